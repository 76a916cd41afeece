// optim::Optimizer: the interface every optimizer implements (torch.optim.Optimizer): a fixed list
// of parameters, step() and zero_grad().
#pragma once

#include <vector>

#include "core/nn/module.h"

namespace ditto::optim {

class Optimizer {
 public:
  /// Throws InvalidArgument for an empty list, a null or repeated parameter, or a parameter
  /// whose data is undefined or not f32 (naming the parameter). `call` names the optimizer.
  Optimizer(std::vector<nn::Parameter*> params, const char* call);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter whose grad is defined (others are skipped, as in PyTorch).
  /// Asynchronous: enqueued on each parameter's device's current stream.
  virtual void step() = 0;

  /// Zero every defined grad in place (keeping its storage, so views of it stay valid), or with
  /// set_to_none reset it to undefined (PyTorch's default since 2.0).
  void zero_grad(bool set_to_none = false);

  const std::vector<nn::Parameter*>& parameters() const { return params_; }

 protected:
  std::vector<nn::Parameter*> params_;
};

}  // namespace ditto::optim
