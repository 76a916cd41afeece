// ditto-train --model gpt's weights in and out (issue 32): --init-from FILE (nanoGPT's
// init_from: an llm.c model file, Hugging Face GPT-2 safetensors or a ditto checkpoint, told by
// content, core/io/gpt_weights.h), --export llmc|llmc-bf16|hf FILE (the trained model in llm.c's
// or Hugging Face's format) and --eval-only (nanoGPT's eval_only: evaluate, do not train).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/io/gpt_weights.h"
#include "core/train/trainer.h"
#include "examples/ditto_train_gpt.h"

namespace ditto_train {

/// The weights options' values.
struct WeightsOptions {
  std::string init_from;            ///< --init-from FILE; "": nanoGPT's 'scratch'
  std::vector<std::string> export_; ///< --export FORMAT FILE; empty: none
  bool eval_only = false;           ///< --eval-only
};

/// "--init-from", "--export", "--eval-only": options of --model gpt only.
const std::set<std::string>& weights_options();

/// Registers the options on `app` (group "GPT weights (--model gpt)").
void add_weights_options(CLI::App& app, WeightsOptions& w);

/// --init-from: reads the file (io::load_gpt_weights; --n-head is used only when the file does
/// not record the heads) and sets g's model fields (n_layer, n_head, n_embd, block_size,
/// vocab_size, bias) from it. An option in `given` that contradicts the file is refused naming
/// both values ("--n-layer: expected the --init-from file's 2 ('f.bin'), got 4"), and --preset is
/// refused with it. Returns null without --init-from.
/// Throws ParseError ("--init-from: io::load_gpt_weights: 'f.bin': ...") for a malformed file.
std::shared_ptr<const ditto::io::GptWeights> apply_init_from(const WeightsOptions& w,
                                                             GptOptions& g,
                                                             const std::set<std::string>& given);

/// "ditto-train: init_from=FILE (format): n_layer=... (the file's padded rows ... dropped ...)".
void print_init_from(const WeightsOptions& w, const ditto::io::GptWeights& weights);

/// After configure_gpt: checks --export (format llmc, llmc-bf16 or hf; a model with biases; a
/// file in an existing directory that is not --init-from's or --data's) and --eval-only, sets
/// c.eval_only (and g.sample 0 unless --sample was given), and makes c.make_model load
/// `weights` into every replica's GPT (not in a dry run, which holds no tensor data).
void configure_weights(const WeightsOptions& w,
                       std::shared_ptr<const ditto::io::GptWeights> weights, GptOptions& g,
                       const std::set<std::string>& given, const std::string& data,
                       ditto::train::TrainerConfig& c);

/// --export: writes rank 0's model `rep` (its parameters in f32) as w.export_ says, atomically,
/// and prints "ditto-train: exported ...". Nothing without --export. Throws ditto::Error.
void export_model(const WeightsOptions& w, ditto::train::Replica& rep,
                  const ditto::nn::GPTConfig& m);

}  // namespace ditto_train
