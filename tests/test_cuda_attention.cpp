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

std::vector<float> uniform(std::size_t n, unsigned seed, float r = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-r, r);
  std::vector<float> v(n);
  for (float& x : v) x = u(gen);
  return v;
}

struct AttnRun {
  std::vector<float> y, stats, dqkv;
};

// Forward and backward of one (B, T, C, nh) on `backend`'s device 0 in `mode`.
AttnRun run_attention(const char* backend, const std::vector<float>& qkv,
                      const std::vector<float>& dy, std::int64_t B, std::int64_t T, std::int64_t C,
                      std::int64_t nh, float p, Determinism mode) {
  const Device d(backend, 0);
  const Tensor tqkv = Tensor::from_vector(qkv, {B, T, 3 * C}).to(d);
  const Tensor tdy = Tensor::from_vector(dy, {B, T, C}).to(d);
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(5) << 8) | 1);
  Tensor stats;
  const Tensor y = ops::attention(tqkv, nh, stats, p, 1234, stream, 77, mode);
  const Tensor dqkv = ops::attention_backward(tdy, tqkv, stats, nh, p, 1234, stream, 77, mode);
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

struct Shape {
  std::int64_t B, T, C, nh;
};

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {
      {4, 256, 768, 12},  // GPT-2 124M's heads (hd 64), 8 query tiles
      {2, 300, 384, 6},   // nanoGPT char model's heads, T not a multiple of 32
      {2, 100, 256, 2},   // hd 128: 16 x 16 tiles
      {3, 45, 32, 2},     // hd 16: the 32 class
      {1, 40, 272, 2}};   // hd 136: the reference kernels
  return s;
}

TEST_F(CudaAttention, BitwiseEqualsTheSimulatorAndFastIsWithinTolerance) {
  unsigned seed = 1;
  for (const Shape& s : shapes())
    for (float p : {0.0f, 0.1f}) {
      SCOPED_TRACE("B " + std::to_string(s.B) + " T " + std::to_string(s.T) + " C " +
                   std::to_string(s.C) + " nh " + std::to_string(s.nh) + " p " + std::to_string(p));
      const std::vector<float> qkv = uniform(std::size_t(s.B * s.T * 3 * s.C), seed++);
      const std::vector<float> dy = uniform(std::size_t(s.B * s.T * s.C), seed++);
      const AttnRun sim =
          run_attention("sim", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::bitwise);
      const AttnRun bit =
          run_attention("cuda", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::bitwise);
      EXPECT_TRUE(bits_equal(bit.y, sim.y)) << "y";
      EXPECT_TRUE(bits_equal(bit.stats, sim.stats)) << "stats";
      EXPECT_TRUE(bits_equal(bit.dqkv, sim.dqkv)) << "dqkv";
      const AttnRun fast =
          run_attention("cuda", qkv, dy, s.B, s.T, s.C, s.nh, p, Determinism::fast);
      EXPECT_LE(rel_error(fast.y, sim.y), kFastVsBitwiseTol) << "y";
      EXPECT_LE(rel_error(fast.stats, sim.stats), kFastVsBitwiseTol) << "stats";
      EXPECT_LE(rel_error(fast.dqkv, sim.dqkv), kFastVsBitwiseTol) << "dqkv";
    }
}

// The simulator has one attention order (Note [GPT kernels]): fast mode gives bitwise's bits.
TEST_F(AttentionMode, SimRunsTheCanonicalOrderInBothModes) {
  const std::int64_t B = 2, T = 19, C = 24, nh = 3;
  const std::vector<float> qkv = uniform(std::size_t(B * T * 3 * C), 5);
  const std::vector<float> dy = uniform(std::size_t(B * T * C), 6);
  for (float p : {0.0f, 0.2f}) {
    const AttnRun a = run_attention("sim", qkv, dy, B, T, C, nh, p, Determinism::bitwise);
    const AttnRun b = run_attention("sim", qkv, dy, B, T, C, nh, p, Determinism::fast);
    EXPECT_TRUE(bits_equal(a.y, b.y));
    EXPECT_TRUE(bits_equal(a.stats, b.stats));
    EXPECT_TRUE(bits_equal(a.dqkv, b.dqkv));
  }
}

TEST_F(AttentionMode, ABadModeIsRefused) {
  const Tensor qkv = Tensor::from_vector(uniform(2 * 3 * 12, 7), {2, 3, 12}).to(Device("sim", 0));
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
