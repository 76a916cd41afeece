// optim::SGD: stochastic gradient descent with momentum, dampening, weight decay and Nesterov
// momentum, exactly torch.optim.SGD (maximize = false).
#pragma once

#include "core/optim/optimizer.h"

namespace ditto::optim {

struct SGDOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

class SGD : public OptimizerWith<SGDOptions> {
 public:
  /// Per parameter p with gradient g (torch.optim.SGD):
  ///   g = g + weight_decay * p
  ///   if momentum != 0: buf = g on the first step, else buf = momentum * buf + (1 - dampening) *
  ///   g;
  ///                     g = nesterov ? g + momentum * buf : buf
  ///   p = p - lr * g
  /// Momentum buffers live on each parameter's device. Throws InvalidArgument for lr < 0,
  /// momentum < 0, weight_decay < 0 (or any NaN), nesterov without momentum > 0 and dampening 0,
  /// and what Optimizer's constructor throws.
  SGD(std::vector<nn::Parameter*> params, SGDOptions options);

  void step() override;
  /// "state.<i>.momentum_buffer" for each parameter with a buffer; options lr, momentum,
  /// dampening, weight_decay, nesterov.
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;
  /// The momentum buffers (none without momentum).
  std::size_t state_bytes() const override;

  /// Momentum buffer of parameter i (undefined before its first step or when momentum == 0).
  const Tensor& momentum_buffer(std::size_t i) const { return buffers_.at(i); }

 private:
  std::vector<Tensor> buffers_;
};

}  // namespace ditto::optim
