// optim::Optimizer basics and optim::SGD's step through ops::sgd_step_ (Kernels::sgd_step).
#include "core/optim/sgd.h"

#include <cstring>
#include <set>

#include "core/backend.h"
#include "core/ops.h"

namespace ditto::ops {

// Declared in core/ops.h with the other validated ops; defined here, beside its only caller, so
// that ops.cpp (kernels' argument checks) and the optimizer could be written in parallel. It may
// move to ops.cpp.
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
    DITTO_CHECK(p->data.defined() && p->data.dtype() == DType::f32, call, ": params[", i, "] ('",
                p->name, "'): expected defined f32 data, got ",
                p->data.defined() ? p->data.str() : std::string("an undefined tensor"));
  }
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
    : Optimizer(std::move(params), "optim::SGD"), options_(options) {
  // Messages follow torch.optim.SGD's ("Invalid learning rate: ...").
  DITTO_CHECK(options.lr >= 0.0f, "optim::SGD: lr: Invalid learning rate: ", options.lr,
              " (expected >= 0)");
  DITTO_CHECK(options.momentum >= 0.0f,
              "optim::SGD: momentum: Invalid momentum value: ", options.momentum,
              " (expected >= 0)");
  DITTO_CHECK(options.weight_decay >= 0.0f,
              "optim::SGD: weight_decay: Invalid weight_decay value: ", options.weight_decay,
              " (expected >= 0)");
  DITTO_CHECK(options.dampening == options.dampening,
              "optim::SGD: dampening: expected a number, "
              "got nan");
  DITTO_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
              "optim::SGD: nesterov: Nesterov momentum requires a momentum and zero dampening ",
              "(got momentum ", options.momentum, ", dampening ", options.dampening, ")");
  buffers_.resize(params_.size());
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
