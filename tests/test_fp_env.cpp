// Tests that keep the floating-point environment honest for bitwise mode (DESIGN rule 3, Note
// [Floating-point flags] in CMakeLists.txt): no a*b+c contracted into an fma behind our back, no
// excess precision, round-to-nearest, and no flush-to-zero / denormals-are-zero, neither on the
// main thread nor on the simulator's worker threads that run the kernels.
#include <gtest/gtest.h>

#include <cfenv>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#define DITTO_TEST_X86_MXCSR 1
#endif

#include "backend_sim/sim_backend.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/numerics/portable_math.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

// ---- contraction --------------------------------------------------------------------------------

// Inputs the optimizer cannot see: a = b = 1 + 2^-12, c = -(1 + 2^-11). Then a*b = 1 + 2^-11 +
// 2^-24 exactly, which rounds (a tie, to even) to 1 + 2^-11: a*b + c is 0 with two roundings but
// 2^-24 with one (fma).
volatile float g_a = 1.0f + 0x1p-12f;
volatile float g_b = 1.0f + 0x1p-12f;
volatile float g_c = -(1.0f + 0x1p-11f);

// The expression as kernel code writes it; out of line so it is compiled in a body of its own.
// With -ffp-contract=fast (GCC's default for C++ outside ISO mode) and an FMA-capable -march this
// compiles to one vfmadd and the test below fails.
[[gnu::noinline]] float mul_add(float a, float b, float c) { return a * b + c; }

// The same inside a loop, the shape of a row sum or dot product the vectoriser likes.
[[gnu::noinline]] float dot_plain(const float* x, const float* y, int n) {
  float acc = 0.0f;
  for (int i = 0; i < n; ++i) acc = acc + x[i] * y[i];
  return acc;
}

// Separate roundings forced: the product is stored to a volatile float before the add.
float mul_then_add_reference(float a, float b, float c) {
  volatile float p = a * b;
  return p + c;
}

TEST(FpEnv, InputsDistinguishFusedFromUnfused) {
  const float a = g_a, b = g_b, c = g_c;
  EXPECT_EQ(mul_then_add_reference(a, b, c), 0.0f);
  EXPECT_EQ(std::fma(a, b, c), 0x1p-24f);
  EXPECT_EQ(pmath::fma(a, b, c), 0x1p-24f);
}

TEST(FpEnv, NoContractionOfMultiplyAdd) {
  // Inline first, straight from the volatiles, so the product has no other use (GCC only fuses a
  // product whose every use is an add).
  const float inline_result = g_a * g_b + g_c;
  const float a = g_a, b = g_b, c = g_c;
  const float want = mul_then_add_reference(a, b, c);
  EXPECT_EQ(bits(mul_add(a, b, c)), bits(want))
      << "a*b + c was fused into an fma: is the code built with -ffp-contract=off?";
  EXPECT_EQ(bits(inline_result), bits(want)) << "a*b + c was fused into an fma (inline)";
}

TEST(FpEnv, NoContractionInLoops) {
  // acc = 0 + a*b rounds to 1 + 2^-11 either way; then acc + (-a)*b is 0 with the product
  // rounded first, -2^-24 when fused.
  std::vector<float> x(64, 0.0f), y(64, 0.0f);
  x[0] = g_a;
  y[0] = g_b;
  x[1] = -g_a;
  y[1] = g_b;
  EXPECT_EQ(bits(dot_plain(x.data(), y.data(), static_cast<int>(x.size()))), bits(0.0f))
      << "acc + x*y was fused into an fma";
}

// ---- precision and rounding mode ----------------------------------------------------------------

TEST(FpEnv, NoExcessPrecisionAndRoundToNearest) {
  EXPECT_EQ(FLT_EVAL_METHOD, 0) << "float expressions are evaluated in a wider format";
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);
  // 1 + 2^-24 is a tie between 1 and 1 + 2^-23: to nearest even gives 1; with excess precision
  // the sum minus 1 would be 2^-24.
  volatile float one = 1.0f, tiny = 0x1p-24f;
  const float s = one + tiny;
  EXPECT_EQ(s - one, 0.0f);
}

// ---- flush-to-zero / denormals-are-zero ---------------------------------------------------------

struct FpState {
  bool known = false;  // false where the architecture's control register is not checked here
  bool ftz = false;    // flush-to-zero (MXCSR bit 15; AArch64 FPCR.FZ)
  bool daz = false;    // denormals-are-zero (MXCSR bit 6)
  int rounding = -1;   // std::fegetround()
  float denormal_product = 0.0f;
};

FpState read_fp_state() {
  FpState st;
#if defined(DITTO_TEST_X86_MXCSR)
  const unsigned csr = _mm_getcsr();
  st.known = true;
  st.ftz = (csr & (1u << 15)) != 0;
  st.daz = (csr & (1u << 6)) != 0;
#elif defined(__aarch64__)
  std::uint64_t fpcr = 0;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  st.known = true;
  st.ftz = (fpcr & (std::uint64_t{1} << 24)) != 0;  // FZ flushes both inputs and outputs
  st.daz = st.ftz;
#endif
  st.rounding = std::fegetround();
  volatile float tiny = std::numeric_limits<float>::denorm_min(), one = 1.0f;
  st.denormal_product = tiny * one;  // 0 under DAZ
  return st;
}

void expect_ieee_state(const FpState& st, const std::string& where) {
  if (st.known) {
    EXPECT_FALSE(st.ftz) << "flush-to-zero is on in " << where;
    EXPECT_FALSE(st.daz) << "denormals-are-zero is on in " << where;
  }
  EXPECT_EQ(st.rounding, FE_TONEAREST) << "rounding mode in " << where;
  EXPECT_EQ(st.denormal_product, std::numeric_limits<float>::denorm_min())
      << "denormal flushed in " << where;
}

class FpEnvSim : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 16;
    init_backend("sim", o);
  }
};

TEST(FpEnv, NoFlushToZeroOnMainThread) {
#if !defined(DITTO_TEST_X86_MXCSR) && !defined(__aarch64__)
  std::cout << "[ fp_env   ] control register not checked on this architecture\n";
#endif
  expect_ieee_state(read_fp_state(), "the main thread");
}

TEST_F(FpEnvSim, NoFlushToZeroInStreamWorkers) {
  Backend& backend = get_backend("sim");
  for (int d : {0, 1, 7, 15}) {
    FpState st;
    sim::as_sim(current_stream(Device("sim", d)), "test").run_sync([&] { st = read_fp_state(); });
    expect_ieee_state(st, "the worker of sim:" + std::to_string(d));
  }
  // A stream created later (homed on another pool thread) too.
  std::unique_ptr<Stream> extra = backend.create_stream(3);
  FpState st;
  sim::as_sim(*extra, "test").run_sync([&] { st = read_fp_state(); });
  expect_ieee_state(st, "the worker of a new stream on sim:3");
}

TEST_F(FpEnvSim, KernelsKeepDenormals) {
  const float dmin = std::numeric_limits<float>::denorm_min();
  const float dmax = std::nextafter(std::numeric_limits<float>::min(), 0.0f);
  const float fmin = std::numeric_limits<float>::min();
  const std::vector<float> values = {dmin, 3 * dmin, dmax, -dmin, fmin};
  for (int d : {0, 5, 15}) {
    const Device dev("sim", d);
    // x * 1: denormal inputs survive (no DAZ), denormal outputs survive (no FTZ).
    Tensor x = Tensor::from_vector(values, {5}, dev);
    ops::scale_(x, 1.0f);
    const std::vector<float> same = x.to_vector<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(bits(same[i]), bits(values[i])) << "scale_ by 1 on sim:" << d << " at " << i;
    // Normal inputs whose products are denormal.
    Tensor y = Tensor::from_vector(std::vector<float>{fmin, 0x1p-148f, fmin}, {3}, dev);
    ops::scale_(y, 0.5f);
    const std::vector<float> half = y.to_vector<float>();
    EXPECT_EQ(half[0], 0x1p-127f) << "on sim:" << d;
    EXPECT_EQ(half[1], dmin) << "on sim:" << d;
    // y += 1 * x, from zeros: the denormals pass through an add.
    Tensor z = Tensor::zeros({5}, DType::f32, dev);
    ops::axpy_(1.0f, Tensor::from_vector(values, {5}, dev), z);
    const std::vector<float> sum = z.to_vector<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      EXPECT_EQ(bits(sum[i]), bits(values[i])) << "axpy_ on sim:" << d << " at " << i;
  }
}

TEST_F(FpEnvSim, PortableMathGivesSameBitsOnWorkers) {
  const std::vector<float> xs = {-100.0f, -87.5f, -1.0f, 0.5f, 3.0f, 88.0f, 1e-40f, 1e-3f};
  std::vector<float> on_main, on_worker(2 * xs.size());
  for (float x : xs) {
    on_main.push_back(pmath::exp(x));
    on_main.push_back(pmath::log(x));
  }
  sim::as_sim(current_stream(Device("sim", 2)), "test").run_sync([&] {
    for (std::size_t i = 0; i < xs.size(); ++i) {
      on_worker[2 * i] = pmath::exp(xs[i]);
      on_worker[2 * i + 1] = pmath::log(xs[i]);
    }
  });
  for (std::size_t i = 0; i < on_main.size(); ++i)
    EXPECT_EQ(bits(on_worker[i]), bits(on_main[i])) << "at " << i;
  EXPECT_GT(pmath::exp(-100.0f), 0.0f);  // a denormal result
}

}  // namespace
}  // namespace ditto
