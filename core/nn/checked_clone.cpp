// checked_clone (checked_clone.h): the error of a clone of another type.
#include "core/nn/checked_clone.h"

#include <cxxabi.h>

#include <cstdlib>

#include "core/base/error.h"

namespace ditto::nn::detail {

std::string type_name(const std::type_info& t) {
  int status = 0;
  char* d = abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? std::string(d) : std::string(t.name());
  std::free(d);
  return name;
}

void throw_sliced_clone(const char* call, const char* fn, const std::type_info& self,
                        const std::type_info* made) {
  const std::string me = type_name(self);
  if (made == nullptr)
    throw InvalidArgument(
        ditto::detail::cat(call, ": ", me, "::", fn, "() returned null; expected a new ", me));
  throw InvalidArgument(ditto::detail::cat(
      call, ": ", me, "::", fn, "() returned a ", type_name(*made), ", not a ", me, " (a ", fn,
      "() inherited from a base class makes the base, which would compute the base's forward); "
      "override ",
      fn, "() in ", me, " to return a ", me));
}

}  // namespace ditto::nn::detail
