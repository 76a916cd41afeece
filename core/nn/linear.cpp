// nn::Linear: forward y = x W^T + b, backward into grad_W, grad_b and grad_x; Philox init.
#include "core/nn/linear.h"

#include <cmath>
#include <limits>

#include "core/nn/init.h"
#include "core/nn/token_bounds.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

Linear::Linear(std::int64_t in, std::int64_t out, bool bias)
    : Affine("Linear", detail::cat(in, ", ", out), bias), in_(in), out_(out) {}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, const Device& device,
               std::uint64_t seed, std::uint64_t layer_id, LinearOptions options)
    : Linear(in_features, out_features, options.bias) {
  DITTO_CHECK(in_features >= 1 && out_features >= 1, "Linear: expected in_features >= 1 and ",
              "out_features >= 1, got in_features = ", in_features,
              ", out_features = ", out_features);
  DITTO_CHECK(
      in_features <= std::numeric_limits<std::int64_t>::max() / out_features,
      "Linear: expected in_features * out_features <= ", std::numeric_limits<std::int64_t>::max(),
      ", got in_features = ", in_features, ", out_features = ", out_features);
  DITTO_CHECK(std::isfinite(options.init_std) && options.init_std >= 0.0f,
              "Linear: init_std: expected a finite value >= 0 (0: torch's default init), got ",
              options.init_std);
  const std::uint64_t stream = stream_id(kStreamInit, layer_id);
  if (options.init_std > 0.0f) {  // nanoGPT's _init_weights
    weight_.data =
        normal_tensor({out_features, in_features}, device, seed, stream, options.init_std);
    if (has_bias_) bias_.data = Tensor::full({out_features}, 0.0f, device);
    return;
  }
  // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) on the weight gives bound
  // gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), i.e. 1 / sqrt(fan_in); the bias uses
  // 1 / sqrt(fan_in) directly.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features)));
  // Allocate on the device first: a layer too large for the device fails with its OutOfMemory
  // before any host memory is spent on it.
  weight_.data = Tensor::empty({out_features, in_features}, DType::f32, device);
  if (has_bias_) bias_.data = Tensor::empty({out_features}, DType::f32, device);
  if (is_dry_run(device)) {  // nothing to draw: price the uploads only (Note [Dry run])
    dry_upload(weight_.data);
    if (has_bias_) dry_upload(bias_.data);
    return;
  }
  const std::int64_t nw = weight_.data.numel();
  Tensor w = Tensor::empty({out_features, in_features}, DType::f32, Device::cpu());
  float* wp = w.data<float>();
  for (std::int64_t i = 0; i < nw; ++i)
    wp[i] = uniform(seed, stream, static_cast<std::uint64_t>(i), -bound, bound);
  weight_.data.copy_(w);
  if (!has_bias_) return;
  Tensor b = Tensor::empty({out_features}, DType::f32, Device::cpu());
  float* bp = b.data<float>();
  for (std::int64_t j = 0; j < out_features; ++j)
    bp[j] = uniform(seed, stream, static_cast<std::uint64_t>(nw + j), -bound, bound);
  bias_.data.copy_(b);
}

void Linear::keep_input(const Tensor& input, const char* call) {
  DITTO_CHECK(input.defined(), str(), call, ": input: expected a defined tensor");
  DITTO_CHECK(input.dim() >= 2 && input.size(-1) == in_, str(), call, ": input: expected [N, ", in_,
              "], got ", input.str(),
              input.dim() > 2 ? " (or [N, ..., in]: leading dims are flattened)" : "");
  DITTO_CHECK(is_float_storage(input.dtype()), str(), call,
              ": input: expected dtype f32, bf16 or f16, got ", input.str());
  const Device& dev = weight_.data.device();
  DITTO_CHECK(input.device() == dev, str(), call, ": input: expected a tensor on ", dev.str(),
              " (the layer's device), got ", input.str());
  input_shape_ = input.shape();
  input_ = input.dim() == 2 ? input : input.view({-1, in_});
  forward_done();
}

Tensor Linear::out_view(const Tensor& y) const {
  if (input_shape_.size() == 2) return y;
  Shape out_shape = input_shape_;
  out_shape.back() = out_;
  return y.view(out_shape);
}

Tensor Linear::forward(const Tensor& input) {
  keep_input(input, ".forward");
  // y[rows, out] = x[rows, in] @ W[out, in]^T, then + b (one GEMM with a bias epilogue where
  // the backend has it, ops::linear).
  return out_view(
      ops::linear(input_, weight_.data, has_bias_ ? bias_.data : Tensor(), determinism_));
}

bool Linear::gelu_fused(const Tensor& input) const {
  return ops::linear_gelu_fused(input, weight_.data, has_bias_ ? bias_.data : Tensor(),
                                determinism_);
}

Tensor Linear::forward_gelu(const Tensor& input, Tensor& pre) {
  keep_input(input, ".forward_gelu");
  Tensor h;
  const Tensor y =
      ops::linear_gelu(input_, weight_.data, has_bias_ ? bias_.data : Tensor(), h, determinism_);
  pre = out_view(h);
  return out_view(y);
}

Tensor Linear::parameter_grads(const Tensor& grad_output, const char* call) {
  require_forward(str() + call);
  Shape out_shape = input_shape_;
  out_shape.back() = out_;
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == out_shape &&
                  is_float_storage(grad_output.dtype()),
              str(), call, ": grad_output: expected ", shape_str(out_shape),
              " f32 (or bf16 / f16), got ", describe(grad_output));
  DITTO_CHECK(grad_output.device() == input_.device(), str(), call,
              ": grad_output: expected a tensor on ", input_.device().str(), ", got ",
              grad_output.str());
  backward_done();
  const std::int64_t rows = input_.size(0);
  const Tensor gy = grad_output.dim() == 2 ? grad_output : grad_output.view({rows, out_});
  if (determinism_ == Determinism::bitwise) {
    // Note [Micro-shards]: rows summed in order inside each micro-shard, shards combined by the
    // canonical tree, so the result does not depend on how many devices share the batch.
    const std::int64_t samples = input_shape_[0];
    const std::vector<std::int64_t> bounds =
        token_bounds(*this, str(), samples, samples == 0 ? 1 : rows / samples);
    const bool acc_w = weight_.grad.defined();
    new_grad(weight_, grad_dtype(weight_.data.dtype(), determinism_), gy.device());
    ops::gemm_tn_sharded(gy, input_, weight_.grad, bounds, acc_w);
    if (has_bias_) add_row_sums(gy, bias_, determinism_, bounds);
  } else {
    // grad_W[out, in] (+)= gy[rows, out]^T @ x[rows, in]
    const bool acc_w = weight_.grad.defined();
    new_grad(weight_, grad_dtype(weight_.data.dtype(), determinism_), gy.device());
    ops::gemm(gy, input_, weight_.grad, true, false, 1.0f, acc_w ? 1.0f : 0.0f, determinism_);
    // grad_b[out] (+)= sum over rows of gy
    if (has_bias_) add_row_sums(gy, bias_, determinism_, {});
  }
  return gy;
}

Tensor Linear::backward(const Tensor& grad_output) {
  const Tensor gy = parameter_grads(grad_output, ".backward");
  if (!input_requires_grad_) return Tensor();
  // grad_x[rows, in] = gy[rows, out] @ W[out, in]
  Tensor gx = ops::matmul(gy, weight_.data, false, false, determinism_);
  return input_shape_.size() == 2 ? gx : gx.view(input_shape_);
}

Tensor Linear::backward_dgelu(const Tensor& grad_output, const Tensor& pre) {
  const Tensor gy = parameter_grads(grad_output, ".backward_dgelu");
  DITTO_CHECK(pre.defined() && pre.shape() == input_shape_, str(),
              ".backward_dgelu: pre: expected ", shape_str(input_shape_),
              " (the input's shape), got ", describe(pre));
  if (!input_requires_grad_) return Tensor();
  // grad_pre[rows, in] = (gy[rows, out] @ W[out, in]) * gelu'(pre)
  const Tensor p = pre.dim() == 2 ? pre : pre.view({input_.size(0), in_});
  Tensor gx = ops::matmul_dgelu(gy, weight_.data, p, determinism_);
  return input_shape_.size() == 2 ? gx : gx.view(input_shape_);
}

std::unique_ptr<Module> Linear::clone() const {
  return share_parameters(std::unique_ptr<Affine>(new Linear(in_, out_, has_bias_)));
}

}  // namespace ditto::nn
