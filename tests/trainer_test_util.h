// What the Trainer tests share: the tiny GPT run (tests/test_gpt_trainer.cpp, test_grad_accum.cpp,
// test_token_source.cpp), a GPT of a few thousand parameters trained for a few iterations with
// AdamW, optionally with nanoGPT's recipe (warm-up and cosine decay, clipping, beta2 0.99, weight
// decay 0.1); the GPT runs priced on a device profile (test_dry_run.cpp, test_compute_units.cpp);
// the mixed-magnitude classification data of the bitwise MLP runs (test_bitwise_trainer.cpp,
// test_grad_accum.cpp); the parameters a fit ends with.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend_sim/sim_run.h"
#include "core/data/dataset.h"
#include "core/nn/gpt.h"
#include "core/numerics/random.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/sgd.h"
#include "core/train/trainer.h"

namespace ditto::test {

/// A train::DataSource that forwards every call to `inner`: a test's wrapper overrides only what it
/// watches or changes.
class ForwardingSource : public train::DataSource {
 public:
  explicit ForwardingSource(std::shared_ptr<train::DataSource> inner) : inner_(std::move(inner)) {}
  std::int64_t batches_per_epoch(std::int64_t b) const override {
    return inner_->batches_per_epoch(b);
  }
  data::Batch batch(std::int64_t e, std::int64_t i, std::int64_t b) override {
    return inner_->batch(e, i, b);
  }
  const data::Dataset& eval_set() const override { return inner_->eval_set(); }
  std::int64_t train_size() const override { return inner_->train_size(); }
  std::int64_t shortest_batch_rows(std::int64_t b) const override {
    return inner_->shortest_batch_rows(b);
  }
  std::int64_t num_inputs() const override { return inner_->num_inputs(); }
  std::int64_t num_outputs() const override { return inner_->num_outputs(); }
  std::map<std::string, std::string> checkpoint_config() const override {
    return inner_->checkpoint_config();
  }
  data::Batch step_batch(std::int64_t step, std::int64_t b) override {
    return inner_->step_batch(step, b);
  }
  data::Batch step_batch_rows(std::int64_t step, std::int64_t b, std::int64_t lo,
                              std::int64_t hi) override {
    return inner_->step_batch_rows(step, b, lo, hi);
  }
  data::Batch eval_batch(train::EvalSplit split, std::int64_t k, std::int64_t b) override {
    return inner_->eval_batch(split, k, b);
  }

 protected:
  std::shared_ptr<train::DataSource> inner_;
};

/// The bundled digits data set (examples/data/digits.csv): 20% held out for validation, seed 0.
inline std::shared_ptr<train::CsvDataSource> digits() {
  return std::make_shared<train::CsvDataSource>(DITTO_DIGITS_CSV, data::CsvOptions{}, 0.2, 0);
}

/// How the tiny GPT of tiny_gpt_trainer trains.
struct TinyGptRun {
  std::int64_t max_iters = 8;
  std::int64_t eval_interval = 4;
  std::int64_t eval_iters = 2;
  /// nanoGPT's recipe: lr 1e-2 warmed up over 2 iterations then cosine-decayed to 1e-3 at
  /// max_iters (optim::nanogpt_lr), gradients clipped at norm 1, AdamW beta2 0.99 and weight
  /// decay 0.1. Else AdamW's defaults at a constant 1e-2.
  bool nanogpt_recipe = true;
};

/// A TrainerConfig of GPT `m` (named "tiny-gpt", initialised from seed 0) on `devices` devices
/// of trainer `kind`, batches of 8 rows, AdamW (the optimizer "adamw") as `run` says.
inline train::TrainerConfig tiny_gpt_trainer(const nn::GPTConfig& m, int devices,
                                             train::TrainerKind kind, const TinyGptRun& run = {}) {
  train::TrainerConfig c;
  c.devices = devices;
  c.trainer = kind;
  c.make_model = [m](const Device& d) { return std::make_unique<nn::GPT>(m, d, 0); };
  c.model_name = "tiny-gpt";
  c.optimizer = "adamw";
  const bool recipe = run.nanogpt_recipe;
  c.make_optimizer = [recipe](std::vector<nn::Parameter*> params, float lr) {
    optim::AdamWOptions o;
    o.lr = lr;
    if (recipe) {
      o.beta2 = 0.99;
      o.weight_decay = 0.1;
    }
    return std::make_unique<optim::AdamW>(std::move(params), o);
  };
  c.lr = 1e-2f;
  if (recipe) {
    const std::int64_t decay_iters = run.max_iters;
    c.lr_schedule = [decay_iters](std::int64_t it) {
      return optim::nanogpt_lr(it, 1e-2, 2, decay_iters, 1e-3);
    };
    c.grad_clip = 1.0;
  }
  c.batch_size = 8;
  c.max_iters = run.max_iters;
  c.eval_interval = run.eval_interval;
  c.eval_iters = run.eval_iters;
  return c;
}

/// How priced_gpt's run trains and where it is priced.
struct PricedGptRun {
  std::string profile;  ///< the device profile the simulator prices with (SimRunOptions::profile)
  int devices = 1;
  bool dry_run = true;  ///< TrainerConfig::dry_run: priced only, nothing computed
  Determinism determinism = Determinism::fast;
  std::int64_t batch_size = 8, max_iters = 2;
  double grad_clip = 1.0;
  float lr = 1e-3f;
  std::uint64_t seed = 0;  ///< the GPT's initialisation
};

/// A TrainerConfig of GPT `m` on `run.devices` devices priced on `run.profile`
/// (sim::add_sim_run), with nanoGPT's optimizer: AdamW (the optimizer "adamw") at the run's lr
/// with weight decay 0.1, gradients clipped at `run.grad_clip`.
inline train::TrainerConfig priced_gpt(const nn::GPTConfig& m, const PricedGptRun& run) {
  train::TrainerConfig c;
  c.devices = run.devices;
  c.dry_run = run.dry_run;
  sim::SimRunOptions sim_options;
  sim_options.profile = run.profile;
  sim::add_sim_run(c, sim_options);
  c.determinism = run.determinism;
  c.batch_size = run.batch_size;
  c.max_iters = run.max_iters;
  c.grad_clip = run.grad_clip;
  c.optimizer = "adamw";
  c.lr = run.lr;
  const std::uint64_t seed = run.seed;
  c.make_model = [m, seed](const Device& d) { return std::make_unique<nn::GPT>(m, d, seed); };
  c.loss_may_overwrite_output =
      true;  // as configure_gpt: nn::GPT's backward never reads its logits
  c.make_optimizer = [](std::vector<nn::Parameter*> params, float lr) {
    optim::AdamWOptions o;
    o.lr = lr;
    o.weight_decay = 0.1;
    return std::make_unique<optim::AdamW>(std::move(params), o);
  };
  return c;
}

/// Trains `c` on `data` (Trainer::fit) and returns rank 0's parameters at the end, flattened
/// (train::flat_parameters of the model TrainerCallbacks::on_finish sees).
inline std::vector<float> fitted_parameters(const train::TrainerConfig& c,
                                            std::shared_ptr<train::DataSource> data) {
  std::vector<float> all;
  train::TrainerCallbacks cb;
  cb.on_finish = [&](train::Replica& r) { all = train::flat_parameters(r.model()); };
  train::Trainer(c, std::move(data), cb).fit();
  return all;
}

/// The bitwise MLP runs' optimizer: SGD, lr 0.05, Nesterov momentum 0.9, weight decay 0.001.
inline std::unique_ptr<optim::Optimizer> nesterov_sgd(std::vector<nn::Parameter*> params) {
  optim::SGDOptions so;
  so.lr = 0.05f;
  so.momentum = 0.9f;
  so.weight_decay = 0.001f;
  so.nesterov = true;
  return std::make_unique<optim::SGD>(std::move(params), so);
}

/// Mixed-magnitude synthetic classification data: n rows of 12 features (scales 100, 1 and 0.01
/// in turn, so sums in another order differ in their bits), 5 classes; the feature of a row's
/// class shifted by half its scale (learnable).
inline data::Dataset mixed_magnitude_classes(std::int64_t n) {
  const std::int64_t f = 12;
  std::vector<float> x(static_cast<std::size_t>(n * f));
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = philox_u32(5, stream_id(kStreamSynthetic, 20), i) % 5;
    for (std::int64_t j = 0; j < f; ++j) {
      float scale = (j % 3 == 0) ? 100.0f : (j % 3 == 1 ? 1.0f : 0.01f);
      x[i * f + j] = scale * uniform(5, stream_id(kStreamSynthetic, 21), i * f + j, -1, 1) +
                     (j == y[i] ? 0.5f * scale : 0.0f);
    }
  }
  data::Dataset d;
  d.features = Tensor::from_vector(x, {n, f});
  d.labels = Tensor::from_vector(y, {n});
  return d;
}

}  // namespace ditto::test
