// The transformer ops (ops::embedding .. ops::sum_squares, core/runtime/ops.h) on the simulator:
// each forward against a double-precision host reference (tests/gpt_ops_reference.h), each
// backward against double-precision central finite differences of that reference (issue 12's
// gradient check of every new layer, at the op level), and the argument errors. Bits (micro-shard
// invariance, dropout masks, sim against gpt_math.h, Philox) are in test_gpt_ops_bits.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"
#include "gpt_ops_reference.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using gpt_ref::to_double;
using gpt_ref::Vec;

using GptOps = SimSuite<8>;

/// Every |got - want| <= atol + rtol * |want|; the first violation is reported.
::testing::AssertionResult all_close(const Vec& got, const Vec& want, double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i] << " (rtol " << rtol
             << ", atol " << atol << ")";
  return ::testing::AssertionSuccess();
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

/// A gradient computed in float against finite differences of the double reference: within
/// 1e-5 relative plus 1e-6 of the largest entry (a wrong formula is off by far more).
::testing::AssertionResult grad_close(const Vec& got, const Vec& fd) {
  return all_close(got, fd, 1e-5, 1e-6 * max_abs(fd) + 1e-7);
}

// ---- embedding ----------------------------------------------------------------------------------

TEST_F(GptOps, EmbeddingForwardIsTheRowSum) {
  const std::int64_t B = 3, T = 5, C = 7, V = 11, P = 8;
  std::vector<std::int64_t> idx(B * T);
  for (std::int64_t i = 0; i < B * T; ++i) idx[i] = (i * 7 + 3) % V;
  const std::vector<float> wte = random_values(V * C, 1), wpe = random_values(P * C, 2);
  const Tensor tidx = Tensor::from_vector(idx, {B, T}, kOpsDevice);
  const Tensor out = ops::embedding(tidx, upload(wte, {V, C}), upload(wpe, {P, C}));
  ASSERT_EQ(out.shape(), (Shape{B, T, C}));
  const std::vector<float> got = out.to_vector<float>();
  const Tensor no_pos = ops::embedding(tidx, upload(wte, {V, C}), Tensor());
  const std::vector<float> got_np = no_pos.to_vector<float>();
  for (std::int64_t r = 0; r < B * T; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      // One correctly rounded add: float(double(a) + double(b)) exactly.
      const float want = static_cast<float>(double(wte[idx[r] * C + c]) + wpe[(r % T) * C + c]);
      ASSERT_EQ(bits(got[r * C + c]), bits(want)) << r << ", " << c;
      ASSERT_EQ(bits(got_np[r * C + c]), bits(wte[idx[r] * C + c]));
    }
}

TEST_F(GptOps, EmbeddingBackwardMatchesFiniteDifferences) {
  const std::int64_t B = 2, T = 6, C = 5, V = 7;
  std::vector<std::int64_t> idx(B * T);
  for (std::int64_t i = 0; i < B * T; ++i) idx[i] = (i * i + 1) % V;  // repeats, some ids absent
  const std::vector<float> wte = random_values(V * C, 3), dy = random_values(B * T * C, 4);
  const Vec dyd = to_double(dy);
  auto loss = [&](const Vec& w) {
    double s = 0;
    for (std::int64_t r = 0; r < B * T; ++r)
      for (std::int64_t c = 0; c < C; ++c) s += dyd[r * C + c] * w[idx[r] * C + c];
    return s;
  };
  const Vec fd = gpt_ref::finite_differences(loss, to_double(wte));
  const Tensor tidx = Tensor::from_vector(idx, {B, T}, kOpsDevice);
  Tensor grad = Tensor::full({V, C}, 123.0f, kOpsDevice);  // overwritten: accumulate = false
  ops::embedding_backward(tidx, upload(dy, {B, T, C}), grad, micro_shard_bounds(B * T, 4), false);
  EXPECT_TRUE(grad_close(to_double(grad), fd));
  // accumulate adds to what is there; the flat [N] / [N, C] form gives the same.
  Tensor acc = Tensor::full({V, C}, 0.5f, kOpsDevice);
  ops::embedding_backward(tidx.view({B * T}), upload(dy, {B * T, C}), acc, {0, B * T}, true);
  Vec want = fd;
  for (double& x : want) x += 0.5;
  EXPECT_TRUE(grad_close(to_double(acc), want));
}

// ---- LayerNorm ----------------------------------------------------------------------------------

TEST_F(GptOps, LayerNormForwardMatchesTheReference) {
  const std::int64_t N = 6, C = 10;
  const float eps = 1e-5f;
  std::vector<float> x = random_values(N * C, 5, -3, 3);
  for (std::int64_t c = 0; c < C; ++c) x[c] = 100.0f + 0.01f * c;  // a row with a large mean
  const std::vector<float> w = random_values(C, 6, 0.5, 1.5), b = random_values(C, 7);
  for (bool bias : {true, false}) {
    Tensor mean, rstd;
    const Tensor y = ops::layernorm(upload(x, {2, 3, C}), upload(w, {C}),
                                    bias ? upload(b, {C}) : Tensor(), eps, mean, rstd);
    ASSERT_EQ(y.shape(), (Shape{2, 3, C}));
    ASSERT_EQ(mean.shape(), (Shape{N}));
    const Vec want =
        gpt_ref::layernorm(to_double(x), to_double(w), bias ? to_double(b) : Vec{}, N, C, eps);
    // Float's own error: the mean is off by ~C u |mean|, which xhat sees times rstd (large for
    // the first row: |mean| / std ~ 3500); the rest is a few roundings of xhat * w + b.
    const std::vector<float> m = mean.to_vector<float>(), rs = rstd.to_vector<float>();
    const Vec yd = to_double(y);
    for (std::int64_t r = 0; r < N; ++r)
      for (std::int64_t c = 0; c < C; ++c) {
        const double tol = (2 * C + 8) * 0x1p-24 * (1 + std::fabs(m[r]) * rs[r]) * w[c] +
                           (bias ? 4 * 0x1p-24 * std::fabs(b[c]) : 0.0);
        ASSERT_NEAR(yd[r * C + c], want[r * C + c], tol) << r << ", " << c << " bias " << bias;
      }
    EXPECT_NEAR(m[0], 100.045, 1e-4);
    EXPECT_NEAR(rs[0], 1 / std::sqrt(0.000825 + 1e-5), 1e-2);  // var of 100 + 0.01 c
  }
}

TEST_F(GptOps, LayerNormBackwardMatchesFiniteDifferences) {
  const std::int64_t N = 4, C = 9;
  const double eps = 1e-5;
  const std::vector<float> x = random_values(N * C, 8, -2, 2), w = random_values(C, 9, 0.5, 1.5);
  const std::vector<float> b = random_values(C, 10), dy = random_values(N * C, 11);
  const Vec xd = to_double(x), wd = to_double(w), bd = to_double(b), dyd = to_double(dy);
  const Vec fd_x = gpt_ref::finite_differences(
      [&](const Vec& v) { return gpt_ref::dot(dyd, gpt_ref::layernorm(v, wd, bd, N, C, eps)); },
      xd);
  const Vec fd_w = gpt_ref::finite_differences(
      [&](const Vec& v) { return gpt_ref::dot(dyd, gpt_ref::layernorm(xd, v, bd, N, C, eps)); },
      wd);
  Tensor mean, rstd, dy_xhat;
  const Tensor tx = upload(x, {N, C}), tw = upload(w, {C});
  ops::layernorm(tx, tw, upload(b, {C}), static_cast<float>(eps), mean, rstd);
  const Tensor dx = ops::layernorm_backward(upload(dy, {N, C}), tx, tw, mean, rstd, dy_xhat);
  EXPECT_TRUE(grad_close(to_double(dx), fd_x));
  // grad_w is the row sum of dy_xhat.
  const Vec dxh = to_double(dy_xhat);
  Vec gw(C, 0.0);
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t c = 0; c < C; ++c) gw[c] += dxh[r * C + c];
  EXPECT_TRUE(grad_close(gw, fd_w));
}

// ---- GELU ---------------------------------------------------------------------------------------

TEST_F(GptOps, GeluMatchesTheReferenceAndFiniteDifferences) {
  std::vector<float> x = random_values(200, 12, -6, 6);
  for (float v : {0.0f, -0.0f, 1e-8f, -1e-3f, 10.0f, -10.0f, 20.0f, -20.0f}) x.push_back(v);
  const auto n = static_cast<std::int64_t>(x.size());
  const std::vector<float> gy = random_values(x.size(), 13);
  const Tensor tx = upload(x, {n});
  const Vec y = to_double(ops::gelu(tx));
  const Vec gx = to_double(ops::gelu_backward(tx, upload(gy, {n})));
  for (std::int64_t i = 0; i < n; ++i) {
    const double xi = x[i], want = gpt_ref::gelu(xi);
    // 0.5 x (1 + t) in float: t's few ulp show fully where 1 + t cancels (x << 0), as in torch.
    const double k0 = std::sqrt(2 / 3.14159265358979323846);
    const double t = std::tanh(k0 * (xi + 0.044715 * xi * xi * xi));
    EXPECT_NEAR(y[i], want, 0.5 * std::fabs(xi) * (1 + std::fabs(t)) * 8 * 0x1p-24 + 1e-30)
        << "x = " << xi;
    const double h = 1e-5;
    const double fd = gy[i] * (gpt_ref::gelu(xi + h) - gpt_ref::gelu(xi - h)) / (2 * h);
    EXPECT_NEAR(gx[i], fd, 1e-5 * std::fabs(fd) + 1e-6) << "x = " << xi;
  }
}

// ---- attention ----------------------------------------------------------------------------------

struct AttnShape {
  std::int64_t B, T, C, nh;
};

TEST_F(GptOps, AttentionForwardMatchesTheReference) {
  for (AttnShape s : {AttnShape{2, 5, 12, 3}, AttnShape{1, 1, 4, 1}, AttnShape{3, 9, 8, 2}}) {
    const std::vector<float> qkv = random_values(s.B * s.T * 3 * s.C, 14, -2, 2);
    Tensor att;
    const Tensor y = ops::attention(upload(qkv, {s.B, s.T, 3 * s.C}), s.nh, att);
    ASSERT_EQ(y.shape(), (Shape{s.B, s.T, s.C}));
    // att is not stored: the softmax stats {max, normaliser} per query are (f32).
    ASSERT_EQ(att.shape(), (Shape{s.B, s.nh, s.T, 2}));
    ASSERT_EQ(att.dtype(), DType::f32);
    const Vec y_ref = gpt_ref::attention(to_double(qkv), s.B, s.T, s.C, s.nh);
    EXPECT_TRUE(all_close(to_double(y), y_ref, 1e-5, 1e-6)) << "T = " << s.T;
    const Vec st_ref = gpt_ref::attention_stats(to_double(qkv), s.B, s.T, s.C, s.nh);
    EXPECT_TRUE(all_close(to_double(att), st_ref, 1e-5, 1e-6)) << "T = " << s.T;
  }
}

TEST_F(GptOps, AttentionBackwardMatchesFiniteDifferences) {
  const AttnShape s{2, 6, 8, 2};
  const std::vector<float> qkv = random_values(s.B * s.T * 3 * s.C, 15, -1.5, 1.5);
  const std::vector<float> dy = random_values(s.B * s.T * s.C, 16);
  const Vec dyd = to_double(dy);
  const Vec fd = gpt_ref::finite_differences(
      [&](const Vec& v) { return gpt_ref::dot(dyd, gpt_ref::attention(v, s.B, s.T, s.C, s.nh)); },
      to_double(qkv));
  const Tensor tqkv = upload(qkv, {s.B, s.T, 3 * s.C});
  Tensor att;
  ops::attention(tqkv, s.nh, att);
  const Tensor dqkv = ops::attention_backward(upload(dy, {s.B, s.T, s.C}), tqkv, att, s.nh);
  ASSERT_EQ(dqkv.shape(), tqkv.shape());
  EXPECT_TRUE(grad_close(to_double(dqkv), fd));
}

// ---- dropout, add, sum_squares ------------------------------------------------------------------

TEST_F(GptOps, DropoutIsInvertedAndBackwardUsesTheSameMask) {
  const std::int64_t n = 1 << 16;
  const float p = 0.3f;
  const std::vector<float> x = random_values(n, 17, 0.5, 1.5), gy = random_values(n, 18, 0.5, 1);
  const std::uint64_t stream = stream_id(kStreamDropout, (5u << 8) | 2);
  const std::vector<float> y = ops::dropout(upload(x, {n}), p, 42, stream, 1000).to_vector<float>();
  const std::vector<float> gx =
      ops::dropout_backward(upload(gy, {n}), p, 42, stream, 1000).to_vector<float>();
  const float scale = 1.0f / (1.0f - p);
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool k = y[i] != 0.0f;
    kept += k;
    ASSERT_EQ(bits(y[i]), bits(k ? x[i] * scale : 0.0f)) << i;
    ASSERT_EQ(bits(gx[i]), bits(k ? gy[i] * scale : 0.0f)) << i;  // the same mask
  }
  // Binomial(n, 1 - p): within 5 standard deviations (sd ~ 117).
  const double sd = std::sqrt(n * p * (1.0 - p));
  EXPECT_NEAR(static_cast<double>(kept), n * (1.0 - p), 5 * sd);
  // p == 0 is the identity: the same tensor back.
  const Tensor tx = upload(x, {n});
  EXPECT_EQ(ops::dropout(tx, 0.0f, 1, stream, 0).data<float>(), tx.data<float>());
  EXPECT_EQ(ops::dropout_backward(tx, 0.0f, 1, stream, 0).data<float>(), tx.data<float>());
}

TEST_F(GptOps, AddIsOneRoundedAdd) {
  const std::vector<float> a = mixed_values(333, 19), b = mixed_values(333, 20);
  const std::vector<float> c =
      ops::add(upload(a, {3, 111}), upload(b, {3, 111})).to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(bits(c[i]), bits(static_cast<float>(double(a[i]) + double(b[i])))) << i;
}

TEST_F(GptOps, SumSquaresMatchesTheReferenceInBothModes) {
  for (std::int64_t n : {0, 1, 4095, 4096, 4097, 3 * 4096 + 17}) {
    const std::vector<float> x = mixed_values(static_cast<std::size_t>(n), 21);
    double s = 0;
    for (float v : x) s += double(v) * v;
    for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
      const Tensor out = ops::sum_squares(upload(x, {n}), mode);
      ASSERT_EQ(out.dim(), 0);
      EXPECT_NEAR(out.item(), s, (n + 2) * 0x1p-24 * s) << n << " " << determinism_name(mode);
    }
  }
}

// ---- argument errors ----------------------------------------------------------------------------

TEST_F(GptOps, BadArgumentsAreRefusedWithClearMessages) {
  const Tensor idx = Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 9}, {2, 2}, kOpsDevice);
  const Tensor wte = Tensor::zeros({5, 4}, DType::f32, kOpsDevice);
  const Tensor wpe = Tensor::zeros({2, 4}, DType::f32, kOpsDevice);
  expect_invalid([&] { ops::embedding(idx, wte, wpe); },
                 "ops::embedding: idx[1, 1] = 9 out of range [0, 5)");
  const Tensor ok_idx =
      Tensor::from_vector(std::vector<std::int64_t>{0, 1, 2, 3, 4, 0}, {2, 3}, kOpsDevice);
  expect_invalid([&] { ops::embedding(ok_idx, wte, wpe); }, "P >= T = 3");
  expect_invalid([&] { ops::embedding(ok_idx, wte.view({20}), wpe); }, "wte: expected a 2-dim");
  expect_invalid([&] { ops::embedding(wte, wte, wpe); }, "idx: expected dtype i64");
  expect_invalid([&] { ops::embedding(ok_idx.to(Device::cpu()), wte, wpe); },
                 "idx: expected a tensor on a device");
  Tensor grad = Tensor::zeros({5, 4}, DType::f32, kOpsDevice);
  const Tensor dy = Tensor::zeros({2, 3, 4}, DType::f32, kOpsDevice);
  expect_invalid(
      [&] {
        ops::embedding_backward(ok_idx, dy, grad, {0, 5}, false);
      },
      "ops::embedding_backward: bounds: expected the last entry to equal rows = 6");
  expect_invalid(
      [&] {
        ops::embedding_backward(ok_idx, dy.view({6, 4}), grad, {0, 6}, false);
      },
      "dy: expected idx's shape [2, 3]");
  Tensor narrow_grad = Tensor::zeros({5, 3}, DType::f32, kOpsDevice);
  expect_invalid(
      [&] {
        ops::embedding_backward(ok_idx, dy, narrow_grad, {0, 6}, false);
      },
      "grad_wte: expected [V, C] with C = 4");
  Tensor small_grad = Tensor::zeros({4, 4}, DType::f32, kOpsDevice);
  expect_invalid(
      [&] {
        ops::embedding_backward(ok_idx, dy, small_grad, {0, 6}, false);
      },
      "idx[1, 1] = 4 out of range [0, 4)");

  Tensor mean, rstd, dxh;
  const Tensor x = Tensor::zeros({3, 4}, DType::f32, kOpsDevice),
               w = Tensor::full({4}, 1.0f, kOpsDevice);
  const Tensor w3 = Tensor::full({3}, 1.0f, kOpsDevice);
  expect_invalid([&] { ops::layernorm(x, w3, Tensor(), 1e-5f, mean, rstd); },
                 "ops::layernorm: w: expected [C] = [4]");
  expect_invalid(
      [&] { ops::layernorm(x, w, Tensor::full({5}, 0.0f, kOpsDevice), 1e-5f, mean, rstd); },
      "b: expected [C] = [4]");
  expect_invalid([&] { ops::layernorm(x, w, Tensor(), -1.0f, mean, rstd); }, "eps: expected");
  ops::layernorm(x, w, Tensor(), 1e-5f, mean, rstd);
  expect_invalid(
      [&] {
        ops::layernorm_backward(x, x, w, rstd.view({1, 3}), rstd, dxh);
      },
      "mean: expected [rows] = [3]");
  expect_invalid(
      [&] {
        ops::layernorm_backward(x.view({4, 3}), x, w, mean, rstd, dxh);
      },
      "x: expected [4, 3] (the shape of dy)");
  expect_invalid([&] { ops::gelu_backward(x, w); }, "ops::gelu_backward: grad_y: expected [3, 4]");

  Tensor att;
  const Tensor qkv = Tensor::zeros({2, 3, 12}, DType::f32, kOpsDevice);
  expect_invalid([&] { ops::attention(qkv, 3, att); },
                 "ops::attention: n_head: expected a divisor of C = 4");
  expect_invalid([&] { ops::attention(qkv, 0, att); }, "n_head: expected n_head >= 1, got 0");
  expect_invalid(
      [&] {
        ops::attention(Tensor::zeros({2, 3, 10}, DType::f32, kOpsDevice), 1, att);
      },
      "a multiple of 3");
  expect_invalid([&] { ops::attention(qkv.view({6, 12}), 2, att); }, "qkv: expected a 3-dim");
  ops::attention(qkv, 2, att);
  const Tensor y_grad = Tensor::zeros({2, 3, 4}, DType::f32, kOpsDevice);
  expect_invalid(
      [&] {
        ops::attention_backward(y_grad, qkv, att.view({2, 2, 6}), 2);
      },
      "stats: expected [B, n_head, T, 2] = [2, 2, 3, 2]");
  expect_invalid([&] { ops::attention_backward(y_grad, qkv, att.to(DType::bf16), 2); },
                 "ops::attention_backward: stats: expected");
  expect_invalid([&] { ops::attention_backward(qkv, qkv, att, 2); },
                 "dy: expected [B, T, C] = [2, 3, 4]");

  for (float p : {1.0f, -0.1f, 1.5f, std::nanf("")})
    expect_invalid([&] { ops::dropout(x, p, 0, 0, 0); },
                   "ops::dropout: p: expected a drop probability in [0, 1)");
  expect_invalid([&] { ops::dropout_backward(x, 1.0f, 0, 0, 0); }, "ops::dropout_backward: p");
  expect_invalid([&] { ops::add(x, x.view({4, 3})); }, "ops::add: b: expected [3, 4]");
  expect_invalid([&] { ops::sum_squares(ok_idx, Determinism::bitwise); },
                 "ops::sum_squares: x: expected dtype f32");
}

}  // namespace
}  // namespace ditto
