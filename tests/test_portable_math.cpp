// Tests of core/numerics/portable_math.h (DESIGN rule 4): accuracy of pmath::exp, log, expm1,
// log1p, tanh and sigmoid against long double libm (ulp distance on the float bit patterns) over a
// dense sweep of the float range and at the edge values, and bit-identical results whether a
// function is inlined into a loop or called through a function pointer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "core/numerics/gpt_math.h"
#include "core/numerics/portable_math.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

float from_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Position of x on the number line counted in floats (-0 and +0 both map to 0).
std::int64_t ordinal(float x) {
  const std::uint32_t u = bits(x);
  return (u >> 31) ? -static_cast<std::int64_t>(u & 0x7fffffffu) : static_cast<std::int64_t>(u);
}

constexpr std::int64_t kNanMismatch = std::int64_t{1} << 40;

// Distance in ulps between two floats; both nan counts as 0, one nan as a huge distance.
std::int64_t ulp_distance(float got, float want) {
  if (std::isnan(got) || std::isnan(want))
    return std::isnan(got) && std::isnan(want) ? 0 : kNanMismatch;
  const std::int64_t d = ordinal(got) - ordinal(want);
  return d < 0 ? -d : d;
}

using Fn = float (*)(float);
using RefFn = long double (*)(long double);

long double ref_exp(long double x) { return std::exp(x); }
long double ref_log(long double x) { return std::log(x); }
long double ref_expm1(long double x) { return std::expm1(x); }
long double ref_log1p(long double x) { return std::log1p(x); }
long double ref_tanh(long double x) { return std::tanh(x); }
long double ref_sigmoid(long double x) { return 1.0L / (1.0L + std::exp(-x)); }

// The reference: the long double result rounded to float (correctly rounded except when the
// exact value lies within 2^-40 relative of a midpoint between two floats).
float reference(RefFn ref, float x) { return static_cast<float>(ref(static_cast<long double>(x))); }

struct SweepResult {
  std::int64_t max_ulp = 0;
  float worst_x = 0.0f;
  std::uint64_t count = 0;
};

// Every `stride`-th bit pattern in [first, last] (inclusive, as unsigned encodings).
void sweep(Fn f, RefFn ref, std::uint32_t first, std::uint32_t last, std::uint32_t stride,
           SweepResult& res) {
  for (std::uint64_t u = first; u <= last; u += stride) {
    const float x = from_bits(static_cast<std::uint32_t>(u));
    const std::int64_t d = ulp_distance(f(x), reference(ref, x));
    ++res.count;
    if (d > res.max_ulp) {
      res.max_ulp = d;
      res.worst_x = x;
    }
  }
}

// A Release build sweeps every 257th bit pattern for exp and log (~8M points each); other builds
// (Debug, -O1 sanitizers) take a sparser sweep so the suite stays fast.
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
constexpr std::uint32_t kStrideMain = 257;
constexpr std::uint32_t kStrideOther = 2053;
#else
constexpr std::uint32_t kStrideMain = 257 * 8 + 1;
constexpr std::uint32_t kStrideOther = 2053 * 8 + 3;
#endif

constexpr std::uint32_t kNegZero = 0x80000000u;

struct Range {
  float lo, hi;  // sweep covers [lo, hi] (through 0 when lo < 0 < hi)
};

// Sweeps both signs of [r.lo, r.hi], records and prints the max ulp error, and checks the bound.
void check_accuracy(const char* name, Fn f, RefFn ref, Range r, std::uint32_t stride,
                    std::int64_t bound) {
  SweepResult res;
  if (r.lo < 0.0f) sweep(f, ref, kNegZero, bits(r.lo), stride, res);
  if (r.hi > 0.0f) sweep(f, ref, r.lo > 0.0f ? bits(r.lo) : 0u, bits(r.hi), stride, res);
  std::cout << "[ pmath    ] " << name << ": max error " << res.max_ulp << " ulp over " << res.count
            << " inputs (stride " << stride << "), worst at " << std::hexfloat << res.worst_x
            << std::defaultfloat << "\n";
  ::testing::Test::RecordProperty(std::string("max_ulp_") + name, static_cast<int>(res.max_ulp));
  EXPECT_LE(res.max_ulp, bound) << name << " worst at x = " << std::hexfloat << res.worst_x
                                << ": got " << f(res.worst_x) << ", want "
                                << reference(ref, res.worst_x);
}

// Each value of `xs` and its `n` neighbours on each side, against the reference.
void check_near(const char* name, Fn f, RefFn ref, const std::vector<float>& xs, int n,
                std::int64_t bound) {
  for (float x0 : xs) {
    for (int i = -n; i <= n; ++i) {
      const std::int64_t o = ordinal(x0) + i;
      const float x = o >= 0 ? from_bits(static_cast<std::uint32_t>(o))
                             : from_bits(static_cast<std::uint32_t>(-o) | 0x80000000u);
      if (std::isnan(x)) continue;
      EXPECT_LE(ulp_distance(f(x), reference(ref, x)), bound)
          << name << "(" << std::hexfloat << x << ") = " << f(x) << ", want " << reference(ref, x);
    }
  }
}

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
const float kDenormMin = std::numeric_limits<float>::denorm_min();
const float kDenormMax = from_bits(0x007fffffu);
const float kFltMin = std::numeric_limits<float>::min();
const float kFltMax = std::numeric_limits<float>::max();

bool is_pos_zero(float x) { return bits(x) == 0u; }
bool is_neg_zero(float x) { return bits(x) == 0x80000000u; }

// ---- accuracy sweeps ----------------------------------------------------------------------------

TEST(PortableMath, ExpWithinOneUlpOnDenseSweep) {
  check_accuracy("exp", pmath::exp, ref_exp, {-104.5f, 89.5f}, kStrideMain, 1);
}

TEST(PortableMath, LogWithinOneUlpOnDenseSweep) {
  check_accuracy("log", pmath::log, ref_log, {kDenormMin, kFltMax}, kStrideMain, 1);
}

TEST(PortableMath, Expm1Log1pWithinOneUlpOnSweep) {
  check_accuracy("expm1", pmath::expm1, ref_expm1, {-18.0f, 89.5f}, kStrideOther, 1);
  check_accuracy("log1p", pmath::log1p, ref_log1p, {-1.0f, kFltMax}, kStrideOther, 1);
}

TEST(PortableMath, TanhSigmoidWithinTwoUlpOnSweep) {
  check_accuracy("tanh", pmath::tanh, ref_tanh, {-10.0f, 10.0f}, kStrideOther, 2);
  check_accuracy("sigmoid", pmath::sigmoid, ref_sigmoid, {-105.0f, 20.0f}, kStrideOther, 2);
}

// ---- edge values --------------------------------------------------------------------------------

TEST(PortableMath, ExpEdgeValues) {
  EXPECT_EQ(bits(pmath::exp(0.0f)), bits(1.0f));
  EXPECT_EQ(bits(pmath::exp(-0.0f)), bits(1.0f));
  EXPECT_EQ(pmath::exp(kDenormMin), 1.0f);
  EXPECT_EQ(pmath::exp(-kDenormMin), 1.0f);
  EXPECT_EQ(pmath::exp(kInf), kInf);
  EXPECT_TRUE(is_pos_zero(pmath::exp(-kInf)));
  EXPECT_TRUE(std::isnan(pmath::exp(kNan)));
  EXPECT_EQ(pmath::exp(kFltMax), kInf);
  EXPECT_TRUE(is_pos_zero(pmath::exp(-kFltMax)));
  EXPECT_EQ(pmath::exp(1.0f), 0x1.5bf0a8p+1f);  // e, correctly rounded
  // Overflow threshold: ln(FLT_MAX + ulp/2) = 88.7228391...
  EXPECT_EQ(pmath::exp(0x1.62e42ep+6f), 0x1.ffff08p+127f);
  EXPECT_EQ(pmath::exp(0x1.62e430p+6f), kInf);
  // Smallest normal result, the denormal range and underflow to 0 (threshold -103.972...).
  EXPECT_EQ(pmath::exp(-0x1.5d589ep+6f), reference(ref_exp, -0x1.5d589ep+6f));
  EXPECT_EQ(pmath::exp(-103.0f), reference(ref_exp, -103.0f));
  EXPECT_GT(pmath::exp(-103.0f), 0.0f);
  EXPECT_EQ(pmath::exp(-0x1.9fe368p+6f), kDenormMin);  // -103.9720...: rounds up to 2^-149
  EXPECT_TRUE(is_pos_zero(pmath::exp(-0x1.9fe36ap+6f)));
  EXPECT_TRUE(is_pos_zero(pmath::exp(-104.0f)));
  check_near("exp", pmath::exp, ref_exp,
             {0.0f, 1.0f, -1.0f, 0x1.62e42ep+6f, -0x1.5d589ep+6f, -0x1.9fe368p+6f, -87.0f, -100.0f,
              0x1p-25f, -0x1p-25f, 0.34657359f, -0.34657359f, 10.0f, -10.0f},
             64, 1);
}

TEST(PortableMath, LogEdgeValues) {
  EXPECT_EQ(pmath::log(0.0f), -kInf);
  EXPECT_EQ(pmath::log(-0.0f), -kInf);
  EXPECT_TRUE(std::isnan(pmath::log(-1.0f)));
  EXPECT_TRUE(std::isnan(pmath::log(-kDenormMin)));
  EXPECT_TRUE(std::isnan(pmath::log(-kInf)));
  EXPECT_TRUE(std::isnan(pmath::log(kNan)));
  EXPECT_EQ(pmath::log(kInf), kInf);
  EXPECT_TRUE(is_pos_zero(pmath::log(1.0f)));                         // exactly +0
  EXPECT_EQ(pmath::log(kDenormMin), reference(ref_log, kDenormMin));  // -103.2789...
  EXPECT_EQ(pmath::log(kDenormMin), -0x1.9d1da0p+6f);
  EXPECT_EQ(pmath::log(2.0f), 0x1.62e430p-1f);  // float(ln2)
  check_near("log", pmath::log, ref_log,
             {kDenormMin, kDenormMax, kFltMin, kFltMax, 1.0f, 2.0f, 0.5f, 0x1.6a09e6p-1f,
              0x1.6a09e6p+0f, 10.0f, 1e-30f, 1e30f},
             64, 1);
}

TEST(PortableMath, Expm1Log1pEdgeValues) {
  EXPECT_TRUE(is_neg_zero(pmath::expm1(-0.0f)));
  EXPECT_TRUE(is_pos_zero(pmath::expm1(0.0f)));
  EXPECT_EQ(pmath::expm1(kDenormMin), kDenormMin);
  EXPECT_EQ(pmath::expm1(kInf), kInf);
  EXPECT_EQ(pmath::expm1(-kInf), -1.0f);
  EXPECT_EQ(pmath::expm1(-20.0f), -1.0f);
  EXPECT_TRUE(std::isnan(pmath::expm1(kNan)));
  EXPECT_TRUE(is_neg_zero(pmath::log1p(-0.0f)));
  EXPECT_TRUE(is_pos_zero(pmath::log1p(0.0f)));
  EXPECT_EQ(pmath::log1p(-kDenormMin), -kDenormMin);
  EXPECT_EQ(pmath::log1p(-1.0f), -kInf);
  EXPECT_TRUE(std::isnan(pmath::log1p(-2.0f)));
  EXPECT_TRUE(std::isnan(pmath::log1p(-kInf)));
  EXPECT_TRUE(std::isnan(pmath::log1p(kNan)));
  EXPECT_EQ(pmath::log1p(kInf), kInf);
  check_near("expm1", pmath::expm1, ref_expm1,
             {0x1p-25f, -0x1p-25f, 0.34657359f, -0.34657359f, 16.6f, -16.6f, -17.33f, -17.5f,
              0x1.62e42ep+6f, 44.0f},
             64, 1);
  check_near("log1p", pmath::log1p, ref_log1p,
             {0x1p-8f, -0x1p-8f, -0.5f, -0x1.fffffep-1f, 1.0f, 0x1p24f, kFltMax, 1e-20f}, 64, 1);
}

TEST(PortableMath, TanhSigmoidEdgeValues) {
  EXPECT_TRUE(is_neg_zero(pmath::tanh(-0.0f)));
  EXPECT_TRUE(is_pos_zero(pmath::tanh(0.0f)));
  EXPECT_EQ(pmath::tanh(kDenormMin), kDenormMin);
  EXPECT_EQ(pmath::tanh(kInf), 1.0f);
  EXPECT_EQ(pmath::tanh(-kInf), -1.0f);
  EXPECT_EQ(pmath::tanh(20.0f), 1.0f);
  EXPECT_TRUE(std::isnan(pmath::tanh(kNan)));
  for (float x : {0.001f, 0.3f, 0.99f, 1.0f, 2.5f, 9.0f})
    EXPECT_EQ(bits(pmath::tanh(-x)), bits(-pmath::tanh(x))) << "tanh is odd at " << x;
  EXPECT_EQ(pmath::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(pmath::sigmoid(-0.0f), 0.5f);
  EXPECT_EQ(pmath::sigmoid(kInf), 1.0f);
  EXPECT_TRUE(is_pos_zero(pmath::sigmoid(-kInf)));
  EXPECT_EQ(pmath::sigmoid(100.0f), 1.0f);
  EXPECT_GT(pmath::sigmoid(-100.0f), 0.0f);  // a denormal, not 0 (1 / (1 + e^100) would be)
  EXPECT_TRUE(std::isnan(pmath::sigmoid(kNan)));
  check_near("tanh", pmath::tanh, ref_tanh, {0x1p-12f, 1.0f, 9.1f, -9.1f}, 64, 2);
  check_near("sigmoid", pmath::sigmoid, ref_sigmoid,
             {-100.0f, -87.0f, -103.9f, 16.6f, 17.0f, 0x1p-20f, -0x1p-20f}, 64, 2);
}

// ---- same bits in every calling context ---------------------------------------------------------

// Calls through a function pointer the optimizer cannot see through, so the function is compiled
// once, out of line.
float call_opaque(Fn f, float x) {
  Fn volatile g = f;
  return g(x);
}

template <Fn F>
void expect_inline_matches_pointer(const char* name) {
  std::vector<float> xs;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65521)
    xs.push_back(from_bits(static_cast<std::uint32_t>(u)));
  // Inlined into a loop the compiler may unroll and vectorise.
  std::vector<float> inlined(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) inlined[i] = F(xs[i]);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float opaque = call_opaque(F, xs[i]);
    if (bits(opaque) != bits(inlined[i]) && !(std::isnan(opaque) && std::isnan(inlined[i]))) {
      if (++mismatches <= 5)
        ADD_FAILURE() << name << "(" << std::hexfloat << xs[i] << "): inline " << inlined[i]
                      << " vs function pointer " << opaque;
    }
  }
  EXPECT_EQ(mismatches, 0u) << name;
}

TEST(PortableMath, InlineAndFunctionPointerGiveSameBits) {
  expect_inline_matches_pointer<pmath::exp>("exp");
  expect_inline_matches_pointer<pmath::log>("log");
  expect_inline_matches_pointer<pmath::expm1>("expm1");
  expect_inline_matches_pointer<pmath::log1p>("log1p");
  expect_inline_matches_pointer<pmath::tanh>("tanh");
  expect_inline_matches_pointer<pmath::sigmoid>("sigmoid");
}

// tanh_branchless is tanh's operations without branches: the same bits for every input. Every
// 97th float bit pattern (44 million, both signs, denormals, inf and nan included) and every
// float in [-10, 10] within 64 ulp of the branch points (2^-12, 1, 9.1 and where expm1's k
// changes path), in a loop the compiler vectorises, as the GELU kernels' loops are.
TEST(PortableMath, TanhBranchlessHasTanhsBitsEverywhere) {
  std::vector<float> xs;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 97)
    xs.push_back(from_bits(static_cast<std::uint32_t>(u)));
  const float edges[] = {0x1p-12f, 1.0f, 9.1f, 0.5f * 0.34657359f, 8.3177662f, 8.6643398f};
  for (float e : edges)
    for (float sign : {1.0f, -1.0f})
      for (int d = -64; d <= 64; ++d)
        xs.push_back(sign *
                     from_bits(static_cast<std::uint32_t>(static_cast<std::int64_t>(bits(e)) + d)));
  for (float v : {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                  std::numeric_limits<float>::denorm_min()})
    xs.push_back(v);
  std::vector<float> got(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) got[i] = pmath::tanh_branchless(xs[i]);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float want = pmath::tanh(xs[i]);
    const bool same = bits(got[i]) == bits(want) || (std::isnan(got[i]) && std::isnan(want));
    if (!same && ++bad <= 5)
      ADD_FAILURE() << "tanh_branchless(" << xs[i] << " = 0x" << std::hex << bits(xs[i]) << ") = 0x"
                    << bits(got[i]) << ", tanh = 0x" << bits(want) << std::dec;
  }
  EXPECT_EQ(bad, 0u) << "of " << xs.size();
}

// The GELU kernels' branch-free forms (gpt::gelu<true>, gelu_grad<true>, run by the simulator)
// against the scalar ones the CUDA kernels run: same bits, every 997th float in [-16, 16] and the
// specials.
TEST(PortableMath, BranchlessGeluHasTheScalarGelusBits) {
  std::vector<float> xs;
  for (std::uint32_t u = 0; u < 0x41800000u; u += 997) {  // [0, 16)
    xs.push_back(from_bits(u));
    xs.push_back(-from_bits(u));
  }
  for (float v : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), 1e30f, -1e30f})
    xs.push_back(v);
  std::vector<float> f(xs.size()), g(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    f[i] = gpt::gelu<true>(xs[i]);
    g[i] = gpt::gelu_grad<true>(xs[i], 0.75f);
  }
  std::size_t bad = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float wf = gpt::gelu(xs[i]), wg = gpt::gelu_grad(xs[i], 0.75f);
    const auto same = [](float a, float b) {
      return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b));
    };
    if ((!same(f[i], wf) || !same(g[i], wg)) && ++bad <= 5)
      ADD_FAILURE() << "x = " << xs[i] << ": gelu " << f[i] << " vs " << wf << ", grad " << g[i]
                    << " vs " << wg;
  }
  EXPECT_EQ(bad, 0u) << "of " << xs.size();
}

// Golden bits: these exact results on every platform and backend (bitwise checksums depend on
// them). A change here is a change of the bitwise contract.
TEST(PortableMath, GoldenBits) {
  // Computed once from this implementation; each equals the correctly rounded value.
  EXPECT_EQ(bits(pmath::exp(0.5f)), 0x3fd3094cu);       // 0x1.a61298p+0
  EXPECT_EQ(bits(pmath::exp(-3.25f)), 0x3d1ed1b4u);     // 0x1.3da368p-5
  EXPECT_EQ(bits(pmath::log(3.0f)), 0x3f8c9f54u);       // 0x1.193ea8p+0
  EXPECT_EQ(bits(pmath::log(1e-3f)), 0xc0dd0c55u);      // -0x1.ba18aap+2
  EXPECT_EQ(bits(pmath::expm1(1e-3f)), 0x3a832337u);    // 0x1.06466ep-10
  EXPECT_EQ(bits(pmath::log1p(0.1f)), 0x3dc331fcu);     // 0x1.8663f8p-4
  EXPECT_EQ(bits(pmath::tanh(0.75f)), 0x3f22991fu);     // 0x1.45323ep-1
  EXPECT_EQ(bits(pmath::sigmoid(-2.0f)), 0x3df420a9u);  // 0x1.e84152p-4
}

}  // namespace
}  // namespace ditto
