// Losses with PyTorch's default reduction ('mean'), explicit forward and backward.
//
// forward(input, target) returns a 0-dim f32 tensor on input's device; backward(grad_loss) takes a
// 0-dim f32 tensor (d final / d loss, default 1) and returns d final / d input.
#pragma once

#include <cstdint>
#include <memory>

#include "core/numerics/determinism.h"
#include "core/runtime/tensor.h"

namespace ditto::nn {

/// How a loss's row terms (Loss::row_terms) make its mean: consecutive rows a sample (the T tokens
/// of a [B, T, C] input, else 1) and elements a row the mean divides by (MSELoss: a sample's
/// elements, else 1).
struct RowTerms {
  std::int64_t rows_per_sample = 1;
  std::int64_t elements_per_row = 1;
};

class Loss {
 public:
  virtual ~Loss() = default;
  virtual Tensor forward(const Tensor& input, const Tensor& target) = 0;
  /// Gradient for the last forward given d(final)/d(loss), a 0-dim f32 tensor on the same device.
  virtual Tensor backward(const Tensor& grad_loss) = 0;
  /// Same with d(final)/d(loss) = 1: calls backward(Tensor()), and every loss's
  /// backward(grad_loss) reads an undefined grad_loss as 1 on the input's device.
  Tensor backward();
  /// A fresh loss of the same kind with the same settings (determinism() and global_batch()),
  /// as DataParallel's replicas of an nn::WithLoss need; no saved forward.
  virtual std::unique_ptr<Loss> clone() const = 0;
  void set_determinism(Determinism d) { determinism_ = d; }
  Determinism determinism() const { return determinism_; }

  /// Take the 'mean' over a global batch of `rows` samples of which each forward sees a part
  /// (one rank's rows under DistributedDataParallel, Note [DDP loss scaling] in
  /// core/parallel/distributed_data_parallel.h): forward and backward divide by `rows` (times
  /// the elements per sample for MSELoss) instead of by the input's rows, so the ranks' losses
  /// and gradients add up to those of the global batch. 0 (the default): the input's own rows.
  /// Throws InvalidArgument for rows < 0; forward throws InvalidArgument when the input has more
  /// samples than `rows`. A forward over no samples gives torch's NaN with `rows` 0 and 0 (a
  /// share of no rows) otherwise (Note [Empty replica loss], loss.cpp).
  void set_global_batch(std::int64_t rows);
  std::int64_t global_batch() const { return global_batch_; }

  /// Evaluation in pieces (Note [Evaluation in pieces], core/train/replica.cpp): the terms whose
  /// mean forward(input, target) returns, one a row, [rows] f32 on input's device
  /// (CrossEntropyLoss: a token's loss, rows N or B * T; MSELoss: a sample's summed squared
  /// error), with `how` set. A row's term does not depend on the other rows, so the terms of a
  /// batch computed in pieces and put end to end are the whole batch's. Undefined where the loss
  /// has no such form (the default: a user's Loss), whose callers then evaluate whole. Saves
  /// nothing for a backward. Errors: forward's checks of input and target.
  virtual Tensor row_terms(const Tensor& input, const Tensor& target, RowTerms& how) const;
  /// Whether row_terms gives the terms, known before any input: MSELoss and CrossEntropyLoss
  /// themselves; false for a subclass of theirs (its forward may compute another loss, as a
  /// label-smoothed one would) unless it overrides both functions, and for other losses.
  virtual bool has_row_terms() const { return false; }
  /// The mean forward(...) returns over the whole batch whose row_terms these are, in
  /// determinism() mode: the same bits (bitwise mode: the canonical micro-shard tree over its
  /// samples). Divides by the terms' own rows (global_batch() plays no part); NaN for none, as
  /// forward. terms: [rows] in row_terms' dtype (f32, or bf16 / f16), rows a multiple of
  /// how.rows_per_sample, else InvalidArgument. Returns a 0-dim f32 tensor.
  Tensor mean_of_row_terms(const Tensor& terms, const RowTerms& how) const;

 protected:
  /// Samples the mean divides by for an input of `input_rows` samples (global_batch() or
  /// input_rows); `call` names the forward for the error.
  std::int64_t mean_rows(std::int64_t input_rows, const char* call) const;
  /// The end of a forward: keeps `input` and `target` for backward and returns the mean of the
  /// per-sample losses, their sum divided by `denominator`, in determinism() mode.
  /// per_sample may hold `rows_per_sample` consecutive rows per sample (the tokens of a [B, T]
  /// batch): in bitwise mode the micro-shards then cut between samples.
  Tensor save_and_mean(const Tensor& per_sample, const Tensor& input, const Tensor& target,
                       std::int64_t denominator, std::int64_t rows_per_sample = 1);
  /// The start of a backward: d(final)/d(loss), grad_loss or 1 when undefined, on the device of
  /// the last forward's input. Throws InvalidArgument before any forward or for a grad_loss
  /// that is not one f32 element there, and for a second backward of one forward (Note [One
  /// backward per forward], core/nn/module.h); `call` names the backward.
  Tensor grad_loss_for(const Tensor& grad_loss, const char* call);
  /// 1 / the denominator of the last forward's mean: the scale of the input's gradient; 0 for
  /// an empty input without a global batch (Note [Empty replica loss]).
  float mean_scale() const {
    return denominator_ > 0 ? 1.0f / static_cast<float>(denominator_) : 0.0f;
  }

  Determinism determinism_ = Determinism::fast;
  std::int64_t global_batch_ = 0;
  Tensor input_, target_;         // the last forward's, as the ops saw them
  std::int64_t denominator_ = 1;  // what the last forward's mean divided by
  bool has_forward_ = false;      // a forward not yet gone back through
};

/// A loss L (MSELoss, CrossEntropyLoss) whose clone() is a new L with this one's settings.
template <class L>
class LossOf : public Loss {
 public:
  std::unique_ptr<Loss> clone() const override {
    auto copy = std::make_unique<L>();
    copy->set_determinism(determinism_);
    copy->set_global_batch(global_batch_);
    return copy;
  }
};

/// torch.nn.MSELoss(reduction='mean'): mean over all elements of (input - target)^2.
/// input and target: same shape, f32. Errors: InvalidArgument on shape/dtype/device mismatch.
class MSELoss : public LossOf<MSELoss> {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor row_terms(const Tensor& input, const Tensor& target, RowTerms& how) const override;
  bool has_row_terms() const override;
  Tensor backward(const Tensor& grad_loss) override;
  using Loss::backward;
};

/// torch.nn.CrossEntropyLoss(reduction='mean'): logits [N, C] f32, targets [N] i64 class indices
/// in [0, C); or logits [B, T, C] with targets [B, T] (a language model's, as nanoGPT's
/// F.cross_entropy(logits.view(-1, C), targets.view(-1))): the mean over the B * T tokens;
/// set_global_batch counts samples (sequences), the denominator is then samples * T; backward
/// returns the logits' shape. Errors: InvalidArgument for shapes, dtypes, devices, or a target
/// out of range (naming the row index and the value).
class CrossEntropyLoss : public LossOf<CrossEntropyLoss> {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) override;
  Tensor row_terms(const Tensor& input, const Tensor& target, RowTerms& how) const override;
  bool has_row_terms() const override;
  Tensor backward(const Tensor& grad_loss) override;
  using Loss::backward;

  /// Whether forward_backward(input, target, ...) is one pass: determinism() fast and
  /// ops::cross_entropy_fused_available for the flattened logits (CUDA; a dry run: its price).
  bool fuses(const Tensor& input, const Tensor& target) const;
  /// forward(input, target), and where fuses(input, target) the gradient backward(grad_loss)
  /// would return computed in the same pass (ops::cross_entropy_fused, llm.c's
  /// fused_classifier): the gradient is written over input (the logits are gone afterwards; the
  /// caller must not need them) and the next backward(...) returns it without reading its
  /// argument. grad_loss: as backward's (undefined: 1), known at forward time (the training
  /// step's GradScaler scale). Elsewhere this is forward(input, target) alone and backward runs
  /// as usual. Returns the mean loss, 0-dim f32. Errors: forward's, and backward's for grad_loss.
  Tensor forward_backward(const Tensor& input, const Tensor& target, const Tensor& grad_loss);

 private:
  Shape input_shape_;  // the last forward's logits shape
  Tensor fused_grad_;  // forward_backward's gradient (over the logits) until backward takes it
};

}  // namespace ditto::nn
