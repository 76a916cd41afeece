// nn::Linear: forward y = x W^T + b, backward into grad_W, grad_b and grad_x; Philox init.
#include "core/nn/linear.h"

#include <cmath>
#include <limits>

#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"
#include "core/numerics/random.h"

namespace ditto::nn {

Linear::Linear(std::int64_t in, std::int64_t out) : in_(in), out_(out) {}

Linear::Linear(std::int64_t in_features, std::int64_t out_features, const Device& device,
               std::uint64_t seed, std::uint64_t layer_id)
    : in_(in_features), out_(out_features) {
  DITTO_CHECK(in_features >= 1 && out_features >= 1, "Linear: expected in_features >= 1 and ",
              "out_features >= 1, got in_features = ", in_features,
              ", out_features = ", out_features);
  DITTO_CHECK(in_features <= std::numeric_limits<std::int64_t>::max() / out_features,
              "Linear: expected in_features * out_features <= ",
              std::numeric_limits<std::int64_t>::max(), ", got in_features = ", in_features,
              ", out_features = ", out_features);
  // torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)) on the weight gives bound
  // gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + 5)), i.e. 1 / sqrt(fan_in); the bias uses
  // 1 / sqrt(fan_in) directly.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features)));
  const std::uint64_t stream = stream_id(kStreamInit, layer_id);
  // Allocate on the device first: a layer too large for the device fails with its OutOfMemory
  // before any host memory is spent on it.
  weight_.data = Tensor::empty({out_features, in_features}, DType::f32, device);
  bias_.data = Tensor::empty({out_features}, DType::f32, device);
  const std::int64_t nw = weight_.data.numel();
  Tensor w = Tensor::empty({out_features, in_features}, DType::f32, Device::cpu());
  Tensor b = Tensor::empty({out_features}, DType::f32, Device::cpu());
  float* wp = w.data<float>();
  float* bp = b.data<float>();
  for (std::int64_t i = 0; i < nw; ++i)
    wp[i] = uniform(seed, stream, static_cast<std::uint64_t>(i), -bound, bound);
  for (std::int64_t j = 0; j < out_features; ++j)
    bp[j] = uniform(seed, stream, static_cast<std::uint64_t>(nw + j), -bound, bound);
  weight_.data.copy_(w);
  bias_.data.copy_(b);
}

std::string Linear::str() const { return detail::cat("Linear(", in_, ", ", out_, ")"); }

Tensor Linear::forward(const Tensor& input) {
  DITTO_CHECK(input.defined(), str(), ".forward: input: expected a defined tensor");
  DITTO_CHECK(input.dim() == 2 && input.size(1) == in_, str(), ".forward: input: expected [N, ",
              in_, "], got ", input.str());
  DITTO_CHECK(input.dtype() == DType::f32, str(), ".forward: input: expected dtype f32, got ",
              input.str());
  const Device& dev = weight_.data.device();
  DITTO_CHECK(input.device() == dev, str(), ".forward: input: expected a tensor on ", dev.str(),
              " (the layer's device), got ", input.str());
  // y[N, out] = x[N, in] @ W[out, in]^T, then + b.
  Tensor y = ops::matmul(input, weight_.data, false, true, determinism_);
  ops::add_bias_(y, bias_.data);
  input_ = input;
  return y;
}

Tensor Linear::backward(const Tensor& grad_output) {
  DITTO_CHECK(input_.defined(), str(), ".backward: called before forward");
  const std::int64_t n = input_.size(0);
  DITTO_CHECK(grad_output.defined() && grad_output.dim() == 2 && grad_output.size(0) == n &&
                  grad_output.size(1) == out_ && grad_output.dtype() == DType::f32,
              str(), ".backward: grad_output: expected [", n, ", ", out_, "] f32, got ",
              grad_output.defined() ? grad_output.str() : std::string("an undefined tensor"));
  DITTO_CHECK(grad_output.device() == input_.device(), str(),
              ".backward: grad_output: expected a tensor on ", input_.device().str(), ", got ",
              grad_output.str());
  if (determinism_ == Determinism::bitwise) {
    // Note [Micro-shards]: rows summed in order inside each micro-shard, shards combined by the
    // canonical tree, so the result does not depend on how many devices share the batch.
    const std::vector<std::int64_t> bounds =
        micro_shards_.empty() ? micro_shard_bounds(n, kDefaultMicroShards) : micro_shards_;
    DITTO_CHECK(bounds.back() == n, str(), ".backward: micro-shards cover ", bounds.back(),
                " rows, the batch has ", n, " (set_micro_shards before forward)");
    const bool acc_w = weight_.grad.defined(), acc_b = bias_.grad.defined();
    if (!acc_w) weight_.grad = Tensor::empty({out_, in_}, DType::f32, grad_output.device());
    if (!acc_b) bias_.grad = Tensor::empty({out_}, DType::f32, grad_output.device());
    ops::gemm_tn_sharded(grad_output, input_, weight_.grad, bounds, acc_w);
    ops::sum_rows_sharded(grad_output, bias_.grad, bounds, acc_b);
    if (!input_requires_grad_) return Tensor();
    return ops::matmul(grad_output, weight_.data, false, false, determinism_);
  }
  // grad_W[out, in] (+)= gy[N, out]^T @ x[N, in]
  if (weight_.grad.defined())
    ops::gemm(grad_output, input_, weight_.grad, true, false, 1.0f, 1.0f, determinism_);
  else
    weight_.grad = ops::matmul(grad_output, input_, true, false, determinism_);
  // grad_b[out] (+)= sum over rows of gy
  if (bias_.grad.defined()) {
    ops::sum_rows(grad_output, bias_.grad, 1.0f, determinism_);
  } else {
    bias_.grad = Tensor::zeros({out_}, DType::f32, grad_output.device());
    ops::sum_rows(grad_output, bias_.grad, 0.0f, determinism_);
  }
  if (!input_requires_grad_) return Tensor();
  // grad_x[N, in] = gy[N, out] @ W[out, in]
  return ops::matmul(grad_output, weight_.data, false, false, determinism_);
}

std::unique_ptr<Module> Linear::clone() const {
  std::unique_ptr<Linear> m(new Linear(in_, out_));
  m->weight_.data = weight_.data;
  m->bias_.data = bias_.data;
  copy_settings(*this, *m);
  return m;
}

}  // namespace ditto::nn
