// Element types: NCCL's set (ncclDataType_t) and PyTorch's names for them.
//
//   DType    bytes  PyTorch               NCCL             safetensors  host type (C++)
//   f32      4      torch.float32         ncclFloat32      F32          float
//   i64      8      torch.int64           ncclInt64        I64          std::int64_t
//   f64      8      torch.float64         ncclFloat64      F64          double
//   f16      2      torch.float16         ncclFloat16      F16          ditto::float16
//   bf16     2      torch.bfloat16        ncclBfloat16     BF16         ditto::bfloat16
//   i8       1      torch.int8            ncclInt8         I8           std::int8_t
//   u8       1      torch.uint8           ncclUint8        U8           std::uint8_t
//   i32      4      torch.int32           ncclInt32        I32          std::int32_t
//   u32      4      torch.uint32          ncclUint32       U32          std::uint32_t
//   u64      8      torch.uint64          ncclUint64       U64          std::uint64_t
//   f8_e4m3  1      torch.float8_e4m3fn   ncclFloat8e4m3   F8_E4M3      ditto::float8_e4m3
//   f8_e5m2  1      torch.float8_e5m2     ncclFloat8e5m2   F8_E5M2      ditto::float8_e5m2
//
// f32 and i64 keep the values 0 and 1 they had when they were the only two. The 16- and 8-bit
// float types are bit containers on the host (core/numerics/float_formats.h: conversions with
// round to nearest even, shared by the simulator and the CUDA kernels).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/base/error.h"
#include "core/numerics/float_formats.h"

namespace ditto {

enum class DType : std::uint8_t {
  f32,
  i64,
  f64,
  f16,
  bf16,
  i8,
  u8,
  i32,
  u32,
  u64,
  f8_e4m3,
  f8_e5m2
};

/// Number of DType enumerators (for tables and loops over every dtype).
inline constexpr int kNumDTypes = 12;

/// Every DType, in enumeration order.
inline constexpr DType kAllDTypes[kNumDTypes] = {
    DType::f32, DType::i64, DType::f64, DType::f16, DType::bf16,    DType::i8,
    DType::u8,  DType::i32, DType::u32, DType::u64, DType::f8_e4m3, DType::f8_e5m2};

namespace detail {
/// The fallback of dtype_size / dtype_name for a value outside the enumeration (a cast from a
/// corrupt byte): never reached for a DType built from its enumerators.
[[noreturn]] inline void unknown_dtype(const char* fn, DType t) {
  throw InternalError(cat(fn, ": unknown DType value ", static_cast<int>(t),
                          " (expected one of f32, i64, f64, f16, bf16, i8, u8, i32, u32, u64, "
                          "f8_e4m3, f8_e5m2)"));
}
}  // namespace detail

// The switches below have no default, so -Wswitch (in -Wall) names every one a new enumerator
// must be added to.

/// Bytes per element. Throws InternalError for a value outside the enumeration.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i64: return 8;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::u32: return 4;
    case DType::u64: return 8;
    case DType::f8_e4m3: return 1;
    case DType::f8_e5m2: return 1;
  }
  detail::unknown_dtype("dtype_size", t);
}

/// "f32", "i64", "bf16", ... (the names of the table above). Throws InternalError for a value
/// outside the enumeration.
constexpr const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::i64: return "i64";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::u32: return "u32";
    case DType::u64: return "u64";
    case DType::f8_e4m3: return "f8_e4m3";
    case DType::f8_e5m2: return "f8_e5m2";
  }
  detail::unknown_dtype("dtype_name", t);
}

/// Whether `t` is one of the enumerators (a DType cast from a corrupt byte or a bad int is not).
constexpr bool is_valid_dtype(DType t) { return static_cast<unsigned>(t) < kNumDTypes; }

/// f32, f64, f16, bf16, f8_e4m3, f8_e5m2.
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16 ||
         t == DType::f8_e4m3 || t == DType::f8_e5m2;
}
/// The integer types (i8, u8, i32, u32, i64, u64).
constexpr bool is_integral(DType t) { return !is_floating(t); }
/// i8, i32, i64 (and every floating type).
constexpr bool is_signed(DType t) {
  return !(t == DType::u8 || t == DType::u32 || t == DType::u64);
}

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::i8;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<std::uint32_t>() {
  return DType::u32;
}
template <>
constexpr DType dtype_of<std::uint64_t>() {
  return DType::u64;
}
template <>
constexpr DType dtype_of<float8_e4m3>() {
  return DType::f8_e4m3;
}
template <>
constexpr DType dtype_of<float8_e5m2>() {
  return DType::f8_e5m2;
}

/// Calls f(T{}) with T the host type of `t` (the table above): the one switch over dtypes that
/// dtype-generic host code (kernels, collectives, checks) dispatches through.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::i64: return f(std::int64_t{});
    case DType::f64: return f(double{});
    case DType::f16: return f(float16{});
    case DType::bf16: return f(bfloat16{});
    case DType::i8: return f(std::int8_t{});
    case DType::u8: return f(std::uint8_t{});
    case DType::i32: return f(std::int32_t{});
    case DType::u32: return f(std::uint32_t{});
    case DType::u64: return f(std::uint64_t{});
    case DType::f8_e4m3: return f(float8_e4m3{});
    case DType::f8_e5m2: return f(float8_e5m2{});
  }
  detail::unknown_dtype("visit_dtype", t);
}

}  // namespace ditto
