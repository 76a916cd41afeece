// Tests of ops:: on simulated devices: every op against a plain host reference (double, or the
// exact float sequence of the bitwise contract), in both determinism modes, plus zero-size inputs
// and the argument errors core reports.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

Tensor on_sim(const std::vector<float>& v, const Shape& shape, int device = 0) {
  return Tensor::from_vector(v, shape, sim_device(device));
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double rel_tol,
                     double abs_tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], abs_tol + rel_tol * std::fabs(want[i])) << "at " << i;
}

class OpsTest : public ::testing::TestWithParam<Determinism> {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 16;
    init_backend("sim", o);
  }
  Determinism mode() const { return GetParam(); }
};

using Sim16 = SimSuite<16>;
using OpsBitwise = Sim16;
using OpsKernels = Sim16;
using OpsErrors = Sim16;

// ---- gemm ---------------------------------------------------------------------------------------

struct GemmCase {
  std::int64_t M, N, K;
};
const std::vector<GemmCase> kGemmShapes = {{1, 1, 1},    {3, 17, 5},    {17, 3, 129},
                                           {129, 17, 3}, {33, 65, 129}, {5, 40, 1}};
const std::vector<std::pair<float, float>> kAlphaBeta = {
    {1.0f, 0.0f}, {0.5f, 0.0f}, {1.5f, -0.75f}, {1.0f, 1.0f}};

// Logical op(A)[i, k] stored as A ([M, K], or [K, M] when transposed).
struct GemmInputs {
  std::vector<float> a, b, c;  // as stored
  Shape a_shape, b_shape;
  float op_a(std::int64_t i, std::int64_t k, const GemmCase& g, bool ta) const {
    return ta ? a[k * g.M + i] : a[i * g.K + k];
  }
  float op_b(std::int64_t k, std::int64_t j, const GemmCase& g, bool tb) const {
    return tb ? b[j * g.K + k] : b[k * g.N + j];
  }
};

GemmInputs make_gemm_inputs(const GemmCase& g, bool ta, bool tb, std::uint32_t seed) {
  GemmInputs in;
  in.a = random_values(static_cast<std::size_t>(g.M * g.K), seed);
  in.b = random_values(static_cast<std::size_t>(g.K * g.N), seed + 1);
  in.c = random_values(static_cast<std::size_t>(g.M * g.N), seed + 2);
  in.a_shape = ta ? Shape{g.K, g.M} : Shape{g.M, g.K};
  in.b_shape = tb ? Shape{g.N, g.K} : Shape{g.K, g.N};
  return in;
}

// Calls f for every shape of kGemmShapes, transpose and (alpha, beta) of kAlphaBeta, with fresh
// inputs (seeds from `seed` on) and a trace naming the case.
void for_each_gemm_case(
    std::uint32_t seed,
    const std::function<void(const GemmCase&, bool, bool, float, float, const GemmInputs&)>& f) {
  for (const auto& g : kGemmShapes)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (auto [alpha, beta] : kAlphaBeta) {
          SCOPED_TRACE(::testing::Message()
                       << "M=" << g.M << " N=" << g.N << " K=" << g.K << " ta=" << ta
                       << " tb=" << tb << " alpha=" << alpha << " beta=" << beta);
          f(g, ta, tb, alpha, beta, make_gemm_inputs(g, ta, tb, seed += 3));
        }
}

TEST_P(OpsTest, GemmMatchesDoubleReferenceAllTransposes) {
  for_each_gemm_case(
      10, [&](const GemmCase& g, bool ta, bool tb, float alpha, float beta, const GemmInputs& in) {
        Tensor a = on_sim(in.a, in.a_shape), b = on_sim(in.b, in.b_shape);
        Tensor c = on_sim(in.c, {g.M, g.N});
        ops::gemm(a, b, c, ta, tb, alpha, beta, mode());
        std::vector<float> got = c.to_vector<float>();
        for (std::int64_t i = 0; i < g.M; ++i)
          for (std::int64_t j = 0; j < g.N; ++j) {
            double acc = 0, mag = 0;
            for (std::int64_t k = 0; k < g.K; ++k) {
              double p = double(in.op_a(i, k, g, ta)) * in.op_b(k, j, g, tb);
              acc += p;
              mag += std::fabs(p);
            }
            double cij = in.c[i * g.N + j];
            double want = alpha * acc + beta * cij;
            double tol =
                4.0 * (g.K + 2) * 1.2e-7 * (std::fabs(alpha) * mag + std::fabs(beta * cij)) + 1e-30;
            ASSERT_NEAR(got[i * g.N + j], want, tol) << "at (" << i << ", " << j << ")";
          }
      });
}

TEST_F(OpsBitwise, GemmEqualsScalarFmaChainBitForBit) {
  for_each_gemm_case(
      100, [&](const GemmCase& g, bool ta, bool tb, float alpha, float beta, const GemmInputs& in) {
        Tensor a = on_sim(in.a, in.a_shape, 2), b = on_sim(in.b, in.b_shape, 2);
        Tensor c = on_sim(in.c, {g.M, g.N}, 2);
        ops::gemm(a, b, c, ta, tb, alpha, beta, Determinism::bitwise);
        std::vector<float> want(in.c.size());
        for (std::int64_t i = 0; i < g.M; ++i)
          for (std::int64_t j = 0; j < g.N; ++j) {
            float acc = 0.0f;
            for (std::int64_t k = 0; k < g.K; ++k)
              acc = std::fma(in.op_a(i, k, g, ta), in.op_b(k, j, g, tb), acc);
            float cij = in.c[i * g.N + j];
            float r;
            if (beta == 0.0f)
              r = alpha == 1.0f ? acc : alpha * acc;
            else
              r = std::fma(beta, cij, alpha * acc);
            want[i * g.N + j] = r;
          }
        EXPECT_TRUE(bits_equal(c.to_vector<float>(), want));
      });
}

// Blocking over rows and columns must not change any bit: every row of a 37-row product equals
// the same row computed alone, and all four transpose layouts of the same matrices agree.
TEST_F(OpsBitwise, GemmBitsIndependentOfBlockingAndLayout) {
  const std::int64_t M = 37, N = 45, K = 70;
  std::vector<float> a = random_values(M * K, 7), b = random_values(K * N, 8);
  std::vector<float> at(M * K), bt(K * N);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t k = 0; k < K; ++k) at[k * M + i] = a[i * K + k];
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t j = 0; j < N; ++j) bt[j * K + k] = b[k * N + j];
  Tensor ta = on_sim(a, {M, K}), tb = on_sim(b, {K, N});
  Tensor tat = on_sim(at, {K, M}), tbt = on_sim(bt, {N, K});
  auto full = ops::matmul(ta, tb, false, false, Determinism::bitwise).to_vector<float>();
  EXPECT_TRUE(
      bits_equal(ops::matmul(tat, tb, true, false, Determinism::bitwise).to_vector<float>(), full));
  EXPECT_TRUE(
      bits_equal(ops::matmul(ta, tbt, false, true, Determinism::bitwise).to_vector<float>(), full));
  EXPECT_TRUE(
      bits_equal(ops::matmul(tat, tbt, true, true, Determinism::bitwise).to_vector<float>(), full));
  for (std::int64_t i = 0; i < M; ++i) {
    auto row =
        ops::matmul(ta.narrow(i, 1), tb, false, false, Determinism::bitwise).to_vector<float>();
    std::vector<float> want(full.begin() + i * N, full.begin() + (i + 1) * N);
    ASSERT_TRUE(bits_equal(row, want)) << "row " << i;
  }
}

TEST_P(OpsTest, GemmZeroSizes) {
  // K == 0: C = beta * C, and with beta == 0 C's old contents (NaN here) are ignored.
  Tensor a = Tensor::empty({3, 0}, DType::f32, sim_device(1)),
         b = Tensor::empty({0, 4}, DType::f32, sim_device(1));
  Tensor c = Tensor::full({3, 4}, std::nanf(""), sim_device(1));
  ops::gemm(a, b, c, false, false, 2.0f, 0.0f, mode());
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(12, 0.0f));
  Tensor c2 = Tensor::full({3, 4}, 2.0f, sim_device(1));
  ops::gemm(a, b, c2, false, false, 1.0f, 0.5f, mode());
  EXPECT_EQ(c2.to_vector<float>(), std::vector<float>(12, 1.0f));
  EXPECT_EQ(ops::matmul(a, b, false, false, mode()).to_vector<float>(),
            std::vector<float>(12, 0.0f));
  // M == 0 or N == 0: empty results, nothing launched.
  Tensor e = ops::matmul(Tensor::empty({0, 5}, DType::f32, sim_device(1)),
                         Tensor::zeros({5, 2}, DType::f32, sim_device(1)), false, false, mode());
  EXPECT_EQ(e.shape(), (Shape{0, 2}));
  Tensor e2 = ops::matmul(Tensor::zeros({3, 5}, DType::f32, sim_device(1)),
                          Tensor::empty({5, 0}, DType::f32, sim_device(1)), false, false, mode());
  EXPECT_EQ(e2.shape(), (Shape{3, 0}));
  EXPECT_EQ(e2.numel(), 0);
}

// ---- bias, row sums, relu -----------------------------------------------------------------------

TEST_P(OpsTest, AddBias) {
  const std::int64_t R = 7, C = 19;
  auto y = random_values(R * C, 1), bias = random_values(C, 2);
  Tensor ty = on_sim(y, {R, C}, 3);
  ops::add_bias_(ty, on_sim(bias, {C}, 3));
  std::vector<float> want(y);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) want[r * C + c] += bias[c];
  EXPECT_TRUE(bits_equal(ty.to_vector<float>(), want));
  Tensor empty_y = Tensor::empty({0, C}, DType::f32, sim_device(3));
  ops::add_bias_(empty_y, on_sim(bias, {C}, 3));  // no rows: nothing to do
}

TEST_P(OpsTest, SumRows) {
  for (std::int64_t R : {0, 1, 3, 129})
    for (std::int64_t C : {1, 17, 1500})
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        SCOPED_TRACE(::testing::Message() << "rows=" << R << " cols=" << C << " beta=" << beta);
        auto x = random_values(R * C, static_cast<std::uint32_t>(R * 7 + C));
        auto out0 = random_values(C, 5);
        Tensor out = on_sim(out0, {C});
        ops::sum_rows(on_sim(x, {R, C}), out, beta, mode());
        std::vector<float> got = out.to_vector<float>();
        std::vector<float> exact(C);
        std::vector<double> ref(C);
        for (std::int64_t c = 0; c < C; ++c) {
          float acc = 0.0f;
          double dacc = 0.0;
          for (std::int64_t r = 0; r < R; ++r) {
            acc += x[r * C + c];
            dacc += x[r * C + c];
          }
          exact[c] = beta == 0.0f ? acc : std::fma(beta, out0[c], acc);
          ref[c] = dacc + double(beta) * out0[c];
        }
        if (mode() == Determinism::bitwise)
          EXPECT_TRUE(bits_equal(got, exact));
        else
          expect_near_all(got, ref, 1e-5, 1e-4);
      }
}

TEST_P(OpsTest, ReluAndBackward) {
  std::vector<float> x = random_values(1000, 3);
  x[0] = 0.0f;
  x[1] = -0.0f;
  Tensor tx = on_sim(x, {10, 100}, 4);
  Tensor y = ops::relu(tx);
  EXPECT_EQ(y.shape(), (Shape{10, 100}));
  std::vector<float> yv = y.to_vector<float>();
  std::vector<float> gy = random_values(1000, 4);
  std::vector<float> gx = ops::relu_backward(y, on_sim(gy, {10, 100}, 4)).to_vector<float>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(yv[i], x[i] > 0 ? x[i] : 0.0f) << i;
    ASSERT_EQ(gx[i], x[i] > 0 ? gy[i] : 0.0f) << i;
  }
  Tensor e = ops::relu(Tensor::empty({0, 3}, DType::f32, sim_device(4)));
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  EXPECT_EQ(ops::relu_backward(e, e).numel(), 0);
}

// ---- losses -------------------------------------------------------------------------------------

TEST_P(OpsTest, CrossEntropyForwardAndBackward) {
  const std::int64_t N = 9, C = 10;
  std::vector<float> logits = random_values(N * C, 11, -4.0f, 4.0f);
  logits[5] = 80.0f;  // large logits stay finite (max subtracted)
  std::vector<std::int64_t> targets = {0, 9, 3, 3, 7, 1, 2, 8, 5};
  Tensor tl = on_sim(logits, {N, C}, 5);
  Tensor tt = Tensor::from_vector(targets, {N}, sim_device(5));
  std::vector<float> loss = ops::cross_entropy(tl, tt).to_vector<float>();
  Tensor grad_loss = Tensor::full({}, 0.5f, sim_device(5));
  std::vector<float> grad =
      ops::cross_entropy_backward(tl, tt, grad_loss, 1.0f / N).to_vector<float>();
  ASSERT_EQ(loss.size(), std::size_t(N));
  for (std::int64_t r = 0; r < N; ++r) {
    double m = -1e300, s = 0;
    for (std::int64_t c = 0; c < C; ++c) m = std::max(m, double(logits[r * C + c]));
    for (std::int64_t c = 0; c < C; ++c) s += std::exp(logits[r * C + c] - m);
    double want = std::log(s) + m - logits[r * C + targets[r]];
    EXPECT_NEAR(loss[r], want, 1e-5 + 1e-5 * std::fabs(want)) << "sample " << r;
    for (std::int64_t c = 0; c < C; ++c) {
      double p = std::exp(logits[r * C + c] - m) / s;
      double g = 0.5 / N * (p - (c == targets[r] ? 1.0 : 0.0));
      EXPECT_NEAR(grad[r * C + c], g, 1e-7) << "(" << r << ", " << c << ")";
    }
  }
  // No samples: empty results.
  Tensor el = Tensor::empty({0, C}, DType::f32, sim_device(5));
  Tensor et = Tensor::empty({0}, DType::i64, sim_device(5));
  EXPECT_EQ(ops::cross_entropy(el, et).shape(), (Shape{0}));
  EXPECT_EQ(ops::cross_entropy_backward(el, et, grad_loss, 1.0f).shape(), (Shape{0, C}));
}

TEST_P(OpsTest, MseForwardAndBackward) {
  for (Shape shape : {Shape{6, 5}, Shape{7}}) {
    std::int64_t rows = shape[0], cols = shape.size() == 2 ? shape[1] : 1;
    auto x = random_values(rows * cols, 21), t = random_values(rows * cols, 22);
    Tensor tx = on_sim(x, shape, 6), tt = on_sim(t, shape, 6);
    std::vector<float> loss = ops::mse(tx, tt).to_vector<float>();
    ASSERT_EQ(loss.size(), std::size_t(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      float acc = 0.0f;  // the canonical chain: one fma per feature
      for (std::int64_t c = 0; c < cols; ++c) {
        float d = x[r * cols + c] - t[r * cols + c];
        acc = std::fma(d, d, acc);
      }
      EXPECT_EQ(loss[r], acc) << "sample " << r;
    }
    Tensor g = ops::mse_backward(tx, tt, Tensor::full({}, 3.0f, sim_device(6)), 0.25f);
    EXPECT_EQ(g.shape(), shape);
    std::vector<float> gv = g.to_vector<float>();
    for (std::size_t i = 0; i < x.size(); ++i)
      EXPECT_EQ(gv[i], 3.0f * 0.25f * 2.0f * (x[i] - t[i])) << i;
  }
  Tensor e = Tensor::empty({0, 4}, DType::f32, sim_device(6));
  EXPECT_EQ(ops::mse(e, e).shape(), (Shape{0}));
  EXPECT_EQ(ops::mse_backward(e, e, Tensor::full({}, 1.0f, sim_device(6)), 1.0f).shape(),
            (Shape{0, 4}));
}

// ---- sum, fill, axpy, scale ---------------------------------------------------------------------

TEST_P(OpsTest, Sum) {
  for (std::int64_t n : {0, 1, 5, 1000, 4097}) {
    auto x = random_values(n, static_cast<std::uint32_t>(n + 1));
    Tensor out = ops::sum(on_sim(x, {n}, 7), 0.25f, mode());
    EXPECT_EQ(out.dim(), 0);
    float got = out.item();
    float acc = 0.0f;
    double ref = 0.0;
    for (float v : x) {
      acc += v;
      ref += v;
    }
    if (mode() == Determinism::bitwise)
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(0.25f * acc))
          << "n=" << n;
    else
      EXPECT_NEAR(got, 0.25 * ref, 1e-5 * n + 1e-7) << "n=" << n;
  }
  // Sum of nothing is 0, of any shape.
  EXPECT_EQ(ops::sum(Tensor::empty({3, 0}, DType::f32, sim_device(7)), 1.0f, mode()).item(), 0.0f);
}

TEST_P(OpsTest, FillAxpyScale) {
  Tensor x = Tensor::empty({4, 33}, DType::f32, sim_device(8));
  ops::fill_(x, 1.25f);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(132, 1.25f));
  auto xv = random_values(132, 31), yv = random_values(132, 32);
  Tensor tx = on_sim(xv, {4, 33}, 8), ty = on_sim(yv, {4, 33}, 8);
  ops::axpy_(-0.3f, tx, ty);
  ops::scale_(tx, 3.5f);
  std::vector<float> want_y(132), want_x(132);
  for (std::size_t i = 0; i < 132; ++i) {
    want_y[i] = yv[i] + -0.3f * xv[i];
    want_x[i] = 3.5f * xv[i];
  }
  EXPECT_TRUE(bits_equal(ty.to_vector<float>(), want_y));
  EXPECT_TRUE(bits_equal(tx.to_vector<float>(), want_x));
  Tensor e = Tensor::empty({0}, DType::f32, sim_device(8));
  ops::fill_(e, 1.0f);
  ops::axpy_(1.0f, e, e);
  ops::scale_(e, 2.0f);
}

// ---- sum_inputs ---------------------------------------------------------------------------------

// The canonical tree of Note [Canonical tree], written independently of tree_mid.
float host_tree(const std::vector<std::vector<float>>& in, std::size_t lo, std::size_t hi,
                std::size_t i) {
  if (hi - lo == 1) return in[lo][i];
  std::size_t mid = lo + std::bit_floor(hi - lo - 1);
  return host_tree(in, lo, mid, i) + host_tree(in, mid, hi, i);
}

TEST_P(OpsTest, SumInputs) {
  for (std::size_t n_in : {1, 2, 3, 5, 8, 9})
    for (std::int64_t numel : {1, 1000, 2500}) {
      SCOPED_TRACE(::testing::Message() << "inputs=" << n_in << " numel=" << numel);
      std::vector<std::vector<float>> host;
      std::vector<Tensor> inputs;
      for (std::size_t k = 0; k < n_in; ++k) {
        // Mixed magnitudes so that the order matters.
        float scale = k % 3 == 0 ? 1e6f : 1e-2f;
        host.push_back(random_values(numel, static_cast<std::uint32_t>(40 + k), -scale, scale));
        inputs.push_back(on_sim(host.back(), {numel}, 9));
      }
      for (bool in_place : {false, true}) {
        Tensor out =
            in_place ? inputs[0].clone() : Tensor::empty({numel}, DType::f32, sim_device(9));
        std::vector<Tensor> in = inputs;
        if (in_place) in[0] = out;  // out aliases inputs[0]
        ops::sum_inputs(in, out, mode());
        std::vector<float> got = out.to_vector<float>();
        for (std::int64_t i = 0; i < numel; ++i) {
          if (mode() == Determinism::bitwise) {
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]),
                      std::bit_cast<std::uint32_t>(host_tree(host, 0, n_in, i)))
                << "element " << i << " in_place=" << in_place;
          } else {
            double ref = 0, mag = 0;
            for (auto& h : host) {
              ref += h[i];
              mag += std::fabs(h[i]);
            }
            ASSERT_NEAR(got[i], ref, 1e-6 * mag) << "element " << i;
          }
        }
      }
    }
}

// A left-to-right sum and the canonical tree round differently on these inputs; bitwise mode
// follows the tree exactly.
TEST_F(OpsBitwise, SumInputsFollowsTreeNotLeftToRight) {
  std::vector<std::vector<float>> host = {{1.0f, 3.0f}, {1e8f, 1e8f}, {-1e8f, -1e8f}, {1.0f, 3.0f}};
  std::vector<Tensor> inputs;
  for (auto& h : host) inputs.push_back(on_sim(h, {2}, 10));
  Tensor out = Tensor::empty({2}, DType::f32, sim_device(10));
  ops::sum_inputs(inputs, out, Determinism::bitwise);
  std::vector<float> got = out.to_vector<float>();
  for (std::size_t i = 0; i < 2; ++i) {
    float left_to_right = ((host[0][i] + host[1][i]) + host[2][i]) + host[3][i];
    float tree = host_tree(host, 0, 4, i);
    EXPECT_NE(left_to_right, tree) << "inputs do not separate the two orders at " << i;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(tree)) << i;
  }
}

// ---- sgd kernel ---------------------------------------------------------------------------------

TEST_F(OpsKernels, SgdStepMatchesTorchAlgorithm) {
  struct Opt {
    float lr, momentum, dampening, wd;
    bool nesterov;
  };
  for (Opt o : {Opt{0.1f, 0.0f, 0.0f, 0.0f, false}, Opt{0.1f, 0.9f, 0.0f, 0.0f, false},
                Opt{0.05f, 0.9f, 0.1f, 1e-2f, false}, Opt{0.05f, 0.9f, 0.0f, 1e-3f, true}}) {
    SCOPED_TRACE(::testing::Message() << "momentum=" << o.momentum << " nesterov=" << o.nesterov);
    const std::int64_t n = 37;
    std::vector<float> p = random_values(n, 51), buf(n, 0.0f);
    Tensor tp = on_sim(p, {n}, 11);
    Tensor tb = Tensor::zeros({n}, DType::f32, sim_device(11));
    Kernels& k = get_backend("sim").kernels();
    Stream& s = current_stream(sim_device(11));
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = random_values(n, static_cast<std::uint32_t>(60 + step));
      Tensor tg = on_sim(g, {n}, 11);
      k.sgd_step(s, tp.data<float>(), tg.data<float>(),
                 o.momentum != 0 ? tb.data<float>() : nullptr, n, o.lr, o.momentum, o.dampening,
                 o.wd, o.nesterov, step == 0);
      for (std::int64_t i = 0; i < n; ++i) {  // torch.optim.SGD, single-tensor path
        float d = g[i];
        if (o.wd != 0) d = d + o.wd * p[i];
        if (o.momentum != 0) {
          buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
          d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
        }
        p[i] = p[i] + -o.lr * d;
      }
      s.synchronize();
    }
    EXPECT_TRUE(bits_equal(tp.to_vector<float>(), p));
    if (o.momentum != 0) {
      EXPECT_TRUE(bits_equal(tb.to_vector<float>(), buf));
    }
  }
}

// Ops run on the thread's current stream (StreamGuard), in order.
TEST_F(OpsKernels, RunOnCurrentStream) {
  Backend& b = get_backend("sim");
  auto stream = b.create_stream(12);
  Tensor x = Tensor::zeros({64}, DType::f32, sim_device(12));
  b.default_stream(12).synchronize();
  {
    StreamGuard guard(*stream);
    ops::fill_(x, 2.0f);
    ops::scale_(x, 3.0f);
    Tensor s = ops::sum(x, 1.0f, Determinism::bitwise);
    stream->synchronize();
    EXPECT_EQ(s.item(), 384.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, OpsTest, ::testing::Values(Determinism::bitwise, Determinism::fast),
                         [](const auto& info) {
                           return std::string(determinism_name(info.param));
                         });

// ---- errors -------------------------------------------------------------------------------------

TEST_F(OpsErrors, GemmShapes) {
  Tensor a = Tensor::zeros({4, 5}, DType::f32, sim_device(0));
  Tensor b = Tensor::zeros({6, 3}, DType::f32, sim_device(0));
  Tensor c = Tensor::zeros({4, 3}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(
      ops::gemm(a, b, c, false, false, 1, 0, Determinism::fast), InvalidArgument,
      "ops::gemm: b: expected [K, N] = [5, 3] for a of [4, 5], got [6, 3] f32 on sim:0");
  EXPECT_THROW_MSG(ops::matmul(a, b, true, false, Determinism::fast), InvalidArgument,
                   "ops::matmul: b: expected [K, N] = [4, 3] for a of [4, 5] (trans_a)");
  Tensor b2 = Tensor::zeros({5, 3}, DType::f32, sim_device(0));
  Tensor c2 = Tensor::zeros({3, 4}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(ops::gemm(a, b2, c2, false, false, 1, 0, Determinism::fast), InvalidArgument,
                   "ops::gemm: c: expected [M, N] = [4, 3]");
  Tensor v = Tensor::zeros({5}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(ops::matmul(a, v, false, false, Determinism::fast), InvalidArgument,
                   "ops::matmul: b: expected a 2-dim tensor [K, N], got [5] f32 on sim:0");
  // c may not share memory with an operand.
  Tensor sq = Tensor::zeros({4, 4}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(ops::gemm(sq, sq, sq, false, false, 1, 0, Determinism::fast), InvalidArgument,
                   "ops::gemm: c: must not share memory with a");
}

TEST_F(OpsErrors, DevicesAndDtypes) {
  Tensor a = Tensor::zeros({2, 2}, DType::f32, sim_device(0));
  Tensor b1 = Tensor::zeros({2, 2}, DType::f32, sim_device(1));
  Tensor host = Tensor::zeros({2, 2}, DType::f32, Device::cpu());
  Tensor labels = Tensor::zeros({2, 2}, DType::i64, sim_device(0));
  EXPECT_THROW_MSG(
      ops::matmul(a, b1, false, false, Determinism::fast), InvalidArgument,
      "ops::matmul: b: expected a tensor on sim:0 (the device of a), got [2, 2] f32 on sim:1");
  EXPECT_THROW_MSG(
      ops::relu(host), InvalidArgument,
      "ops::relu: x: expected a tensor on a device (sim or cuda), got [2, 2] f32 on cpu");
  EXPECT_THROW_MSG(ops::matmul(a, labels, false, false, Determinism::fast), InvalidArgument,
                   "ops::matmul: b: expected dtype f32, got [2, 2] i64 on sim:0");
  EXPECT_THROW_MSG(ops::sum(Tensor(), 1.0f, Determinism::fast), InvalidArgument,
                   "ops::sum: x: expected a defined tensor");
  EXPECT_THROW_MSG(ops::axpy_(1.0f, a, b1), InvalidArgument,
                   "ops::axpy_: y: expected a tensor on sim:0");
  Tensor a3 = Tensor::zeros({3, 2}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(ops::axpy_(1.0f, a, a3), InvalidArgument,
                   "ops::axpy_: y: expected [2, 2] (the shape of x), got [3, 2]");
  EXPECT_THROW_MSG(ops::relu_backward(a, a3), InvalidArgument,
                   "ops::relu_backward: grad_y: expected [2, 2] (the shape of y), got [3, 2]");
  Tensor bias = Tensor::zeros({3}, DType::f32, sim_device(0));
  EXPECT_THROW_MSG(ops::add_bias_(a, bias), InvalidArgument,
                   "ops::add_bias_: bias: expected [cols] = [2] for y of [2, 2], got [3]");
  EXPECT_THROW_MSG(ops::sum_rows(a, bias, 0.0f, Determinism::bitwise), InvalidArgument,
                   "ops::sum_rows: out: expected [cols] = [2] for x of [2, 2], got [3]");
  EXPECT_THROW_MSG(ops::mse(a, a3), InvalidArgument,
                   "ops::mse: target: expected [2, 2] (the shape of input), got [3, 2]");
  EXPECT_THROW_MSG(ops::mse_backward(a, a, a, 1.0f), InvalidArgument,
                   "ops::mse_backward: grad_loss: expected a one-element (0-dim) f32 tensor");
}

TEST_F(OpsErrors, CrossEntropyTargets) {
  const std::int64_t N = 9, C = 10;
  Tensor logits = Tensor::zeros({N, C}, DType::f32, sim_device(0));
  std::vector<std::int64_t> t = {0, 1, 2, 3, 4, 5, 6, 12, 9};
  Tensor targets = Tensor::from_vector(t, {N}, sim_device(0));
  EXPECT_THROW_MSG(ops::cross_entropy(logits, targets), InvalidArgument,
                   "ops::cross_entropy: targets[7] = 12 out of range [0, 10)");
  t[7] = -1;
  EXPECT_THROW_MSG(ops::cross_entropy_backward(logits, Tensor::from_vector(t, {N}, sim_device(0)),
                                               Tensor::full({}, 1.0f, sim_device(0)), 1.0f),
                   InvalidArgument,
                   "ops::cross_entropy_backward: targets[7] = -1 out of range [0, 10)");
  EXPECT_THROW_MSG(ops::cross_entropy(logits, Tensor::zeros({N}, DType::f32, sim_device(0))),
                   InvalidArgument, "ops::cross_entropy: targets: expected dtype i64, got [9] f32");
  EXPECT_THROW_MSG(
      ops::cross_entropy(logits, Tensor::zeros({N - 1}, DType::i64, sim_device(0))),
      InvalidArgument,
      "ops::cross_entropy: targets: expected [N] = [9] for logits of [9, 10], got [8] i64");
  EXPECT_THROW_MSG(
      ops::cross_entropy(logits, Tensor::zeros({N}, DType::i64, sim_device(1))), InvalidArgument,
      "ops::cross_entropy: targets: expected a tensor on sim:0 (the device of logits)");
}

TEST_F(OpsErrors, SumInputs) {
  Tensor out = Tensor::zeros({4}, DType::f32, sim_device(0));
  std::vector<Tensor> none;
  EXPECT_THROW_MSG(ops::sum_inputs(none, out, Determinism::bitwise), InvalidArgument,
                   "ops::sum_inputs: inputs: expected at least one tensor, got none");
  std::vector<Tensor> bad_shape = {Tensor::zeros({4}, DType::f32, sim_device(0)),
                                   Tensor::zeros({5}, DType::f32, sim_device(0))};
  EXPECT_THROW_MSG(ops::sum_inputs(bad_shape, out, Determinism::bitwise), InvalidArgument,
                   "ops::sum_inputs: inputs[1]: expected [4] (the shape of out), got [5]");
  std::vector<Tensor> bad_dev = {Tensor::zeros({4}, DType::f32, sim_device(1))};
  EXPECT_THROW_MSG(ops::sum_inputs(bad_dev, out, Determinism::bitwise), InvalidArgument,
                   "ops::sum_inputs: inputs[0]: expected a tensor on sim:0 (the device of out)");
  std::vector<Tensor> aliased = {Tensor::zeros({4}, DType::f32, sim_device(0)), out};
  EXPECT_THROW_MSG(ops::sum_inputs(aliased, out, Determinism::bitwise), InvalidArgument,
                   "ops::sum_inputs: out: must not share memory with inputs[1]");
}

}  // namespace
}  // namespace ditto
