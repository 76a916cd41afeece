// optim::Adam: torch.optim.Adam (Kingma & Ba, with the optional AMSGrad variant; L2 weight decay
// added to the gradient, not AdamW's decoupled decay; maximize = false), step for step and in
// PyTorch's per-element operation order (Note [Adam step] in core/numerics/canonical_math.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/optim/optimizer.h"

namespace ditto::optim {

/// Hyper-parameters of torch.optim.Adam (AdamOptions) and torch.optim.AdamW (AdamWOptions,
/// core/optim/adamw.h), with torch's defaults, which differ only in weight_decay's:
/// Defaults::kWeightDecay. Doubles, like the Python floats PyTorch holds them in: step_size = lr /
/// bias_correction1 is formed in double before it is rounded to float, exactly as PyTorch does.
/// `Defaults` gives the weight_decay default (a type, not a double template argument: clang before
/// 18 refuses those).
template <typename Defaults>
struct AdamFamilyOptions {
  double lr = 1e-3;
  double beta1 = 0.9;    ///< betas[0]
  double beta2 = 0.999;  ///< betas[1]
  double eps = 1e-8;
  /// Adam: the L2 decay added to the gradient. AdamW: the decoupled decay of nanoGPT's "decay"
  /// group when the parameters come as one list; explicit groups (AdamWGroup) carry their own.
  double weight_decay = Defaults::kWeightDecay;
  bool amsgrad = false;
};

/// torch.optim.Adam's defaults that differ from AdamW's.
struct AdamDefaults {
  static constexpr double kWeightDecay = 0.0;
};
/// torch.optim.Adam's hyper-parameters (weight_decay 0 by default).
using AdamOptions = AdamFamilyOptions<AdamDefaults>;

/// Adam's (and AdamW's) hyper-parameter checks with torch's messages ("<call>: beta1: Invalid
/// beta parameter at index 0: 1.5 (expected 0 <= beta1 < 1)"): InvalidArgument for lr, eps or
/// weight_decay < 0, a beta outside [0, 1), or any NaN.
void check_adam_options(const char* call, double lr, double beta1, double beta2, double eps,
                        double weight_decay);

/// The options of Adam::state_dict() for `o` over num_params parameters (exact decimal strings).
std::map<std::string, std::string> adam_option_strings(const AdamOptions& o,
                                                       std::size_t num_params);

class Adam : public OptimizerWith<AdamOptions> {
 public:
  /// Per parameter p with gradient g, at its step t = 1, 2, ... (torch.optim.Adam):
  ///   g = g + weight_decay * p
  ///   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
  ///   amsgrad: v_max = max(v_max, v), used below in place of v
  ///   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
  /// beta^t is kept per parameter by repeated multiplication in double (not pow), so it is
  /// the same on every platform. State (step, exp_avg, exp_avg_sq, max_exp_avg_sq) is created
  /// zeroed on a parameter's device at its first step with a grad. Throws InvalidArgument with
  /// PyTorch's messages for lr < 0 ("Invalid learning rate: -1"), eps < 0 ("Invalid epsilon
  /// value"), a beta outside [0, 1) ("Invalid beta parameter at index 0: 1.5"), weight_decay < 0
  /// ("Invalid weight_decay value"), any NaN, and what Optimizer's constructor throws.
  Adam(std::vector<nn::Parameter*> params, AdamOptions options = {});

  void step() override;
  /// Per parameter with a step: "state.<i>.step" (0-dim i64; PyTorch keeps a 0-dim f32),
  /// "state.<i>.exp_avg", "state.<i>.exp_avg_sq" and with amsgrad "state.<i>.max_exp_avg_sq";
  /// options lr, beta1, beta2, eps, weight_decay, amsgrad. Loading recomputes beta^step by the
  /// same repeated multiplication, so the next step has the same bits.
  OptimizerState state_dict() const override;
  void load_state_dict(const OptimizerState& state) override;
  /// exp_avg, exp_avg_sq (and max_exp_avg_sq) of every parameter with a step.
  std::size_t state_bytes() const override;

  /// Number of steps parameter i has taken (0 before its first step with a grad).
  std::int64_t step_count(std::size_t i) const { return state_.at(i).step; }
  /// First-moment estimate of parameter i (undefined before its first step).
  const Tensor& exp_avg(std::size_t i) const { return state_.at(i).exp_avg; }
  /// Second-moment estimate of parameter i (undefined before its first step).
  const Tensor& exp_avg_sq(std::size_t i) const { return state_.at(i).exp_avg_sq; }
  /// Running maximum of exp_avg_sq (amsgrad only; undefined otherwise).
  const Tensor& max_exp_avg_sq(std::size_t i) const { return state_.at(i).max_exp_avg_sq; }

  /// Whether step() runs as one ops::adam_step_multi_ per device: every parameter with a grad
  /// is on a backend with multi-tensor kernels (ops::has_multi_tensor_kernels: cuda), and there
  /// is at least one. Otherwise step() makes one ops::adam_step_ per parameter.
  bool multi_tensor() const;
  /// The multi-tensor step (multi_tensor() true): the state of step(), then per device one
  /// ops::adam_step_multi_ over its parameters with a grad, in order. `decay` (null, or one entry
  /// per parameter): AdamW's decoupled decay, param *= (*decay)[i] first where set. The bits of
  /// step() after those scale_ calls. `fused` (null: none): Optimizer::step_fused's arguments
  /// (grads of bf16 / f16 read as stored, the gradient scale, the outputs), checked by the
  /// caller with can_step_fused.
  void step_multi(const std::vector<std::optional<float>>* decay,
                  const FusedStepArgs* fused = nullptr);
  /// multi_tensor(), and every parameter with a grad on a backend that has_multi_tensor_ex its
  /// grad's dtype (f32, bf16, f16) and its output's (args.outputs: one per parameter or none).
  bool can_step_fused(const FusedStepArgs& args) const override;
  /// step_multi(nullptr, &args) (Optimizer::step_fused).
  void step_fused(const FusedStepArgs& args) override;

 private:
  struct State {
    std::int64_t step = 0;
    double beta1_power = 1.0;  // beta1^step by repeated multiplication
    double beta2_power = 1.0;
    Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };
  std::vector<State> state_;
};

}  // namespace ditto::optim
