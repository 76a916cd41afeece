// The multi-tensor ops (ops::adam_step_multi_, sum_squares_multi, scale_multi_; Kernels::
// adam_step_multi and siblings, issue 29): in the backend-ops table (every backend against a
// double reference, cuda against the simulator bit for bit when a GPU is there), equal bit for
// bit to the per-tensor ops they replace, their argument checks, and the simulator keeping the
// per-tensor path (has_multi_tensor_kernels false: its launches and virtual time unchanged).
// The CUDA kernels themselves run on the CPU in ctest CudaEmu.Kernels (test_emu_fused.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <vector>

#include "backend_ops_table.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using namespace ditto::test::backend_ops;

// AdamW over three tensors (sizes 7, 4099, 1) at steps 1, 2 and 1 (per-tensor bias
// corrections), the decay on the first two: against torch.optim.AdamW's formula in double.
void multi_adamw_case(OpRun& r) {
  const std::vector<std::int64_t> sizes = {7, 4099, 1};
  const std::vector<int> steps = {1, 2, 1};
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<Tensor> p, g, m, v;
  std::vector<Vec> pw, ps, vw;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::int64_t n = sizes[i];
    const std::vector<float> p0 = r.values(n), g0 = r.values(n), m0 = r.values(n),
                             v0 = r.values(n);
    std::vector<float> va(v0.size());
    for (std::size_t e = 0; e < v0.size(); ++e) va[e] = std::fabs(v0[e]);
    p.push_back(r.upload(p0, {n}));
    g.push_back(r.upload(g0, {n}));
    m.push_back(r.upload(m0, {n}));
    v.push_back(r.upload(va, {n}));
    const bool decay = i < 2;
    const double bc1 = 1 - std::pow(b1, steps[i]), bc2 = 1 - std::pow(b2, steps[i]);
    Vec want(n), scale(n), vv(n);
    for (std::int64_t e = 0; e < n; ++e) {
      double pe = p0[e];
      if (decay) pe *= 1.0 - lr * wd;
      const double me = b1 * m0[e] + (1 - b1) * g0[e];
      vv[e] = b2 * va[e] + (1 - b2) * double(g0[e]) * g0[e];
      const double update = (lr / bc1) * me / (std::sqrt(vv[e]) / std::sqrt(bc2) + eps);
      want[e] = pe - update;
      scale[e] = std::fabs(pe) + std::fabs(update) + std::fabs(p0[e]);
    }
    pw.push_back(want);
    ps.push_back(scale);
    vw.push_back(vv);
  }
  std::vector<ops::AdamStepTensors> list;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    ops::AdamStepTensors t;
    t.param = &p[i];
    t.grad = &g[i];
    t.exp_avg = &m[i];
    t.exp_avg_sq = &v[i];
    t.bias_correction1 = 1 - std::pow(b1, steps[i]);
    t.bias_correction2 = 1 - std::pow(b2, steps[i]);
    if (i < 2) t.decay_scale = static_cast<float>(1.0 - lr * wd);
    list.push_back(t);
  }
  ops::adam_step_multi_(list, lr, b1, b2, eps, 0.0, false);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    r.check(detail::cat("param", i), p[i], pw[i], ps[i], 64 * kU);
    r.check(detail::cat("exp_avg_sq", i), v[i], vw[i], vw[i], 16 * kU);
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

const RegisterOpCases kMultiCases({{"multi_adamw", multi_adamw_case},
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
        Tensor t = Tensor::from_vector(
            random_values(static_cast<std::size_t>(sizes[i]), static_cast<std::uint32_t>(100 + 10 * i + k),
                          k >= 3 ? 0.0f : -1.0f, 1.0f),
            {sizes[i]},
            dev);
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

TEST_F(MultiTensorOpsTest, ArgumentErrorsNameTheEntry) {
  const Device d0("sim", 0), d1("sim", 1);
  Tensor p = Tensor::zeros({4}, DType::f32, d0), g = p.clone(), m = p.clone(), v = p.clone();
  Tensor g_short = Tensor::zeros({3}, DType::f32, d0), p1 = Tensor::zeros({4}, DType::f32, d1);
  ops::AdamStepTensors ok{&p, &g, &m, &v, nullptr, 1.0, 1.0, std::nullopt};
  ops::AdamStepTensors bad = ok;
  bad.grad = &g_short;
  expect_invalid([&] { ops::adam_step_multi_({ok, bad}, 1e-3, 0.9, 0.999, 1e-8, 0, false); },
                 "ops::adam_step_multi_: tensors[1].grad: expected [4]");
  ops::AdamStepTensors other = ok;
  other.param = &p1;
  expect_invalid([&] { ops::adam_step_multi_({ok, other}, 1e-3, 0.9, 0.999, 1e-8, 0, false); },
                 "tensors[1].param: expected a tensor on sim:0");
  expect_invalid([&] { ops::adam_step_multi_({ok}, 1e-3, 0.9, 0.999, 1e-8, 0, true); },
                 "tensors[0].max_exp_avg_sq: expected a tensor, got null");
  expect_invalid([&] { ops::sum_squares_multi({}, Determinism::bitwise); },
                 "ops::sum_squares_multi: xs: expected at least one tensor");
  expect_invalid([&] { ops::sum_squares_multi({&p, &p1}, Determinism::bitwise); },
                 "xs[1]: expected a tensor on sim:0");
  Tensor host = Tensor::zeros({2}, DType::f32, Device::cpu());
  expect_invalid([&] { ops::scale_multi_({&host}, 2.0f); },
                 "ops::scale_multi_: xs[0]: expected a tensor on a device");
}

}  // namespace
}  // namespace ditto
