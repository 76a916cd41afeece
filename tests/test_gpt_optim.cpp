// The GPT's optimizer side and plumbing (issue 12): the Module settings (training, step,
// first_row) passed on by Sequential and WithLoss and set on DataParallel's replicas and a DDP
// rank's module; optim::AdamW against torch.optim.AdamW's formula computed here; its state_dict;
// optim::clip_grad_norm_ against the closed form and across DDP ranks; nanoGPT's learning-rate
// schedule against train.py's get_lr written out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/comm/communicator.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/nn/with_loss.h"
#include "core/numerics/random.h"
#include "core/optim/adam.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class GptOptimTest : public SimSuite<8> {};

// ---- plumbing
// ------------------------------------------------------------------------------------

/// What a Probe saw at one forward.
struct Seen {
  Device device;
  std::int64_t rows, first_row, step;
  bool training;
};

/// The log the Probes of one test (and all their clones) append to.
struct ProbeLog {
  std::mutex mu;
  std::vector<Seen> seen;
  /// The entries, ordered by device index (replicas run on parallel threads).
  std::vector<Seen> by_device() {
    std::vector<Seen> s = seen;
    std::sort(s.begin(), s.end(),
              [](const Seen& a, const Seen& b) { return a.device.index < b.device.index; });
    seen.clear();
    return s;
  }
};

/// Identity layer that records its settings at each forward (one [1] parameter, so that
/// DataParallel and DDP have something to replicate).
class Probe : public nn::Module {
 public:
  Probe(ProbeLog& log, const Device& device) : log_(log) {
    p_.name = "p";
    p_.data = Tensor::zeros({1}, DType::f32, device);
  }
  std::string name() const override { return "Probe"; }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    std::lock_guard<std::mutex> lock(log_.mu);
    log_.seen.push_back({x.device(), x.size(0), first_row(), step(), training()});
    return x;
  }
  Tensor backward(const Tensor& g) override { return g; }
  std::vector<nn::Parameter*> parameters() override { return {&p_}; }
  std::unique_ptr<Module> clone() const override {
    auto m = std::make_unique<Probe>(log_, p_.data.device());
    m->p_.data = p_.data;
    copy_settings(*this, *m);
    return m;
  }

 private:
  ProbeLog& log_;
  nn::Parameter p_;
};

Tensor rows_of(std::int64_t b) { return Tensor::zeros({b, 3}, DType::f32, Device::cpu()); }

TEST_F(GptOptimTest, SequentialAndWithLossPassTheSettingsOn) {
  ProbeLog log;
  const Device d0("sim", 0);
  auto seq = std::make_unique<nn::Sequential>();
  seq->set_step(5);
  seq->set_training(false);
  seq->set_first_row(9);
  seq->add(std::make_unique<Probe>(log, d0));  // takes the container's settings
  nn::Sequential* inner = seq.get();
  nn::WithLoss wl(std::move(seq), std::make_unique<nn::MSELoss>());
  EXPECT_EQ(wl.step(), 5);  // WithLoss starts with its model's settings
  EXPECT_FALSE(wl.training());
  EXPECT_EQ(wl.first_row(), 9);
  const Tensor x = rows_of(2).to(d0);
  wl.forward({x, x});
  wl.set_step(6);
  wl.set_training(true);
  wl.set_first_row(4);
  EXPECT_EQ(inner->step(), 6);
  wl.forward({x, x});
  std::vector<Seen> s = log.seen;
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].step, 5);
  EXPECT_FALSE(s[0].training);
  EXPECT_EQ(s[0].first_row, 9);
  EXPECT_EQ(s[1].step, 6);
  EXPECT_TRUE(s[1].training);
  EXPECT_EQ(s[1].first_row, 4);
  // clone() keeps them (copy_settings), down to the leaf.
  auto c = wl.clone();
  log.seen.clear();
  c->forward({x, x});
  ASSERT_EQ(log.seen.size(), 1u);
  EXPECT_EQ(log.seen[0].step, 6);
  EXPECT_EQ(log.seen[0].first_row, 4);
}

// DataParallel over 4 devices: replica i sees first_row = b0 + ... + b(i-1) of its chunk sizes,
// and the wrapped module's step and training as they are at that forward.
void check_data_parallel_rows(Determinism mode, const std::vector<std::int64_t>& want_rows) {
  ProbeLog log;
  const std::vector<Device> devs = devices("sim", 4);
  auto seq = std::make_unique<nn::Sequential>();
  seq->add(std::make_unique<Probe>(log, devs[0]));
  nn::WithLoss model(std::move(seq), std::make_unique<nn::MSELoss>());
  parallel::DataParallelOptions o;
  o.determinism = mode;
  parallel::DataParallel dp(model, devs, o);
  const Tensor x = rows_of(10);
  for (std::int64_t step : {3, 4}) {
    model.set_step(step);
    model.set_training(step == 4);
    dp.forward({x, x});
    std::vector<Seen> s = log.by_device();
    ASSERT_EQ(s.size(), 4u);
    const std::vector<std::int64_t>& chunks = dp.last_chunk_sizes();
    std::int64_t start = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(s[i].device, devs[i]);
      EXPECT_EQ(s[i].rows, chunks[i]);
      EXPECT_EQ(s[i].first_row, start) << "replica " << i;
      EXPECT_EQ(s[i].first_row, want_rows[i]) << "replica " << i;
      EXPECT_EQ(s[i].step, step);
      EXPECT_EQ(s[i].training, step == 4);
      start += chunks[i];
    }
  }
}

TEST_F(GptOptimTest, DataParallelReplicasGetTheirFirstRowStepAndTraining) {
  check_data_parallel_rows(Determinism::fast, {0, 3, 6, 9});     // torch.chunk: 3, 3, 3, 1
  check_data_parallel_rows(Determinism::bitwise, {0, 2, 5, 7});  // micro-shards: floor(2.5 d)
}

TEST_F(GptOptimTest, DataParallelOnOneDeviceGivesRowZero) {
  ProbeLog log;
  Probe probe(log, Device("sim", 0));
  probe.set_first_row(12);
  parallel::DataParallel dp(probe, devices("sim", 1));
  dp.forward(rows_of(4));
  ASSERT_EQ(log.seen.size(), 1u);
  EXPECT_EQ(log.seen[0].first_row, 0);
}

/// Runs fn(rank, comm) on one thread per rank of a new communicator over sim:0..world-1;
/// rethrows a rank's exception.
void on_ranks(int world, Determinism mode, const std::function<void(int, Communicator&)>& fn) {
  CommOptions co;
  co.determinism = mode;
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", world), co);
  std::vector<std::future<void>> done;
  for (int r = 0; r < world; ++r)
    done.push_back(
        std::async(std::launch::async, fn, r, std::ref(comms[static_cast<std::size_t>(r)])));
  for (auto& f : done) f.get();
}

TEST_F(GptOptimTest, DdpSetsTheRankFirstRowFromTheGlobalBatch) {
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    ProbeLog log;
    std::vector<std::int64_t> lo(4, -1);
    on_ranks(4, mode, [&](int r, Communicator& comm) {
      Probe probe(log, comm.device());
      probe.set_step(11);
      parallel::DistributedDataParallel ddp(probe, comm);
      const auto [a, b] = ddp.local_rows(10);
      lo[static_cast<std::size_t>(r)] = a;
      ddp.forward({rows_of(b - a)}, 10);
    });
    // bitwise: the rows of 16 micro-shards each (of 64); fast: torch.chunk's parts 3, 3, 3, 1.
    EXPECT_EQ(lo, mode == Determinism::bitwise ? (std::vector<std::int64_t>{0, 2, 5, 7})
                                               : (std::vector<std::int64_t>{0, 3, 6, 9}));
    std::vector<Seen> s = log.by_device();
    ASSERT_EQ(s.size(), 4u);
    for (std::size_t r = 0; r < 4; ++r) {
      EXPECT_EQ(s[r].first_row, lo[r]) << "rank " << r;
      EXPECT_EQ(s[r].step, 11);
    }
  }
}

// ---- AdamW
// ---------------------------------------------------------------------------------------

/// torch.optim.AdamW's update of one element written out in double (the hand computation):
/// p *= 1 - lr * wd, then Adam's moments and bias-corrected step at step t.
struct TorchAdamW {
  double beta1, beta2, eps, wd;
  int t = 0;
  double m = 0, v = 0;
  double update(double p, double g, double lr) {
    ++t;
    p *= 1 - lr * wd;
    m = beta1 * m + (1 - beta1) * g;
    v = beta2 * v + (1 - beta2) * g * g;
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    return p - lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

nn::Parameter param_on(const std::string& name, const std::vector<float>& v, const Shape& shape,
                       const Device& device = Device("sim", 0)) {
  return {name, Tensor::from_vector(v, shape, device), Tensor()};
}

/// Gradient of step s for a parameter of n elements (both signs, changing sizes).
std::vector<float> grad_of(int s, std::size_t n, float scale) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] =
        scale * (static_cast<float>(i) - 1.5f) * (s % 2 ? -0.5f : 1.0f) * static_cast<float>(s + 1);
  return g;
}

TEST_F(GptOptimTest, AdamWGroupsAsNanoGPT) {
  auto b = param_on("b", {1, 2, 3}, {3});
  auto w = param_on("w", {1, 2, 3, 4, 5, 6}, {2, 3});
  auto ln = param_on("ln", {1}, {1});
  optim::AdamW opt({&b, &w, &ln}, {.weight_decay = 0.1});
  // decay group {w} first, then {b, ln}: torch's state indices.
  ASSERT_EQ(opt.parameters().size(), 3u);
  EXPECT_EQ(opt.parameters()[0], &w);
  EXPECT_EQ(opt.parameters()[1], &b);
  EXPECT_EQ(opt.parameters()[2], &ln);
  EXPECT_EQ(opt.weight_decay(0), 0.1);
  EXPECT_EQ(opt.weight_decay(1), 0.0);
  EXPECT_EQ(opt.weight_decay(2), 0.0);
  // One explicit group: torch's AdamW(list, weight_decay=0.3) decays every parameter.
  const std::vector<nn::Parameter*> all{&b, &w};
  optim::AdamW torch_like({{all, 0.3}}, {});
  EXPECT_EQ(torch_like.parameters()[0], &b);
  EXPECT_EQ(torch_like.weight_decay(0), 0.3);
  EXPECT_EQ(torch_like.weight_decay(1), 0.3);
  EXPECT_EQ(torch_like.state_dict().options.at("num_groups"), "1");
  expect_invalid([&] { optim::AdamW({&w}, {.beta2 = 1.0}); },
                 "optim::AdamW: beta2: Invalid beta parameter at index 1: 1");
  expect_invalid(
      [&] {
        optim::AdamW(std::vector<optim::AdamWGroup>{{{&w}, -1.0}});
      },
      "groups[0].weight_decay: Invalid weight_decay value: -1");
  expect_invalid([&] { opt.set_lr(-0.5); }, "Invalid learning rate: -0.5");
}

TEST_F(GptOptimTest, SetLrThroughTheOptimizerInterface) {
  auto p = param_on("p", {1, 2}, {2});
  optim::SGD sgd({&p}, {.lr = 0.1f});
  optim::Adam adam({&p});
  optim::AdamW adamw({&p});
  for (optim::Optimizer* o : std::vector<optim::Optimizer*>{&sgd, &adam, &adamw}) {
    o->set_lr(0.25);
    EXPECT_EQ(o->lr(), 0.25);
    expect_invalid([&] { o->set_lr(std::nan("")); }, "Invalid learning rate: nan");
  }
  sgd.set_lr(0.1);
  EXPECT_EQ(sgd.lr(), static_cast<double>(0.1f));  // SGD keeps a float
  // The new rate is the one the next step uses: SGD p -= lr * g.
  p.grad = Tensor::from_vector(std::vector<float>{1, 1}, {2}, Device("sim", 0));
  sgd.set_lr(0.5);
  sgd.step();
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{0.5f, 1.5f}));
}

TEST_F(GptOptimTest, AdamWMatchesTorchFormulaWithDecayOnlyOn2dAndSetLr) {
  const optim::AdamWOptions o{
      .lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.5};
  const std::vector<float> w0{0.5f, -1.25f, 3.0f, 0.25f, 2.0f, -0.75f}, b0{1.5f, -2.0f, 0.125f};
  auto w = param_on("w", w0, {2, 3});
  auto b = param_on("b", b0, {3});
  optim::AdamW opt({&w, &b}, o);
  std::vector<TorchAdamW> rw(w0.size(), {o.beta1, o.beta2, o.eps, o.weight_decay});
  std::vector<TorchAdamW> rb(b0.size(), {o.beta1, o.beta2, o.eps, 0.0});
  std::vector<double> ew(w0.begin(), w0.end()), eb(b0.begin(), b0.end());
  const double lrs[] = {0.1, 0.1, 0.05, 0.02};  // set_lr between steps, as a schedule does
  for (int s = 0; s < 4; ++s) {
    if (lrs[s] != opt.lr()) opt.set_lr(lrs[s]);
    EXPECT_EQ(opt.lr(), lrs[s]);
    const std::vector<float> gw = grad_of(s, w0.size(), 1.0f), gb = grad_of(s, b0.size(), 0.3f);
    w.grad = Tensor::from_vector(gw, {2, 3}, Device("sim", 0));
    b.grad = Tensor::from_vector(gb, {3}, Device("sim", 0));
    opt.step();
    for (std::size_t i = 0; i < w0.size(); ++i) ew[i] = rw[i].update(ew[i], gw[i], lrs[s]);
    for (std::size_t i = 0; i < b0.size(); ++i) eb[i] = rb[i].update(eb[i], gb[i], lrs[s]);
    const std::vector<float> gotw = w.data.to_vector<float>(), gotb = b.data.to_vector<float>();
    // f32 against the double formula: a few ulps; a wrong order of decay and update, decay on
    // the bias, L2 decay or a stale lr are off by 1e-3 or more.
    for (std::size_t i = 0; i < w0.size(); ++i)
      EXPECT_NEAR(gotw[i], ew[i], 2e-6 * (1 + std::fabs(ew[i])))
          << "w step " << s << " [" << i << "]";
    for (std::size_t i = 0; i < b0.size(); ++i)
      EXPECT_NEAR(gotb[i], eb[i], 2e-6 * (1 + std::fabs(eb[i])))
          << "b step " << s << " [" << i << "]";
    EXPECT_EQ(opt.step_count(0), s + 1);
  }
}

TEST_F(GptOptimTest, AdamWIsTheDecayThenAdamBitForBit) {
  // Bits: the decay is the float product float(1 - lr * wd) * p (a zero first gradient moves
  // nothing else), and the rest is torch.optim.Adam without decay (test_optim checks Adam's
  // bits against torch's per-element operations).
  const double lr = 0.03, wd = 0.1;
  const std::vector<float> w0{0.5f, -1.25f, 3.0f, 0.1f}, b0{1.5f, -2.0f};
  auto w = param_on("w", w0, {2, 2});
  auto b = param_on("b", b0, {2});
  optim::AdamW opt({&w, &b}, {.lr = lr, .beta2 = 0.99, .weight_decay = wd});
  w.grad = Tensor::zeros({2, 2}, DType::f32, Device("sim", 0));
  b.grad = Tensor::zeros({2}, DType::f32, Device("sim", 0));
  opt.step();
  std::vector<float> want_w = w0;
  const auto factor = static_cast<float>(1.0 - lr * wd);
  for (float& x : want_w) x *= factor;
  EXPECT_TRUE(bits_equal(w.data.to_vector<float>(), want_w));
  EXPECT_TRUE(bits_equal(b.data.to_vector<float>(), b0));  // 1-D: no decay
  // Steps 2..4 against Adam(weight_decay 0) on the same values, decayed by hand for w.
  auto aw = param_on("aw", want_w, {2, 2});
  auto ab = param_on("ab", b0, {2});
  optim::Adam adam({&aw, &ab}, {.lr = lr, .beta2 = 0.99});
  aw.grad = w.grad;
  ab.grad = b.grad;
  adam.step();  // the same zero first step: moments and step count as opt's
  for (int s = 1; s < 4; ++s) {
    const std::vector<float> gw = grad_of(s, 4, 1.0f), gb = grad_of(s, 2, 2.0f);
    for (nn::Parameter* p : {&w, &aw}) p->grad = Tensor::from_vector(gw, {2, 2}, Device("sim", 0));
    for (nn::Parameter* p : {&b, &ab}) p->grad = Tensor::from_vector(gb, {2}, Device("sim", 0));
    std::vector<float> decayed = aw.data.to_vector<float>();
    for (float& x : decayed) x *= factor;
    aw.data.copy_(Tensor::from_vector(decayed, {2, 2}, Device::cpu()));
    opt.step();
    adam.step();
    EXPECT_TRUE(bits_equal(w.data.to_vector<float>(), aw.data.to_vector<float>())) << "step " << s;
    EXPECT_TRUE(bits_equal(b.data.to_vector<float>(), ab.data.to_vector<float>())) << "step " << s;
  }
}

TEST_F(GptOptimTest, AdamWStateDictRoundTripGivesTheSameNextStep) {
  const optim::AdamWOptions o{.lr = 0.01, .beta2 = 0.99, .weight_decay = 0.1};
  const std::vector<float> w0{0.5f, -1.25f, 3.0f, 0.1f, 2.0f, -0.5f}, b0{1.5f, -2.0f, 0.5f};
  auto w = param_on("w", w0, {3, 2});
  auto b = param_on("b", b0, {3});
  optim::AdamW opt({&w, &b}, o);
  auto set_grads = [](int s, nn::Parameter& pw, nn::Parameter& pb) {
    pw.grad = Tensor::from_vector(grad_of(s, 6, 1.0f), {3, 2}, Device("sim", 0));
    pb.grad = Tensor::from_vector(grad_of(s, 3, 0.5f), {3}, Device("sim", 0));
  };
  for (int s = 0; s < 2; ++s) {
    set_grads(s, w, b);
    opt.step();
  }
  const optim::OptimizerState st = opt.state_dict();
  EXPECT_EQ(st.type, "AdamW");
  EXPECT_EQ(st.options.at("lr"), "0.01");
  EXPECT_EQ(st.options.at("beta2"), "0.98999999999999999");
  EXPECT_EQ(st.options.at("param_groups.0.weight_decay"), "0.10000000000000001");
  EXPECT_EQ(st.options.at("param_groups.1.weight_decay"), "0");
  EXPECT_EQ(st.options.at("param_groups.1.num_params"), "1");
  std::vector<std::string> names;
  for (const auto& [name, t] : st.tensors) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                                      "state.1.step", "state.1.exp_avg", "state.1.exp_avg_sq"}));

  // A fresh optimizer over copies of the parameters, made with another lr: the load takes the
  // saved lr (as torch does) and the next step has the same bits.
  auto w2 = param_on("w", w.data.to_vector<float>(), {3, 2});
  auto b2 = param_on("b", b.data.to_vector<float>(), {3});
  optim::AdamWOptions other = o;
  other.lr = 0.5;
  optim::AdamW opt2({&w2, &b2}, other);
  opt2.load_state_dict(st);
  EXPECT_EQ(opt2.lr(), 0.01);
  EXPECT_EQ(opt2.step_count(0), 2);
  set_grads(2, w, b);
  set_grads(2, w2, b2);
  opt.step();
  opt2.step();
  EXPECT_TRUE(bits_equal(w2.data.to_vector<float>(), w.data.to_vector<float>()));
  EXPECT_TRUE(bits_equal(b2.data.to_vector<float>(), b.data.to_vector<float>()));
  EXPECT_TRUE(
      bits_equal(opt2.exp_avg_sq(0).to_vector<float>(), opt.exp_avg_sq(0).to_vector<float>()));

  // Other betas or decays are refused, naming the option, and change nothing.
  optim::AdamWOptions beta = o;
  beta.beta2 = 0.95;
  optim::AdamW opt3({&w2, &b2}, beta);
  expect_invalid(
      [&] { opt3.load_state_dict(st); },
      "optim::AdamW::load_state_dict: state: option beta2 differs: saved beta2=0.98999999999999999");
  EXPECT_EQ(opt3.step_count(0), 0);
  optim::AdamWOptions decay = o;
  decay.weight_decay = 0.2;
  optim::AdamW opt4({&w2, &b2}, decay);
  expect_invalid([&] { opt4.load_state_dict(st); }, "option param_groups.0.weight_decay differs");
  optim::OptimizerState bad_lr = st;
  bad_lr.options["lr"] = "fast";
  expect_invalid([&] { opt2.load_state_dict(bad_lr); },
                 "option lr: expected a finite number >= 0, got 'fast'");
  EXPECT_EQ(opt2.lr(), 0.01);
}

TEST_F(GptOptimTest, AdamWStateSurvivesACheckpointFile) {
  // The options (param_groups.<g>.*) go through the checkpoint's safetensors metadata.
  auto net = nn::mlp({3, 4, 2}, Device("sim", 0), 9);
  auto net2 = nn::mlp({3, 4, 2}, Device("sim", 0), 10);
  const optim::AdamWOptions o{.lr = 0.02, .beta2 = 0.99, .weight_decay = 0.1};
  optim::AdamW opt(net->parameters(), o), opt2(net2->parameters(), o);
  auto step = [](nn::Module& m, optim::AdamW& a, int s) {
    for (nn::Parameter* p : m.parameters()) {
      std::vector<float> g = grad_of(s, static_cast<std::size_t>(p->data.numel()), 0.1f);
      p->grad = Tensor::from_vector(g, p->data.shape(), p->data.device());
    }
    a.step();
  };
  step(*net, opt, 0);
  TrainerState ts;
  ts.step = 1;
  const std::string dir = scratch_path("gpt_optim", "adamw_ckpt");
  const std::string path = save_checkpoint(dir, *net, opt, ts);
  Checkpoint c = read_checkpoint(path);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_EQ(c.optimizer.options.at("param_groups.0.num_params"), "2");  // the two weights
  for (std::size_t i = 0; i < c.params.size(); ++i)
    net2->parameters()[i]->data.copy_(c.params[i].second);
  opt2.load_state_dict(c.optimizer);
  step(*net, opt, 1);
  step(*net2, opt2, 1);
  for (std::size_t i = 0; i < net->parameters().size(); ++i)
    EXPECT_TRUE(bits_equal(net2->parameters()[i]->data.to_vector<float>(),
                           net->parameters()[i]->data.to_vector<float>()))
        << "parameter " << i;
  std::filesystem::remove_all(dir);
}

// ---- the learning-rate schedule
// --------------------------------------------------------------------

/// nanoGPT train.py get_lr, as written there.
double get_lr(std::int64_t it, double learning_rate, std::int64_t warmup_iters,
              std::int64_t lr_decay_iters, double min_lr) {
  if (it < warmup_iters) return learning_rate * (it + 1) / (warmup_iters + 1);
  if (it > lr_decay_iters) return min_lr;
  const double decay_ratio = double(it - warmup_iters) / double(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(3.141592653589793 * decay_ratio));
  return min_lr + coeff * (learning_rate - min_lr);
}

TEST(GptSchedule, NanoGptLrAtKnownIterations) {
  // config/train_shakespeare_char.py: 1e-3, warmup 100, decay to 1e-4 over 5000 iterations.
  const optim::NanoGPTSchedule sched{
      .learning_rate = 1e-3, .warmup_iters = 100, .lr_decay_iters = 5000, .min_lr = 1e-4};
  for (std::int64_t it : {0, 1, 50, 99, 100, 101, 2550, 4999, 5000, 5001, 9000}) {
    SCOPED_TRACE(it);
    EXPECT_EQ(sched(it), get_lr(it, 1e-3, 100, 5000, 1e-4));
    EXPECT_EQ(optim::nanogpt_lr(it, 1e-3, 100, 5000, 1e-4), sched(it));
  }
  EXPECT_DOUBLE_EQ(sched(0), 1e-3 / 101);            // the first warmup step
  EXPECT_DOUBLE_EQ(sched(99), 1e-3 * 100 / 101);     // the last one
  EXPECT_DOUBLE_EQ(sched(100), 1e-3);                // the top of the cosine
  EXPECT_DOUBLE_EQ(sched(2550), (1e-3 + 1e-4) / 2);  // its middle
  EXPECT_EQ(sched(5000), 1e-4);                      // its end: coeff = 0 exactly
  EXPECT_EQ(sched(5001), 1e-4);
  EXPECT_EQ(sched(1000000), 1e-4);
  const optim::NanoGPTSchedule constant{.learning_rate = 3e-4, .decay_lr = false};
  EXPECT_EQ(constant(0), 3e-4);
  EXPECT_EQ(constant(123456), 3e-4);
  EXPECT_EQ(optim::nanogpt_lr(7, 1e-3, 7, 7, 1e-4), 1e-4);  // an empty decay: min_lr from warmup on
  expect_invalid([] { optim::nanogpt_lr(-1, 1e-3, 10, 100, 1e-4); }, "it: expected >= 0, got -1");
  expect_invalid([] { optim::nanogpt_lr(0, 1e-3, 10, 5, 1e-4); },
                 "lr_decay_iters: expected >= warmup_iters (10), got 5");
  expect_invalid([] { optim::nanogpt_lr(0, std::nan(""), 10, 100, 1e-4); },
                 "learning_rate: expected a finite value >= 0");
}

// ---- clip_grad_norm_
// -------------------------------------------------------------------------------

TEST_F(GptOptimTest, ClipGradNormMatchesTheClosedForm) {
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    SCOPED_TRACE(mode == Determinism::bitwise ? "bitwise" : "fast");
    auto a = param_on("a", {0, 0}, {2});
    auto w = param_on("w", {0, 0, 0, 0}, {2, 2}, Device("sim", 1));
    auto none = param_on("none", {1}, {1});  // no grad: skipped
    // (9 + 16 + 4 + 64 + 64) / 256^2 = 157 / 65536, all exact: total = sqrt(157) / 256, small
    // enough that torch's + 1e-6 changes coef's bits.
    const float u = 1.0f / 256;
    const std::vector<float> ga{3 * u, 4 * u}, gw{-2 * u, 8 * u, 0, 8 * u};
    auto set = [&] {
      a.grad = Tensor::from_vector(ga, {2}, Device("sim", 0));
      w.grad = Tensor::from_vector(gw, {2, 2}, Device("sim", 1));  // another device
    };
    const std::vector<nn::Parameter*> ps{&a, &none, &w};
    const float total = std::sqrt(157.0f) / 256;
    // Below the norm: returned, grads untouched.
    set();
    EXPECT_EQ(optim::clip_grad_norm_(ps, 0.05, mode), total);
    EXPECT_TRUE(bits_equal(a.grad.to_vector<float>(), ga));
    EXPECT_TRUE(bits_equal(w.grad.to_vector<float>(), gw));
    EXPECT_FALSE(none.grad.defined());
    // Above: every grad times max_norm / (total + 1e-6), in float as torch.
    set();
    EXPECT_EQ(optim::clip_grad_norm_(ps, 0.01, mode), total);
    const float coef = 0.01f / (total + 1e-6f);
    ASSERT_NE(bits(coef), bits(0.01f / total));
    std::vector<float> wa = ga, ww = gw;
    for (float& x : wa) x *= coef;
    for (float& x : ww) x *= coef;
    EXPECT_TRUE(bits_equal(a.grad.to_vector<float>(), wa));
    EXPECT_TRUE(bits_equal(w.grad.to_vector<float>(), ww));
    // The clipped norm is max_norm * total / (total + 1e-6), to float roundings.
    EXPECT_NEAR(optim::clip_grad_norm_(ps, 100.0, mode), 0.01 * total / (total + 1e-6), 1e-9);
  }
  auto p = param_on("p", {1}, {1});
  EXPECT_EQ(optim::clip_grad_norm_({&p}, 1.0), 0.0f);  // no grads at all
  expect_invalid([&] { optim::clip_grad_norm_({&p}, 0.0); },
                 "optim::clip_grad_norm_: max_norm: expected a finite value > 0, got 0");
  p.grad = Tensor::zeros({2}, DType::f32, Device("sim", 0));
  expect_invalid([&] { optim::clip_grad_norm_({&p}, 1.0); },
                 "params[0] ('p'): grad: expected [1] f32");
}

TEST_F(GptOptimTest, ClipGradNormGivesTheSameBitsOnEveryDdpRank) {
  constexpr std::int64_t kBatch = 16, kIn = 5, kOut = 3;
  std::vector<float> xs(kBatch * kIn), ys(kBatch * kOut);
  for (std::size_t i = 0; i < xs.size(); ++i)
    xs[i] = uniform(3, stream_id(kStreamSynthetic, 40), i, -1, 1);
  for (std::size_t i = 0; i < ys.size(); ++i)
    ys[i] = uniform(3, stream_id(kStreamSynthetic, 41), i, -1, 1);
  const Tensor x = Tensor::from_vector(xs, {kBatch, kIn}),
               y = Tensor::from_vector(ys, {kBatch, kOut});
  std::vector<float> norms(4);
  std::vector<std::vector<float>> grads(4);
  on_ranks(4, Determinism::bitwise, [&](int r, Communicator& comm) {
    nn::WithLoss model(nn::mlp({kIn, 16, kOut}, comm.device(), 5), std::make_unique<nn::MSELoss>());
    model.loss().set_global_batch(kBatch);
    parallel::DistributedDataParallelOptions o;
    o.average_gradients = false;  // Note [DDP loss scaling]
    parallel::DistributedDataParallel ddp(model, comm, o);
    const auto [lo, hi] = ddp.local_rows(kBatch);
    ddp.forward({x.narrow(lo, hi - lo), y.narrow(lo, hi - lo)}, kBatch);
    ddp.backward();
    const auto rank = static_cast<std::size_t>(r);
    norms[rank] = optim::clip_grad_norm_(model.parameters(), 0.05, Determinism::bitwise);
    for (nn::Parameter* p : model.parameters())
      for (float g : p->grad.to_vector<float>()) grads[rank].push_back(g);
  });
  EXPECT_GT(norms[0], 0.05f);  // it clipped
  for (std::size_t r = 1; r < 4; ++r) {
    EXPECT_EQ(bits(norms[r]), bits(norms[0])) << "rank " << r;
    EXPECT_TRUE(bits_equal(grads[r], grads[0])) << "rank " << r;
  }
}

}  // namespace
}  // namespace ditto
