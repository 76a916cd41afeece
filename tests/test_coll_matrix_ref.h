// The host reference of the collective test matrix (tests/test_coll_matrix*.cpp), written from
// Note [Reductions over ranks] (core/numerics/reduce_math.h) and Note [Small float conversions]
// (core/numerics/float_formats.h) WITHOUT calling either header's functions, so the matrix can
// catch a backend (or those headers) departing from the Notes:
//  - element values are raw bits (one std::uint64_t per element, the low dtype_size bytes);
//  - f16 decodes by its definition and rounds in double arithmetic (IEEE binary16, round to
//    nearest even; checked against the compiler's _Float16 where it has one), bf16 through the top half of an f32 with the classic round-to-nearest-even add,
//    fp8 e4m3 / e5m2 by brute force: the nearest of the decoded codes, ties to the even code, the
//    Note's overflow rule (e4m3: NaN past 464, e5m2: inf from 61440);
//  - the reduction: each rank's value loaded into the accumulator (float for f32 / f16 / bf16 /
//    fp8, double for f64, the integer itself, wrapping, for integers), premul_sum multiplying by
//    the rank's scalar first, the canonical tree over rank index (split at the largest power of
//    two below the count), then avg's division (truncating toward zero for integers) and ONE
//    rounding to the dtype.
// Also the deterministic inputs of every (dtype, op, rank, element), the per-dtype tolerance of
// fast mode, and tensors from and to element bits.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/runtime/dtype.h"
#include "core/runtime/tensor.h"

namespace ditto::test::ref {

/// The ops of the matrix, in ReduceOp's order (sum, prod, min, max, avg, premul_sum).
enum class Op { sum, prod, min, max, avg, premul_sum };
inline constexpr Op kAllOps[] = {Op::sum, Op::prod, Op::min, Op::max, Op::avg, Op::premul_sum};
inline const char* op_name(Op op) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg", "premul_sum"};
  return names[static_cast<int>(op)];
}

// ---- which dtypes are what (own table) ----------------------------------------------------------

struct Info {
  bool floating;
  bool is_signed;
  int bits;       ///< storage bits
  int mant;       ///< floats: explicit mantissa bits
  int emin;       ///< floats: exponent of the smallest normal
};
inline Info info(DType t) {
  switch (t) {
    case DType::f32: return {true, true, 32, 23, -126};
    case DType::f64: return {true, true, 64, 52, -1022};
    case DType::f16: return {true, true, 16, 10, -14};
    case DType::bf16: return {true, true, 16, 7, -126};
    case DType::f8_e4m3: return {true, true, 8, 3, -6};
    case DType::f8_e5m2: return {true, true, 8, 2, -14};
    case DType::i8: return {false, true, 8, 0, 0};
    case DType::u8: return {false, false, 8, 0, 0};
    case DType::i32: return {false, true, 32, 0, 0};
    case DType::u32: return {false, false, 32, 0, 0};
    case DType::i64: return {false, true, 64, 0, 0};
    case DType::u64: return {false, false, 64, 0, 0};
  }
  return {};
}
inline std::uint64_t mask(DType t) {
  const int b = info(t).bits;
  return b == 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << b) - 1;
}

// ---- small float codecs -------------------------------------------------------------------------

// f16 by its definition, in double arithmetic (exact for every f32 and f16 value) with
// std::nearbyint's round half to even, not through the compiler's _Float16: Clang 14 accepts
// _Float16 on x86 only for CPUs with AVX512-FP16 (the check build failed on an AMD EPYC).
// NaN as the x86 F16C conversions do it: sign and top payload bits kept, quiet bit set.
// tests/test_coll_matrix.cpp checks both against _Float16 where the compiler has it.
inline float f16_value(std::uint64_t b) {
  const auto u = static_cast<std::uint32_t>(b & 0xffffu);
  const std::uint32_t sign = (u >> 15) << 31;
  const int e = static_cast<int>((u >> 10) & 31u);
  const std::uint32_t m = u & 1023u;
  if (e == 31)
    return m == 0 ? std::bit_cast<float>(sign | 0x7f800000u)
                  : std::bit_cast<float>(sign | 0x7fc00000u | (m << 13));
  const double v = e == 0 ? std::ldexp(static_cast<double>(m), -24)
                          : std::ldexp(static_cast<double>(1024u + m), e - 25);
  return sign ? -static_cast<float>(v) : static_cast<float>(v);
}
inline std::uint64_t f16_round(float f) {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  if (std::isnan(f)) return sign | 0x7e00u | ((x & 0x7fffffu) >> 13);
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00u;  // rounds past 65504 (ties go to the even inf)
  if (a < 0x1p-14) return sign | static_cast<std::uint32_t>(std::nearbyint(a * 0x1p24));
  int e2 = 0;
  std::frexp(a, &e2);  // a in [2^(e2 - 1), 2^e2)
  const int E = e2 - 1;
  const double r = std::nearbyint(std::ldexp(a, 10 - E));  // in [1024, 2048]: 2048 carries into E + 1
  return sign | (static_cast<std::uint32_t>((E + 15) << 10) + static_cast<std::uint32_t>(r - 1024.0));
}
inline float bf16_value(std::uint64_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b & 0xffffu) << 16);
}
inline std::uint64_t bf16_round(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;  // NaN: quiet
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/// fp8 code -> value (e4m3fn: bias 7, no inf, S.1111.111 NaN; e5m2: bias 15, IEEE-like).
inline float fp8_value(bool e4m3, std::uint64_t code) {
  const int c = static_cast<int>(code & 0xffu);
  const float sign = (c & 0x80) ? -1.0f : 1.0f;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const int field = (c & 0x7f) >> mbits, m = c & ((1 << mbits) - 1);
  if (e4m3 && field == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (!e4m3 && field == 31)
    return m == 0 ? sign * std::numeric_limits<float>::infinity()
                  : std::numeric_limits<float>::quiet_NaN();
  const float frac = static_cast<float>(m) / static_cast<float>(1 << mbits);
  if (field == 0) return sign * std::ldexp(frac, 1 - bias);
  return sign * std::ldexp(1.0f + frac, field - bias);
}
/// Nearest fp8 code, ties to the even code; past the largest finite value: the Note's overflow.
inline std::uint64_t fp8_round(bool e4m3, float f) {
  const std::uint64_t nan = e4m3 ? 0x7f : 0x7e, max_code = e4m3 ? 0x7e : 0x7b;
  if (std::isnan(f)) return nan;
  const std::uint64_t sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(f));
  const std::uint64_t over = e4m3 ? nan : 0x7c;  // e5m2: inf
  const double top = fp8_value(e4m3, max_code);
  const double next = top + (top - fp8_value(e4m3, max_code - 1));  // one more step
  if (a > (top + next) / 2 || (a == (top + next) / 2 && (max_code & 1))) return sign | over;
  std::uint64_t best = 0;
  double best_d = a;
  for (std::uint64_t c = 1; c <= max_code; ++c) {
    const double d = std::fabs(fp8_value(e4m3, c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

/// The exact value of a floating element (f64 elements too).
inline double value(DType t, std::uint64_t b) {
  switch (t) {
    case DType::f32: return std::bit_cast<float>(static_cast<std::uint32_t>(b));
    case DType::f64: return std::bit_cast<double>(b);
    case DType::f16: return f16_value(b);
    case DType::bf16: return bf16_value(b);
    case DType::f8_e4m3: return fp8_value(true, b);
    case DType::f8_e5m2: return fp8_value(false, b);
    default: return 0;
  }
}
/// A float accumulator value rounded to the floating dtype t (f64: a double, already exact).
inline std::uint64_t round_to(DType t, double a) {
  switch (t) {
    case DType::f64: return std::bit_cast<std::uint64_t>(a);
    case DType::f32: return std::bit_cast<std::uint32_t>(static_cast<float>(a));
    case DType::f16: return f16_round(static_cast<float>(a));
    case DType::bf16: return bf16_round(static_cast<float>(a));
    case DType::f8_e4m3: return fp8_round(true, static_cast<float>(a));
    case DType::f8_e5m2: return fp8_round(false, static_cast<float>(a));
    default: return 0;
  }
}
/// The canonical quiet NaN of a floating dtype.
inline std::uint64_t nan_bits(DType t) {
  return round_to(t, std::numeric_limits<double>::quiet_NaN());
}

/// Integer element as a signed (sign-extended) or unsigned 64-bit value.
inline std::int64_t as_signed(DType t, std::uint64_t b) {
  const int bits = info(t).bits;
  if (bits == 64) return static_cast<std::int64_t>(b);
  const std::uint64_t m = mask(t), top = std::uint64_t(1) << (bits - 1);
  b &= m;
  return static_cast<std::int64_t>((b & top) ? (b | ~m) : b);
}

// ---- the reduction ------------------------------------------------------------------------------

/// The canonical tree over leaves v[0..n) combined by f (Note [Canonical tree]).
template <typename A, typename F>
A tree(const A* v, int n, const F& f) {
  if (n == 1) return v[0];
  int p = 1;
  while (p * 2 < n) p *= 2;
  return f(tree(v, p, f), tree(v + p, n - p, f));
}

template <typename A>
A combine_float(A a, A b, Op op) {
  switch (op) {
    case Op::prod: return a * b;
    case Op::min: return std::isnan(a) ? a : std::isnan(b) ? b : (b < a ? b : a);
    case Op::max: return std::isnan(a) ? a : std::isnan(b) ? b : (b > a ? b : a);
    default: return a + b;
  }
}

template <typename A>
std::uint64_t reduce_float(DType t, Op op, const std::vector<std::uint64_t>& leaf,
                           const std::vector<double>& scalars) {
  const int n = static_cast<int>(leaf.size());
  std::vector<A> v(leaf.size());
  for (int r = 0; r < n; ++r) {
    v[r] = static_cast<A>(value(t, leaf[r]));
    if (op == Op::premul_sum) v[r] = v[r] * static_cast<A>(scalars[r]);
  }
  A a = tree(v.data(), n, [op](A x, A y) { return combine_float(x, y, op); });
  if (op == Op::avg) a = a / static_cast<A>(n);
  return round_to(t, static_cast<double>(a));
}

inline std::uint64_t reduce_int(DType t, Op op, const std::vector<std::uint64_t>& leaf,
                                const std::vector<double>& scalars) {
  const int n = static_cast<int>(leaf.size());
  const std::uint64_t m = mask(t);
  const bool sgn = info(t).is_signed;
  std::vector<std::uint64_t> v(leaf.size());
  for (int r = 0; r < n; ++r) {
    v[r] = leaf[r] & m;
    if (op == Op::premul_sum)
      v[r] = (v[r] * static_cast<std::uint64_t>(static_cast<std::int64_t>(scalars[r]))) & m;
  }
  auto f = [&](std::uint64_t a, std::uint64_t b) -> std::uint64_t {
    const bool less = sgn ? as_signed(t, b) < as_signed(t, a) : b < a;
    switch (op) {
      case Op::prod: return (a * b) & m;
      case Op::min: return less ? b : a;
      case Op::max: return (!less && a != b) ? b : a;
      default: return (a + b) & m;
    }
  };
  std::uint64_t a = tree(v.data(), n, f);
  if (op == Op::avg) {  // NCCL's FuncSumPostDiv: C's truncating division of the wrapped sum
    if (sgn)
      a = static_cast<std::uint64_t>(as_signed(t, a) / n) & m;
    else
      a = a / static_cast<std::uint64_t>(n);
  }
  return a;
}

/// Rank r's element leaf[r] reduced over ranks (Note [Reductions over ranks]), bits of dtype t.
inline std::uint64_t reduce(DType t, Op op, const std::vector<std::uint64_t>& leaf,
                            const std::vector<double>& scalars) {
  if (!info(t).floating) return reduce_int(t, op, leaf, scalars);
  if (t == DType::f64) return reduce_float<double>(t, op, leaf, scalars);
  return reduce_float<float>(t, op, leaf, scalars);
}

/// fast mode's allowance for a floating reduction: any order of the accumulator's operations (and
/// NCCL's rounding to the dtype at each hop on cuda), i.e. n roundings of the accumulator and of
/// the dtype at the scale of the sum of magnitudes, plus the final rounding.
inline double fast_tolerance(DType t, Op op, const std::vector<std::uint64_t>& leaf,
                             const std::vector<double>& scalars, double result) {
  const Info in = info(t);
  const int n = static_cast<int>(leaf.size());
  const double eps_t = std::ldexp(1.0, -in.mant);
  const double eps_acc = std::ldexp(1.0, t == DType::f64 ? -52 : -23);
  double scale = 0;
  if (op == Op::prod) {
    scale = std::fabs(result);
  } else {
    for (int r = 0; r < n; ++r)
      scale += std::fabs(value(t, leaf[r]) * (op == Op::premul_sum ? scalars[r] : 1.0));
    if (op == Op::avg) scale /= n;
  }
  const int e = std::max(std::ilogb(std::max(std::fabs(result), 1e-300)), in.emin);
  const double ulp = std::ldexp(1.0, e - in.mant);
  return n * (eps_t + eps_acc) * scale + ulp;
}

// ---- deterministic inputs -----------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline std::uint64_t hash(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t d) {
  return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

/// The exponent range of the floating inputs of sum-like ops: wide (so the order of the
/// accumulation shows in f32) but with no overflow of 8 ranks' sum in the dtype.
inline void exp_range(DType t, int& lo, int& hi) {
  switch (t) {
    case DType::f64: lo = -40, hi = 60; return;
    case DType::f32: lo = -12, hi = 28; return;
    case DType::bf16: lo = -20, hi = 20; return;
    case DType::f16: lo = -14, hi = 10; return;
    case DType::f8_e4m3: lo = -6, hi = 4; return;
    default: lo = -14, hi = 8; return;  // e5m2
  }
}

/// Every third element of the sum-like inputs: +-2^big or +-[1, 2) x 2^(small + 0..2), the smalls
/// below half an f32 ulp of a big, so the bigs cancel in some orders of the f32 accumulation and
/// absorb the smalls in others, and the order shows after the rounding to the dtype (8 bigs of
/// one sign stay finite). e4m3 has none: its whole range (2^-9 .. 448, 4 significant bits) adds
/// up exactly in f32, in any order.
inline bool order_sensitive(DType t, int& big, int& small) {
  switch (t) {
    case DType::f64: big = 60, small = -2; return true;
    case DType::f32: big = 40, small = 10; return true;
    case DType::bf16: big = 100, small = 60; return true;
    case DType::f16: big = 12, small = -12; return true;
    case DType::f8_e5m2: big = 12, small = -16; return true;
    default: return false;
  }
}

/// Rank r's element i of the matrix's reduction inputs for (t, op), as bits:
///  - integers: the full range of the type (sums, products and premul_sum wrap; avg of negative
///    wrapped sums truncates toward zero);
///  - floats, sum / avg / premul_sum: +-m * 2^e over a wide exponent range, a few exact +0, and
///    every third element order-sensitive (order_sensitive);
///    prod: +-[0.5, 2) (8 ranks stay in range of every dtype);
///  - floats, min / max: the same plus NaN on one rank of every fifth element and -inf (inf-less
///    e4m3: its largest negative) on one rank of every seventh. No -0 anywhere (min / max of +0
///    and -0 may pick either in fast mode).
inline std::uint64_t input(DType t, Op op, int r, std::int64_t i, std::uint64_t salt = 0) {
  const std::uint64_t h = hash(static_cast<std::uint64_t>(t) * 8 + static_cast<int>(op) + salt,
                               static_cast<std::uint64_t>(r), static_cast<std::uint64_t>(i), 17);
  const Info in = info(t);
  if (!in.floating) return h & mask(t);
  if (op == Op::min || op == Op::max) {
    // The rank holding element i's NaN (none when it is past the rank count).
    const std::uint64_t nan_rank = hash(static_cast<std::uint64_t>(t), salt, static_cast<std::uint64_t>(i), 29) % 8;
    if (i % 5 == 0 && static_cast<std::uint64_t>(r) == nan_rank) return nan_bits(t);
    if (i % 7 == 3 && r == 1)
      return round_to(t, t == DType::f8_e4m3 ? -448.0 : -std::numeric_limits<double>::infinity());
  }
  const double sign = (h >> 40) & 1 ? -1.0 : 1.0;
  const double m = 1.0 + static_cast<double>((h >> 8) & 0xffff) / 65536.0;
  if (op == Op::prod) return round_to(t, sign * m * ((h >> 41) & 1 ? 0.5 : 1.0));
  if (i % 9 == 4 && r == 0) return round_to(t, 0.0);
  int big = 0, small = 0;
  if (i % 3 == 1 && order_sensitive(t, big, small)) {  // bigs that cancel or not, by the order
    if ((h >> 42) & 1) return round_to(t, sign * std::ldexp(1.0, big));
    return round_to(t, sign * std::ldexp(m, small + static_cast<int>((h >> 24) % 3)));
  }
  int lo = 0, hi = 0;
  exp_range(t, lo, hi);
  const int e = lo + static_cast<int>((h >> 24) % static_cast<std::uint64_t>(hi - lo + 1));
  std::uint64_t b = round_to(t, sign * std::ldexp(m, e));
  if (value(t, b) == 0) b = round_to(t, 0.0);  // no -0
  return b;
}

/// Rank r's premul_sum scalar: floats a mix including an inexact 0.1 (converted to the
/// accumulator once); integers integral and representable in every integer type.
inline double scalar(DType t, int r) {
  static const double f[8] = {0.5, -1.25, 2.0, 0.125, 3.0, -0.75, 1.0, 0.1};
  static const double s[8] = {-1, 2, 0, 3, -2, 1, 5, -3};
  static const double u[8] = {1, 2, 0, 3, 7, 1, 5, 4};
  const Info in = info(t);
  return in.floating ? f[r % 8] : in.is_signed ? s[r % 8] : u[r % 8];
}

/// "0x3c00 (1)": an element's bits and value, for failure messages.
inline std::string show(DType t, std::uint64_t b) {
  char buf[64];
  const Info in = info(t);
  if (in.floating)
    std::snprintf(buf, sizeof buf, "0x%llx (%.9g)", static_cast<unsigned long long>(b & mask(t)),
                  value(t, b));
  else if (in.is_signed)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(as_signed(t, b)));
  else
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b & mask(t)));
  return buf;
}

// ---- tensors from and to element bits -----------------------------------------------------------

/// A 1-d tensor of dtype t on d holding v's elements (the low dtype_size bytes of each).
inline Tensor make(DType t, const std::vector<std::uint64_t>& v, const Device& d) {
  Tensor h = Tensor::empty({static_cast<std::int64_t>(v.size())}, t, Device::cpu());
  const std::size_t w = dtype_size(t);
  for (std::size_t i = 0; i < v.size(); ++i)
    std::memcpy(static_cast<unsigned char*>(h.data_ptr()) + i * w, &v[i], w);  // little endian
  return h.to(d);
}
/// The elements of t (any device; blocks) as bits.
inline std::vector<std::uint64_t> read(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const std::size_t w = dtype_size(t.dtype());
  std::vector<std::uint64_t> v(static_cast<std::size_t>(t.numel()), 0);
  for (std::size_t i = 0; i < v.size(); ++i)
    std::memcpy(&v[i], static_cast<const unsigned char*>(h.data_ptr()) + i * w, w);
  return v;
}

}  // namespace ditto::test::ref
