// The backend-ops suite (after ggml's tests/test-backend-ops.cpp): one table of op cases, each
// with its shapes and its inputs drawn from a seed, covering every Kernels method
// (core/runtime/backend.h) through the tensor ops of core/runtime/ops.h and the copies between
// devices, run over every registered backend that runs kernels, in both determinism modes. Each
// (case, backend, mode) is its own ctest:
//   - the simulator, the reference backend, against a double-precision reference computed here
//     from the same inputs, within an error bound per output (n * u * the sum of the magnitudes
//     of the terms for a reduction of n terms; a few ulp for elementwise and transcendental ops;
//     0 for ops that are exact);
//   - any other backend against the simulator: the same bits in bitwise mode (the determinism
//     contract, DESIGN.md), and within twice that error bound in fast mode (both are within it of
//     the exact value); and against the double reference too.
// A backend that cannot start here (cuda without a GPU) reports SKIPPED with the reason. "cpu"
// holds host tensors but runs no kernels (Backend::kernels throws), so it has no cases.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend_ops_table.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using namespace ditto::test::backend_ops;

// ---- the cases --------------------------------------------------------------------------------

// C = alpha op(A) op(B) + beta C (odd shapes, each transpose), and beta = 0 over a C of NaNs
// (beta == 0 ignores C's contents).
void gemm_case(OpRun& r, std::int64_t M, std::int64_t N, std::int64_t K, bool ta, bool tb) {
  const std::vector<float> a = r.values(M * K), b = r.values(K * N), c = r.values(M * N);
  const float alpha = 1.5f, beta = -0.25f;
  Vec want(c.size()), scale(c.size()), prod(c.size()), prod_scale(c.size());
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double s = 0, m = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double x = a[ta ? k * M + i : i * K + k], y = b[tb ? j * K + k : k * N + j];
        s += x * y;
        m += std::fabs(x * y);
      }
      const std::size_t e = static_cast<std::size_t>(i * N + j);
      want[e] = alpha * s + beta * double(c[e]);
      scale[e] = alpha * m + std::fabs(beta * double(c[e]));
      prod[e] = s;
      prod_scale[e] = m;
    }
  const Tensor ta_ = r.upload(a, ta ? Shape{K, M} : Shape{M, K});
  const Tensor tb_ = r.upload(b, tb ? Shape{N, K} : Shape{K, N});
  Tensor tc = r.upload(c, {M, N});
  ops::gemm(ta_, tb_, tc, ta, tb, alpha, beta, r.mode);
  const double rtol = static_cast<double>(K + 2) * kU;
  r.check("gemm", tc, want, scale, rtol);
  Tensor nan = Tensor::full({M, N}, std::nanf(""), r.dev);
  ops::gemm(ta_, tb_, nan, ta, tb, 1.0f, 0.0f, r.mode);
  r.check("gemm beta=0 over NaN", nan, prod, prod_scale, rtol);
  r.check("matmul", ops::matmul(ta_, tb_, ta, tb, r.mode), prod, prod_scale, rtol);
}

constexpr std::int64_t kRows = 37, kCols = 11;

void add_bias_case(OpRun& r) {
  const std::vector<float> y = r.values(kRows * kCols), bias = r.values(kCols);
  Vec want, scale;
  for (std::size_t e = 0; e < y.size(); ++e) {
    want.push_back(double(y[e]) + bias[e % kCols]);
    scale.push_back(std::fabs(want.back()));
  }
  Tensor t = r.upload(y, {kRows, kCols});
  ops::add_bias_(t, r.upload(bias, {kCols}));
  r.check("add_bias_", t, want, scale, kU);
}

void sum_rows_case(OpRun& r, float beta) {
  const std::vector<float> x = r.values(kRows * kCols), out = r.values(kCols);
  Vec want(kCols), scale(kCols);
  for (std::int64_t c = 0; c < kCols; ++c) {
    want[c] = beta * double(out[c]);
    scale[c] = std::fabs(want[c]);
    for (std::int64_t row = 0; row < kRows; ++row) {
      want[c] += x[row * kCols + c];
      scale[c] += std::fabs(x[row * kCols + c]);
    }
  }
  Tensor t = r.upload(out, {kCols});
  ops::sum_rows(r.upload(x, {kRows, kCols}), t, beta, r.mode);
  r.check("sum_rows", t, want, scale, (kRows + 2) * kU);
  if (beta == 0.0f) {  // out is not read (nn's new bias gradients are not zeroed first)
    Tensor nan = Tensor::full({kCols}, std::nanf(""), r.dev);
    ops::sum_rows(r.upload(x, {kRows, kCols}), nan, 0.0f, r.mode);
    r.check("sum_rows beta=0 over NaN", nan, want, scale, (kRows + 2) * kU);
  }
}

void relu_case(OpRun& r) {
  const std::vector<float> x = r.values(kRows * kCols), gy = r.values(kRows * kCols);
  std::vector<float> y(x.size()), gx(x.size());
  for (std::size_t e = 0; e < x.size(); ++e) {
    y[e] = x[e] > 0 ? x[e] : 0.0f;
    gx[e] = y[e] > 0 ? gy[e] : 0.0f;
  }
  Tensor ty = ops::relu(r.upload(x, {kRows, kCols}));
  r.check_exact("relu", ty, y);
  r.check_exact("relu_backward", ops::relu_backward(ty, r.upload(gy, {kRows, kCols})), gx);
}

// Logits of moderate size (|x| <= 5: exp must not overflow) and targets (7 i) mod classes.
void cross_entropy_case(OpRun& r) {
  std::vector<float> logits = r.values(kRows * kCols);
  for (float& v : logits) v *= 0.05f;
  std::vector<std::int64_t> targets(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) targets[i] = (i * 7) % kCols;
  const float grad_loss = 0.75f, scale = 1.0f / kRows;
  Vec loss(kRows), loss_scale(kRows), grad, grad_scale;
  for (std::int64_t i = 0; i < kRows; ++i) {
    const float* x = &logits[i * kCols];
    double mx = x[0], z = 0;
    for (std::int64_t c = 1; c < kCols; ++c) mx = std::max(mx, double(x[c]));
    for (std::int64_t c = 0; c < kCols; ++c) z += std::exp(x[c] - mx);
    loss[i] = mx + std::log(z) - x[targets[i]];
    loss_scale[i] = std::fabs(mx) + std::log(z) + std::fabs(x[targets[i]]);
    for (std::int64_t c = 0; c < kCols; ++c) {
      grad.push_back(double(grad_loss) * scale *
                     (std::exp(x[c] - mx) / z - (c == targets[i] ? 1.0 : 0.0)));
      grad_scale.push_back(double(grad_loss) * scale);
    }
  }
  const Tensor tl = r.upload(logits, {kRows, kCols});
  const Tensor tt = Tensor::from_vector(targets, {kRows}, r.dev);
  r.check("cross_entropy", ops::cross_entropy(tl, tt), loss, loss_scale, 64 * kU);
  r.check("cross_entropy_backward",
          ops::cross_entropy_backward(tl, tt, Tensor::full({}, grad_loss, r.dev), scale), grad,
          grad_scale, 64 * kU);
}

void mse_case(OpRun& r) {
  const std::vector<float> x = r.values(kRows * kCols), t = r.values(kRows * kCols);
  const float grad_loss = 0.75f, scale = 1.0f / kRows;
  Vec loss(kRows, 0.0), grad, grad_scale;
  for (std::int64_t i = 0; i < kRows; ++i)
    for (std::int64_t c = 0; c < kCols; ++c) {
      const double d = double(x[i * kCols + c]) - t[i * kCols + c];
      loss[i] += d * d;
      grad.push_back(double(grad_loss) * scale * 2 * d);
      grad_scale.push_back(std::fabs(grad.back()));
    }
  const Tensor tx = r.upload(x, {kRows, kCols}), tt = r.upload(t, {kRows, kCols});
  r.check("mse", ops::mse(tx, tt), loss, loss, (kCols + 4) * kU);
  r.check("mse_backward", ops::mse_backward(tx, tt, Tensor::full({}, grad_loss, r.dev), scale),
          grad, grad_scale, 8 * kU);
}

void sum_case(OpRun& r) {
  const std::vector<float> x = r.values(kRows * kCols);
  const float scale = 1.0f / kRows;
  double s = 0, m = 0;
  for (float v : x) s += v, m += std::fabs(v);
  r.check("sum", ops::sum(r.upload(x, {kRows, kCols}), scale, r.mode), {scale * s}, {scale * m},
          (static_cast<double>(x.size()) + 2) * kU);
}

void fill_axpy_scale_case(OpRun& r) {
  const std::vector<float> x = r.values(kRows * kCols), y = r.values(kRows * kCols);
  Tensor f = r.upload(x, {kRows, kCols});
  ops::fill_(f, -2.5f);
  r.check_exact("fill_", f, std::vector<float>(x.size(), -2.5f));
  Vec ax, ax_scale, sc, sc_scale;
  for (std::size_t e = 0; e < x.size(); ++e) {
    ax.push_back(double(0.3f) * x[e] + y[e]);
    ax_scale.push_back(std::fabs(double(0.3f) * x[e]) + std::fabs(y[e]));
    sc.push_back(double(-1.7f) * y[e]);
    sc_scale.push_back(std::fabs(sc.back()));
  }
  Tensor ty = r.upload(y, {kRows, kCols});
  ops::axpy_(0.3f, r.upload(x, {kRows, kCols}), ty);
  r.check("axpy_", ty, ax, ax_scale, 2 * kU);
  Tensor ts = r.upload(y, {kRows, kCols});
  ops::scale_(ts, -1.7f);
  r.check("scale_", ts, sc, sc_scale, kU);
}

void sum_inputs_case(OpRun& r, int n) {
  Vec want(kRows * kCols, 0.0), scale(kRows * kCols, 0.0);
  std::vector<Tensor> inputs;
  for (int k = 0; k < n; ++k) {
    const std::vector<float> v = r.values(kRows * kCols);
    for (std::size_t e = 0; e < v.size(); ++e) want[e] += v[e], scale[e] += std::fabs(v[e]);
    inputs.push_back(r.upload(v, {kRows, kCols}));
  }
  Tensor out = Tensor::zeros({kRows, kCols}, DType::f32, r.dev);
  ops::sum_inputs(inputs, out, r.mode);
  r.check("sum_inputs", out, want, scale, (n + 1) * kU);
}

// The micro-sharded reductions (one fixed order in both modes) over `shards` micro-shards of
// kRows rows (uneven, and empty when shards > kRows), accumulating or not.
void sharded_case(OpRun& r, std::int64_t shards, bool accumulate) {
  const std::vector<std::int64_t> bounds = micro_shard_bounds(kRows, shards);
  const std::int64_t M = 5;
  const std::vector<float> a = r.values(kRows * M), x = r.values(kRows * kCols);
  const std::vector<float> c = r.values(M * kCols), out = r.values(kCols);
  Vec gw(c.size()), gw_scale(c.size()), sr(kCols), sr_scale(kCols);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < kCols; ++j) {
      const std::size_t e = static_cast<std::size_t>(i * kCols + j);
      gw[e] = accumulate ? c[e] : 0.0;
      gw_scale[e] = std::fabs(gw[e]);
      for (std::int64_t row = 0; row < kRows; ++row) {
        gw[e] += double(a[row * M + i]) * x[row * kCols + j];
        gw_scale[e] += std::fabs(double(a[row * M + i]) * x[row * kCols + j]);
      }
    }
  for (std::int64_t j = 0; j < kCols; ++j) {
    sr[j] = accumulate ? out[j] : 0.0;
    sr_scale[j] = std::fabs(sr[j]);
    for (std::int64_t row = 0; row < kRows; ++row)
      sr[j] += x[row * kCols + j], sr_scale[j] += std::fabs(x[row * kCols + j]);
  }
  const double rtol = (kRows + 2) * kU;
  const Tensor tx = r.upload(x, {kRows, kCols});
  Tensor tc = r.upload(c, {M, kCols});
  ops::gemm_tn_sharded(r.upload(a, {kRows, M}), tx, tc, bounds, accumulate);
  r.check("gemm_tn_sharded", tc, gw, gw_scale, rtol);
  Tensor to = r.upload(out, {kCols});
  ops::sum_rows_sharded(tx, to, bounds, accumulate);
  r.check("sum_rows_sharded", to, sr, sr_scale, rtol);
  // sum_sharded over the first kRows elements of x, the mean of a batch's losses.
  double s = 0, m = 0;
  for (std::int64_t row = 0; row < kRows; ++row) s += x[row], m += std::fabs(x[row]);
  r.check("sum_sharded", ops::sum_sharded(tx.view({kRows * kCols}).narrow(0, kRows), bounds, 0.5f),
          {0.5 * s}, {0.5 * m}, rtol);
}

// torch.optim.SGD, two steps (the first initialises the momentum buffer). The double reference
// runs the same recurrence; its twin over magnitudes (every term made positive) is the scale.
void sgd_case(OpRun& r, float momentum, float dampening, float weight_decay, bool nesterov) {
  const std::int64_t n = kRows * kCols;
  const std::vector<float> p0 = r.values(n), g1 = r.values(n), g2 = r.values(n);
  const float lr = 0.1f;
  Vec p(p0.begin(), p0.end()), buf(n), ps = abs_of(p0), bufs(n);
  for (int step = 0; step < 2; ++step) {
    const std::vector<float>& g = step == 0 ? g1 : g2;
    for (std::int64_t e = 0; e < n; ++e) {
      double d = g[e] + double(weight_decay) * p[e];
      double ds = std::fabs(g[e]) + double(weight_decay) * ps[e];
      if (momentum != 0.0f) {
        buf[e] = step == 0 ? d : momentum * buf[e] + (1.0 - double(dampening)) * d;
        bufs[e] = step == 0 ? ds : momentum * bufs[e] + (1.0 - double(dampening)) * ds;
        d = nesterov ? d + momentum * buf[e] : buf[e];
        ds = nesterov ? ds + momentum * bufs[e] : bufs[e];
      }
      p[e] -= double(lr) * d;
      ps[e] += double(lr) * ds;
    }
  }
  Tensor tp = r.upload(p0, {kRows, kCols});
  Tensor tb = momentum != 0.0f ? Tensor::zeros({kRows, kCols}, DType::f32, r.dev) : Tensor();
  for (int step = 0; step < 2; ++step)
    ops::sgd_step_(tp, r.upload(step == 0 ? g1 : g2, {kRows, kCols}), tb, lr, momentum, dampening,
                   weight_decay, nesterov, step == 0);
  r.check("param", tp, p, ps, 32 * kU);
  if (momentum != 0.0f) r.check("momentum_buffer", tb, buf, bufs, 32 * kU);
}

// torch.optim.Adam, two steps, with weight decay; amsgrad or not.
void adam_case(OpRun& r, bool amsgrad) {
  const std::int64_t n = kRows * kCols;
  const std::vector<float> p0 = r.values(n), g1 = r.values(n), g2 = r.values(n);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  Vec p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0), vmax(n, 0.0), ps = abs_of(p0);
  Tensor tp = r.upload(p0, {kRows, kCols});
  Tensor tm = Tensor::zeros({kRows, kCols}, DType::f32, r.dev), tv = tm.clone(), tmax = tm.clone();
  Tensor none;
  for (int step = 1; step <= 2; ++step) {
    const std::vector<float>& g = step == 1 ? g1 : g2;
    const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(b2, step);
    for (std::int64_t e = 0; e < n; ++e) {
      const double d = g[e] + wd * p[e];
      m[e] = b1 * m[e] + (1 - b1) * d;
      v[e] = b2 * v[e] + (1 - b2) * d * d;
      vmax[e] = std::max(vmax[e], v[e]);
      const double update =
          (lr / bc1) * m[e] / (std::sqrt(amsgrad ? vmax[e] : v[e]) / std::sqrt(bc2) + eps);
      p[e] -= update;
      ps[e] += std::fabs(update);
    }
    ops::adam_step_(tp, r.upload(g, {kRows, kCols}), tm, tv, amsgrad ? tmax : none, lr, b1, b2, eps,
                    wd, bc1, bc2, amsgrad);
  }
  r.check("param", tp, p, ps, 64 * kU);
  r.check("exp_avg_sq", tv, v, v, 16 * kU);
}

// Copies: host -> device -> the other device -> back, narrow and clone, i64 between devices,
// and a strided block copy (Backend::copy_2d through detail::copy_block) between the devices.
void copies_case(OpRun& r) {
  const std::vector<float> x = r.values(kRows * kCols);
  const Tensor t = r.upload(x, {kRows, kCols});
  r.check_exact("to(dev1)", t.to(r.dev1), x);
  r.check_exact("to(dev1).to(dev)", t.to(r.dev1).to(r.dev), x);
  r.check_exact("narrow.clone", t.narrow(3, 4).clone(),
                std::vector<float>(x.begin() + 3 * kCols, x.begin() + 7 * kCols));
  std::vector<std::int64_t> labels(kRows);
  for (std::int64_t i = 0; i < kRows; ++i) labels[i] = (i * 7) % kCols - (i % 2 ? 1ll << 40 : 0);
  r.check("i64 to(dev1)", Tensor::from_vector(labels, {kRows}, r.dev).to(r.dev1),
          Vec(labels.begin(), labels.end()), {}, 0.0);
  // Columns 2..8 of rows 0..kRows-1 into a [kRows, 9] tensor on dev1, column 1 on.
  Tensor dst = Tensor::full({kRows, 9}, -1.0f, r.dev1);
  const std::size_t f = sizeof(float);
  detail::copy_block(dst, f, 9 * f, t, 2 * f, kCols * f, 7 * f, kRows);
  std::vector<float> want(kRows * 9, -1.0f);
  for (std::int64_t row = 0; row < kRows; ++row)
    for (std::int64_t c = 0; c < 7; ++c) want[row * 9 + 1 + c] = x[row * kCols + 2 + c];
  r.check_exact("copy_2d", dst, want);
}

std::string bool_name(bool b) { return b ? "1" : "0"; }

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> v;
    struct G {
      std::int64_t M, N, K;
    };
    for (G g : {G{1, 1, 1}, G{7, 13, 5}, G{33, 17, 65}, G{64, 48, 128}, G{130, 3, 257}})
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        v.push_back({detail::cat("gemm_", g.M, "x", g.N, "x", g.K, "_ta", bool_name(ta), "_tb",
                                 bool_name(tb)),
                     [=](OpRun& r) { gemm_case(r, g.M, g.N, g.K, ta, tb); }});
      }
    v.push_back({"add_bias", add_bias_case});
    v.push_back({"sum_rows_beta0", [](OpRun& r) { sum_rows_case(r, 0.0f); }});
    v.push_back({"sum_rows_beta1", [](OpRun& r) { sum_rows_case(r, 1.0f); }});
    v.push_back({"relu_and_backward", relu_case});
    v.push_back({"cross_entropy_and_backward", cross_entropy_case});
    v.push_back({"mse_and_backward", mse_case});
    v.push_back({"sum", sum_case});
    v.push_back({"fill_axpy_scale", fill_axpy_scale_case});
    for (int n = 1; n <= 9; ++n)
      v.push_back({detail::cat("sum_inputs_", n), [n](OpRun& r) { sum_inputs_case(r, n); }});
    for (std::int64_t k : {1, 8, 64})
      for (bool acc : {false, true})
        v.push_back({detail::cat("sharded_K", k, "_acc", bool_name(acc)),
                     [=](OpRun& r) { sharded_case(r, k, acc); }});
    v.push_back({"sgd_plain", [](OpRun& r) { sgd_case(r, 0.0f, 0.0f, 0.0f, false); }});
    v.push_back({"sgd_momentum", [](OpRun& r) { sgd_case(r, 0.9f, 0.0f, 0.0f, false); }});
    v.push_back(
        {"sgd_dampening_weight_decay", [](OpRun& r) { sgd_case(r, 0.9f, 0.1f, 0.01f, false); }});
    v.push_back(
        {"sgd_nesterov_weight_decay", [](OpRun& r) { sgd_case(r, 0.9f, 0.0f, 0.01f, true); }});
    v.push_back({"adam", [](OpRun& r) { adam_case(r, false); }});
    v.push_back({"adam_amsgrad", [](OpRun& r) { adam_case(r, true); }});
    v.push_back({"copies_between_devices", copies_case});
    for (const OpCase& c : registered_op_cases()) v.push_back(c);
    return v;
  }();
  return cases;
}

// ---- running the table ------------------------------------------------------------------------

struct Param {
  std::size_t case_index;
  std::string backend;
  Determinism mode;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << op_cases()[p.case_index].name << " on " << p.backend << ", " << determinism_name(p.mode);
}

std::vector<Param> params() {
  std::vector<Param> out;
  for (const std::string& b : registered_backends()) {
    if (b == "cpu") continue;  // runs no kernels
    for (std::size_t c = 0; c < op_cases().size(); ++c)
      for (Determinism m : {Determinism::bitwise, Determinism::fast}) out.push_back({c, b, m});
  }
  return out;
}

std::uint64_t seed_of(const std::string& name) {  // FNV-1a: a case keeps its inputs when moved
  std::uint64_t h = 1469598103934665603ull;
  for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  return h;
}

std::vector<Output> run_case(const OpCase& c, const std::string& backend, Determinism mode) {
  OpRun r(backend, mode, seed_of(c.name));
  c.body(r);
  return std::move(r.outputs);
}

// Every element within its bound of the double reference.
void expect_near_reference(const std::vector<Output>& outs, const std::string& who) {
  for (const Output& o : outs) {
    ASSERT_EQ(o.got.size(), o.want.size()) << who << " " << o.name;
    std::size_t bad = 0, first = 0;
    for (std::size_t e = 0; e < o.got.size(); ++e)
      if (!(std::fabs(o.got[e] - o.want[e]) <= o.rtol * o.scale[e] + 1e-37) && bad++ == 0)
        first = e;
    EXPECT_EQ(bad, 0u) << who << " " << o.name << ": " << bad << " of " << o.got.size()
                       << " elements outside the bound; first at " << first << ": got "
                       << o.got[first] << ", want " << o.want[first] << " +- "
                       << o.rtol * o.scale[first];
  }
}

class BackendOps : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    // Two devices of each (copies between devices); the simulator is the reference.
    for (const std::string& b : {std::string("sim"), GetParam().backend})
      if (std::string why = backend_unavailable(b, 2); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(BackendOps, MatchesTheSimulatorAndTheDoubleReference) {
  const Param& p = GetParam();
  const OpCase& c = op_cases()[p.case_index];
  const std::vector<Output> sim = run_case(c, "sim", p.mode);
  expect_near_reference(sim, "sim");
  if (p.backend == "sim") return;
  const std::vector<Output> got = run_case(c, p.backend, p.mode);
  expect_near_reference(got, p.backend);
  ASSERT_EQ(got.size(), sim.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    const Output &g = got[k], &s = sim[k];
    ASSERT_EQ(g.got.size(), s.got.size()) << g.name;
    std::size_t bad = 0, first = 0;
    for (std::size_t e = 0; e < g.got.size(); ++e) {
      const bool same =
          p.mode == Determinism::bitwise
              ? std::bit_cast<std::uint64_t>(g.got[e]) == std::bit_cast<std::uint64_t>(s.got[e])
              : std::fabs(g.got[e] - s.got[e]) <= 2 * g.rtol * g.scale[e] + 1e-37;
      if (!same && bad++ == 0) first = e;
    }
    EXPECT_EQ(bad, 0u) << g.name << ": " << bad << " of " << g.got.size() << " elements "
                       << (p.mode == Determinism::bitwise ? "differ in their bits from"
                                                          : "outside the tolerance of")
                       << " the simulator's; first at " << first << ": " << g.got[first] << " vs "
                       << s.got[first];
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BackendOps, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return detail::cat(op_cases()[info.param.case_index].name, "_",
                                              info.param.backend, "_",
                                              determinism_name(info.param.mode));
                         });

// The table reaches every Kernels method: a case per method family (gemm, add_bias, sum_rows,
// relu, cross_entropy, mse, sum, fill/axpy/scale, sum_inputs, sgd, the sharded kernels, adam)
// and the copies; a table that lost one fails here.
TEST(BackendOpsTable, CoversEveryKernelFamily) {
  for (const char* prefix :
       {"gemm_", "add_bias", "sum_rows_", "relu", "cross_entropy", "mse", "sum", "fill_axpy_scale",
        "sum_inputs_", "sharded_", "sgd_", "adam", "copies"}) {
    bool found = false;
    for (const OpCase& c : op_cases()) found = found || c.name.rfind(prefix, 0) == 0;
    EXPECT_TRUE(found) << prefix;
  }
}

}  // namespace
}  // namespace ditto
