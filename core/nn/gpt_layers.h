// The GPT's elementwise and normalisation layers: nn::Embedding, nn::LayerNorm, nn::GELU and
// nn::Dropout (torch.nn's modules of those names), each with an explicit forward and backward over
// the transformer ops of core/runtime/ops.h. Activations are [B, T, C] (any [B, ..., C]); in
// bitwise mode the parameter gradients are reduced over the micro-shards of the B samples
// (core/nn/token_bounds.h), so 1, 2, 4, ... devices give the same bits.
#pragma once

#include <cstdint>

#include "core/nn/activation.h"
#include "core/nn/affine.h"
#include "core/nn/module.h"

namespace ditto::nn {

/// torch.nn.Embedding(num_embeddings, embedding_dim): weight [V, C] f32.
class Embedding : public Module {
 public:
  /// weight [num_embeddings, embedding_dim] on `device`, each element normal(0, init_std)
  /// from normal_tensor(seed, stream_id(kStreamInit, layer_id), init_std) (Note [Normal init] in
  /// core/nn/init.h; torch's default is normal(0, 1), nanoGPT's 0.02). Throws InvalidArgument
  /// unless both sizes are >= 1 and init_std is finite and >= 0.
  Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, const Device& device,
            std::uint64_t seed, std::uint64_t layer_id, float init_std = 1.0f);

  std::string name() const override { return "Embedding"; }
  /// "Embedding(65, 128)".
  std::string str() const;
  /// idx [B, T] (or [N]) i64 on the weight's device, every id in [0, V) -> [B, T, C] (or
  /// [N, C]): weight[idx]. Throws InvalidArgument naming the first id out of range.
  using Module::forward;
  Tensor forward(const Tensor& idx) override;
  /// grad_output (the output's shape): weight.grad (+)= the scatter-add of its rows by idx
  /// (ops::embedding_backward; bitwise: over the samples' micro-shards). Returns an undefined
  /// tensor (token ids have no gradient).
  Tensor backward(const Tensor& grad_output) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }
  std::unique_ptr<Module> clone() const override;
  /// Token ids have no gradient: input_requires_grad() is always false (a true is ignored).
  void set_input_requires_grad(bool) override { input_requires_grad_ = false; }

  std::int64_t num_embeddings() const { return v_; }
  std::int64_t embedding_dim() const { return c_; }
  Parameter& weight() { return weight_; }

 private:
  Embedding(std::int64_t v, std::int64_t c) : v_(v), c_(c) { input_requires_grad_ = false; }
  std::int64_t v_ = 0, c_ = 0;
  Parameter weight_{"weight", {}, {}};
  Tensor idx_;
};

/// A residual stream's sum and its LayerNorm (nn::LayerNorm::forward_add): sum = x + branch,
/// y = the LayerNorm of sum, both of x's shape and dtype.
struct AddNorm {
  Tensor sum, y;
};

/// torch.nn.LayerNorm(C, eps=1e-5, bias=...) over the last dim (nanoGPT's LayerNorm with
/// optional bias): weight [C] = 1, bias [C] = 0.
class LayerNorm : public Affine {
 public:
  /// Throws InvalidArgument unless normalized_shape >= 1 and eps > 0.
  LayerNorm(std::int64_t normalized_shape, const Device& device, bool bias = true,
            float eps = 1e-5f);
  /// x [N, ..., C] f32 -> y of x's shape (ops::layernorm); keeps x, mean and rstd.
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  /// forward(x + branch) with the residual add before it (nn::Block: ln_2(x + attn(..)), the
  /// next block's ln_1 or ln_f of x + mlp(..)): returns {sum, y} with the bits of sum =
  /// ops::add(x, branch) and y = forward(sum), as one kernel where ops::layernorm_add_fused says
  /// so; else those two ops, `branch` released between them (so pass it with std::move to free
  /// it before the LayerNorm's outputs exist, as the separate add did). Keeps sum as the
  /// backward's x. branch: x's shape, dtype and device (InvalidArgument naming the layer and
  /// the argument otherwise).
  AddNorm forward_add(const Tensor& x, Tensor branch);
  /// grad_w (+)= sum over rows of dy * xhat, grad_b (+)= sum over rows of dy; returns dx.
  Tensor backward(const Tensor& grad_output) override;
  /// backward(grad_output) with a residual gradient (nn::Block: x = x + f(ln(x))): returns
  /// residual_grad + dx, the bits of ops::add(residual_grad, backward(grad_output)), as one
  /// kernel where ops::layernorm_backward_add_fused says so. residual_grad: grad_output's shape,
  /// dtype and device (undefined: backward(grad_output)).
  Tensor backward(const Tensor& grad_output, const Tensor& residual_grad);
  std::unique_ptr<Module> clone() const override;

 private:
  LayerNorm(std::int64_t c, bool bias, float eps);  // for clone: parameters set by the caller
  void check_input(const Tensor& x) const;          // forward's checks of x
  std::int64_t c_ = 0;
  float eps_ = 1e-5f;
  Tensor x_, mean_, rstd_;
  Shape shape_;
};

/// torch.nn.GELU(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), with the
/// portable tanh (nanoGPT's model.py uses the exact erf form; ditto's GPT uses the tanh form of
/// GPT-2 and llm.c: Note [GPT] in core/nn/gpt.h). Any f32 (or bf16 / f16) shape; keeps x
/// (Elementwise).
using GELU = Elementwise<GeluFn>;

/// torch.nn.Dropout(p) with masks that do not depend on the device count (Note [Dropout masks]
/// in core/numerics/gpt_math.h): in training mode element i of this module's [B, ...] input is
/// kept (and scaled by 1 / (1 - p)) when uniform01(seed, stream, first_row() * E + i) >= p, E
/// = the elements per sample, stream = dropout_stream(step(), site). In eval mode, or p == 0,
/// the identity.
class Dropout : public Module {
 public:
  /// Throws InvalidArgument unless 0 <= p < 1 and, with p > 0, site < 2^16 (kDropoutSites in
  /// gpt_config.h).
  Dropout(float p, std::uint64_t site, std::uint64_t seed);
  std::string name() const override { return "Dropout"; }
  /// x [B, ...] f32 -> x's shape.
  using Module::forward;
  Tensor forward(const Tensor& x) override;
  /// The last forward's mask (recomputed) applied to grad_output; the identity when the
  /// forward was.
  Tensor backward(const Tensor& grad_output) override;
  std::unique_ptr<Module> clone() const override;
  float p() const { return p_; }
  std::uint64_t site() const { return site_; }
  std::uint64_t seed() const { return seed_; }
  /// Whether the next forward draws a mask (training() and p > 0).
  bool active() const { return training_ && p_ > 0.0f; }

 private:
  float p_ = 0.0f;
  std::uint64_t site_ = 0, seed_ = 0;
  // The last forward's mask key (applied == false: it was the identity).
  bool applied_ = false;
  std::uint64_t stream_ = 0, index_base_ = 0;
  Shape shape_;
};

/// The Philox stream of dropout site `site` at optimizer step `step` (Note [Dropout masks]):
/// stream_id(kStreamDropout, step << 8 | site) for site < 256 and step < 2^40,
/// stream_id(kStreamDropoutWide, step << 16 | site) for 256 <= site < 2^16 and step < 2^32.
/// Throws InvalidArgument for a site or step past those (or a step < 0).
std::uint64_t dropout_stream(std::int64_t step, std::uint64_t site);
/// The logical index of the first element of a replica's rows: first_row * elements_per_row.
std::uint64_t dropout_index_base(std::int64_t first_row, std::int64_t elements_per_row);

}  // namespace ditto::nn
