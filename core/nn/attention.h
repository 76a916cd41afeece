// nn::CausalSelfAttention and nn::GPTMLP: the two halves of a transformer block of nanoGPT's
// model.py (its CausalSelfAttention and MLP), built from nn::Linear, nn::Dropout, nn::GELU and the
// causal attention op (ops::attention).
#pragma once

#include <cstdint>
#include <memory>

#include "core/nn/container.h"
#include "core/nn/gpt_config.h"
#include "core/nn/gpt_layers.h"
#include "core/nn/linear.h"

namespace ditto::nn {

/// A transformer block (nn::Block) or one of its halves (CausalSelfAttention, GPTMLP): a
/// Container on the residual stream whose children are built for block `layer` of a GPTConfig
/// (layer ids and dropout sites: Note [GPT] in core/nn/gpt.h).
class BlockModule : public Container {
 public:
  std::string name() const override { return name_; }
  std::int64_t n_embd() const { return n_embd_; }
  /// x [B, T, C] f32 (or bf16 / f16) -> [B, T, C]. Throws InvalidArgument naming the module
  /// for another shape or dtype ("MLP.forward: input: expected [B, T, 64] ...").
  using Module::forward;
  Tensor forward(const Tensor& x) final;
  /// Default: backward_chain (GPTMLP).
  Tensor backward(const Tensor& grad_output) override { return backward_chain(grad_output); }

 protected:
  BlockModule(const char* name, std::int64_t n_embd) : name_(name), n_embd_(n_embd) {}
  /// forward()'s check of x (InvalidArgument naming the module).
  void check_input(const Tensor& x) const;
  /// forward() once x is checked. Default: forward_chain (GPTMLP).
  virtual Tensor forward_btc(const Tensor& x) { return forward_chain(x); }

 private:
  const char* name_;
  std::int64_t n_embd_;
};

/// nanoGPT's CausalSelfAttention: qkv = c_attn(x) [B, T, 3C]; per head softmax((q k^T) /
/// sqrt(hd)) over the causal window; att = attn_dropout(att) [B, nh, T, T]; y = att v
/// re-assembled to [B, T, C]; resid_dropout(c_proj(y)).
class CausalSelfAttention : public BlockModule {
 public:
  /// Parameters c_attn.weight [3C, C], c_attn.bias [3C], c_proj.weight [C, C], c_proj.bias [C]
  /// (biases when cfg.bias).
  CausalSelfAttention(const GPTConfig& cfg, std::int64_t layer, const Device& device,
                      std::uint64_t seed);
  Tensor backward(const Tensor& grad_output) override;

 private:
  CausalSelfAttention(std::int64_t n_embd, std::int64_t n_head);             // for clone
  enum Child : std::size_t { kCAttn, kAttnDropout, kCProj, kResidDropout };  // children()
  Tensor forward_btc(const Tensor& x) override;
  std::unique_ptr<Container> empty_clone() const override;
  std::int64_t n_head_;
  Tensor qkv_, stats_;  // the forward's qkv and softmax stats [B, nh, T, 2] (f32)
  Tensor y_;            // the forward's attention output (c_proj's input, kept by it too)
  float att_p_ = 0.0f;  // the last forward's attn_dropout p (0: none)
  std::uint64_t att_stream_ = 0, att_base_ = 0;  // and its mask key
};

/// nanoGPT's MLP: dropout(c_proj(gelu(c_fc(x)))), c_fc [4C, C], c_proj [C, 4C]. Where c_fc's
/// GEMM takes the GELU in its epilogue (Linear::gelu_fused: fast mode on a backend with
/// Kernels::has_gemm_gelu_epilogue; llm.c's fusion), the forward runs
/// c_fc.forward_gelu (one GEMM, keeping the pre-GELU as the GELU module would) and the backward
/// c_proj.backward_dgelu (c_proj's input-gradient GEMM gives the pre-GELU's gradient: no GELU
/// backward launch); otherwise the four children in sequence.
class GPTMLP : public BlockModule {
 public:
  GPTMLP(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed);
  Tensor backward(const Tensor& grad_output) override;

 private:
  explicit GPTMLP(std::int64_t n_embd) : BlockModule("MLP", n_embd) {}  // for clone
  enum Child : std::size_t { kCFc, kGelu, kCProj, kDropout };           // children()
  Tensor forward_btc(const Tensor& x) override;
  std::unique_ptr<Container> empty_clone() const override;
  Tensor pre_;  // the fused forward's pre-GELU [B, T, 4C]; undefined after an unfused forward
};

}  // namespace ditto::nn
