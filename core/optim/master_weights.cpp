// optim::MasterWeights: f32 masters made from the model's parameters, grads upcast, the inner
// step, masters rounded back, and the masters in the state dict (Note [Master weights]).
#include "core/optim/master_weights.h"

#include <algorithm>
#include <map>
#include <string>

#include "core/base/error.h"
#include "core/optim/clip.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

namespace {
constexpr const char* kMasterPrefix = "master.";
}

MasterWeights::MasterWeights(std::vector<nn::Parameter*> params,
                             const InnerOptimizerFactory& make_inner)
    : Optimizer(std::move(params), "optim::MasterWeights", {DType::f32, DType::bf16, DType::f16}) {
  const char* call = "optim::MasterWeights";
  DITTO_CHECK(static_cast<bool>(make_inner), call, ": make_inner: expected a factory, got none");
  for (nn::Parameter* p : params_) {
    auto m = std::make_unique<nn::Parameter>();
    m->name = p->name;
    // f32: the parameter's own data (no copy); bf16 / f16: the exact upcast.
    m->data = p->data.dtype() == DType::f32 ? p->data : ops::cast(p->data, DType::f32);
    master_ptrs_.push_back(m.get());
    masters_.push_back(std::move(m));
  }
  inner_ = make_inner(master_ptrs_);
  DITTO_CHECK(inner_ != nullptr, call, ": make_inner: returned no optimizer");
  DITTO_CHECK(
      inner_->parameters() == master_ptrs_ ||
          [&] {  // the same set (AdamW's groups may reorder them)
            if (inner_->parameters().size() != master_ptrs_.size()) return false;
            for (nn::Parameter* q : inner_->parameters())
              if (std::find(master_ptrs_.begin(), master_ptrs_.end(), q) == master_ptrs_.end())
                return false;
            return true;
          }(),
      call, ": make_inner: expected an optimizer over the ", master_ptrs_.size(),
      " master parameters it was given, got one over ", inner_->parameters().size(),
      " other parameters");
  for (nn::Parameter* q : inner_->parameters())
    inner_index_.push_back(static_cast<std::size_t>(
        std::find(master_ptrs_.begin(), master_ptrs_.end(), q) - master_ptrs_.begin()));
}

namespace {
// The model parameter's data that receives its master rounded once: a bf16 / f16 parameter's
// (an f32 parameter's master is its data itself: none).
Tensor* output_of(nn::Parameter& p) { return p.data.dtype() == DType::f32 ? nullptr : &p.data; }
}  // namespace

FusedStepArgs MasterWeights::load_model_grads() const {
  for (std::size_t i = 0; i < params_.size(); ++i) masters_[i]->grad = params_[i]->grad;
  FusedStepArgs args;
  for (std::size_t k : inner_index_) args.outputs.push_back(output_of(*params_[k]));
  return args;
}

bool MasterWeights::fused_path() const {
  if (scaler_ != nullptr) return false;
  bool any = false;
  for (const nn::Parameter* p : params_) {
    if (!p->grad.defined()) continue;
    const Device& dev = p->data.device();
    if (p->grad.shape() != p->data.shape() || p->grad.device() != dev || dev.is_cpu() ||
        !ops::has_multi_tensor_ex(dev, p->grad.dtype()) ||
        !ops::has_multi_tensor_ex(dev, p->data.dtype()))
      return false;
    any = true;
  }
  if (!any) return false;
  // The inner's own answer on the model's grads; the masters' grads are put back.
  std::vector<Tensor> saved;
  for (const auto& m : masters_) saved.push_back(m->grad);
  const bool ok = inner_->can_step_fused(load_model_grads());
  for (std::size_t i = 0; i < masters_.size(); ++i) masters_[i]->grad = saved[i];
  return ok;
}

float MasterWeights::clip_grad_norm_(double max_norm, Determinism mode) {
  const char* call = "optim::MasterWeights::clip_grad_norm_";
  if (grads_ == Grads::none && fused_path()) {
    load_model_grads();
    grads_ = Grads::model;
  }
  if (grads_ != Grads::model) {
    if (grads_ == Grads::none) load_master_grads();
    return optim::clip_grad_norm_(master_ptrs_, max_norm, mode);
  }
  DITTO_CHECK(!grad_scale_.has_value(), call,
              ": called twice before step(): the fused clip (Note [Typed optimizer step]) keeps "
              "its coefficient for the step, so a second norm would not see the first clip");
  std::vector<const Tensor*> grads;
  for (const auto& m : masters_)
    if (m->grad.defined()) grads.push_back(&m->grad);
  const detail::GradNorm r =
      detail::grad_norm(grads, max_norm, mode, /*multi_tensor=*/!grads.empty(), call);
  grad_scale_ = r.scale;
  return r.total;
}

void MasterWeights::load_master_grads() {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::Parameter& p = *params_[i];
    nn::Parameter& m = *masters_[i];
    if (!p.grad.defined()) {
      m.grad = Tensor();
      continue;
    }
    DITTO_CHECK(p.grad.shape() == p.data.shape() && p.grad.device() == p.data.device() &&
                    is_floating(p.grad.dtype()),
                "optim::MasterWeights::load_master_grads: params[", i, "] ('", p.name,
                "'): grad: expected ", shape_str(p.data.shape()), " of a float dtype on ",
                p.data.device().str(), ", got ", p.grad.str());
    m.grad = p.grad.dtype() == DType::f32 ? p.grad : ops::cast(p.grad, DType::f32);
    // A fused clip's coefficient, on the copies (the bits of clip_grad_norm_'s scale_).
    if (grad_scale_) ops::scale_(m.grad, *grad_scale_);
  }
  grad_scale_.reset();
  grads_ = Grads::f32;
}

void MasterWeights::step() {
  if (grads_ == Grads::none && fused_path()) {
    load_model_grads();
    grads_ = Grads::model;
  }
  if (grads_ == Grads::model) {
    FusedStepArgs args = load_model_grads();
    args.grad_scale = grad_scale_;
    grad_scale_.reset();
    grads_ = Grads::none;
    inner_->step_fused(args);
    return;
  }
  if (grads_ == Grads::none) load_master_grads();
  grads_ = Grads::none;
  inner_->step();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter& p = *params_[i];
    const nn::Parameter& m = *masters_[i];
    if (!m.grad.defined() || p.data.dtype() == DType::f32) continue;  // f32: updated in place
    Tensor rounded = ops::cast(m.data, p.data.dtype());
    p.data.copy_(rounded);
  }
}

OptimizerState MasterWeights::state_dict() const {
  OptimizerState s = inner_->state_dict();
  s.options["master_weights"] = "f32";
  if (scaler_) put_scaler_state(*scaler_, s.options);
  for (std::size_t i = 0; i < masters_.size(); ++i)
    s.tensors.emplace_back(kMasterPrefix + std::to_string(i),
                           masters_[i]->data.to(Device::cpu(), /*copy=*/true));
  return s;
}

std::size_t MasterWeights::state_bytes() const {
  std::size_t n = inner_->state_bytes();
  for (const auto& m : masters_) n += m->data.nbytes();
  return n;
}

void MasterWeights::load_state_dict(const OptimizerState& state) {
  const char* call = "optim::MasterWeights::load_state_dict";
  auto mw = state.options.find("master_weights");
  DITTO_CHECK(mw != state.options.end() && mw->second == "f32", call,
              ": state: saved without master weights (option master_weights=f32 missing; a run "
              "in f32 keeps none): cannot resume a mixed-precision run from it");
  OptimizerState inner = state;
  inner.options.erase("master_weights");
  inner.tensors.clear();
  const std::map<std::string, std::string> scaler_state = take_scaler_state(inner.options);
  DITTO_CHECK(!scaler_ || !scaler_state.empty(), call,
              ": state: saved without a GradScaler's state (grad_scaler.* options), this run "
              "scales its loss (f16)");
  DITTO_CHECK(scaler_ || scaler_state.empty(), call,
              ": state: saved with a GradScaler's state (an f16 run), this run has none");
  if (scaler_) {  // checks before changing: a copy loads first
    GradScaler check(scaler_->options());
    check.load_state_dict(scaler_state);
  }
  std::vector<const Tensor*> found(masters_.size(), nullptr);
  const std::string prefix = kMasterPrefix;
  for (const auto& [name, t] : state.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0) {
      inner.tensors.emplace_back(name, t);
      continue;
    }
    const std::string idx = name.substr(prefix.size());
    std::size_t i = 0;
    bool ok = !idx.empty() && idx.size() < 10;
    for (char c : idx) ok = ok && c >= '0' && c <= '9';
    if (ok) i = std::stoul(idx);
    DITTO_CHECK(ok && i < masters_.size(), call, ": state: unexpected tensor '", name,
                "' (expected master.<i> with i < ", masters_.size(), ")");
    DITTO_CHECK(found[i] == nullptr, call, ": state: tensor '", name, "' appears more than once");
    const nn::Parameter& p = *params_[i];
    DITTO_CHECK(t.defined() && t.dtype() == DType::f32 && t.shape() == p.data.shape(), call,
                ": state: tensor '", name, "': expected ", shape_str(p.data.shape()),
                " f32 (the master of parameter ", i, " '", p.name, "'), got ",
                t.defined() ? t.str() : std::string("an undefined tensor"));
    found[i] = &t;
  }
  for (std::size_t i = 0; i < found.size(); ++i)
    DITTO_CHECK(found[i] != nullptr, call, ": state: tensor 'master.", i, "' (the master of '",
                params_[i]->name, "') is missing");
  inner_->load_state_dict(inner);  // checks before it changes anything
  if (scaler_) scaler_->load_state_dict(scaler_state);
  for (std::size_t i = 0; i < masters_.size(); ++i) masters_[i]->data.copy_(*found[i]);
  grads_ = Grads::none;
  grad_scale_.reset();
}

}  // namespace ditto::optim
