// The transformer ops' cases of the backend-ops table (tests/test_backend_ops.cpp,
// backend_ops_table.h): each runs on every backend in both modes, against a double reference
// here (and, off the simulator, against the simulator's bits in bitwise mode). Backward
// references are double-precision finite differences of the double forward
// (tests/gpt_ops_reference.h) where no closed form is written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_ops_table.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/random.h"
#include "core/runtime/ops.h"
#include "gpt_ops_reference.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using namespace ditto::test::backend_ops;

/// r.values(n) times `s` (the table's values reach 100; attention and GELU want O(1) inputs).
std::vector<float> scaled(OpRun& r, std::int64_t n, float s) {
  std::vector<float> v = r.values(n);
  for (float& x : v) x *= s;
  return v;
}

Vec filled(std::size_t n, double v) { return Vec(n, v); }

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Token rows N = B * T; K micro-shards of the B samples scaled by T (as a layer passes them).
void embedding_case(OpRun& r, std::int64_t K, bool accumulate) {
  const std::int64_t B = 4, T = 5, C = 7, V = 11, P = 6, N = B * T;
  std::vector<std::int64_t> idx(N);
  for (std::int64_t i = 0; i < N; ++i) idx[i] = (i * i * 5 + 3) % (V - 2);  // repeats, absents
  const std::vector<float> wte = r.values(V * C), wpe = r.values(P * C), dy = r.values(N * C);
  const std::vector<float> prior = r.values(V * C);
  const Tensor tidx = Tensor::from_vector(idx, {B, T}, r.dev);
  Vec fw, fw_scale;
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t c = 0; c < C; ++c) {
      const double a = wte[idx[i] * C + c], b = wpe[(i % T) * C + c];
      fw.push_back(a + b);
      fw_scale.push_back(std::fabs(a + b));
    }
  r.check("embedding", ops::embedding(tidx, r.upload(wte, {V, C}), r.upload(wpe, {P, C})), fw,
          fw_scale, kU);
  Vec bw(V * C, 0.0), bw_scale(V * C, 0.0);
  for (std::int64_t i = 0; i < V * C; ++i)
    if (accumulate) bw[i] = prior[i], bw_scale[i] = std::fabs(prior[i]);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t c = 0; c < C; ++c) {
      bw[idx[i] * C + c] += dy[i * C + c];
      bw_scale[idx[i] * C + c] += std::fabs(dy[i * C + c]);
    }
  std::vector<std::int64_t> bounds = micro_shard_bounds(B, K);
  for (std::int64_t& x : bounds) x *= T;
  Tensor grad = r.upload(prior, {V, C});
  ops::embedding_backward(tidx, r.upload(dy, {B, T, C}), grad, bounds, accumulate);
  r.check("embedding_backward", grad, bw, bw_scale, (N + 2) * kU);
}

void layernorm_case(OpRun& r, bool bias) {
  const std::int64_t N = 9, C = 24;
  const double eps = 1e-5;
  const std::vector<float> x = r.values(N * C), w = r.values(C), b = r.values(C);
  const std::vector<float> dy = r.values(N * C);
  Vec y, y_scale, dx, dx_scale, dxh, dxh_scale;
  for (std::int64_t i = 0; i < N; ++i) {
    const float* xr = &x[i * C];
    double mean = 0, var = 0, mg = 0, mgx = 0, gmax = 0;
    for (std::int64_t c = 0; c < C; ++c) mean += xr[c];
    mean /= C;
    for (std::int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / C + eps);
    for (std::int64_t c = 0; c < C; ++c) {
      const double xh = (xr[c] - mean) * rstd, g = double(dy[i * C + c]) * w[c];
      mg += g / C;
      mgx += g * xh / C;
      gmax = std::max(gmax, std::fabs(g));
      y.push_back(xh * w[c] + (bias ? b[c] : 0.0));
      y_scale.push_back((std::fabs(xh) + 1) * std::fabs(w[c]) + (bias ? std::fabs(b[c]) : 0.0));
      dxh.push_back(dy[i * C + c] * xh);
      dxh_scale.push_back(std::fabs(dy[i * C + c]) * (std::fabs(xh) + 1));
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const double xh = (xr[c] - mean) * rstd, g = double(dy[i * C + c]) * w[c];
      dx.push_back(rstd * (g - mg - xh * mgx));
      dx_scale.push_back(rstd * gmax * (std::fabs(xh) + 1) * 4);
    }
  }
  Tensor mean, rstd, dy_xhat;
  const Tensor tx = r.upload(x, {N, C}), tw = r.upload(w, {C});
  const Tensor ty = ops::layernorm(tx, tw, bias ? r.upload(b, {C}) : Tensor(),
                                   static_cast<float>(eps), mean, rstd);
  const double rtol = (2 * C + 16) * kU;
  r.check("layernorm", ty, y, y_scale, rtol);
  const Tensor tdx = ops::layernorm_backward(r.upload(dy, {N, C}), tx, tw, mean, rstd, dy_xhat);
  r.check("layernorm_backward dx", tdx, dx, dx_scale, rtol);
  r.check("layernorm_backward dy_xhat", dy_xhat, dxh, dxh_scale, rtol);
}

void gelu_case(OpRun& r) {
  const std::int64_t n = 333;
  const std::vector<float> x = scaled(r, n, 0.06f), gy = r.values(n);
  const double k0 = std::sqrt(2.0 / 3.14159265358979323846);
  Vec y, y_scale, gx, gx_scale;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i], inner = k0 * (v + 0.044715 * v * v * v), t = std::tanh(inner);
    const double dinner = k0 * (1 + 3 * 0.044715 * v * v);
    y.push_back(0.5 * v * (1 + t));
    y_scale.push_back(0.5 * std::fabs(v) * (1 + std::fabs(t) + (1 - t * t) * std::fabs(inner)));
    gx.push_back(gy[i] * (0.5 * (1 + t) + 0.5 * v * (1 - t * t) * dinner));
    gx_scale.push_back(std::fabs(gy[i]) * (1 + std::fabs(v) * dinner * (1 + std::fabs(inner))));
  }
  const Tensor tx = r.upload(x, {n});
  r.check("gelu", ops::gelu(tx), y, y_scale, 16 * kU);
  r.check("gelu_backward", ops::gelu_backward(tx, r.upload(gy, {n})), gx, gx_scale, 16 * kU);
}

void attention_case(OpRun& r, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh) {
  const std::int64_t hd = C / nh;
  const std::vector<float> qkv = scaled(r, B * T * 3 * C, 0.02f), dy = r.values(B * T * C);
  const Vec y = gpt_ref::attention(gpt_ref::to_double(qkv), B, T, C, nh);
  const Vec st = gpt_ref::attention_stats(gpt_ref::to_double(qkv), B, T, C, nh);
  // Bound: the scores' error hd u S (S their magnitude) moves the row max by that, att, y and the
  // softmax normaliser relatively by about twice that; the sum and att @ v add T u each.
  double S = 0;
  for (std::int64_t i = 0; i < B * T; ++i)
    for (std::int64_t j = 0; j < B * T; ++j)
      if (i / T == j / T) {
        for (std::int64_t h = 0; h < nh; ++h) {
          double s = 0;
          for (std::int64_t e = 0; e < hd; ++e)
            s += std::fabs(double(qkv[i * 3 * C + h * hd + e]) * qkv[j * 3 * C + C + h * hd + e]);
          S = std::max(S, s / std::sqrt(double(hd)));
        }
      }
  const double vmax = max_abs(gpt_ref::to_double(qkv));
  const double rtol = (2 * hd + 2 * T + 32) * kU;
  Tensor tatt;
  const Tensor tqkv = r.upload(qkv, {B, T, 3 * C});
  r.check("attention y", ops::attention(tqkv, nh, tatt), y, filled(y.size(), vmax * (1 + S)), rtol);
  Vec st_scale;  // {m, sum}: m within (1 + S) absolute, sum relative
  for (std::size_t i = 0; i < st.size(); i += 2) {
    st_scale.push_back(1 + S);
    st_scale.push_back(st[i + 1] * (1 + S));
  }
  r.check("attention stats", tatt, st, st_scale, rtol);
  const Vec dyd = gpt_ref::to_double(dy);
  const Vec fd = gpt_ref::finite_differences(
      [&](const Vec& v) { return gpt_ref::dot(dyd, gpt_ref::attention(v, B, T, C, nh)); },
      gpt_ref::to_double(qkv), 1e-4);
  r.check("attention_backward", ops::attention_backward(r.upload(dy, {B, T, C}), tqkv, tatt, nh),
          fd, filled(fd.size(), max_abs(fd)), 128 * kU);
}

// Exact: the mask is random.cpp's uniform01 >= p, the kept values one rounded product. `stream`:
// a site < 256 (kStreamDropout) or, for GPTs deeper than 85 blocks, a site >= 256
// (kStreamDropoutWide, Note [Dropout masks]).
void dropout_case(OpRun& r, std::uint64_t stream) {
  const std::int64_t n = 37 * 11;
  const float p = 0.2f, scale = 1.0f / (1.0f - p);
  const std::uint64_t seed = 99, base = 12345;
  const std::vector<float> x = r.values(n), gy = r.values(n);
  std::vector<float> y(n), gx(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool kept = uniform01(seed, stream, base + static_cast<std::uint64_t>(i)) >= p;
    y[i] = kept ? x[i] * scale : 0.0f;
    gx[i] = kept ? gy[i] * scale : 0.0f;
  }
  r.check_exact("dropout", ops::dropout(r.upload(x, {n}), p, seed, stream, base), y);
  r.check_exact("dropout_backward", ops::dropout_backward(r.upload(gy, {n}), p, seed, stream, base),
                gx);
}

void add_sum_squares_case(OpRun& r) {
  const std::int64_t n = 3 * 4096 + 5;  // more than one block of sum_squares
  const std::vector<float> a = r.values(n), b = r.values(n);
  Vec sum, sum_scale;
  double sq = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    sum.push_back(double(a[i]) + b[i]);
    sum_scale.push_back(std::fabs(sum.back()));
    sq += double(a[i]) * a[i];
  }
  r.check("add", ops::add(r.upload(a, {n}), r.upload(b, {n})), sum, sum_scale, kU);
  r.check("sum_squares", ops::sum_squares(r.upload(a, {n}), r.mode), {sq}, {sq}, (n + 2) * kU);
}

const RegisterOpCases kGptCases([] {
  std::vector<OpCase> v;
  for (std::int64_t k : {1, 8})
    for (bool acc : {false, true})
      v.push_back({detail::cat("gpt_embedding_K", k, "_acc", acc ? "1" : "0"),
                   [=](OpRun& r) { embedding_case(r, k, acc); }});
  v.push_back({"gpt_layernorm_bias", [](OpRun& r) { layernorm_case(r, true); }});
  v.push_back({"gpt_layernorm_nobias", [](OpRun& r) { layernorm_case(r, false); }});
  v.push_back({"gpt_gelu", gelu_case});
  v.push_back({"gpt_attention_2x7x12h3", [](OpRun& r) { attention_case(r, 2, 7, 12, 3); }});
  v.push_back({"gpt_attention_1x16x16h1", [](OpRun& r) { attention_case(r, 1, 16, 16, 1); }});
  v.push_back(
      {"gpt_dropout", [](OpRun& r) { dropout_case(r, stream_id(kStreamDropout, (2u << 8) | 5)); }});
  v.push_back({"gpt_dropout_wide", [](OpRun& r) {
                 dropout_case(r, stream_id(kStreamDropoutWide, (std::uint64_t(3) << 16) | 258));
               }});
  v.push_back({"gpt_add_sum_squares", add_sum_squares_case});
  return v;
}());

// Every transformer kernel family is in the table.
TEST(BackendOpsTable, CoversEveryGptKernel) {
  for (const char* prefix : {"gpt_embedding", "gpt_layernorm", "gpt_gelu", "gpt_attention",
                             "gpt_dropout", "gpt_add_sum_squares"}) {
    bool found = false;
    for (const OpCase& c : registered_op_cases()) found = found || c.name.rfind(prefix, 0) == 0;
    EXPECT_TRUE(found) << prefix;
  }
}

}  // namespace
}  // namespace ditto
