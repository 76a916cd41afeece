// checked_clone: x.clone(), refused where it is not of x's own dynamic type.
#pragma once

#include <memory>
#include <string>
#include <typeinfo>

namespace ditto::nn {

namespace detail {
/// The demangled name of a type ("MyLoss", "ditto::nn::CrossEntropyLoss").
std::string type_name(const std::type_info& t);
/// InvalidArgument for `call`: self's `fn` (clone, empty_clone) made a `made` (null: none).
[[noreturn]] void throw_sliced_clone(const char* call, const char* fn, const std::type_info& self,
                                     const std::type_info* made);
/// `made`, what self.fn() returned, when it is of self's own dynamic type; else throws
/// throw_sliced_clone's error.
template <class P, class T>
P checked_made(P made, const T& self, const char* call, const char* fn) {
  if (!made || typeid(*made) != typeid(self))
    throw_sliced_clone(call, fn, typeid(self), made ? &typeid(*made) : nullptr);
  return made;
}
}  // namespace detail

/// x.clone() (an nn::Module or an nn::Loss), checked to be of x's own dynamic type: a subclass
/// that overrides forward but inherits its base's clone() (LossOf<CrossEntropyLoss>'s,
/// Linear's) clones as its base, and a replica or evaluation made from the clone would compute
/// the base's function without a word (tester7's F1: a label-smoothed CrossEntropyLoss subclass
/// was evaluated as plain cross-entropy under DDP). Throws InvalidArgument naming `call`, both
/// types and the fix (override clone()); also when clone() returns null.
template <class T>
auto checked_clone(const T& x, const char* call) -> decltype(x.clone()) {
  return detail::checked_made(x.clone(), x, call, "clone");
}

}  // namespace ditto::nn
