// nn::GPTConfig: the hyper-parameters of nanoGPT's GPT (model.py's GPTConfig, same names).
#pragma once

#include <cstdint>

namespace ditto::nn {

/// nanoGPT's GPTConfig (defaults: the character-level Shakespeare model on a CPU, nanoGPT's
/// README: block_size 64, n_layer 4, n_head 4, n_embd 128, dropout 0, bias False; vocab 65).
struct GPTConfig {
  std::int64_t block_size = 64;  ///< longest context (positions of wpe)
  std::int64_t vocab_size = 65;  ///< tokens (rows of wte)
  std::int64_t n_layer = 4;      ///< transformer blocks
  std::int64_t n_head = 4;       ///< attention heads; n_embd % n_head == 0
  std::int64_t n_embd = 128;     ///< width C
  float dropout = 0.0f;          ///< every dropout site's p, in [0, 1)
  bool bias = false;             ///< biases in the Linears and LayerNorms
};

/// Note [GPT] (core/nn/gpt.h): Philox init layer ids and dropout sites.
constexpr std::uint64_t kWteLayerId = 0, kWpeLayerId = 1;
enum class BlockLinear : std::uint64_t { c_attn = 0, attn_c_proj = 1, c_fc = 2, mlp_c_proj = 3 };
/// Init layer id of one of block `layer`'s Linears: 2 + 4 * layer + which.
constexpr std::uint64_t gpt_layer_id(std::int64_t layer, BlockLinear which) {
  return 2 + 4 * static_cast<std::uint64_t>(layer) + static_cast<std::uint64_t>(which);
}
constexpr std::uint64_t kEmbeddingDropoutSite = 0;
enum class BlockDropout : std::uint64_t { attn = 0, resid = 1, mlp = 2 };
/// Dropout site of one of block `layer`'s dropouts: 1 + 3 * layer + which.
constexpr std::uint64_t gpt_dropout_site(std::int64_t layer, BlockDropout which) {
  return 1 + 3 * static_cast<std::uint64_t>(layer) + static_cast<std::uint64_t>(which);
}
/// nanoGPT's init std of Linear and Embedding weights, and of the c_proj weights
/// (0.02 / sqrt(2 * n_layer), in double then rounded to float).
constexpr float kGptInitStd = 0.02f;
float gpt_c_proj_std(std::int64_t n_layer);

/// Throws InvalidArgument naming the field unless every size is >= 1, n_embd % n_head == 0,
/// 0 <= dropout < 1 and n_layer <= 85 (the dropout sites must fit in 8 bits, Note [GPT]).
void check_config(const GPTConfig& cfg);

}  // namespace ditto::nn
