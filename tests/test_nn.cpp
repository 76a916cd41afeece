// nn layers and losses: values against an independent double-precision host computation, gradients
// against central finite differences of that computation, Linear's Philox initialisation, the
// containers (Sequential, mlp, WithLoss) and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/nn/relu.h"
#include "core/nn/sequential.h"
#include "core/nn/with_loss.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using Vec = std::vector<double>;

class NNTest : public SimSuite<16> {
 protected:
  static Device dev(int i = 0) { return Device("sim", i); }
};

// Deterministic test values in [lo, hi) (Philox, synthetic stream `sub`).
std::vector<float> values(std::int64_t n, std::uint64_t sub, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] =
        uniform(99, stream_id(kStreamSynthetic, sub), static_cast<std::uint64_t>(i), lo, hi);
  return v;
}
Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
Vec host(const Tensor& t) { return to_double(t.to_vector<float>()); }

// ---- independent host reference: an MLP in double --------------------------------------------

// Linear layers (W [out, in] row-major, b [out]) with ReLU between consecutive ones.
struct HostMlp {
  std::vector<std::int64_t> sizes;
  std::vector<Vec> W, b;

  Vec forward(const Vec& x, std::int64_t n) const {
    Vec a = x;
    for (std::size_t l = 0; l < W.size(); ++l) {
      const std::int64_t in = sizes[l], out = sizes[l + 1];
      Vec y(static_cast<std::size_t>(n * out));
      for (std::int64_t r = 0; r < n; ++r)
        for (std::int64_t o = 0; o < out; ++o) {
          double s = b[l][static_cast<std::size_t>(o)];
          for (std::int64_t k = 0; k < in; ++k)
            s += a[static_cast<std::size_t>(r * in + k)] *
                 W[l][static_cast<std::size_t>(o * in + k)];
          if (l + 1 < W.size()) s = std::max(s, 0.0);
          y[static_cast<std::size_t>(r * out + o)] = s;
        }
      a = std::move(y);
    }
    return a;
  }
};

HostMlp host_copy(nn::Module& m, const std::vector<std::int64_t>& sizes) {
  HostMlp h;
  h.sizes = sizes;
  auto ps = m.parameters();
  for (std::size_t i = 0; i < ps.size(); i += 2) {
    h.W.push_back(host(ps[i]->data));
    h.b.push_back(host(ps[i + 1]->data));
  }
  return h;
}

double host_mse(const Vec& y, const Vec& t) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += (y[i] - t[i]) * (y[i] - t[i]);
  return s / static_cast<double>(y.size());
}

double host_cross_entropy(const Vec& logits, const std::vector<std::int64_t>& t, std::int64_t c) {
  double total = 0;
  const auto n = static_cast<std::int64_t>(t.size());
  for (std::int64_t r = 0; r < n; ++r) {
    double mx = -1e300;
    for (std::int64_t j = 0; j < c; ++j)
      mx = std::max(mx, logits[static_cast<std::size_t>(r * c + j)]);
    double se = 0;
    for (std::int64_t j = 0; j < c; ++j)
      se += std::exp(logits[static_cast<std::size_t>(r * c + j)] - mx);
    total += mx + std::log(se) -
             logits[static_cast<std::size_t>(r * c + t[static_cast<std::size_t>(r)])];
  }
  return total / static_cast<double>(n);
}

double central_difference(Vec& v, std::size_t i, const std::function<double()>& f) {
  const double eps = 1e-6, keep = v[i];
  v[i] = keep + eps;
  const double up = f();
  v[i] = keep - eps;
  const double down = f();
  v[i] = keep;
  return (up - down) / (2 * eps);
}

// Every element of `analytic` agrees with the finite difference of `loss` w.r.t. `v`.
void expect_grad(const char* what, const Vec& analytic, Vec& v,
                 const std::function<double()>& loss) {
  ASSERT_EQ(analytic.size(), v.size()) << what;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const double fd = central_difference(v, i, loss);
    EXPECT_NEAR(analytic[i], fd, 2e-4 + 2e-4 * std::abs(fd)) << what << "[" << i << "]";
  }
}

// ---- Linear ----------------------------------------------------------------------------------

TEST_F(NNTest, LinearInitIsPhiloxUniformWithinBound) {
  nn::Linear a(16, 8, dev(), 1234, 3);
  const float bound = 0.25f;  // 1/sqrt(16)
  auto w = a.weight().data.to_vector<float>(), b = a.bias().data.to_vector<float>();
  ASSERT_EQ(a.weight().data.shape(), (Shape{8, 16}));
  ASSERT_EQ(a.bias().data.shape(), (Shape{8}));
  float lo = 1, hi = -1;
  for (std::size_t i = 0; i < w.size(); ++i) {
    ASSERT_GE(w[i], -bound);
    ASSERT_LT(w[i], bound);
    ASSERT_EQ(w[i], uniform(1234, stream_id(kStreamInit, 3), i, -bound, bound));
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  EXPECT_LT(lo, -0.8f * bound);
  EXPECT_GT(hi, 0.8f * bound);
  for (std::size_t j = 0; j < b.size(); ++j)
    EXPECT_EQ(b[j], uniform(1234, stream_id(kStreamInit, 3), 128 + j, -bound, bound));
  EXPECT_EQ(a.weight().name, "weight");
  EXPECT_EQ(a.bias().name, "bias");
}

TEST_F(NNTest, LinearInitDependsOnSeedAndLayerNotDevice) {
  auto w = [](std::uint64_t seed, std::uint64_t layer, int d) {
    return nn::Linear(5, 3, Device("sim", d), seed, layer).weight().data.to_vector<float>();
  };
  EXPECT_EQ(w(7, 0, 0), w(7, 0, 5));
  EXPECT_NE(w(7, 0, 0), w(8, 0, 0));
  EXPECT_NE(w(7, 0, 0), w(7, 1, 0));
}

TEST_F(NNTest, LinearForwardMatchesHost) {
  nn::Linear lin(6, 4, dev(2), 5);
  auto xv = values(3 * 6, 1);
  Tensor y = lin.forward(Tensor::from_vector(xv, {3, 6}, dev(2)));
  ASSERT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_EQ(y.device(), dev(2));
  Vec expect = host_copy(lin, {6, 4}).forward(to_double(xv), 3);
  Vec got = host(y);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expect[i], 1e-6) << i;
}

TEST_F(NNTest, LinearBitwiseIsAscendingFmaChainPlusBias) {
  nn::Linear lin(7, 3, dev(), 5);
  lin.set_determinism(Determinism::bitwise);
  const std::int64_t n = 4;
  lin.set_micro_shards({0, n});  // one micro-shard: the batch reduction is one ascending chain
  auto xv = values(n * 7, 2), gv = values(n * 3, 3);
  Tensor x = Tensor::from_vector(xv, {n, 7}, dev());
  auto w = lin.weight().data.to_vector<float>(), b = lin.bias().data.to_vector<float>();
  auto y = lin.forward(x).to_vector<float>();
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t o = 0; o < 3; ++o) {
      float acc = 0.0f;
      for (std::int64_t k = 0; k < 7; ++k) acc = std::fma(xv[r * 7 + k], w[o * 7 + k], acc);
      EXPECT_EQ(y[r * 3 + o], acc + b[o]) << r << "," << o;
    }
  lin.backward(Tensor::from_vector(gv, {n, 3}, dev()));
  auto gw = lin.weight().grad.to_vector<float>(), gb = lin.bias().grad.to_vector<float>();
  for (std::int64_t o = 0; o < 3; ++o) {
    float sb = 0.0f;
    for (std::int64_t r = 0; r < n; ++r) sb = sb + gv[r * 3 + o];
    EXPECT_EQ(gb[o], sb) << o;
    for (std::int64_t k = 0; k < 7; ++k) {
      float acc = 0.0f;
      for (std::int64_t r = 0; r < n; ++r) acc = std::fma(gv[r * 3 + o], xv[r * 7 + k], acc);
      EXPECT_EQ(gw[o * 7 + k], acc) << o << "," << k;
    }
  }
}

TEST_F(NNTest, LinearBitwiseBatchReductionFollowsTheMicroShardTree) {
  // Default micro-shards: K = 64 over the batch; each shard an ascending fma chain from zero,
  // shards combined by the canonical tree (Note [Micro-shards]).
  nn::Linear lin(5, 2, dev(), 6);
  lin.set_determinism(Determinism::bitwise);
  const std::int64_t n = 100;
  auto xv = values(n * 5, 8), gv = values(n * 2, 9);
  for (std::size_t i = 0; i < xv.size(); i += 3) xv[i] *= 1e4f;  // mixed magnitudes
  lin.forward(Tensor::from_vector(xv, {n, 5}, dev()));
  lin.backward(Tensor::from_vector(gv, {n, 2}, dev()));
  auto gw = lin.weight().grad.to_vector<float>();
  std::vector<std::int64_t> bounds = micro_shard_bounds(n, kDefaultMicroShards);
  std::size_t differs_from_chain = 0;
  for (std::int64_t o = 0; o < 2; ++o)
    for (std::int64_t k = 0; k < 5; ++k) {
      std::function<float(std::int64_t, std::int64_t)> tree = [&](std::int64_t lo,
                                                                  std::int64_t hi) {
        if (hi - lo == 1) {
          float acc = 0.0f;
          for (std::int64_t r = bounds[lo]; r < bounds[lo + 1]; ++r)
            acc = std::fma(gv[r * 2 + o], xv[r * 5 + k], acc);
          return acc;
        }
        std::int64_t mid = tree_mid(lo, hi);
        return tree(lo, mid) + tree(mid, hi);
      };
      EXPECT_EQ(gw[o * 5 + k], tree(0, kDefaultMicroShards)) << o << "," << k;
      float chain = 0.0f;
      for (std::int64_t r = 0; r < n; ++r) chain = std::fma(gv[r * 2 + o], xv[r * 5 + k], chain);
      differs_from_chain += chain != gw[o * 5 + k];
    }
  EXPECT_GT(differs_from_chain, 0u);  // the order matters on these inputs
}

TEST_F(NNTest, LinearGradientsMatchFiniteDifferences) {
  const std::int64_t n = 5, in = 4, out = 3;
  nn::Linear lin(in, out, dev(), 11);
  auto xv = values(n * in, 4), rv = values(n * out, 5);
  lin.forward(Tensor::from_vector(xv, {n, in}, dev()));
  // L = sum(y * R), so dL/dy = R.
  Tensor gx = lin.backward(Tensor::from_vector(rv, {n, out}, dev()));
  HostMlp h = host_copy(lin, {in, out});
  Vec x = to_double(xv), r = to_double(rv);
  auto loss = [&] {
    Vec y = h.forward(x, n);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
    return s;
  };
  expect_grad("grad_W", host(lin.weight().grad), h.W[0], loss);
  expect_grad("grad_b", host(lin.bias().grad), h.b[0], loss);
  expect_grad("grad_x", host(gx), x, loss);
}

TEST_F(NNTest, LinearAccumulatesGradsAndSkipsInputGradOnRequest) {
  nn::Linear lin(3, 2, dev(), 1);
  Tensor x = Tensor::from_vector(values(6, 6), {2, 3}, dev());
  Tensor g = Tensor::from_vector(values(4, 7), {2, 2}, dev());
  lin.forward(x);
  EXPECT_TRUE(lin.backward(g).defined());
  Vec w1 = host(lin.weight().grad), b1 = host(lin.bias().grad);
  lin.set_input_requires_grad(false);
  lin.forward(x);
  EXPECT_FALSE(lin.backward(g).defined());
  Vec w2 = host(lin.weight().grad), b2 = host(lin.bias().grad);
  for (std::size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(w2[i], 2 * w1[i], 1e-6);
  for (std::size_t i = 0; i < b1.size(); ++i) EXPECT_NEAR(b2[i], 2 * b1[i], 1e-6);
  lin.zero_grad();
  for (double v : host(lin.weight().grad)) EXPECT_EQ(v, 0.0);
}

TEST_F(NNTest, LinearErrors) {
  nn::Linear lin(64, 128, dev(), 0);
  expect_invalid(
      [&] {
        lin.forward(Tensor::zeros({32, 10}, DType::f32, dev()));
      },
      "Linear(64, 128).forward: input: expected [N, 64], got [32, 10] f32 on sim:0");
  expect_invalid(
      [&] {
        lin.forward(Tensor::zeros({2, 64}, DType::f32, dev(1)));
      },
      "Linear(64, 128).forward: input: expected a tensor on sim:0 (the layer's "
      "device), got [2, 64] f32 on sim:1");
  expect_invalid(
      [&] {
        lin.backward(Tensor::zeros({2, 128}, DType::f32, dev()));
      },
      "Linear(64, 128).backward: no forward to go back through (call forward first; each forward "
      "allows one backward)");
  lin.forward(Tensor::zeros({2, 64}, DType::f32, dev()));
  expect_invalid(
      [&] {
        lin.backward(Tensor::zeros({3, 128}, DType::f32, dev()));
      },
      "Linear(64, 128).backward: grad_output: expected [2, 128] f32 (or bf16 / f16), got [3, 128]");
  expect_invalid([&] { nn::Linear(0, 3, dev(), 0); },
                 "Linear: expected in_features >= 1 and out_features >= 1, got in_features = 0");
}

// Regression (UBSan, ASan): in_features * out_features was multiplied unchecked, and the weights
// were built in a host vector before the device was asked for memory, so a layer larger than the
// device failed with the host's std::bad_alloc (under ASan: an abort) instead of OutOfMemory.
TEST_F(NNTest, LinearTooLargeFailsOnTheDeviceWithoutHostAllocation) {
  Backend& sim = get_backend("sim");
  sim.default_stream(3).synchronize();
  const std::size_t in_use_before = sim.memory_stats(3).in_use;
  const std::int64_t big = std::int64_t(1) << 40;
  expect_invalid([&] { nn::Linear(big, big, dev(3), 0); },
                 "Linear: expected in_features * out_features <= 9223372036854775807, got "
                 "in_features = 1099511627776, out_features = 1099511627776");
  // 2^40 weights are 4 TiB: more than the device's 80 GiB.
  const std::int64_t side = std::int64_t(1) << 20;
  expect_error<OutOfMemory>([&] { nn::Linear(side, side, dev(3), 0); },
                            "sim:3: out of memory: tried to allocate");
  // The failed layers left nothing allocated.
  sim.default_stream(3).synchronize();
  EXPECT_EQ(sim.memory_stats(3).in_use, in_use_before);
}

// ---- ReLU ------------------------------------------------------------------------------------

TEST_F(NNTest, ReLUForwardAndBackward) {
  std::vector<float> xv = {-2.0f, -0.5f, 0.25f, 3.0f, -1.0f, 4.0f};
  std::vector<float> gv = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  nn::ReLU relu;
  Tensor y = relu.forward(Tensor::from_vector(xv, {2, 3}, dev()));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 0, 0.25f, 3.0f, 0, 4.0f}));
  Tensor gx = relu.backward(Tensor::from_vector(gv, {2, 3}, dev()));
  EXPECT_EQ(gx.to_vector<float>(), (std::vector<float>{0, 0, 3.0f, 4.0f, 0, 6.0f}));
  relu.forward(Tensor::from_vector(xv, {2, 3}, dev()));  // each forward allows one backward
  expect_invalid(
      [&] {
        relu.backward(Tensor::zeros({3, 2}, DType::f32, dev()));
      },
      "ReLU.backward: grad_output: expected [2, 3] f32");
  relu.set_input_requires_grad(false);
  EXPECT_FALSE(relu.backward(Tensor::from_vector(gv, {2, 3}, dev())).defined());
}

// ---- Sequential and mlp ----------------------------------------------------------------------

TEST_F(NNTest, MlpStructureNamesAndSettings) {
  auto net = nn::mlp({4, 8, 8, 3}, dev(1), 42);
  ASSERT_EQ(net->size(), 5u);
  EXPECT_EQ((*net)[0].name(), "Linear");
  EXPECT_EQ((*net)[1].name(), "ReLU");
  std::vector<std::string> names;
  for (auto* p : net->parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                             "4.bias"}));
  EXPECT_EQ(net->num_parameters(), 4 * 8 + 8 + 8 * 8 + 8 + 8 * 3 + 3);
  EXPECT_EQ(net->device(), dev(1));
  EXPECT_FALSE(net->input_requires_grad());
  EXPECT_FALSE((*net)[0].input_requires_grad());
  EXPECT_TRUE((*net)[2].input_requires_grad());
  // Distinct per-layer streams: the layers' first weights differ from layer-0 draws.
  auto& l2 = static_cast<nn::Linear&>((*net)[2]);
  EXPECT_EQ(l2.weight().data.to_vector<float>()[0],
            uniform(42, stream_id(kStreamInit, 1), 0, -1 / std::sqrt(8.0f), 1 / std::sqrt(8.0f)));
  net->set_determinism(Determinism::bitwise);
  for (std::size_t i = 0; i < net->size(); ++i)
    EXPECT_EQ((*net)[i].determinism(), Determinism::bitwise);
  expect_invalid([] { nn::mlp({4}, Device("sim", 0), 0); },
                 "nn::mlp: sizes: expected at least 2 sizes (in, out), got 1");
  expect_invalid([] { nn::Sequential().forward(Tensor::zeros({1}, DType::f32, Device("sim", 0))); },
                 "Sequential.forward: the container is empty");
}

TEST_F(NNTest, SequentialCloneSharesDataWithFreshGrads) {
  auto net = nn::mlp({3, 5, 2}, dev(), 9);
  net->set_determinism(Determinism::bitwise);
  Tensor x = Tensor::from_vector(values(4 * 3, 8), {4, 3}, dev());
  net->forward(x);
  net->backward(Tensor::from_vector(values(4 * 2, 9), {4, 2}, dev()));
  auto copy = net->clone();
  auto a = net->parameters(), b = copy->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(a[i]->data.data_ptr(), b[i]->data.data_ptr());
    EXPECT_NE(a[i], b[i]);
    EXPECT_TRUE(a[i]->grad.defined());
    EXPECT_FALSE(b[i]->grad.defined());
  }
  EXPECT_EQ(copy->determinism(), Determinism::bitwise);
  EXPECT_FALSE(copy->input_requires_grad());
  EXPECT_EQ(copy->forward(x).to_vector<float>(), net->forward(x).to_vector<float>());
  // to() moves this module's parameters only; the clone keeps the shared originals.
  copy->to(dev(4));
  EXPECT_EQ(copy->device(), dev(4));
  EXPECT_EQ(net->device(), dev());
}

// The gradients of a 2-layer MLP's parameters and of its input x against central differences of
// the host loss f.
void expect_mlp_grads(nn::Module& net, HostMlp& h, const Tensor& gx, Vec& x,
                      const std::function<double()>& f) {
  auto ps = net.parameters();
  expect_grad("0.weight", host(ps[0]->grad), h.W[0], f);
  expect_grad("0.bias", host(ps[1]->grad), h.b[0], f);
  expect_grad("2.weight", host(ps[2]->grad), h.W[1], f);
  expect_grad("2.bias", host(ps[3]->grad), h.b[1], f);
  expect_grad("input", host(gx), x, f);
}

TEST_F(NNTest, MlpWithMSELossGradientsMatchFiniteDifferences) {
  const std::int64_t n = 5;
  const std::vector<std::int64_t> sizes = {4, 6, 3};
  auto net = nn::mlp(sizes, dev(), 3);
  net->set_input_requires_grad(true);
  nn::MSELoss mse;
  auto xv = values(n * 4, 10), tv = values(n * 3, 11);
  Tensor out = net->forward(Tensor::from_vector(xv, {n, 4}, dev()));
  Tensor loss = mse.forward(out, Tensor::from_vector(tv, {n, 3}, dev()));
  EXPECT_EQ(loss.dim(), 0);
  Tensor gx = net->backward(mse.backward());
  HostMlp h = host_copy(*net, sizes);
  Vec x = to_double(xv), t = to_double(tv);
  auto f = [&] { return host_mse(h.forward(x, n), t); };
  EXPECT_NEAR(loss.item(), f(), 1e-6);
  expect_mlp_grads(*net, h, gx, x, f);
}

TEST_F(NNTest, MlpWithCrossEntropyGradientsMatchFiniteDifferences) {
  const std::int64_t n = 6, c = 4;
  const std::vector<std::int64_t> sizes = {5, 7, c};
  auto net = nn::mlp(sizes, dev(3), 4);
  net->set_input_requires_grad(true);
  nn::CrossEntropyLoss ce;
  auto xv = values(n * 5, 12, -2.0f, 2.0f);
  std::vector<std::int64_t> tv = {0, 3, 1, 2, 3, 0};
  Tensor loss = ce.forward(net->forward(Tensor::from_vector(xv, {n, 5}, dev(3))),
                           Tensor::from_vector(tv, {n}, dev(3)));
  Tensor gx = net->backward(ce.backward());
  HostMlp h = host_copy(*net, sizes);
  Vec x = to_double(xv);
  auto f = [&] { return host_cross_entropy(h.forward(x, n), tv, c); };
  EXPECT_NEAR(loss.item(), f(), 1e-6);
  expect_mlp_grads(*net, h, gx, x, f);
}

// ---- losses ----------------------------------------------------------------------------------

TEST_F(NNTest, MSELossValueAndGradLossScaling) {
  std::vector<float> yv = {1.0f, 2.0f, 3.0f, 4.0f}, tv = {0.0f, 2.0f, 5.0f, 3.0f};
  for (Determinism d : {Determinism::fast, Determinism::bitwise}) {
    nn::MSELoss mse;
    mse.set_determinism(d);
    Tensor y = Tensor::from_vector(yv, {2, 2}, dev()), t = Tensor::from_vector(tv, {2, 2}, dev());
    EXPECT_FLOAT_EQ(mse.forward(y, t).item(), (1.0f + 0 + 4 + 1) / 4);
    // d/dy mean((y-t)^2) = 2 (y - t) / 4
    EXPECT_EQ(mse.backward().to_vector<float>(), (std::vector<float>{0.5f, 0.0f, -1.0f, 0.5f}));
    mse.forward(y, t);  // each forward allows one backward
    EXPECT_EQ(mse.backward(Tensor::full({}, 2.0f, dev())).to_vector<float>(),
              (std::vector<float>{1.0f, 0.0f, -2.0f, 1.0f}));
  }
  nn::MSELoss mse;
  // 1-dim input (regression outputs of shape [N]).
  EXPECT_FLOAT_EQ(mse.forward(Tensor::from_vector(std::vector<float>{1, 3}, {2}, dev()),
                              Tensor::from_vector(std::vector<float>{0, 0}, {2}, dev()))
                      .item(),
                  5.0f);
  expect_invalid(
      [&] {
        mse.forward(Tensor::zeros({2, 2}, DType::f32, dev()),
                    Tensor::zeros({2, 3}, DType::f32, dev()));
      },
      "MSELoss.forward: target: expected [2, 2] f32 (or bf16 / f16) on sim:0 (the input's shape and "
      "device), got [2, 3] f32 on sim:0");
  expect_invalid([&] { nn::MSELoss().backward(); },
                 "MSELoss.backward: no forward to go back through");
  expect_invalid([&] { mse.backward(Tensor::full({2}, 1.0f, dev())); },
                 "MSELoss.backward: grad_loss: expected a 0-dim f32 tensor on sim:0, got [2]");
}

TEST_F(NNTest, CrossEntropyValueAndErrors) {
  // logits [[0, ln 3], [0, 0]], targets [1, 0]: losses ln(4/3), ln 2.
  std::vector<float> lv = {0.0f, std::log(3.0f), 0.0f, 0.0f};
  nn::CrossEntropyLoss ce;
  Tensor logits = Tensor::from_vector(lv, {2, 2}, dev());
  Tensor loss =
      ce.forward(logits, Tensor::from_vector(std::vector<std::int64_t>{1, 0}, {2}, dev()));
  EXPECT_NEAR(loss.item(), (std::log(4.0 / 3.0) + std::log(2.0)) / 2, 1e-6);
  // softmax - onehot, divided by N = 2
  Vec g = host(ce.backward());
  const double expect[] = {0.125, -0.125, -0.25, 0.25};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(g[i], expect[i], 1e-6) << i;

  expect_invalid(
      [&] {
        ce.forward(logits, Tensor::from_vector(std::vector<std::int64_t>{1, 7}, {2}, dev()));
      },
      "CrossEntropyLoss.forward: ops::cross_entropy: targets[1] = 7 out of range [0, 2)");
  expect_invalid(
      [&] {
        ce.forward(logits, Tensor::from_vector(std::vector<std::int64_t>{-1, 0}, {2}, dev()));
      },
      "targets[0] = -1 out of range [0, 2)");
  expect_invalid(
      [&] {
        ce.forward(logits, Tensor::from_vector(std::vector<float>{1, 0}, {2}, dev()));
      },
      "CrossEntropyLoss.forward: target: expected [2] i64 on sim:0 (class indices, one "
      "per row of input), got [2] f32 on sim:0");
  expect_invalid(
      [&] {
        ce.forward(Tensor::zeros({4}, DType::f32, dev()), Tensor::zeros({4}, DType::i64, dev()));
      },
      "CrossEntropyLoss.forward: input: expected logits [N, C] f32 (or bf16 / f16), got [4] f32");
}

// Issue 16, defect 8: clone() kept neither set_global_batch nor the determinism, so a copy of a
// loss over 2 rows of a global batch of 10 divided by 2 (0.6789) where the original divided by
// 10 (0.1358): DataParallel's replicas of a WithLoss took the wrong mean.
TEST_F(NNTest, LossCloneKeepsTheGlobalBatchAndTheDeterminism) {
  Tensor x = Tensor::from_vector(values(2 * 3, 17), {2, 3}, dev());
  Tensor t = Tensor::from_vector(std::vector<std::int64_t>{2, 0}, {2}, dev());
  nn::CrossEntropyLoss ce;
  const float own_rows = ce.forward(x, t).item();
  ce.set_global_batch(10);
  ce.set_determinism(Determinism::bitwise);
  const float of_ten = ce.forward(x, t).item();
  EXPECT_NEAR(of_ten, own_rows * 2 / 10, 1e-6f);
  std::unique_ptr<nn::Loss> copy = ce.clone();
  EXPECT_EQ(copy->global_batch(), 10);
  EXPECT_EQ(copy->determinism(), Determinism::bitwise);
  EXPECT_EQ(copy->forward(x, t).item(), of_ten);

  Tensor y_half = Tensor::from_vector(values(2 * 3, 18), {2, 3}, dev());
  nn::MSELoss mse;
  mse.set_global_batch(10);
  mse.set_determinism(Determinism::bitwise);
  const float mse_of_ten = mse.forward(x, y_half).item();
  std::unique_ptr<nn::Loss> mse_copy = mse.clone();
  EXPECT_EQ(mse_copy->global_batch(), 10);
  EXPECT_EQ(mse_copy->determinism(), Determinism::bitwise);
  EXPECT_EQ(mse_copy->forward(x, y_half).item(), mse_of_ten);

  // A WithLoss's clone (DataParallel's replicas) keeps its loss's global batch.
  auto loss = std::make_unique<nn::CrossEntropyLoss>();
  loss->set_global_batch(10);
  nn::WithLoss wl(nn::mlp({3, 4, 3}, dev(), 21), std::move(loss));
  std::unique_ptr<nn::Module> wl_copy = wl.clone();
  EXPECT_EQ(static_cast<nn::WithLoss&>(*wl_copy).loss().global_batch(), 10);
  EXPECT_EQ(wl_copy->forward({x, t}).item(), wl.forward({x, t}).item());
}

// Note [Empty replica loss]: a mean over no samples is NaN, as torch's (issue 29: it was 0), its
// gradient empty; a replica's share of no rows of a global batch (set_global_batch) adds 0.
TEST_F(NNTest, LossOverNoSamplesIsNanAsTorchsAndZeroAsAShareOfAGlobalBatch) {
  nn::CrossEntropyLoss ce;
  const float l =
      ce.forward(Tensor::zeros({0, 3}, DType::f32, dev()), Tensor::zeros({0}, DType::i64, dev()))
          .item();
  EXPECT_TRUE(std::isnan(l)) << l;
  EXPECT_EQ(ce.backward().shape(), (Shape{0, 3}));
  nn::MSELoss mse;
  EXPECT_TRUE(std::isnan(mse.forward(Tensor::zeros({0, 3}, DType::f32, dev()),
                                     Tensor::zeros({0, 3}, DType::f32, dev()))
                             .item()));
  ce.set_global_batch(4);
  EXPECT_EQ(
      ce.forward(Tensor::zeros({0, 3}, DType::f32, dev()), Tensor::zeros({0}, DType::i64, dev()))
          .item(),
      0.0f);
  EXPECT_EQ(ce.backward().shape(), (Shape{0, 3}));
}

// Note [Evaluation in pieces]: a loss's row terms computed in pieces and put end to end give,
// through mean_of_row_terms, the bits of forward over the whole batch ([B, T, C] cross-entropy
// and [N, F] MSE, both modes, 64 samples over the 16 micro-shards), and a user's loss has none,
// nor a subclass of a built-in one.
TEST_F(NNTest, RowTermsInPiecesGiveTheBitsOfTheWholeBatchsMean) {
  const std::int64_t B = 64, T = 3, C = 5, F = 4;
  Tensor logits = Tensor::from_vector(values(B * T * C, 31), {B, T, C}, dev());
  std::vector<std::int64_t> ids(static_cast<std::size_t>(B * T));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 7) % C);
  Tensor targets = Tensor::from_vector(ids, {B, T}, dev());
  Tensor x = Tensor::from_vector(values(B * F, 32), {B, F}, dev());
  Tensor y = Tensor::from_vector(values(B * F, 33), {B, F}, dev());
  for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
    nn::CrossEntropyLoss ce;
    nn::MSELoss mse;
    ce.set_determinism(mode);
    mse.set_determinism(mode);
    EXPECT_TRUE(ce.has_row_terms());
    auto in_pieces = [&](nn::Loss& loss, const Tensor& in, const Tensor& tgt, nn::RowTerms& how) {
      std::vector<float> all;
      for (std::int64_t lo = 0; lo < B; lo += 24) {  // pieces of 24, 24 and 16 samples
        const std::int64_t n = std::min<std::int64_t>(24, B - lo);
        const std::vector<float> v =
            loss.row_terms(in.narrow(lo, n), tgt.narrow(lo, n), how).to_vector<float>();
        all.insert(all.end(), v.begin(), v.end());
      }
      return Tensor::from_vector(all, {static_cast<std::int64_t>(all.size())}, dev());
    };
    nn::RowTerms how;
    const Tensor ce_terms = in_pieces(ce, logits, targets, how);
    EXPECT_EQ(how.rows_per_sample, T);
    EXPECT_EQ(how.elements_per_row, 1);
    EXPECT_EQ(ce_terms.size(0), B * T);
    EXPECT_EQ(test::bits(ce.mean_of_row_terms(ce_terms, how).item()),
              test::bits(ce.forward(logits, targets).item()));
    const Tensor mse_terms = in_pieces(mse, x, y, how);
    EXPECT_EQ(how.rows_per_sample, 1);
    EXPECT_EQ(how.elements_per_row, F);
    EXPECT_EQ(test::bits(mse.mean_of_row_terms(mse_terms, how).item()),
              test::bits(mse.forward(x, y).item()));
    // Forward's checks, under row_terms' name; a layout that does not divide the rows.
    test::expect_invalid([&] { ce.row_terms(logits, targets.narrow(0, 2), how); },
                         "CrossEntropyLoss.row_terms: target: expected [64, 3] i64");
    test::expect_invalid([&] { mse.row_terms(x, y.narrow(0, 2), how); },
                         "MSELoss.row_terms: target: expected [64, 4]");
    test::expect_invalid(
        [&] {
          ce.mean_of_row_terms(ce_terms.narrow(0, 7), {T, 1});
        },
        "Loss::mean_of_row_terms: how: expected rows_per_sample >= 1 dividing "
        "the 7 rows");
  }
  struct Plain : nn::LossOf<Plain> {  // a user's loss
    Tensor forward(const Tensor& in, const Tensor&) override { return in; }
    Tensor backward(const Tensor& g) override { return g; }
  } plain;
  nn::RowTerms how;
  EXPECT_FALSE(plain.has_row_terms());
  EXPECT_FALSE(plain.row_terms(x, y, how).defined());
  // A subclass may compute another loss in its forward (label smoothing): no row terms of its
  // base's unless it says so (the review's finding: it inherited CrossEntropyLoss's).
  struct Smoothed : nn::CrossEntropyLoss {
    Tensor forward(const Tensor& in, const Tensor& t) override {
      return nn::CrossEntropyLoss::forward(in, t);
    }
  } smoothed;
  EXPECT_FALSE(smoothed.has_row_terms());
  EXPECT_TRUE(nn::MSELoss().has_row_terms());
}

// ---- WithLoss --------------------------------------------------------------------------------

TEST_F(NNTest, WithLossMatchesModelThenLoss) {
  const std::int64_t n = 4;
  Tensor x = Tensor::from_vector(values(n * 3, 13), {n, 3}, dev());
  Tensor t = Tensor::from_vector(std::vector<std::int64_t>{2, 0, 1, 1}, {n}, dev());
  auto ref = nn::mlp({3, 4, 3}, dev(), 21);
  nn::CrossEntropyLoss ce;
  float ref_loss = ce.forward(ref->forward(x), t).item();
  ref->backward(ce.backward());

  nn::WithLoss wl(nn::mlp({3, 4, 3}, dev(), 21), std::make_unique<nn::CrossEntropyLoss>());
  EXPECT_EQ(wl.num_inputs(), 2);
  EXPECT_EQ(wl.name(), "WithLoss");
  Tensor loss = wl.forward({x, t});
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.item(), ref_loss);
  EXPECT_FALSE(wl.backward(Tensor::full({}, 1.0f, dev())).defined());  // mlp: no input grad
  auto a = ref->parameters(), b = wl.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i]->grad.to_vector<float>(), b[i]->grad.to_vector<float>()) << a[i]->name;

  auto c = wl.clone();
  EXPECT_EQ(c->num_inputs(), 2);
  EXPECT_EQ(c->forward({x, t}).item(), ref_loss);
  wl.set_determinism(Determinism::bitwise);
  EXPECT_EQ(wl.model().determinism(), Determinism::bitwise);
  EXPECT_EQ(wl.loss().determinism(), Determinism::bitwise);

  expect_invalid([&] { wl.forward(x); }, "WithLoss.forward: takes 2 inputs, got 1");
  expect_invalid([&] { wl.forward(std::vector<Tensor>{x}); },
                 "WithLoss.forward: takes 2 inputs (input, target), got 1");
  expect_invalid(
      [&] {
        nn::Linear(3, 3, dev(), 0).forward(std::vector<Tensor>{x, t});
      },
      "Linear.forward: takes 1 input, got 2");
  expect_invalid([] { nn::WithLoss(nullptr, std::make_unique<nn::MSELoss>()); },
                 "WithLoss: model: expected a module, got null");
}

}  // namespace
}  // namespace ditto
