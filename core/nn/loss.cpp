// MSELoss and CrossEntropyLoss (reduction 'mean'): per-sample losses from ops::mse /
// ops::cross_entropy, then one ops::sum with scale 1/numel (MSE) or 1/N (cross-entropy) in the
// loss's determinism mode.
#include "core/nn/loss.h"

#include <limits>
#include <typeinfo>
#include <utility>

#include "core/nn/module.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"

namespace ditto::nn {

namespace {

std::string describe(const Tensor& t) {
  return t.defined() ? t.str() : std::string("an undefined tensor");
}

// d(final)/d(loss): the caller's 0-dim tensor, or 1 on `device` when undefined (Loss::backward()).
Tensor grad_or_one(const Tensor& grad_loss, const Device& device, const char* call) {
  if (!grad_loss.defined()) return Tensor::full({}, 1.0f, device);
  DITTO_CHECK(grad_loss.numel() == 1 && grad_loss.dim() <= 1 && grad_loss.dtype() == DType::f32 &&
                  grad_loss.device() == device,
              call, ": grad_loss: expected a 0-dim f32 tensor on ", device.str(), ", got ",
              grad_loss.str());
  return grad_loss.dim() == 0 ? grad_loss : grad_loss.view({});
}

// scale * sum of per-sample losses; in bitwise mode over the canonical micro-shard tree of the
// batch (Note [Micro-shards]), so a loss computed per rank (DDP) composes like the gradients.
// `rows_per_sample` > 1: per_sample holds that many consecutive rows per sample (tokens of a
// [B, T] batch), and the shards cut between samples.
Tensor mean_of(const Tensor& per_sample, float scale, Determinism mode,
               std::int64_t rows_per_sample) {
  if (mode != Determinism::bitwise) return ops::sum(per_sample, scale, mode);
  std::vector<std::int64_t> bounds =
      micro_shard_bounds(per_sample.size(0) / rows_per_sample, kDefaultMicroShards);
  for (std::int64_t& b : bounds) b *= rows_per_sample;
  return ops::sum_sharded(per_sample, bounds, scale);
}

}  // namespace

void Loss::set_global_batch(std::int64_t rows) {
  DITTO_CHECK(rows >= 0, "Loss::set_global_batch: rows: expected >= 0 (0: the input's rows), got ",
              rows);
  global_batch_ = rows;
}

std::int64_t Loss::mean_rows(std::int64_t input_rows, const char* call) const {
  if (global_batch_ == 0) return input_rows;
  DITTO_CHECK(input_rows <= global_batch_, call, ": input: expected at most ", global_batch_,
              " samples (the global batch set by set_global_batch), got ", input_rows);
  return global_batch_;
}

// Note [Empty replica loss]
// Bitwise DataParallel runs a replica on every device, also on one whose share of a small batch
// is empty (Note [Micro-shards]); a replica of an nn::WithLoss then takes the mean of no rows.
// torch's mean over an empty input is 0/0 = NaN. DataParallel leaves such a replica's output out
// of the gathered one, so both modes gather min(B, devices) losses and its NaN reaches no one.
// With set_global_batch(B) (kept by clone(); DDP's ranks, micro-steps) a replica's share of no
// rows is 0 (0 / B): it adds nothing, and the shares sum to the mean over the B rows. Without a
// global batch the mean over no samples is NaN, as torch's (issue 29: it was 0, so a batch of no
// rows "trained" with loss 0); mean_scale() is 0 either way, the input's gradient empty.
Tensor Loss::save_and_mean(const Tensor& per_sample, const Tensor& input, const Tensor& target,
                           std::int64_t denominator, std::int64_t rows_per_sample) {
  denominator_ = denominator;
  input_ = input;
  target_ = target;
  has_forward_ = true;
  Tensor mean = mean_of(per_sample, mean_scale(), determinism_, rows_per_sample);
  if (denominator == 0)  // PyTorch: the mean of no elements is 0/0 = NaN (issue 29)
    return Tensor::full({}, std::numeric_limits<float>::quiet_NaN(), mean.device());
  return mean;
}

Tensor Loss::grad_loss_for(const Tensor& grad_loss, const char* call) {
  DITTO_CHECK(has_forward_, call,
              ": no forward to go back through (call forward first; each forward allows one "
              "backward)");
  Tensor g = grad_or_one(grad_loss, input_.device(), call);
  has_forward_ = false;
  return g;
}

// An undefined grad_loss means 1 in every loss's backward(grad_loss).
Tensor Loss::backward() { return backward(Tensor()); }

Tensor Loss::row_terms(const Tensor&, const Tensor&, RowTerms&) const { return Tensor(); }

Tensor Loss::mean_of_row_terms(const Tensor& terms, const RowTerms& how) const {
  constexpr const char* call = "Loss::mean_of_row_terms";
  DITTO_CHECK(terms.defined() && terms.dim() == 1 && is_float_storage(terms.dtype()), call,
              ": terms: expected [rows] f32 (or bf16 / f16: row_terms'), got ", describe(terms));
  DITTO_CHECK(how.rows_per_sample >= 1 && how.elements_per_row >= 1 &&
                  terms.size(0) % how.rows_per_sample == 0,
              call, ": how: expected rows_per_sample >= 1 dividing the ", terms.size(0),
              " rows and elements_per_row >= 1, got ", how.rows_per_sample, " and ",
              how.elements_per_row);
  // forward's: save_and_mean over the batch's rows, denominator rows x elements a row.
  const std::int64_t denominator = terms.size(0) * how.elements_per_row;
  if (denominator == 0)
    return Tensor::full({}, std::numeric_limits<float>::quiet_NaN(), terms.device());
  return mean_of(terms, 1.0f / static_cast<float>(denominator), determinism_, how.rows_per_sample);
}

namespace {

/// MSELoss's checks of input and target, and the [N, F] (or [N]) views ops::mse takes: 0-dim as
/// [1], higher ranks as [N, -1].
std::pair<Tensor, Tensor> mse_args(const Tensor& input, const Tensor& target, const char* call) {
  DITTO_CHECK(input.defined() && is_float_storage(input.dtype()), call,
              ": input: expected an f32 (or bf16 / f16) tensor, got ", describe(input));
  DITTO_CHECK(target.defined() && target.shape() == input.shape() &&
                  is_float_storage(target.dtype()) && target.device() == input.device(),
              call, ": target: expected ", shape_str(input.shape()), " f32 (or bf16 / f16) on ",
              input.device().str(), " (the input's shape and device), got ", describe(target));
  if (input.dim() == 0) return {input.view({1}), target.view({1})};
  if (input.dim() > 2) return {input.view({input.size(0), -1}), target.view({input.size(0), -1})};
  return {input, target};
}

}  // namespace

Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  const auto [x, t] = mse_args(input, target, "MSELoss.forward");
  Tensor per_sample = ops::mse(x, t);
  // Elements the mean divides by: all of them, or global_batch() samples of this size.
  const std::int64_t per_row = x.dim() == 1 ? 1 : x.size(1);
  return save_and_mean(per_sample, x, t, mean_rows(x.size(0), "MSELoss.forward") * per_row);
}

bool MSELoss::has_row_terms() const { return typeid(*this) == typeid(MSELoss); }

Tensor MSELoss::row_terms(const Tensor& input, const Tensor& target, RowTerms& how) const {
  const auto [x, t] = mse_args(input, target, "MSELoss.row_terms");
  how = RowTerms{1, x.dim() == 1 ? 1 : x.size(1)};
  return ops::mse(x, t);
}

Tensor MSELoss::backward(const Tensor& grad_loss) {
  return ops::mse_backward(input_, target_, grad_loss_for(grad_loss, "MSELoss.backward"),
                           mean_scale());
}

namespace {

/// CrossEntropyLoss.forward's checks of logits [N, C] or [B, T, C] and targets [N] or [B, T].
void check_cross_entropy_loss_args(const Tensor& input, const Tensor& target,
                                   const char* call = "CrossEntropyLoss.forward") {
  DITTO_CHECK(
      input.defined() && (input.dim() == 2 || input.dim() == 3) && is_float_storage(input.dtype()),
      call, ": input: expected logits [N, C] f32 (or bf16 / f16), got ", describe(input),
      " (or [B, T, C] logits with [B, T] targets)");
  Shape want(input.shape().begin(), input.shape().end() - 1);
  DITTO_CHECK(target.defined() && target.shape() == want && target.dtype() == DType::i64 &&
                  target.device() == input.device(),
              call, ": target: expected ", shape_str(want), " i64 on ", input.device().str(),
              " (class indices, one per row of input), got ", describe(target));
  DITTO_CHECK(input.size(-1) >= 1, call,
              ": input: expected at least 1 class, "
              "got ",
              input.str());
}

/// Checked logits and targets as rows: [B, T, C] / [B, T] flattened to [B * T, C] / [B * T]
/// (nanoGPT's F.cross_entropy(logits.view(-1, C), targets.view(-1))); [N, C] / [N] as they are.
std::pair<Tensor, Tensor> cross_entropy_rows(const Tensor& input, const Tensor& target) {
  return {input.dim() == 3 ? input.view({-1, input.size(2)}) : input,
          target.dim() == 2 ? target.view({-1}) : target};
}

/// ops::cross_entropy of rows x, t (cross_entropy_rows), its errors under `call`'s name.
Tensor cross_entropy_terms(const Tensor& x, const Tensor& t, const char* call) {
  try {
    return ops::cross_entropy(x, t);  // checks targets in [0, C) on the host
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(call) + ": " + e.what());
  }
}

}  // namespace

bool CrossEntropyLoss::has_row_terms() const { return typeid(*this) == typeid(CrossEntropyLoss); }

Tensor CrossEntropyLoss::row_terms(const Tensor& input, const Tensor& target, RowTerms& how) const {
  constexpr const char* call = "CrossEntropyLoss.row_terms";
  check_cross_entropy_loss_args(input, target, call);
  const auto [x, t] = cross_entropy_rows(input, target);
  how = RowTerms{input.dim() == 3 ? input.size(1) : 1, 1};
  return cross_entropy_terms(x, t, call);
}

Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  check_cross_entropy_loss_args(input, target);
  fused_grad_ = Tensor();
  // [B, T, C] logits: the mean over all B * T tokens (nanoGPT's F.cross_entropy of the
  // flattened logits); the samples are the B sequences.
  input_shape_ = input.shape();
  const std::int64_t tokens = input.dim() == 3 ? input.size(1) : 1;
  const auto [x, t] = cross_entropy_rows(input, target);
  const Tensor per_sample = cross_entropy_terms(x, t, "CrossEntropyLoss.forward");
  return save_and_mean(per_sample, x, t,
                       mean_rows(input.size(0), "CrossEntropyLoss.forward") * tokens, tokens);
}

bool CrossEntropyLoss::fuses(const Tensor& input, const Tensor& target) const {
  if (!input.defined() || !target.defined() || (input.dim() != 2 && input.dim() != 3)) return false;
  const auto [x, t] = cross_entropy_rows(input, target);  // (t: the device, as target's)
  return ops::cross_entropy_fused_available(x, t, determinism_);
}

Tensor CrossEntropyLoss::forward_backward(const Tensor& input, const Tensor& target,
                                          const Tensor& grad_loss) {
  if (!fuses(input, target)) return forward(input, target);
  check_cross_entropy_loss_args(input, target);
  constexpr const char* call = "CrossEntropyLoss.forward_backward";
  input_shape_ = input.shape();
  const std::int64_t tokens = input.dim() == 3 ? input.size(1) : 1;
  const auto [x, t] = cross_entropy_rows(input, target);
  const std::int64_t denominator = mean_rows(input.size(0), call) * tokens;
  const float scale = denominator > 0 ? 1.0f / static_cast<float>(denominator) : 0.0f;
  const Tensor g = grad_or_one(grad_loss, x.device(), call);
  Tensor per_sample;
  try {
    per_sample = ops::cross_entropy_fused(x, t, g, scale);  // targets checked before any write
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(call) + ": " + e.what());
  }
  fused_grad_ = x;  // now the gradient (mean_scale() below is this scale)
  return save_and_mean(per_sample, x, t, denominator, tokens);
}

Tensor CrossEntropyLoss::backward(const Tensor& grad_loss) {
  if (fused_grad_.defined()) {  // forward_backward's, over the logits
    Tensor g = std::move(fused_grad_);
    fused_grad_ = Tensor();
    has_forward_ = false;
    return g.shape() == input_shape_ ? g : g.view(input_shape_);
  }
  Tensor g = ops::cross_entropy_backward(
      input_, target_, grad_loss_for(grad_loss, "CrossEntropyLoss.backward"), mean_scale());
  return g.shape() == input_shape_ ? g : g.view(input_shape_);
}

}  // namespace ditto::nn
