// optim::Adam: argument checks with torch.optim.Adam's messages, per-parameter state, and the
// step through ops::adam_step_ (Kernels::adam_step).
#include "core/optim/adam.h"

#include "core/error.h"
#include "core/ops.h"

namespace ditto::optim {

Adam::Adam(std::vector<nn::Parameter*> params, AdamOptions options)
    : Optimizer(std::move(params), "optim::Adam"), options_(options) {
  // Messages follow torch.optim.Adam's; written so that NaN fails every check.
  const AdamOptions& o = options;
  DITTO_CHECK(o.lr >= 0.0, "optim::Adam: lr: Invalid learning rate: ", o.lr, " (expected >= 0)");
  DITTO_CHECK(o.eps >= 0.0, "optim::Adam: eps: Invalid epsilon value: ", o.eps, " (expected >= 0)");
  DITTO_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0,
              "optim::Adam: beta1: Invalid beta parameter at index 0: ", o.beta1,
              " (expected 0 <= beta1 < 1)");
  DITTO_CHECK(o.beta2 >= 0.0 && o.beta2 < 1.0,
              "optim::Adam: beta2: Invalid beta parameter at index 1: ", o.beta2,
              " (expected 0 <= beta2 < 1)");
  DITTO_CHECK(o.weight_decay >= 0.0,
              "optim::Adam: weight_decay: Invalid weight_decay value: ", o.weight_decay,
              " (expected >= 0)");
  state_.resize(params_.size());
}

void Adam::step() {
  const AdamOptions& o = options_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    if (!p.grad.defined()) continue;  // as PyTorch: no grad, no update and no state
    State& st = state_[i];
    const Device& dev = p.data.device();
    if (st.step == 0) {
      st.exp_avg = Tensor::zeros(p.data.shape(), DType::f32, dev);
      st.exp_avg_sq = Tensor::zeros(p.data.shape(), DType::f32, dev);
      if (o.amsgrad) st.max_exp_avg_sq = Tensor::zeros(p.data.shape(), DType::f32, dev);
    } else if (st.exp_avg.device() != dev) {  // the parameter moved (Module::to)
      st.exp_avg = st.exp_avg.to(dev);
      st.exp_avg_sq = st.exp_avg_sq.to(dev);
      if (o.amsgrad) st.max_exp_avg_sq = st.max_exp_avg_sq.to(dev);
    }
    // Validate before touching the state, so a rejected step leaves it as it was.
    DITTO_CHECK(
        p.grad.shape() == p.data.shape() && p.grad.dtype() == DType::f32 && p.grad.device() == dev,
        "optim::Adam: params[", i, "] ('", p.name, "'): grad: expected ", shape_str(p.data.shape()),
        " f32 on ", dev.str(), " (the parameter's shape and device), got ", p.grad.str());
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
