// nn::Sequential: a chain of modules applied in order (torch.nn.Sequential), and nn::mlp, the
// Linear-ReLU-...-Linear network the trainer and examples use.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/container.h"

namespace ditto::nn {

class Sequential : public Container {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::unique_ptr<Module>> children);

  std::string name() const override { return "Sequential"; }

  /// Append a child (takes ownership). Its parameters are renamed "<index>.<name>" like
  /// PyTorch's state_dict keys ("0.weight", "2.bias"; nested: "1.0.weight"), so add children to
  /// an inner Sequential before adding it to an outer one. The child gets this container's
  /// determinism, micro-shards, training, step and first row, and input_requires_grad() if it
  /// is the first child (true otherwise).
  /// Throws InvalidArgument for a null child or one taking more than one input.
  Sequential& add(std::unique_ptr<Module> child);
  std::size_t size() const { return num_children(); }
  Module& operator[](std::size_t i) const;

  /// Applies the children in order. Throws InvalidArgument when empty.
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// Backward through the children in reverse order; after each child's backward, its parameters
  /// go to the grad-ready hook (set_grad_ready_hook), if one is set.
  Tensor backward(const Tensor& grad_output) override;

  /// Passed to the first child (the other settings of Module: to every child, Container).
  void set_input_requires_grad(bool v) override;

 private:
  std::unique_ptr<Container> empty_clone() const override;
};

/// Multi-layer perceptron: Linear(sizes[0], sizes[1]), ReLU, Linear(sizes[1], sizes[2]), ReLU,
/// ..., Linear(sizes[n-2], sizes[n-1]) on `device`; the k-th Linear (k = 0, 1, ...) draws its
/// initial values with layer_id k (Note [Random streams] in core/numerics/random.h). Parameters are
/// named "0.weight", "0.bias", "2.weight", ... The first layer does not compute an input gradient
/// (input_requires_grad false). Throws InvalidArgument unless sizes has >= 2 entries, all >= 1.
std::unique_ptr<Sequential> mlp(const std::vector<std::int64_t>& sizes, const Device& device,
                                std::uint64_t seed);

}  // namespace ditto::nn
