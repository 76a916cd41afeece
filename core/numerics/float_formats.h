// The small floating-point formats (f16, bf16, fp8 e4m3 / e5m2) as bit containers, and the one
// conversion to and from f32 that the simulator, the CUDA kernels (DITTO_HD) and the host share,
// so a value converts to the same bits everywhere.
//
// Note [Small float conversions]
// f32 -> small: round to nearest, ties to even, on the exact value (subnormals of the target
// included; f32 subnormal inputs too). Overflow:
//   f16, bf16, e5m2 (IEEE-like, with inf): a result past the largest finite value becomes inf
//     (as IEEE 754 round-to-nearest, torch, and CUDA's __float2half_rn / __float2bfloat16_rn);
//   e4m3 (torch.float8_e4m3fn, OCP "fn": no inf, one NaN pattern S.1111.111): a value that rounds
//     past 448 becomes NaN, and so does inf (torch's float8_e4m3fn and CUDA's __NV_NOSAT).
// NaN stays NaN: sign kept, the top mantissa bits kept, quiet bit set (IEEE-like formats; the
// hardware F16C / CUDA conversions keep the payload alike); e4m3 has one NaN per sign. torch
// canonicalises NaN payloads (bf16 0x7FC0), so its bits agree with these except for NaN payloads.
// small -> f32 is exact (every small value is an f32). f64 <-> small goes through f32 (as
// torch's c10::Half(double) does), integers likewise (int -> f32 rounds to nearest even).
//
// Float to integer (cast_float_to_int): truncation toward zero, NaN -> 0, out-of-range values
// saturate to the type's minimum or maximum. This is what CUDA's conversion instructions
// (cvt.rzi.sat) do, so both backends agree; C++'s own cast is undefined there (and PyTorch
// inherits that).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "core/numerics/hd.h"
#include "core/numerics/portable_math.h"

namespace ditto {

namespace fmt_detail {

using pmath::detail::from_bits;  // core/numerics/portable_math.h: the float of an encoding
using pmath::detail::to_bits;    // and the encoding of a float

/// A binary format with E exponent bits and M mantissa bits (bias 2^(E-1) - 1). Inf: the
/// all-ones exponent is inf (mantissa 0) / NaN (IEEE-like); without Inf (e4m3fn) only the
/// all-ones code S.1..1.1..1 is NaN and every other code is finite.
template <int E, int M, bool Inf>
struct Format {
  static constexpr int bias = (1 << (E - 1)) - 1;
  static constexpr int emin = 1 - bias;  // exponent of the smallest normal
  static constexpr std::uint32_t mag_mask = (1u << (E + M)) - 1u;
  static constexpr std::uint32_t inf_code = Inf ? ((1u << E) - 1u) << M : 0u;
  static constexpr std::uint32_t nan_code = Inf ? inf_code | (1u << (M - 1)) : mag_mask;
  static constexpr std::uint32_t max_finite = Inf ? inf_code - 1u : mag_mask - 1u;

  /// Round-to-nearest-even encoding of f (Note [Small float conversions]).
  DITTO_HD static std::uint32_t from_f32(float f) {
    const std::uint32_t x = to_bits(f);
    const std::uint32_t sign = (x >> 31) << (E + M);
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, set the quiet bit
      if (!Inf) return sign | nan_code;
      return sign | inf_code | (1u << (M - 1)) | ((abs & 0x7fffffu) >> (23 - M));
    }
    if (abs == 0x7f800000u) return sign | (Inf ? inf_code : nan_code);
    if (abs == 0) return sign;
    const int field = static_cast<int>(abs >> 23);
    const std::uint64_t sig = field ? (abs & 0x7fffffu) | 0x800000u : (abs & 0x7fffffu);
    const int e = (field ? field : 1) - 127;  // value = sig * 2^(e - 23)
    // The target's quantum: 2^(e - M) for normals, 2^(emin - M) in the subnormal range.
    const int q = (e >= emin ? e : emin) - M;
    const int shift = q - (e - 23);  // low bits of sig below the quantum (>= 23 - M > 0)
    std::uint64_t r;
    if (shift > 40) {
      r = 0;  // far below half the smallest subnormal
    } else {
      r = sig >> shift;
      const std::uint64_t rem = sig & ((std::uint64_t(1) << shift) - 1);
      const std::uint64_t half = std::uint64_t(1) << (shift - 1);
      if (rem > half || (rem == half && (r & 1u))) ++r;
    }
    // Normals: code = (biased exponent - 1) << M plus r in [2^M, 2^(M+1)] (a carry of the
    // rounding moves into the exponent by itself); subnormals: code = r (r == 2^M is the
    // smallest normal).
    const std::int64_t base = e >= emin ? std::int64_t(e + bias - 1) << M : 0;
    const std::int64_t code = base + static_cast<std::int64_t>(r);
    if (code > static_cast<std::int64_t>(max_finite)) return sign | (Inf ? inf_code : nan_code);
    return sign | static_cast<std::uint32_t>(code);
  }

  /// The exact f32 value of `code`.
  DITTO_HD static float to_f32(std::uint32_t code) {
    const std::uint32_t sign = ((code >> (E + M)) & 1u) << 31;
    const std::uint32_t mag = code & mag_mask;
    const std::uint32_t field = mag >> M, mant = mag & ((1u << M) - 1u);
    if (Inf ? field == (1u << E) - 1u : mag == mag_mask) {
      if (Inf && mant == 0) return from_bits(sign | 0x7f800000u);
      if (!Inf) return from_bits(sign | 0x7fc00000u);
      return from_bits(sign | 0x7fc00000u | (mant << (23 - M)));
    }
    if (field == 0) {
      if (mant == 0) return from_bits(sign);
      // Subnormal of the target: mant * 2^(emin - M), normal (or subnormal for bf16) in f32.
      int e = emin;
      std::uint32_t m = mant;
      while ((m & (1u << M)) == 0 && e > -126) {
        m <<= 1;
        --e;
      }
      if ((m & (1u << M)) == 0) return from_bits(sign | (m << (23 - M)));  // f32 subnormal
      return from_bits(sign | (static_cast<std::uint32_t>(e + 127) << 23) |
                       ((m & ((1u << M) - 1u)) << (23 - M)));
    }
    const int e = static_cast<int>(field) - bias;
    return from_bits(sign | (static_cast<std::uint32_t>(e + 127) << 23) | (mant << (23 - M)));
  }
};

using F16 = Format<5, 10, true>;
using BF16 = Format<8, 7, true>;
using E4M3 = Format<4, 3, false>;
using E5M2 = Format<5, 2, true>;

/// What the four types below share: the `bits` of format Fmt in a Bits, Self::from(f32) and
/// to_float() (Note [Small float conversions]), and == on the bits. Self is the type itself
/// (float16, ...), so from() gives it; `float16{0x3C00}` still sets the bits.
template <typename Self, typename Bits, typename Fmt>
struct SmallFloat {
  Bits bits = 0;
  /// f32 -> Self, rounded to nearest even (Note [Small float conversions]).
  DITTO_HD static Self from(float f) {
    Self s;
    s.bits = static_cast<Bits>(Fmt::from_f32(f));
    return s;
  }
  /// Self -> f32, exact.
  DITTO_HD float to_float() const { return Fmt::to_f32(bits); }
  friend DITTO_HD bool operator==(Self a, Self b) { return a.bits == b.bits; }
};

}  // namespace fmt_detail

/// IEEE binary16 (torch.float16, __half): bits only; convert with to_float / float16::from.
struct float16 : fmt_detail::SmallFloat<float16, std::uint16_t, fmt_detail::F16> {};
/// bfloat16 (torch.bfloat16, __nv_bfloat16): the top 16 bits of an f32, rounded.
struct bfloat16 : fmt_detail::SmallFloat<bfloat16, std::uint16_t, fmt_detail::BF16> {};
/// OCP fp8 E4M3 "fn" (torch.float8_e4m3fn, __nv_fp8_e4m3): max 448, no inf.
struct float8_e4m3 : fmt_detail::SmallFloat<float8_e4m3, std::uint8_t, fmt_detail::E4M3> {};
/// OCP fp8 E5M2 (torch.float8_e5m2, __nv_fp8_e5m2): max 57344, with inf.
struct float8_e5m2 : fmt_detail::SmallFloat<float8_e5m2, std::uint8_t, fmt_detail::E5M2> {};

/// True for float16, bfloat16, float8_e4m3, float8_e5m2 (stored as bits, computed in f32).
template <typename T>
inline constexpr bool is_small_float_v =
    std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float8_e4m3> ||
    std::is_same_v<T, float8_e5m2>;

/// Float to integer type I: truncation toward zero, NaN -> 0, saturating (Note [Small float
/// conversions]).
template <typename I>
DITTO_HD inline I cast_float_to_int(double v) {
  if (v != v) return I(0);
  constexpr double lo = static_cast<double>(std::numeric_limits<I>::min());
  // max() + 1 is a power of two, exact in double; max() itself may not be (u64, i64).
  constexpr double hi_excl = static_cast<double>(std::numeric_limits<I>::max() / 2 + 1) * 2.0;
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi_excl) return std::numeric_limits<I>::max();
  return static_cast<I>(v);  // in range: truncation
}

/// The value of any ditto element type as the type To (Note [Small float conversions]): the
/// conversion Tensor::to(dtype) and the cast kernels apply elementwise.
template <typename To, typename From>
DITTO_HD inline To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_small_float_v<From>) {
    return convert<To>(x.to_float());
  } else if constexpr (is_small_float_v<To>) {
    if constexpr (std::is_same_v<From, float>)
      return To::from(x);
    else
      return To::from(static_cast<float>(x));  // f64 and integers through f32
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return cast_float_to_int<To>(static_cast<double>(x));
  } else {
    return static_cast<To>(x);  // int <-> int wraps (two's complement), int -> float rounds
  }
}

}  // namespace ditto
