// Internal: the built-in backends register themselves through this one function, called once when
// the registry is first used (static-library registration by global constructors would be dropped
// by the linker). Defined in core/builtin_backends.cpp.
#pragma once

#include <functional>
#include <string>

#include "core/backend.h"

namespace ditto::detail {
using RegisterFn = std::function<void(const std::string&, BackendFactory)>;
void register_builtin_backends(const RegisterFn& add);
}  // namespace ditto::detail
