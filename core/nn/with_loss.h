// nn::WithLoss: a model followed by its loss, as one Module taking {input, target} and returning
// the 0-dim loss, for DataParallel's "each replica returns a 0-dim loss" case.
#pragma once

#include <memory>

#include "core/nn/container.h"
#include "core/nn/loss.h"

namespace ditto::nn {

class WithLoss : public Container {
 public:
  /// Takes ownership of both. Throws InvalidArgument when either is null or the model takes
  /// other than 1 input.
  WithLoss(std::unique_ptr<Module> model, std::unique_ptr<Loss> loss);

  std::string name() const override { return "WithLoss"; }
  int num_inputs() const override { return 2; }

  /// inputs = {x, target}: returns loss(model(x), target), 0-dim f32 on the model's device.
  /// Throws InvalidArgument for a wrong number of inputs (and what model and loss throw).
  using Module::forward;
  Tensor forward(const std::vector<Tensor>& inputs) override;
  /// grad_output: 0-dim f32 d(final)/d(loss) (an undefined tensor means 1). Backprops through
  /// the loss then the model; returns the model's input gradient (undefined when
  /// !input_requires_grad()).
  Tensor backward(const Tensor& grad_output) override;

  /// Clones model and loss; same settings.
  std::unique_ptr<Module> clone() const override;

  /// Passed to the model (Container passes the other settings of Module to it, its one child).
  void set_input_requires_grad(bool v) override;
  /// Passed to the model and the loss.
  void set_determinism(Determinism d) override;
  /// Passed to the model.
  void set_grad_ready_hook(GradReadyHook hook) override;

  Module& model() { return child<Module>(0); }
  Loss& loss() { return *loss_; }

 private:
  std::unique_ptr<Loss> loss_;
};

}  // namespace ditto::nn
