// nanoGPT's recipe as a TrainerConfig (train.py with config/train_shakespeare_char.py and its
// README's CPU settings): the GPT of core/nn/gpt.h on a text (a character model) or on llm.c /
// nanoGPT token files, AdamW with decay on the 2-D weights, nanoGPT's warm-up and cosine
// schedule, gradient clipping and iteration mode; its weights optionally read from a file
// (nanoGPT's init_from: core/checkpoint/gpt_weights.h), written at the end (--export), or only
// evaluated (eval_only). ditto-train --model gpt is this with its options as the fields.
//
//   ditto::train::GptSettings g;                  // nanoGPT's CPU defaults
//   g.data = "shakespeare.txt";
//   ditto::train::TrainerConfig c;
//   ditto::train::GptRun run = ditto::train::configure_gpt(g, c);
//   ditto::train::Trainer(c, run.source).fit();
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/checkpoint/gpt_weights.h"
#include "core/data/text_source.h"
#include "core/data/token_source.h"
#include "core/io/file.h"
#include "core/nn/gpt_config.h"
#include "core/train/metrics.h"
#include "core/train/trainer.h"

namespace ditto::train {

/// The GPT run's settings: nanoGPT's names and CPU defaults.
struct GptSettings {
  std::int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64;
  std::int64_t batch_size = 12, max_iters = 2000, eval_interval = 250, eval_iters = 20;
  std::int64_t warmup_iters = 100, lr_decay_iters = 2000;
  double learning_rate = 1e-3, min_lr = 1e-4, weight_decay = 0.1, grad_clip = 1.0;
  double dropout = 0.0, beta1 = 0.9, beta2 = 0.99;
  bool bias = false;
  /// Tokens to generate at the end (gpt_sample; 0: none), at `temperature` among the top_k.
  std::int64_t sample = 500, top_k = 200;
  double temperature = 0.8;
  /// nanoGPT's GPT-2 model_type (gpt2, gpt2-medium, gpt2-large, gpt2-xl): sets n_layer, n_head,
  /// n_embd, block_size 1024, vocab_size 50304, bias; fields in `given` win. "": none.
  std::string preset;
  /// Rows of wte (GPTConfig.vocab_size); 0: the data's vocabulary. Must hold every token id of
  /// the data (>= the text's vocabulary).
  std::int64_t vocab_size = 0;
  /// The training data: a text, or llm.c / nanoGPT token files (a file, a comma list or a glob).
  /// "" in a dry run with a vocab_size: token ids 0 (ZeroTokenSource; no file read).
  std::string data;
  /// What `data` holds (train::DataFormat, Note [Token files]): auto, text, llmc or nanogpt.
  std::string data_format = "auto";
  /// Validation token files (a file, comma list or glob); "": the val files beside `data` by
  /// llm.c's / nanoGPT's naming (train::val_paths_beside).
  std::string val_data;
  /// nanoGPT's init_from: an llm.c model file, Hugging Face GPT-2 safetensors or a ditto
  /// checkpoint (io::load_gpt_weights); the model's configuration is the file's, and a text is
  /// encoded with a ditto checkpoint's vocabulary when it records one (Note [Checkpoint
  /// vocabulary]). "": scratch.
  std::string init_from;
  /// Files written with rank 0's trained model at the end (export_gpt): FORMAT FILE pairs, the
  /// format llmc (f32), llmc-bf16 or hf (Hugging Face safetensors).
  std::vector<std::string> export_files;
  /// nanoGPT's eval_only: evaluate once and stop (needs init_from or a resume).
  bool eval_only = false;
  /// The fields set explicitly, by name ("n_layer"; also TrainerConfig's "batch_size", "lr" and
  /// "weight_decay", which then keep the config's value, "data", and "dry_run"'s defaults'
  /// "max_iters", "eval_iters", "sample", "lr_decay_iters"): the others take the defaults of the
  /// preset, of the init_from file, of a dry run or of eval_only.
  std::set<std::string> given;
  /// How errors name a field: {"n_layer", "--n-layer"} for a command line; a field not listed is
  /// "GptSettings::<field>".
  std::map<std::string, std::string> field_names;

  std::string name_of(const std::string& field) const;
};

/// A configured GPT run: its data, its model and the weights it starts from.
struct GptRun {
  std::shared_ptr<DataSource> source;
  std::shared_ptr<TextDataSource> text;     ///< null unless a text
  std::shared_ptr<TokenDataSource> tokens;  ///< null unless token files
  nn::GPTConfig model;                      ///< what the run builds
  /// The init_from file's weights, loaded into every replica (null: scratch).
  std::shared_ptr<const io::GptWeights> init_weights;
};

/// What a configured GPT run reads, for io::check_outputs_are_not_inputs: `files`, each named
/// by its setting (g.name_of: "--data" for each file of its list or glob, "--val-data" for each
/// validation file given, "--data (validation file found beside it)" for one found beside the
/// data, "--init-from" for a weights file), and `dirs`
/// (an init_from checkpoint directory, c's checkpoint_dir and resume_dir, named by c.name_of).
struct RunInputs {
  std::vector<io::NamedPath> files, dirs;
};
/// The inputs of `run` (configure_gpt's, for `g`) and `c`'s checkpoint directories (empty paths
/// kept: check_outputs_are_not_inputs skips them).
RunInputs gpt_inputs(const GptSettings& g, const GptRun& run, const TrainerConfig& c);
/// The files g.export_files writes, each named "<g.name_of("export_files")> FORMAT" (for
/// io::check_outputs_are_not_inputs); a trailing FORMAT without its FILE is left out.
std::vector<io::NamedPath> gpt_exports(const GptSettings& g);

/// Sets up `c` for the GPT run of `g` (which it completes: the init_from file's model fields,
/// the preset's, a dry run's defaults of a few steps without evaluation or sample, eval_only's
/// sample 0): checks every setting (InvalidArgument naming the field by g.name_of or c.name_of:
/// expected what, got what), reads init_from (its ParseError or Error prefixed with its name),
/// opens the data (Note [Token files]; errors prefixed with the data's name) and the validation
/// files (refused when there are none and eval_iters > 0), and sets the model, AdamW, nanoGPT's
/// schedule, clipping, iteration mode, checkpoint settings and the lm_head alias, and with
/// init_from the model factory that loads its weights (not in a dry run: no tensor data), and
/// refuses an export file that is one of gpt_inputs' or inside one of its directories
/// (io::check_outputs_are_not_inputs).
/// c.batch_size, c.lr and c.weight_decay keep their values when g.given lists them. A dry run's
/// sample must be 0 (it holds no tensor data: the sample would be noise).
GptRun configure_gpt(GptSettings& g, TrainerConfig& c);

/// nanoGPT's estimate_mfu FLOPs per token of `m` (the PaLM paper's 6N + 12 L H Q T, N the
/// parameters without wpe, T the block size).
double gpt_flops_per_token(const nn::GPTConfig& m);

/// "model=gpt n_layer=... params=... (...M without wpe) backend=... devices=..." and the data
/// and training settings, after `prog`: ": " (the run as it starts), two lines.
std::string format_gpt_start(const std::string& prog, const RunInfo& r, const GptSettings& g,
                             const TrainerConfig& c, const GptRun& run);
/// "PROG: init_from=FILE (format): n_layer=... (the file's padded rows ... dropped ...) bias=..."
/// and, for a checkpoint that records a vocabulary, " vocab=N characters (its trainer.json)".
std::string format_init_from(const std::string& prog, const GptSettings& g,
                             const io::GptWeights& weights);
/// The prediction's GPT figures: tokens/s and nanoGPT's MFU (model.py estimate_mfu) against the
/// peak the run's matrix products are priced at (BF16 tensor cores for bf16 / f16, TF32 for f32
/// with allow_tf32 in fast mode, FP32 otherwise), the fullest device's peak memory, and in a dry
/// run what was priced on which unit.
std::string format_gpt_prediction(const CostPrediction& p, const std::vector<DeviceMemory>& memory,
                                  const nn::GPTConfig& m, const TrainerConfig& c);
/// g.sample characters generated by rank 0's trained model from "\n" (nanoGPT sample.py's
/// start), at g.temperature and g.top_k, seeded with `seed`, drawn among the text's tokens only
/// (never a padded vocabulary's extra rows); "" when g.sample is 0. The bytes as they are (a
/// text may hold NUL bytes). Token data (no tokenizer here): g.sample token ids from llm.c's
/// start token <|endoftext|> 50256 (token 0 when the vocabulary has no 50256), separated by
/// spaces.
std::string gpt_sample(Replica& rep, const GptSettings& g, const GptRun& run, std::uint64_t seed);
/// gpt_sample's text under its header, "sample (N characters, temperature T, top_k K, seed S):"
/// (token data: "N token ids"), and a newline; "" for an empty sample. May hold NUL bytes: write
/// it with fwrite.
std::string format_sample(const GptSettings& g, const GptRun& run, const std::string& sample,
                          std::uint64_t seed);
/// Writes rank 0's model `rep` (its parameters in f32) to each of g.export_files, atomically
/// (an existing file keeps its mode), calling `written(file, what)` after each. Every file is
/// tried: one that fails does not stop the others; then throws ditto::Error naming each that
/// failed (the one error as thrown when only one did).
void export_gpt(const GptSettings& g, Replica& rep, const nn::GPTConfig& m,
                const std::function<void(const std::string& file, const char* what)>& written);

}  // namespace ditto::train
