// Portable float transcendentals for bitwise mode (../DESIGN.md, rule 4): exp, expm1, log, log1p,
// tanh and sigmoid, built only from IEEE 754 operations that every conforming platform rounds the
// same way (+, -, *, /, fma), comparisons and bit manipulation. Header-only and DITTO_HD, so the
// simulator's kernels and the CUDA kernels evaluate the very same operation sequence and agree
// bit for bit. Accuracy: exp and log within 1 ulp of the correctly rounded result over the whole
// float range (tests/test_portable_math.cpp measures it); the others within 2 ulp.
//
// Note [Portable math]
// Why: libm's expf/logf and CUDA's __expf/expf differ between platforms, library versions and
// compiler flags, so a bitwise run would not agree across backends. These functions never call
// them; they use float arithmetic only (no double: it is slow on GPUs and would be one more thing
// that differs), in one fixed order.
//
// The order is part of the contract. Every rounding is spelled out with detail::add/sub/mul/div
// and pmath::fma: on the device they are the __f*_rn intrinsics, which nvcc never contracts nor
// reassociates, whatever -fmad or --use_fast_math say; on the host they are the plain operators,
// and the build uses -ffp-contract=off (Note [Floating-point flags] in CMakeLists.txt). Beyond
// that, no rounded product here feeds an add: every product is exact (a power-of-two scaling,
// k*L1) or is an operand of an explicit fma, so a compiler that contracts a*b+c anyway (GCC's
// C++ default, -ffp-contract=fast) has nothing to change (checked with GCC 12 and Clang at -O0
// to -O3, with and without FMA hardware). Keep it so. Do not rewrite a formula below, even into an
// algebraically equal one, without rerunning test_portable_math (GoldenBits) and accepting that
// every bitwise checksum depending on it changes.
//
// exp(x), x in [-104, 89] (outside: 0 and inf; exp(-104) is below half the smallest denormal,
// exp(89) above FLT_MAX):
//   k   = round(x / ln2)                  fma(x, 1/ln2, 1.5*2^23) - 1.5*2^23 (round to nearest)
//   r   = x - k*L                         fma(-k, L, x), L = float(ln2); exact, see exp_reduce
//   c   = -k * (ln2 - L)                  the rest of -k*ln2, |c| < 3e-7
//   q   = (e^r - 1 - r) / r^2             Taylor, 1/2 + r/6 + ... + r^6/8!, Horner with fma
//   a   = r*q;  w = fma(r, a, 1 + r)      w ~ e^r (only multiplies c)
//   v   = fma(r, a, c*w)                  ~ e^(r+c) - 1 - r
//   y   = s + (((1 - s) + r) + v)         s = 1 + r; (1 - s) + r is its exact rounding error
//   exp = y * 2^k                         in two exact-then-rounded steps when k < -125 or > 127,
//                                         so denormal results are rounded once
// expm1 uses the same reduction: r + v when k == 0; for 1 <= |k| <= 24 the three terms
// (2^k - 1) + 2^k*r + 2^k*v are added with an exact two-sum of the first two.
//
// log(x), x positive normal (denormals are scaled by 2^25 first):
//   x = 2^k * m, m in [sqrt(1/2), sqrt(2)),  f = m - 1 (exact)
//   s = f / (2 + f);  z = s*s;  R = 2/3 + z*(2/5 + z*(2/7 + z*(2/9 + z*2/11)))
//   log1p(f) = f - hfsq + s*(hfsq + z*R), hfsq = f*f/2  (2*atanh(s), arranged so that the
//   rounding errors of s and R only touch a term at most f^2/2 in size)
//   log = S + (((fma(k, L2, corr) + tail) + e))  where corr = fma(s, fma(R, z, hfsq), -hfsq),
//   S = k*L1 + f, e its exact rounding error; L1 + L2 = ln2, L1 with 15 bits so k*L1 is exact.
// log1p(x) writes 1 + x = u + t exactly (two-sum) and takes log(u) with tail t/u; |x| < 2^-8
// uses the series x - x^2/2 + x^3/3 - x^4/4.
#pragma once

#include <cmath>  // std::fma
#include <cstdint>
#include <cstring>  // std::memcpy

#include "core/numerics/hd.h"  // includes nothing: canonical_math.h may include this header

namespace ditto::pmath {

/// a * b + c with a single rounding (std::fma on the host, __fmaf_rn on the device).
DITTO_HD inline float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

namespace detail {

// ---- rounded primitives and bit access (Note [Portable math]) --------------------------------

DITTO_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

DITTO_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DITTO_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DITTO_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// The IEEE 754 binary32 encoding of x.
DITTO_HD inline std::uint32_t to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

/// The float whose binary32 encoding is u.
DITTO_HD inline float from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

DITTO_HD inline float abs(float x) { return from_bits(to_bits(x) & 0x7fffffffu); }
DITTO_HD inline float infinity() { return from_bits(0x7f800000u); }
DITTO_HD inline float quiet_nan() { return from_bits(0x7fc00000u); }

/// 2^k exactly, for integer k in [-126, 127].
DITTO_HD inline float pow2(int k) { return from_bits(static_cast<std::uint32_t>(k + 127) << 23); }

/// y * 2^k for y in [0.5, 2) and k in [-152, 128], rounded once: when the result may be denormal
/// the first product is exact and only the second rounds (no double rounding).
DITTO_HD inline float scale(float y, int k) {
  if (k > 127) return mul(mul(y, pow2(127)), pow2(k - 127));
  if (k < -125) return mul(mul(y, pow2(k + 64)), pow2(-64));
  return mul(y, pow2(k));
}

// ---- exp ----------------------------------------------------------------------------------------

inline constexpr float kInvLn2 = 0x1.715476p+0f;     // 1/ln2 rounded
inline constexpr float kShifter = 0x1.8p+23f;        // adding it rounds to an integer
inline constexpr float kLn2 = 0x1.62e430p-1f;        // float(ln2)
inline constexpr float kLn2Rest = -0x1.05c610p-29f;  // ln2 - kLn2, rounded
inline constexpr float kExpMax = 89.0f;              // exp(x) rounds to inf above (88.72...)
inline constexpr float kExpMin = -104.0f;            // exp(x) rounds to 0 below (-103.97...)

/// exp(x) = 2^k * (1 + r + v) (up to ~1e-8 relative), for x in [kExpMin, kExpMax]. r is exact
/// and |r| <= ln2/2 + tiny; v = e^(r + c) - 1 - r with c the rest of -k*ln2.
struct ExpReduced {
  int k;
  float r;
  float v;
};

DITTO_HD inline ExpReduced exp_reduce(float x) {
  const float kf = sub(fma(x, kInvLn2, kShifter), kShifter);
  // Exact: k*kLn2 is a multiple of 2^-24; when k != 0, |x| > 0.34 is a multiple of 2^-25; the
  // difference is a multiple of 2^-25 below 0.5 in magnitude, so it fits in 24 bits.
  const float r = fma(-kf, kLn2, x);
  const float c = mul(-kf, kLn2Rest);
  // q(r) = (e^r - 1 - r) / r^2 = sum_{n>=2} r^(n-2) / n!, to r^6/8! (truncation < 2e-10).
  float q = 0x1.a01a02p-16f;       // 1/8!
  q = fma(q, r, 0x1.a01a02p-13f);  // 1/7!
  q = fma(q, r, 0x1.6c16c2p-10f);  // 1/6!
  q = fma(q, r, 0x1.111112p-7f);   // 1/5!
  q = fma(q, r, 0x1.555556p-5f);   // 1/4!
  q = fma(q, r, 0x1.555556p-3f);   // 1/3!
  q = fma(q, r, 0.5f);             // 1/2!
  const float a = mul(r, q);
  const float w = fma(r, a, add(1.0f, r));  // ~e^r
  const float v = fma(r, a, mul(c, w));     // e^r - 1 - r + c*e^r ~ e^(r+c) - 1 - r
  return {static_cast<int>(kf), r, v};
}

/// 1 + r + v rounded once (r exact, |r| < 1), in [0.70, 1.42].
DITTO_HD inline float one_plus(float r, float v) {
  const float s = add(1.0f, r);
  const float e = add(sub(1.0f, s), r);  // exact rounding error of s (|1| >= |r|)
  return add(s, add(e, v));
}

// ---- log ----------------------------------------------------------------------------------------

inline constexpr float kLn2Hi15 = 0x1.62e400p-1f;   // ln2 to 15 bits: k * kLn2Hi15 is exact
inline constexpr float kLn2Lo15 = 0x1.7f7d1cp-20f;  // ln2 - kLn2Hi15, rounded
inline constexpr std::uint32_t kSqrtHalfBits = 0x3f3504f3u;  // float(sqrt(1/2))

/// log(u) + k0*ln2 + tail for a positive normal finite u and a small tail (|tail| <= 2^-23).
DITTO_HD inline float log_core(float u, int k0, float tail) {
  // u = 2^k * m with m in [sqrt(1/2), sqrt(2)).
  const std::uint32_t iu = to_bits(u) - kSqrtHalfBits;
  const int k = static_cast<int>(iu) >> 23;  // arithmetic shift: k < 0 when u < sqrt(1/2)
  const float m = from_bits((iu & 0x007fffffu) + kSqrtHalfBits);
  const float kf = static_cast<float>(k + k0);
  const float f = sub(m, 1.0f);  // exact (Sterbenz)
  const float s = div(f, add(2.0f, f));
  const float z = mul(s, s);
  // z*R = 2*atanh(s)/s - 2 = sum_{j>=1} 2 z^j / (2j + 1), to z^5 (truncation < 2e-11).
  float R = 0x1.745d18p-3f;       // 2/11
  R = fma(R, z, 0x1.c71c72p-3f);  // 2/9
  R = fma(R, z, 0x1.24924ap-2f);  // 2/7
  R = fma(R, z, 0x1.99999ap-2f);  // 2/5
  R = fma(R, z, 0x1.555556p-1f);  // 2/3
  const float hfsq = mul(mul(0.5f, f), f);
  const float corr = fma(s, fma(R, z, hfsq), -hfsq);  // log1p(f) - f
  const float hi = mul(kf, kLn2Hi15);                 // exact (|k| < 2^8)
  const float S = add(hi, f);
  const float e = add(sub(hi, S), f);  // exact rounding error of S (|hi| >= |f|, or hi = 0)
  const float lo = add(add(fma(kf, kLn2Lo15, corr), tail), e);
  return add(S, lo);
}

}  // namespace detail

// ---- public functions ---------------------------------------------------------------------------

/// e^x. exp(nan) = nan, exp(+-inf) = inf / 0, overflow to inf, gradual underflow to denormals
/// and 0. Within 1 ulp of the correctly rounded value (mirrors expf / torch.exp, portable).
DITTO_HD inline float exp(float x) {
  using namespace detail;
  if (!(x == x)) return add(x, x);  // nan
  if (x > kExpMax) return infinity();
  if (x < kExpMin) return 0.0f;
  const ExpReduced e = exp_reduce(x);
  return scale(one_plus(e.r, e.v), e.k);
}

/// e^x - 1, accurate for small |x| too (expm1f / torch.expm1). Within 2 ulp.
DITTO_HD inline float expm1(float x) {
  using namespace detail;
  if (!(x == x)) return add(x, x);
  if (abs(x) < 0x1p-25f) return x;  // x + x^2/2 rounds to x; keeps the sign of zero
  if (x > kExpMax) return infinity();
  if (x < -17.5f) return -1.0f;  // e^x < 2^-25: rounds to -1
  const ExpReduced e = exp_reduce(x);
  if (e.k == 0) return add(e.r, e.v);
  if (e.k >= -24 && e.k <= 24) {
    const float p = pow2(e.k);
    const float a = sub(p, 1.0f);  // exact for |k| <= 24
    const float b = mul(p, e.r);   // exact
    const float s = add(a, b);
    const float err = add(sub(a, s), b);  // exact rounding error of s (|a| >= |b|)
    return add(s, add(err, mul(p, e.v)));
  }
  if (e.k < 0) return fma(one_plus(e.r, e.v), pow2(e.k), -1.0f);  // k = -25
  // k > 24: the -1 only touches the last bits of 1 + r + v (and nothing once k >= 64).
  const float v = e.k < 64 ? sub(e.v, pow2(-e.k)) : e.v;
  return scale(one_plus(e.r, v), e.k);
}

/// Natural logarithm. log(+-0) = -inf, log(x < 0) = nan, log(inf) = inf, log(nan) = nan,
/// log(1) = +0; denormals handled. Within 1 ulp of the correctly rounded value (logf / torch.log).
DITTO_HD inline float log(float x) {
  using namespace detail;
  const std::uint32_t ix = to_bits(x);
  if (ix >= 0x7f800000u) {                                   // +inf, nan or sign bit set
    if (ix == 0x7f800000u) return x;                         // +inf
    if ((ix & 0x7fffffffu) > 0x7f800000u) return add(x, x);  // nan
    if ((ix & 0x7fffffffu) == 0u) return -infinity();        // -0
    return quiet_nan();                                      // x < 0
  }
  if (ix == 0u) return -infinity();
  if (ix < 0x00800000u) return log_core(mul(x, 0x1p25f), -25, 0.0f);  // denormal
  return log_core(x, 0, 0.0f);
}

/// log(1 + x), accurate for small |x| too (log1pf / torch.log1p). log1p(-1) = -inf, nan below.
/// Within 2 ulp.
DITTO_HD inline float log1p(float x) {
  using namespace detail;
  if (!(x == x)) return add(x, x);
  if (x <= -1.0f) return x == -1.0f ? -infinity() : quiet_nan();
  if (x == infinity()) return x;
  if (abs(x) < 0x1p-8f) {
    // x - x^2/2 + x^3/3 - x^4/4 (truncation below 2^-34 relative); keeps the sign of zero.
    float p = fma(x, -0.25f, 0x1.555556p-2f);
    p = fma(x, p, -0.5f);
    return fma(mul(x, x), p, x);
  }
  // 1 + x = u + t exactly (two-sum); log(u + t) = log(u) + t/u up to (t/u)^2 < 2^-48.
  const float u = add(1.0f, x);
  const float b = sub(u, 1.0f);
  const float t = add(sub(1.0f, sub(u, b)), sub(x, b));
  return log_core(u, 0, div(t, u));
}

/// Hyperbolic tangent (tanhf / torch.tanh), from expm1. Within 2 ulp; odd, tanh(+-inf) = +-1.
DITTO_HD inline float tanh(float x) {
  using namespace detail;
  if (!(x == x)) return add(x, x);
  const float ax = abs(x);
  if (ax < 0x1p-12f) return x;  // x - x^3/3 rounds to x
  float z;
  if (ax >= 9.1f) {
    z = 1.0f;  // 1 - tanh < 2^-25
  } else if (ax >= 1.0f) {
    const float t = expm1(mul(2.0f, ax));
    z = sub(1.0f, div(2.0f, add(t, 2.0f)));
  } else {
    const float t = expm1(mul(-2.0f, ax));
    z = div(-t, add(t, 2.0f));
  }
  return x < 0.0f ? -z : z;
}

/// tanh(x) with the same bits as tanh() above for every x, written without branches: every
/// path of tanh and of the expm1 it calls is evaluated and the result selected (each path's
/// operations exactly as there; the paths not taken may compute inf or nan, which are
/// discarded). A loop over it vectorises (the simulator's GELU kernels, sim_kernels_gpt.cpp),
/// where tanh's branches keep each element scalar. The ranges it relies on: for
/// 2^-12 <= |x| < 9.1, expm1's argument y = -2|x| (|x| < 1) or 2|x| lies in [-2, 18.2], where
/// expm1 takes neither its nan, tiny, overflow nor -1 shortcut, and k = round(y / ln2) is in
/// [-3, 27], so only its k == 0, |k| <= 24 and 24 < k < 64 paths occur, and scale() is one
/// multiplication. tests/test_portable_math.cpp compares the bits with tanh() over a sweep.
DITTO_HD inline float tanh_branchless(float x) {
  using namespace detail;
  const float ax = abs(x);
  const bool big = ax >= 1.0f;
  // Clamped so that k stays in range for the discarded lanes (and nan gives a number).
  const float axc = ax < 9.1f ? ax : 9.1f;
  const float y = mul(big ? 2.0f : -2.0f, axc);
  const ExpReduced e = exp_reduce(y);
  const float t0 = add(e.r, e.v);  // k == 0
  const float p = pow2(e.k);
  const float a = sub(p, 1.0f);
  const float b = mul(p, e.r);
  const float s = add(a, b);
  const float err = add(sub(a, s), b);
  const float t1 = add(s, add(err, mul(p, e.v)));                // |k| <= 24
  const float t2 = mul(one_plus(e.r, sub(e.v, pow2(-e.k))), p);  // 24 < k < 64
  const float t = e.k == 0 ? t0 : (e.k <= 24 ? t1 : t2);
  const float z_big = sub(1.0f, div(2.0f, add(t, 2.0f)));
  const float z_small = div(-t, add(t, 2.0f));
  const float z = ax >= 9.1f ? 1.0f : (big ? z_big : z_small);
  const float r = ax < 0x1p-12f ? x : (x < 0.0f ? -z : z);
  return x == x ? r : add(x, x);
}

/// Logistic sigmoid 1 / (1 + e^-x) (torch.sigmoid), from exp, without overflow: e^x / (1 + e^x)
/// for x < 0, so tiny results stay accurate down to the denormals. Within 2 ulp.
DITTO_HD inline float sigmoid(float x) {
  using namespace detail;
  if (!(x == x)) return add(x, x);
  if (x >= 0.0f) return div(1.0f, add(1.0f, exp(-x)));
  const float e = exp(x);
  return div(e, add(1.0f, e));
}

}  // namespace ditto::pmath
