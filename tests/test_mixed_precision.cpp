// Note [Mixed precision] (core/runtime/mixed_precision.h): ops on bf16 / f16 tensors give the
// f32 kernel's result rounded once (exact against the f32 path on the f32 copies), the gradient
// dtype rule (nn::grad_dtype), Module::to(DType), a bf16 MLP under DataParallel (bitwise: the
// same gradient bytes and loss on 1, 2, 4 and 8 devices), and the simulator's pricing of bf16
// ops as native kernels with their f32 scratch charged to no device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "backend_sim/cost_model.h"
#include "backend_sim/sim_backend.h"
#include "core/nn/gpt.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/float_formats.h"
#include "core/numerics/random.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/mixed_precision.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class MixedPrecisionTest : public SimSuite<8> {
 protected:
  static Device dev(int i = 0) { return Device("sim", i); }
};

/// A host f32 tensor of uniform values in [-1, 1) (Philox stream `seed`).
Tensor random_host(const Shape& shape, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(seed, stream_id(kStreamSynthetic, 31), i, -1.0f, 1.0f);
  return Tensor::from_vector(v, shape);
}

/// The f32 values of any float tensor (host copy).
std::vector<float> values(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::f32).to_vector<float>();
}

// ---- the gradient dtype rule and Module::to -----------------------------------------------------

TEST_F(MixedPrecisionTest, GradDtypeIsTheParameterDtypeInFastModeAndF32InBitwiseMode) {
  EXPECT_EQ(nn::grad_dtype(DType::bf16, Determinism::fast), DType::bf16);
  EXPECT_EQ(nn::grad_dtype(DType::f16, Determinism::fast), DType::f16);
  EXPECT_EQ(nn::grad_dtype(DType::f32, Determinism::fast), DType::f32);
  EXPECT_EQ(nn::grad_dtype(DType::bf16, Determinism::bitwise), DType::f32);
  EXPECT_EQ(nn::grad_dtype(DType::f16, Determinism::bitwise), DType::f32);
  EXPECT_EQ(nn::grad_dtype(DType::f32, Determinism::bitwise), DType::f32);
  expect_invalid([] { nn::grad_dtype(DType::i64, Determinism::fast); },
                 "nn::grad_dtype: param: expected f32, bf16 or f16, got i64");
}

TEST_F(MixedPrecisionTest, ModuleToBf16RoundsEveryParameterOnceAndDropsGrads) {
  auto f32 = nn::mlp({5, 7, 3}, dev(), 11);
  auto m = nn::mlp({5, 7, 3}, dev(), 11);
  m->zero_grad();
  m->to(DType::bf16);
  const auto pf = f32->parameters(), pb = m->parameters();
  ASSERT_EQ(pf.size(), pb.size());
  for (std::size_t i = 0; i < pf.size(); ++i) {
    EXPECT_EQ(pb[i]->data.dtype(), DType::bf16) << pb[i]->name;
    EXPECT_FALSE(pb[i]->grad.defined()) << pb[i]->name;
    const std::vector<float> want = pf[i]->data.to_vector<float>();
    const std::vector<float> got = values(pb[i]->data);
    for (std::size_t j = 0; j < want.size(); ++j)
      ASSERT_EQ(got[j], convert<bfloat16>(want[j]).to_float()) << pb[i]->name << "[" << j << "]";
  }
  // zero_grad allocates the grads in grad_dtype: bf16 in fast mode (the module's default).
  m->zero_grad();
  for (nn::Parameter* p : m->parameters()) EXPECT_EQ(p->grad.dtype(), DType::bf16);
  m->set_determinism(Determinism::bitwise);
  m->zero_grad();
  for (nn::Parameter* p : m->parameters()) EXPECT_EQ(p->grad.dtype(), DType::f32);
  expect_invalid([&] { m->to(DType::i32); }, ".to: dtype: expected f32, bf16 or f16, got i32");
}

// ---- ops: the f32 kernel's result rounded once --------------------------------------------------

/// `got` has exactly the bits of the f32 result `want` rounded to got's dtype.
void expect_rounded(const Tensor& got, const Tensor& want_f32, const char* what) {
  ASSERT_EQ(got.shape(), want_f32.shape()) << what;
  EXPECT_EQ(tensor_bytes(got), tensor_bytes(want_f32.to(got.dtype()))) << what;
}

TEST_F(MixedPrecisionTest, MatmulOfBf16IsTheF32ProductOfTheF32CopiesRoundedOnce) {
  for (DType dt : {DType::bf16, DType::f16}) {
    for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
      const Tensor a = random_host({9, 13}, 1).to(dev()).to(dt);
      const Tensor b = random_host({11, 13}, 2).to(dev()).to(dt);
      const Tensor c = ops::matmul(a, b, false, true, mode);
      EXPECT_EQ(c.dtype(), dt);
      expect_rounded(c, ops::matmul(a.to(DType::f32), b.to(DType::f32), false, true, mode),
                     "matmul");
      // A bf16 weight with an f32 gradient out (the bitwise weight gradient): no rounding.
      Tensor g = Tensor::zeros({13, 13}, DType::f32, dev());
      ops::gemm(a, a, g, true, false, 1.0f, 0.0f, mode);
      const Tensor g32 = ops::matmul(a.to(DType::f32), a.to(DType::f32), true, false, mode);
      EXPECT_EQ(tensor_bytes(g), tensor_bytes(g32));
      // In place into a bf16 c with beta = 1: c + a^T a in f32, rounded once.
      Tensor cb = g32.to(dt);
      const Tensor cb32 = cb.to(DType::f32);
      Tensor ref = cb32.clone();
      ops::gemm(a.to(DType::f32), a.to(DType::f32), ref, true, false, 0.5f, 1.0f, mode);
      ops::gemm(a, a, cb, true, false, 0.5f, 1.0f, mode);
      expect_rounded(cb, ref, "gemm beta = 1");
    }
  }
}

TEST_F(MixedPrecisionTest, ElementwiseAndReductionOpsRoundOnceAndScalarsStayF32) {
  const Tensor x32 = random_host({6, 10}, 3).to(dev());
  const Tensor x = x32.to(DType::bf16);
  const Tensor xr = x.to(DType::f32);  // the exact f32 copy
  const Tensor b = random_host({10}, 4).to(dev()).to(DType::bf16);
  expect_rounded(ops::relu(x), ops::relu(xr), "relu");
  expect_rounded(ops::relu_backward(ops::relu(x), x),
                 ops::relu_backward(ops::relu(x).to(DType::f32), xr), "relu_backward");
  expect_rounded(ops::gelu(x), ops::gelu(xr), "gelu");
  expect_rounded(ops::add(x, x), ops::add(xr, xr), "add");
  Tensor y = x.clone(), y32 = xr.clone();
  ops::add_bias_(y, b);
  ops::add_bias_(y32, b.to(DType::f32));
  expect_rounded(y, y32, "add_bias_");
  y = x.clone();
  y32 = xr.clone();
  ops::axpy_(0.75f, x, y);
  ops::axpy_(0.75f, xr, y32);
  expect_rounded(y, y32, "axpy_");
  y = x.clone();
  y32 = xr.clone();
  ops::scale_(y, 3.0f);
  ops::scale_(y32, 3.0f);
  expect_rounded(y, y32, "scale_");
  const std::vector<std::int64_t> bounds{0, 2, 5, 6};
  Tensor rows = Tensor::zeros({10}, DType::f32, dev());
  ops::sum_rows_sharded(x, rows, bounds, false);  // an f32 out: the exact f32 sums
  Tensor rows32 = Tensor::zeros({10}, DType::f32, dev());
  ops::sum_rows_sharded(xr, rows32, bounds, false);
  EXPECT_EQ(tensor_bytes(rows), tensor_bytes(rows32));
  const Tensor s = ops::sum(x, 0.5f, Determinism::bitwise);
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.item(), ops::sum(xr, 0.5f, Determinism::bitwise).item());
  const Tensor ss = ops::sum_squares(x, Determinism::bitwise);
  EXPECT_EQ(ss.dtype(), DType::f32);
  EXPECT_EQ(ss.item(), ops::sum_squares(xr, Determinism::bitwise).item());
  // Cross-entropy: bf16 logits, f32 per-sample losses, dlogits in the logits' dtype.
  const Tensor t = Tensor::from_vector(std::vector<std::int64_t>{1, 0, 9, 3, 3, 7}, {6}, dev());
  const Tensor l = ops::cross_entropy(x, t);
  EXPECT_EQ(l.dtype(), DType::f32);
  EXPECT_EQ(tensor_bytes(l), tensor_bytes(ops::cross_entropy(xr, t)));
  const Tensor one = Tensor::full({}, 1.0f, dev());
  const Tensor dl = ops::cross_entropy_backward(x, t, one, 1.0f / 6);
  EXPECT_EQ(dl.dtype(), DType::bf16);
  expect_rounded(dl, ops::cross_entropy_backward(xr, t, one, 1.0f / 6), "cross_entropy_backward");
}

TEST_F(MixedPrecisionTest, ErrorsNameTheOpAndSayTheChecksRanOnF32Copies) {
  const Tensor a = Tensor::zeros({2, 3}, DType::bf16, dev());
  const Tensor b = Tensor::zeros({4, 5}, DType::bf16, dev());
  expect_invalid([&] { ops::matmul(a, b, false, false, Determinism::bitwise); },
                 "ops::matmul: b: expected [K, N] = [3, 5]");
  expect_invalid([&] { ops::matmul(a, b, false, false, Determinism::bitwise); },
                 "(ops::matmul on bf16 tensors: checked on their f32 copies");
  const Tensor f64 = Tensor::zeros({3, 2}, DType::f64, dev());
  expect_invalid([&] { ops::matmul(a, f64, false, false, Determinism::bitwise); },
                 "ops::matmul: expected every floating tensor in f32, bf16 or f16");
  // An f32-only call keeps its message (no note).
  const Tensor i64 = Tensor::zeros({3, 2}, DType::i64, dev());
  expect_invalid([&] { ops::matmul(a.to(DType::f32), i64, false, false, Determinism::bitwise); },
                 "ops::matmul: b: expected dtype f32, got [3, 2] i64 on sim:0");
}

// ---- a bf16 MLP under DataParallel --------------------------------------------------------------

struct StepResult {
  float loss = 0;
  std::vector<std::vector<std::uint8_t>> grads;
  std::vector<DType> grad_dtypes;
};

/// One forward + backward of a bf16 MLP 12-32-16-5 with cross-entropy (as train::Replica does
/// for dp: the loss over the gathered output) on `n` devices.
StepResult mlp_step(int n, Determinism mode, DType dt) {
  auto model = nn::mlp({12, 32, 16, 5}, Device("sim", 0), 3);
  model->set_input_requires_grad(false);
  model->to(dt);
  parallel::DataParallelOptions o;
  o.determinism = mode;
  parallel::DataParallel dp(*model, devices("sim", n), o);
  const std::int64_t B = 24;
  const Tensor x = random_host({B, 12}, 7);
  std::vector<std::int64_t> yv(static_cast<std::size_t>(B));
  for (std::int64_t i = 0; i < B; ++i) yv[static_cast<std::size_t>(i)] = (i * 7) % 5;
  nn::CrossEntropyLoss crit;
  crit.set_determinism(mode);
  const Tensor out = dp.forward(x);
  EXPECT_EQ(out.dtype(), dt);
  const Tensor loss = crit.forward(out, Tensor::from_vector(yv, {B}, out.device()));
  EXPECT_EQ(loss.dtype(), DType::f32);
  dp.backward(crit.backward());
  StepResult r;
  r.loss = loss.item();
  for (nn::Parameter* p : model->parameters()) {
    r.grads.push_back(tensor_bytes(p->grad));
    r.grad_dtypes.push_back(p->grad.dtype());
  }
  return r;
}

TEST_F(MixedPrecisionTest, Bf16MlpBitwiseGivesTheSameGradientBytesAndLossOn1248Devices) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const StepResult one = mlp_step(1, Determinism::bitwise, dt);
    for (DType g : one.grad_dtypes) EXPECT_EQ(g, DType::f32);  // grad_dtype in bitwise mode
    EXPECT_TRUE(std::isfinite(one.loss));
    EXPECT_GT(one.loss, 0.5f);
    for (int n : {2, 4, 8}) {
      const StepResult r = mlp_step(n, Determinism::bitwise, dt);
      EXPECT_EQ(r.loss, one.loss) << n << " devices, " << dtype_name(dt);
      ASSERT_EQ(r.grads.size(), one.grads.size());
      for (std::size_t k = 0; k < r.grads.size(); ++k)
        EXPECT_EQ(r.grads[k], one.grads[k])
            << "parameter " << k << ", " << n << " devices, " << dtype_name(dt);
    }
  }
}

TEST_F(MixedPrecisionTest, Bf16MlpFastModeHasBf16GradientsWithinToleranceOfOneDevice) {
  const StepResult one = mlp_step(1, Determinism::fast, DType::bf16);
  for (DType g : one.grad_dtypes) EXPECT_EQ(g, DType::bf16);
  const StepResult four = mlp_step(4, Determinism::fast, DType::bf16);
  EXPECT_NEAR(four.loss, one.loss, 1e-6);
  auto as_floats = [](const std::vector<std::uint8_t>& bytes) {
    std::vector<float> v;
    for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
      bfloat16 h;
      std::memcpy(&h.bits, &bytes[i], 2);
      v.push_back(h.to_float());
    }
    return v;
  };
  for (std::size_t k = 0; k < one.grads.size(); ++k) {
    const std::vector<float> a = as_floats(one.grads[k]), b = as_floats(four.grads[k]);
    for (std::size_t i = 0; i < a.size(); ++i)  // a few bf16 ulps (2^-8 relative each)
      EXPECT_NEAR(a[i], b[i], 0.02 * std::abs(a[i]) + 1e-4) << "parameter " << k << "[" << i << "]";
  }
}

// ---- the simulator: native pricing, uncharged scratch
// --------------------------------------------

TEST_F(MixedPrecisionTest, SimPricesABf16GemmAtTensorCorePeakAndHalfTheBytes) {
  BackendOptions bo;
  bo.device_count = 1;
  auto& be = *init_backend("sim", bo).extension<sim::SimBackend>();
  sim::ClusterSpec cluster{sim::device_profile("h100-sxm"), sim::interconnect_profile("nvlink"), 1,
                           1};
  be.cost_model().configure(cluster);
  const std::int64_t M = 64, N = 48, K = 80;
  const Tensor a = Tensor::zeros({M, K}, DType::bf16, dev());
  const Tensor b = Tensor::zeros({K, N}, DType::bf16, dev());
  be.default_stream(0).synchronize();
  const sim::VTime before = be.cost_model().totals().compute[0];
  // Fast mode: cuBLASLt on the tensor cores (Note [Compute units] in backend_sim/cost_model.h).
  const Tensor c = ops::matmul(a, b, false, false, Determinism::fast);
  be.default_stream(0).synchronize();
  const sim::VTime took = be.cost_model().totals().compute[0] - before;
  const sim::KernelCost f32{2.0 * M * N * K, 4.0 * (M * K + K * N + M * N), true};
  const sim::KernelCost native = sim::native_cost(f32, DType::bf16);
  EXPECT_EQ(native.operands, DType::bf16);
  EXPECT_EQ(sim::kernel_price(cluster.device, native).compute_unit,
            sim::PricedUnit::tensor_core_bf16);
  EXPECT_EQ(native.bytes, f32.bytes / 2);
  // One kernel at the native cost; the conversions cost nothing.
  EXPECT_EQ(took, sim::to_vtime(sim::kernel_seconds(cluster.device, native)));
  EXPECT_LT(sim::kernel_seconds(cluster.device, native), sim::kernel_seconds(cluster.device, f32));
  init_sim(8);
}

TEST_F(MixedPrecisionTest, SimChargesOnlyTheBf16OutputNotTheF32Scratch) {
  auto& be = dev().backend();
  const std::int64_t M = 128, K = 256, N = 64;
  const Tensor a = Tensor::zeros({M, K}, DType::bf16, dev());
  const Tensor b = Tensor::zeros({K, N}, DType::bf16, dev());
  be.default_stream(0).synchronize();
  const MemoryStats s0 = be.memory_stats(0);
  be.reset_peak_memory(0);
  Tensor c = ops::matmul(a, b, false, false, Determinism::bitwise);
  be.default_stream(0).synchronize();
  const MemoryStats s1 = be.memory_stats(0);
  EXPECT_EQ(s1.in_use - s0.in_use, c.nbytes());  // M * N * 2 bytes: the bf16 output only
  EXPECT_EQ(s1.peak, s1.in_use);                 // the f32 copies of a, b and c never counted
  c = Tensor();
  be.default_stream(0).synchronize();
  EXPECT_EQ(be.memory_stats(0).in_use, s0.in_use);
  // LayerNorm's f32 mean and rstd are real outputs: charged.
  const Tensor x = Tensor::zeros({M, K}, DType::bf16, dev());
  const Tensor w = Tensor::full({K}, 1.0, DType::bf16, dev());
  be.default_stream(0).synchronize();
  const std::size_t in0 = be.memory_stats(0).in_use;
  Tensor mean, rstd;
  Tensor y = ops::layernorm(x, w, Tensor(), 1e-5f, mean, rstd);
  be.default_stream(0).synchronize();
  EXPECT_EQ(mean.dtype(), DType::f32);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(be.memory_stats(0).in_use - in0, y.nbytes() + mean.nbytes() + rstd.nbytes());
}

// ---- a bf16 GPT
// -----------------------------------------------------------------------------------

nn::GPTConfig tiny_gpt(float dropout = 0.0f) {
  return {.block_size = 16,
          .vocab_size = 65,
          .n_layer = 2,
          .n_head = 4,
          .n_embd = 32,
          .dropout = dropout};
}

struct GptBatch {
  Tensor idx, targets;
};
GptBatch gpt_batch(std::int64_t B, std::int64_t T, std::int64_t V) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(B * T)), tg(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = philox_u32(5, stream_id(kStreamSynthetic, 40), i) % static_cast<std::uint32_t>(V);
    tg[i] = philox_u32(5, stream_id(kStreamSynthetic, 41), i) % static_cast<std::uint32_t>(V);
  }
  return {Tensor::from_vector(ids, {B, T}), Tensor::from_vector(tg, {B, T})};
}

struct GptStep {
  float loss = 0;
  std::vector<std::vector<std::uint8_t>> grads;
  std::vector<DType> grad_dtypes;
  std::vector<float> logits;
};

/// One forward + backward of the tiny GPT (f32 Philox init, then cast to `dt`) with B = 8
/// sequences of T = 16 tokens on `n` devices via DataParallel, the loss over the gathered
/// logits as train::Replica computes it for dp.
GptStep gpt_step(int n, Determinism mode, DType dt, float dropout = 0.0f,
                 const std::string& backend = "sim") {
  const nn::GPTConfig cfg = tiny_gpt(dropout);
  nn::GPT model(cfg, Device(backend, 0), 1337);
  if (dt != DType::f32) model.to(dt);
  model.set_step(3);
  parallel::DataParallelOptions o;
  o.determinism = mode;
  parallel::DataParallel dp(model, devices(backend, n), o);
  const GptBatch b = gpt_batch(8, cfg.block_size, cfg.vocab_size);
  nn::CrossEntropyLoss crit;
  crit.set_determinism(mode);
  const Tensor logits = dp.forward(b.idx);
  EXPECT_EQ(logits.dtype(), dt);  // the GPT runs in its parameters' dtype
  const Tensor loss = crit.forward(logits, b.targets.to(logits.device()));
  EXPECT_EQ(loss.dtype(), DType::f32);
  const Tensor dlogits = crit.backward();
  EXPECT_EQ(dlogits.dtype(), dt);  // dlogits in the logits' dtype
  dp.backward(dlogits);
  GptStep r;
  r.loss = loss.item();
  r.logits = values(logits);
  for (nn::Parameter* p : model.parameters()) {
    EXPECT_TRUE(p->grad.defined()) << p->name;
    r.grads.push_back(tensor_bytes(p->grad));
    r.grad_dtypes.push_back(p->grad.dtype());
  }
  return r;
}

// bf16 and f16 (the GPT cast to the dtype): in bitwise mode the same loss and gradient bytes on 1,
// 2, 4 and 8 devices, with and without dropout; the gradients in f32 (grad_dtype in bitwise mode).
class MixedPrecisionGpt : public MixedPrecisionTest, public ::testing::WithParamInterface<DType> {};

TEST_P(MixedPrecisionGpt, BitwiseGivesTheSameGradientBytesAndLossOn1248Devices) {
  const DType dt = GetParam();
  for (float dropout : {0.0f, 0.1f}) {
    const GptStep one = gpt_step(1, Determinism::bitwise, dt, dropout);
    for (DType g : one.grad_dtypes) EXPECT_EQ(g, DType::f32);
    EXPECT_NEAR(one.loss, std::log(65.0f), 0.3f);  // an untrained GPT: about ln(V)
    for (int n : {2, 4, 8}) {
      const GptStep r = gpt_step(n, Determinism::bitwise, dt, dropout);
      EXPECT_EQ(r.loss, one.loss) << n << " devices, dropout " << dropout;
      ASSERT_EQ(r.grads.size(), one.grads.size());
      for (std::size_t k = 0; k < r.grads.size(); ++k)
        EXPECT_EQ(r.grads[k], one.grads[k])
            << "parameter " << k << ", " << n << " devices, dropout " << dropout;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MixedPrecisionGpt, ::testing::Values(DType::bf16, DType::f16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

TEST_F(MixedPrecisionTest, Bf16GptFastModeHasBf16GradientsAndMatchesOneDeviceWithinTolerance) {
  const GptStep one = gpt_step(1, Determinism::fast, DType::bf16);
  for (DType g : one.grad_dtypes) EXPECT_EQ(g, DType::bf16);
  const GptStep four = gpt_step(4, Determinism::fast, DType::bf16);
  EXPECT_NEAR(four.loss, one.loss, 1e-3 * one.loss);
}

TEST_F(MixedPrecisionTest, Bf16GptLossAndLogitsAreTheF32GptsWithinBf16Tolerance) {
  const GptStep f32 = gpt_step(1, Determinism::bitwise, DType::f32);
  const GptStep bf = gpt_step(1, Determinism::bitwise, DType::bf16);
  // bf16 keeps 8 significant bits (relative step 2^-8 = 0.4%); the rounding at every op boundary
  // of 2 blocks adds up to a few of those on the logits (values of order 0.1 here).
  ASSERT_EQ(bf.logits.size(), f32.logits.size());
  double max_abs = 0, max_diff = 0;
  for (std::size_t i = 0; i < f32.logits.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(double(f32.logits[i])));
    max_diff = std::max(max_diff, std::abs(double(f32.logits[i]) - bf.logits[i]));
  }
  EXPECT_GT(max_abs, 0.05);
  EXPECT_LT(max_diff, 0.05 * max_abs) << "max |f32 - bf16| " << max_diff << " of " << max_abs;
  EXPECT_NEAR(bf.loss, f32.loss, 5e-3 * f32.loss);
  EXPECT_NE(bf.loss, f32.loss);  // it did run in bf16
}

// ---- the PyTorch reference (tools/mp_reference.py)
// ------------------------------------------------

Tensor bf16_from_bits(const nlohmann::json& j, const Shape& shape) {
  std::vector<bfloat16> v;
  for (const auto& e : j) {
    bfloat16 h;
    h.bits = e.get<std::uint16_t>();
    v.push_back(h);
  }
  return Tensor::from_vector(v, shape, Device("sim", 0));
}

/// How many elements differ, and whether every difference is at most one bf16 ulp.
std::pair<int, bool> bf16_ulps(const Tensor& got, const Tensor& want) {
  const std::vector<bfloat16> g = got.to(Device::cpu()).to_vector<bfloat16>();
  const std::vector<bfloat16> w = want.to(Device::cpu()).to_vector<bfloat16>();
  int differ = 0;
  bool within_one = true;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g[i].bits == w[i].bits) continue;
    ++differ;
    // Same sign: adjacent bf16 values differ by one in their bit patterns.
    const int d = std::abs(int(g[i].bits) - int(w[i].bits));
    within_one = within_one && (g[i].bits >> 15) == (w[i].bits >> 15) && d == 1;
  }
  return {differ, within_one};
}

TEST_F(MixedPrecisionTest, MatchesTheTorchReference) {
  std::ifstream in(std::string(DITTO_TEST_DATA_DIR) + "/mp_reference.json");
  ASSERT_TRUE(in.good()) << "tests/data/mp_reference.json (tools/mp_reference.py)";
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::int64_t N = j["N"], C = j["C"], H = j["H"];
  const Tensor x = bf16_from_bits(j["x"], {N, C});
  const Tensor w = bf16_from_bits(j["w"], {H, C});
  const Tensor b = bf16_from_bits(j["b"], {H});
  const Tensor targets =
      Tensor::from_vector(j["targets"].get<std::vector<std::int64_t>>(), {N}, dev());
  for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
    // torch.matmul(x.float(), w.float().t()).bfloat16(): f32 accumulate, rounded once. Exact.
    const Tensor mm = ops::matmul(x, w, false, true, mode);
    EXPECT_EQ(tensor_bytes(mm), tensor_bytes(bf16_from_bits(j["mm"], {N, H})));
    // (mm.float() + b.float()).bfloat16(): one f32 add, rounded once. Exact.
    Tensor biased = mm.clone();
    ops::add_bias_(biased, b);
    const Tensor want_biased = bf16_from_bits(j["biased"], {N, H});
    EXPECT_EQ(tensor_bytes(biased), tensor_bytes(want_biased));
    // From torch's own bf16 inputs on: gelu and layer_norm may differ from torch's f32
    // arithmetic in the last f32 bits (tanh, the variance's order), at most one bf16 ulp after.
    const Tensor act = ops::gelu(want_biased);
    const Tensor want_act = bf16_from_bits(j["act"], {N, H});
    const auto [act_differ, act_one] = bf16_ulps(act, want_act);
    EXPECT_TRUE(act_one);
    EXPECT_LE(act_differ, 2) << "of " << N * H;
    Tensor mean, rstd;
    const Tensor normed = ops::layernorm(want_act, Tensor::full({H}, 1.0, DType::bf16, dev()),
                                         Tensor(), 1e-5f, mean, rstd);
    const Tensor want_normed = bf16_from_bits(j["normed"], {N, H});
    const auto [ln_differ, ln_one] = bf16_ulps(normed, want_normed);
    EXPECT_TRUE(ln_one);
    EXPECT_LE(ln_differ, 3) << "of " << N * H;
    // F.cross_entropy(normed.float(), targets): f32, and its gradient rounded to bf16.
    const Tensor per_sample = ops::cross_entropy(want_normed, targets);
    const float loss = ops::sum(per_sample, 1.0f / float(N), mode).item();
    EXPECT_NEAR(loss, j["loss"].get<double>(), 1e-6 * j["loss"].get<double>());
    const Tensor dl = ops::cross_entropy_backward(want_normed, targets,
                                                  Tensor::full({}, 1.0f, dev()), 1.0f / float(N));
    const auto [dl_differ, dl_one] = bf16_ulps(dl, bf16_from_bits(j["dlogits"], {N, H}));
    EXPECT_TRUE(dl_one);
    EXPECT_LE(dl_differ, 3) << "of " << N * H;
  }
}

// ---- CUDA: the same bits (skips without a GPU)
// ----------------------------------------------------

using MixedPrecisionCudaTest = CudaSuite<2>;

// The wrapper goes through Kernels (cast + the f32 kernels), whose bitwise arithmetic the two
// backends share: a bf16 GPT step gives the simulator's gradient bytes and loss on CUDA.
TEST_F(MixedPrecisionCudaTest, Bf16GptBitwiseStepHasTheSimulatorsBits) {
  for (int n : {1, 2}) {
    const GptStep sim = gpt_step(n, Determinism::bitwise, DType::bf16, 0.1f, "sim");
    const GptStep cuda = gpt_step(n, Determinism::bitwise, DType::bf16, 0.1f, "cuda");
    EXPECT_EQ(cuda.loss, sim.loss) << n << " devices";
    EXPECT_EQ(cuda.grads, sim.grads) << n << " devices";
  }
}

}  // namespace
}  // namespace ditto
