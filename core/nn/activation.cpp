// nn::Elementwise<Fn>: forward and backward of ReLU (ops::relu) and GELU (ops::gelu).
#include "core/nn/activation.h"

#include "core/nn/token_bounds.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

// Each Fn: its name, f (which keeps in `saved` what its gradient reads) and the gradient.
struct ReluFn {
  static constexpr const char* kName = "ReLU";
  static Tensor forward(const Tensor& x, Tensor& saved) {
    saved = ops::relu(x);
    return saved;
  }
  static Tensor backward(const Tensor& saved, const Tensor& g) {
    return ops::relu_backward(saved, g);
  }
};

// torch.nn.GELU(approximate='tanh') (Note [GPT] in core/nn/gpt.h).
struct GeluFn {
  static constexpr const char* kName = "GELU";
  static Tensor forward(const Tensor& x, Tensor& saved) {
    saved = x;
    return ops::gelu(x);
  }
  static Tensor backward(const Tensor& saved, const Tensor& g) {
    return ops::gelu_backward(saved, g);
  }
};

template <class Fn>
std::string Elementwise<Fn>::name() const {
  return Fn::kName;
}

template <class Fn>
Tensor Elementwise<Fn>::forward(const Tensor& input) {
  DITTO_CHECK(input.defined() && is_float_storage(input.dtype()), Fn::kName,
              ".forward: input: expected an f32 (or bf16 / f16) tensor, got ", describe(input));
  Tensor y = Fn::forward(input, saved_);
  forward_done();
  return y;
}

template <class Fn>
Tensor Elementwise<Fn>::backward(const Tensor& grad_output) {
  require_forward(std::string(Fn::kName) + ".backward");
  DITTO_CHECK(grad_output.defined() && grad_output.shape() == saved_.shape(), Fn::kName,
              ".backward: grad_output: expected ", shape_str(saved_.shape()),
              " f32 (the input's shape), got ", describe(grad_output));
  backward_done();
  if (!input_requires_grad_) return Tensor();
  return Fn::backward(saved_, grad_output);
}

template <class Fn>
std::unique_ptr<Module> Elementwise<Fn>::clone() const {
  auto m = std::make_unique<Elementwise<Fn>>();
  copy_settings(*this, *m);
  return m;
}

template class Elementwise<ReluFn>;
template class Elementwise<GeluFn>;

}  // namespace ditto::nn
