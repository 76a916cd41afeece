// Double-precision host references of the transformer ops (tests/test_gpt_ops*.cpp,
// test_gpt_attn_dropout.cpp): the formulas of PyTorch's layer_norm, gelu(approximate='tanh') and
// nanoGPT's causal self-attention, written plainly in double, and central finite differences
// over them; and the device those tests run the ops on (kOpsDevice, upload).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/runtime/tensor.h"

namespace ditto::test {

/// The device the transformer-op tests run the ops on.
inline const Device kOpsDevice("sim", 0);

/// Host values `v` as an f32 tensor of shape `s` on `d`.
inline Tensor upload(const std::vector<float>& v, const Shape& s, const Device& d = kOpsDevice) {
  return Tensor::from_vector(v, s, d);
}

}  // namespace ditto::test

namespace ditto::test::gpt_ref {

using Vec = std::vector<double>;

inline Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
inline Vec to_double(const Tensor& t) { return to_double(t.to_vector<float>()); }

/// Central differences d f / d x_i = (f(x + h e_i) - f(x - h e_i)) / (2h) of a double function.
inline Vec finite_differences(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-5) {
  Vec g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

/// sum_i w[i] * y[i]: a scalar loss whose gradient with respect to y is w (the upstream dy).
inline double dot(const Vec& w, const Vec& y) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += w[i] * y[i];
  return s;
}

/// layer_norm over the last dim of a [N, C] x (b may be empty: no bias).
inline Vec layernorm(const Vec& x, const Vec& w, const Vec& b, std::int64_t N, std::int64_t C,
                     double eps) {
  Vec y(x.size());
  for (std::int64_t r = 0; r < N; ++r) {
    const double* xr = &x[static_cast<std::size_t>(r * C)];
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < C; ++c) mean += xr[c];
    mean /= static_cast<double>(C);
    for (std::int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    for (std::int64_t c = 0; c < C; ++c)
      y[static_cast<std::size_t>(r * C + c)] =
          (xr[c] - mean) * rstd * w[static_cast<std::size_t>(c)] +
          (b.empty() ? 0.0 : b[static_cast<std::size_t>(c)]);
  }
  return y;
}

inline double gelu(double x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

/// nanoGPT's causal self-attention on qkv [B, T, 3C]: y [B, T, C] (and att [B, nh, T, T] when
/// `att` is given, the softmax statistics [B, nh, T, 2] = {m, sum} when `stats` is: m the row
/// max of the scaled scores, sum = sum_u exp(s_u - m), what Kernels::attention_forward stores).
inline Vec attention(const Vec& qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                     std::int64_t nh, Vec* att = nullptr, Vec* stats = nullptr) {
  const std::int64_t hd = C / nh, W = 3 * C;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Vec y(static_cast<std::size_t>(B * T * C), 0.0);
  if (att != nullptr) att->assign(static_cast<std::size_t>(B * nh * T * T), 0.0);
  if (stats != nullptr) stats->assign(static_cast<std::size_t>(B * nh * T * 2), 0.0);
  Vec p(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const double* q = &qkv[static_cast<std::size_t>((b * T + t) * W + h * hd)];
        double m = -INFINITY, z = 0;
        for (std::int64_t u = 0; u <= t; ++u) {
          const double* k = &qkv[static_cast<std::size_t>((b * T + u) * W + C + h * hd)];
          double s = 0;
          for (std::int64_t i = 0; i < hd; ++i) s += q[i] * k[i];
          p[static_cast<std::size_t>(u)] = s * scale;
          m = std::max(m, s * scale);
        }
        for (std::int64_t u = 0; u <= t; ++u) z += std::exp(p[static_cast<std::size_t>(u)] - m);
        if (stats != nullptr) {
          const auto i = static_cast<std::size_t>(((b * nh + h) * T + t) * 2);
          (*stats)[i] = m;
          (*stats)[i + 1] = z;
        }
        for (std::int64_t u = 0; u <= t; ++u) {
          const double a = std::exp(p[static_cast<std::size_t>(u)] - m) / z;
          if (att != nullptr) (*att)[static_cast<std::size_t>(((b * nh + h) * T + t) * T + u)] = a;
          const double* v = &qkv[static_cast<std::size_t>((b * T + u) * W + 2 * C + h * hd)];
          for (std::int64_t i = 0; i < hd; ++i)
            y[static_cast<std::size_t>((b * T + t) * C + h * hd + i)] += a * v[i];
        }
      }
  return y;
}

/// The softmax statistics of `attention` per (b, h, t): [B, nh, T, 2] = {m, sum}.
inline Vec attention_stats(const Vec& qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                           std::int64_t nh) {
  Vec st;
  attention(qkv, B, T, C, nh, nullptr, &st);
  return st;
}

}  // namespace ditto::test::gpt_ref
