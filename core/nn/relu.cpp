// nn::ReLU forward and backward through ops::relu / ops::relu_backward.
#include "core/nn/relu.h"

#include "core/runtime/ops.h"

namespace ditto::nn {

Tensor ReLU::forward(const Tensor& input) {
  DITTO_CHECK(input.defined(), "ReLU.forward: input: expected a defined tensor");
  output_ = ops::relu(input);
  return output_;
}

Tensor ReLU::backward(const Tensor& grad_output) {
  DITTO_CHECK(output_.defined(), "ReLU.backward: called before forward");
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == output_.shape(),
              "ReLU.backward: grad_output: expected ", shape_str(output_.shape()),
              " f32 (the output's shape), got ",
              grad_output.defined() ? grad_output.str() : std::string("an undefined tensor"));
  if (!input_requires_grad_) return Tensor();
  return ops::relu_backward(output_, grad_output);
}

std::unique_ptr<Module> ReLU::clone() const {
  auto m = std::make_unique<ReLU>();
  copy_settings(*this, *m);
  return m;
}

}  // namespace ditto::nn
