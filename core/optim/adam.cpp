// optim::Adam: argument checks with torch.optim.Adam's messages, per-parameter state, and the
// step through ops::adam_step_ (Kernels::adam_step).
#include "core/optim/adam.h"

#include <map>
#include <string>

#include "core/base/error.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

void check_adam_options(const char* call, double lr, double beta1, double beta2, double eps,
                        double weight_decay) {
  // Messages follow torch.optim.Adam's; written so that NaN fails every check.
  DITTO_CHECK(lr >= 0.0, call, ": lr: Invalid learning rate: ", lr, " (expected >= 0)");
  DITTO_CHECK(eps >= 0.0, call, ": eps: Invalid epsilon value: ", eps, " (expected >= 0)");
  DITTO_CHECK(beta1 >= 0.0 && beta1 < 1.0, call,
              ": beta1: Invalid beta parameter at index 0: ", beta1, " (expected 0 <= beta1 < 1)");
  DITTO_CHECK(beta2 >= 0.0 && beta2 < 1.0, call,
              ": beta2: Invalid beta parameter at index 1: ", beta2, " (expected 0 <= beta2 < 1)");
  DITTO_CHECK(weight_decay >= 0.0, call,
              ": weight_decay: Invalid weight_decay value: ", weight_decay, " (expected >= 0)");
}

Adam::Adam(std::vector<nn::Parameter*> params, AdamOptions options)
    : OptimizerWith(std::move(params), "optim::Adam", options) {
  check_adam_options("optim::Adam", options.lr, options.beta1, options.beta2, options.eps,
                     options.weight_decay);
  state_.resize(params_.size());
}

std::map<std::string, std::string> adam_option_strings(const AdamOptions& o, std::size_t n) {
  return {{"lr", exact_str(o.lr)},
          {"beta1", exact_str(o.beta1)},
          {"beta2", exact_str(o.beta2)},
          {"eps", exact_str(o.eps)},
          {"weight_decay", exact_str(o.weight_decay)},
          {"amsgrad", o.amsgrad ? "true" : "false"},
          {"num_params", std::to_string(n)}};
}

OptimizerState Adam::state_dict() const {
  OptimizerState s{"Adam", adam_option_strings(options_, params_.size()), {}};
  for (std::size_t i = 0; i < state_.size(); ++i) {
    const State& st = state_[i];
    if (st.step == 0) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    Tensor step = Tensor::empty({}, DType::i64, Device::cpu());
    *step.data<std::int64_t>() = st.step;
    s.tensors.emplace_back(prefix + "step", step);
    s.tensors.emplace_back(prefix + "exp_avg", st.exp_avg.to(Device::cpu(), /*copy=*/true));
    s.tensors.emplace_back(prefix + "exp_avg_sq", st.exp_avg_sq.to(Device::cpu(), /*copy=*/true));
    if (options_.amsgrad)
      s.tensors.emplace_back(prefix + "max_exp_avg_sq",
                             st.max_exp_avg_sq.to(Device::cpu(), /*copy=*/true));
  }
  return s;
}

std::size_t Adam::state_bytes() const {
  std::size_t n = 0;
  for (const State& st : state_)
    for (const Tensor* t : {&st.exp_avg, &st.exp_avg_sq, &st.max_exp_avg_sq})
      if (t->defined()) n += t->nbytes();
  return n;
}

void Adam::load_state_dict(const OptimizerState& state) {
  const char* call = "optim::Adam::load_state_dict";
  std::vector<std::string> keys{"step", "exp_avg", "exp_avg_sq"};
  if (options_.amsgrad) keys.push_back("max_exp_avg_sq");
  check_state(state, call, "Adam", adam_option_strings(options_, params_.size()), keys);
  std::vector<std::map<std::string, const Tensor*>> per(params_.size());
  for (const auto& [name, t] : state.tensors) {
    auto [i, key] = split_state_name(name);
    per[i][key] = &t;
  }
  // A parameter has either all of its state or none of it, and a step count >= 1.
  for (std::size_t i = 0; i < per.size(); ++i) {
    if (per[i].empty()) continue;
    for (const std::string& k : keys)
      DITTO_CHECK(per[i].count(k), call, ": state: parameter ", i, " has some state but no '",
                  "state.", i, ".", k, "'");
    const std::int64_t step = *per[i]["step"]->data<std::int64_t>();
    DITTO_CHECK(step >= 1, call, ": state: 'state.", i, ".step': expected >= 1, got ", step);
  }
  std::vector<State> loaded(params_.size());
  for (std::size_t i = 0; i < per.size(); ++i) {
    if (per[i].empty()) continue;
    State& st = loaded[i];
    const Device& dev = params_[i]->data.device();
    auto to_dev = [&](const char* k) {
      Tensor t = Tensor::empty(params_[i]->data.shape(), DType::f32, dev);
      t.copy_(*per[i][k]);
      return t;
    };
    st.step = *per[i]["step"]->data<std::int64_t>();
    for (std::int64_t s = 0; s < st.step; ++s) {  // as step() forms them: no pow
      st.beta1_power *= options_.beta1;
      st.beta2_power *= options_.beta2;
    }
    st.exp_avg = to_dev("exp_avg");
    st.exp_avg_sq = to_dev("exp_avg_sq");
    if (options_.amsgrad) st.max_exp_avg_sq = to_dev("max_exp_avg_sq");
  }
  state_ = std::move(loaded);
}

bool Adam::multi_tensor() const {
  bool any = false;
  for (const nn::Parameter* p : params_) {
    if (!p->grad.defined()) continue;
    if (!ops::has_multi_tensor_kernels(p->data.device())) return false;
    any = true;
  }
  return any;
}

namespace {

// One parameter's state made ready for a step (step() and step_multi()): the moments allocated
// on its first step or moved with the parameter (Module::to), and its gradient validated before
// the state is touched, so a rejected step leaves it as it was. New moments are zeros
// (torch.optim.Adam's zeros_like state): each made so where `to_zero` is null (step(): one fill
// per moment); otherwise allocated and listed in *to_zero, which the caller zeroes in one
// ops::fill_multi_ per device before the step (step_multi(): the same bits and memory, one
// launch instead of two or three per parameter). A rejected step leaves st.step at 0, so its
// next step makes them again.
template <class State>
void prepare_adam_state(nn::Parameter& p, State& st, const AdamOptions& o, std::size_t i,
                        bool typed = false, std::vector<Tensor*>* to_zero = nullptr) {
  const Device& dev = p.data.device();
  if (st.step == 0) {
    for (Tensor* t : {&st.exp_avg, &st.exp_avg_sq, o.amsgrad ? &st.max_exp_avg_sq : nullptr}) {
      if (t == nullptr) continue;
      if (to_zero == nullptr) {
        *t = Tensor::zeros(p.data.shape(), DType::f32, dev);
      } else {
        *t = Tensor::empty(p.data.shape(), DType::f32, dev);
        to_zero->push_back(t);
      }
    }
  } else if (st.exp_avg.device() != dev) {  // the parameter moved (Module::to)
    st.exp_avg = st.exp_avg.to(dev);
    st.exp_avg_sq = st.exp_avg_sq.to(dev);
    if (o.amsgrad) st.max_exp_avg_sq = st.max_exp_avg_sq.to(dev);
  }
  const DType g = p.grad.dtype();
  DITTO_CHECK(p.grad.shape() == p.data.shape() && p.grad.device() == dev &&
                  (g == DType::f32 || (typed && (g == DType::bf16 || g == DType::f16))),
              "optim::Adam: params[", i, "] ('", p.name, "'): grad: expected ",
              shape_str(p.data.shape()), typed ? " f32, bf16 or f16" : " f32", " on ", dev.str(),
              " (the parameter's shape and device), got ", p.grad.str());
}

}  // namespace

bool Adam::can_step_fused(const FusedStepArgs& args) const {
  if (!multi_tensor()) return false;
  if (!args.outputs.empty() && args.outputs.size() != params_.size()) return false;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    const Device& dev = p.data.device();
    if (!ops::has_multi_tensor_ex(dev, p.grad.dtype())) return false;
    const Tensor* out = args.outputs.empty() ? nullptr : args.outputs[i];
    if (out != nullptr && !ops::has_multi_tensor_ex(dev, out->dtype())) return false;
  }
  return true;
}

void Adam::step_fused(const FusedStepArgs& args) {
  DITTO_CHECK(can_step_fused(args),
              "optim::Adam::step_fused: expected every parameter with a "
              "grad on a backend with typed multi-tensor kernels for its grad's and output's "
              "dtypes (can_step_fused), got one without");
  step_multi(nullptr, &args);
}

void Adam::step_multi(const std::vector<std::optional<float>>* decay, const FusedStepArgs* fused) {
  const AdamOptions& o = options_;
  std::vector<Device> devices;  // in order of first appearance
  std::vector<std::vector<ops::AdamStepTensors>> lists;
  std::vector<std::vector<Tensor*>> to_zero;  // per device: the moments made at this step
  std::vector<std::size_t> stepped;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;
    State& st = state_[i];
    const Device& dev = p.data.device();
    std::size_t d = 0;
    while (d < devices.size() && devices[d] != dev) ++d;
    if (d == devices.size()) {
      devices.push_back(dev);
      lists.emplace_back();
      to_zero.emplace_back();
    }
    prepare_adam_state(p, st, o, i, fused != nullptr, &to_zero[d]);
    ops::AdamStepTensors t;
    t.param = &p.data;
    t.grad = &p.grad;
    t.exp_avg = &st.exp_avg;
    t.exp_avg_sq = &st.exp_avg_sq;
    t.max_exp_avg_sq = o.amsgrad ? &st.max_exp_avg_sq : nullptr;
    t.bias_correction1 = 1.0 - st.beta1_power * o.beta1;
    t.bias_correction2 = 1.0 - st.beta2_power * o.beta2;
    if (decay != nullptr) t.decay_scale = (*decay)[i];
    if (fused != nullptr && !fused->outputs.empty()) t.model = fused->outputs[i];
    lists[d].push_back(t);
    stepped.push_back(i);
  }
  const std::optional<float> grad_scale =
      fused != nullptr ? fused->grad_scale : std::optional<float>();
  for (const auto& moments : to_zero) ops::fill_multi_(moments, 0.0f);
  for (const auto& list : lists)
    ops::adam_step_multi_(list, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad,
                          grad_scale);
  for (std::size_t i : stepped) {
    State& st = state_[i];
    ++st.step;
    st.beta1_power *= o.beta1;
    st.beta2_power *= o.beta2;
  }
}

void Adam::step() {
  if (multi_tensor()) return step_multi(nullptr);
  const AdamOptions& o = options_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;  // as PyTorch: no grad, no update and no state
    State& st = state_[i];
    prepare_adam_state(p, st, o, i);
    const double beta1_power = st.beta1_power * o.beta1;
    const double beta2_power = st.beta2_power * o.beta2;
    ops::adam_step_(p.data, p.grad, st.exp_avg, st.exp_avg_sq, st.max_exp_avg_sq, o.lr, o.beta1,
                    o.beta2, o.eps, o.weight_decay, 1.0 - beta1_power, 1.0 - beta2_power,
                    o.amsgrad);
    ++st.step;
    st.beta1_power = beta1_power;
    st.beta2_power = beta2_power;
  }
}

}  // namespace ditto::optim
