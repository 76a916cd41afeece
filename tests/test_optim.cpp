// optim::SGD against hand-computed torch.optim.SGD steps (plain, momentum, dampening, Nesterov,
// weight decay), skipping of parameters without grad, zero_grad, and argument errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "core/runtime/backend.h"
#include "core/optim/adam.h"
#include "core/optim/sgd.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class SGDTest : public SimSuite<16> {
 protected:
  static Device dev(int i = 0) { return Device("sim", i); }
  static nn::Parameter param(const std::string& name, std::vector<float> data,
                             const Device& d = dev()) {
    const auto n = static_cast<std::int64_t>(data.size());
    return {name, Tensor::from_vector(data, {n}, d), {}};
  }
};

// torch.optim.SGD for one element with the same float operations (the build has
// -ffp-contract=off, so no fma sneaks in).
struct RefSGD {
  optim::SGDOptions o;
  bool has_buf = false;
  float buf = 0;
  float step(float p, float g) {
    if (o.weight_decay != 0) g = g + o.weight_decay * p;
    if (o.momentum != 0) {
      buf = has_buf ? o.momentum * buf + (1 - o.dampening) * g : g;
      has_buf = true;
      g = o.nesterov ? g + o.momentum * buf : buf;
    }
    return p + -o.lr * g;
  }
};

TEST_F(SGDTest, PlainStepByHand) {
  auto p = param("w", {1.0f, 2.0f, -3.0f});
  p.grad = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}, dev());
  optim::SGD sgd({&p}, {.lr = 0.1f});
  sgd.step();
  auto v = p.data.to_vector<float>();
  EXPECT_FLOAT_EQ(v[0], 0.95f);
  EXPECT_FLOAT_EQ(v[1], 2.1f);
  EXPECT_FLOAT_EQ(v[2], -3.2f);
  EXPECT_FALSE(sgd.momentum_buffer(0).defined());
}

TEST_F(SGDTest, MomentumByHandOverThreeSteps) {
  // p0 = 1, lr 0.1, momentum 0.9, grads 1, 1, 2:
  // buf = 1 -> p = 0.9; buf = 0.9 + 1 = 1.9 -> p = 0.71; buf = 1.71 + 2 = 3.71 -> p = 0.339
  auto p = param("w", {1.0f});
  optim::SGD sgd({&p}, {.lr = 0.1f, .momentum = 0.9f});
  const float grads[] = {1.0f, 1.0f, 2.0f};
  const float expect_p[] = {0.9f, 0.71f, 0.339f};
  const float expect_buf[] = {1.0f, 1.9f, 3.71f};
  for (int s = 0; s < 3; ++s) {
    p.grad = Tensor::full({1}, grads[s], dev());
    sgd.step();
    EXPECT_NEAR(p.data.item(), expect_p[s], 1e-6f) << "step " << s;
    EXPECT_NEAR(sgd.momentum_buffer(0).item(), expect_buf[s], 1e-6f) << "step " << s;
    EXPECT_EQ(sgd.momentum_buffer(0).device(), dev());
  }
}

TEST_F(SGDTest, DampeningAppliesFromTheSecondStep) {
  // momentum 0.5, dampening 0.5, lr 1, grads 2, 2: buf = 2 (no dampening on the first step),
  // p = 10 - 2 = 8; buf = 0.5 * 2 + 0.5 * 2 = 2, p = 6.
  auto p = param("w", {10.0f});
  optim::SGD sgd({&p}, {.lr = 1.0f, .momentum = 0.5f, .dampening = 0.5f});
  p.grad = Tensor::full({1}, 2.0f, dev());
  sgd.step();
  EXPECT_FLOAT_EQ(p.data.item(), 8.0f);
  sgd.step();
  EXPECT_FLOAT_EQ(p.data.item(), 6.0f);
  EXPECT_FLOAT_EQ(sgd.momentum_buffer(0).item(), 2.0f);
}

TEST_F(SGDTest, NesterovByHand) {
  // momentum 0.9, lr 0.1, grad 1 twice: buf = 1, g = 1 + 0.9 = 1.9, p = 1 - 0.19 = 0.81;
  // buf = 0.9 + 1 = 1.9, g = 1 + 1.71 = 2.71, p = 0.81 - 0.271 = 0.539.
  auto p = param("w", {1.0f});
  p.grad = Tensor::full({1}, 1.0f, dev());
  optim::SGD sgd({&p}, {.lr = 0.1f, .momentum = 0.9f, .nesterov = true});
  sgd.step();
  EXPECT_NEAR(p.data.item(), 0.81f, 1e-6f);
  sgd.step();
  EXPECT_NEAR(p.data.item(), 0.539f, 1e-6f);
}

TEST_F(SGDTest, WeightDecayByHand) {
  // wd 0.1, lr 0.5: g = 1 + 0.1 * 2 = 1.2, p = 2 - 0.6 = 1.4.
  auto p = param("w", {2.0f});
  p.grad = Tensor::full({1}, 1.0f, dev());
  optim::SGD sgd({&p}, {.lr = 0.5f, .weight_decay = 0.1f});
  sgd.step();
  EXPECT_NEAR(p.data.item(), 1.4f, 1e-6f);
}

TEST_F(SGDTest, AllOptionsMatchReferenceBitForBit) {
  const optim::SGDOptions configs[] = {
      {.lr = 0.05f, .momentum = 0.9f, .dampening = 0.1f, .weight_decay = 0.01f},
      {.lr = 0.05f, .momentum = 0.8f, .weight_decay = 0.001f, .nesterov = true},
      {.lr = 0.3f}};
  for (const auto& o : configs) {
    std::vector<float> init = {0.5f, -1.25f, 3.0f, 0.0f, 7.5f};
    auto p = param("w", init, dev(3));
    optim::SGD sgd({&p}, o);
    std::vector<RefSGD> ref(init.size(), RefSGD{o});
    std::vector<float> expect = init;
    for (int s = 0; s < 4; ++s) {
      std::vector<float> g(init.size());
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.1f * static_cast<float>(i) - 0.3f * s;
      p.grad = Tensor::from_vector(g, {5}, dev(3));
      sgd.step();
      for (std::size_t i = 0; i < g.size(); ++i) expect[i] = ref[i].step(expect[i], g[i]);
      EXPECT_EQ(p.data.to_vector<float>(), expect) << "step " << s;
    }
  }
}

TEST_F(SGDTest, ParametersWithoutGradAreSkipped) {
  auto a = param("a", {1.0f}), b = param("b", {2.0f}, dev(1));
  b.grad = Tensor::full({1}, 1.0f, dev(1));
  optim::SGD sgd({&a, &b}, {.lr = 1.0f, .momentum = 0.5f});
  sgd.step();
  EXPECT_EQ(a.data.item(), 1.0f);
  EXPECT_FALSE(sgd.momentum_buffer(0).defined());
  EXPECT_EQ(b.data.item(), 1.0f);
  EXPECT_EQ(sgd.momentum_buffer(1).device(), dev(1));
}

TEST_F(SGDTest, ZeroGradInPlaceOrToNone) {
  auto a = param("a", {1.0f, 2.0f});
  a.grad = Tensor::full({2}, 3.0f, dev());
  void* storage = a.grad.data_ptr();
  optim::SGD sgd({&a}, {.lr = 1.0f});
  sgd.zero_grad();
  EXPECT_EQ(a.grad.data_ptr(), storage);
  EXPECT_EQ(a.grad.to_vector<float>(), (std::vector<float>{0.0f, 0.0f}));
  sgd.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(a.grad.defined());
}

TEST_F(SGDTest, InvalidOptions) {
  auto p = param("w", {1.0f});
  expect_invalid([&] { optim::SGD({&p}, {.lr = -0.1f}); },
                 "optim::SGD: lr: Invalid learning rate: -0.1");
  expect_invalid([&] { optim::SGD({&p}, {.lr = 0.1f, .momentum = -1.0f}); },
                 "optim::SGD: momentum: Invalid momentum value: -1");
  expect_invalid([&] { optim::SGD({&p}, {.lr = 0.1f, .weight_decay = -1.0f}); },
                 "optim::SGD: weight_decay: Invalid weight_decay value: -1");
  expect_invalid([&] { optim::SGD({&p}, {.lr = 0.1f, .nesterov = true}); },
                 "Nesterov momentum requires a momentum and zero dampening (got momentum 0");
  expect_invalid(
      [&] {
        optim::SGD({&p}, {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true});
      },
      "Nesterov momentum requires a momentum and zero dampening (got momentum 0.9, dampening 0.1)");
  expect_invalid([&] { optim::SGD({&p}, {.lr = std::nanf("")}); }, "Invalid learning rate: nan");
}

TEST_F(SGDTest, InvalidParameterLists) {
  auto p = param("w", {1.0f});
  nn::Parameter empty{"e", {}, {}};
  expect_invalid([&] { optim::SGD({}, {.lr = 0.1f}); },
                 "optim::SGD: params: expected at least one parameter, got an empty list");
  expect_invalid(
      [&] {
        optim::SGD({&p, nullptr}, {.lr = 0.1f});
      },
      "optim::SGD: params[1]: expected a parameter, got null");
  expect_invalid(
      [&] {
        optim::SGD({&p, &p}, {.lr = 0.1f});
      },
      "optim::SGD: params[1] ('w'): the parameter appears more than once");
  expect_invalid([&] { optim::SGD({&empty}, {.lr = 0.1f}); },
                 "optim::SGD: params[0] ('e'): expected defined f32 data, got an undefined tensor");
}

TEST_F(SGDTest, GradOfWrongShapeIsRejected) {
  auto p = param("w", {1.0f, 2.0f});
  p.grad = Tensor::full({3}, 1.0f, dev());
  optim::SGD sgd({&p}, {.lr = 0.1f});
  expect_invalid([&] { sgd.step(); }, "ops::sgd_step_: grad: expected [2] f32 on sim:0");
}

// ---- Adam ---------------------------------------------------------------------------------------

// torch.optim.Adam (single-tensor path, float32) for one element, written from PyTorch's Python
// source and ATen's CPU kernels: grad.add(param, alpha=wd) is an fma (ufunc::add's vectorised
// body), exp_avg.lerp_(grad, w) an fma on the small- or large-weight side, the rest separate
// float operations. Python floats (double) are rounded to float where they meet a tensor.
// The state of a reference Adam for one element: options, step count, moments in T.
template <typename T>
struct RefAdamState {
  optim::AdamOptions o;
  int step = 0;
  T m = 0, v = 0, vmax = 0;
};

struct RefAdam : RefAdamState<float> {
  float update(float p, float g) {
    ++step;
    double bc1 = 1.0, bc2 = 1.0;
    for (int i = 0; i < step; ++i) bc1 *= o.beta1, bc2 *= o.beta2;
    bc1 = 1.0 - bc1;
    bc2 = 1.0 - bc2;
    if (o.weight_decay != 0) g = std::fma(static_cast<float>(o.weight_decay), p, g);
    const float w = static_cast<float>(1.0 - o.beta1);
    m = std::fabs(w) < 0.5f ? std::fma(w, g - m, m) : std::fma(w - 1.0f, g - m, g);
    v = v * static_cast<float>(o.beta2) + static_cast<float>(1.0 - o.beta2) * g * g;
    float second = v;
    if (o.amsgrad) second = vmax = std::max(vmax, v);
    const float denom =
        std::sqrt(second) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(o.eps);
    return p + static_cast<float>(-(o.lr / bc1)) * m / denom;
  }
};

// The same algorithm in double, to check the float result is Adam and not just self-consistent.
struct RefAdamDouble : RefAdamState<double> {
  double update(double p, double g) {
    ++step;
    g += o.weight_decay * p;
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    vmax = std::max(vmax, v);
    const double vhat = (o.amsgrad ? vmax : v) / (1 - std::pow(o.beta2, step));
    return p - o.lr * m / (1 - std::pow(o.beta1, step)) / (std::sqrt(vhat) + o.eps);
  }
};

TEST_F(SGDTest, AdamFirstStepByHand) {
  // Step 1 without weight decay: m_hat = g and v_hat = g^2, so p moves by lr * g / (|g| + eps).
  auto p = param("w", {1.0f, -2.0f});
  p.grad = Tensor::from_vector(std::vector<float>{0.5f, -4.0f}, {2}, dev());
  optim::Adam adam({&p}, {.lr = 0.1});
  EXPECT_EQ(adam.step_count(0), 0);
  EXPECT_FALSE(adam.exp_avg(0).defined());
  adam.step();
  const auto v = p.data.to_vector<float>();
  EXPECT_NEAR(v[0], 0.9f, 1e-6f);
  EXPECT_NEAR(v[1], -1.9f, 1e-6f);
  EXPECT_EQ(adam.step_count(0), 1);
  EXPECT_NEAR(adam.exp_avg(0).to_vector<float>()[1], -0.4f, 1e-6f);     // (1 - 0.9) * -4
  EXPECT_NEAR(adam.exp_avg_sq(0).to_vector<float>()[1], 0.016f, 1e-7f);  // (1 - 0.999) * 16
  EXPECT_FALSE(adam.max_exp_avg_sq(0).defined());
}

TEST_F(SGDTest, AdamMatchesTorchAlgorithmBitForBit) {
  const optim::AdamOptions configs[] = {
      {},
      {.lr = 0.01, .weight_decay = 0.1},
      {.lr = 0.05, .beta1 = 0.3, .beta2 = 0.9, .eps = 1e-3},  // lerp weight 0.7: the other side
      {.lr = 0.02, .beta2 = 0.99, .weight_decay = 0.01, .amsgrad = true},
      {.lr = 0.1, .beta1 = 0.0, .beta2 = 0.0, .amsgrad = true}};
  for (const auto& o : configs) {
    SCOPED_TRACE(::testing::Message() << "lr=" << o.lr << " betas=(" << o.beta1 << ", "
                                      << o.beta2 << ") eps=" << o.eps
                                      << " wd=" << o.weight_decay << " amsgrad=" << o.amsgrad);
    const std::vector<float> init = {0.5f, -1.25f, 3.0f, 0.0f, 7.5f, -0.003f};
    const auto n = static_cast<std::int64_t>(init.size());
    auto p = param("w", init, dev(5));
    optim::Adam adam({&p}, o);
    std::vector<RefAdam> ref(init.size(), RefAdam{{o}});
    std::vector<RefAdamDouble> ref64(init.size(), RefAdamDouble{{o}});
    std::vector<float> expect = init;
    std::vector<double> expect64(init.begin(), init.end());
    for (int s = 0; s < 6; ++s) {
      // Large gradients first, then small ones of changing sign: amsgrad's maximum matters.
      std::vector<float> g(init.size());
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = (s < 2 ? 3.0f : 0.2f) * (static_cast<float>(i) - 2.5f) * (s % 2 ? -1.0f : 1.0f);
      p.grad = Tensor::from_vector(g, {n}, dev(5));
      adam.step();
      for (std::size_t i = 0; i < g.size(); ++i) {
        expect[i] = ref[i].update(expect[i], g[i]);
        expect64[i] = ref64[i].update(expect64[i], g[i]);
      }
      const std::vector<float> got = p.data.to_vector<float>();
      for (std::size_t i = 0; i < g.size(); ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(expect[i]))
            << "step " << s << " element " << i << ": " << got[i] << " vs " << expect[i];
        ASSERT_NEAR(got[i], expect64[i], 1e-5 * (1 + std::fabs(expect64[i])))
            << "step " << s << " element " << i;
      }
      std::vector<float> m(init.size()), v(init.size());
      for (std::size_t i = 0; i < g.size(); ++i) m[i] = ref[i].m, v[i] = ref[i].v;
      EXPECT_EQ(adam.exp_avg(0).to_vector<float>(), m) << "step " << s;
      EXPECT_EQ(adam.exp_avg_sq(0).to_vector<float>(), v) << "step " << s;
      if (o.amsgrad) {
        for (std::size_t i = 0; i < g.size(); ++i) v[i] = ref[i].vmax;
        EXPECT_EQ(adam.max_exp_avg_sq(0).to_vector<float>(), v) << "step " << s;
      }
      EXPECT_EQ(adam.step_count(0), s + 1);
      EXPECT_EQ(adam.exp_avg(0).device(), dev(5));
    }
  }
}

TEST_F(SGDTest, AdamSkipsParametersWithoutGradAndCountsStepsPerParameter) {
  auto a = param("a", {1.0f}), b = param("b", {2.0f}, dev(1));
  b.grad = Tensor::full({1}, 1.0f, dev(1));
  optim::Adam adam({&a, &b}, {.lr = 0.5});
  adam.step();
  adam.step();
  EXPECT_EQ(a.data.item(), 1.0f);
  EXPECT_EQ(adam.step_count(0), 0);
  EXPECT_FALSE(adam.exp_avg(0).defined());
  EXPECT_EQ(adam.step_count(1), 2);
  EXPECT_EQ(adam.exp_avg_sq(1).device(), dev(1));
  // a's first step uses bias corrections of step 1, not of the optimizer's third step.
  a.grad = Tensor::full({1}, -2.0f, dev());
  adam.step();
  EXPECT_EQ(adam.step_count(0), 1);
  EXPECT_NEAR(a.data.item(), 1.5f, 1e-6f);
}

TEST_F(SGDTest, AdamInvalidOptions) {
  auto p = param("w", {1.0f});
  expect_invalid([&] { optim::Adam({&p}, {.lr = -0.1}); },
                 "optim::Adam: lr: Invalid learning rate: -0.1");
  expect_invalid([&] { optim::Adam({&p}, {.eps = -1.0}); },
                 "optim::Adam: eps: Invalid epsilon value: -1");
  expect_invalid([&] { optim::Adam({&p}, {.beta1 = 1.5}); },
                 "optim::Adam: beta1: Invalid beta parameter at index 0: 1.5");
  expect_invalid([&] { optim::Adam({&p}, {.beta1 = -0.1}); },
                 "Invalid beta parameter at index 0: -0.1");
  expect_invalid([&] { optim::Adam({&p}, {.beta2 = 1.0}); },
                 "optim::Adam: beta2: Invalid beta parameter at index 1: 1");
  expect_invalid([&] { optim::Adam({&p}, {.weight_decay = -0.5}); },
                 "optim::Adam: weight_decay: Invalid weight_decay value: -0.5");
  expect_invalid([&] { optim::Adam({&p}, {.lr = std::nan("")}); }, "Invalid learning rate: nan");
  expect_invalid([&] { optim::Adam({&p}, {.beta2 = std::nan("")}); },
                 "Invalid beta parameter at index 1: nan");
  expect_invalid([&] { optim::Adam({}, {}); },
                 "optim::Adam: params: expected at least one parameter, got an empty list");
}

TEST_F(SGDTest, AdamGradOfWrongShapeIsRejectedWithoutTouchingState) {
  auto p = param("w", {1.0f, 2.0f});
  p.grad = Tensor::full({3}, 1.0f, dev());
  optim::Adam adam({&p});
  expect_invalid([&] { adam.step(); },
                 "optim::Adam: params[0] ('w'): grad: expected [2] f32 on sim:0");
  EXPECT_EQ(adam.step_count(0), 0);
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
}

}  // namespace
}  // namespace ditto
