// nn::Elementwise<Fn>: an elementwise activation y = f(x) as a module, the one class behind
// nn::ReLU and nn::GELU (core/nn/relu.h, core/nn/gpt_layers.h); Fn names the function and its
// gradient.
#pragma once

#include <memory>
#include <string>

#include "core/nn/module.h"

namespace ditto::nn {

/// y = f(x) elementwise, f and its gradient given by Fn (ReluFn, GeluFn in activation.cpp, the
/// only instantiations). No parameters.
template <class Fn>
class Elementwise : public Module {
 public:
  /// "ReLU", "GELU".
  std::string name() const override;
  /// input: any shape, f32 (or bf16 / f16) on a device -> the same shape. Keeps what backward
  /// needs (ReLU: the output; GELU: the input). Throws InvalidArgument for another dtype.
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// grad_output: the input's shape -> f'(x) * grad_output (ReLU: grad_output where the output
  /// is > 0, else 0), or an undefined tensor when !input_requires_grad(). Throws
  /// InvalidArgument before forward or on a shape mismatch.
  Tensor backward(const Tensor& grad_output) override;
  std::unique_ptr<Module> clone() const override;

 private:
  Tensor saved_;  // the last forward's input or output (Fn's choice)
};

struct ReluFn;
struct GeluFn;
extern template class Elementwise<ReluFn>;
extern template class Elementwise<GeluFn>;

}  // namespace ditto::nn
