#include "core/numerics/determinism.h"

#include "core/base/error.h"

namespace ditto {

Determinism parse_determinism(std::string_view s) {
  if (s == "bitwise") return Determinism::bitwise;
  if (s == "fast") return Determinism::fast;
  throw InvalidArgument(detail::cat("determinism: expected 'bitwise' or 'fast', got '", s, "'"));
}

}  // namespace ditto
