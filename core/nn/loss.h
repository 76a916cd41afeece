// Losses with PyTorch's default reduction ('mean'), explicit forward and backward.
//
// forward(input, target) returns a 0-dim f32 tensor on input's device; backward(grad_loss) takes a
// 0-dim f32 tensor (d final / d loss, default 1) and returns d final / d input.
#pragma once

#include <cstdint>

#include "core/determinism.h"
#include "core/tensor.h"

namespace ditto::nn {

class Loss {
 public:
  virtual ~Loss() = default;
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  /// Gradient for the last forward given d(final)/d(loss), a 0-dim f32 tensor on the same device.
  virtual Tensor backward(const Tensor& grad_loss) = 0;
  /// Same with d(final)/d(loss) = 1: calls backward(Tensor()), and every loss's
  /// backward(grad_loss) reads an undefined grad_loss as 1 on the input's device.
  Tensor backward();
  virtual std::unique_ptr<Loss> clone() const = 0;
  void set_determinism(Determinism d) { determinism_ = d; }
  Determinism determinism() const { return determinism_; }

 protected:
  Determinism determinism_ = Determinism::fast;
};

/// torch.nn.MSELoss(reduction='mean'): mean over all elements of (input - target)^2.
/// input and target: same shape, f32. Errors: InvalidArgument on shape/dtype/device mismatch.
class MSELoss : public Loss {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor backward(const Tensor& grad_loss) override;
  using Loss::backward;
  std::unique_ptr<Loss> clone() const override { return std::make_unique<MSELoss>(); }

 private:
  Tensor input_, target_;
};

/// torch.nn.CrossEntropyLoss(reduction='mean'): logits [N, C] f32, targets [N] i64 class indices
/// in [0, C). Errors: InvalidArgument for shapes, dtypes, devices, or a target out of range
/// (naming the sample index and the value).
class CrossEntropyLoss : public Loss {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor backward(const Tensor& grad_loss) override;
  using Loss::backward;
  std::unique_ptr<Loss> clone() const override { return std::make_unique<CrossEntropyLoss>(); }

 private:
  Tensor input_, target_;
};

}  // namespace ditto::nn
