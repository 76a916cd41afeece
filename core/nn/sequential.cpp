// nn::Sequential (children run in order, backward in reverse) and nn::mlp.
#include "core/nn/sequential.h"

#include "core/nn/linear.h"
#include "core/nn/relu.h"

namespace ditto::nn {

Sequential::Sequential(std::vector<std::unique_ptr<Module>> children) {
  for (auto& c : children) add(std::move(c));
}

Sequential& Sequential::add(std::unique_ptr<Module> child) {
  DITTO_CHECK(child != nullptr, "Sequential::add: child: expected a module, got null");
  DITTO_CHECK(child->num_inputs() == 1, "Sequential::add: child ", size(), " (", child->name(),
              "): expected a module taking 1 input, got one taking ", child->num_inputs());
  copy_settings(*this, *child);
  if (size() > 0) child->set_input_requires_grad(true);
  add_child(std::to_string(size()), std::move(child));
  return *this;
}

Module& Sequential::operator[](std::size_t i) const {
  DITTO_CHECK(i < size(), "Sequential[]: index ", i, " out of range for ", size(), " children");
  return child<Module>(i);
}

Tensor Sequential::forward(const Tensor& input) {
  DITTO_CHECK(size() > 0, "Sequential.forward: the container is empty");
  return forward_chain(input);
}

Tensor Sequential::backward(const Tensor& grad_output) {
  DITTO_CHECK(size() > 0, "Sequential.backward: the container is empty");
  return backward_chain(grad_output);
}

std::unique_ptr<Container> Sequential::empty_clone() const {
  return std::make_unique<Sequential>();
}

void Sequential::set_input_requires_grad(bool v) {
  input_requires_grad_ = v;
  if (size() > 0) child<Module>(0).set_input_requires_grad(v);
}

std::unique_ptr<Sequential> mlp(const std::vector<std::int64_t>& sizes, const Device& device,
                                std::uint64_t seed) {
  DITTO_CHECK(sizes.size() >= 2, "nn::mlp: sizes: expected at least 2 sizes (in, out), got ",
              sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    DITTO_CHECK(sizes[i] >= 1, "nn::mlp: sizes[", i, "]: expected >= 1, got ", sizes[i]);
  auto net = std::make_unique<Sequential>();
  net->set_input_requires_grad(false);
  for (std::size_t k = 0; k + 1 < sizes.size(); ++k) {
    if (k > 0) net->add(std::make_unique<ReLU>());
    net->add(std::make_unique<Linear>(sizes[k], sizes[k + 1], device, seed, k));
  }
  return net;
}

}  // namespace ditto::nn
