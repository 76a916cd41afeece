// nn::Linear: y = x W^T + b (torch.nn.Linear), with PyTorch's default initialisation drawn from
// Philox so that it is identical on every backend (Note [Random streams] in core/numerics/random.h).
#pragma once

#include <cstdint>

#include "core/nn/module.h"

namespace ditto::nn {

class Linear : public Module {
 public:
  /// weight [out, in] and bias [out], f32 on `device`, each element uniform in
  /// [-1/sqrt(in), 1/sqrt(in)) like torch.nn.Linear's reset_parameters (kaiming_uniform with
  /// a = sqrt(5) gives the same bound). Drawn on the host from Philox keyed by (seed,
  /// stream_id(kStreamInit, layer_id), element index): weight element i at index i, bias
  /// element j at index in*out + j; then copied to the device.
  /// Throws InvalidArgument unless in >= 1 and out >= 1.
  Linear(std::int64_t in_features, std::int64_t out_features, const Device& device,
         std::uint64_t seed, std::uint64_t layer_id = 0);

  std::string name() const override { return "Linear"; }
  /// "Linear(64, 128)".
  std::string str() const;

  /// input [N, in] f32 on the weight's device -> [N, out]. Keeps input for backward.
  /// Throws InvalidArgument for a wrong shape, dtype or device, e.g.
  /// "Linear(64, 128).forward: input: expected [N, 64], got [32, 10] f32 on sim:0".
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// grad_output [N, out]: grad_W += gy^T x, grad_b += column sums of gy; returns gy W [N, in]
  /// when input_requires_grad(), else an undefined tensor. Throws InvalidArgument before any
  /// forward or for a grad_output of the wrong shape.
  Tensor backward(const Tensor& grad_output) override;

  std::vector<Parameter*> parameters() override { return {&weight_, &bias_}; }
  /// Shares weight and bias data; grads undefined; parameter names "weight" and "bias" (a
  /// container prefixes them again when the clone is added).
  std::unique_ptr<Module> clone() const override;

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

 private:
  Linear(std::int64_t in, std::int64_t out);  // for clone: parameters set by the caller

  std::int64_t in_ = 0, out_ = 0;
  Parameter weight_{"weight", {}, {}};
  Parameter bias_{"bias", {}, {}};
  Tensor input_;  // last forward's input
};

}  // namespace ditto::nn
