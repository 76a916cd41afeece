// The CUDA attention kernels (backend_cuda/cuda_attention.cu, Note [CUDA attention]) on a GPU,
// through ops::attention / ops::attention_backward: bitwise mode equals the simulator bit for bit
// (y, stats, dqkv) and fast mode (the flash attention) is within its tolerance of the
// simulator's result, on the head-width classes 32, 64 and 128 and the reference kernels past
// them, T not a multiple of the tile, with and without dropout, at GPT sizes (GPT-2's 12 heads of
// 64, nanoGPT's char model's 6 heads of 64). Without a usable GPU every CUDA test skips with the
// reason (tools/gpu-check-tests.txt lists them for the GPU check); their CPU half is ctest
// CudaEmu.Kernels (tools/cuda_emu/test_emu_gpt.cpp), which runs the same kernels on the CPU.
// AttentionMode.* runs everywhere: the simulator's one order in both modes, a bad mode refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/numerics/random.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaAttention = CudaSuite<>;  // kCudaTestDevices
using AttentionMode = SimSuite<2>;

std::vector<float> uniform_values(std::size_t n, unsigned seed, float r = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-r, r);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

struct AttnRun {
  std::vector<float> y, stats, dqkv;
};

// Forward and backward of one (B, T, C, nh) on `backend`'s device 0 in `mode`; with_y: the
// backward given the forward's output (fast mode reads pd = rowsum(dy * y) from it).
AttnRun run_attention(const char* backend, const std::vector<float>& qkv,
                      const std::vector<float>& dy, std::int64_t B, std::int64_t T, std::int64_t C,
                      std::int64_t nh, float p, Determinism mode, bool with_y = false) {
  const Device d(backend, 0);
  const Tensor tqkv = Tensor::from_vector(qkv, {B, T, 3 * C}).to(d);
  const Tensor tdy = Tensor::from_vector(dy, {B, T, C}).to(d);
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(5) << 8) | 1);
  Tensor stats;
  const Tensor y = ops::attention(tqkv, nh, stats, p, 1234, stream, 77, mode);
  const Tensor dqkv = ops::attention_backward(tdy, tqkv, stats, nh, p, 1234, stream, 77, mode,
                                              with_y ? y : Tensor());
  return {y.to_vector<float>(), stats.to_vector<float>(), dqkv.to_vector<float>()};
}

// The largest |got - want| / (1 + |want|).
double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0.0;
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]) / (1.0 + std::fabs(double(want[i])));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return got.size() == want.size() ? e : INFINITY;
}

// Fast mode's tolerance against the simulator's (bitwise) result: Note [CUDA attention]'s 2e-5
// against double for each of the two.
constexpr double kFastVsBitwiseTol = 4e-5;

struct AttnShape {
  std::int64_t B, T, C, nh;
};

const std::vector<AttnShape>& shapes() {
  static const std::vector<AttnShape> s = {
      {4, 256, 768, 12},  // GPT-2 124M's heads (hd 64), 8 query tiles
      {2, 300, 384, 6},   // nanoGPT char model's heads, T not a multiple of 32
      {2, 100, 256, 2},   // hd 128: 16 x 16 tiles
      {3, 45, 32, 2},     // hd 16: the 32 class
      {1, 40, 272, 2}};   // hd 136: the reference kernels
  return s;
}

TEST_F(CudaAttention, BitwiseEqualsTheSimulatorAndFastIsWithinTolerance) {
  unsigned seed = 1;
  for (const AttnShape& s : shapes())
    for (float p : {0.0f, 0.1f}) {
      SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " C " +
                   std::to_string(s.C) + " nh " + std::to_string(s.nh) + " p " + std::to_string(p));
      const std::vector<float> qkv = uniform_values(std::size_t(s.B * s.T * 3 * s.C), seed++);
      const std::vector<float> dy = uniform_values(std::size_t(s.B * s.T * s.C), seed++);
      const AttnRun sim =
          run_attention("sim", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::bitwise);
      // The backward given the forward's y (bitwise ignores it; fast reads pd from it: 7
      // products) and not (fast recomputes pd: 9).
      for (bool with_y : {false, true}) {
        SCOPED_TRACE(with_y ? "given y" : "no y");
        const AttnRun bit =
            run_attention("cuda", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::bitwise, with_y);
        EXPECT_TRUE(bits_equal(bit.y, sim.y)) << "y";
        EXPECT_TRUE(bits_equal(bit.stats, sim.stats)) << "stats";
        EXPECT_TRUE(bits_equal(bit.dqkv, sim.dqkv)) << "dqkv";
        const AttnRun fast =
            run_attention("cuda", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::fast, with_y);
        EXPECT_LE(rel_error(fast.y, sim.y), kFastVsBitwiseTol) << "y";
        EXPECT_LE(rel_error(fast.stats, sim.stats), kFastVsBitwiseTol) << "stats";
        EXPECT_LE(rel_error(fast.dqkv, sim.dqkv), kFastVsBitwiseTol) << "dqkv";
      }
    }
}

// ---- the typed attention (Kernels::attention_forward_ex / attention_backward_ex) --------------

// Forward and backward of one (B, T, C, nh) on `backend`'s device 0 with qkv and dy stored as
// `dtype` (the values given, rounded to it); results widened to f32 (exact). with_y: the backward
// is given the forward's output (as nn::CausalSelfAttention gives it: fast mode's D from it).
AttnRun run_typed(const char* backend, const std::vector<float>& qkv, const std::vector<float>& dy,
                  DType dtype, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                  float p, Determinism mode, bool with_y = true) {
  const Device d(backend, 0);
  const Tensor tqkv = Tensor::from_vector(qkv, {B, T, 3 * C}).to(d).to(dtype);
  const Tensor tdy = Tensor::from_vector(dy, {B, T, C}).to(d).to(dtype);
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(5) << 8) | 2);
  Tensor stats;
  const Tensor y = ops::attention(tqkv, nh, stats, p, 99, stream, 5, mode);
  const Tensor dqkv =
      ops::attention_backward(tdy, tqkv, stats, nh, p, 99, stream, 5, mode, with_y ? y : Tensor());
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_EQ(dqkv.dtype(), dtype);
  return {y.to(DType::f32).to_vector<float>(), stats.to_vector<float>(),
          dqkv.to(DType::f32).to_vector<float>()};
}

// The values of v once rounded to dtype (what the device tensors hold).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  return Tensor::from_vector(v, {std::int64_t(v.size())})
      .to(dtype)
      .to(DType::f32)
      .to_vector<float>();
}

// Causal attention in double (y, dqkv) from qkv and dy, with the dropout mask of run_typed.
std::pair<std::vector<double>, std::vector<double>> double_attention(const std::vector<float>& qkv,
                                                                     const std::vector<float>& dy,
                                                                     std::int64_t B, std::int64_t T,
                                                                     std::int64_t C,
                                                                     std::int64_t nh, float p) {
  const std::int64_t hd = C / nh, W = 3 * C;
  const double scale = 1.0 / std::sqrt(double(hd));
  const double ds = p > 0 ? 1.0 / (1.0 - double(p)) : 1.0;
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(5) << 8) | 2);
  std::vector<double> y(std::size_t(B * T * C), 0.0), dqkv(std::size_t(B * T * W), 0.0);
  std::vector<double> s(T), att(T), a(T), dp(T), da(T);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const float* q = qkv.data() + (b * T + t) * W + h * hd;
        const float* g = dy.data() + (b * T + t) * C + h * hd;
        double m = -INFINITY, sum = 0.0, pd = 0.0;
        for (std::int64_t u = 0; u <= t; ++u) {
          const float* k = qkv.data() + (b * T + u) * W + C + h * hd;
          double x = 0.0, e = 0.0;
          for (std::int64_t i = 0; i < hd; ++i)
            x += double(q[i]) * k[i], e += double(g[i]) * k[C + i];
          s[u] = x * scale;
          dp[u] = e;
          m = std::max(m, s[u]);
        }
        for (std::int64_t u = 0; u <= t; ++u) sum += std::exp(s[u] - m);
        const std::uint64_t row = std::uint64_t(((b * nh + h) * T + t) * T);
        for (std::int64_t u = 0; u <= t; ++u) {
          att[u] = std::exp(s[u] - m) / sum;
          const bool keep = p == 0 || uniform01(99, stream, 5 + row + std::uint64_t(u)) >= p;
          a[u] = keep ? att[u] * ds : 0.0;
          da[u] = keep ? dp[u] * ds : 0.0;
          pd += att[u] * da[u];
        }
        for (std::int64_t u = 0; u <= t; ++u) {
          const float* k = qkv.data() + (b * T + u) * W + C + h * hd;
          const double dpre = att[u] * (da[u] - pd) * scale;
          for (std::int64_t i = 0; i < hd; ++i) {
            y[(b * T + t) * C + h * hd + i] += a[u] * k[C + i];
            dqkv[(b * T + t) * W + h * hd + i] += dpre * k[i];
            dqkv[(b * T + u) * W + C + h * hd + i] += dpre * q[i];
            dqkv[(b * T + u) * W + 2 * C + h * hd + i] += a[u] * g[i];
          }
        }
      }
  return {y, dqkv};
}

// max |got - want| / (u (1 + max |want|)), u the unit roundoff (Note [CUDA attention]'s bound).
double error_in_u(const std::vector<float>& got, const std::vector<double>& want, double u) {
  double scale = 0.0, e = 0.0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]) / (u * (1.0 + scale));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return got.size() == want.size() ? e : INFINITY;
}

// bf16 / f16 qkv on the GPU: bitwise mode (the typed SIMT kernels) gives the simulator's MixedOp
// bits; fast mode (the tensor-core FlashAttention-2 for hd 64 and 128, the SIMT fast kernels with
// typed loads otherwise) is within 4 u (1 + max |ref|) of a double reference from the same
// rounded inputs (tools/cuda_emu/test_emu_attention.cpp's tolerance).
TEST_F(CudaAttention, TypedBitwiseEqualsTheSimulatorAndFastIsWithinTolerance) {
  unsigned seed = 100;
  for (DType dtype : {DType::bf16, DType::f16})
    for (const AttnShape& s : shapes()) {
      if (s.C / s.nh > 128) continue;  // has_attention_ex: false (MixedOp, tested above)
      for (float p : {0.0f, 0.1f}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " B " + std::to_string(s.B) + " T " +
                     std::to_string(s.T) + " C " + std::to_string(s.C) + " nh " +
                     std::to_string(s.nh) + " p " + std::to_string(p));
        const std::vector<float> qkv =
            rounded(uniform_values(std::size_t(s.B * s.T * 3 * s.C), seed++), dtype);
        const std::vector<float> dy =
            rounded(uniform_values(std::size_t(s.B * s.T * s.C), seed++), dtype);
        const AttnRun sim =
            run_typed("sim", qkv, dy, dtype, s.B, s.T, s.C, s.nh, p, Determinism::bitwise);
        const AttnRun bit =
            run_typed("cuda", qkv, dy, dtype, s.B, s.T, s.C, s.nh, p, Determinism::bitwise);
        EXPECT_TRUE(bits_equal(bit.y, sim.y)) << "y";
        EXPECT_TRUE(bits_equal(bit.stats, sim.stats)) << "stats";
        EXPECT_TRUE(bits_equal(bit.dqkv, sim.dqkv)) << "dqkv";
        const AttnRun fast =
            run_typed("cuda", qkv, dy, dtype, s.B, s.T, s.C, s.nh, p, Determinism::fast);
        const auto ref = double_attention(qkv, dy, s.B, s.T, s.C, s.nh, p);
        const double u = dtype == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
        EXPECT_LE(error_in_u(fast.y, ref.first, u), 4.0) << "y";
        EXPECT_LE(error_in_u(fast.dqkv, ref.second, u), 4.0) << "dqkv";
        EXPECT_LE(rel_error(fast.stats, sim.stats), 1e-5) << "stats";
        // Not given y: D recomputed in the dq kernel's first pass.
        const AttnRun fast0 = run_typed("cuda", qkv, dy, dtype, s.B, s.T, s.C, s.nh, p,
                                        Determinism::fast, /*with_y=*/false);
        EXPECT_LE(error_in_u(fast0.dqkv, ref.second, u), 4.0) << "dqkv, D recomputed";
      }
    }
}

// The simulator has one attention order (Note [GPT kernels]): fast mode gives bitwise's bits.
TEST_F(AttentionMode, SimRunsTheCanonicalOrderInBothModes) {
  const std::int64_t B = 2, T = 19, C = 24, nh = 3;
  const std::vector<float> qkv = uniform_values(std::size_t(B * T * 3 * C), 5);
  const std::vector<float> dy = uniform_values(std::size_t(B * T * C), 6);
  for (float p : {0.0f, 0.2f}) {
    const AttnRun a = run_attention("sim", qkv, dy, B, T, C, nh, p, Determinism::bitwise);
    const AttnRun b = run_attention("sim", qkv, dy, B, T, C, nh, p, Determinism::fast);
    EXPECT_TRUE(bits_equal(a.y, b.y));
    EXPECT_TRUE(bits_equal(a.stats, b.stats));
    EXPECT_TRUE(bits_equal(a.dqkv, b.dqkv));
  }
}

TEST_F(AttentionMode, ABadModeIsRefused) {
  const Tensor qkv =
      Tensor::from_vector(uniform_values(2 * 3 * 12, 7), {2, 3, 12}).to(Device("sim", 0));
  const auto bad = static_cast<Determinism>(7);
  Tensor stats;
  expect_invalid([&] { ops::attention(qkv, 2, stats, 0.0f, 0, 0, 0, bad); },
                 "ops::attention: mode: expected Determinism::fast or Determinism::bitwise, got "
                 "value 7");
  const Tensor y = ops::attention(qkv, 2, stats);
  expect_invalid([&] { ops::attention_backward(y, qkv, stats, 2, 0.0f, 0, 0, 0, bad); },
                 "ops::attention_backward: mode: expected Determinism::fast or "
                 "Determinism::bitwise, got value 7");
}

}  // namespace
}  // namespace ditto
