// optim::AdamW: nanoGPT's parameter groups, the decoupled decay (ops::scale_) before
// torch.optim.Adam's update without decay (an optim::Adam over the same parameters holds the state
// and runs ops::adam_step_), and the state_dict under type "AdamW".
#include "core/optim/adamw.h"

#include <cmath>
#include <map>
#include <optional>
#include <string>

#include "core/base/error.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

std::vector<AdamWGroup> nanogpt_param_groups(const std::vector<nn::Parameter*>& params,
                                             double weight_decay) {
  std::vector<AdamWGroup> groups{{{}, weight_decay}, {{}, 0.0}};
  for (nn::Parameter* p : params)
    groups[p != nullptr && p->data.defined() && p->data.dim() >= 2 ? 0 : 1].params.push_back(p);
  return groups;
}

namespace {

std::vector<nn::Parameter*> flatten(const std::vector<AdamWGroup>& groups) {
  std::vector<nn::Parameter*> all;
  for (const AdamWGroup& g : groups) all.insert(all.end(), g.params.begin(), g.params.end());
  return all;
}

AdamWOptions checked(const AdamWOptions& o, const std::vector<AdamWGroup>& groups) {
  check_adam_options("optim::AdamW", o.lr, o.beta1, o.beta2, o.eps, 0.0);
  for (std::size_t g = 0; g < groups.size(); ++g)
    DITTO_CHECK(groups[g].weight_decay >= 0.0, "optim::AdamW: groups[", g,
                "].weight_decay: Invalid weight_decay value: ", groups[g].weight_decay,
                " (expected >= 0)");
  return o;
}

AdamOptions without_decay(const AdamWOptions& o) {
  return {.lr = o.lr,
          .beta1 = o.beta1,
          .beta2 = o.beta2,
          .eps = o.eps,
          .weight_decay = 0.0,
          .amsgrad = o.amsgrad};
}

}  // namespace

AdamW::AdamW(std::vector<AdamWGroup> groups, AdamWOptions options)
    : AdamW(groups, options, flatten(groups)) {}

AdamW::AdamW(const std::vector<nn::Parameter*>& params, AdamWOptions options)
    : AdamW(nanogpt_param_groups(params, options.weight_decay), options) {}

AdamW::AdamW(std::vector<AdamWGroup> groups, AdamWOptions options, std::vector<nn::Parameter*> all)
    : OptimizerWith(all, "optim::AdamW", checked(options, groups)),
      adam_(std::move(all), without_decay(options)) {
  for (const AdamWGroup& g : groups) {
    group_decay_.push_back(g.weight_decay);
    group_size_.push_back(g.params.size());
    decay_.insert(decay_.end(), g.params.size(), g.weight_decay);
  }
}

void AdamW::set_lr(double lr) {
  OptimizerWith::set_lr(lr);
  adam_.set_lr(lr);
}

namespace {

// Every defined grad of `params` of its parameter's shape and device, and f32 (typed: or bf16 /
// f16); checked before the first decay, so a rejected step changes nothing.
void check_grads(const std::vector<nn::Parameter*>& params, bool typed) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const nn::Parameter& p = *params[i];
    if (!p.grad.defined()) continue;
    const DType g = p.grad.dtype();
    DITTO_CHECK(p.grad.shape() == p.data.shape() &&
                    (g == DType::f32 || (typed && (g == DType::bf16 || g == DType::f16))) &&
                    p.grad.device() == p.data.device(),
                "optim::AdamW: params[", i, "] ('", p.name, "'): grad: expected ",
                shape_str(p.data.shape()), typed ? " f32, bf16 or f16" : " f32", " on ",
                p.data.device().str(), " (the parameter's shape and device), got ", p.grad.str());
  }
}

}  // namespace

void AdamW::step_fused(const FusedStepArgs& args) {
  check_grads(params_, /*typed=*/true);
  DITTO_CHECK(can_step_fused(args),
              "optim::AdamW::step_fused: expected every parameter with a "
              "grad on a backend with typed multi-tensor kernels for its grad's and output's "
              "dtypes (can_step_fused), got one without");
  std::vector<std::optional<float>> decay(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i]->grad.defined() && decay_[i] != 0.0)
      decay[i] = static_cast<float>(1.0 - options_.lr * decay_[i]);
  adam_.step_multi(&decay, &args);
}

void AdamW::step() {
  check_grads(params_, /*typed=*/false);
  if (adam_.multi_tensor()) {  // the decay folded into one multi-tensor launch per device
    std::vector<std::optional<float>> decay(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (params_[i]->grad.defined() && decay_[i] != 0.0)
        decay[i] = static_cast<float>(1.0 - options_.lr * decay_[i]);
    adam_.step_multi(&decay);
    return;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    if (!p.grad.defined() || decay_[i] == 0.0) continue;
    ops::scale_(p.data,
                static_cast<float>(1.0 - options_.lr * decay_[i]));  // param.mul_(1 - lr * wd)
  }
  adam_.step();
}

std::map<std::string, std::string> AdamW::option_strings() const {
  const AdamWOptions& o = options_;
  std::map<std::string, std::string> m{{"lr", exact_str(o.lr)},
                                       {"beta1", exact_str(o.beta1)},
                                       {"beta2", exact_str(o.beta2)},
                                       {"eps", exact_str(o.eps)},
                                       {"amsgrad", o.amsgrad ? "true" : "false"},
                                       {"num_params", std::to_string(params_.size())},
                                       {"num_groups", std::to_string(group_decay_.size())}};
  for (std::size_t g = 0; g < group_decay_.size(); ++g) {
    const std::string prefix = "param_groups." + std::to_string(g) + ".";
    m[prefix + "weight_decay"] = exact_str(group_decay_[g]);
    m[prefix + "num_params"] = std::to_string(group_size_[g]);
  }
  return m;
}

OptimizerState AdamW::state_dict() const {
  OptimizerState s = adam_.state_dict();
  s.type = "AdamW";
  s.options = option_strings();
  return s;
}

void AdamW::load_state_dict(const OptimizerState& state) {
  const char* call = "optim::AdamW::load_state_dict";
  // lr is taken, not compared: check the rest against this optimizer's with the saved lr.
  std::map<std::string, std::string> own = option_strings();
  auto saved_lr = state.options.find("lr");
  DITTO_CHECK(saved_lr != state.options.end(), call, ": state: option lr is missing");
  char* end = nullptr;
  const double lr = std::strtod(saved_lr->second.c_str(), &end);
  DITTO_CHECK(!saved_lr->second.empty() && *end == '\0' && lr >= 0.0 && std::isfinite(lr), call,
              ": state: option lr: expected a finite number >= 0, got '", saved_lr->second, "'");
  own["lr"] = saved_lr->second;
  std::vector<std::string> keys{"step", "exp_avg", "exp_avg_sq"};
  if (options_.amsgrad) keys.push_back("max_exp_avg_sq");
  check_state(state, call, "AdamW", own, keys);
  AdamOptions ao = without_decay(options_);
  ao.lr = lr;
  const double previous = adam_.lr();
  adam_.set_lr(lr);
  try {
    adam_.load_state_dict({"Adam", adam_option_strings(ao, params_.size()), state.tensors});
  } catch (...) {
    adam_.set_lr(previous);  // refused: nothing changed
    throw;
  }
  options_.lr = lr;
}

}  // namespace ditto::optim
