// ditto-train --model gpt (ditto_train_gpt.h): the GPT's options, their checks, the TrainerConfig
// of nanoGPT's recipe, and what the run prints.
#include "examples/ditto_train_gpt.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/nn/gpt.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/runtime/error.h"
#include "core/train/synthetic_source.h"

namespace ditto_train {

using namespace ditto;

const std::set<std::string>& gpt_only_options() {
  static const std::set<std::string> names{
      "--n-layer", "--n-head", "--n-embd", "--block-size", "--max-iters", "--eval-interval",
      "--eval-iters", "--min-lr", "--warmup-iters", "--lr-decay-iters", "--grad-clip",
      "--dropout", "--bias", "--beta1", "--beta2", "--sample", "--temperature", "--top-k",
      "--preset", "--vocab-size", "--data-format", "--val-data"};
  return names;
}

const std::set<std::string>& mlp_only_options() {
  static const std::set<std::string> names{"--hidden", "--epochs", "--label-column", "--header",
                                           "--val-fraction", "--loss", "--optimizer",
                                           "--momentum", "--classes"};
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
  opt("--preset", g.preset,
      "nanoGPT's GPT-2 size: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl (block 1024, vocab "
      "50304, biases; explicit --n-layer etc. win)");
  opt("--vocab-size", g.vocab_size,
      "rows of wte (0: the text's vocabulary, llm.c's tokenizer's 50257 / 128256; --preset: "
      "50304); nanoGPT's .bin tokens need it: meta.pkl's vocab_size, 50304 for GPT-2 BPE");
  opt("--data-format", g.data_format,
      "what --data holds: auto (llm.c shards by their magic 20240520 / 20240801, else nanoGPT "
      "uint16 tokens for a name ending in .bin, else a text), text, llmc or nanogpt");
  opt("--val-data", g.val_data,
      "validation token files (a file, comma list or glob; default: --data's name with its last "
      "'train' made 'val' and a shard number any: fineweb_val_*.bin, val.bin beside train.bin)");
}

void apply_preset(GptOptions& g, const std::set<std::string>& given) {
  if (g.preset.empty()) return;
  const nn::GPTConfig p = nn::gpt2_config(g.preset, "--preset");
  auto set = [&](const char* opt, std::int64_t& field, std::int64_t v) {
    if (!given.count(opt)) field = v;
  };
  set("--n-layer", g.n_layer, p.n_layer);
  set("--n-head", g.n_head, p.n_head);
  set("--n-embd", g.n_embd, p.n_embd);
  set("--block-size", g.block_size, p.block_size);
  set("--vocab-size", g.vocab_size, p.vocab_size);
  if (!given.count("--bias")) g.bias = p.bias;  // GPT-2 has biases (from_pretrained: bias=True)
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

}  // namespace

double gpt_flops_per_token(const nn::GPTConfig& m) {
  // nanoGPT model.py estimate_mfu (the PaLM paper's formula, its appendix B): N =
  // get_num_params() (non_embedding: without wpe), flops_per_token = 6N + 12 L H Q T with
  // L = n_layer, H = n_head, Q = n_embd / n_head (so H Q = n_embd), T = block_size.
  const double N = static_cast<double>(nn::gpt_num_params(m) - m.block_size * m.n_embd);
  return 6.0 * N + 12.0 * static_cast<double>(m.n_layer) * static_cast<double>(m.n_embd) *
                       static_cast<double>(m.block_size);
}

namespace {

std::string hms(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return buf;
}

}  // namespace

namespace {

// The data of --data (Note [Token files]'s rule), into out.source and out.text or out.tokens.
void open_gpt_data(const GptOptions& g, const std::set<std::string>& given,
                   const std::string& data, std::uint64_t seed, GptData& out) {
  train::DataFormat format = train::parse_data_format(g.data_format, "--data-format");
  const std::vector<std::string> files = train::expand_data_paths(data, "--data");
  const bool detected = format == train::DataFormat::automatic;
  if (detected) {
    try {  // a file it cannot open or read is refused here, not taken for another format
      format = train::detect_data_format(files.front());
    } catch (const Error& e) {
      throw InvalidArgument(detail::cat("--data: ", e.what()));
    }
  }
  if (format == train::DataFormat::text) {
    DITTO_CHECK(files.size() == 1, "--data: expected one text file (a list or glob is for "
                "llm.c or nanoGPT token files), got ", files.size(), " files ('", files[0],
                "', '", files[1], "'", files.size() > 2 ? ", ..." : "", ")",
                detected ? ": the first is neither an llm.c shard (magic 20240520 / 20240801) "
                           "nor named .bin" : "");
    DITTO_CHECK(!given.count("--val-data"), "--val-data: expected token data with it (a text's "
                "validation split is its last 10%), got the text '", files[0], "'");
    try {
      out.source = out.text = std::make_shared<train::TextDataSource>(files[0], g.block_size,
                                                                       seed);
    } catch (const Error& e) {
      throw InvalidArgument(detail::cat("--data: ", e.what()));
    }
    DITTO_CHECK(g.vocab_size == 0 || g.vocab_size >= out.text->vocab_size(),
                g.vocab_size_from.empty() ? "--vocab-size" : g.vocab_size_from.c_str(),
                ": expected ", g.vocab_size_from.empty() ? "0 or " : "a vocab_size of ",
                "at least the text's vocabulary of ", out.text->vocab_size(), " tokens ('",
                files[0], "'), got ", g.vocab_size);
    return;
  }
  DITTO_CHECK(format != train::DataFormat::nanogpt || g.vocab_size > 0, "--vocab-size: expected "
              "the vocabulary size of nanoGPT's uint16 tokens in '", files[0], "' (meta.pkl's "
              "vocab_size, a Python pickle: python3 -c \"import pickle; print(pickle.load(open("
              "'meta.pkl', 'rb'))['vocab_size'])\"; 50304 for GPT-2's BPE without meta.pkl), got "
              "none", detected ? " (--data-format auto took it for nanoGPT tokens: not an llm.c "
              "shard, and named .bin; --data-format text if it is a text)" : "");
  std::vector<std::string> val;
  std::string val_name = g.val_data;
  // What a validation file's error is prefixed with: the option that named it.
  std::string val_option = "--val-data";
  if (given.count("--val-data")) {
    val = train::expand_data_paths(g.val_data, "--val-data");
  } else {
    val = train::val_paths_beside(data);
    if (!val.empty()) val_name = val.size() == 1 ? val[0] : val[0] + ", ...";
    val_option = "--data (validation file found beside it)";
  }
  try {  // the training files first: their errors before a missing val split's
    out.source = out.tokens = std::make_shared<train::TokenDataSource>(
        files, std::vector<std::string>{}, format, g.vocab_size, g.block_size, seed, data);
  } catch (const Error& e) {
    throw InvalidArgument(detail::cat("--data: ", e.what()));
  }
  if (!val.empty()) {
    try {
      out.tokens->open_val(val, val_name);
    } catch (const Error& e) {
      // A file's problem (exit 1, as --data's), not a usage error: a plain ditto::Error.
      throw Error(detail::cat(val_option, ": ", e.what()));
    }
  }
  DITTO_CHECK(!val.empty() || g.eval_iters == 0, "--val-data: expected validation data for '",
              data, "' (--val-data FILES, or files named as --data with its last 'train' made "
              "'val' beside it: llm.c's *_val_*.bin, nanoGPT's val.bin), got none (--eval-iters 0 "
              "trains without evaluation)");
}

}  // namespace

GptData configure_gpt(const GptOptions& g,
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
  at_least("--vocab-size", g.vocab_size, 0, " (0: the text's vocabulary)");
  GptData out;
  if (c.dry_run && !given.count("--data") && g.vocab_size > 0) {
    out.source = std::make_shared<train::ZeroTokenSource>(g.block_size, g.vocab_size);
  } else {
    open_gpt_data(g, given, data, c.seed, out);
  }
  nn::GPTConfig m;
  m.block_size = g.block_size;
  m.vocab_size = g.vocab_size > 0 ? g.vocab_size
                 : out.text       ? out.text->vocab_size()
                                  : out.tokens->vocab_size();
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
  // The MFU of the progress lines and the prediction: nanoGPT's estimate_mfu FLOPs a window.
  c.flops_per_sample = gpt_flops_per_token(m) * static_cast<double>(m.block_size);
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
  // The model's fields, as a resume that does not match names them (the checkpoint's "model").
  // (vocab_size is the text's unless --vocab-size is given: it keeps its own name.)
  for (const char* f : {"n_layer", "n_head", "n_embd", "block_size", "bias", "dropout"}) {
    std::string flag = std::string("--") + f;
    std::replace(flag.begin(), flag.end(), '_', '-');
    c.field_names[f] = flag;
  }
  out.model = m;
  return out;
}

void print_gpt_start(const train::RunInfo& r, const GptOptions& g, const train::TrainerConfig& c,
                     const GptData& data) {
  const nn::GPTConfig& m = data.model;
  // The model's own count (dp builds it before the start); ddp reports before building: the
  // count of nanoGPT's layout (the CLI test checks that both agree).
  const std::int64_t params = r.params > 0 ? r.params : nn::gpt_num_params(m);
  std::printf("ditto-train: model=gpt n_layer=%" PRId64 " n_head=%" PRId64 " n_embd=%" PRId64
              " block_size=%" PRId64 " vocab_size=%" PRId64 " bias=%s dropout=%g params=%" PRId64
              " (%.2fM without wpe) backend=%s devices=%d trainer=%s%s determinism=%s\n",
              m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size,
              m.bias ? "True" : "False", g.dropout, params,
              static_cast<double>(params - m.block_size * m.n_embd) / 1e6, r.backend.c_str(),
              r.devices, train::trainer_kind_name(r.trainer),
              r.processes ? " (processes)" : "", determinism_name(r.determinism));
  if (data.text)
    std::printf("ditto-train: data=%s bytes=%" PRId64 " (train %" PRId64 ", val %" PRId64
                " tokens)", data.text->name().c_str(), data.text->size(),
                data.text->train_tokens(), data.text->val_tokens());
  else if (const train::TokenDataSource* t = data.tokens.get())
    std::printf("ditto-train: data=%s format=%s files=%zu (train %" PRId64 " tokens; val %s: %"
                PRId64 " tokens)", t->name().c_str(), train::data_format_name(t->format()),
                t->train().files().size(), t->train_tokens(),
                t->val() ? t->val_name().c_str() : "none", t->val_tokens());
  else
    std::printf("ditto-train: data=zeros (dry run: every token id 0, no file read)");
  std::printf(" batch_size=%" PRId64 " max_iters=%" PRId64 " lr=%g min_lr=%g "
              "warmup_iters=%" PRId64 " lr_decay_iters=%" PRId64 " weight_decay=%g "
              "betas=(%g, %g) grad_clip=%g eval_interval=%" PRId64 " eval_iters=%" PRId64
              " seed=%" PRIu64 "\n",
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

std::string gpt_sample(train::Replica& rep, const GptOptions& g, const GptData& gd,
                       std::uint64_t seed) {
  if (g.sample == 0 || (!gd.text && !gd.tokens)) return "";
  if (gd.tokens) {
    auto* gpt = dynamic_cast<nn::GPT*>(&rep.model());
    DITTO_CHECK(gpt != nullptr, "--sample: expected the trained model to be an nn::GPT");
    const std::int64_t vocab = gd.tokens->vocab_size();
    const std::vector<std::int64_t> prompt{vocab > 50256 ? 50256 : 0};
    const std::int64_t top_k = g.top_k >= vocab ? 0 : g.top_k;
    const std::vector<std::int64_t> out = gpt->generate(
        prompt, g.sample, static_cast<float>(g.temperature), top_k, seed, vocab);
    std::string ids;
    for (std::size_t i = 1; i < out.size(); ++i)
      ids += (i > 1 ? " " : "") + std::to_string(out[i]);
    return ids;
  }
  const train::TextDataSource& data = *gd.text;
  auto* gpt = dynamic_cast<nn::GPT*>(&rep.model());
  DITTO_CHECK(gpt != nullptr, "--sample: expected the trained model to be an nn::GPT");
  const auto& itos = data.itos();
  // nanoGPT sample.py starts from "\n"; a text without newlines starts from its token 0.
  std::vector<std::int64_t> prompt{0};
  for (std::size_t t = 0; t < itos.size(); ++t)
    if (itos[t] == '\n') prompt = {static_cast<std::int64_t>(t)};
  const std::int64_t top_k = g.top_k >= data.vocab_size() ? 0 : g.top_k;
  // Only the text's tokens are drawn: a padded vocabulary (--vocab-size, --preset's 50304) has
  // rows no character maps to, which decode() would refuse after the whole run.
  std::vector<std::int64_t> out = gpt->generate(prompt, g.sample,
                                                static_cast<float>(g.temperature), top_k, seed,
                                                data.vocab_size());
  return data.decode(std::vector<std::int64_t>(out.begin() + 1, out.end()));
}

void print_gpt_prediction(const train::FitResult& r, const GptData& data,
                          const train::TrainerConfig& c) {
  if (!r.prediction) return;
  const train::CostPrediction& p = *r.prediction;
  const nn::GPTConfig& m = data.model;
  const double N = static_cast<double>(nn::gpt_num_params(m) - m.block_size * m.n_embd);
  const double flops_per_token = gpt_flops_per_token(m);
  const double tokens_per_s = p.samples_per_s * static_cast<double>(m.block_size);
  const double achieved = flops_per_token * tokens_per_s;
  const double devices = static_cast<double>(p.devices);
  // MFU against the peak nanoGPT's and llm.c's estimate_mfu use: the BF16 tensor-core peak for
  // bf16 / f16 storage (when the profile has one), FP32 for f32, TF32 for f32 with --allow-tf32
  // in fast mode (the unit its GEMMs are priced on; bitwise mode never uses TF32).
  const bool tc = c.dtype != DType::f32 && p.bf16_peak_flops > 0;
  const bool tf32 = !tc && c.dtype == DType::f32 && c.determinism == Determinism::fast &&
                    p.rates.allow_tf32 && p.rates.tf32_flops > 0;
  const double peak_flops = tc ? p.bf16_peak_flops : tf32 ? p.rates.tf32_flops : p.peak_flops;
  const char* peak_name = tc ? "BF16" : tf32 ? "TF32" : "FP32";
  if (c.dry_run) {
    // Which unit each kernel class is priced on in this mode (Note [Compute units],
    // backend_sim/cost_model.h): what ditto's CUDA backend runs.
    const CostRates& q = p.rates;
    const bool bitwise = c.determinism == Determinism::bitwise;
    char gemm[192];
    if (bitwise)
      std::snprintf(gemm, sizeof gemm, "GEMMs on SIMT cores (ditto's fma-chain kernel, FP32 %.4g "
                    "TFLOP/s x simt_efficiency %.3g)", q.fp32_flops / 1e12, q.simt_efficiency);
    else if (c.dtype != DType::f32)
      std::snprintf(gemm, sizeof gemm, "GEMMs on tensor cores (cuBLASLt, %s %.4g TFLOP/s x "
                    "gemm_efficiency %.3g)", c.dtype == DType::f16 ? "FP16" : "BF16",
                    (c.dtype == DType::f16 ? q.f16_flops : q.bf16_flops) / 1e12,
                    q.gemm_efficiency);
    else if (q.allow_tf32)
      std::snprintf(gemm, sizeof gemm, "GEMMs on tensor cores (cuBLASLt, TF32 %.4g TFLOP/s x "
                    "gemm_efficiency %.3g)", q.tf32_flops / 1e12, q.gemm_efficiency);
    else
      std::snprintf(gemm, sizeof gemm, "GEMMs on SIMT cores (cuBLASLt strict FP32, %.4g TFLOP/s "
                    "x gemm_efficiency %.3g)", q.fp32_flops / 1e12, q.gemm_efficiency);
    std::printf("dry run: priced, not run: no kernel executed and no tensor data held "
                "(Note [Dry run]); determinism=%s dtype=%s; %s, attention on SIMT cores "
                "(ditto's kernels, FP32 %.4g TFLOP/s x simt_efficiency %.3g), other kernels at "
                "memory bandwidth %.4g GB/s x memory_efficiency %.3g\n",
                determinism_name(c.determinism), dtype_name(c.dtype), gemm, q.fp32_flops / 1e12,
                q.simt_efficiency, q.memory_bandwidth / 1e9, q.memory_efficiency);
  }
  std::printf("predicted GPT: %.0f tokens/s (%" PRId64 " tokens per step) step_time=%.2f ms "
              "comm_share=%.1f%%; mfu=%.1f%% of %s peak %.4g TFLOP/s per GPU with nanoGPT's "
              "estimate_mfu: 6N + 12 L H Q T = %.4g FLOP/token, N = %.0f parameters without "
              "wpe\n",
              tokens_per_s, c.batch_size * m.block_size, p.step_time_s * 1e3,
              100.0 * p.comm_share, 100.0 * achieved / (devices * peak_flops),
              peak_name, peak_flops / 1e12, flops_per_token, N);
  std::size_t peak = 0, capacity = 0;
  for (const train::DeviceMemory& d : r.memory) {
    peak = std::max(peak, d.stats.peak);
    capacity = d.stats.capacity;
  }
  if (!r.memory.empty())
    std::printf("predicted GPT: peak memory %.2f GiB of %.2f GiB on the fullest device "
                "(attention keeps softmax stats, not att [B, n_head, T, T], as flash attention "
                "does)\n", static_cast<double>(peak) / 1073741824.0,
                static_cast<double>(capacity) / 1073741824.0);
  std::fflush(stdout);
}

}  // namespace ditto_train
