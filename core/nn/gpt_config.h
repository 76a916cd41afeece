// nn::GPTConfig: the hyper-parameters of nanoGPT's GPT (model.py's GPTConfig, same names).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
/// The dropout sites and steps a mask can be drawn for (Note [Dropout masks] in
/// core/numerics/gpt_math.h): sites < 256 at steps < 2^40 (kStreamDropout), sites 256 .. 2^16 - 1
/// at steps < 2^32 (kStreamDropoutWide).
constexpr std::uint64_t kDropoutNarrowSites = 256, kDropoutSites = std::uint64_t(1) << 16;
constexpr std::int64_t kDropoutNarrowSteps = std::int64_t(1) << 40;
constexpr std::int64_t kDropoutWideSteps = std::int64_t(1) << 32;
/// The most blocks whose dropout sites (the last is 3 n_layer) are all < 256: 85.
constexpr std::int64_t kGptMaxNarrowLayers = (kDropoutNarrowSites - 1) / 3;
/// The most blocks of a GPT with dropout > 0: its sites < 2^16, 21845.
constexpr std::int64_t kGptMaxDropoutLayers = (kDropoutSites - 1) / 3;
/// The most blocks of any GPT: its init layer ids (the last is 4 n_layer + 1, gpt_layer_id) stay
/// below 2^48, the sub of a stream id (Note [Random streams] in core/numerics/random.h).
constexpr std::int64_t kGptMaxLayers = (std::int64_t(1) << 46) - 1;
/// The steps [0, n) at which a GPT of `n_layer` (valid) blocks can draw its dropout masks: 2^40
/// when n_layer <= 85 (every site < 256), else 2^32.
constexpr std::int64_t gpt_dropout_steps(std::int64_t n_layer) {
  return n_layer <= kGptMaxNarrowLayers ? kDropoutNarrowSteps : kDropoutWideSteps;
}
/// nanoGPT's init std of Linear and Embedding weights, and of the c_proj weights
/// (0.02 / sqrt(2 * n_layer), in double then rounded to float).
constexpr float kGptInitStd = 0.02f;
float gpt_c_proj_std(std::int64_t n_layer);

/// nanoGPT's GPT-2 model types (model.py GPT.from_pretrained's config_args): gpt2 (124M)
/// 12 layers / 12 heads / 768 wide, gpt2-medium (350M) 24/16/1024, gpt2-large (774M) 36/20/1280,
/// gpt2-xl (1558M) 48/25/1600; all with block_size 1024 and biases.
struct GPT2Preset {
  const char* model_type;
  std::int64_t n_layer, n_head, n_embd;
};
const std::vector<GPT2Preset>& gpt2_presets();
/// GPT-2's context, and its vocabulary of 50257 padded to a multiple of 64 as llm.c
/// (train_gpt2.cu: Vp = 50304) and nanoGPT's train.py (vocab_size 50304, "for efficiency") do.
constexpr std::int64_t kGpt2BlockSize = 1024, kGpt2PaddedVocab = 50304;
/// The GPTConfig of `model_type` (block 1024, vocab 50304, bias true, dropout 0). Throws
/// InvalidArgument naming `what` (e.g. "--preset") and the known names for another name.
GPTConfig gpt2_config(const std::string& model_type, const std::string& what = "gpt2_config");
// Note [GPT-2 memory]
// What one device of a data-parallel AdamW run holds (fast mode, DDP on D devices), measured by
// the dry run (ditto-train --dry-run, memory: lines; Note [Dry run], backend_sim/sim_backend.h)
// and checked against the arithmetic. N parameters (gpt_num_params), B samples per device:
//   f32 today:  params 4 + grads 4, which live in DDP's gradient buckets (Note [DDP grads as
//               bucket views]: from the second step on the backward writes them there) +
//               AdamW exp_avg, exp_avg_sq 8 = 16 bytes per parameter (torch's DDP with
//               gradient_as_bucket_view=True; 20 with its default, grads and buckets apart);
//   bf16 (llm.c's mixed precision, issue 14's --dtype bf16): params 2 + grads in the buckets 2
//               (fast mode: the param dtype) + f32 master 4 + moments 8 = 16;
//   ZeRO-1 (--zero-stage 1, no DDP buckets): f32 4 + 4 + 8 / D;  bf16 2 + 2 + 12 / D
//               (D = 8: 9 and 5.5 bytes per parameter) held between steps; the peak adds the
//               f32 gradient shard, 4 / D, which lives from the first reduce_scatter (in the
//               backward, with overlap_comm) to the end of step() (core/optim/zero.cpp,
//               grad_shard_; DeepSpeed's fp32 grad partition): f32 4 + 4 + 12 / D, bf16
//               2 + 2 + 16 / D (tester 6, F4: measured 12N / D of optimizer state and 4N / D +
//               ~170 MiB of transients for gpt2-xl bf16, D = 1..64). So on one device ZeRO-1
//               peaks 4N above plain DDP (bf16 20 against 16 bytes): it pays from D = 2 on;
//   activations: about 17.4 C floats per token per layer kept for backward (f32; about half in
//               bf16); attention keeps only its softmax stats, 8 n_head bytes per token per
//               layer, never att [B, n_head, T, T] (Note [Attention memory] in
//               core/numerics/gpt_math.h; flash attention's memory).
// GPT-2 1.5B (gpt2-xl: N = 1,557,686,400, 48 layers, 25 heads, C 1600, T 1024), f32, 8 devices,
// measured peaks: B = 1: 28.30 GiB, B = 2: 33.40 GiB, i.e. 23.2 GiB (= 16 N bytes) + 5.10 GiB
// per sample (17.4 C floats x 1024 tokens x 48 layers); 34.11 and 39.21 GiB (20 N) while each
// backward still made new grads beside the buckets. On 8 x A100 40GB (40 GiB each)
// --batch-size 24 (B = 3) fits (38.49 GiB of 40; it did not at 20 N) and --batch-size 32
// (B = 4) needs 23.2 + 4 x 5.10 = 43.6 GiB: OutOfMemory; with ZeRO-1 9 N = 13.06 GiB + 20.4
// fits (measured: 33.44 GiB; at B = 3 28.53 GiB, optimizer state 1485.89 MiB = 8 N / 8 bytes;
// the rest is the collectives' buffers). Before attention kept only its stats (att
// materialised, 4.69 GiB more per sample) B = 2 did not fit.
// In bf16 --batch-size 32 (B = 4) fits without ZeRO (33.42 GiB: 16 N = 23.2 GiB of state, the
// activations and the f32 step's transients), --batch-size 48 too (38.52 GiB) and 56 does not;
// ZeRO-1: 5.5 N = 7.98 GiB + activations (measured 18.55 GiB at --batch-size 32). Figures of
// the dry run at 67ed691 (ditto-train --model gpt --preset gpt2-xl --dry-run --profile
// a100-sxm-40gb --devices 8 --trainer ddp ...).

/// Parameters of a GPT of `cfg`, the tied head counted once and wpe included (nanoGPT's
/// get_num_params(non_embedding=False)): 12 L C^2 + 13 L C (with biases; 12 L C^2 + 2 L C
/// without) + V C + T C + 2 C (ln_f; C without bias). nanoGPT prints it less T C (wpe).
/// Computed with checked arithmetic: InvalidArgument when the count overflows std::int64_t
/// (ditto-train refuses such sizes first, naming its options: Note [GPT sizes in 64 bits] in
/// core/train/gpt_recipe.cpp).
std::int64_t gpt_num_params(const GPTConfig& cfg);

/// Throws InvalidArgument naming the field unless every size is >= 1, n_embd % n_head == 0,
/// 0 <= dropout < 1, n_layer <= kGptMaxLayers (2^46 - 1: the init streams' layer ids) and, with
/// dropout > 0, n_layer <= kGptMaxDropoutLayers (21845: the dropout sites < 2^16, Note [GPT]).
void check_config(const GPTConfig& cfg);

}  // namespace ditto::nn
