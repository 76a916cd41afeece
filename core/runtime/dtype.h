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

/// The table above, stated once: X(enumerator, host type, safetensors name) for every dtype, in
/// enumeration order. The enum, kAllDTypes, dtype_size, dtype_name, dtype_of and visit_dtype are
/// generated from it; a new dtype is one row here (and the kernels that take it).
#define DITTO_DTYPES(X)                       \
  X(f32, float, "F32")                        \
  X(i64, std::int64_t, "I64")                 \
  X(f64, double, "F64")                       \
  X(f16, ::ditto::float16, "F16")             \
  X(bf16, ::ditto::bfloat16, "BF16")          \
  X(i8, std::int8_t, "I8")                    \
  X(u8, std::uint8_t, "U8")                   \
  X(i32, std::int32_t, "I32")                 \
  X(u32, std::uint32_t, "U32")                \
  X(u64, std::uint64_t, "U64")                \
  X(f8_e4m3, ::ditto::float8_e4m3, "F8_E4M3") \
  X(f8_e5m2, ::ditto::float8_e5m2, "F8_E5M2")

#define DITTO_DTYPE_ENUMERATOR(e, T, st) e,
/// f32, i64, f64, f16, bf16, i8, u8, i32, u32, u64, f8_e4m3, f8_e5m2 (DITTO_DTYPES' order).
enum class DType : std::uint8_t { DITTO_DTYPES(DITTO_DTYPE_ENUMERATOR) };
#undef DITTO_DTYPE_ENUMERATOR

#define DITTO_DTYPE_ONE(e, T, st) +1
/// Number of DType enumerators (for tables and loops over every dtype).
inline constexpr int kNumDTypes = 0 DITTO_DTYPES(DITTO_DTYPE_ONE);
#undef DITTO_DTYPE_ONE

#define DITTO_DTYPE_VALUE(e, T, st) DType::e,
/// Every DType, in enumeration order.
inline constexpr DType kAllDTypes[kNumDTypes] = {DITTO_DTYPES(DITTO_DTYPE_VALUE)};
#undef DITTO_DTYPE_VALUE

namespace detail {
/// The fallback of dtype_size / dtype_name for a value outside the enumeration (a cast from a
/// corrupt byte): never reached for a DType built from its enumerators.
[[noreturn]] inline void unknown_dtype(const char* fn, DType t) {
  throw InternalError(cat(fn, ": unknown DType value ", static_cast<int>(t),
                          " (expected one of f32, i64, f64, f16, bf16, i8, u8, i32, u32, u64, "
                          "f8_e4m3, f8_e5m2)"));
}
}  // namespace detail

// The switches below have no default, so -Wswitch (in -Wall) would name one that a new enumerator
// was left out of; each is generated from DITTO_DTYPES, so none is.

/// Bytes per element (sizeof the host type). Throws InternalError for a value outside the
/// enumeration.
constexpr std::size_t dtype_size(DType t) {
  switch (t) {
#define DITTO_DTYPE_SIZE(e, T, st) \
  case DType::e: return sizeof(T);
    DITTO_DTYPES(DITTO_DTYPE_SIZE)
#undef DITTO_DTYPE_SIZE
  }
  detail::unknown_dtype("dtype_size", t);
}

/// "f32", "i64", "bf16", ... (the names of the table above). Throws InternalError for a value
/// outside the enumeration.
constexpr const char* dtype_name(DType t) {
  switch (t) {
#define DITTO_DTYPE_NAME(e, T, st) \
  case DType::e: return #e;
    DITTO_DTYPES(DITTO_DTYPE_NAME)
#undef DITTO_DTYPE_NAME
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

/// The DType of host type T (the table above): dtype_of<float>() == DType::f32, ... Only the
/// table's types have one.
template <typename T>
constexpr DType dtype_of();
#define DITTO_DTYPE_OF(e, T, st)  \
  template <>                     \
  constexpr DType dtype_of<T>() { \
    return DType::e;              \
  }
DITTO_DTYPES(DITTO_DTYPE_OF)
#undef DITTO_DTYPE_OF

/// Calls f(T{}) with T the host type of `t` (the table above): the one switch over dtypes that
/// dtype-generic host code (kernels, collectives, checks) dispatches through.
template <typename F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
#define DITTO_DTYPE_VISIT(e, T, st) \
  case DType::e: return f(T{});
    DITTO_DTYPES(DITTO_DTYPE_VISIT)
#undef DITTO_DTYPE_VISIT
  }
  detail::unknown_dtype("visit_dtype", t);
}

}  // namespace ditto
