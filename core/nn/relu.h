// nn::ReLU: y = max(x, 0) elementwise (torch.nn.ReLU).
#pragma once

#include "core/nn/module.h"

namespace ditto::nn {

class ReLU : public Module {
 public:
  std::string name() const override { return "ReLU"; }
  /// input: any shape, f32 on a device -> same shape. Keeps the output for backward.
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// grad_output: the output's shape -> grad_output where output > 0, else 0 (undefined when
  /// !input_requires_grad()). Throws InvalidArgument before forward or on a shape mismatch.
  Tensor backward(const Tensor& grad_output) override;
  std::unique_ptr<Module> clone() const override;

 private:
  Tensor output_;
};

}  // namespace ditto::nn
