// nn::GPT (core/nn/gpt.h): nanoGPT's parameter names, shapes and init; gradients of the whole
// model against central finite differences (method and tolerances: tests/gpt_test_util.h);
// the same bits over 1, 2, 4 and 8 simulated devices with DataParallel in bitwise mode, dropout on;
// dropout masks of a row slice equal to those of the whole batch; settings reaching every layer;
// generate() reproducible for a seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <utility>

#include "core/comm/communicator.h"
#include "core/nn/gpt.h"
#include "core/nn/loss.h"
#include "core/nn/with_loss.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/ops.h"
#include "gpt_test_util.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class GptModel : public SimSuite<8> {
 protected:
  static Device dev() { return Device("sim", 0); }
  static nn::GPTConfig tiny(float dropout, bool bias) {
    nn::GPTConfig c;
    c.block_size = 6, c.vocab_size = 11, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
    c.dropout = dropout, c.bias = bias;
    return c;
  }
  static Tensor ids(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t sub) {
    return Tensor::from_vector(seeded_ids(B * T, V, sub), {B, T});
  }
};

TEST_F(GptModel, ParameterNamesAndShapesAreNanoGptsStateDict) {
  for (bool bias : {false, true}) {
    nn::GPTConfig c;
    c.n_layer = 2, c.n_embd = 16, c.n_head = 2, c.block_size = 8, c.vocab_size = 65, c.bias = bias;
    nn::GPT m(c, dev(), 1);
    std::vector<std::pair<std::string, Shape>> want{{"transformer.wte.weight", {65, 16}},
                                                    {"transformer.wpe.weight", {8, 16}}};
    auto add = [&](const std::string& n, Shape w, Shape b) {
      want.emplace_back(n + ".weight", w);
      if (bias) want.emplace_back(n + ".bias", b);
    };
    for (int l = 0; l < 2; ++l) {
      const std::string h = "transformer.h." + std::to_string(l);
      add(h + ".ln_1", {16}, {16});
      add(h + ".attn.c_attn", {48, 16}, {48});
      add(h + ".attn.c_proj", {16, 16}, {16});
      add(h + ".ln_2", {16}, {16});
      add(h + ".mlp.c_fc", {64, 16}, {64});
      add(h + ".mlp.c_proj", {16, 64}, {16});
    }
    add("transformer.ln_f", {16}, {16});
    const std::vector<nn::Parameter*> ps = m.parameters();
    ASSERT_EQ(ps.size(), want.size()) << "bias " << bias;
    for (std::size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(ps[i]->name, want[i].first) << i;
      EXPECT_EQ(ps[i]->data.shape(), want[i].second) << want[i].first;
    }
    // The clone has the same names (DataParallel's replicas) and shares the data.
    std::unique_ptr<nn::Module> cl = m.clone();
    ASSERT_EQ(cl->parameters().size(), ps.size());
    EXPECT_EQ(cl->parameters()[6]->name, ps[6]->name);
    EXPECT_EQ(cl->parameters()[6]->data.data_ptr(), ps[6]->data.data_ptr());
    // nanoGPT's _init_weights: std 0.02, c_proj 0.02 / sqrt(2 n_layer), LayerNorm 1, biases 0.
    auto stdev = [](const Tensor& t) {
      double s = 0, q = 0;
      const std::vector<float> v = t.to_vector<float>();
      for (float x : v) s += x, q += double(x) * x;
      return std::sqrt(q / v.size() - (s / v.size()) * (s / v.size()));
    };
    EXPECT_NEAR(stdev(ps[0]->data), 0.02, 0.003);
    const std::size_t mlp_c_proj = bias ? 12 : 7;
    ASSERT_EQ(ps[mlp_c_proj]->name, "transformer.h.0.mlp.c_proj.weight");
    EXPECT_NEAR(stdev(ps[mlp_c_proj]->data), 0.01, 0.0015);
    for (nn::Parameter* p : ps) {
      if (p->data.dim() != 1) continue;
      const float want1 = p->name.find(".weight") != std::string::npos ? 1.0f : 0.0f;
      for (float x : p->data.to_vector<float>()) ASSERT_EQ(x, want1) << p->name;
    }
  }
}

TEST_F(GptModel, WholeModelGradientsMatchFiniteDifferences) {
  for (auto [p, bias] : {std::pair{0.0f, false}, std::pair{0.1f, true}}) {
    nn::GPT m(tiny(p, bias), dev(), 3);
    std::uint64_t sub = 100;
    for (nn::Parameter* q : m.parameters()) {  // away from the init's special point
      const bool ln_w = q->data.dim() == 1 && q->name.find("weight") != std::string::npos;
      q->data.copy_(Tensor::from_vector(
          seeded(q->data.numel(), sub++, ln_w ? 0.7f : -0.4f, ln_w ? 1.3f : 0.4f),
          q->data.shape()));
    }
    m.set_step(2);
    gradcheck(m, ids(2, 5, 11, 1), p > 0 ? "GPT(dropout 0.1, bias)" : "GPT(no bias)");
    // Positions past T get no gradient; the logits have nanoGPT's shape.
    const std::vector<float> gwpe = m.parameters()[1]->grad.to_vector<float>();
    for (std::size_t i = 5 * 8; i < gwpe.size(); ++i) ASSERT_EQ(gwpe[i], 0.0f) << i;
    EXPECT_EQ(m.forward(ids(3, 4, 11, 2)).shape(), (Shape{3, 4, 11}));
  }
  // Bitwise mode computes the same gradients (its own order: within 1e-4 relative).
  nn::GPT f(tiny(0.1f, true), dev(), 3), b(tiny(0.1f, true), dev(), 3);
  b.set_determinism(Determinism::bitwise);
  for (nn::GPT* m : {&f, &b}) {
    m->zero_grad();
    Tensor out = m->forward(ids(4, 6, 11, 3));
    m->backward(Tensor::from_vector(seeded(out.numel(), 5), out.shape(), dev()));
  }
  for (std::size_t i = 0; i < f.parameters().size(); ++i) {
    const std::vector<float> gf = f.parameters()[i]->grad.to_vector<float>();
    const std::vector<float> gb = b.parameters()[i]->grad.to_vector<float>();
    double scale = 0;
    for (float x : gf) scale = std::max(scale, double(std::abs(x)));
    for (std::size_t k = 0; k < gf.size(); ++k)
      ASSERT_NEAR(gf[k], gb[k], 1e-4 * scale + 1e-7) << f.parameters()[i]->name << "[" << k << "]";
  }
}

nn::GPTConfig dp_config(float dropout) {
  nn::GPTConfig c;
  c.block_size = 6, c.vocab_size = 11, c.n_layer = 2, c.n_head = 2, c.n_embd = 8;
  c.dropout = dropout, c.bias = true;
  return c;
}

// Step `step`'s batch: B windows of 7 seeded tokens, x [B, 6] the first 6, y [B, 6] the last.
std::pair<Tensor, Tensor> batch_of(std::int64_t step, int B) {
  const std::vector<std::int64_t> tok =
      seeded_ids(B * 7, 11, 200 + static_cast<std::uint64_t>(step));
  std::vector<std::int64_t> x, y;
  for (int r = 0; r < B; ++r)
    for (int t = 0; t < 6; ++t) x.push_back(tok[r * 7 + t]), y.push_back(tok[r * 7 + t + 1]);
  return {Tensor::from_vector(x, {B, 6}), Tensor::from_vector(y, {B, 6})};
}

optim::SGDOptions sgd_options() {
  optim::SGDOptions so;
  so.lr = 0.5f;
  return so;
}

// `steps` SGD steps of a GPT of `cfg` (block_size >= 6, vocab 11) in bitwise mode through
// DataParallel over D devices, batches of B sequences; returns every parameter's values.
std::vector<float> train_dp_of(const nn::GPTConfig& cfg, int devices, int B, std::int64_t steps) {
  nn::GPT m(cfg, Device("sim", 0), 7);
  m.set_determinism(Determinism::bitwise);
  parallel::DataParallelOptions o;
  o.determinism = Determinism::bitwise;
  parallel::DataParallel dp(m, ditto::devices("sim", devices), o);
  optim::SGD sgd(m.parameters(), sgd_options());
  nn::CrossEntropyLoss ce;
  ce.set_determinism(Determinism::bitwise);
  for (std::int64_t step = 0; step < steps; ++step) {
    m.set_step(step);
    sgd.zero_grad();
    const auto [x, y] = batch_of(step, B);
    const Tensor logits = dp.forward(x);
    ce.forward(logits, y.to(logits.device()));
    dp.backward(ce.backward());
    sgd.step();
  }
  return parameter_values(m);
}

// 3 SGD steps of the tiny GPT (train_dp_of).
std::vector<float> train_dp(int devices, float dropout, int B = 8) {
  return train_dp_of(dp_config(dropout), devices, B, 3);
}

// The same training with DistributedDataParallel over `world` ranks (one thread each), the loss
// a mean over the global batch (set_global_batch, summed gradients); every rank's parameters.
std::vector<std::vector<float>> train_ddp(int world, float dropout, int B = 8) {
  CommOptions co;
  co.determinism = Determinism::bitwise;
  std::vector<Communicator> comms = Communicator::init_all(ditto::devices("sim", world), co);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(world));
  auto rank = [&](int r) {
    Communicator& comm = comms[static_cast<std::size_t>(r)];
    auto gpt = std::make_unique<nn::GPT>(dp_config(dropout), comm.device(), 7);
    nn::GPT& m = *gpt;
    auto ce = std::make_unique<nn::CrossEntropyLoss>();
    ce->set_global_batch(B);
    nn::WithLoss model(std::move(gpt), std::move(ce));
    parallel::DistributedDataParallelOptions o;
    o.average_gradients = false;
    parallel::DistributedDataParallel ddp(model, comm, o);
    optim::SGD sgd(m.parameters(), sgd_options());
    for (std::int64_t step = 0; step < 3; ++step) {
      m.set_step(step);
      sgd.zero_grad();
      const auto [x, y] = batch_of(step, B);
      const auto [a, b] = ddp.local_rows(B);
      ddp.forward({x.narrow(a, b - a), y.narrow(a, b - a)}, B);
      ddp.backward();
      sgd.step();
    }
    out[static_cast<std::size_t>(r)] = parameter_values(m);
  };
  std::vector<std::future<void>> done;
  for (int r = 0; r < world; ++r) done.push_back(std::async(std::launch::async, rank, r));
  for (auto& f : done) f.get();
  return out;
}

TEST_F(GptModel, SameBitsOverDevicesAndRanksInBitwiseMode) {
  for (float p : {0.0f, 0.1f}) {
    const std::vector<float> one = train_dp(1, p);
    for (int d : {2, 4, 8})
      EXPECT_TRUE(bits_equal(train_dp(d, p), one)) << d << " devices, dropout " << p;
  }
  // DistributedDataParallel over 2 and 4 ranks: the same bits on every rank.
  const std::vector<float> dp1 = train_dp(1, 0.1f);
  for (int world : {2, 4})
    for (const std::vector<float>& r : train_ddp(world, 0.1f))
      EXPECT_TRUE(bits_equal(r, dp1)) << "DDP over " << world << " ranks";
  // A batch smaller than the device count: some replicas hold no rows.
  EXPECT_TRUE(bits_equal(train_dp(8, 0.1f, 3), train_dp(1, 0.1f, 3)));
  // The steps did something, and dropout changed it.
  nn::GPTConfig c = tiny(0.0f, true);
  nn::GPT init(c, dev(), 7);
  EXPECT_TRUE(any_bits_differ(train_dp(1, 0.0f), parameter_values(init)));
  EXPECT_TRUE(any_bits_differ(train_dp(1, 0.1f), train_dp(1, 0.0f)));
}

// GPTs deeper than 85 blocks (GPT-3 has 96) were refused: their dropout sites pass 255. A GPT of
// 90 blocks with dropout trains to the same bits on 1 and 2 devices, and its masks at the sites
// 256..270 (blocks 85..89) are not those of sites 0..14.
TEST_F(GptModel, DeeperThan85BlocksTrainsWithDropoutToTheSameBitsOnOneAndTwoDevices) {
  nn::GPTConfig c;
  c.block_size = 6, c.vocab_size = 11, c.n_layer = 90, c.n_head = 1, c.n_embd = 8;
  c.dropout = 0.1f, c.bias = true;
  nn::GPT init(c, dev(), 7);
  // The model's dropouts of blocks 85..89 (its sites, its seed, Note [GPT]) at step 1.
  const Tensor ones = Tensor::full({2, 40}, 1.0f, dev());
  const auto mask = [&](std::uint64_t site) {
    nn::Dropout d(c.dropout, site, init.seed());
    d.set_step(1);
    return d.forward(ones).to_vector<float>();
  };
  std::uint64_t wide = 0;
  for (std::int64_t l = 85; l < 90; ++l)
    for (nn::BlockDropout w :
         {nn::BlockDropout::attn, nn::BlockDropout::resid, nn::BlockDropout::mlp}) {
      const std::uint64_t site = nn::gpt_dropout_site(l, w);
      ASSERT_GE(site, 256u);
      EXPECT_TRUE(any_bits_differ(mask(site), mask(site - 256))) << "site " << site;
      ++wide;
    }
  EXPECT_EQ(wide, 15u);
  EXPECT_EQ(nn::gpt_dropout_site(89, nn::BlockDropout::mlp), 270u);
  const std::vector<float> one = train_dp_of(c, 1, 4, 2);
  EXPECT_TRUE(bits_equal(train_dp_of(c, 2, 4, 2), one));
  EXPECT_TRUE(any_bits_differ(one, parameter_values(init)));
  // The masks were drawn: without dropout the steps end elsewhere.
  nn::GPTConfig c0 = c;
  c0.dropout = 0.0f;
  EXPECT_TRUE(any_bits_differ(train_dp_of(c0, 1, 4, 2), one));
}

// n_layer's bounds: 2^46 - 1 without dropout (the init streams' layer ids), 21845 with (the
// dropout sites < 2^16); GPT-3's 96 either way.
TEST_F(GptModel, ConfigsDeeperThan85BlocksAreAcceptedUpToTheirStreams) {
  nn::GPTConfig c = tiny(0.0f, false);
  for (float p : {0.0f, 0.1f}) {
    c.dropout = p;
    for (std::int64_t layers : {86, 96, 21845}) {
      c.n_layer = layers;
      EXPECT_NO_THROW(nn::check_config(c)) << layers << " layers, dropout " << p;
    }
  }
  c.n_layer = 21846;
  expect_invalid([&] { nn::check_config(c); },
                 "GPTConfig: n_layer: expected at most 21845 with dropout > 0 (the dropout sites "
                 "fit in 16 bits, Note [Dropout masks]), got 21846 with dropout 0.1");
  c.dropout = 0.0f;
  EXPECT_NO_THROW(nn::check_config(c));
  c.n_layer = (std::int64_t(1) << 46) - 1;
  EXPECT_NO_THROW(nn::check_config(c));
  c.n_layer = std::int64_t(1) << 46;
  expect_invalid([&] { nn::check_config(c); },
                 "GPTConfig: n_layer: expected in [1, 2^46) (the init streams' layer ids fit in "
                 "48 bits), got 70368744177664");
  EXPECT_EQ(nn::gpt_layer_id((std::int64_t(1) << 46) - 2, nn::BlockLinear::mlp_c_proj),
            (std::uint64_t(1) << 48) - 3);
  EXPECT_EQ(nn::gpt_dropout_steps(85), std::int64_t(1) << 40);
  EXPECT_EQ(nn::gpt_dropout_steps(86), std::int64_t(1) << 32);
  // A GPT of 96 blocks builds (dropout 0.1): 96 blocks, nanoGPT's names up to h.95.
  c = tiny(0.1f, false);
  c.n_layer = 96, c.n_embd = 4, c.n_head = 1;
  nn::GPT g(c, dev(), 1);
  EXPECT_EQ(g.parameters().size(), 2u + 96u * 6u + 1u);
  EXPECT_EQ(g.parameters()[2 + 95 * 6]->name, "transformer.h.95.ln_1.weight");
}

TEST_F(GptModel, FastDataParallelAgreesWithOneDeviceAndEveryGradIsReportedOnce) {
  // fast mode (torch.chunk split, any-order kernels): within rounding of one device.
  nn::GPT a(dp_config(0.0f), dev(), 2), b(dp_config(0.0f), dev(), 2);
  parallel::DataParallel dp(b, ditto::devices("sim", 4));
  const auto [x, y] = batch_of(0, 6);
  std::vector<std::string> reported;
  a.set_grad_ready_hook([&](nn::Parameter& p) { reported.push_back(p.name); });
  for (std::pair<nn::GPT*, bool> run : {std::pair{&a, false}, std::pair{&b, true}}) {
    run.first->zero_grad();
    nn::CrossEntropyLoss ce;
    const Tensor logits = run.second ? dp.forward(x) : run.first->forward(x);
    ce.forward(logits, y.to(logits.device()));
    if (run.second)
      dp.backward(ce.backward());
    else
      run.first->backward(ce.backward());
  }
  const std::vector<nn::Parameter*> pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> ga = pa[i]->grad.to_vector<float>(),
                             gb = pb[i]->grad.to_vector<float>();
    for (std::size_t k = 0; k < ga.size(); ++k) ASSERT_NEAR(ga[k], gb[k], 1e-6) << pa[i]->name;
  }
  // DDP's hook: each parameter once, after its layer's backward (ln_f first, wte last).
  std::vector<std::string> names;
  for (nn::Parameter* p : pa) names.push_back(p->name);
  ASSERT_EQ(reported.size(), names.size());
  EXPECT_EQ(reported.front(), "transformer.ln_f.weight");
  EXPECT_EQ(reported.back(), "transformer.wte.weight");
  std::sort(reported.begin(), reported.end());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(reported, names);
}

TEST_F(GptModel, RowSliceWithItsFirstRowDrawsTheWholeBatchsMasks) {
  nn::GPT m(tiny(0.3f, false), dev(), 5);
  m.set_determinism(Determinism::bitwise);
  m.set_step(4);
  const Tensor x = ids(4, 6, 11, 9);
  const std::vector<float> all = m.forward(x).to_vector<float>();
  std::unique_ptr<nn::Module> r = m.clone();
  r->set_first_row(2);
  const std::vector<float> tail = r->forward(x.narrow(2, 2)).to_vector<float>();
  EXPECT_TRUE(bits_equal(tail, std::vector<float>(all.begin() + all.size() / 2, all.end())));
  r->set_first_row(0);  // the wrong row draws other masks
  EXPECT_TRUE(any_bits_differ(r->forward(x.narrow(2, 2)).to_vector<float>(),
                              std::vector<float>(all.begin() + all.size() / 2, all.end())));
}

TEST_F(GptModel, TrainingAndStepReachEveryDropout) {
  nn::GPT drop(tiny(0.2f, true), dev(), 5), none(tiny(0.0f, true), dev(), 5);
  const Tensor x = ids(2, 6, 11, 10);
  const std::vector<float> ref = none.forward(x).to_vector<float>();
  const std::vector<float> s0 = drop.forward(x).to_vector<float>();
  EXPECT_TRUE(any_bits_differ(s0, ref));
  drop.set_step(1);
  EXPECT_TRUE(any_bits_differ(drop.forward(x).to_vector<float>(), s0));
  std::unique_ptr<nn::Module> cl = drop.clone();  // keeps the step
  EXPECT_TRUE(bits_equal(cl->forward(x).to_vector<float>(), drop.forward(x).to_vector<float>()));
  drop.set_training(false);  // eval: no dropout anywhere
  EXPECT_TRUE(bits_equal(drop.forward(x).to_vector<float>(), ref));
}

TEST_F(GptModel, GenerateIsReproducibleForASeed) {
  nn::GPT m(tiny(0.1f, false), dev(), 11);
  const std::vector<std::int64_t> prompt{1, 2, 3};
  const std::vector<std::int64_t> a = m.generate(prompt, 12, 0.8f, 5, 42);
  ASSERT_EQ(a.size(), 15u);
  EXPECT_EQ(std::vector<std::int64_t>(a.begin(), a.begin() + 3), prompt);
  for (std::int64_t t : a) EXPECT_TRUE(t >= 0 && t < 11) << t;
  EXPECT_EQ(m.generate(prompt, 12, 0.8f, 5, 42), a);
  EXPECT_NE(m.generate(prompt, 12, 0.8f, 5, 43), a);
  EXPECT_TRUE(m.training());  // restored
  {  // a diverged model: refused (it sampled the last vocabulary entry every time), mode restored
    nn::GPT bad(tiny(0.0f, false), dev(), 11);
    nn::Parameter& w = *bad.parameters().back();
    ops::fill_(w.data, NAN);
    expect_invalid([&] { bad.generate(prompt, 3, 0.8f, 5, 42); },
                   "GPT.generate: the logits of new token 0 are not numbers");
    EXPECT_TRUE(bad.training());
  }
  // top_k = 1 is greedy: the argmax of the last position's logits (eval mode), with the
  // context cropped to block_size (prompt of 8 > 6).
  const std::vector<std::int64_t> longp{1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int64_t> g = m.generate(longp, 1, 1.0f, 1, 0);
  m.set_training(false);
  const std::vector<float> l =
      m.forward(
           Tensor::from_vector(std::vector<std::int64_t>(longp.end() - 6, longp.end()), {1, 6}))
          .to_vector<float>();
  const auto best = std::max_element(l.end() - 11, l.end()) - (l.end() - 11);
  EXPECT_EQ(g.back(), best);
  expect_invalid([&] { m.generate({}, 1, 1.0f, 0, 0); }, "prompt: expected at least one token");
  expect_invalid([&] { m.generate({11}, 1, 1.0f, 0, 0); },
                 "prompt[0]: expected a token id in [0, 11), got 11");
  expect_invalid([&] { m.generate({1}, 1, 0.0f, 0, 0); },
                 "temperature: expected a finite value > 0");
}

// vocab_limit (issue 31): a padded vocabulary's rows past the text's tokens are never drawn
// (ditto-train's sample decoded one and lost the run's result); 0 and V draw as before.
TEST_F(GptModel, GenerateDrawsOnlyBelowTheVocabLimit) {
  nn::GPT m(tiny(0.0f, false), dev(), 11);  // V = 11
  const std::vector<std::int64_t> prompt{1};
  // At temperature 100 every id is about equally likely: 200 draws of 11 reach 5..10.
  const std::vector<std::int64_t> all = m.generate(prompt, 200, 100.0f, 0, 7);
  EXPECT_GE(*std::max_element(all.begin(), all.end()), 5);
  const std::vector<std::int64_t> low = m.generate(prompt, 200, 100.0f, 0, 7, 5);
  for (std::int64_t t : low) EXPECT_TRUE(t >= 0 && t < 5) << t;
  EXPECT_EQ(m.generate(prompt, 20, 0.8f, 3, 7, 11), m.generate(prompt, 20, 0.8f, 3, 7));
  EXPECT_EQ(m.generate(prompt, 20, 0.8f, 3, 7, 0), m.generate(prompt, 20, 0.8f, 3, 7));
  const std::vector<std::int64_t> top = m.generate(prompt, 50, 100.0f, 8, 7, 5);  // top_k >= 5
  for (std::int64_t t : top) EXPECT_TRUE(t >= 0 && t < 5) << t;
  expect_invalid([&] { m.generate(prompt, 1, 1.0f, 0, 0, 12); },
                 "GPT.generate: vocab_limit: expected 0 (every id) or 1..11 (vocab_size), got 12");
}

TEST_F(GptModel, BadInputsAreRefusedByName) {
  nn::GPTConfig c = tiny(0.0f, false);
  c.n_embd = 9;
  expect_invalid([&] { nn::GPT(c, dev(), 1); },
                 "n_embd: expected a positive multiple of n_head = 2, got 9");
  nn::GPT m(tiny(0.0f, false), dev(), 1);
  expect_invalid([&] { m.forward(ids(1, 7, 11, 1)); }, "expected 1 <= T <= block_size = 6");
  expect_invalid(
      [&] {
        m.forward(Tensor::zeros({2, 3}, DType::f32, dev()));
      },
      "idx: expected [B, T] i64");
  expect_invalid(
      [&] {
        m.backward(Tensor::zeros({1, 1, 11}, DType::f32, dev()));
      },
      "GPT.backward: no forward to go back through");
  expect_invalid(
      [&] {
        m.forward(Tensor::from_vector(std::vector<std::int64_t>{1, 11}, {1, 2}));
      },
      "GPT.forward: ops::embedding: idx[0, 1] = 11 out of range [0, 11)");
}

}  // namespace
}  // namespace ditto
