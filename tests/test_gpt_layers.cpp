// The GPT's layers (core/nn/gpt_layers.h, attention.h, linear.h, init.h, loss.h): gradients
// against central finite differences (method and tolerances: tests/gpt_test_util.h), nanoGPT's
// normal init against an independent double-precision polar method, Linear on [B, T, C] and
// without bias, CrossEntropyLoss on [B, T, V], dropout masks keyed by the global row.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/nn/attention.h"
#include "core/nn/gpt.h"
#include "core/nn/gpt_layers.h"
#include "core/nn/init.h"
#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/nn/relu.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/runtime/ops.h"
#include "gpt_test_util.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class GptLayers : public SimSuite<8> {
 protected:
  static Device dev() { return Device("sim", 0); }
  static Tensor act(const Shape& s, std::uint64_t sub, float lo = -1.0f, float hi = 1.0f) {
    return Tensor::from_vector(seeded(shape_numel(s), sub, lo, hi), s, dev());
  }
  // Every parameter replaced by seeded values (weights [-0.5, 0.5), 1-D parameters around 1 for
  // LayerNorm weights): the check runs away from the special point of the init (zero biases, unit
  // LayerNorm weights, near-zero attention logits).
  static void randomize(nn::Module& m, std::uint64_t sub) {
    for (nn::Parameter* p : m.parameters()) {
      const bool ln_weight =
          p->name.find("ln") != std::string::npos && p->name.find("weight") != std::string::npos;
      const float lo = ln_weight ? 0.7f : -0.5f, hi = ln_weight ? 1.3f : 0.5f;
      p->data.copy_(Tensor::from_vector(seeded(p->data.numel(), sub++, lo, hi), p->data.shape()));
    }
  }
  static nn::GPTConfig tiny(float dropout, bool bias) {
    nn::GPTConfig c;
    c.block_size = 6, c.vocab_size = 11, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
    c.dropout = dropout, c.bias = bias;
    return c;
  }
};

TEST_F(GptLayers, NormalInitIsThePolarMethodOfNoteNormalInit) {
  // An independent double-precision polar method with libm over the same Philox draws.
  const std::uint64_t stream = stream_id(kStreamInit, 3);
  const std::int64_t n = 4000;
  double sum = 0, sq = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double want = 0;
    for (std::uint64_t a = 0;; ++a) {
      const std::uint64_t k = 2 * (a * n + static_cast<std::uint64_t>(i));
      const double x = 2.0 * uniform01(5, stream, k) - 1.0,
                   y = 2.0 * uniform01(5, stream, k + 1) - 1.0;
      const double s = x * x + y * y;
      if (s > 0 && s < 1) {
        want = 0.5 * x * std::sqrt(-2.0 * std::log(s) / s);
        break;
      }
    }
    const float got = nn::normal_sample(5, stream, i, n, 0.5f);
    ASSERT_NEAR(got, want, 1e-6 * (1.0 + std::abs(want))) << "element " << i;
    sum += got, sq += double(got) * got;
  }
  EXPECT_NEAR(sum / n, 0.0, 4 * 0.5 / std::sqrt(double(n)));  // mean 0
  EXPECT_NEAR(std::sqrt(sq / n), 0.5, 0.05);                  // std 0.5
  expect_invalid([] { nn::normal_sample(1, 2, 5, 5, 1.0f); }, "index: expected in [0, 5), got 5");
}

TEST_F(GptLayers, LinearOnTokensEqualsLinearOnFlattenedRowsAndHasNoBiasOnRequest) {
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    nn::Linear a(8, 5, dev(), 3, 1), b(8, 5, dev(), 3, 1);
    a.set_determinism(mode), b.set_determinism(mode);
    const Tensor x = act({3, 4, 8}, 1), gy = act({3, 4, 5}, 2);
    const Tensor y3 = a.forward(x), y2 = b.forward(x.view({12, 8}));
    ASSERT_EQ(y3.shape(), (Shape{3, 4, 5}));
    EXPECT_TRUE(bits_equal(y3.to_vector<float>(), y2.to_vector<float>()));
    const Tensor g3 = a.backward(gy), g2 = b.backward(gy.view({12, 5}));
    ASSERT_EQ(g3.shape(), (Shape{3, 4, 8}));
    EXPECT_TRUE(bits_equal(g3.to_vector<float>(), g2.to_vector<float>()));
    if (mode == Determinism::fast) {  // bitwise: shards over 3 samples vs 12 rows differ
      EXPECT_TRUE(
          bits_equal(a.weight().grad.to_vector<float>(), b.weight().grad.to_vector<float>()));
      EXPECT_TRUE(bits_equal(a.bias().grad.to_vector<float>(), b.bias().grad.to_vector<float>()));
    }
  }
  nn::LinearOptions o;
  o.bias = false, o.init_std = 0.02f;
  nn::Linear c(16, 32, dev(), 3, 2, o);
  ASSERT_EQ(c.parameters().size(), 1u);
  EXPECT_EQ(c.str(), "Linear(16, 32, bias=False)");
  expect_invalid([&] { c.bias(); }, "has no bias");
  const std::vector<float> w = c.weight().data.to_vector<float>();
  const std::uint64_t stream = stream_id(kStreamInit, 2);
  for (std::int64_t i : {0, 7, 511})
    EXPECT_EQ(bits(w[static_cast<std::size_t>(i)]),
              bits(nn::normal_sample(3, stream, i, 512, 0.02f)));
  gradcheck(c, act({2, 3, 16}, 3), "Linear without bias on [B, T, C]");
  nn::Linear d(6, 4, dev(), 1, 0);
  gradcheck(d, act({2, 3, 6}, 4), "Linear on [B, T, C]");
}

TEST_F(GptLayers, LayerNormGeluEmbeddingDropoutGradients) {
  for (bool bias : {true, false}) {
    nn::LayerNorm ln(8, dev(), bias);
    randomize(ln, 10);
    ASSERT_EQ(ln.parameters().size(), bias ? 2u : 1u);
    gradcheck(ln, act({2, 3, 8}, 5, -2.0f, 2.0f), bias ? "LayerNorm" : "LayerNorm(bias=False)");
  }
  nn::GELU gelu;
  gradcheck(gelu, act({2, 3, 8}, 6, -3.0f, 3.0f), "GELU");
  gelu.set_input_requires_grad(false);  // no input gradient, as every layer (Module::backward)
  EXPECT_FALSE(gelu.backward(act({2, 3, 8}, 6)).defined());
  nn::Embedding emb(7, 5, dev(), 1, 0);
  gradcheck(emb, Tensor::from_vector(seeded_ids(12, 7, 7), {3, 4}), "Embedding");
  nn::Dropout drop(0.3f, 4, 9);
  gradcheck(drop, act({2, 3, 8}, 8), "Dropout(0.3)");
}

TEST_F(GptLayers, DropoutMaskIsKeyedByStepSiteAndGlobalRow) {
  nn::Dropout drop(0.5f, 3, 9);
  drop.set_step(2);
  const Tensor x = Tensor::full({4, 6}, 1.0f, dev());
  const std::vector<float> all = drop.forward(x).to_vector<float>();
  int kept = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const bool keep = uniform01(9, nn::dropout_stream(2, 3), i) >= 0.5f;
    EXPECT_EQ(all[i], keep ? 2.0f : 0.0f) << i;
    kept += keep;
  }
  EXPECT_GT(kept, 4);
  EXPECT_LT(kept, 20);
  // Rows [2, 4) on their own draw the same mask when told their first row...
  drop.set_first_row(2);
  const std::vector<float> tail = drop.forward(x.narrow(2, 2)).to_vector<float>();
  EXPECT_TRUE(bits_equal(tail, std::vector<float>(all.begin() + 12, all.end())));
  // ...and another one at another step or site, or in eval mode none.
  drop.set_first_row(0);
  drop.set_step(3);
  EXPECT_TRUE(any_bits_differ(drop.forward(x).to_vector<float>(), all));
  drop.set_training(false);
  EXPECT_TRUE(bits_equal(drop.forward(x).to_vector<float>(), std::vector<float>(24, 1.0f)));
  expect_invalid([] { nn::Dropout(1.0f, 0, 0); }, "p: expected in [0, 1), got 1");
}

// GPTs deeper than 85 blocks have dropout sites >= 256: they take streams of their own
// (kStreamDropoutWide), and the sites < 256 keep the original encoding, bit for bit.
TEST_F(GptLayers, DropoutSitesPast255HaveStreamsOfTheirOwn) {
  const auto u = [](std::uint64_t v) { return v; };
  // The original encoding, unchanged: kind 5 << 48 | step << 8 | site.
  EXPECT_EQ(nn::dropout_stream(5, 2), u(5) << 48 | u(5) << 8 | 2);
  EXPECT_EQ(nn::dropout_stream((std::int64_t(1) << 40) - 1, 255), u(5) << 48 | ~u(0) >> 16);
  // Sites 256 .. 2^16 - 1: kind 9 << 48 | step << 16 | site.
  EXPECT_EQ(nn::dropout_stream(5, 300), u(9) << 48 | u(5) << 16 | 300);
  EXPECT_EQ(nn::dropout_stream((std::int64_t(1) << 32) - 1, 65535), u(9) << 48 | ~u(0) >> 16);
  // No two (step, site) share a stream: every site < 512 at steps 0..3 and a few far ones.
  std::set<std::uint64_t> seen;
  std::size_t keys = 0;
  for (std::int64_t step : {std::int64_t(0), std::int64_t(1), std::int64_t(2), std::int64_t(3),
                            std::int64_t(255), std::int64_t(256), std::int64_t(65535)})
    for (std::uint64_t site = 0; site < 512; ++site, ++keys)
      seen.insert(nn::dropout_stream(step, site));
  EXPECT_EQ(seen.size(), keys);
  // The masks of sites 256 + k are not those of site k (a model of 90 blocks has sites 0..270).
  const Tensor x = Tensor::full({4, 16}, 1.0f, dev());
  for (std::uint64_t k : {0u, 1u, 2u, 14u}) {
    nn::Dropout low(0.5f, k, 9), high(0.5f, 256 + k, 9);
    low.set_step(3), high.set_step(3);
    EXPECT_TRUE(
        any_bits_differ(high.forward(x).to_vector<float>(), low.forward(x).to_vector<float>()))
        << "site " << 256 + k;
  }
  // Past the ranges: refused by name; with p == 0 nothing is drawn and any site is accepted.
  expect_invalid([] { nn::dropout_stream(0, 65536); },
                 "nn::dropout_stream: site: expected < 2^16, got 65536");
  expect_invalid([] { nn::dropout_stream(std::int64_t(1) << 32, 256); },
                 "nn::dropout_stream: step: expected in [0, 2^32) at site 256 (>= 256: Note "
                 "[Dropout masks]), got 4294967296");
  EXPECT_EQ(nn::dropout_stream(std::int64_t(1) << 32, 255), u(5) << 48 | u(1) << 40 | 255);
  expect_invalid([] { nn::dropout_stream(std::int64_t(1) << 40, 255); },
                 "nn::dropout_stream: step: expected in [0, 2^40) at site 255, got 1099511627776");
  expect_invalid([] { nn::dropout_stream(-1, 0); }, "step: expected in [0, 2^40) at site 0");
  expect_invalid([] { nn::Dropout(0.1f, 65536, 0); },
                 "Dropout: site: expected < 2^16 with p > 0 (Note [Dropout masks]), got 65536");
  nn::Dropout off(0.0f, std::uint64_t(1) << 20, 0);
  EXPECT_TRUE(bits_equal(off.forward(x).to_vector<float>(), std::vector<float>(64, 1.0f)));
}

TEST_F(GptLayers, AttentionMlpAndBlockGradients) {
  for (float p : {0.0f, 0.2f}) {
    const nn::GPTConfig cfg = tiny(p, true);
    const std::string tag = p > 0 ? " with dropout 0.2" : "";
    nn::CausalSelfAttention attn(cfg, 1, dev(), 4);
    randomize(attn, 20);
    attn.set_step(5);
    gradcheck(attn, act({2, 5, 8}, 9), "CausalSelfAttention" + tag);
    nn::GPTMLP mlp(cfg, 1, dev(), 4);
    randomize(mlp, 30);
    gradcheck(mlp, act({2, 5, 8}, 10), "MLP" + tag);
    nn::Block block(cfg, 0, dev(), 4);
    randomize(block, 40);
    gradcheck(block, act({2, 5, 8}, 11), "Block" + tag);
  }
}

TEST_F(GptLayers, AttentionDropoutAgreesWithNoDropoutWhenNothingIsDropped) {
  // p tiny: every element kept with scale 1, so the kernel with dropout must equal the one
  // without (up to where the score scale is applied: within 1e-6).
  const Tensor qkv = act({2, 5, 24}, 12);
  Tensor att, att_d;
  const Tensor y = ops::attention(qkv, 2, att);
  const Tensor yd = ops::attention(qkv, 2, att_d, 1e-9f, 1, 2, 0);
  const std::vector<float> a = y.to_vector<float>(), b = yd.to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6) << i;
  const Tensor dy = act({2, 5, 8}, 13);
  const std::vector<float> g1 = ops::attention_backward(dy, qkv, att, 2).to_vector<float>();
  const std::vector<float> g2 =
      ops::attention_backward(dy, qkv, att, 2, 1e-9f, 1, 2, 0).to_vector<float>();
  for (std::size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR(g1[i], g2[i], 1e-5) << i;
}

TEST_F(GptLayers, CrossEntropyOverTokensIsTheMeanOverBTimesT) {
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    const Tensor logits = act({3, 4, 6}, 14, -2.0f, 2.0f);
    const Tensor targets = Tensor::from_vector(seeded_ids(12, 6, 15), {3, 4}, dev());
    nn::CrossEntropyLoss a, b;
    a.set_determinism(mode), b.set_determinism(mode);
    const float la = a.forward(logits, targets).item();
    const float lb = b.forward(logits.view({12, 6}), targets.view({12})).item();
    EXPECT_NEAR(la, lb, 1e-6);
    const Tensor ga = a.backward(), gb = b.backward();
    ASSERT_EQ(ga.shape(), (Shape{3, 4, 6}));
    EXPECT_TRUE(bits_equal(ga.to_vector<float>(), gb.to_vector<float>()));
    // set_global_batch counts sequences: 6 samples of 4 tokens halve the loss of 3.
    nn::CrossEntropyLoss c;
    c.set_determinism(mode);
    c.set_global_batch(6);
    EXPECT_NEAR(c.forward(logits, targets).item(), la / 2, 1e-6);
  }
  nn::CrossEntropyLoss d;
  expect_invalid(
      [&] {
        d.forward(act({3, 4, 6}, 1), Tensor::zeros({3, 5}, DType::i64, dev()));
      },
      "target: expected [3, 4] i64");
}

// Note [One backward per forward]: a second backward of one forward is refused, as torch's
// "Trying to backward through the graph a second time", with DataParallel.backward's words, and
// adds nothing to the gradients; a refused grad_output keeps the forward.
std::vector<std::vector<float>> one_backward_grads(nn::Module& m) {
  std::vector<std::vector<float>> g;
  for (nn::Parameter* p : m.parameters()) g.push_back(p->grad.to_vector<float>());
  return g;
}

TEST_F(GptLayers, EachForwardAllowsOneBackward) {
  const std::string refusal =
      ".backward: no forward to go back through (call forward first; each forward allows one "
      "backward)";
  const nn::GPTConfig cfg = tiny(0.2f, true);
  const Tensor x = act({2, 5, 8}, 40);
  const Tensor ids = Tensor::from_vector(seeded_ids(10, 11, 41), {2, 5}, dev());
  struct Case {
    std::unique_ptr<nn::Module> m;
    Tensor input;
    std::string who;  // the module whose backward refuses
  };
  std::vector<Case> cases;
  cases.push_back({std::make_unique<nn::Linear>(8, 3, dev(), 1, 0), x, "Linear(8, 3)"});
  cases.push_back({std::make_unique<nn::ReLU>(), x, "ReLU"});
  cases.push_back({std::make_unique<nn::GELU>(), x, "GELU"});
  cases.push_back({std::make_unique<nn::LayerNorm>(8, dev(), true), x, "LayerNorm(8)"});
  cases.push_back({std::make_unique<nn::Embedding>(11, 8, dev(), 1, 0), ids, "Embedding(11, 8)"});
  cases.push_back({std::make_unique<nn::Dropout>(0.5f, 1, 2), x, "Dropout"});
  cases.push_back(
      {std::make_unique<nn::CausalSelfAttention>(cfg, 0, dev(), 3), x, "CausalSelfAttention"});
  cases.push_back({std::make_unique<nn::GPTMLP>(cfg, 0, dev(), 3), x, "Dropout"});
  cases.push_back({std::make_unique<nn::Block>(cfg, 0, dev(), 3), x, "Dropout"});
  cases.push_back({std::make_unique<nn::GPT>(cfg, dev(), 3), ids, "GPT"});
  cases.push_back({nn::mlp({8, 6, 3}, dev(), 4), x, "Linear(6, 3)"});
  for (Case& c : cases) {
    SCOPED_TRACE(c.who);
    const Tensor y = c.m->forward(c.input);
    const Tensor gy = act(y.shape(), 42);
    // A refused grad_output keeps the forward.
    expect_invalid([&] { c.m->backward(act({1, 1}, 43)); }, "expected [");
    c.m->backward(gy);
    const std::vector<std::vector<float>> once = one_backward_grads(*c.m);
    expect_invalid([&] { c.m->backward(gy); }, c.who + refusal);
    EXPECT_EQ(one_backward_grads(*c.m), once);  // nothing added
    c.m->forward(c.input);                      // a new forward allows a new backward
    c.m->backward(gy);
    EXPECT_TRUE(one_backward_grads(*c.m) != once || c.m->parameters().empty());
  }
  // Linear's fused GELU pair: c_fc's forward_gelu, c_proj's backward_dgelu.
  nn::Linear fc(8, 6, dev(), 1, 0), proj(6, 3, dev(), 1, 1);
  Tensor pre;
  const Tensor y = proj.forward(fc.forward_gelu(x, pre));
  const Tensor gy = act(y.shape(), 44);
  fc.backward(proj.backward_dgelu(gy, pre));
  expect_invalid([&] { proj.backward_dgelu(gy, pre); },
                 "Linear(6, 3).backward_dgelu" + refusal.substr(9));
  expect_invalid([&] { fc.backward(act(pre.shape(), 45)); }, "Linear(8, 6)" + refusal);
  // The losses, forward and CrossEntropyLoss's fused forward_backward.
  const Tensor logits = act({2, 5, 11}, 45);
  nn::CrossEntropyLoss ce;
  ce.forward(logits, ids);
  ce.backward();
  expect_invalid([&] { ce.backward(); }, "CrossEntropyLoss" + refusal);
  Tensor fused = logits.clone();
  ce.forward_backward(fused, ids, Tensor());
  EXPECT_EQ(ce.backward().shape(), logits.shape());
  expect_invalid([&] { ce.backward(); }, "CrossEntropyLoss" + refusal);
  nn::MSELoss mse;
  mse.forward(x, act(x.shape(), 46));
  expect_invalid([&] { mse.backward(Tensor::full({2}, 1.0f, dev())); }, "grad_loss");
  mse.backward();
  expect_invalid([&] { mse.backward(); }, "MSELoss" + refusal);
}

}  // namespace
}  // namespace ditto
