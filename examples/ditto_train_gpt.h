// ditto-train --model gpt: nanoGPT's character-level Shakespeare model (train.py with
// config/train_shakespeare_char.py and the README's CPU settings) on the bundled
// examples/data/shakespeare.txt. Its options are nanoGPT's, with dashes (--n-layer for
// --n_layer); the defaults are nanoGPT's CPU configuration. ditto_train.cpp owns the options
// shared with the MLP (--batch-size, --lr, --weight-decay, --data, --devices, ...).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/nn/gpt_config.h"

#include "core/train/text_source.h"
#include "core/train/token_source.h"
#include "core/train/trainer.h"

namespace ditto_train {

/// The GPT's options (nanoGPT's names and defaults); batch_size, learning_rate, weight_decay
/// and data take effect only when the shared option was not given.
struct GptOptions {
  std::int64_t n_layer = 4, n_head = 4, n_embd = 128, block_size = 64;
  std::int64_t batch_size = 12, max_iters = 2000, eval_interval = 250, eval_iters = 20;
  std::int64_t warmup_iters = 100, lr_decay_iters = 2000;
  double learning_rate = 1e-3, min_lr = 1e-4, weight_decay = 0.1, grad_clip = 1.0;
  double dropout = 0.0, beta1 = 0.9, beta2 = 0.99;
  bool bias = false;
  std::int64_t sample = 500, top_k = 200;
  double temperature = 0.8;
  /// nanoGPT's GPT-2 model_type (gpt2, gpt2-medium, gpt2-large, gpt2-xl): sets n_layer, n_head,
  /// n_embd, block_size 1024, vocab_size 50304, bias; options given explicitly win. "": none.
  std::string preset;
  /// Rows of wte (GPTConfig.vocab_size); 0: the text's vocabulary. Must hold every token id of
  /// the data (>= the text's vocabulary).
  std::int64_t vocab_size = 0;
  /// Who set vocab_size when --vocab-size did not ("--init-from 'x.bin'"): what a refusal of
  /// the value names. "": --vocab-size (or nobody).
  std::string vocab_size_from;
  /// What --data holds (train::DataFormat, Note [Token files]): auto, text, llmc or nanogpt.
  std::string data_format = "auto";
  /// Validation token files (--val-data; a file, comma list or glob); "": the val files beside
  /// --data by llm.c's / nanoGPT's naming (train::val_paths_beside).
  std::string val_data;
};

/// Applies g.preset (nn::gpt2_config, core/nn/gpt_config.h) to the fields of g not in `given`;
/// InvalidArgument naming --preset for an unknown name. Nothing when g.preset is empty.
void apply_preset(GptOptions& g, const std::set<std::string>& given);

/// The GPT's data: a text (TextDataSource), llm.c or nanoGPT token files (TokenDataSource) or,
/// in a dry run without --data but with a vocabulary (--preset or --vocab-size), token ids 0
/// (ZeroTokenSource; no file read).
struct GptData {
  std::shared_ptr<ditto::train::DataSource> source;
  std::shared_ptr<ditto::train::TextDataSource> text;     ///< null unless a text
  std::shared_ptr<ditto::train::TokenDataSource> tokens;  ///< null unless token files
  ditto::nn::GPTConfig model;                          ///< what the run builds
};

/// The options only --model gpt takes.
const std::set<std::string>& gpt_only_options();
/// The options only --model mlp takes (refused with --model gpt).
const std::set<std::string>& mlp_only_options();

/// Registers the GPT-only options on `app` (group "GPT (--model gpt)").
void add_gpt_options(CLI::App& app, GptOptions& g);

/// Checks the options (InvalidArgument naming the option, expected what, got what) and sets up
/// `c` for the GPT: model, AdamW, nanoGPT's schedule, clipping, iteration mode, checkpoint
/// settings and the lm_head alias. `c.batch_size` / `c.lr` / `c.weight_decay` keep what was
/// given on the command line (`given`), else take the GPT's defaults. Opens `data` (a text, or
/// llm.c / nanoGPT token files by g.data_format: Note [Token files]; errors prefixed with
/// "--data: "), and the validation token files (g.val_data, else those beside `data`; refused
/// when there are none and g.eval_iters > 0).
/// With c.dry_run and no --data given, the data are ZeroTokenSource's when g.vocab_size > 0.
GptData configure_gpt(const GptOptions& g, const std::set<std::string>& given,
                      const std::string& data, ditto::train::TrainerConfig& c);

/// nanoGPT's estimate_mfu FLOPs per token of `m` (the PaLM paper's 6N + 12 L H Q T, N the
/// parameters without wpe, T the block size).
double gpt_flops_per_token(const ditto::nn::GPTConfig& m);

/// "ditto-train: model=gpt ..." (the run as it starts).
void print_gpt_start(const ditto::train::RunInfo& r, const GptOptions& g,
                     const ditto::train::TrainerConfig& c, const GptData& data);
/// The prediction's GPT figures: tokens/s and nanoGPT's MFU (model.py estimate_mfu, PaLM's
/// 6N + 12 L H Q T FLOPs per token, N the parameters without wpe) against the peak the run's
/// matrix products are priced at (BF16 tensor cores for bf16 / f16, FP32 for f32); in a dry run,
/// what was priced.
void print_gpt_prediction(const ditto::train::FitResult& r, const GptData& data,
                          const ditto::train::TrainerConfig& c);
/// "step N: train loss X, val loss Y (lr, tokens/s, ETA)".
void print_gpt_eval(const ditto::train::EvalMetrics& m);
/// g.sample characters generated by rank 0's trained model from "\n" (nanoGPT sample.py's
/// start), at g.temperature and g.top_k, seeded with `seed`, drawn among the text's tokens only
/// (never a padded vocabulary's extra rows); "" when g.sample is 0. The bytes as they are (a
/// text may hold NUL bytes): print them with fwrite, not as a C string. Token data (no
/// tokenizer here): g.sample token ids from llm.c's start token <|endoftext|> 50256 (token 0
/// when the vocabulary has no 50256), separated by spaces.
std::string gpt_sample(ditto::train::Replica& rep, const GptOptions& g, const GptData& data,
                       std::uint64_t seed);

}  // namespace ditto_train
