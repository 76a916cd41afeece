// Fast conversions between f32 and the small floats for the simulator's element loops
// (sim_comm_kernels.cpp): the same bits as the one conversion of core/numerics/float_formats.h
// (Note [Small float conversions]), which the CUDA kernels and the host share, only without its
// general-purpose code on the common path. float_formats.h decodes and rounds any format
// field by field (a loop for subnormals), about 20x slower than an f32 add, so an f16 / bf16
// all_reduce ran 35x slower than an f32 one of the same bytes.
//   bf16 -> f32   the code's 16 bits on top of 16 zero bits (NaN: the quiet bit set, as there);
//   f32 -> bf16   round to nearest even on the low 16 bits by one integer add (NaN: quieted);
//   f16 <-> f32   normal values by rebiasing the exponent (and one integer add to round);
//                 subnormals, zeros, inf, NaN, and f32 values that round outside f16's normal
//                 range go to float_formats.h;
//   fp8 -> f32    a table of the 256 codes decoded by float_formats.h; f32 -> fp8 is
//                 float_formats.h itself.
// tests/test_coll_convert.cpp checks every code of every small format, and f32 -> small on
// every 4093rd f32 bit pattern plus each boundary's neighbourhood, against float_formats.h; f32 ->
// f16 and f32 -> bf16 were also checked once on all 2^32 patterns (0 mismatches, scalar and
// block forms).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "core/numerics/float_formats.h"

namespace ditto::sim {

namespace small_float_detail {
template <typename T>
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (unsigned c = 0; c < 256; ++c) t[c] = T{static_cast<std::uint8_t>(c)}.to_float();
    return t;
  }();
  return table;
}

// The general conversions, out of line: inlined, the compiler may if-convert them into the
// loop and compute them for every element.
template <typename T>
[[gnu::noinline, gnu::cold]] float slow_to_f32(T x) {
  return x.to_float();
}
template <typename T>
[[gnu::noinline, gnu::cold]] T slow_from_f32(float f) {
  return T::from(f);
}

// The bit formulas, on codes widened to 32 bits.
inline std::uint32_t bf16_to_f32_bits(std::uint32_t h) {
  const std::uint32_t u = h << 16;
  return (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : u;  // NaN: quiet
}
inline std::uint16_t f32_bits_to_bf16(std::uint32_t x) {
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // ties to even
  const std::uint32_t nan = (x >> 16) | 0x40u;  // the top payload bits, quiet
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
// f16 codes of exponent field 0 (zero, subnormal) or 31 (inf, NaN) take the general path.
inline bool f16_special(std::uint32_t h) { return ((h >> 10) & 0x1fu) - 1u >= 30u; }
inline std::uint32_t f16_normal_to_f32_bits(std::uint32_t h) {
  return ((h & 0x8000u) << 16) | (((h & 0x7fffu) + (112u << 10)) << 13);
}
// f32 magnitudes outside [2^-14, 65520) do not round to a normal f16 (65520 and up: inf).
inline bool f32_not_f16_normal(std::uint32_t x) {
  const std::uint32_t abs = x & 0x7fffffffu;
  return abs < 0x38800000u || abs >= 0x477ff000u;
}
inline std::uint16_t f32_bits_to_f16_normal(std::uint32_t x) {
  const std::uint32_t a = (x & 0x7fffffffu) - (112u << 23);  // the exponent rebiased to f16's
  return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) |
                                    ((a + 0xfffu + ((a >> 13) & 1u)) >> 13));
}
}  // namespace small_float_detail

/// x.to_float(), bit for bit.
template <typename T>
inline float to_f32_fast(T x) {
  static_assert(is_small_float_v<T>);
  namespace d = small_float_detail;
  if constexpr (std::is_same_v<T, bfloat16>) {
    return std::bit_cast<float>(d::bf16_to_f32_bits(x.bits));
  } else if constexpr (std::is_same_v<T, float16>) {
    if (d::f16_special(x.bits)) return d::slow_to_f32(x);
    return std::bit_cast<float>(d::f16_normal_to_f32_bits(x.bits));
  } else {
    return d::fp8_table<T>()[x.bits];
  }
}

/// T::from(f), bit for bit.
template <typename T>
inline T from_f32_fast(float f) {
  static_assert(is_small_float_v<T>);
  namespace d = small_float_detail;
  const auto x = std::bit_cast<std::uint32_t>(f);
  if constexpr (std::is_same_v<T, bfloat16>) {
    return {d::f32_bits_to_bf16(x)};
  } else if constexpr (std::is_same_v<T, float16>) {
    if (d::f32_not_f16_normal(x)) return d::slow_from_f32<T>(f);
    return {d::f32_bits_to_f16_normal(x)};
  } else {
    return T::from(f);
  }
}

/// dst[i] = src[i].to_float() for i < len, bit for bit: branch-free loops the compiler
/// vectorises; for f16 then the rare special codes again through float_formats.h.
template <typename T>
void to_f32_block(const T* src, float* dst, std::int64_t len) {
  namespace d = small_float_detail;
  // float16 / bfloat16 are their one std::uint16_t member (pointer-interconvertible).
  if constexpr (std::is_same_v<T, bfloat16>) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(src);
    for (std::int64_t i = 0; i < len; ++i) dst[i] = std::bit_cast<float>(d::bf16_to_f32_bits(h[i]));
  } else if constexpr (std::is_same_v<T, float16>) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(src);
    std::uint32_t special = 0;
    for (std::int64_t i = 0; i < len; ++i) special |= d::f16_special(h[i]);
    for (std::int64_t i = 0; i < len; ++i)
      dst[i] = std::bit_cast<float>(d::f16_normal_to_f32_bits(h[i]));
    if (special)
      for (std::int64_t i = 0; i < len; ++i)
        if (d::f16_special(h[i])) dst[i] = d::slow_to_f32(src[i]);
  } else {
    for (std::int64_t i = 0; i < len; ++i) dst[i] = to_f32_fast(src[i]);
  }
}

/// dst[i] = T::from(src[i]) for i < len, bit for bit (as to_f32_block).
template <typename T>
void from_f32_block(const float* src, T* dst, std::int64_t len) {
  namespace d = small_float_detail;
  if constexpr (std::is_same_v<T, bfloat16>) {
    auto* h = reinterpret_cast<std::uint16_t*>(dst);
    for (std::int64_t i = 0; i < len; ++i)
      h[i] = d::f32_bits_to_bf16(std::bit_cast<std::uint32_t>(src[i]));
  } else if constexpr (std::is_same_v<T, float16>) {
    auto* h = reinterpret_cast<std::uint16_t*>(dst);
    std::uint32_t special = 0;
    for (std::int64_t i = 0; i < len; ++i) {
      const auto x = std::bit_cast<std::uint32_t>(src[i]);
      special |= d::f32_not_f16_normal(x);
      h[i] = d::f32_bits_to_f16_normal(x);
    }
    if (special)
      for (std::int64_t i = 0; i < len; ++i)
        if (d::f32_not_f16_normal(std::bit_cast<std::uint32_t>(src[i])))
          dst[i] = d::slow_from_f32<T>(src[i]);
  } else {
    for (std::int64_t i = 0; i < len; ++i) dst[i] = from_f32_fast<T>(src[i]);
  }
}

}  // namespace ditto::sim
