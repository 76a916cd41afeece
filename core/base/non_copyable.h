// ditto::NonCopyable: the base of the polymorphic objects that are owned through a pointer and
// known by their address (Backend, Stream, Event, nn::Module, optim::Optimizer).
#pragma once

namespace ditto {

/// A virtual destructor (a derived object is deleted through a base pointer) and no copy or move:
/// a backend, stream, event, module or optimizer is one object that others point to (a stream's
/// pending work, a module's parameters), so a copy would be a second owner of the same thing.
/// Derived classes add their own copies where one makes sense (nn::Module::clone()).
class NonCopyable {
 public:
  virtual ~NonCopyable() = default;
  NonCopyable(const NonCopyable&) = delete;
  NonCopyable& operator=(const NonCopyable&) = delete;

 protected:
  NonCopyable() = default;
};

}  // namespace ditto
