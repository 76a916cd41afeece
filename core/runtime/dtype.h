// Element types. v0 carries f32 data and i64 class labels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/runtime/error.h"

namespace ditto {

enum class DType : std::uint8_t { f32, i64 };

namespace detail {
/// The fallback of dtype_size / dtype_name for a value outside the enumeration (a cast from a
/// corrupt byte): never reached for a DType built from its enumerators.
[[noreturn]] inline void unknown_dtype(const char* fn, DType t) {
  throw InternalError(cat(fn, ": unknown DType value ", static_cast<int>(t),
                          " (expected f32 or i64)"));
}
}  // namespace detail

// The switches below have no default, so -Wswitch (in -Wall) names every one a new enumerator
// must be added to.

/// Bytes per element. Throws InternalError for a value outside the enumeration.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i64: return 8;
  }
  detail::unknown_dtype("dtype_size", t);
}

/// "f32" / "i64". Throws InternalError for a value outside the enumeration.
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::i64: return "i64";
  }
  detail::unknown_dtype("dtype_name", t);
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

}  // namespace ditto
