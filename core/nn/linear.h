// nn::Linear: y = x W^T + b (torch.nn.Linear), with PyTorch's default initialisation or nanoGPT's
// normal(0, std) drawn from Philox so that it is identical on every backend (Note [Random streams]
// in core/numerics/random.h, Note [Normal init] in core/nn/init.h).
#pragma once

#include <cstdint>

#include "core/nn/affine.h"

namespace ditto::nn {

/// Construction options of nn::Linear beyond the sizes.
struct LinearOptions {
  /// torch.nn.Linear's `bias`: false gives a layer without a bias parameter.
  bool bias = true;
  /// 0: torch's default initialisation (uniform, see Linear). > 0: nanoGPT's _init_weights,
  /// weight normal(0, init_std) (Note [Normal init]), bias zeros.
  float init_std = 0.0f;
};

class Linear : public Affine {
 public:
  /// weight [out, in] and bias [out] (when options.bias), f32 on `device`. Default init: each
  /// element uniform in [-1/sqrt(in), 1/sqrt(in)) like torch.nn.Linear's reset_parameters
  /// (kaiming_uniform with a = sqrt(5) gives the same bound), drawn on the host from Philox keyed
  /// by (seed, stream_id(kStreamInit, layer_id), element index): weight element i at index i,
  /// bias element j at index in*out + j. With options.init_std > 0: the weight from
  /// normal_tensor(seed, stream_id(kStreamInit, layer_id), init_std), the bias zeros. Then
  /// copied to the device. Throws InvalidArgument unless in >= 1, out >= 1 and init_std is
  /// finite and >= 0.
  Linear(std::int64_t in_features, std::int64_t out_features, const Device& device,
         std::uint64_t seed, std::uint64_t layer_id = 0, LinearOptions options = {});

  /// input [N, in] or [N, ..., in] f32 on the weight's device (leading dims flattened, as
  /// torch.nn.Linear) -> [N, ..., out]. Keeps input for backward.
  /// Throws InvalidArgument for a wrong shape, dtype or device, e.g.
  /// "Linear(64, 128).forward: input: expected [N, 64], got [32, 10] f32 on sim:0".
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// grad_output [N, ..., out] (the output's shape): grad_W += gy^T x, grad_b += column sums of
  /// gy over all N * ... rows; returns gy W (the input's shape) when input_requires_grad(),
  /// else an undefined tensor. In bitwise mode the rows are reduced over the micro-shards of the
  /// N samples (module.h), each sample's rows together. Throws InvalidArgument before any
  /// forward or for a grad_output of the wrong shape.
  Tensor backward(const Tensor& grad_output) override;
  /// Whether forward_gelu and backward_dgelu fuse the GELU into the GEMM for an input of
  /// input's dtype and device here (ops::linear_gelu_fused in the layer's determinism: fast
  /// mode where the backend has Kernels::has_gemm_gelu_epilogue).
  bool gelu_fused(const Tensor& input) const;
  /// gelu(forward(input)) (GELU's tanh form), setting `pre` to forward(input) (the pre-GELU,
  /// [N, ..., out]): ops::linear_gelu, one GEMM with the GELU in its epilogue where gelu_fused,
  /// else the two ops. Keeps input for backward; throws as forward.
  Tensor forward_gelu(const Tensor& input, Tensor& pre);
  /// backward for a layer whose input was gelu(pre) (pre: the input's shape, from the previous
  /// layer's forward_gelu): the parameter gradients as backward, then returns (grad_output W) *
  /// gelu'(pre) (ops::matmul_dgelu: one GEMM with the GELU's gradient in its epilogue where
  /// fused), the gradient of pre, or an undefined tensor when !input_requires_grad(). Throws as
  /// backward, and InvalidArgument for a pre of another shape.
  Tensor backward_dgelu(const Tensor& grad_output, const Tensor& pre);
  /// Shares weight and bias data; grads undefined; parameter names "weight" and "bias" (a
  /// container prefixes them again when the clone is added).
  std::unique_ptr<Module> clone() const override;

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }

 private:
  Linear(std::int64_t in, std::int64_t out, bool bias);  // for clone: parameters set by the caller
  /// Checks a forward's input (`call`: ".forward") and keeps it (input_, input_shape_).
  void keep_input(const Tensor& input, const char* call);
  /// y [rows, out] as [N, ..., out] (the input's leading dims).
  Tensor out_view(const Tensor& y) const;
  /// backward's checks (`call`: ".backward") and parameter gradients; returns grad_output as
  /// [rows, out].
  Tensor parameter_grads(const Tensor& grad_output, const char* call);

  std::int64_t in_ = 0, out_ = 0;
  Tensor input_;  // last forward's input, flattened to [rows, in]
  Shape input_shape_;
};

}  // namespace ditto::nn
