// The softmax cross-entropy's forward and backward in one pass (issue 29; Kernels::
// has_cross_entropy_fused / cross_entropy_fused, ops::cross_entropy_fused,
// nn::CrossEntropyLoss::forward_backward, llm.c's fused_classifier). On the CPU through a probe
// backend: the simulator's kernels behind a Kernels that counts every call and answers
// has_cross_entropy_fused as told; its cross_entropy_fused computes what the two kernels compute
// (cross_entropy(_ex), then cross_entropy_backward(_ex) into scratch, copied over the logits), so
// the fused path must give the unfused path's bytes exactly. CUDA's kernel: tests/
// test_cuda_cross_entropy_fused.cpp (a GPU) and its CPU half, ctest CudaEmu.Kernels
// (`cuda_emu_test fused`, tools/cuda_emu/test_emu_fused.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/nn/gpt.h"
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

constexpr const char* kXentProbe = "xent_probe";

// The simulator's kernels, counted; has_cross_entropy_fused answers `fused` (f32, bf16, f16;
// fast mode). cross_entropy_fused: the two kernels' arithmetic (MixedOp's for bf16 / f16: the
// logits widened, the f32 kernels, the gradient rounded once into the logits).
class XentProbeKernels final : public CountingKernels {
 public:
  using CountingKernels::CountingKernels;
  bool fused = false;

  bool has_cross_entropy_fused(DType t, Determinism mode) const override {
    return fused && mode == Determinism::fast &&
           (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }
  void cross_entropy_fused(Stream& s, DType t, void* logits, const std::int64_t* targets,
                           std::int64_t rows, std::int64_t classes, const float* grad_loss,
                           float scale, float* losses) override {
    note("cross_entropy_fused");
    const std::int64_t n = rows * classes;
    Scratch sc(*this, s);
    const float* x = t == DType::f32 ? static_cast<const float*>(logits) : sc.in(t, logits, n);
    k_.cross_entropy(s, x, targets, rows, classes, losses);
    float* g = sc.f32(n);
    k_.cross_entropy_backward(s, x, targets, rows, classes, grad_loss, scale, g);
    sc.out(g, t, logits, n);  // f32: a copy
  }
};

class XentFused : public SimSuite<2> {
 protected:
  static void SetUpTestSuite() {
    SimSuite<2>::SetUpTestSuite();
    register_probe_backend<XentProbeKernels>(kXentProbe);
  }
  static XentProbeKernels& probe() {
    return static_cast<XentProbeKernels&>(get_backend(kXentProbe).kernels());
  }
  void TearDown() override { probe().fused = false; }
};

// The fused pass's inputs: test_util.h's xent_logits with Philox key 23, xent_targets with
// stride 7.
Tensor fused_logits(const Shape& shape, DType dt, std::uint64_t sub, const std::string& backend) {
  return xent_logits(shape, dt, 23, sub, backend);
}
Tensor fused_targets(std::int64_t n, std::int64_t classes, const std::string& backend) {
  return xent_targets(n, classes, 7, backend);
}

// Dispatch: where the backend has the kernel, ops::cross_entropy_fused is one launch returning
// ops::cross_entropy's losses and leaving cross_entropy_backward's gradient in the logits (their
// bytes: the probe's arithmetic is the two kernels'); where it has not (or in bitwise mode),
// cross_entropy_fused_available is false and the op refuses, naming itself and the logits.
TEST_F(XentFused, OpIsOneLaunchWithTheTwoKernelsResults) {
  XentProbeKernels& k = probe();
  const std::int64_t N = 6, C = 13;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor targets = fused_targets(N, C, kXentProbe);
    const Tensor gl = Tensor::full({}, 0.5f, Device(kXentProbe, 0));
    const Tensor ref_logits = fused_logits({N, C}, dt, 1, kXentProbe);
    k.fused = false;
    EXPECT_FALSE(ops::cross_entropy_fused_available(ref_logits, targets, Determinism::fast));
    const auto ref_losses = tensor_bytes(ops::cross_entropy(ref_logits, targets));
    const Tensor ref_grad = ops::cross_entropy_backward(ref_logits, targets, gl, 0.25f);
    EXPECT_EQ(ref_grad.dtype(), dt);

    k.fused = true;
    Tensor logits = fused_logits({N, C}, dt, 1, kXentProbe);
    EXPECT_TRUE(ops::cross_entropy_fused_available(logits, targets, Determinism::fast));
    EXPECT_FALSE(ops::cross_entropy_fused_available(logits, targets, Determinism::bitwise));
    k.calls.clear();
    const Tensor losses = ops::cross_entropy_fused(logits, targets, gl, 0.25f);
    EXPECT_EQ(k.count("cross_entropy_fused"), 1);
    EXPECT_EQ(k.count("cross_entropy_backward") + k.count("cross_entropy_backward_ex"), 0);
    EXPECT_EQ(losses.dtype(), DType::f32);
    EXPECT_EQ(tensor_bytes(losses), ref_losses);
    EXPECT_EQ(tensor_bytes(logits), tensor_bytes(ref_grad));  // the gradient, over the logits
    // A real value: row 0's target is class 0, so its gradient is 0.125 (p - 1) < 0.
    EXPECT_LT(logits.to(DType::f32).to(Device::cpu()).to_vector<float>()[0], 0.0f);
  }
  k.fused = false;
  Tensor logits = fused_logits({N, C}, DType::f32, 1, kXentProbe);
  try {
    ops::cross_entropy_fused(logits, fused_targets(N, C, kXentProbe),
                             Tensor::full({}, 1.0f, Device(kXentProbe, 0)), 1.0f);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("ops::cross_entropy_fused: logits:"), std::string::npos) << what;
    EXPECT_NE(what.find("has_cross_entropy_fused"), std::string::npos) << what;
  }
}

// Bad arguments: InvalidArgument naming ops::cross_entropy_fused and the argument, before any
// launch, the logits untouched: a target out of range (-1, C), targets of the wrong shape or
// device, grad_loss of the wrong dtype or size, logits not 2-dim.
TEST_F(XentFused, BadArgumentsThrowBeforeAnyWrite) {
  XentProbeKernels& k = probe();
  k.fused = true;
  const std::int64_t N = 4, C = 9;
  const Device dev(kXentProbe, 0);
  Tensor logits = fused_logits({N, C}, DType::bf16, 2, kXentProbe);
  const auto before = tensor_bytes(logits);
  const Tensor gl = Tensor::full({}, 1.0f, dev);
  auto expect_error = [&](const Tensor& t, const Tensor& g, const std::string& want) {
    k.calls.clear();
    try {
      ops::cross_entropy_fused(logits, t, g, 1.0f);
      ADD_FAILURE() << "expected InvalidArgument: " << want;
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("ops::cross_entropy_fused: " + want), std::string::npos) << what;
    }
    EXPECT_EQ(k.count("cross_entropy_fused"), 0);
    EXPECT_EQ(tensor_bytes(logits), before);
  };
  expect_error(Tensor::from_vector(std::vector<std::int64_t>{0, -1, 2, 3}, {N}).to(dev), gl,
               "targets[1] = -1 out of range [0, 9)");
  expect_error(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, C}, {N}).to(dev), gl,
               "targets[3] = 9 out of range [0, 9)");
  expect_error(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2}, {3}).to(dev), gl,
               "targets: expected [N] = [4]");
  expect_error(Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 3}, {N}).to(Device("sim", 0)),
               gl, "targets: expected a tensor on");
  expect_error(fused_targets(N, C, kXentProbe), Tensor::full({2}, 1.0f, dev),
               "grad_loss: expected a one-element");
  expect_error(fused_targets(N, C, kXentProbe), Tensor::full({}, 1.0f, dev).to(DType::bf16),
               "grad_loss: expected dtype f32");
  Tensor three = fused_logits({2, 2, C}, DType::f32, 3, kXentProbe);
  try {
    ops::cross_entropy_fused(three, fused_targets(2, C, kXentProbe), gl, 1.0f);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ops::cross_entropy_fused: logits: expected a 2-dim"),
              std::string::npos)
        << e.what();
  }
}

struct XentStep {
  std::vector<std::uint8_t> loss;
  std::vector<std::vector<std::uint8_t>> grads;
};

// A tiny GPT step in `mode` on the probe: the loss forward and backward (forward_backward where
// `fused`, with grad_loss 1024: the GradScaler's role), then the model's backward.
XentStep xent_gpt_step(DType dt, Determinism mode, bool fused) {
  const nn::GPTConfig cfg{
      .block_size = 8, .vocab_size = 37, .n_layer = 2, .n_head = 2, .n_embd = 16};
  const Device dev(kXentProbe, 0);
  nn::GPT model(cfg, dev, 99);
  model.to(dt);
  model.set_determinism(mode);
  const std::int64_t B = 3, T = cfg.block_size;
  std::vector<std::int64_t> ids(B * T), tg(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = philox_u32(8, stream_id(kStreamSynthetic, 60), i) % 37u;
    tg[i] = philox_u32(8, stream_id(kStreamSynthetic, 61), i) % 37u;
  }
  tg[0] = 0;
  tg[1] = 36;
  nn::CrossEntropyLoss crit;
  crit.set_determinism(mode);
  const Tensor gl = Tensor::full({}, 1024.0f, dev);
  const Tensor logits = model.forward(Tensor::from_vector(ids, {B, T}).to(dev));
  const Tensor targets = Tensor::from_vector(tg, {B, T}).to(dev);
  const Tensor loss =
      fused ? crit.forward_backward(logits, targets, gl) : crit.forward(logits, targets);
  model.backward(crit.backward(gl));
  XentStep r;
  r.loss = tensor_bytes(loss);
  for (nn::Parameter* p : model.parameters()) r.grads.push_back(tensor_bytes(p->grad));
  return r;
}

// nn::CrossEntropyLoss::forward_backward in a GPT step: where the backend fuses (fast mode), one
// cross_entropy_fused launch and no backward kernel, with the loss and every parameter gradient
// of forward-then-backward (byte for byte here: the probe's kernel is the two kernels; CUDA's
// own is within the emulator's tolerance of them); in bitwise mode (or without the kernel)
// forward_backward is forward and the backward runs as before.
TEST_F(XentFused, TinyGptStepForwardBackwardKeepsLossAndGradients) {
  XentProbeKernels& k = probe();
  for (Determinism mode : {Determinism::fast, Determinism::bitwise})
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      k.fused = true;
      const XentStep two = xent_gpt_step(dt, mode, false);
      k.calls.clear();
      const XentStep one = xent_gpt_step(dt, mode, true);
      EXPECT_EQ(one.loss, two.loss);
      EXPECT_EQ(one.grads, two.grads);
      const bool fast = mode == Determinism::fast;
      EXPECT_EQ(k.count("cross_entropy_fused"), fast ? 1 : 0);
      const int backward_kernels =
          k.count("cross_entropy_backward") + k.count("cross_entropy_backward_ex");
      EXPECT_EQ(backward_kernels, fast ? 0 : 1);
      // The loss is a real value: about log(37) for a fresh model.
      float lv = 0;
      std::memcpy(&lv, one.loss.data(), 4);
      EXPECT_NEAR(lv, std::log(37.0f), 0.5f);
    }
}

// forward_backward's loss checks are forward's (the call named), and a plain forward after it
// drops the stored gradient (backward then computes from that forward's logits).
TEST_F(XentFused, ForwardBackwardChecksAndForgets) {
  XentProbeKernels& k = probe();
  k.fused = true;
  const Device dev(kXentProbe, 0);
  nn::CrossEntropyLoss crit;
  const std::int64_t N = 4, C = 7;
  Tensor bad_t = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 7, 2}, {N}).to(dev);
  Tensor logits = fused_logits({N, C}, DType::f32, 4, kXentProbe);
  const auto before = tensor_bytes(logits);
  try {
    crit.forward_backward(logits, bad_t, Tensor());
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("CrossEntropyLoss.forward_backward: ops::cross_entropy_fused: targets[2] = 7"),
        std::string::npos)
        << what;
  }
  EXPECT_EQ(tensor_bytes(logits), before);
  const Tensor t = fused_targets(N, C, kXentProbe);
  crit.forward_backward(logits, t, Tensor());  // the gradient now over logits
  Tensor fresh = fused_logits({N, C}, DType::f32, 5, kXentProbe);
  crit.forward(fresh, t);
  k.calls.clear();
  const Tensor g = crit.backward();
  EXPECT_EQ(k.count("cross_entropy_backward"), 1);
  EXPECT_EQ(tensor_bytes(g),
            tensor_bytes(ops::cross_entropy_backward(fresh, t, Tensor::full({}, 1.0f, dev),
                                                     1.0f / static_cast<float>(N))));
}

}  // namespace
}  // namespace ditto
