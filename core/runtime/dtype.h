// Element types. v0 carries f32 data and i64 class labels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ditto {

enum class DType : std::uint8_t { f32, i64 };

/// Bytes per element.
constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 8; }

/// "f32" / "i64".
constexpr const char* dtype_name(DType t) { return t == DType::f32 ? "f32" : "i64"; }

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() { return DType::f32; }
template <>
constexpr DType dtype_of<std::int64_t>() { return DType::i64; }

}  // namespace ditto
