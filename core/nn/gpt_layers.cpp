// nn::Embedding, nn::LayerNorm and nn::Dropout: forward and backward over the transformer ops
// (core/runtime/ops.h). nn::GELU is in activation.cpp.
#include "core/nn/gpt_layers.h"

#include <cmath>

#include "core/nn/gpt_config.h"
#include "core/nn/init.h"
#include "core/nn/token_bounds.h"
#include "core/numerics/random.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

namespace {

// Samples of a [B, ...] activation and its rows per sample (T for [B, T, C]).
std::int64_t rows_per_sample(const Shape& shape) {
  std::int64_t r = 1;
  for (std::size_t d = 1; d + 1 < shape.size(); ++d) r *= shape[d];
  return r;
}

}  // namespace

std::uint64_t dropout_stream(std::int64_t step, std::uint64_t site) {
  DITTO_CHECK(site < kDropoutSites, "nn::dropout_stream: site: expected < 2^16, got ", site);
  const bool narrow = site < kDropoutNarrowSites;
  DITTO_CHECK(step >= 0 && step < (narrow ? kDropoutNarrowSteps : kDropoutWideSteps),
              "nn::dropout_stream: step: expected in [0, ", narrow ? "2^40" : "2^32", ") at site ",
              site, narrow ? "" : " (>= 256: Note [Dropout masks])", ", got ", step);
  const auto s = static_cast<std::uint64_t>(step);
  return narrow ? stream_id(kStreamDropout, s << 8 | site)
                : stream_id(kStreamDropoutWide, s << 16 | site);
}

std::uint64_t dropout_index_base(std::int64_t first_row, std::int64_t elements_per_row) {
  DITTO_CHECK(first_row >= 0, "nn::dropout_index_base: first_row: expected >= 0, got ", first_row);
  return static_cast<std::uint64_t>(first_row) * static_cast<std::uint64_t>(elements_per_row);
}

// ---- Embedding -----------------------------------------------------------------------------

Embedding::Embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, const Device& device,
                     std::uint64_t seed, std::uint64_t layer_id, float init_std)
    : v_(num_embeddings), c_(embedding_dim) {
  input_requires_grad_ = false;
  DITTO_CHECK(num_embeddings >= 1 && embedding_dim >= 1,
              "Embedding: expected num_embeddings >= 1 and embedding_dim >= 1, got ",
              num_embeddings, " and ", embedding_dim);
  DITTO_CHECK(std::isfinite(init_std) && init_std >= 0.0f,
              "Embedding: init_std: expected a finite value >= 0, got ", init_std);
  weight_.data = normal_tensor({v_, c_}, device, seed, stream_id(kStreamInit, layer_id), init_std);
}

std::string Embedding::str() const { return detail::cat("Embedding(", v_, ", ", c_, ")"); }

Tensor Embedding::forward(const Tensor& idx) {
  DITTO_CHECK(idx.defined() && idx.dtype() == DType::i64 && (idx.dim() == 1 || idx.dim() == 2),
              str(), ".forward: idx: expected [B, T] or [N] i64 token ids, got ", describe(idx));
  Tensor y;
  try {
    y = ops::embedding(idx, weight_.data, Tensor());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(str() + ".forward: " + e.what());
  }
  idx_ = idx;
  forward_done();
  return y;
}

Tensor Embedding::backward(const Tensor& grad_output) {
  require_forward(str() + ".backward");
  Shape want = idx_.shape();
  want.push_back(c_);
  DITTO_CHECK(
      grad_output.defined() && grad_output.shape() == want && is_float_storage(grad_output.dtype()),
      str(), ".backward: grad_output: expected ", shape_str(want), " f32 (or bf16 / f16), got ",
      describe(grad_output));
  backward_done();
  const std::int64_t n = idx_.numel(), samples = idx_.size(0);
  const std::vector<std::int64_t> bounds =
      determinism_ == Determinism::bitwise
          ? token_bounds(*this, str(), samples, samples == 0 ? 1 : n / samples)
          : std::vector<std::int64_t>{0, n};
  const bool acc = weight_.grad.defined();
  new_grad(weight_, grad_dtype(weight_.data.dtype(), determinism_), grad_output.device());
  ops::embedding_backward(idx_.view({n}), grad_output.view({n, c_}), weight_.grad, bounds, acc);
  return Tensor();
}

std::unique_ptr<Module> Embedding::clone() const {
  std::unique_ptr<Embedding> m(new Embedding(v_, c_));
  m->weight_.data = weight_.data;
  copy_settings(*this, *m);
  return m;
}

// ---- LayerNorm -----------------------------------------------------------------------------

LayerNorm::LayerNorm(std::int64_t normalized_shape, const Device& device, bool bias, float eps)
    : LayerNorm(normalized_shape, bias, eps) {
  DITTO_CHECK(normalized_shape >= 1, "LayerNorm: normalized_shape: expected >= 1, got ",
              normalized_shape);
  DITTO_CHECK(std::isfinite(eps) && eps > 0.0f, "LayerNorm: eps: expected > 0, got ", eps);
  weight_.data = Tensor::full({c_}, 1.0f, device);
  if (has_bias_) bias_.data = Tensor::full({c_}, 0.0f, device);
}

LayerNorm::LayerNorm(std::int64_t c, bool bias, float eps)
    : Affine("LayerNorm", std::to_string(c), bias), c_(c), eps_(eps) {}

void LayerNorm::check_input(const Tensor& x) const {
  DITTO_CHECK(x.defined() && x.dim() >= 2 && x.size(-1) == c_ && is_float_storage(x.dtype()), str(),
              ".forward: input: expected [N, ..., ", c_, "] f32 (or bf16 / f16), got ",
              describe(x));
  DITTO_CHECK(x.device() == weight_.data.device(), str(), ".forward: input: expected a tensor on ",
              weight_.data.device().str(), " (the layer's device), got ", x.str());
}

Tensor LayerNorm::forward(const Tensor& x) {
  check_input(x);
  shape_ = x.shape();
  x_ = x.view({-1, c_});
  Tensor y =
      ops::layernorm(x_, weight_.data, has_bias_ ? bias_.data : Tensor(), eps_, mean_, rstd_);
  forward_done();
  return y.view(shape_);
}

AddNorm LayerNorm::forward_add(const Tensor& x, Tensor branch) {
  check_input(x);
  DITTO_CHECK(branch.defined() && branch.shape() == x.shape() && branch.dtype() == x.dtype() &&
                  branch.device() == x.device(),
              str(), ".forward_add: branch: expected ", shape_str(x.shape()), " ",
              dtype_name(x.dtype()), " on ", x.device().str(),
              " (the input's shape, dtype and device), got ", describe(branch));
  const Tensor b = has_bias_ ? bias_.data : Tensor();
  if (!ops::layernorm_add_fused(x, branch, weight_.data, b)) {
    // The two ops as nn::Block ran them: the branch freed before the LayerNorm's outputs exist
    // (the simulator's launches and memory).
    Tensor sum = ops::add(x, branch);
    branch = Tensor();
    Tensor y = forward(sum);
    return {std::move(sum), std::move(y)};
  }
  shape_ = x.shape();
  Tensor sum;
  Tensor y = ops::layernorm_add(x, branch, weight_.data, b, eps_, sum, mean_, rstd_);
  x_ = sum.view({-1, c_});
  forward_done();
  return {std::move(sum), std::move(y)};
}

Tensor LayerNorm::backward(const Tensor& grad_output) { return backward(grad_output, Tensor()); }

Tensor LayerNorm::backward(const Tensor& grad_output, const Tensor& residual_grad) {
  require_forward(str() + ".backward");
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == shape_ &&
                  is_float_storage(grad_output.dtype()),
              str(), ".backward: grad_output: expected ", shape_str(shape_),
              " f32 (or bf16 / f16), got ", describe(grad_output));
  DITTO_CHECK(!residual_grad.defined() || (residual_grad.shape() == shape_ &&
                                           residual_grad.dtype() == grad_output.dtype() &&
                                           residual_grad.device() == grad_output.device()),
              str(), ".backward: residual_grad: expected ", shape_str(shape_), " ",
              dtype_name(grad_output.dtype()), " on ", grad_output.device().str(),
              " (grad_output's shape, dtype and device), got ", describe(residual_grad));
  backward_done();
  const Tensor dy = grad_output.view({-1, c_});
  const Tensor r = residual_grad.defined() ? residual_grad.view({-1, c_}) : Tensor();
  // The gradients' dtype: an existing gradient's, else nn::grad_dtype's (both, if a bias).
  const DType gd = weight_.grad.defined() ? weight_.grad.dtype()
                                          : grad_dtype(weight_.data.dtype(), determinism_);
  if (determinism_ == Determinism::fast &&
      (!has_bias_ || !bias_.grad.defined() || bias_.grad.dtype() == gd) &&
      ops::layernorm_backward_params_fused(dy, x_, weight_.data, mean_, rstd_, r, gd)) {
    // One kernel: dx (and the residual's add) with both parameter gradients (Note [CUDA
    // LayerNorm parameter gradients]); a new gradient is written, an existing one accumulated.
    const bool acc_w = weight_.grad.defined(), acc_b = has_bias_ && bias_.grad.defined();
    new_grad(weight_, gd, dy.device(), /*zero=*/false);
    Tensor gw = weight_.grad.view({-1}), gb;
    if (has_bias_) {
      new_grad(bias_, gd, dy.device(), /*zero=*/false);
      gb = bias_.grad.view({-1});
    }
    return ops::layernorm_backward_params(dy, x_, weight_.data, mean_, rstd_, r, gw, acc_w, gb,
                                          acc_b)
        .view(shape_);
  }
  const std::vector<std::int64_t> bounds =
      determinism_ == Determinism::bitwise
          ? token_bounds(*this, str(), shape_[0], rows_per_sample(shape_))
          : std::vector<std::int64_t>{};
  // The backward (one kernel with the residual's add where the backend fuses it; else the add
  // after the row sums, as nn::Block ran it), the row sums while dy_xhat exists.
  const Tensor dx = ops::internal::layernorm_backward_with(
      dy, x_, weight_.data, mean_, rstd_, r, [&](const Tensor& dy_xhat) {
        add_row_sums(dy_xhat, weight_, determinism_, bounds);
        if (has_bias_) add_row_sums(dy, bias_, determinism_, bounds);
      });
  return dx.view(shape_);
}

std::unique_ptr<Module> LayerNorm::clone() const {
  return share_parameters(std::unique_ptr<Affine>(new LayerNorm(c_, has_bias_, eps_)));
}

// ---- Dropout -------------------------------------------------------------------------------

Dropout::Dropout(float p, std::uint64_t site, std::uint64_t seed)
    : p_(p), site_(site), seed_(seed) {
  DITTO_CHECK(p >= 0.0f && p < 1.0f, "Dropout: p: expected in [0, 1), got ", p);
  DITTO_CHECK(p == 0.0f || site < kDropoutSites,
              "Dropout: site: expected < 2^16 with p > 0 (Note [Dropout masks]), got ", site);
}

Tensor Dropout::forward(const Tensor& x) {
  DITTO_CHECK(x.defined() && is_float_storage(x.dtype()) && x.dim() >= 1,
              "Dropout.forward: input: expected an f32 (or bf16 / f16) tensor [B, ...], got ",
              describe(x));
  shape_ = x.shape();
  forward_done();
  applied_ = active() && x.numel() > 0;
  if (!applied_) return x;
  stream_ = dropout_stream(step_, site_);
  index_base_ = dropout_index_base(first_row_, x.numel() / x.size(0));
  return ops::dropout(x, p_, seed_, stream_, index_base_);
}

Tensor Dropout::backward(const Tensor& grad_output) {
  require_forward("Dropout.backward");
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == shape_,
              "Dropout.backward: grad_output: expected ", shape_str(shape_),
              " f32 (the input's shape), got ", describe(grad_output));
  backward_done();
  if (!applied_) return grad_output;
  return ops::dropout_backward(grad_output, p_, seed_, stream_, index_base_);
}

std::unique_ptr<Module> Dropout::clone() const {
  auto m = std::make_unique<Dropout>(p_, site_, seed_);
  copy_settings(*this, *m);
  return m;
}

}  // namespace ditto::nn
