// The GPT MLP's GELU in its GEMMs' epilogues (issue 29; Kernels::has_gemm_gelu_epilogue,
// GemmEpilogue::gelu_aux_bias and dgelu, ops::linear_gelu, ops::matmul_dgelu, nn::GPTMLP): on the
// CPU through a probe backend, the simulator's kernels behind a Kernels that counts every call,
// claims the typed GEMM for f32 and the GELU epilogues as told, and computes them the reference
// way (the simulator's GEMM, bias add and GELU kernels). The MLP and a GPT step then take the
// fused path exactly where fast mode and the capability say so, with the unfused path's values
// and no GELU launch. On a GPU: tests/test_cuda_gemm.cpp (CudaGemm.GeluEpiloguesMatchAReference).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/nn/attention.h"
#include "core/nn/gpt.h"
#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "counting_kernels.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr const char* kGeluProbe = "gelu_probe";

// The simulator's kernels, counted; has_gemm_ex true for f32 and has_gemm_gelu_epilogue as
// `gelu` says (in both modes: core must keep bitwise off it). gemm_ex runs the simulator's gemm,
// add_bias and GELU kernels on the f32 operands (contiguous: ld == N), counting each epilogue.
class GeluProbeKernels final : public CountingKernels {
 public:
  using CountingKernels::CountingKernels;

  bool gelu = false;
  std::map<GemmEpilogue, int> epilogues;
  void reset() {
    calls.clear();
    epilogues.clear();
  }

  bool has_gemm_ex(DType a, DType b, DType c, Determinism) const override {
    return a == DType::f32 && b == a && c == a;
  }
  bool has_gemm_gelu_epilogue(DType dtype, Determinism) const override {
    return gelu && dtype == DType::f32;
  }
  void gemm_ex(Stream& s, const GemmExArgs& g) override {
    note("gemm_ex");
    ++epilogues[g.epilogue];
    const bool to_aux = g.epilogue == GemmEpilogue::gelu_aux_bias;
    auto* out = static_cast<float*>(to_aux ? g.aux : g.C);
    k_.gemm(s, g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, static_cast<const float*>(g.A), g.lda,
            static_cast<const float*>(g.B), g.ldb, g.beta, out, to_aux ? g.ld_aux : g.ldc, g.mode);
    if (g.bias != nullptr) k_.add_bias(s, out, static_cast<const float*>(g.bias), g.M, g.N);
    if (to_aux) k_.gelu_forward(s, out, static_cast<float*>(g.C), g.M * g.N);
    if (g.epilogue == GemmEpilogue::dgelu)
      k_.gelu_backward(s, static_cast<const float*>(g.aux), static_cast<const float*>(g.C),
                       static_cast<float*>(g.C), g.M * g.N);
  }
};

class GemmGelu : public SimSuite<2> {
 protected:
  static void SetUpTestSuite() {
    SimSuite<2>::SetUpTestSuite();
    register_probe_backend<GeluProbeKernels>(kGeluProbe);
  }
  static GeluProbeKernels& probe() {
    return static_cast<GeluProbeKernels&>(get_backend(kGeluProbe).kernels());
  }
  void TearDown() override { probe().gelu = false; }
};

/// Host values in [-2, 2) (Philox stream `sub`) as an f32 tensor on the probe's device 0.
Tensor input(const Shape& shape, std::uint64_t sub) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(17, stream_id(kStreamSynthetic, sub), i, -2.0f, 2.0f);
  return Tensor::from_vector(v, shape).to(Device(kGeluProbe, 0));
}

void expect_near(const Tensor& a, const Tensor& b, float tol, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i)
    ASSERT_NEAR(x[i], y[i], tol * (1.0f + std::fabs(y[i]))) << what << " [" << i << "]";
}

// One forward and backward of a GPT MLP (C 16, B 2, T 5) in `mode` on the probe: its output,
// input gradient and parameter gradients.
struct MlpRun {
  Tensor y, dx;
  std::vector<Tensor> grads;
  std::vector<std::string> hooked;  // the grad-ready hook's parameters, in order
};
MlpRun mlp_run(Determinism mode) {
  const nn::GPTConfig cfg{
      .block_size = 8, .vocab_size = 11, .n_layer = 1, .n_head = 2, .n_embd = 16, .bias = true};
  nn::GPTMLP mlp(cfg, 0, Device(kGeluProbe, 0), 7);
  mlp.set_determinism(mode);
  mlp.set_micro_shards({0, 1, 2});
  MlpRun r;
  mlp.set_grad_ready_hook([&](nn::Parameter& p) { r.hooked.push_back(p.name); });
  r.y = mlp.forward(input({2, 5, 16}, 1));
  r.dx = mlp.backward(input({2, 5, 16}, 2));
  for (nn::Parameter* p : mlp.parameters()) r.grads.push_back(p->grad);
  return r;
}

// Fast mode with the capability: c_fc is one gelu_aux_bias GEMM and c_proj's input gradient one
// dgelu GEMM, no GELU launch, the grad-ready hook sees the parameters in the unfused order, and
// the output and every gradient equal the unfused run's (the
// probe's epilogues are the simulator's kernels: the same values, within a tolerance stated for
// a backend that fuses). Without the capability, or in bitwise mode with it, the unfused path.
TEST_F(GemmGelu, MlpFusesTheGeluOnlyInFastModeWhereTheBackendSaysSo) {
  GeluProbeKernels& k = probe();
  k.gelu = false;
  k.reset();
  const MlpRun plain = mlp_run(Determinism::fast);
  EXPECT_EQ(k.count("gelu_forward"), 1);
  EXPECT_EQ(k.count("gelu_backward"), 1);
  EXPECT_EQ(k.epilogues[GemmEpilogue::gelu_aux_bias] + k.epilogues[GemmEpilogue::dgelu], 0);

  k.gelu = true;
  k.reset();
  const MlpRun fused = mlp_run(Determinism::fast);
  EXPECT_EQ(k.count("gelu_forward"), 0);
  EXPECT_EQ(k.count("gelu_backward"), 0);
  EXPECT_EQ(k.epilogues[GemmEpilogue::gelu_aux_bias], 1);
  EXPECT_EQ(k.epilogues[GemmEpilogue::dgelu], 1);
  EXPECT_EQ(k.epilogues[GemmEpilogue::bias], 1);  // c_proj's forward
  expect_near(fused.y, plain.y, 1e-6f, "y");
  expect_near(fused.dx, plain.dx, 1e-6f, "dx");
  ASSERT_EQ(fused.grads.size(), 4u);
  for (std::size_t i = 0; i < fused.grads.size(); ++i)
    expect_near(fused.grads[i], plain.grads[i], 1e-6f, "grad " + std::to_string(i));
  EXPECT_EQ(fused.hooked, plain.hooked);  // c_proj's, then c_fc's, as backward_chain reports
  EXPECT_EQ(plain.hooked.size(), 4u);

  k.reset();  // bitwise: never the epilogues, whatever the backend says
  const MlpRun bitwise = mlp_run(Determinism::bitwise);
  EXPECT_EQ(k.count("gelu_forward"), 1);
  EXPECT_EQ(k.count("gelu_backward"), 1);
  EXPECT_EQ(k.epilogues[GemmEpilogue::gelu_aux_bias] + k.epilogues[GemmEpilogue::dgelu], 0);
  expect_near(bitwise.y, plain.y, 1e-5f, "bitwise y");
}

// A GPT step (2 layers, dropout) in fast mode takes the epilogues in every block and has the
// unfused step's loss and gradients; the model's grad-ready hook sees every parameter once, in
// the unfused order.
TEST_F(GemmGelu, GptStepWithTheEpiloguesHasTheUnfusedLossAndGradients) {
  GeluProbeKernels& k = probe();
  const nn::GPTConfig cfg{
      .block_size = 8, .vocab_size = 23, .n_layer = 2, .n_head = 2, .n_embd = 16, .dropout = 0.1f};
  struct Step {
    float loss = 0;
    std::vector<Tensor> grads;
    std::vector<std::string> hooked;
  };
  auto step = [&] {
    nn::GPT model(cfg, Device(kGeluProbe, 0), 1337);
    model.set_step(2);
    Step r;
    model.set_grad_ready_hook([&](nn::Parameter& p) { r.hooked.push_back(p.name); });
    const std::int64_t B = 2, T = cfg.block_size;
    std::vector<std::int64_t> ids(B * T), tg(B * T);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<std::int64_t>((i * 7 + 3) % 23);
      tg[i] = static_cast<std::int64_t>((i * 5 + 1) % 23);
    }
    const Device dev(kGeluProbe, 0);
    nn::CrossEntropyLoss crit;
    const Tensor logits = model.forward(Tensor::from_vector(ids, {B, T}).to(dev));
    r.loss = crit.forward(logits, Tensor::from_vector(tg, {B, T}).to(dev)).item();
    model.backward(crit.backward());
    for (nn::Parameter* p : model.parameters()) r.grads.push_back(p->grad);
    return r;
  };
  k.gelu = false;
  k.reset();
  const Step plain = step();
  EXPECT_EQ(k.count("gelu_forward"), 2);
  k.gelu = true;
  k.reset();
  const Step fused = step();
  EXPECT_EQ(k.count("gelu_forward") + k.count("gelu_backward"), 0);
  EXPECT_EQ(k.epilogues[GemmEpilogue::gelu_aux_bias], 2);
  EXPECT_EQ(k.epilogues[GemmEpilogue::dgelu], 2);
  EXPECT_NEAR(fused.loss, plain.loss, 1e-6f * (1.0f + std::fabs(plain.loss)));
  ASSERT_EQ(fused.grads.size(), plain.grads.size());
  for (std::size_t i = 0; i < fused.grads.size(); ++i)
    expect_near(fused.grads[i], plain.grads[i], 1e-5f, "grad " + std::to_string(i));
  EXPECT_EQ(fused.hooked, plain.hooked);
}

// The ops' own checks on the fused path name the op and the argument; without the capability
// they are linear + gelu and matmul + gelu_backward.
TEST_F(GemmGelu, FusedOpsCheckTheirArguments) {
  GeluProbeKernels& k = probe();
  k.gelu = true;
  const Tensor x = input({3, 4}, 3), w = input({8, 4}, 4), b = input({8}, 5);
  EXPECT_TRUE(ops::linear_gelu_fused(x, w, b, Determinism::fast));
  EXPECT_FALSE(ops::linear_gelu_fused(x, w, b, Determinism::bitwise));
  EXPECT_TRUE(ops::linear_gelu_fused(x, w, Tensor(), Determinism::fast));  // GELU_AUX
  EXPECT_FALSE(ops::linear_gelu_fused(x.to(DType::bf16), w, b, Determinism::fast));
  Tensor pre;
  const Tensor y = ops::linear_gelu(x, w, b, pre, Determinism::fast);
  expect_near(pre, ops::linear(x, w, b, Determinism::fast), 0.0f, "pre");
  expect_near(y, ops::gelu(pre), 0.0f, "y");
  expect_invalid([&] { ops::linear_gelu(x, w, input({7}, 6), pre, Determinism::fast); },
                 "ops::linear_gelu: bias: expected [out] = [8]");
  expect_invalid(
      [&] {
        ops::linear_gelu(x, input({8, 5}, 7), b, pre, Determinism::fast);
      },
      "ops::linear_gelu: b:");
  Tensor pre_nb;  // no bias
  expect_near(ops::linear_gelu(x, w, Tensor(), pre_nb, Determinism::fast),
              ops::gelu(ops::matmul(x, w, false, true, Determinism::fast)), 0.0f, "y, no bias");
  const Tensor gy = input({3, 8}, 8), p = input({3, 4}, 10);
  expect_near(ops::matmul_dgelu(gy, w, p, Determinism::fast),
              ops::gelu_backward(p, ops::matmul(gy, w, false, false, Determinism::fast)), 0.0f,
              "dgelu");
  expect_invalid(
      [&] {
        ops::matmul_dgelu(gy, w, input({3, 5}, 9), Determinism::fast);
      },
      "ops::matmul_dgelu: pre: expected [rows, in] = [3, 4]");
  k.gelu = false;
}

}  // namespace
}  // namespace ditto
