// nanoGPT's recipe as a TrainerConfig (core/train/gpt_recipe.h): the settings' checks, the data,
// the model, optimizer and schedule, and what the run reports.
#include "core/train/gpt_recipe.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "core/base/error.h"
#include "core/data/synthetic_source.h"
#include "core/nn/gpt.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/train/metrics_format.h"
#include "core/train/options.h"

namespace ditto::train {

// In core/train/gpt_weights_flow.cpp: init_from's weights and the model fields they set, and the
// export / eval_only settings' checks.
std::shared_ptr<const io::GptWeights> apply_init_from(GptSettings& g, std::string& vocab_from);
void configure_weights(GptSettings& g, const GptRun& run, TrainerConfig& c);

std::string GptSettings::name_of(const std::string& field) const {
  auto it = field_names.find(field);
  return it != field_names.end() ? it->second : "GptSettings::" + field;
}

namespace {

void at_least(const std::string& name, std::int64_t v, std::int64_t lo, const char* note = "") {
  DITTO_CHECK(v >= lo, name, ": expected >= ", lo, note, ", got ", v);
}

void finite_in(const std::string& name, double v, double lo, bool lo_open, double hi,
               bool hi_open) {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  DITTO_CHECK(ok, name, ": expected a value in ", lo_open ? "(" : "[", lo, ", ", hi,
              hi_open ? ")" : "]", ", got ", v);
}

void apply_preset(GptSettings& g) {
  if (g.preset.empty()) return;
  const nn::GPTConfig p = nn::gpt2_config(g.preset, g.name_of("preset"));
  auto set = [&](const char* field, std::int64_t& v, std::int64_t preset) {
    if (!g.given.count(field)) v = preset;
  };
  set("n_layer", g.n_layer, p.n_layer);
  set("n_head", g.n_head, p.n_head);
  set("n_embd", g.n_embd, p.n_embd);
  set("block_size", g.block_size, p.block_size);
  set("vocab_size", g.vocab_size, p.vocab_size);
  if (!g.given.count("bias")) g.bias = p.bias;  // GPT-2 has biases (from_pretrained: bias=True)
}

// Note [GPT sizes in 64 bits]
// The GPT's sizes are int64 options (--n-layer, --n-embd, --block-size, --vocab-size,
// --batch-size), and what is computed from them is int64 or size_t too: the parameter count N
// (printed, and the FLOPs of the MFU), each tensor's elements and bytes, and the memory the
// simulator counts. Sizes whose products overflow were accepted and wrapped (--n-layer
// 70368744177663 printed params=702561541902130944, --block-size 9223372036854775807 made 123688704
// parameters and failed in Tensor::empty, --n-embd 4000000000 --n-head 1 a negative FLOP count;
// UBSan reports at each). They are refused here, naming the options, as usage errors:
// - a step's tokens, --batch-size x --block-size, at most 2^31 (check_step_tokens): the bound of
//   the data sources, which build a batch's windows on the host (kMaxBatchTokens in
//   core/data/window_source.cpp and synthetic_source.cpp; they refused it during the first step,
//   naming themselves: "ZeroTokenSource: batch_size: ...", exit 1); T is at most 2^31 with it;
// - the model (check_model_sizes): N x 16 bytes, the f32 AdamW state of every parameter (weights,
//   gradients, exp_avg, exp_avg_sq; Note [GPT-2 memory] in core/nn/gpt_config.h), and the bytes
//   of its largest tensors, f32 (4 bytes an element: wte's V x C, c_fc's 4C x C, the logits
//   B x T x V and the MLP's hidden B x T x 4C of a whole --batch-size), fit in int64. Such a
//   model needs more memory than any device has; a smaller one is counted exactly, and the
//   device's capacity refuses it (OutOfMemory) if it does not fit.
// nn::gpt_num_params checks its own arithmetic too (InvalidArgument), for other callers.
constexpr std::int64_t kMaxStepTokens = std::int64_t(1) << 31;

/// A step's tokens, --batch-size x --block-size, at most kMaxStepTokens (Note [GPT sizes in 64
/// bits]).
void check_step_tokens(const GptSettings& g, const TrainerConfig& c) {
  const std::int64_t T = g.block_size, B = c.batch_size;
  DITTO_CHECK(T <= kMaxStepTokens, g.name_of("block_size"),
              ": expected at most 2^31 = ", kMaxStepTokens, " (a step's tokens, ",
              c.name_of("batch_size"), " x ", g.name_of("block_size"),
              ", are at most 2^31: the data's batches are built on the host), got ", T);
  DITTO_CHECK(B <= kMaxStepTokens / T, c.name_of("batch_size"), ": expected at most ",
              kMaxStepTokens / T, " (a step's tokens, ", c.name_of("batch_size"), " x ",
              g.name_of("block_size"), " = ", T,
              ", are at most 2^31: the data's batches are built on the host), got ", B);
}

/// The model's parameter count and largest tensors in bytes fit in int64 (Note [GPT sizes in 64
/// bits]); `m`: the model of the settings, its vocabulary the data's when not given.
void check_model_sizes(const GptSettings& g, const nn::GPTConfig& m, const TrainerConfig& c) {
  const std::int64_t C = m.n_embd, T = m.block_size, V = m.vocab_size, L = m.n_layer;
  const std::int64_t BT = c.batch_size * T;  // <= 2^31 (check_step_tokens)
  const auto fits = [](std::int64_t x, std::int64_t y, std::int64_t bytes) {
    std::int64_t r = 0;
    return !__builtin_mul_overflow(x, y, &r) && !__builtin_mul_overflow(r, bytes, &r);
  };
  // The count in long double (no overflow): what the message says.
  const long double Cl = static_cast<long double>(C), b = m.bias ? 1 : 0;
  const long double n = static_cast<long double>(L) * (12 * Cl * Cl + (2 + 11 * b) * Cl) +
                        static_cast<long double>(V) * Cl + static_cast<long double>(T) * Cl +
                        Cl * (1 + b);
  constexpr long double kMax = static_cast<long double>(std::numeric_limits<std::int64_t>::max());
  const auto sizes = [&] {
    return detail::cat(g.name_of("n_layer"), " ", L, " ", g.name_of("n_embd"), " ", C, " ",
                       g.name_of("vocab_size"), " ", V, " ", g.name_of("block_size"), " ", T);
  };
  DITTO_CHECK(n * 16 <= kMax, sizes(),
              ": expected a GPT whose f32 AdamW state, 16 bytes a parameter, fits in 64 bits "
              "(at most ",
              std::numeric_limits<std::int64_t>::max() / 16, " parameters), got ",
              strprintf("%.3Lg", n),
              " parameters (12 L C^2 + 13 L C + V C + T C + 2 C with biases)");
  const char* tensor = !fits(V, C, 4)        ? "wte's V x C"
                       : !fits(4 * C, C, 4)  ? "mlp.c_fc's 4C x C"  // 4C: n * 16 fits
                       : !fits(BT, V, 4)     ? "the logits' B x T x V"
                       : !fits(BT, 4 * C, 4) ? "the MLP's hidden B x T x 4C"
                                             : nullptr;
  DITTO_CHECK(tensor == nullptr, sizes(), " ", c.name_of("batch_size"), " ", c.batch_size,
              ": expected a GPT whose every tensor's f32 bytes fit in 64 bits, got ", tensor,
              " past them");
}

/// Every GPT setting's own check (the Trainer checks the shared ones).
void check_settings(const GptSettings& g, double lr, double weight_decay, const TrainerConfig& c) {
  auto n = [&](const char* f) { return g.name_of(f); };
  at_least(n("n_layer"), g.n_layer, 1);
  DITTO_CHECK(g.n_layer <= nn::kGptMaxLayers, n("n_layer"),
              ": expected 1..2^46 - 1 (the init streams' layer ids fit in 48 bits), got ",
              g.n_layer);
  at_least(n("n_head"), g.n_head, 1);
  at_least(n("n_embd"), g.n_embd, 1);
  DITTO_CHECK(g.n_embd % g.n_head == 0, n("n_embd"), ": expected a multiple of ", n("n_head"),
              " = ", g.n_head, ", got ", g.n_embd);
  at_least(n("block_size"), g.block_size, 1);
  check_step_tokens(g, c);
  at_least(n("max_iters"), g.max_iters, 1);
  at_least(n("eval_interval"), g.eval_interval, 1);
  at_least(n("eval_iters"), g.eval_iters, 0, " (0: no evaluation)");
  at_least(n("warmup_iters"), g.warmup_iters, 0);
  if (!g.given.count("lr_decay_iters"))  // its default: the option given is the one to change
    DITTO_CHECK(g.lr_decay_iters > g.warmup_iters, n("warmup_iters"), ": expected < ",
                n("lr_decay_iters"), " = ", g.lr_decay_iters, " (its default",
                c.dry_run ? " in a dry run: the larger of " + n("max_iters") + " and " +
                                n("warmup_iters") + " + 1, which must fit in 64 bits"
                          : std::string(),
                "; nanoGPT's cosine decay runs from the one to the other: give ",
                n("lr_decay_iters"), " too), got ", g.warmup_iters);
  DITTO_CHECK(g.lr_decay_iters > g.warmup_iters, n("lr_decay_iters"), ": expected > ",
              n("warmup_iters"), " = ", g.warmup_iters,
              " (nanoGPT's cosine decay runs from the "
              "one to the other), got ",
              g.lr_decay_iters);
  const double inf = HUGE_VAL;
  finite_in(c.name_of("lr"), lr, 0, true, inf, true);
  finite_in(n("min_lr"), g.min_lr, 0, false, lr, false);
  finite_in(c.name_of("weight_decay"), weight_decay, 0, false, inf, true);
  finite_in(n("grad_clip"), g.grad_clip, 0, false, inf, true);
  finite_in(n("dropout"), g.dropout, 0, false, 1, true);
  if (g.dropout > 0) {  // the masks' streams (Note [Dropout masks])
    DITTO_CHECK(g.n_layer <= nn::kGptMaxDropoutLayers, n("n_layer"), ": expected at most ",
                nn::kGptMaxDropoutLayers, " with ", n("dropout"),
                " > 0 (each block's dropout sites must fit in the 16 bits of Note [Dropout "
                "masks]), got ",
                g.n_layer);
    const std::int64_t steps = nn::gpt_dropout_steps(g.n_layer);
    DITTO_CHECK(g.max_iters <= steps, n("max_iters"), ": expected at most ",
                steps == nn::kDropoutNarrowSteps ? "2^40" : "2^32", " with ", n("dropout"),
                " > 0 and ", n("n_layer"), " = ", g.n_layer,
                " (the dropout masks' steps, Note [Dropout masks]), got ", g.max_iters);
  }
  finite_in(n("beta1"), g.beta1, 0, false, 1, true);
  finite_in(n("beta2"), g.beta2, 0, false, 1, true);
  at_least(n("sample"), g.sample, 0, " (0: no sample)");
  // As a dry run's checkpoints and exports: it holds no tensor data (its copies to the host read
  // zeros), so the sample would be noise printed as the model's.
  DITTO_CHECK(!c.dry_run || g.sample == 0, n("sample"), ": expected 0 (none) with ",
              c.name_of("dry_run"),
              " (a dry run holds no tensor data, so its sample would be noise, not the model's), "
              "got ",
              g.sample);
  finite_in(n("temperature"), g.temperature, 0, true, inf, true);
  at_least(n("top_k"), g.top_k, 0, " (0: every character)");
  at_least(n("vocab_size"), g.vocab_size, 0, " (0: the text's vocabulary)");
}

std::string model_name(const nn::GPTConfig& m) {
  std::ostringstream s;
  s << "gpt(n_layer=" << m.n_layer << ",n_head=" << m.n_head << ",n_embd=" << m.n_embd
    << ",block_size=" << m.block_size << ",vocab_size=" << m.vocab_size
    << ",bias=" << (m.bias ? "True" : "False") << ",dropout=" << m.dropout << ")";
  return s.str();
}

// The data of g.data (Note [Token files]'s rule), into out.source and out.text or out.tokens.
void open_data(const GptSettings& g, const std::string& vocab_from, std::uint64_t seed,
               GptRun& out) {
  const std::string data = g.name_of("data"), val_data = g.name_of("val_data");
  const std::string data_format = g.name_of("data_format");
  DataFormat format = parse_data_format(g.data_format, data_format.c_str());
  const std::vector<std::string> files = expand_data_paths(g.data, data.c_str());
  const bool detected = format == DataFormat::automatic;
  if (detected) {
    try {  // a file it cannot open or read is refused here, not taken for another format
      format = detect_data_format(files.front());
    } catch (const Error& e) {
      throw InvalidArgument(detail::cat(data, ": ", e.what()));
    }
  }
  if (format == DataFormat::text) {
    DITTO_CHECK(files.size() == 1, data,
                ": expected one text file (a list or glob is for "
                "llm.c or nanoGPT token files), got ",
                files.size(), " files ('", files[0], "', '", files[1], "'",
                files.size() > 2 ? ", ..." : "", ")",
                detected ? ": the first is neither an llm.c shard (magic 20240520 / 20240801) "
                           "nor named .bin"
                         : "");
    DITTO_CHECK(!g.given.count("val_data"), val_data,
                ": expected token data with it (a text's "
                "validation split is its last 10%), got the text '",
                files[0], "'");
    // A checkpoint of a character model: its vocabulary, so that its ids keep meaning its
    // characters on this text (Note [Checkpoint vocabulary], core/checkpoint/gpt_weights.h).
    std::optional<TextVocabulary> vocab;
    if (const io::GptWeights* w = out.init_weights.get(); w && !w->vocab.empty())
      vocab =
          TextVocabulary{w->vocab, detail::cat("the ", g.name_of("init_from"),
                                               " checkpoint's vocabulary ('", w->vocab_from, "')")};
    try {
      out.source = out.text =
          std::make_shared<TextDataSource>(files[0], g.block_size, seed, vocab ? &*vocab : nullptr);
    } catch (const Error& e) {
      throw InvalidArgument(detail::cat(data, ": ", e.what()));
    }
    DITTO_CHECK(g.vocab_size == 0 || g.vocab_size >= out.text->vocab_size(),
                vocab_from.empty() ? g.name_of("vocab_size") : vocab_from, ": expected ",
                vocab_from.empty() ? "0 or " : "a vocab_size of ",
                "at least the text's "
                "vocabulary of ",
                out.text->vocab_size(), " tokens ('", files[0], "'), got ", g.vocab_size);
    return;
  }
  DITTO_CHECK(format != DataFormat::nanogpt || g.vocab_size > 0, g.name_of("vocab_size"),
              ": expected the vocabulary size of nanoGPT's uint16 tokens in '", files[0],
              "' (meta.pkl's vocab_size, a Python pickle: python3 -c \"import pickle; print("
              "pickle.load(open('meta.pkl', 'rb'))['vocab_size'])\"; 50304 for GPT-2's BPE "
              "without meta.pkl), got none",
              detected ? " (" + data_format +
                             " auto took it for "
                             "nanoGPT tokens: not an llm.c shard, and named .bin; " +
                             data_format +
                             " text if "
                             "it is a text)"
                       : "");
  std::vector<std::string> val;
  std::string val_name = g.val_data;
  // What a validation file's error is prefixed with: the setting that named it.
  std::string val_option = val_data;
  if (g.given.count("val_data")) {
    val = expand_data_paths(g.val_data, val_data.c_str());
  } else {
    val = val_paths_beside(g.data);
    if (!val.empty()) val_name = val.size() == 1 ? val[0] : val[0] + ", ...";
    val_option = data + " (validation file found beside it)";
  }
  try {  // the training files first: their errors before a missing val split's
    // No --vocab-size (nanoGPT's tokens were refused above): the vocabulary of the tokenizer
    // whose magic the first shard carries.
    const std::int64_t vocab_size =
        g.vocab_size > 0 ? g.vocab_size
                         : llmc_tokenizer_vocab_size(TokenFile(files.front(), format).magic());
    out.source = out.tokens = std::make_shared<TokenDataSource>(
        files, std::vector<std::string>{}, format, vocab_size, g.block_size, seed, g.data);
  } catch (const Error& e) {
    throw InvalidArgument(detail::cat(data, ": ", e.what()));
  }
  if (!val.empty()) {
    try {
      out.tokens->open_val(val, val_name);
    } catch (const Error& e) {
      // A file's problem (exit 1, as the data's), not a usage error: a plain ditto::Error.
      throw Error(detail::cat(val_option, ": ", e.what()));
    }
  }
  DITTO_CHECK(!val.empty() || g.eval_iters == 0, val_data, ": expected validation data for '",
              g.data, "' (", val_data, " FILES, or files named as ", data,
              " with its last "
              "'train' made 'val' beside it: llm.c's *_val_*.bin, nanoGPT's val.bin), got none (",
              g.name_of("eval_iters"), " 0 trains without evaluation)");
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

// nanoGPT's init_from takes 'scratch', 'resume' or 'gpt2*' (its model names); ditto's is a file.
// Such a value that names no file is refused saying what to use instead.
void check_not_nanogpt_init_from(const GptSettings& g, const TrainerConfig& c) {
  const std::string& v = g.init_from;
  const bool gpt2 = v == "gpt2" || v == "gpt2-medium" || v == "gpt2-large" || v == "gpt2-xl";
  if (v != "scratch" && v != "resume" && !gpt2) return;
  std::error_code ec;
  if (std::filesystem::exists(v, ec)) return;  // a file of that name: it is meant
  const std::string instead =
      v == "resume"    ? detail::cat("to resume a run, give its checkpoint directory to ",
                                     c.name_of("resume_dir"), " DIR")
      : v == "scratch" ? detail::cat("to start from scratch, leave ", g.name_of("init_from"),
                                     " out (the default)")
                       : detail::cat("to start from ", v,
                                     "'s weights, give a file of them: an llm.c model file "
                                     "(gpt2_124M.bin) or Hugging Face's model.safetensors "
                                     "(docs/llmc_nanogpt.md)");
  throw InvalidArgument(detail::cat(g.name_of("init_from"), ": expected a model file or a ",
                                    "checkpoint directory, got '", v, "' (nanoGPT's init_from ",
                                    "value, not a file here): ", instead));
}

// The decimal a float option was typed as, as a double: --lr and --weight-decay are parsed into
// the TrainerConfig's floats (the MLP's optimizers take float), while the GPT's schedule and AdamW
// take nanoGPT's doubles. Widening the float made `--lr 1e-3` 0.0010000000474974513, another
// schedule than the default 1e-3: other bits than leaving it out, and a default run's checkpoint
// refused by a resume that typed the default. The shortest decimal that reads back as the float
// (shortest) is what was typed whenever that had at most 6 significant digits.
double typed_value(float v) { return std::strtod(shortest(v).c_str(), nullptr); }

}  // namespace

GptRun configure_gpt(GptSettings& g, TrainerConfig& c) {
  GptRun out;
  std::string vocab_from;  // who set vocab_size when it was not given (init_from's file)
  check_not_nanogpt_init_from(g, c);
  out.init_weights = apply_init_from(g, vocab_from);
  apply_preset(g);
  if (c.dry_run) {  // a prediction: a few steps, no evaluation unless asked for, no sample
    if (!g.given.count("max_iters")) g.max_iters = 2;
    if (!g.given.count("eval_iters")) g.eval_iters = 0;
    if (!g.given.count("sample")) g.sample = 0;
    if (!g.given.count("lr_decay_iters"))  // (none exceeds the largest int64: check_settings)
      g.lr_decay_iters = g.warmup_iters < std::numeric_limits<std::int64_t>::max()
                             ? std::max(g.max_iters, g.warmup_iters + 1)
                             : g.warmup_iters;
  }
  const double lr = g.given.count("lr") ? typed_value(*c.lr) : g.learning_rate;
  const double wd = g.given.count("weight_decay") ? typed_value(c.weight_decay) : g.weight_decay;
  if (!g.given.count("batch_size")) c.batch_size = g.batch_size;
  check_settings(g, lr, wd, c);
  if (c.dry_run && !g.given.count("data") && g.vocab_size > 0) {
    out.source = std::make_shared<ZeroTokenSource>(g.block_size, g.vocab_size);
  } else {
    open_data(g, vocab_from, c.seed, out);
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
  check_model_sizes(g, m, c);
  const std::uint64_t seed = c.seed;
  c.make_model = [m, seed](const Device& d) { return std::make_unique<nn::GPT>(m, d, seed); };
  c.loss_may_overwrite_output = true;  // the logits: lm_head's backward reads its input, not them
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
  // The loop's fields and the model's, as errors and a resume that does not match name them
  // (the checkpoint's "model"; vocab_size is the data's unless given: it keeps its own name).
  for (const char* f : {"max_iters", "eval_interval", "eval_iters", "grad_clip", "n_layer",
                        "n_head", "n_embd", "block_size", "bias", "dropout", "min_lr",
                        "warmup_iters", "lr_decay_iters", "beta1", "beta2"})
    c.field_names[f] = g.name_of(f);
  c.field_names["learning_rate"] = c.name_of("lr");  // checkpoint_settings' name of --lr
  out.model = m;
  configure_weights(g, out, c);
  return out;
}

std::string format_gpt_start(const std::string& prog, const RunInfo& r, const GptSettings& g,
                             const TrainerConfig& c, const GptRun& run) {
  const nn::GPTConfig& m = run.model;
  // The model's own count (dp builds it before the start); ddp reports before building: the
  // count of nanoGPT's layout (the CLI test checks that both agree).
  const std::int64_t params = r.params > 0 ? r.params : nn::gpt_num_params(m);
  std::string s =
      strprintf("%s: model=gpt n_layer=%" PRId64 " n_head=%" PRId64 " n_embd=%" PRId64
                " block_size=%" PRId64 " vocab_size=%" PRId64 " bias=%s dropout=%g params=%" PRId64
                " (%.2fM without wpe) backend=%s devices=%d trainer=%s%s "
                "determinism=%s\n",
                prog.c_str(), m.n_layer, m.n_head, m.n_embd, m.block_size, m.vocab_size,
                m.bias ? "True" : "False", g.dropout, params,
                static_cast<double>(params - m.block_size * m.n_embd) / 1e6, r.backend.c_str(),
                r.devices, trainer_kind_name(r.trainer), r.processes ? " (processes)" : "",
                determinism_name(r.determinism));
  if (run.text)
    s += strprintf("%s: data=%s bytes=%" PRId64 " (train %" PRId64 ", val %" PRId64 " tokens)",
                   prog.c_str(), run.text->name().c_str(), run.text->size(),
                   run.text->train_tokens(), run.text->val_tokens());
  else if (const TokenDataSource* t = run.tokens.get())
    s += strprintf(
        "%s: data=%s format=%s files=%zu (train %" PRId64 " tokens; val %s: %" PRId64 " tokens)",
        prog.c_str(), t->name().c_str(), data_format_name(t->format()), t->train().files().size(),
        t->train_tokens(), t->val() ? t->val_name().c_str() : "none", t->val_tokens());
  else
    s += prog + ": data=zeros (dry run: every token id 0, no file read)";
  return s + strprintf(" batch_size=%" PRId64 " max_iters=%" PRId64 " lr=%g min_lr=%g "
                       "warmup_iters=%" PRId64 " lr_decay_iters=%" PRId64 " weight_decay=%g "
                       "betas=(%g, %g) grad_clip=%g eval_interval=%" PRId64 " eval_iters=%" PRId64
                       " seed=%" PRIu64 "\n",
                       c.batch_size, c.max_iters, static_cast<double>(*c.lr), g.min_lr,
                       g.warmup_iters, g.lr_decay_iters, static_cast<double>(c.weight_decay),
                       g.beta1, g.beta2, c.grad_clip, c.eval_interval, c.eval_iters, c.seed);
}

std::string gpt_sample(Replica& rep, const GptSettings& g, const GptRun& run, std::uint64_t seed) {
  if (g.sample == 0 || (!run.text && !run.tokens)) return "";
  auto* gpt = dynamic_cast<nn::GPT*>(&rep.model());
  DITTO_CHECK(gpt != nullptr, g.name_of("sample"),
              ": expected the trained model to be an "
              "nn::GPT");
  if (run.tokens) {
    const std::int64_t vocab = run.tokens->vocab_size();
    const std::vector<std::int64_t> prompt{vocab > 50256 ? 50256 : 0};
    const std::int64_t top_k = g.top_k >= vocab ? 0 : g.top_k;
    const std::vector<std::int64_t> out =
        gpt->generate(prompt, g.sample, static_cast<float>(g.temperature), top_k, seed, vocab);
    std::string ids;
    for (std::size_t i = 1; i < out.size(); ++i) {
      if (i > 1) ids += ' ';
      ids += std::to_string(out[i]);
    }
    return ids;
  }
  const TextDataSource& data = *run.text;
  const auto& itos = data.itos();
  // nanoGPT sample.py starts from "\n"; a text without newlines starts from its token 0.
  std::vector<std::int64_t> prompt{0};
  for (std::size_t t = 0; t < itos.size(); ++t)
    if (itos[t] == '\n') prompt = {static_cast<std::int64_t>(t)};
  const std::int64_t top_k = g.top_k >= data.vocab_size() ? 0 : g.top_k;
  // Only the text's tokens are drawn: a padded vocabulary (vocab_size, a preset's 50304) has
  // rows no character maps to, which decode() would refuse after the whole run.
  std::vector<std::int64_t> out = gpt->generate(prompt, g.sample, static_cast<float>(g.temperature),
                                                top_k, seed, data.vocab_size());
  return data.decode(std::vector<std::int64_t>(out.begin() + 1, out.end()));
}

std::string format_sample(const GptSettings& g, const GptRun& run, const std::string& sample,
                          std::uint64_t seed) {
  if (sample.empty()) return "";
  // Token data: the ids (no tokenizer here: tiktoken's gpt2 decodes them).
  const std::string head =
      run.tokens ? strprintf("sample (%" PRId64 " token ids, temperature %g, top_k %" PRId64
                             ", seed %" PRIu64 "):\n",
                             g.sample, g.temperature, g.top_k, seed)
                 : strprintf("sample (%zu characters, temperature %g, top_k %" PRId64
                             ", seed %" PRIu64 "):\n",
                             sample.size(), g.temperature, g.top_k, seed);
  return head + sample + "\n";
}

std::string format_gpt_prediction(const CostPrediction& p, const std::vector<DeviceMemory>& memory,
                                  const nn::GPTConfig& m, const TrainerConfig& c) {
  const double N = static_cast<double>(nn::gpt_num_params(m) - m.block_size * m.n_embd);
  const double flops_per_token = gpt_flops_per_token(m);
  const double tokens_per_s = p.samples_per_s * static_cast<double>(m.block_size);
  const double achieved = flops_per_token * tokens_per_s;
  const double devices = static_cast<double>(p.devices);
  // MFU against the peak nanoGPT's and llm.c's estimate_mfu use, the unit the GEMMs are priced
  // on (mfu_peak): the BF16 or FP16 tensor-core peak for bf16 / f16 storage (each its own: a
  // profile with FP16 125 and no BF16 rate made f16's MFU 424.5% of FP32's 15.7), FP32 for f32,
  // TF32 for f32 with allow_tf32 in fast mode (bitwise mode never uses TF32).
  const MfuPeak mp =
      mfu_peak(p.rates, p.peak_flops, c.dtype,
               c.dtype == DType::f32 && c.determinism == Determinism::fast && p.rates.allow_tf32);
  const double peak_flops = mp.flops;
  const char* peak_name = mp.name;
  std::string s;
  if (c.dry_run) {
    // Which unit each kernel class is priced on in this mode (Note [Compute units],
    // backend_sim/cost_model.h): what ditto's CUDA backend runs.
    const CostRates& q = p.rates;
    std::string gemm;
    if (c.determinism == Determinism::bitwise)
      gemm = strprintf("GEMMs on SIMT cores (ditto's fma-chain kernel, FP32 %.4g TFLOP/s x "
                       "simt_efficiency %.3g)",
                       q.fp32_flops / 1e12, q.simt_efficiency);
    else if (c.dtype != DType::f32)
      gemm =
          strprintf("GEMMs on tensor cores (cuBLASLt, %s %.4g TFLOP/s x gemm_efficiency %.3g)",
                    c.dtype == DType::f16 ? "FP16" : "BF16",
                    (c.dtype == DType::f16 ? q.f16_flops : q.bf16_flops) / 1e12, q.gemm_efficiency);
    else if (q.allow_tf32)
      gemm = strprintf("GEMMs on tensor cores (cuBLASLt, TF32 %.4g TFLOP/s x gemm_efficiency %.3g)",
                       q.tf32_flops / 1e12, q.gemm_efficiency);
    else
      gemm = strprintf("GEMMs on SIMT cores (cuBLASLt strict FP32, %.4g TFLOP/s x gemm_efficiency "
                       "%.3g)",
                       q.fp32_flops / 1e12, q.gemm_efficiency);
    // Attention: CUDA's tensor-core flash attention runs fast mode on bf16 / f16 with heads of
    // 64 or 128 (Note [CUDA attention]); the rest runs ditto's SIMT kernels.
    const std::int64_t hd = m.n_head > 0 ? m.n_embd / m.n_head : 0;
    std::string attention;
    if (c.determinism == Determinism::fast && c.dtype != DType::f32 && (hd == 64 || hd == 128))
      attention = strprintf(
          "attention on tensor cores (ditto's mma.sync flash attention, %s %.4g TFLOP/s x "
          "mma_efficiency %.3g, an estimate)",
          c.dtype == DType::f16 ? "FP16" : "BF16",
          (c.dtype == DType::f16 ? q.f16_flops : q.bf16_flops) / 1e12, q.mma_efficiency);
    else
      attention = strprintf("attention on SIMT cores (ditto's kernels, FP32 %.4g TFLOP/s x "
                            "simt_efficiency %.3g)",
                            q.fp32_flops / 1e12, q.simt_efficiency);
    s += strprintf("dry run: priced, not run: no kernel executed and no tensor data held "
                   "(Note [Dry run]); determinism=%s dtype=%s; %s, %s, other kernels at "
                   "memory bandwidth %.4g GB/s x memory_efficiency %.3g\n",
                   determinism_name(c.determinism), dtype_name(c.dtype), gemm.c_str(),
                   attention.c_str(), q.memory_bandwidth / 1e9, q.memory_efficiency);
  }
  s += strprintf(
      "predicted GPT: %.0f tokens/s (%" PRId64 " tokens per step) step_time=%.2f ms "
      "comm_share=%.1f%%; mfu=%.1f%% of %s peak %.4g TFLOP/s per GPU with nanoGPT's "
      "estimate_mfu: 6N + 12 L H Q T = %.4g FLOP/token, N = %.0f parameters without wpe\n",
      tokens_per_s, c.batch_size * m.block_size, p.step_time_s * 1e3, 100.0 * p.comm_share,
      100.0 * achieved / (devices * peak_flops), peak_name, peak_flops / 1e12, flops_per_token, N);
  std::size_t peak = 0, capacity = 0;
  for (const DeviceMemory& d : memory) {
    peak = std::max(peak, d.stats.peak);
    capacity = d.stats.capacity;
  }
  // Each in MiB below 1 GiB (tester 6, F9: "0.07 GiB of 0.07 GiB" hid a 0.33 MiB margin; a
  // small model's peak on an H100 said "0.00 GiB of 79.65 GiB"), else in GiB.
  if (!memory.empty())
    s += strprintf("predicted GPT: peak memory %s of %s on the fullest device (attention keeps "
                   "softmax stats, not att [B, n_head, T, T], as flash attention does)\n",
                   format_size(peak).c_str(), format_size(capacity).c_str());
  return s;
}

}  // namespace ditto::train
