// ditto-train --model gpt (ditto_train_gpt.h): the GPT's options, their checks, the TrainerConfig
// of nanoGPT's recipe, and what the run prints.
#include "examples/ditto_train_gpt.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/nn/gpt.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/runtime/error.h"

namespace ditto_train {

using namespace ditto;

const std::set<std::string>& gpt_only_options() {
  static const std::set<std::string> names{
      "--n-layer", "--n-head", "--n-embd", "--block-size", "--max-iters", "--eval-interval",
      "--eval-iters", "--min-lr", "--warmup-iters", "--lr-decay-iters", "--grad-clip",
      "--dropout", "--bias", "--beta1", "--beta2", "--sample", "--temperature", "--top-k"};
  return names;
}

const std::set<std::string>& mlp_only_options() {
  static const std::set<std::string> names{"--hidden", "--epochs", "--label-column", "--header",
                                           "--val-fraction", "--loss", "--optimizer",
                                           "--momentum"};
  return names;
}

void add_gpt_options(CLI::App& app, GptOptions& g) {
  const char* group = "GPT (--model gpt; nanoGPT's options and CPU defaults)";
  auto opt = [&](const char* name, auto& value, const char* help) {
    app.add_option(name, value, help)->capture_default_str()->group(group);
  };
  opt("--n-layer", g.n_layer, "transformer blocks");
  opt("--n-head", g.n_head, "attention heads (n_embd % n_head == 0)");
  opt("--n-embd", g.n_embd, "embedding width");
  opt("--block-size", g.block_size, "context length in characters");
  opt("--max-iters", g.max_iters, "optimizer steps");
  opt("--eval-interval", g.eval_interval, "steps between evaluations (also at 0 and the end)");
  opt("--eval-iters", g.eval_iters, "batches per split per evaluation (fixed windows)");
  opt("--min-lr", g.min_lr, "learning rate at the end of the cosine decay");
  opt("--warmup-iters", g.warmup_iters, "steps of linear warm-up");
  opt("--lr-decay-iters", g.lr_decay_iters, "step where the cosine decay reaches --min-lr");
  opt("--grad-clip", g.grad_clip, "clip the gradients' global norm to this (0: off)");
  opt("--dropout", g.dropout, "dropout probability of every dropout site");
  app.add_flag("--bias", g.bias, "biases in the Linears and LayerNorms (default: none)")
      ->group(group);
  opt("--beta1", g.beta1, "AdamW beta1");
  opt("--beta2", g.beta2, "AdamW beta2");
  opt("--sample", g.sample, "characters to generate at the end (0: none)");
  opt("--temperature", g.temperature, "sampling temperature");
  opt("--top-k", g.top_k, "sample among the k likeliest characters (0: all)");
}

namespace {

void at_least(const char* opt, std::int64_t v, std::int64_t lo, const char* note = "") {
  DITTO_CHECK(v >= lo, opt, ": expected >= ", lo, note, ", got ", v);
}

void finite_in(const char* opt, double v, double lo, bool lo_open, double hi, bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  DITTO_CHECK(ok, opt, ": expected a value in ", lo_open ? "(" : "[", lo, ", ", hi,
              hi_open ? ")" : "]", ", got ", v);
}

/// Every GPT option's own check (the Trainer checks the shared ones).
void check_options(const GptOptions& g, double lr, double weight_decay) {
  at_least("--n-layer", g.n_layer, 1);
  DITTO_CHECK(g.n_layer <= 85, "--n-layer: expected 1..85 (each block's dropout sites must fit "
              "in the 8 bits of Note [Dropout masks]), got ", g.n_layer);
  at_least("--n-head", g.n_head, 1);
  at_least("--n-embd", g.n_embd, 1);
  DITTO_CHECK(g.n_embd % g.n_head == 0, "--n-embd: expected a multiple of --n-head = ", g.n_head,
              ", got ", g.n_embd);
  at_least("--block-size", g.block_size, 1);
  at_least("--max-iters", g.max_iters, 1);
  at_least("--eval-interval", g.eval_interval, 1);
  at_least("--eval-iters", g.eval_iters, 0, " (0: no evaluation)");
  at_least("--warmup-iters", g.warmup_iters, 0);
  DITTO_CHECK(g.lr_decay_iters > g.warmup_iters, "--lr-decay-iters: expected > --warmup-iters = ",
              g.warmup_iters, " (nanoGPT's cosine decay runs from the one to the other), got ",
              g.lr_decay_iters);
  const double inf = HUGE_VAL;
  finite_in("--lr", lr, 0, true, inf, true);
  finite_in("--min-lr", g.min_lr, 0, false, lr, false);
  finite_in("--weight-decay", weight_decay, 0, false, inf, true);
  finite_in("--grad-clip", g.grad_clip, 0, false, inf, true);
  finite_in("--dropout", g.dropout, 0, false, 1, true);
  finite_in("--beta1", g.beta1, 0, false, 1, true);
  finite_in("--beta2", g.beta2, 0, false, 1, true);
  at_least("--sample", g.sample, 0, " (0: no sample)");
  finite_in("--temperature", g.temperature, 0, true, inf, true);
  at_least("--top-k", g.top_k, 0, " (0: every character)");
}

std::string model_name(const nn::GPTConfig& m) {
  std::ostringstream s;
  s << "gpt(n_layer=" << m.n_layer << ",n_head=" << m.n_head << ",n_embd=" << m.n_embd
    << ",block_size=" << m.block_size << ",vocab_size=" << m.vocab_size
    << ",bias=" << (m.bias ? "True" : "False") << ",dropout=" << m.dropout << ")";
  return s.str();
}

/// Parameters of nanoGPT's GPT (tied head counted once), as its get_num_params(False).
std::int64_t gpt_params(const nn::GPTConfig& m) {
  const std::int64_t C = m.n_embd, b = m.bias ? 1 : 0;
  const std::int64_t block = 2 * C * (1 + b) + 3 * C * C + 3 * C * b + C * C + C * b +
                             4 * C * C + 4 * C * b + 4 * C * C + C * b;
  return m.vocab_size * C + m.block_size * C + m.n_layer * block + C * (1 + b);
}

std::string hms(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

}  // namespace

std::shared_ptr<train::TextDataSource> configure_gpt(const GptOptions& g,
                                                     const std::set<std::string>& given,
                                                     const std::string& data,
                                                     train::TrainerConfig& c) {
  for (const std::string& opt : mlp_only_options())
    DITTO_CHECK(!given.count(opt), opt, ": expected --model mlp (the GPT's options are nanoGPT's: "
                "--max-iters, not --epochs, with AdamW and cross-entropy), got --model gpt");
  const double lr = given.count("--lr") ? static_cast<double>(*c.lr) : g.learning_rate;
  const double wd = given.count("--weight-decay") ? c.weight_decay : g.weight_decay;
  if (!given.count("--batch-size")) c.batch_size = g.batch_size;
  check_options(g, lr, wd);
  std::shared_ptr<train::TextDataSource> text;
  try {
    text = std::make_shared<train::TextDataSource>(data, g.block_size, c.seed);
  } catch (const Error& e) {
    throw InvalidArgument(detail::cat("--data: ", e.what()));
  }
  nn::GPTConfig m;
  m.block_size = g.block_size;
  m.vocab_size = text->vocab_size();
  m.n_layer = g.n_layer;
  m.n_head = g.n_head;
  m.n_embd = g.n_embd;
  m.dropout = static_cast<float>(g.dropout);
  m.bias = g.bias;
  const std::uint64_t seed = c.seed;
  c.make_model = [m, seed](const Device& d) { return std::make_unique<nn::GPT>(m, d, seed); };
  c.model_name = model_name(m);
  c.optimizer = "adamw";
  c.lr = static_cast<float>(lr);
  c.weight_decay = static_cast<float>(wd);
  const double beta1 = g.beta1, beta2 = g.beta2;
  c.make_optimizer = [beta1, beta2, wd](std::vector<nn::Parameter*> params, float rate) {
    optim::AdamWOptions o;  // nanoGPT's configure_optimizers: decay on the 2-D weights only
    o.lr = rate;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.weight_decay = wd;
    return std::make_unique<optim::AdamW>(std::move(params), o);
  };
  const std::int64_t warmup = g.warmup_iters, decay = g.lr_decay_iters;
  const double min_lr = g.min_lr;
  c.lr_schedule = [lr, warmup, decay, min_lr](std::int64_t it) {
    return optim::nanogpt_lr(it, lr, warmup, decay, min_lr);
  };
  c.grad_clip = g.grad_clip;
  c.max_iters = g.max_iters;
  c.eval_interval = g.eval_interval;
  c.eval_iters = g.eval_iters;
  // A resume to the same bits needs the same schedule and clipping (AdamW checks its own).
  c.checkpoint_settings = {{"learning_rate", optim::exact_str(lr)},
                           {"min_lr", optim::exact_str(min_lr)},
                           {"warmup_iters", std::to_string(warmup)},
                           {"lr_decay_iters", std::to_string(decay)},
                           {"grad_clip", optim::exact_str(g.grad_clip)}};
  c.checkpoint_aliases = {{"lm_head.weight", "transformer.wte.weight"}};  // nanoGPT's tied head
  c.field_names["max_iters"] = "--max-iters";
  c.field_names["eval_interval"] = "--eval-interval";
  c.field_names["eval_iters"] = "--eval-iters";
  c.field_names["grad_clip"] = "--grad-clip";
  return text;
}

void print_gpt_start(const train::RunInfo& r, const GptOptions& g, const train::TrainerConfig& c,
                     const train::TextDataSource& data) {
  nn::GPTConfig m;
  m.block_size = g.block_size;
  m.vocab_size = data.vocab_size();
  m.n_layer = g.n_layer;
  m.n_head = g.n_head;
  m.n_embd = g.n_embd;
  m.bias = g.bias;
  // The model's own count (dp builds it before the start); ddp reports before building: the
  // count of nanoGPT's layout (the CLI test checks that both agree).
  const std::int64_t params = r.params > 0 ? r.params : gpt_params(m);
  std::printf("ditto-train: model=gpt n_layer=%" PRId64 " n_head=%" PRId64 " n_embd=%" PRId64
              " block_size=%" PRId64 " vocab_size=%" PRId64 " bias=%s dropout=%g params=%" PRId64
              " (%.2fM without wpe) backend=%s devices=%d trainer=%s%s determinism=%s\n",
              m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size,
              m.bias ? "True" : "False", g.dropout, params,
              static_cast<double>(params - m.block_size * m.n_embd) / 1e6, r.backend.c_str(),
              r.devices, train::trainer_kind_name(r.trainer),
              r.processes ? " (processes)" : "", determinism_name(r.determinism));
  std::printf("ditto-train: data=%s bytes=%" PRId64 " (train %" PRId64 ", val %" PRId64
              " tokens) batch_size=%" PRId64 " max_iters=%" PRId64 " lr=%g min_lr=%g "
              "warmup_iters=%" PRId64 " lr_decay_iters=%" PRId64 " weight_decay=%g "
              "betas=(%g, %g) grad_clip=%g eval_interval=%" PRId64 " eval_iters=%" PRId64
              " seed=%" PRIu64 "\n",
              data.name().c_str(), data.size(), data.train_tokens(), data.val_tokens(),
              c.batch_size, c.max_iters, static_cast<double>(*c.lr), g.min_lr, g.warmup_iters,
              g.lr_decay_iters, static_cast<double>(c.weight_decay), g.beta1, g.beta2,
              c.grad_clip, c.eval_interval, c.eval_iters, c.seed);
  std::fflush(stdout);
}

void print_gpt_eval(const train::EvalMetrics& m) {
  std::printf("step %" PRId64 ": train loss %.4f, val loss %.4f (lr %.3e", m.step, m.train_loss,
              m.val_loss, m.lr);
  if (m.step > 0 && m.tokens_per_s > 0)
    std::printf(", %.0f tokens/s, ETA %s", m.tokens_per_s, hms(m.eta_s).c_str());
  std::printf(")\n");
  std::fflush(stdout);
}

std::string gpt_sample(train::Replica& rep, const GptOptions& g,
                       const train::TextDataSource& data, std::uint64_t seed) {
  if (g.sample == 0) return "";
  auto* gpt = dynamic_cast<nn::GPT*>(&rep.model());
  DITTO_CHECK(gpt != nullptr, "--sample: expected the trained model to be an nn::GPT");
  const auto& itos = data.itos();
  // nanoGPT sample.py starts from "\n"; a text without newlines starts from its token 0.
  std::vector<std::int64_t> prompt{0};
  for (std::size_t t = 0; t < itos.size(); ++t)
    if (itos[t] == '\n') prompt = {static_cast<std::int64_t>(t)};
  const std::int64_t top_k = g.top_k >= data.vocab_size() ? 0 : g.top_k;
  std::vector<std::int64_t> out = gpt->generate(prompt, g.sample,
                                                static_cast<float>(g.temperature), top_k, seed);
  return data.decode(std::vector<std::int64_t>(out.begin() + 1, out.end()));
}

}  // namespace ditto_train
