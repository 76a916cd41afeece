// optim::Optimizer basics and optim::SGD's step through ops::sgd_step_ (Kernels::sgd_step).
#include "core/optim/sgd.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/ops_check.h"

namespace ditto::ops {

// Declared in core/runtime/ops.h with the other validated ops; defined here, beside its only
// caller, so that ops.cpp (kernels' argument checks) and the optimizer could be written in
// parallel. It may move to ops.cpp.
void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float dampening, float weight_decay, bool nesterov, bool first_step) {
  DITTO_CHECK(param.defined() && param.dtype() == DType::f32 && !param.device().is_cpu(),
              "ops::sgd_step_: param: expected an f32 tensor on a device, got ",
              param.defined() ? param.str() : std::string("an undefined tensor"));
  DITTO_CHECK(grad.defined() && grad.shape() == param.shape() && grad.dtype() == DType::f32 &&
                  grad.device() == param.device(),
              "ops::sgd_step_: grad: expected ", shape_str(param.shape()), " f32 on ",
              param.device().str(), " (param's shape and device), got ",
              grad.defined() ? grad.str() : std::string("an undefined tensor"));
  if (momentum != 0.0f)
    DITTO_CHECK(momentum_buf.defined() && momentum_buf.shape() == param.shape() &&
                    momentum_buf.dtype() == DType::f32 && momentum_buf.device() == param.device(),
                "ops::sgd_step_: momentum_buf: expected ", shape_str(param.shape()), " f32 on ",
                param.device().str(), " when momentum != 0, got ",
                momentum_buf.defined() ? momentum_buf.str() : std::string("an undefined tensor"));
  internal::check_live("ops::sgd_step_", "param", param);
  internal::check_live("ops::sgd_step_", "grad", grad);
  if (momentum != 0.0f) internal::check_live("ops::sgd_step_", "momentum_buf", momentum_buf);
  if (param.numel() == 0) return;
  const Device& dev = param.device();
  dev.backend().kernels().sgd_step(current_stream(dev), param.data<float>(), grad.data<float>(),
                                   momentum != 0.0f ? momentum_buf.data<float>() : nullptr,
                                   param.numel(), lr, momentum, dampening, weight_decay, nesterov,
                                   first_step);
}

}  // namespace ditto::ops

namespace ditto::optim {

Optimizer::Optimizer(std::vector<nn::Parameter*> params, const char* call)
    : Optimizer(std::move(params), call, std::vector<DType>{DType::f32}) {}

Optimizer::Optimizer(std::vector<nn::Parameter*> params, const char* call,
                     std::vector<DType> dtypes)
    : params_(std::move(params)) {
  DITTO_CHECK(!params_.empty(), call,
              ": params: expected at least one parameter, got an empty "
              "list");
  std::set<const nn::Parameter*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::Parameter* p = params_[i];
    DITTO_CHECK(p != nullptr, call, ": params[", i, "]: expected a parameter, got null");
    DITTO_CHECK(seen.insert(p).second, call, ": params[", i, "] ('", p->name,
                "'): the parameter appears more than once");
    std::string want;
    for (DType d : dtypes) want += std::string(want.empty() ? "" : " or ") + dtype_name(d);
    DITTO_CHECK(p->data.defined() &&
                    std::find(dtypes.begin(), dtypes.end(), p->data.dtype()) != dtypes.end(),
                call, ": params[", i, "] ('", p->name, "'): expected defined ", want, " data, got ",
                p->data.defined() ? p->data.str() : std::string("an undefined tensor"));
  }
}

std::string exact_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string exact_str(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

std::pair<std::size_t, std::string> Optimizer::split_state_name(const std::string& name) {
  const std::size_t dot = name.find('.', 6);  // after "state."
  return {static_cast<std::size_t>(std::stoull(name.substr(6, dot - 6))), name.substr(dot + 1)};
}

void Optimizer::check_lr(double lr, const char* call) {
  DITTO_CHECK(lr >= 0.0, call, ": lr: Invalid learning rate: ", lr, " (expected >= 0)");
}

void Optimizer::check_state(const OptimizerState& state, const char* call, const std::string& type,
                            const std::map<std::string, std::string>& own_options,
                            const std::vector<std::string>& keys) const {
  DITTO_CHECK(state.type == type, call, ": state: expected the state of a ", type,
              " optimizer, got one of ", state.type.empty() ? "(none)" : state.type);
  for (const auto& [key, value] : own_options) {
    auto it = state.options.find(key);
    DITTO_CHECK(it != state.options.end(), call, ": state: option ", key, " is missing (this ",
                type, " has ", key, "=", value, ")");
    DITTO_CHECK(it->second == value, call, ": state: option ", key, " differs: saved ", key, "=",
                it->second, ", this ", type, " has ", key, "=", value);
  }
  for (const auto& [key, value] : state.options)
    DITTO_CHECK(own_options.count(key), call, ": state: unexpected option ", key, "=", value);
  std::set<std::string> seen;
  for (const auto& [name, t] : state.tensors) {
    // "state.<i>.<key>" with i a decimal index in range and key one of `keys`.
    std::size_t i = 0, pos = 6;
    bool ok = name.compare(0, 6, "state.") == 0 && name.size() > 6 &&
              std::isdigit(static_cast<unsigned char>(name[6]));
    while (ok && pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos]))) {
      i = i * 10 + static_cast<std::size_t>(name[pos] - '0');
      ok = i < params_.size();
      ++pos;
    }
    ok = ok && pos < name.size() && name[pos] == '.';
    const std::string key = ok ? name.substr(pos + 1) : std::string();
    ok = ok && std::find(keys.begin(), keys.end(), key) != keys.end();
    DITTO_CHECK(ok, call, ": state: unexpected tensor '", name,
                "' (expected state.<i>.<key> with i < ", params_.size(), " and key one of the ",
                type, "'s)");
    DITTO_CHECK(seen.insert(name).second, call, ": state: tensor '", name,
                "' appears more than once");
    DITTO_CHECK(t.defined(), call, ": state: tensor '", name, "' is undefined");
    const nn::Parameter& p = *params_[i];
    if (key == "step") {
      DITTO_CHECK(t.dtype() == DType::i64 && t.dim() == 0, call, ": state: tensor '", name,
                  "': expected a 0-dim i64 step count, got ", t.str());
    } else {
      DITTO_CHECK(t.dtype() == DType::f32 && t.shape() == p.data.shape(), call, ": state: tensor '",
                  name, "': expected ", shape_str(p.data.shape()), " f32 (the shape of parameter ",
                  i, " '", p.name, "'), got ", t.str());
    }
  }
}

std::size_t Optimizer::state_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, t] : state_dict().tensors)
    if (t.dim() > 0) n += t.nbytes();
  return n;
}

std::size_t SGD::state_bytes() const {
  std::size_t n = 0;
  for (const Tensor& b : buffers_)
    if (b.defined()) n += b.nbytes();
  return n;
}

bool Optimizer::can_step_fused(const FusedStepArgs&) const { return false; }

void Optimizer::step_fused(const FusedStepArgs&) {
  throw InvalidArgument(
      "optim::Optimizer::step_fused: this optimizer has no fused step here (can_step_fused is "
      "false: it has none, or a parameter's backend has no typed multi-tensor kernels)");
}

void Optimizer::zero_grad(bool set_to_none) {
  for (nn::Parameter* p : params_) {
    if (!p->grad.defined()) continue;
    if (set_to_none) {
      p->grad = Tensor();
    } else if (p->grad.device().is_cpu()) {
      if (p->grad.numel() > 0) std::memset(p->grad.data_ptr(), 0, p->grad.nbytes());
    } else {
      ops::fill_(p->grad, 0.0f);
    }
  }
}

SGD::SGD(std::vector<nn::Parameter*> params, SGDOptions options)
    : OptimizerWith(std::move(params), "optim::SGD", options) {
  // Messages follow torch.optim.SGD's ("Invalid learning rate: ...").
  DITTO_CHECK(options.lr >= 0.0f, "optim::SGD: lr: Invalid learning rate: ", options.lr,
              " (expected >= 0)");
  DITTO_CHECK(options.momentum >= 0.0f,
              "optim::SGD: momentum: Invalid momentum value: ", options.momentum,
              " (expected >= 0)");
  DITTO_CHECK(options.weight_decay >= 0.0f,
              "optim::SGD: weight_decay: Invalid weight_decay value: ", options.weight_decay,
              " (expected >= 0)");
  DITTO_CHECK(options.dampening == options.dampening, "optim::SGD: dampening: expected a number, "
                                                      "got nan");
  DITTO_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
              "optim::SGD: nesterov: Nesterov momentum requires a momentum and zero dampening ",
              "(got momentum ", options.momentum, ", dampening ", options.dampening, ")");
  buffers_.resize(params_.size());
}

namespace {
std::map<std::string, std::string> sgd_options(const SGDOptions& o, std::size_t n) {
  return {{"lr", exact_str(o.lr)},
          {"momentum", exact_str(o.momentum)},
          {"dampening", exact_str(o.dampening)},
          {"weight_decay", exact_str(o.weight_decay)},
          {"nesterov", o.nesterov ? "true" : "false"},
          {"num_params", std::to_string(n)}};
}
}  // namespace

OptimizerState SGD::state_dict() const {
  OptimizerState s{"SGD", sgd_options(options_, params_.size()), {}};
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    if (buffers_[i].defined())
      s.tensors.emplace_back("state." + std::to_string(i) + ".momentum_buffer",
                             buffers_[i].to(Device::cpu(), /*copy=*/true));
  return s;
}

void SGD::load_state_dict(const OptimizerState& state) {
  check_state(state, "optim::SGD::load_state_dict", "SGD", sgd_options(options_, params_.size()),
              {"momentum_buffer"});
  std::vector<Tensor> buffers(params_.size());
  for (const auto& [name, t] : state.tensors) {
    const std::size_t i = split_state_name(name).first;
    buffers[i] = Tensor::empty(t.shape(), DType::f32, params_[i]->data.device());
    buffers[i].copy_(t);
  }
  buffers_ = std::move(buffers);
}

void SGD::step() {
  const SGDOptions& o = options_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;  // as PyTorch: no grad, no update (and no buffer)
    Tensor& buf = buffers_[i];
    bool first_step = false;
    if (o.momentum != 0.0f) {
      if (!buf.defined()) {
        buf = Tensor::empty(p.data.shape(), DType::f32, p.data.device());
        first_step = true;
      } else if (buf.device() != p.data.device()) {
        buf = buf.to(p.data.device());  // the parameter moved (Module::to)
      }
    }
    ops::sgd_step_(p.data, p.grad, buf, o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov,
                   first_step);
  }
}

}  // namespace ditto::optim
