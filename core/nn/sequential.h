// nn::Sequential: a chain of modules applied in order (torch.nn.Sequential), and nn::mlp, the
// Linear-ReLU-...-Linear network the trainer and examples use.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/module.h"

namespace ditto::nn {

class Sequential : public Module {
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
  std::size_t size() const { return children_.size(); }
  Module& operator[](std::size_t i) const;

  /// Applies the children in order. Throws InvalidArgument when empty.
  using Module::forward;
  Tensor forward(const Tensor& input) override;
  /// Backward through the children in reverse order; after each child's backward, its parameters
  /// go to the grad-ready hook (set_grad_ready_hook), if one is set.
  Tensor backward(const Tensor& grad_output) override;

  /// The children's parameters, in order.
  std::vector<Parameter*> parameters() override;
  /// Deep clone: each child cloned (sharing parameter data), same settings.
  std::unique_ptr<Module> clone() const override;

  /// Passed to the first child.
  void set_input_requires_grad(bool v) override;
  /// Passed to every child.
  void set_determinism(Determinism d) override;
  void set_micro_shards(std::vector<std::int64_t> bounds) override;
  void set_training(bool v) override;
  void set_step(std::int64_t step) override;
  void set_first_row(std::int64_t row) override;

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

/// Multi-layer perceptron: Linear(sizes[0], sizes[1]), ReLU, Linear(sizes[1], sizes[2]), ReLU,
/// ..., Linear(sizes[n-2], sizes[n-1]) on `device`; the k-th Linear (k = 0, 1, ...) draws its
/// initial values with layer_id k (Note [Random streams] in core/numerics/random.h). Parameters are named
/// "0.weight", "0.bias", "2.weight", ... The first layer does not compute an input gradient
/// (input_requires_grad false). Throws InvalidArgument unless sizes has >= 2 entries, all >= 1.
std::unique_ptr<Sequential> mlp(const std::vector<std::int64_t>& sizes, const Device& device,
                                std::uint64_t seed);

}  // namespace ditto::nn
