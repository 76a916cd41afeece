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

/// nanoGPT's CausalSelfAttention: qkv = c_attn(x) [B, T, 3C]; per head softmax((q k^T) /
/// sqrt(hd)) over the causal window; att = attn_dropout(att) [B, nh, T, T]; y = att v
/// re-assembled to [B, T, C]; resid_dropout(c_proj(y)).
class CausalSelfAttention : public Container {
 public:
  /// Block `layer`'s attention of the GPT of `cfg` (layer ids and dropout sites: Note [GPT] in
  /// core/nn/gpt.h). Parameters c_attn.weight [3C, C], c_attn.bias [3C], c_proj.weight [C, C],
  /// c_proj.bias [C] (biases when cfg.bias).
  CausalSelfAttention(const GPTConfig& cfg, std::int64_t layer, const Device& device,
                      std::uint64_t seed);
  std::string name() const override { return "CausalSelfAttention"; }
  /// x [B, T, C] f32 -> [B, T, C].
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_output) override;
  std::unique_ptr<Module> clone() const override;

 protected:
  std::vector<Module*> children() override;

 private:
  CausalSelfAttention() = default;
  std::int64_t n_head_ = 1;
  std::unique_ptr<Linear> c_attn_, c_proj_;
  std::unique_ptr<Dropout> attn_dropout_, resid_dropout_;
  Tensor qkv_, stats_;   // the forward's qkv and softmax stats [B, nh, T, 2] (f32)
  float att_p_ = 0.0f;  // the last forward's attn_dropout p (0: none)
  std::uint64_t att_stream_ = 0, att_base_ = 0;  // and its mask key
};

/// nanoGPT's MLP: dropout(c_proj(gelu(c_fc(x)))), c_fc [4C, C], c_proj [C, 4C].
class GPTMLP : public Container {
 public:
  GPTMLP(const GPTConfig& cfg, std::int64_t layer, const Device& device, std::uint64_t seed);
  std::string name() const override { return "MLP"; }
  /// x [B, T, C] f32 -> [B, T, C].
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  Tensor backward(const Tensor& grad_output) override;
  std::unique_ptr<Module> clone() const override;

 protected:
  std::vector<Module*> children() override;

 private:
  GPTMLP() = default;
  std::unique_ptr<Linear> c_fc_, c_proj_;
  std::unique_ptr<GELU> gelu_;
  std::unique_ptr<Dropout> dropout_;
};

}  // namespace ditto::nn
