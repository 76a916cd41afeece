// The optimizer step on the model's gradients as stored (issue 29; Note [Typed optimizer step] in
// core/optim/master_weights.h): optim::MasterWeights' clip and AdamW step call the typed
// multi-tensor kernels (Kernels::adam_step_multi_ex, sum_squares_multi_ex) exactly where the
// backend's has_multi_tensor_ex says so, with the bits of the f32 path they replace (casts,
// sum_squares_multi, scale_multi, adam_step_multi, casts back, copies), and otherwise keep that
// path (the simulator's, unchanged). On the CPU through a probe backend: the simulator's kernels
// behind a Kernels that counts every call and answers has_multi_tensor_kernels and
// has_multi_tensor_ex as told (its typed entries compute as the f32 path does, on the simulator).
// The kernels' own bits: ctest CudaEmu.Kernels (`cuda_emu_test multi`,
// tools/cuda_emu/test_emu_multi.cpp); on a GPU, CudaOptimFused (skips without one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/gpt.h"
#include "core/nn/loss.h"
#include "core/numerics/random.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/master_weights.h"
#include "core/optim/sgd.h"
#include "core/optim/zero.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "counting_kernels.h"
#include "test_util.h"
#include "train_step.h"
#include "zero_test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr const char* kOptimProbe = "optim_probe";

// The simulator's kernels, each call counted by name; has_multi_tensor_kernels answers `multi`,
// has_multi_tensor_ex `typed` (f32, bf16, f16). The typed entries run the f32 path on the
// simulator: each gradient cast to f32 scratch, scale_multi, adam_step_multi (sum_squares_multi),
// each master cast into its model weight.
class OptimProbeKernels final : public CountingKernels {
 public:
  using CountingKernels::CountingKernels;

  bool multi = false, typed = false;

  bool has_multi_tensor_kernels() const override { return multi; }
  bool has_multi_tensor_ex(DType t) const override {
    return typed && (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }
  void adam_step_multi_ex(Stream& s, const std::vector<AdamTensorEx>& ts, double lr, double beta1,
                          double beta2, double eps, double weight_decay, bool amsgrad,
                          bool scale_grads, float grad_scale) override {
    note("adam_step_multi_ex");
    Scratch sc(*this, s);
    std::vector<AdamTensor> f32;
    std::vector<float*> gs;
    std::vector<std::int64_t> ns;
    for (const AdamTensorEx& t : ts) {
      float* g = sc.f32(t.n);
      k_.cast(s, t.grad, t.grad_type, g, DType::f32, t.n);  // a copy: the scale must not write
      f32.push_back({t, g});  // t's state, the f32 copy of its gradient
      gs.push_back(g);
      ns.push_back(t.n);
    }
    if (scale_grads) k_.scale_multi(s, gs, ns, grad_scale);
    k_.adam_step_multi(s, f32, lr, beta1, beta2, eps, weight_decay, amsgrad);
    for (const AdamTensorEx& t : ts)
      if (t.model != nullptr) k_.cast(s, t.param, DType::f32, t.model, t.model_type, t.n);
  }
  void sum_squares_multi_ex(Stream& s, const std::vector<const void*>& xs,
                            const std::vector<DType>& types, const std::vector<std::int64_t>& ns,
                            float* out, Determinism mode) override {
    note("sum_squares_multi_ex");
    Scratch sc(*this, s);
    std::vector<const float*> f;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      float* x = sc.f32(ns[i]);
      k_.cast(s, xs[i], types[i], x, DType::f32, ns[i]);
      f.push_back(x);
    }
    k_.sum_squares_multi(s, f, ns, out, mode);
  }
};

class OptimFused : public SimSuite<2> {
 protected:
  static void SetUpTestSuite() {
    SimSuite<2>::SetUpTestSuite();
    register_probe_backend<OptimProbeKernels>(kOptimProbe);
  }
  static OptimProbeKernels& probe() {
    return static_cast<OptimProbeKernels&>(get_backend(kOptimProbe).kernels());
  }
  void TearDown() override {
    probe().multi = false;
    probe().typed = false;
    probe().calls.clear();
  }
};

// A tiny GPT (2 layers, C 32, T 16, V 65) in `dt` on sim:0 and its optimizer on the probe: each
// of two steps runs forward and backward on the simulator, hands the gradients (bf16 / f16 in fast
// mode, f32 in bitwise mode: nn::grad_dtype) to copies of the parameters on the probe, clips at
// `clip` and steps MasterWeights(AdamW) there as the trainer does (Replica::optimizer_step), and
// copies the weights back. `poison`: an inf in the first gradient of the second step (a
// non-finite norm). Returns every probe weight's bytes after the second step, and the masters'.
struct TwoSteps {
  std::vector<std::vector<std::uint8_t>> weights, masters;
  std::vector<float> norms;
  std::map<std::string, int> calls;  // the probe's calls during the steps
};
TwoSteps gpt_two_steps(DType dt, Determinism mode, double clip, bool poison) {
  const nn::GPTConfig cfg{
      .block_size = 16, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 32, .dropout = 0.0f};
  nn::GPT model(cfg, Device("sim", 0), 1337);
  model.to(dt);
  model.set_determinism(mode);
  const Device probe_dev(kOptimProbe, 0);
  std::vector<nn::Parameter*> params = model.parameters();
  std::vector<std::unique_ptr<nn::Parameter>> mirror;
  std::vector<nn::Parameter*> ptrs;
  for (nn::Parameter* p : params) {
    mirror.push_back(std::make_unique<nn::Parameter>());
    mirror.back()->name = p->name;
    mirror.back()->data = p->data.to(probe_dev);
    ptrs.push_back(mirror.back().get());
  }
  optim::MasterWeights mw(ptrs, [](std::vector<nn::Parameter*> masters) {
    return std::make_unique<optim::AdamW>(masters,
                                          optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
  });
  nn::CrossEntropyLoss crit;
  crit.set_determinism(mode);
  const std::int64_t B = 4, T = cfg.block_size;
  TwoSteps r;
  OptimProbeKernels& k = static_cast<OptimProbeKernels&>(get_backend(kOptimProbe).kernels());
  k.calls.clear();
  for (int step = 0; step < 2; ++step) {
    std::vector<std::int64_t> ids(B * T), tg(B * T);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      ids[i] = philox_u32(5 + step, stream_id(kStreamSynthetic, 40), i) % 65u;
      tg[i] = philox_u32(5 + step, stream_id(kStreamSynthetic, 41), i) % 65u;
    }
    const Device dev("sim", 0);
    for (nn::Parameter* p : params) p->grad = Tensor();
    const Tensor logits = model.forward(Tensor::from_vector(ids, {B, T}).to(dev));
    (void)crit.forward(logits, Tensor::from_vector(tg, {B, T}).to(dev));
    model.backward(crit.backward());
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor g = params[i]->grad.to(Device::cpu(), /*copy=*/true);
      if (poison && step == 1 && i == 0) {
        Tensor f = g.to(DType::f32);
        f.data<float>()[1] = INFINITY;
        g = f.to(g.dtype());
      }
      ptrs[i]->grad = g.to(probe_dev);
    }
    if (clip > 0) r.norms.push_back(mw.clip_grad_norm_(clip, mode));
    mw.step();
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i]->data.copy_(ptrs[i]->data.to(Device::cpu()));
  }
  current_stream(probe_dev).synchronize();
  r.calls = k.calls;
  for (nn::Parameter* p : ptrs) r.weights.push_back(tensor_bytes(p->data));
  for (nn::Parameter* m : mw.master_parameters()) r.masters.push_back(tensor_bytes(m->data));
  return r;
}

// A run's weights and masters (bytes), its norms, and whether it took the fused path.
struct ProbeLessRun {
  std::vector<std::vector<std::uint8_t>> bytes;
  std::vector<float> norms;
  bool fused = false;
};

int total(const std::map<std::string, int>& calls) {
  int n = 0;
  for (const auto& [name, c] : calls) n += c;
  return n;
}

// The dispatch rule and the bits: with has_multi_tensor_ex false (the simulator's answer) the
// steps keep the f32 path (per-parameter casts in and out, a copy each); with it true, each
// step is one adam_step_multi_ex and the clip one sum_squares_multi_ex (fast: bf16 / f16 grads;
// bitwise: f32 grads, sum_squares_multi), no cast, no scale_multi; the weights and masters after
// two steps have the same bytes either way, in both modes, with the clip scaling (max_norm
// 0.05) and not (1e9), and with an inf gradient (the norm inf, every grad scaled by 0: NaN
// where the inf was, as the f32 path gives).
TEST_F(OptimFused, MasterWeightsTakeTheTypedKernelsOnlyWhereTheBackendHasThem) {
  OptimProbeKernels& k = probe();
  for (DType dt : {DType::bf16, DType::f16})
    for (Determinism mode : {Determinism::fast, Determinism::bitwise})
      for (double clip : {0.05, 1e9, 0.0})
        for (bool poison : {false, true}) {
          if (poison && clip == 0.0) continue;
          SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode) + " clip " +
                       std::to_string(clip) + (poison ? " inf" : ""));
          k.multi = true;
          k.typed = false;
          const TwoSteps f32 = gpt_two_steps(dt, mode, clip, poison);
          k.typed = true;
          const TwoSteps typed = gpt_two_steps(dt, mode, clip, poison);
          EXPECT_EQ(typed.weights, f32.weights);
          EXPECT_EQ(typed.masters, f32.masters);
          ASSERT_EQ(typed.norms.size(), f32.norms.size());
          for (std::size_t i = 0; i < f32.norms.size(); ++i) {
            EXPECT_EQ(std::isnan(typed.norms[i]), std::isnan(f32.norms[i]));
            if (!std::isnan(f32.norms[i])) {
              EXPECT_EQ(typed.norms[i], f32.norms[i]);
            }
          }
          if (poison) {
            EXPECT_TRUE(std::isinf(f32.norms.back()));
          }
          auto c = [](const TwoSteps& r, const char* name) {
            return r.calls.count(name) ? r.calls.at(name) : 0;
          };
          const bool half_grads = mode == Determinism::fast;
          EXPECT_EQ(c(f32, "adam_step_multi_ex"), 0);
          EXPECT_EQ(c(f32, "sum_squares_multi_ex"), 0);
          EXPECT_EQ(c(f32, "adam_step_multi"), 2);
          EXPECT_EQ(c(typed, "adam_step_multi"), 0);
          EXPECT_EQ(c(typed, "adam_step_multi_ex"), 2);
          EXPECT_EQ(c(typed, "sum_squares_multi_ex"), clip > 0 && half_grads ? 2 : 0);
          EXPECT_EQ(c(typed, "sum_squares_multi"), clip > 0 && !half_grads ? 2 : 0);
          EXPECT_EQ(c(f32, "sum_squares_multi"), clip > 0 ? 2 : 0);
          EXPECT_EQ(c(typed, "scale_multi"), 0);
          EXPECT_EQ(c(typed, "cast"), 0);  // no grad copies in, no weights cast out
          // The f32 path: a cast per parameter and step out (and in, for bf16 / f16 grads).
          const int n = static_cast<int>(f32.weights.size());
          EXPECT_EQ(c(f32, "cast"), 2 * n * (half_grads ? 2 : 1));
          EXPECT_LT(total(typed.calls), total(f32.calls));
          // Both take Adam::step_multi: AdamW's new moments zeroed in one launch at step 1.
          EXPECT_EQ(c(f32, "fill_multi"), 1);
          EXPECT_EQ(c(typed, "fill_multi"), 1);
          if (dt == DType::bf16 && clip == 0.05 && !poison)
            std::printf("%s: optimizer launches in two steps %d -> %d, casts %d -> 0\n",
                        determinism_name(mode), total(f32.calls), total(typed.calls),
                        c(f32, "cast"));
        }
  // Without multi-tensor kernels (a backend's per-tensor loops) the f32 path runs whatever
  // has_multi_tensor_ex says: Adam's fused step needs the multi-tensor launch.
  k.multi = false;
  k.typed = true;
  const TwoSteps loop = gpt_two_steps(DType::bf16, Determinism::fast, 0.05, false);
  EXPECT_EQ(loop.calls.count("adam_step_multi_ex"), 0u);
  EXPECT_GT(loop.calls.at("adam_step"), 0);
  k.multi = true;
  const TwoSteps typed = gpt_two_steps(DType::bf16, Determinism::fast, 0.05, false);
  EXPECT_EQ(loop.weights, typed.weights);
  // The moments (exp_avg, exp_avg_sq of each parameter): a fill_f32 each in the loop, one
  // fill_multi with multi-tensor kernels.
  EXPECT_EQ(loop.calls.count("fill_multi"), 0u);
  EXPECT_EQ(typed.calls.at("fill_multi"), 1);
  const int n = static_cast<int>(typed.weights.size());
  EXPECT_EQ(
      loop.calls.at("fill_f32") - (typed.calls.count("fill_f32") ? typed.calls.at("fill_f32") : 0),
      2 * n);
}

// The fused path's limits: a GradScaler attached (f16's unscale_ reads f32 copies) or an inner
// optimizer without a fused step (SGD) keep the f32 path; a second fused clip before the step is
// refused; load_master_grads() after a fused clip applies its coefficient to the copies (the
// same bits as the f32 path's clip).
TEST_F(OptimFused, FusedPathLimits) {
  OptimProbeKernels& k = probe();
  k.multi = true;
  k.typed = true;
  const Device dev(kOptimProbe, 0);
  auto make = [&](DType dt) {
    std::vector<float> v(40);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i) - 2.0f;
    auto p = std::make_unique<nn::Parameter>();
    p->name = "w";
    p->data = Tensor::from_vector(v, {5, 8}).to(dt).to(dev);
    p->grad = Tensor::from_vector(v, {5, 8}).to(dt).to(dev);
    return p;
  };
  auto adamw = [](std::vector<nn::Parameter*> m) {
    return std::make_unique<optim::AdamW>(m, optim::AdamWOptions{.lr = 1e-2});
  };
  {
    auto p = make(DType::f16);
    optim::MasterWeights mw({p.get()}, adamw);
    EXPECT_TRUE(mw.fused_path());
    optim::GradScaler scaler;
    mw.attach_grad_scaler(&scaler);
    EXPECT_FALSE(mw.fused_path());
  }
  {
    auto p = make(DType::bf16);
    optim::MasterWeights mw({p.get()}, [](std::vector<nn::Parameter*> m) {
      return std::make_unique<optim::SGD>(m, optim::SGDOptions{.lr = 1e-2f});
    });
    EXPECT_FALSE(mw.fused_path());
    k.calls.clear();
    mw.step();
    EXPECT_EQ(k.count("adam_step_multi_ex"), 0);
    EXPECT_EQ(k.count("sgd_step"), 1);
  }
  {
    auto p = make(DType::bf16);
    optim::MasterWeights mw({p.get()}, adamw);
    EXPECT_TRUE(mw.fused_path());
    (void)mw.clip_grad_norm_(0.5, Determinism::bitwise);
    expect_invalid([&] { (void)mw.clip_grad_norm_(0.5, Determinism::bitwise); },
                   "optim::MasterWeights::clip_grad_norm_: called twice before step()");
    // The copies then carry the kept coefficient: the f32 path's clip, bit for bit.
    mw.load_master_grads();
    const auto scaled = tensor_bytes(mw.master_parameters()[0]->grad);
    auto q = make(DType::bf16);
    optim::MasterWeights ref({q.get()}, adamw);
    ref.load_master_grads();
    (void)optim::clip_grad_norm_(ref.master_parameters(), 0.5, Determinism::bitwise);
    EXPECT_EQ(scaled, tensor_bytes(ref.master_parameters()[0]->grad));
    mw.step();
    ref.step();
    EXPECT_EQ(tensor_bytes(p->data), tensor_bytes(q->data));
  }
}

// GradScaler::unscale_ where the backend has multi-tensor kernels (cuda): one sum_squares_multi and
// one scale_multi for the device instead of a sum_squares, a read and a scale per grad, with the
// per-grad path's found_inf and bits (a clean step, and one with an inf in the third grad; the
// scale 3 makes inv_scale inexact, so every product rounds).
TEST_F(OptimFused, GradScalerUnscalesWithTheMultiTensorKernelsAndTheSameBits) {
  OptimProbeKernels& k = probe();
  const Device dev(kOptimProbe, 0);
  struct Unscaled {
    bool inf = false;
    std::vector<std::vector<std::uint8_t>> grads;
    std::map<std::string, int> calls;
  };
  auto unscale = [&](bool multi, bool poison) {
    k.multi = multi;
    std::vector<std::unique_ptr<nn::Parameter>> owned;
    std::vector<nn::Parameter*> params;
    for (int j = 0; j < 5; ++j) {
      std::vector<float> v(static_cast<std::size_t>(7 + 3 * j));
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = 1e3f * std::sin(0.7f * static_cast<float>(i) + static_cast<float>(j));
      if (poison && j == 2) v[3] = INFINITY;
      auto p = std::make_unique<nn::Parameter>();
      p->name = "w" + std::to_string(j);
      const Shape shape{static_cast<std::int64_t>(v.size())};
      p->data = Tensor::from_vector(v, shape).to(dev);
      p->grad = Tensor::from_vector(v, shape).to(dev);
      params.push_back(p.get());
      owned.push_back(std::move(p));
    }
    optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 3.0});
    k.calls.clear();
    Unscaled r;
    r.inf = scaler.unscale_(params, Determinism::bitwise);
    r.calls = k.calls;
    for (const nn::Parameter* p : params) r.grads.push_back(tensor_bytes(p->grad));
    return r;
  };
  for (const bool poison : {false, true}) {
    SCOPED_TRACE(poison ? "an inf in grad 2" : "finite grads");
    const Unscaled loop = unscale(false, poison);
    const Unscaled multi = unscale(true, poison);
    EXPECT_EQ(loop.inf, poison);
    EXPECT_EQ(multi.inf, poison);
    EXPECT_EQ(multi.grads, loop.grads);
    auto count = [](const Unscaled& u, const char* name) {
      auto it = u.calls.find(name);
      return it == u.calls.end() ? 0 : it->second;
    };
    EXPECT_EQ(count(loop, "sum_squares"), 5);
    EXPECT_EQ(count(loop, "scale"), 5);
    EXPECT_EQ(count(multi, "sum_squares_multi"), 1);
    EXPECT_EQ(count(multi, "scale_multi"), 1);
    EXPECT_EQ(count(multi, "sum_squares"), 0);
    EXPECT_EQ(count(multi, "scale"), 0);
  }
}

// The typed ops' argument checks name the op and the argument; without typed kernels a bf16
// grad is refused with the reason.
TEST_F(OptimFused, TypedOpsCheckTheirArguments) {
  OptimProbeKernels& k = probe();
  k.multi = true;
  k.typed = false;
  const Device dev(kOptimProbe, 0);
  Tensor p = Tensor::zeros({4}, DType::f32, dev), m = Tensor::zeros({4}, DType::f32, dev),
         v = Tensor::zeros({4}, DType::f32, dev);
  Tensor g = Tensor::zeros({4}, DType::bf16, dev), w = Tensor::zeros({4}, DType::bf16, dev);
  ops::AdamStepTensors t;
  t.param = &p;
  t.grad = &g;
  t.exp_avg = &m;
  t.exp_avg_sq = &v;
  expect_invalid([&] { ops::adam_step_multi_({t}, 1e-3, 0.9, 0.99, 1e-8, 0.0, false); },
                 "ops::adam_step_multi_: tensors[0].grad: bf16 needs optim_probe:0's backend to "
                 "run the typed multi-tensor kernels");
  expect_invalid([&] { (void)ops::sum_squares_multi({&g}, Determinism::fast); },
                 "ops::sum_squares_multi: xs[0]: bf16 needs optim_probe:0's backend");
  k.typed = true;
  Tensor bad = Tensor::zeros({5}, DType::bf16, dev);
  t.model = &bad;
  expect_invalid([&] { ops::adam_step_multi_({t}, 1e-3, 0.9, 0.99, 1e-8, 0.0, false); },
                 "ops::adam_step_multi_: tensors[0].model: expected [4] (the shape of "
                 "tensors[0].param), got");
  Tensor f32_model = Tensor::zeros({4}, DType::f32, dev);
  t.model = &f32_model;
  expect_invalid([&] { ops::adam_step_multi_({t}, 1e-3, 0.9, 0.99, 1e-8, 0.0, false); },
                 "ops::adam_step_multi_: tensors[0].model: expected dtype bf16 or f16, got");
  t.model = &g;
  expect_invalid([&] { ops::adam_step_multi_({t}, 1e-3, 0.9, 0.99, 1e-8, 0.0, false); },
                 "ops::adam_step_multi_: tensors[0].model: must not share memory with "
                 "tensors[0].grad");
  t.model = &w;
  k.calls.clear();
  ops::adam_step_multi_({t}, 1e-3, 0.9, 0.99, 1e-8, 0.0, false, 0.5f);
  EXPECT_EQ(k.count("adam_step_multi_ex"), 1);
}

// Note [ZeRO copies] (core/optim/zero.h): ZeRO-1 on a backend with multi-tensor kernels moves
// its buffer's pieces in one ops::copy_multi_ per list: per chunk the grads packed, (bf16
// grads) the reduced part upcast into the shard, this rank's pieces put into and the other's
// taken out of the all_gather's buffer; per step (bf16 parameters) every master rounded into its
// piece. Two ranks, chunks of 2 x 4096 elements (4 of them), three AdamW steps with the clip:
// every parameter's bits equal the per-piece path's (Tensor::copy_, ops::cast + copy_), for bf16
// parameters with bf16 grads (fast mode's) and f32 grads (bitwise mode's), and f32 parameters.
TEST_F(OptimFused, ZeroCopiesTakeTheMultiTensorKernelsWithTheSameBits) {
  const std::vector<Shape> shapes{{70, 130}, {130}, {10, 70}, {10}, {3, 5}, {2000}};
  struct Case {
    DType param, grad;
    Determinism mode;
  };
  for (const Case& c : {Case{DType::bf16, DType::bf16, Determinism::fast},
                        Case{DType::bf16, DType::f32, Determinism::bitwise},
                        Case{DType::f32, DType::f32, Determinism::bitwise}}) {
    SCOPED_TRACE(std::string(dtype_name(c.param)) + " grads " + dtype_name(c.grad));
    std::int64_t chunks = 0;
    auto run = [&](bool multi) {
      probe().multi = multi;
      probe().calls.clear();
      std::vector<std::vector<std::uint8_t>> out(2);
      CommOptions co;
      co.determinism = c.mode;
      expect_no_rank_errors(run_comm_ranks(
          2, co,
          [&](int r, Communicator& comm) {
            std::vector<nn::Parameter> ps = make_params(shapes, comm.device(), c.param);
            optim::ZeroOptions zo;
            zo.max_grad_norm = 0.5;
            zo.bucket_cap_mb = 2 * 4096 * 4 / (1024.0 * 1024.0);  // 4096 elements a rank
            optim::ZeroRedundancyOptimizer zero(
                ptrs(ps), comm,
                [](std::vector<nn::Parameter*> q, float lr) {
                  return std::make_unique<optim::AdamW>(
                      q, optim::AdamWOptions{.lr = lr, .weight_decay = 0.1});
                },
                0.01f, zo);
            if (r == 0) chunks = zero.flat_numel() / 2 / zero.chunk_numel();
            for (int t = 0; t < 3; ++t) {
              for (std::size_t i = 0; i < ps.size(); ++i) {
                std::vector<float> g =
                    random_values(static_cast<std::size_t>(ps[i].data.numel()),
                                  static_cast<std::uint32_t>(50 * t + 7 * r + i));
                ps[i].grad = Tensor::from_vector(g, ps[i].data.shape(), comm.device()).to(c.grad);
              }
              zero.step();
            }
            for (auto& p : ps) {
              const std::vector<std::uint8_t> b = tensor_bytes(p.data);
              out[static_cast<std::size_t>(r)].insert(out[static_cast<std::size_t>(r)].end(),
                                                      b.begin(), b.end());
            }
          },
          kOptimProbe));
      return out;
    };
    const auto per_piece = run(false);
    const int per_piece_multi = probe().count("copy_multi");
    const auto multi = run(true);
    EXPECT_EQ(per_piece_multi, 0);
    EXPECT_EQ(multi, per_piece);
    EXPECT_EQ(multi[0], multi[1]);
    ASSERT_EQ(chunks, 4);  // 11,955 parameter elements in 8 slots of 4096: 4 x 4096 a rank
    // Per step and rank: 3 a chunk (pack, own pieces in, others' out), bf16 grads one upcast a
    // chunk, bf16 parameters one rounding of the masters.
    const int per_rank_step = static_cast<int>(3 * chunks) +
                              (c.grad == DType::bf16 ? static_cast<int>(chunks) : 0) +
                              (c.param == DType::bf16 ? 1 : 0);
    EXPECT_EQ(probe().count("copy_multi"), 2 * 3 * per_rank_step);
  }
}

// ---- CUDA (skips without a GPU): the typed kernels give the simulator's f32 path's bits

using CudaOptimFused = CudaSuite<>;  // kCudaTestDevices

// MasterWeights(AdamW) over bf16 / f16 weights of ragged sizes (one across the 8192-element
// chunk) with bf16 / f16 gradients (fast mode) and f32 ones (bitwise mode): two clipped steps on
// the CUDA backend's fused path (one adam_step_multi_ex, one sum_squares_multi_ex) give the
// weights, masters and norms of the simulator's f32 path, bit for bit. (NaN gradients: the
// emulator's checks; a GPU's arithmetic returns its canonical NaN, whose bits the host's need not
// have, for the f32 path's kernels as for these.)
TEST_F(CudaOptimFused, FusedStepEqualsTheSimulatorsF32Path) {
  const std::vector<Shape> shapes = {{3, 7}, {8193}, {1}, {40, 24}};
  for (DType dt : {DType::bf16, DType::f16})
    for (bool f32_grads : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (f32_grads ? " f32 grads" : ""));
      auto run = [&](const std::string& backend) {
        const Device dev(backend, 0);
        std::vector<std::unique_ptr<nn::Parameter>> ps;
        std::vector<nn::Parameter*> ptrs;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          std::vector<float> v(static_cast<std::size_t>(shape_numel(shapes[i])));
          for (std::size_t j = 0; j < v.size(); ++j)
            v[j] = uniform(3, stream_id(kStreamSynthetic, 60 + i), j, -1.0f, 1.0f);
          ps.push_back(std::make_unique<nn::Parameter>());
          ps.back()->name = "p" + std::to_string(i);
          ps.back()->data = Tensor::from_vector(v, shapes[i]).to(dt).to(dev);
          ptrs.push_back(ps.back().get());
        }
        ProbeLessRun r;
        optim::MasterWeights mw(ptrs, [](std::vector<nn::Parameter*> m) {
          return std::make_unique<optim::AdamW>(
              m, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
        });
        r.fused = mw.fused_path();
        for (int step = 0; step < 2; ++step) {
          for (std::size_t i = 0; i < shapes.size(); ++i) {
            std::vector<float> g(static_cast<std::size_t>(shape_numel(shapes[i])));
            for (std::size_t j = 0; j < g.size(); ++j)
              g[j] = uniform(4 + step, stream_id(kStreamSynthetic, 70 + i), j, -3.0f, 3.0f);
            ptrs[i]->grad =
                Tensor::from_vector(g, shapes[i]).to(f32_grads ? DType::f32 : dt).to(dev);
          }
          const Determinism mode = f32_grads ? Determinism::bitwise : Determinism::fast;
          r.norms.push_back(mw.clip_grad_norm_(0.5, mode));
          mw.step();
        }
        for (nn::Parameter* p : ptrs) r.bytes.push_back(tensor_bytes(p->data));
        for (nn::Parameter* m : mw.master_parameters()) r.bytes.push_back(tensor_bytes(m->data));
        return r;
      };
      const ProbeLessRun sim = run("sim"), cuda = run("cuda");
      EXPECT_FALSE(sim.fused);
      EXPECT_TRUE(cuda.fused);
      EXPECT_EQ(cuda.bytes, sim.bytes);
      ASSERT_EQ(cuda.norms.size(), sim.norms.size());
      for (std::size_t i = 0; i < sim.norms.size(); ++i)
        EXPECT_EQ(bits(cuda.norms[i]), bits(sim.norms[i])) << "norm " << i;
    }
}

// ops::copy_multi_ (ZeRO-1's copies, Note [ZeRO copies] in core/optim/zero.h) on the GPU: 1100
// pieces (two launches of 1000) of lengths 0, 1, odd and across the 8192-element chunk, the dsts
// in another buffer in the reverse order with a gap after each; copies of f32, bf16, u8 and i64,
// casts f32 -> bf16 / f16 and back. The bytes equal one Tensor::copy_ (or ops::cast + copy_)
// per piece on the GPU and ops::copy_multi_ on the simulator (its per-piece casts); the gaps
// keep their bytes.
TEST_F(CudaOptimFused, CopyMultiEqualsPerPieceCopiesAndCasts) {
  std::vector<std::int64_t> sizes;
  for (int i = 0; i < 1100; ++i) sizes.push_back(i % 97 == 0 ? 0 : (i * 37) % 41);
  sizes[5] = 20000;
  sizes[6] = 8193;
  sizes[7] = 1;
  const std::size_t count = sizes.size();
  std::vector<std::int64_t> src_at(count), dst_at(count);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    src_at[i] = total;
    total += sizes[i] + 1;
  }
  std::int64_t at = 0;
  for (std::size_t i = count; i-- > 0;) {
    dst_at[i] = at;
    at += sizes[i] + 1;
  }
  struct Pair {
    DType from, to;
  };
  for (const Pair& p :
       {Pair{DType::f32, DType::f32}, Pair{DType::bf16, DType::bf16}, Pair{DType::u8, DType::u8},
        Pair{DType::i64, DType::i64}, Pair{DType::f32, DType::bf16}, Pair{DType::f32, DType::f16},
        Pair{DType::bf16, DType::f32}, Pair{DType::f16, DType::f32}}) {
    SCOPED_TRACE(std::string(dtype_name(p.from)) + " -> " + dtype_name(p.to));
    std::vector<float> v(static_cast<std::size_t>(total)), w(v.size());
    for (std::size_t j = 0; j < v.size(); ++j) {
      v[j] = uniform(8, stream_id(kStreamSynthetic, 80), j, -100.0f, 100.0f);
      w[j] = uniform(9, stream_id(kStreamSynthetic, 81), j, -100.0f, 100.0f);
    }
    auto run = [&](const std::string& backend, bool multi) {
      const Device dev(backend, 0);
      const Tensor src = Tensor::from_vector(v, {total}).to(p.from).to(dev);
      Tensor dst = Tensor::from_vector(w, {total}).to(p.to).to(dev);
      std::vector<Tensor> srcs, dsts;
      for (std::size_t i = 0; i < count; ++i) {
        srcs.push_back(src.narrow(src_at[i], sizes[i]));
        dsts.push_back(dst.narrow(dst_at[i], sizes[i]));
      }
      if (multi) {
        ops::copy_multi_(dsts, srcs);
      } else {
        for (std::size_t i = 0; i < count; ++i)
          dsts[i].copy_(p.from == p.to ? srcs[i] : ops::cast(srcs[i], p.to));
      }
      return tensor_bytes(dst);
    };
    const std::vector<std::uint8_t> sim = run("sim", true), cuda = run("cuda", true);
    EXPECT_EQ(cuda, run("cuda", false));
    EXPECT_EQ(cuda, sim);
  }
}

}  // namespace
}  // namespace ditto
