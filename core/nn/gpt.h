// nn::Block and nn::GPT: nanoGPT's transformer (karpathy/nanoGPT model.py) with explicit forward
// and backward: token and position embeddings, pre-LayerNorm blocks of causal self-attention and
// MLP with residual connections, a final LayerNorm and a linear head tied to the token embedding.
//
// Note [GPT]
// Structure, parameter names and order are nanoGPT's (its state_dict without lm_head.weight,
// which is transformer.wte.weight itself):
//   transformer.wte.weight [V, C], transformer.wpe.weight [block_size, C], then per block l:
//   transformer.h.l.ln_1.weight [C] (.bias), .attn.c_attn.weight [3C, C] (.bias [3C]),
//   .attn.c_proj.weight [C, C] (.bias), .ln_2.weight (.bias), .mlp.c_fc.weight [4C, C]
//   (.bias [4C]), .mlp.c_proj.weight [C, 4C] (.bias), and transformer.ln_f.weight (.bias);
//   the biases only with bias = true.
// GELU is the tanh form (GPT-2's and llm.c's; nanoGPT's nn.GELU() is the erf form, within 1e-3).
//
// Initialisation (nanoGPT's _init_weights): Linear and Embedding weights normal(0, 0.02),
// c_proj weights normal(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1 and bias 0.
// Every normal is drawn on the host from Philox (Note [Normal init] in core/nn/init.h) under the
// GPT's seed and stream_id(kStreamInit, layer id), the layer ids being
//   wte 0, wpe 1, block l: attn.c_attn 2 + 4l, attn.c_proj 3 + 4l, mlp.c_fc 4 + 4l,
//   mlp.c_proj 5 + 4l                                   (gpt_layer_id in gpt_config.h)
//
// Dropout sites (Note [Dropout masks] in core/numerics/gpt_math.h: the mask of a site is keyed
// by the GPT's seed, dropout_stream(step, site) and the logical element index in the global
// batch, first_row * elements per sample + i):
//   site 0: transformer.drop, on the embeddings x = wte[idx] + wpe [B, T, C]
//   block l: 1 + 3l attn.attn_dropout on att [B, nh, T, T] (in the attention kernel),
//            2 + 3l attn.resid_dropout on c_proj's output [B, T, C],
//            3 + 3l mlp.dropout on the MLP's output [B, T, C]     (gpt_dropout_site)
// so sites fit in 8 bits (kStreamDropout's original encoding) for n_layer <= 85; the sites >= 256
// of deeper blocks take kStreamDropoutWide, up to n_layer 21845 with dropout > 0 (with dropout 0
// no mask is drawn: n_layer is limited only by the init layer ids, < 2^46). Dropout is active in
// training mode (set_training) with cfg.dropout > 0; the Trainer sets step(), DataParallel / DDP
// each replica's first_row().
//
// Bitwise mode: every batch reduction (Linear, LayerNorm and embedding gradients) is reduced over
// the micro-shards of the B samples (bounds scaled by T, core/nn/token_bounds.h), so 1, 2, 4, 8
// devices give the same bits. transformer.wte.weight gets two contributions, the head's dW =
// dlogits^T x and the embedding's scatter-add; in bitwise mode they are added per micro-shard
// (head then embedding) and the shards combined by the canonical tree, so the tied gradient is
// one micro-shard reduction like every other. This holds log2(shards) + 2 temporaries [V, C].
// A shard without tokens (more micro-shards than samples: GPT-2 at B 8 has 56 of its 64) adds
// +0.0 leaves, so it is left out of the tree: no part, no fill, no add (a node with one such
// child is the other child). That gives the same bits: the embedding's scatter-add adds to every
// element of a part a sum that starts from +0.0 (or +0.0 itself), so no part holds -0.0, and
// x + (+0.0) == x for every other x (a NaN keeps its bits).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/attention.h"
#include "core/nn/container.h"
#include "core/nn/gpt_config.h"
#include "core/nn/gpt_layers.h"

namespace ditto::nn {

/// The residual stream between blocks with its last add pending: the stream is x + branch
/// (branch undefined: x itself). nn::GPT hands it from block to block so that each add is
/// folded into the LayerNorm after it (the next block's ln_1, or ln_f).
struct Residual {
  Tensor x, branch;
};

/// nanoGPT's Block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class Block : public BlockModule {
 public:
  Block(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed);
  /// forward() on a stream whose add is pending (nn::GPT): ln_1 of in.x + in.branch (one
  /// LayerNorm::forward_add: the add folded into it where the backend has the kernel), and
  /// returns {x1, mlp(ln_2(x1))} with x1 = that sum + attn(..) (ln_2's forward_add), the block's
  /// own add left pending. ops::add(out.x, out.branch) has the bits of forward(in.x +
  /// in.branch). in.x: [B, T, C] (InvalidArgument as forward's); in.branch undefined or in.x's
  /// shape, dtype and device (InvalidArgument naming the block and the argument otherwise).
  Residual forward_residual(Residual in);
  Tensor backward(const Tensor& grad_output) override;

 private:
  explicit Block(std::int64_t n_embd) : BlockModule("Block", n_embd) {}  // for clone
  enum Child : std::size_t { kLn1, kAttn, kLn2, kMlp };                  // children()
  Tensor forward_btc(const Tensor& x) override;
  std::unique_ptr<Container> empty_clone() const override;
};

/// nanoGPT's GPT (Note [GPT]).
class GPT : public Container {
 public:
  /// Parameters on `device`, initialised from `seed` as nanoGPT's _init_weights (Note [GPT]);
  /// the seed also keys the dropout masks. Throws InvalidArgument for a bad config
  /// (check_config).
  GPT(const GPTConfig& cfg, const Device& device, std::uint64_t seed);
  std::string name() const override { return "GPT"; }

  /// idx [B, T] i64 token ids in [0, vocab_size), 1 <= T <= block_size, on any device (copied to
  /// the model's) -> logits [B, T, vocab_size] f32 on the model's device (nanoGPT's forward
  /// with targets: the head on every position). Throws InvalidArgument for a wrong shape or
  /// dtype, T > block_size, or an id out of range (naming it).
  using Module::forward;
  Tensor forward(const Tensor& idx) override;
  /// grad_logits [B, T, vocab_size] (d loss / d logits, e.g. CrossEntropyLoss's backward):
  /// accumulates every parameter's grad; returns an undefined tensor (ids have no gradient).
  Tensor backward(const Tensor& grad_logits) override;
  /// Token ids have no gradient: input_requires_grad() is always false (a true is ignored).
  void set_input_requires_grad(bool) override { input_requires_grad_ = false; }
  // parameters(): nanoGPT's state_dict names and order (Note [GPT]); lm_head.weight is wte.
  const GPTConfig& config() const { return cfg_; }
  std::uint64_t seed() const { return seed_; }

  /// nanoGPT's generate(): appends max_new_tokens tokens to `prompt` (non-empty, ids in [0, V))
  /// and returns the whole sequence. Each new token: run the model in eval mode on the last
  /// block_size tokens (B = 1), take the last position's logits / temperature, keep the top_k
  /// largest (top_k <= 0 or >= V: all; ties at the k-th value are kept as torch.topk's
  /// threshold does), softmax with the portable exp on the host (max subtracted, sum ascending),
  /// and sample token n (0-based among the new ones) as the first index whose running sum of
  /// probabilities exceeds u = uniform01(seed, stream_id(kStreamSample, 0), n). The model's
  /// training mode and micro-shards are restored afterwards; the saved state of the last forward
  /// is not (call forward again before backward). Throws InvalidArgument for an empty prompt,
  /// a bad id, max_new_tokens < 0 or a temperature that is not finite and > 0.
  /// `vocab_limit` in (0, V]: draw only among the ids below it (the tokens a padded vocabulary,
  /// --vocab-size or GPT-2's 50304, holds beyond its data's never occur: they are dropped before
  /// top_k and the softmax); 0 (the default) or V: every id, the same draws as before.
  std::vector<std::int64_t> generate(std::vector<std::int64_t> prompt, std::int64_t max_new_tokens,
                                     float temperature, std::int64_t top_k, std::uint64_t seed,
                                     std::int64_t vocab_limit = 0);

 private:
  GPT(const GPTConfig& cfg, std::uint64_t seed) : cfg_(cfg), seed_(seed) {  // for clone
    input_requires_grad_ = false;
  }
  std::unique_ptr<Container> empty_clone() const override;
  void wte_grad(const Tensor& dlogits, const Tensor& demb);
  // The children, in nanoGPT's order: wte, wpe, drop, h.0 ... h.<n_layer - 1>, ln_f.
  Embedding& wte() const { return child<Embedding>(0); }
  Embedding& wpe() const { return child<Embedding>(1); }
  Dropout& drop() const { return child<Dropout>(2); }
  Block& h(std::int64_t l) const { return child<Block>(3 + static_cast<std::size_t>(l)); }
  LayerNorm& ln_f() const { return child<LayerNorm>(3 + static_cast<std::size_t>(cfg_.n_layer)); }

  GPTConfig cfg_;
  std::uint64_t seed_ = 0;
  Tensor idx_, xf_, dlogits_;  // the last forward's ids [B, T], ln_f output [B*T, C]
};

}  // namespace ditto::nn
