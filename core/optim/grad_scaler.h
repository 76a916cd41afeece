// optim::GradScaler: dynamic loss scaling for f16 training, as torch.amp.GradScaler
// (torch.cuda.amp.GradScaler): the loss gradient is multiplied by a scale so that small f16
// gradients do not flush to zero; before the optimizer step the gradients are unscaled and checked
// for inf / NaN; a step with a non-finite gradient is skipped and the scale backs off; after
// growth_interval clean steps in a row the scale grows.
//
// Note [GradScaler]
// The arithmetic is torch's (aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp and
// torch/amp/grad_scaler.py), so a sequence of found_inf flags gives torch's scales bit for bit
// (tests/test_grad_scaler.cpp checks tools/grad_scaler_reference.py's sequence):
//   scale      f32, init_scale rounded to float
//   inv_scale  float(1.0 / double(scale)) (scale.double().reciprocal().float()) unscale_ found_inf
//   = any grad element is inf or NaN (checked before the multiply);
//              g = g * inv_scale in f32, skipped when inv_scale == 1
//   update     found_inf:  scale = float(double(scale) * backoff_factor), tracker = 0
//              otherwise:  tracker + 1 == growth_interval ? (scale = float(double(scale) *
//                          growth_factor) unless that is inf; tracker = 0) : ++tracker
// The non-finite check is exact: a grad with a finite sum of squares (ops::sum_squares) holds only
// finite elements; when the sum is inf or NaN (a non-finite element, or squares of finite
// elements past f32's range) the grad is checked elementwise as x - x (0 for every finite x, NaN
// for inf and NaN; ops::axpy_) summed (ops::sum): NaN iff some element is not finite. So large
// finite gradients are never taken for an overflow. Every step reads one float per grad on the
// host (blocks). Where every grad is f32 on a backend with multi-tensor kernels (cuda, and the sim
// in a dry run, which prices cuda's launches), the sums are one ops::sum_squares_multi per device,
// read in one copy, and the multiply one ops::scale_multi_ per device (torch's
// _amp_foreach_non_finite_check_and_unscale_): the same bits and the same found_inf, in two
// launches and one read per device rather than about three launches and one read per grad.
//
// Ranks: under DDP every rank holds the same all-reduced gradients, so each rank's found_inf is
// the same and the ranks skip the same steps. Where a rank checks only its part of the gradients
// (ZeRO-1's shard), set_found_inf_reducer gives the all_reduce(max) of the flags over the ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/nn/module.h"
#include "core/numerics/determinism.h"
#include "core/optim/optimizer.h"

namespace ditto::optim {

/// torch.amp.GradScaler's constructor arguments, with its defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;          ///< 2^16
  double growth_factor = 2.0;           ///< > 1
  double backoff_factor = 0.5;          ///< in (0, 1)
  std::int64_t growth_interval = 2000;  ///< clean steps in a row before the scale grows; >= 1
  bool enabled = true;  ///< false: scale 1, unscale_ checks nothing, step always steps
};

class GradScaler {
 public:
  /// Throws InvalidArgument naming the option for init_scale not finite and > 0, growth_factor
  /// not > 1 (torch: "The growth factor must be > 1.0."), backoff_factor not in (0, 1)
  /// ("The backoff factor must be < 1.0."), growth_interval < 1.
  explicit GradScaler(GradScalerOptions options = {});

  bool enabled() const { return options_.enabled; }
  /// The current scale (torch's get_scale()); 1 when disabled.
  float scale() const { return options_.enabled ? scale_ : 1.0f; }
  /// d(scaled loss)/d(loss): a 0-dim f32 tensor holding scale() on `device`, to pass as
  /// Loss::backward(grad_loss) (torch: scaler.scale(loss).backward()).
  Tensor loss_grad(const Device& device) const;

  /// torch's unscale_(optimizer) on the grads of `params` (undefined grads are skipped; any
  /// float dtype, f32 checked and scaled in place, others through f32 and back): records
  /// found_inf for this step and multiplies each grad by the inverse scale. Returns found_inf
  /// (after set_found_inf_reducer's reduction). Blocks. Throws InvalidArgument when called a
  /// second time before update() (torch: "unscale_() has already been called on this optimizer
  /// since the last update()"), or for a null parameter.
  bool unscale_(const std::vector<nn::Parameter*>& params, Determinism mode = Determinism::fast);
  /// torch's scaler.step(optimizer): unscale_(optimizer.parameters()) unless done in this step,
  /// then optimizer.step() unless found_inf. Returns whether the optimizer stepped.
  bool step(Optimizer& optimizer, Determinism mode = Determinism::fast);
  /// torch's update(): backoff when this step found an inf / NaN, growth after growth_interval
  /// clean steps (Note [GradScaler]); ends the step (the next unscale_ may run). A step in which
  /// unscale_ did not run counts as clean (torch requires unscale_ / step first: here update()
  /// without either throws InvalidArgument "update: no unscale_() or step() since the last
  /// update()"). No-op when disabled.
  void update();

  /// Whether this step's unscale_ found a non-finite gradient.
  bool found_inf() const { return found_inf_; }
  /// Consecutive clean steps since the last growth or backoff (torch's _growth_tracker).
  std::int64_t growth_tracker() const { return growth_tracker_; }
  /// Steps skipped for non-finite gradients so far (not in torch; the trainer reports it).
  std::int64_t skipped_steps() const { return skipped_; }
  const GradScalerOptions& options() const { return options_; }

  /// `reduce(local)` returns the found_inf of every rank combined (logical or, e.g. an
  /// all_reduce max of 0 / 1) when each rank checked only its share of the gradients (ZeRO-1's
  /// shard). Unset: the local flag (DDP's all-reduced gradients are the same on every rank).
  void set_found_inf_reducer(std::function<bool(bool local)> reduce) {
    reducer_ = std::move(reduce);
  }

  /// torch's state_dict(): "scale", "growth_factor", "backoff_factor", "growth_interval",
  /// "_growth_tracker" as exact decimal strings, plus "skipped_steps". load_state_dict restores
  /// scale, tracker and skipped steps; the factors and interval must match (InvalidArgument
  /// naming the first difference), as must enabled.
  std::map<std::string, std::string> state_dict() const;
  void load_state_dict(const std::map<std::string, std::string>& state);

 private:
  // unscale_ with one ops::sum_squares_multi and one ops::scale_multi_ per device: every grad f32
  // on a device with multi-tensor kernels (cuda; the sim in a dry run). The same bits and result.
  static bool multi_tensor_unscale(const std::vector<Tensor>& grads);
  bool unscale_multi(std::vector<Tensor>& grads, float inv_scale, Determinism mode);
  GradScalerOptions options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_ = 0;
  bool unscaled_ = false;  // unscale_ ran in this step
  bool found_inf_ = false;
  std::function<bool(bool)> reducer_;
};

/// A GradScaler's state inside an optimizer's state dict (MasterWeights and
/// ZeroRedundancyOptimizer save it so): each state_dict() entry as the option
/// "grad_scaler.<key>" of `options`.
void put_scaler_state(const GradScaler& scaler, std::map<std::string, std::string>& options);
/// The inverse: removes every "grad_scaler.*" option from `options` and returns them without
/// the prefix (empty when the state dict holds no scaler's state).
std::map<std::string, std::string> take_scaler_state(std::map<std::string, std::string>& options);

/// Whether every element of `x` (f32, any device) is finite, exactly (Note [GradScaler]). Blocks.
bool all_finite(const Tensor& x, Determinism mode = Determinism::fast);

}  // namespace ditto::optim
