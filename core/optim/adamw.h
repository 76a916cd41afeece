// optim::AdamW: torch.optim.AdamW (Loshchilov & Hutter's decoupled weight decay; maximize =
// false), with nanoGPT's parameter groups (GPT.configure_optimizers: weight decay on the tensors
// of 2 or more dims, none on biases and LayerNorm weights) and a learning rate that the schedule
// changes between steps (set_lr).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "core/optim/adam.h"
#include "core/optim/optimizer.h"

namespace ditto::optim {

/// torch.optim.AdamW's defaults that differ from Adam's.
struct AdamWDefaults {
  static constexpr double kWeightDecay = 1e-2;
};
/// torch.optim.AdamW's hyper-parameters (AdamFamilyOptions in core/optim/adam.h; weight_decay
/// 1e-2 by default).
using AdamWOptions = AdamFamilyOptions<AdamWDefaults>;

/// One of torch's param_groups: parameters sharing a weight decay.
struct AdamWGroup {
  std::vector<nn::Parameter*> params;
  double weight_decay = 0.0;
};

/// nanoGPT's configure_optimizers groups: {params of dim >= 2, weight_decay} then {the others,
/// 0.0}, each in the order of `params` (a group may be empty).
std::vector<AdamWGroup> nanogpt_param_groups(const std::vector<nn::Parameter*>& params,
                                             double weight_decay);

class AdamW : public OptimizerWith<AdamWOptions> {
 public:
  /// Per parameter p of a group with decay wd, with gradient g, at its step t = 1, 2, ...
  /// (torch.optim.AdamW, _single_tensor_adamw):
  ///   p *= float(1 - lr * wd)                 (1 - lr * wd in double; skipped when wd == 0)
  ///   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
  ///   amsgrad: v_max = max(v_max, v), used below in place of v
  ///   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
  /// i.e. the decay then torch.optim.Adam's update without weight decay, in Adam's operation order
  /// (Note [Adam step] in core/numerics/canonical_math.h; ops::scale_ then ops::adam_step_).
  /// Parameters without a grad are skipped (no decay, no state). parameters() lists the groups'
  /// parameters in group order (torch's state_dict indices). Throws InvalidArgument with
  /// torch's messages for lr < 0, eps < 0, a beta outside [0, 1), a group's weight_decay < 0 (or
  /// any NaN), and what Optimizer's constructor throws (no parameters at all, one repeated).
  AdamW(std::vector<AdamWGroup> groups, AdamWOptions options = {});
  /// nanoGPT's groups of `params` (nanogpt_param_groups with options.weight_decay). Unlike
  /// torch.optim.AdamW(list), which decays every parameter, biases and LayerNorm weights get no
  /// decay; for torch's behaviour pass one group: AdamW({{params, wd}}, options).
  AdamW(const std::vector<nn::Parameter*>& params, AdamWOptions options = {});
  /// The same for a braced list AdamW({&w, &b}, ...) (which the vector of groups would also
  /// take, by its iterator-pair constructor).
  AdamW(std::initializer_list<nn::Parameter*> params, AdamWOptions options = {})
      : AdamW(std::vector<nn::Parameter*>(params), options) {}

  void step() override;
  /// Adam's (the same parameters, in this order).
  bool can_step_fused(const FusedStepArgs& args) const override {
    return adam_.can_step_fused(args);
  }
  /// step() with Optimizer::step_fused's typed grads, gradient scale and outputs: the decay
  /// folded into the one ops::adam_step_multi_ per device, as step() does on multi-tensor
  /// backends.
  void step_fused(const FusedStepArgs& args) override;
  /// The learning rate of the next step (every group; nanoGPT sets param_group['lr'] to the
  /// schedule's value before each step). Throws InvalidArgument for lr < 0 or NaN.
  void set_lr(double lr) override;

  /// Type "AdamW"; tensors as Adam's ("state.<i>.step" 0-dim i64, "state.<i>.exp_avg",
  /// "state.<i>.exp_avg_sq", with amsgrad "state.<i>.max_exp_avg_sq"; i indexes parameters());
  /// options lr, beta1, beta2, eps, amsgrad, num_params, num_groups and per group g
  /// "param_groups.<g>.weight_decay" and "param_groups.<g>.num_params".
  OptimizerState state_dict() const override;
  /// As Optimizer::load_state_dict, except that lr is not compared: the saved lr is taken (as
  /// torch's load_state_dict takes the saved param_groups' lr; a schedule sets it again before
  /// the next step). betas, eps, amsgrad and the groups (sizes and weight decays) must match.
  void load_state_dict(const OptimizerState& state) override;
  /// Adam's moments (Adam::state_bytes).
  std::size_t state_bytes() const override { return adam_.state_bytes(); }

  /// Weight decay of parameter i (its group's).
  double weight_decay(std::size_t i) const { return decay_.at(i); }
  std::int64_t step_count(std::size_t i) const { return adam_.step_count(i); }
  const Tensor& exp_avg(std::size_t i) const { return adam_.exp_avg(i); }
  const Tensor& exp_avg_sq(std::size_t i) const { return adam_.exp_avg_sq(i); }
  const Tensor& max_exp_avg_sq(std::size_t i) const { return adam_.max_exp_avg_sq(i); }

 private:
  AdamW(std::vector<AdamWGroup> groups, AdamWOptions options, std::vector<nn::Parameter*> all);
  std::map<std::string, std::string> option_strings() const;

  std::vector<double> group_decay_;      // [g]
  std::vector<std::size_t> group_size_;  // [g]
  std::vector<double> decay_;            // [i]: parameter i's group's weight decay
  Adam adam_;                            // the update without decay, and the state
};

}  // namespace ditto::optim
