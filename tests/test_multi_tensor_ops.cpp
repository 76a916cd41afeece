// The multi-tensor ops (ops::adam_step_multi_, sum_squares_multi, scale_multi_, copy_multi_;
// Kernels:: adam_step_multi and siblings, issue 29): in the backend-ops table (every backend
// against a double reference, cuda against the simulator bit for bit when a GPU is there), equal
// bit for bit to the per-tensor ops they replace, their argument checks, and the simulator keeping
// the per-tensor path (has_multi_tensor_kernels false: its launches and virtual time unchanged).
// The CUDA kernels themselves run on the CPU in ctest CudaEmu.Kernels (test_emu_fused.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend_ops_table.h"
#include "core/optim/adam.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using namespace ditto::test::backend_ops;

// AdamW over three tensors (sizes 7, 4099, 1) at steps 1, 2 and 1 (per-tensor bias
// corrections), the decay on the first two: against torch.optim.AdamW's formula in double; with
// amsgrad, the update divides by the running maximum of exp_avg_sq (max_exp_avg_sq, updated).
void multi_adamw_case(OpRun& r, bool amsgrad) {
  const std::vector<std::int64_t> sizes = {7, 4099, 1};
  const std::vector<int> steps = {1, 2, 1};
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<Tensor> p, g, m, v, vmax;
  std::vector<Vec> pw, ps, vw, mw;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t n = sizes[i];
    const std::vector<float> p0 = r.values(n), g0 = r.values(n), m0 = r.values(n), v0 = r.values(n);
    std::vector<float> va(v0.size()), ma(v0.size());
    for (std::size_t e = 0; e < v0.size(); ++e) va[e] = std::fabs(v0[e]);
    if (amsgrad) {  // running maxima above and below exp_avg_sq's new values
      const std::vector<float> x0 = r.values(n);
      for (std::size_t e = 0; e < v0.size(); ++e) ma[e] = std::fabs(x0[e]);
    }
    p.push_back(r.upload(p0, {n}));
    g.push_back(r.upload(g0, {n}));
    m.push_back(r.upload(m0, {n}));
    v.push_back(r.upload(va, {n}));
    vmax.push_back(r.upload(ma, {n}));
    const bool decay = i < 2;
    const double bc1 = 1 - std::pow(b1, steps[i]), bc2 = 1 - std::pow(b2, steps[i]);
    Vec want(n), scale(n), vv(n), vm(n);
    for (std::int64_t e = 0; e < n; ++e) {
      double pe = p0[e];
      if (decay) pe *= 1.0 - lr * wd;
      const double me = b1 * m0[e] + (1 - b1) * g0[e];
      vv[e] = b2 * va[e] + (1 - b2) * double(g0[e]) * g0[e];
      vm[e] = amsgrad ? std::max(double(ma[e]), vv[e]) : vv[e];
      const double update = (lr / bc1) * me / (std::sqrt(vm[e]) / std::sqrt(bc2) + eps);
      want[e] = pe - update;
      scale[e] = std::fabs(pe) + std::fabs(update) + std::fabs(p0[e]);
    }
    pw.push_back(want);
    ps.push_back(scale);
    vw.push_back(vv);
    mw.push_back(vm);
  }
  std::vector<ops::AdamStepTensors> list;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ops::AdamStepTensors t;
    t.param = &p[i];
    t.grad = &g[i];
    t.exp_avg = &m[i];
    t.exp_avg_sq = &v[i];
    if (amsgrad) t.max_exp_avg_sq = &vmax[i];
    t.bias_correction1 = 1 - std::pow(b1, steps[i]);
    t.bias_correction2 = 1 - std::pow(b2, steps[i]);
    if (i < 2) t.decay_scale = static_cast<float>(1.0 - lr * wd);
    list.push_back(t);
  }
  ops::adam_step_multi_(list, lr, b1, b2, eps, 0.0, amsgrad);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    r.check(detail::cat("param", i), p[i], pw[i], ps[i], 64 * kU);
    r.check(detail::cat("exp_avg_sq", i), v[i], vw[i], vw[i], 16 * kU);
    if (amsgrad) r.check(detail::cat("max_exp_avg_sq", i), vmax[i], mw[i], mw[i], 16 * kU);
  }
}

// Sums of squares of four tensors (one empty, one of several kSquaresBlock blocks), then the
// clip's scaling of them.
void multi_squares_scale_case(OpRun& r) {
  const std::vector<std::int64_t> sizes = {5, 0, 3 * 4096 + 7, 300};
  std::vector<Tensor> xs;
  std::vector<std::vector<float>> host;
  Vec sq;
  for (std::int64_t n : sizes) {
    host.push_back(r.values(n));
    xs.push_back(r.upload(host.back(), {n}));
    double s = 0;
    for (float x : host.back()) s += double(x) * x;
    sq.push_back(s);
  }
  std::vector<const Tensor*> cx;
  std::vector<Tensor*> px;
  for (Tensor& t : xs) {
    cx.push_back(&t);
    px.push_back(&t);
  }
  double worst = 0;
  for (std::int64_t n : sizes) worst = std::max(worst, double(n));
  r.check("sum_squares_multi", ops::sum_squares_multi(cx, r.mode), sq, sq, (worst + 2) * kU);
  const float alpha = 0.37f;
  ops::scale_multi_(px, alpha);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    Vec want, scale;
    for (float x : host[i]) {
      want.push_back(double(alpha) * x);
      scale.push_back(std::fabs(want.back()));
    }
    r.check(detail::cat("scale_multi", i), xs[i], want, scale, kU);
  }
}

const RegisterOpCases kMultiCases({{"multi_adamw", [](OpRun& r) { multi_adamw_case(r, false); }},
                                   {"multi_adamw_amsgrad",
                                    [](OpRun& r) { multi_adamw_case(r, true); }},
                                   {"multi_sum_squares_scale", multi_squares_scale_case}});

class MultiTensorOpsTest : public SimSuite<2> {};

// The simulator has no multi-tensor kernels of its own (its optimizer keeps the per-tensor ops,
// launches and virtual time); the host has none either.
TEST_F(MultiTensorOpsTest, SimulatorAndHostKeepThePerTensorPath) {
  EXPECT_FALSE(ops::has_multi_tensor_kernels(Device("sim", 0)));
  EXPECT_FALSE(ops::has_multi_tensor_kernels(Device::cpu()));
}

// adam_step_multi_ = per tensor scale_ (where a decay is set) then adam_step_, in both modes'
// bits (it has one order), amsgrad or not.
TEST_F(MultiTensorOpsTest, AdamStepMultiIsTheDecayThenAdamPerTensorBitForBit) {
  const Device dev("sim", 0);
  for (bool amsgrad : {false, true}) {
    const std::vector<std::int64_t> sizes = {3, 0, 5000, 17};
    std::vector<Tensor> a[5], b[5];  // param, grad, exp_avg, exp_avg_sq, max: two copies
    for (std::size_t i = 0; i < sizes.size(); ++i)
      for (int k = 0; k < 5; ++k) {
        Tensor t = Tensor::from_vector(random_values(static_cast<std::size_t>(sizes[i]),
                                                     static_cast<std::uint32_t>(100 + 10 * i + k),
                                                     k >= 3 ? 0.0f : -1.0f, 1.0f),
                                       {sizes[i]}, dev);
        a[k].push_back(t);
        b[k].push_back(t.clone());
      }
    std::vector<ops::AdamStepTensors> list;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      ops::AdamStepTensors t;
      t.param = &a[0][i];
      t.grad = &a[1][i];
      t.exp_avg = &a[2][i];
      t.exp_avg_sq = &a[3][i];
      t.max_exp_avg_sq = amsgrad ? &a[4][i] : nullptr;
      t.bias_correction1 = 1 - std::pow(0.9, double(i + 1));
      t.bias_correction2 = 1 - std::pow(0.999, double(i + 1));
      if (i % 2 == 0) t.decay_scale = 0.999f;
      list.push_back(t);
    }
    ops::adam_step_multi_(list, 1e-3, 0.9, 0.999, 1e-8, 0.01, amsgrad);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      if (i % 2 == 0) ops::scale_(b[0][i], 0.999f);
      ops::adam_step_(b[0][i], b[1][i], b[2][i], b[3][i], b[4][i], 1e-3, 0.9, 0.999, 1e-8, 0.01,
                      1 - std::pow(0.9, double(i + 1)), 1 - std::pow(0.999, double(i + 1)),
                      amsgrad);
    }
    for (int k : {0, 2, 3, 4})
      for (std::size_t i = 0; i < sizes.size(); ++i)
        EXPECT_TRUE(bits_equal(a[k][i].to_vector<float>(), b[k][i].to_vector<float>()))
            << "buffer " << k << " tensor " << i << " amsgrad " << amsgrad;
  }
}

TEST_F(MultiTensorOpsTest, SumSquaresAndScaleMultiArePerTensorBitForBit) {
  const Device dev("sim", 1);
  std::vector<Tensor> xs;
  for (std::int64_t n : {4097, 0, 1, 12345})
    xs.push_back(Tensor::from_vector(
        random_values(static_cast<std::size_t>(n), static_cast<std::uint32_t>(7 + n), -3.0f, 3.0f),
        {n}, dev));
  std::vector<const Tensor*> cx;
  std::vector<Tensor*> px;
  for (Tensor& t : xs) {
    cx.push_back(&t);
    px.push_back(&t);
  }
  for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
    const std::vector<float> got = ops::sum_squares_multi(cx, mode).to_vector<float>();
    ASSERT_EQ(got.size(), xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i)
      EXPECT_EQ(bits(got[i]), bits(ops::sum_squares(xs[i], mode).item())) << i;
  }
  std::vector<Tensor> ref;
  for (Tensor& t : xs) ref.push_back(t.clone());
  ops::scale_multi_(px, 0.25f);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ops::scale_(ref[i], 0.25f);
    EXPECT_TRUE(bits_equal(xs[i].to_vector<float>(), ref[i].to_vector<float>())) << i;
  }
}

// Adam::step_multi, the optimizer's multi-tensor path (taken on cuda, multi_tensor() true): on
// the simulator its ops::adam_step_multi_ runs the per-tensor kernels, so it must give the bits
// of step() and of AdamW's decay-then-Adam, step after step, with a parameter on a second device,
// one that misses a gradient at a step (its own step count and bias corrections), and amsgrad.
TEST_F(MultiTensorOpsTest, AdamStepMultiGivesTheBitsOfStepAndOfAdamW) {
  const Device d0("sim", 0), d1("sim", 1);
  auto make = [&](const char* name, std::int64_t n, std::uint32_t seed, const Device& d,
                  const Shape& shape) {
    return nn::Parameter{
        name, Tensor::from_vector(random_values(static_cast<std::size_t>(n), seed), shape, d),
        Tensor()};
  };
  for (bool amsgrad : {false, true}) {
    // Two copies of the same parameters: w [3, 5] on sim:0, b [5] on sim:1, e [4] on sim:0.
    nn::Parameter w[2], b[2], e[2];
    for (int c = 0; c < 2; ++c) {
      w[c] = make("w", 15, 1, d0, {3, 5});
      b[c] = make("b", 5, 2, d1, {5});
      e[c] = make("e", 4, 3, d0, {4});
    }
    const optim::AdamOptions ao{.lr = 0.01, .beta2 = 0.99, .amsgrad = amsgrad};
    optim::Adam per({&w[0], &b[0], &e[0]}, ao), multi({&w[1], &b[1], &e[1]}, ao);
    for (int step = 0; step < 3; ++step) {
      for (int c = 0; c < 2; ++c) {
        w[c].grad = Tensor::from_vector(random_values(15, 10 + step), {3, 5}, d0);
        b[c].grad = Tensor::from_vector(random_values(5, 20 + step), {5}, d1);
        e[c].grad =
            step == 1 ? Tensor() : Tensor::from_vector(random_values(4, 30 + step), {4}, d0);
      }
      per.step();
      multi.step_multi(nullptr);
      EXPECT_TRUE(bits_equal(w[1].data.to_vector<float>(), w[0].data.to_vector<float>()))
          << "step " << step;
      EXPECT_TRUE(bits_equal(b[1].data.to_vector<float>(), b[0].data.to_vector<float>()))
          << "step " << step;
      EXPECT_TRUE(bits_equal(e[1].data.to_vector<float>(), e[0].data.to_vector<float>()))
          << "step " << step;
      for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(multi.step_count(i), per.step_count(i)) << i;
        EXPECT_TRUE(bits_equal(multi.exp_avg_sq(i).to_vector<float>(),
                               per.exp_avg_sq(i).to_vector<float>()))
            << i;
      }
    }
    // AdamW through the multi-tensor path: the decay folded into ops::adam_step_multi_ per
    // parameter, against AdamW::step (the scale_ calls, then Adam) on fresh copies.
    nn::Parameter w2 = make("w", 15, 1, d0, {3, 5}), b2 = make("b", 5, 2, d1, {5});
    nn::Parameter w3 = make("w", 15, 1, d0, {3, 5}), b3 = make("b", 5, 2, d1, {5});
    optim::AdamW ref({&w2, &b2},
                     {.lr = 0.01, .beta2 = 0.99, .weight_decay = 0.1, .amsgrad = amsgrad});
    optim::Adam inner({&w3, &b3}, ao);
    for (int step = 0; step < 3; ++step) {
      w2.grad = w3.grad = Tensor::from_vector(random_values(15, 40 + step), {3, 5}, d0);
      b2.grad = b3.grad = Tensor::from_vector(random_values(5, 50 + step), {5}, d1);
      ref.step();
      const std::vector<std::optional<float>> decay = {static_cast<float>(1.0 - 0.01 * 0.1),
                                                       std::nullopt};  // nanoGPT: 2-dim only
      inner.step_multi(&decay);
      EXPECT_TRUE(bits_equal(w3.data.to_vector<float>(), w2.data.to_vector<float>()))
          << "step " << step;
      EXPECT_TRUE(bits_equal(b3.data.to_vector<float>(), b2.data.to_vector<float>()))
          << "step " << step;
    }
  }
}

// clip_grad_norm_'s multi-tensor path (taken on cuda): the same norm and clipped gradients as
// the per-gradient path, both modes, gradients on two devices, one parameter without a grad,
// clipping and not.
TEST_F(MultiTensorOpsTest, ClipGradNormMultiTensorPathGivesTheSameBits) {
  const Device d0("sim", 0), d1("sim", 1);
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (double max_norm : {0.5, 1e6}) {
      nn::Parameter p[2][4];
      for (int c = 0; c < 2; ++c) {
        const std::int64_t sizes[4] = {9000, 7, 33, 5};
        for (int i = 0; i < 4; ++i) {
          const Device& d = i % 2 == 0 ? d0 : d1;
          const auto n = static_cast<std::size_t>(sizes[i]);
          p[c][i] = nn::Parameter{"p", Tensor::zeros({sizes[i]}, DType::f32, d), Tensor()};
          if (i != 2)
            p[c][i].grad =
                Tensor::from_vector(random_values(n, 60 + i, -2.0f, 2.0f), {sizes[i]}, d);
        }
      }
      const float a = optim::detail::clip_grad_norm_with({&p[0][0], &p[0][1], &p[0][2], &p[0][3]},
                                                         max_norm, mode, false);
      const float b = optim::detail::clip_grad_norm_with({&p[1][0], &p[1][1], &p[1][2], &p[1][3]},
                                                         max_norm, mode, true);
      EXPECT_EQ(bits(a), bits(b)) << determinism_name(mode) << " " << max_norm;
      for (int i : {0, 1, 3})
        EXPECT_TRUE(bits_equal(p[1][i].grad.to_vector<float>(), p[0][i].grad.to_vector<float>()))
            << determinism_name(mode) << " " << max_norm << " grad " << i;
    }
}

TEST_F(MultiTensorOpsTest, ArgumentErrorsNameTheEntry) {
  const Device d0("sim", 0), d1("sim", 1);
  Tensor p = Tensor::zeros({4}, DType::f32, d0), g = p.clone(), m = p.clone(), v = p.clone();
  Tensor g_short = Tensor::zeros({3}, DType::f32, d0), p1 = Tensor::zeros({4}, DType::f32, d1);
  ops::AdamStepTensors ok{&p, &g, &m, &v, nullptr, 1.0, 1.0, std::nullopt};
  ops::AdamStepTensors bad = ok;
  bad.grad = &g_short;
  expect_invalid(
      [&] {
        ops::adam_step_multi_({ok, bad}, 1e-3, 0.9, 0.999, 1e-8, 0, false);
      },
      "ops::adam_step_multi_: tensors[1].grad: expected [4]");
  ops::AdamStepTensors other = ok;
  other.param = &p1;
  expect_invalid(
      [&] {
        ops::adam_step_multi_({ok, other}, 1e-3, 0.9, 0.999, 1e-8, 0, false);
      },
      "tensors[1].param: expected a tensor on sim:0");
  expect_invalid([&] { ops::adam_step_multi_({ok}, 1e-3, 0.9, 0.999, 1e-8, 0, true); },
                 "tensors[0].max_exp_avg_sq: expected a tensor, got null");
  expect_invalid([&] { ops::sum_squares_multi({}, Determinism::bitwise); },
                 "ops::sum_squares_multi: xs: expected at least one tensor");
  expect_invalid(
      [&] {
        ops::sum_squares_multi({&p, &p1}, Determinism::bitwise);
      },
      "xs[1]: expected a tensor on sim:0");
  Tensor host = Tensor::zeros({2}, DType::f32, Device::cpu());
  expect_invalid([&] { ops::scale_multi_({&host}, 2.0f); },
                 "ops::scale_multi_: xs[0]: expected a tensor on a device");
}

// ops::copy_multi_ (ZeRO-1's copies, Note [ZeRO copies] in core/optim/zero.h) on the simulator:
// the bytes of one Tensor::copy_ per piece (bf16: NaN and -0 kept as they are) and of ops::cast
// per piece (f32 -> bf16, bf16 -> f32), the bytes between the dst pieces untouched; then its
// argument checks, each naming the argument and entry.
TEST_F(MultiTensorOpsTest, CopyMultiIsOneCopyOrCastPerPiece) {
  const Device d0("sim", 0), d1("sim", 1);
  const std::vector<std::int64_t> sizes = {3, 0, 1, 4099};
  std::vector<float> v = random_values(4200, 11, -300.0f, 300.0f);
  v[0] = std::nanf("");
  v[1] = -0.0f;
  v[2] = 1.00390625f;  // 1 + 2^-8: a bf16 tie, rounds to even
  // Not a structured binding: Clang before 16 refuses a lambda capturing one (fresh, below).
  for (const auto& from_to : std::vector<std::pair<DType, DType>>{{DType::f32, DType::f32},
                                                                  {DType::bf16, DType::bf16},
                                                                  {DType::f32, DType::bf16},
                                                                  {DType::bf16, DType::f32}}) {
    const DType from = from_to.first, to = from_to.second;
    SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
    const Tensor src = Tensor::from_vector(v, {4200}).to(from).to(d0);
    auto fresh = [&] { return Tensor::from_vector(random_values(4200, 12), {4200}).to(to).to(d0); };
    Tensor a = fresh(), b = fresh();
    std::vector<Tensor> srcs, dsts;
    std::int64_t s_at = 0, d_at = 50;
    for (std::int64_t n : sizes) {
      srcs.push_back(src.narrow(s_at, n));
      dsts.push_back(a.narrow(d_at, n));
      b.narrow(d_at, n).copy_(from == to ? srcs.back() : ops::cast(srcs.back(), to));
      s_at += n + 2;
      d_at += n + 3;
    }
    ops::copy_multi_(dsts, srcs);
    EXPECT_EQ(tensor_bytes(a), tensor_bytes(b));
  }
  Tensor x = Tensor::zeros({8}, DType::f32, d0), y = Tensor::zeros({8}, DType::f32, d0);
  Tensor h = Tensor::zeros({8}, DType::bf16, d0), far = Tensor::zeros({8}, DType::f32, d1);
  const Tensor i64 = Tensor::zeros({8}, DType::i64, d0);
  constexpr const char* op = "ops::copy_multi_: ";
  expect_invalid([&] { ops::copy_multi_({x}, {}); },
                 std::string(op) + "dsts, srcs: expected lists of one length, got 1 dsts and 0");
  expect_invalid(
      [&] {
        ops::copy_multi_({x.narrow(0, 2), h.narrow(0, 2)}, {y.narrow(0, 2), y.narrow(2, 2)});
      },
      std::string(op) + "dsts[1]: expected dtype f32, got");
  expect_invalid([&] { ops::copy_multi_({x.narrow(0, 3)}, {y.narrow(0, 2)}); },
                 std::string(op) + "dsts[0]: expected 2 elements (those of srcs[0]), got");
  expect_invalid(
      [&] {
        ops::copy_multi_({x.narrow(0, 2), far.narrow(0, 2)}, {y.narrow(0, 2), y.narrow(2, 2)});
      },
      std::string(op) + "dsts[1]: expected a tensor on sim:0");
  expect_invalid(
      [&] {
        ops::copy_multi_({x.narrow(0, 4), x.narrow(3, 2)}, {y.narrow(0, 4), y.narrow(4, 2)});
      },
      std::string(op) + "dsts[1]: must not share memory with dsts[0]");
  expect_invalid(
      [&] {
        ops::copy_multi_({x.narrow(0, 2), x.narrow(4, 2)}, {y.narrow(0, 2), x.narrow(5, 2)});
      },
      std::string(op) + "dsts[1]: must not share memory with srcs[1]");
  ops::copy_multi_({x.narrow(6, 2)}, {x.narrow(0, 2)});  // one buffer, apart: fine
  expect_invalid([&] { ops::copy_multi_({x.narrow(1, 4)}, {x.narrow(0, 4)}); },
                 std::string(op) + "dsts[0]: must not share memory with srcs[0]");
  expect_invalid([&] { ops::copy_multi_({x}, {i64}); },
                 std::string(op) + "srcs[0], dsts[0]: expected one dtype, or f32 -> bf16 / f16, or "
                                   "bf16 / f16 -> f32, got");
}

}  // namespace
}  // namespace ditto
