// optim::clip_grad_norm_: per-parameter ops::sum_squares, the float sum and sqrt on the host,
// and ops::scale_ of every grad when the norm is above max_norm.
#include "core/optim/clip.h"

#include <cmath>

#include "core/runtime/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

float clip_grad_norm_(const std::vector<nn::Parameter*>& params, double max_norm,
                      Determinism mode) {
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
  // Enqueue every sum first (one per device stream), then read them in parameter order.
  std::vector<Tensor> sums;
  sums.reserve(grads.size());
  for (Tensor* g : grads) sums.push_back(ops::sum_squares(*g, mode));
  float total = 0.0f;
  for (const Tensor& s : sums) total += s.item();
  total = std::sqrt(total);
  const float coef = static_cast<float>(max_norm) / (total + 1e-6f);
  // A dry run (Note [Dry run], backend_sim/sim_backend.h) reads every norm as 0: price the
  // clipping anyway (a GPT's early steps clip), so the prediction does not depend on data.
  const bool dry = !grads.empty() && is_dry_run(grads.front()->device());
  if (!(coef >= 1.0f) || dry)
    for (Tensor* g : grads) ops::scale_(*g, coef);
  return total;
}

}  // namespace ditto::optim
