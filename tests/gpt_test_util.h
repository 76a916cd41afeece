// Shared helpers of the GPT layer and model tests (tests/test_gpt_layers.cpp,
// tests/test_gpt_model.cpp): seeded host values and the finite-difference gradient check.
//
// Gradient check method: for a module m and input x, the scalar L = sum_i m(x)_i * R_i with fixed
// random R in [-1, 1), accumulated in double on the host from m's f32 outputs. The analytic
// gradient is m.backward(R); the numerical one is the central difference
// (L(theta + eps) - L(theta - eps)) / (2 eps) for the element of largest analytic magnitude and
// a few seeded others of every parameter (and of x when it is f32). The forward runs in f32, so
// eps is large-ish (1e-2 on values of order 1): the rounding noise of L is about 1e-6 relative,
// i.e. ~1e-4 absolute on the difference quotient, and the truncation error eps^2 f'''/6 is of the
// same order. A point passes when |numerical - analytic| <= atol + rtol * |analytic| with atol =
// 1e-3 * (1 + the tensor's largest |analytic|) and rtol = 2e-2; a wrong formula (a missing term
// or factor, a transposed index, a wrong mask) is off by far more than 2%.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "core/numerics/random.h"
#include "core/runtime/tensor.h"

namespace ditto::test {

/// n seeded values in [lo, hi) (Philox, synthetic stream `sub`, seed 7).
inline std::vector<float> seeded(std::int64_t n, std::uint64_t sub, float lo = -1.0f,
                                 float hi = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(7, stream_id(kStreamSynthetic, sub), i, lo, hi);
  return v;
}

/// n seeded token ids in [0, vocab).
inline std::vector<std::int64_t> seeded_ids(std::int64_t n, std::int64_t vocab, std::uint64_t sub) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = philox_u32(7, stream_id(kStreamSynthetic, sub), i) % static_cast<std::uint32_t>(vocab);
  return v;
}

struct GradTolerance {
  double eps = 1e-2;   ///< central-difference step
  double rtol = 2e-2;  ///< relative part of the bound
  double atol = 1e-3;  ///< absolute part, times (1 + the tensor's largest |analytic|)
  int points = 4;      ///< elements checked per tensor (the largest and seeded others)
};

/// Sets element i of t (any device, f32) to v.
inline void set_element(const Tensor& t, std::int64_t i, float v) {
  Tensor one = t.view({-1}).narrow(i, 1);
  one.copy_(Tensor::from_vector(std::vector<float>{v}, {1}));
}

/// The gradient check of the header comment for module m at input x (a host or device tensor;
/// an f32 x is checked too when m.input_requires_grad()). m is left with its parameters as
/// they were and the gradients of the last backward in its grads (zeroed first).
inline void gradcheck(nn::Module& m, const Tensor& x, const std::string& what,
                      const GradTolerance& tol = {}) {
  const Device dev = m.device();
  Tensor xd = x.to(dev.is_cpu() ? x.device() : dev);
  m.zero_grad();
  const Tensor out = m.forward(xd);
  const std::vector<float> r = seeded(out.numel(), 900);
  const Tensor rt = Tensor::from_vector(r, out.shape(), out.device());
  const Tensor gx = m.backward(rt);
  auto loss = [&]() {
    const std::vector<float> y = m.forward(xd).to_vector<float>();
    double s = 0.0;
    for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
    return s;
  };
  auto check_tensor = [&](const std::string& name, const Tensor& data,
                          const std::vector<float>& ana) {
    std::vector<float> host = data.to_vector<float>();
    const auto n = static_cast<std::int64_t>(host.size());
    ASSERT_EQ(static_cast<std::int64_t>(ana.size()), n) << what << " " << name;
    std::int64_t imax = 0;
    double amax = 0.0;
    for (std::int64_t i = 0; i < n; ++i)
      if (std::abs(ana[static_cast<std::size_t>(i)]) > amax) {
        amax = std::abs(ana[static_cast<std::size_t>(i)]);
        imax = i;
      }
    std::vector<std::int64_t> points{imax};
    for (int k = 1; k < tol.points && k < n; ++k)
      points.push_back(philox_u32(11, stream_id(kStreamSynthetic, 901), points.size() + n) % n);
    for (std::int64_t i : points) {
      const float orig = host[static_cast<std::size_t>(i)];
      set_element(data, i, static_cast<float>(orig + tol.eps));
      const double lp = loss();
      set_element(data, i, static_cast<float>(orig - tol.eps));
      const double lm = loss();
      set_element(data, i, orig);
      const double num = (lp - lm) / (2.0 * tol.eps);
      const double a = ana[static_cast<std::size_t>(i)];
      EXPECT_LE(std::abs(num - a), tol.atol * (1.0 + amax) + tol.rtol * std::abs(a))
          << what << ": d/d " << name << "[" << i << "]: analytic " << a << ", numerical " << num;
    }
  };
  for (nn::Parameter* p : m.parameters()) {
    ASSERT_TRUE(p->grad.defined()) << what << ": no gradient for " << p->name;
    check_tensor(p->name, p->data, p->grad.to_vector<float>());
  }
  if (xd.dtype() == DType::f32 && m.input_requires_grad()) {
    ASSERT_TRUE(gx.defined()) << what << ": no input gradient";
    Tensor xc = xd.clone();  // perturbed in place, the caller's x untouched
    xd = xc;
    check_tensor("input", xc, gx.to_vector<float>());
  }
}

}  // namespace ditto::test
