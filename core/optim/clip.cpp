// optim::clip_grad_norm_: per-parameter ops::sum_squares (per device one ops::sum_squares_multi
// where the backend has multi-tensor kernels), the float sum in parameter order and sqrt on the
// host, and ops::scale_ of every grad (ops::scale_multi_) when the norm is above max_norm.
#include "core/optim/clip.h"

#include <cmath>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

namespace {
bool all_multi_tensor(const std::vector<nn::Parameter*>& params) {
  bool any = false;
  for (const nn::Parameter* p : params) {
    if (p == nullptr || !p->grad.defined()) continue;
    if (!ops::has_multi_tensor_kernels(p->grad.device())) return false;
    any = true;
  }
  return any;
}
}  // namespace

float clip_grad_norm_(const std::vector<nn::Parameter*>& params, double max_norm,
                      Determinism mode) {
  return detail::clip_grad_norm_with(params, max_norm, mode, all_multi_tensor(params));
}

std::vector<std::vector<std::size_t>> detail::by_device(const std::vector<const Tensor*>& xs) {
  std::vector<std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    std::size_t d = 0;
    while (d < groups.size() && xs[groups[d][0]]->device() != xs[i]->device()) ++d;
    if (d == groups.size()) groups.emplace_back();
    groups[d].push_back(i);
  }
  return groups;
}

detail::GradNorm detail::grad_norm(const std::vector<const Tensor*>& grads, double max_norm,
                                   Determinism mode, bool multi_tensor, const char* call) {
  DITTO_CHECK(std::isfinite(max_norm) && max_norm > 0.0, call,
              ": max_norm: expected a finite value > 0, got ", max_norm);
  // Backends with multi-tensor kernels (cuda): per device one ops::sum_squares_multi, the same
  // bits as the per-grad ops below (typed grads: read as stored, the bits of their f32 casts).
  const bool multi = multi_tensor && !grads.empty();
  std::vector<float> squares(grads.size());
  if (multi) {
    const auto groups = by_device(grads);
    std::vector<Tensor> sums;  // enqueue on every device first, then read
    for (const auto& idx : groups) {
      std::vector<const Tensor*> xs;
      for (std::size_t i : idx) xs.push_back(grads[i]);
      sums.push_back(ops::sum_squares_multi(xs, mode));
    }
    for (std::size_t d = 0; d < groups.size(); ++d) {
      const Tensor host = sums[d].to(Device::cpu());
      for (std::size_t j = 0; j < groups[d].size(); ++j)
        squares[groups[d][j]] = host.data<float>()[j];
    }
  } else {
    // Enqueue every sum first (one per device stream), then read them in parameter order.
    std::vector<Tensor> sums;
    sums.reserve(grads.size());
    for (const Tensor* g : grads) sums.push_back(ops::sum_squares(*g, mode));
    for (std::size_t i = 0; i < sums.size(); ++i) squares[i] = sums[i].item();
  }
  float total = 0.0f;
  for (float s : squares) total += s;
  total = std::sqrt(total);
  const float coef = static_cast<float>(max_norm) / (total + 1e-6f);
  // A dry run (Note [Dry run], backend_sim/sim_backend.h) reads every norm as 0: price the
  // clipping anyway (a GPT's early steps clip), so the prediction does not depend on data.
  const bool dry = !grads.empty() && is_dry_run(grads.front()->device());
  GradNorm r;
  r.total = total;
  if (!(coef >= 1.0f) || dry) r.scale = coef;
  return r;
}

float detail::clip_grad_norm_with(const std::vector<nn::Parameter*>& params, double max_norm,
                                  Determinism mode, bool multi_tensor) {
  const char* call = "optim::clip_grad_norm_";
  DITTO_CHECK(std::isfinite(max_norm) && max_norm > 0.0, call,
              ": max_norm: expected a finite value > 0, got ", max_norm);
  std::vector<Tensor*> grads;
  for (std::size_t i = 0; i < params.size(); ++i) {
    DITTO_CHECK(params[i] != nullptr, call, ": params[", i, "]: expected a parameter, got null");
    nn::Parameter& p = *params[i];
    if (!p.grad.defined()) continue;  // as torch: only the parameters with a grad
    DITTO_CHECK(p.grad.dtype() == DType::f32 && p.grad.shape() == p.data.shape() &&
                    p.grad.device() == p.data.device(),
                call, ": params[", i, "] ('", p.name, "'): grad: expected ",
                shape_str(p.data.shape()), " f32 on ", p.data.device().str(),
                " (the parameter's shape and device), got ", p.grad.str());
    grads.push_back(&p.grad);
  }
  const bool multi = multi_tensor && !grads.empty();
  const std::vector<const Tensor*> read(grads.begin(), grads.end());
  const GradNorm r = grad_norm(read, max_norm, mode, multi, call);
  if (r.scale) {
    if (multi) {
      for (const auto& idx : by_device(read)) {
        std::vector<Tensor*> xs;
        for (std::size_t i : idx) xs.push_back(grads[i]);
        ops::scale_multi_(xs, *r.scale);
      }
    } else {
      for (Tensor* g : grads) ops::scale_(*g, *r.scale);
    }
  }
  return r.total;
}

}  // namespace ditto::optim
