// optim::GradScaler: torch.amp.GradScaler's checks, unscale_, step and update (Note [GradScaler]),
// and the exact all_finite check.
#include "core/optim/grad_scaler.h"

#include <cmath>
#include <cstdlib>

#include "core/base/error.h"
#include "core/optim/clip.h"
#include "core/runtime/ops.h"

namespace ditto::optim {

namespace {

bool finite_sum(const Tensor& s) { return std::isfinite(s.item()); }

// x - x summed: 0 when every element is finite, NaN otherwise (exact; Note [GradScaler]).
bool all_finite_elementwise(const Tensor& x, Determinism mode) {
  Tensor d = x.clone();
  ops::axpy_(-1.0f, x, d);
  return finite_sum(ops::sum(d, 1.0f, mode));
}

}  // namespace

bool all_finite(const Tensor& x, Determinism mode) {
  DITTO_CHECK(x.defined() && x.dtype() == DType::f32,
              "optim::all_finite: x: expected an f32 tensor, got ",
              x.defined() ? x.str() : std::string("an undefined tensor"));
  if (x.numel() == 0) return true;
  if (finite_sum(ops::sum_squares(x, mode))) return true;
  return all_finite_elementwise(x, mode);
}

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  const char* call = "optim::GradScaler";
  DITTO_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0.0, call,
              ": init_scale: expected a finite value > 0, got ", options.init_scale);
  DITTO_CHECK(std::isfinite(static_cast<float>(options.init_scale)), call,
              ": init_scale: expected a value that fits in f32, got ", options.init_scale);
  DITTO_CHECK(options.growth_factor > 1.0 && std::isfinite(options.growth_factor), call,
              ": growth_factor: The growth factor must be > 1.0 (and finite), got ",
              options.growth_factor);
  DITTO_CHECK(options.backoff_factor > 0.0 && options.backoff_factor < 1.0, call,
              ": backoff_factor: The backoff factor must be < 1.0 (and > 0), got ",
              options.backoff_factor);
  DITTO_CHECK(options.growth_interval >= 1, call, ": growth_interval: expected >= 1, got ",
              options.growth_interval);
  scale_ = static_cast<float>(options.init_scale);
}

Tensor GradScaler::loss_grad(const Device& device) const {
  return Tensor::from_vector(std::vector<float>{scale()}, {}, device);
}

bool GradScaler::unscale_(const std::vector<nn::Parameter*>& params, Determinism mode) {
  const char* call = "optim::GradScaler::unscale_";
  DITTO_CHECK(!unscaled_, call,
              ": unscale_() has already been called on this optimizer since the last update()");
  for (std::size_t i = 0; i < params.size(); ++i)
    DITTO_CHECK(params[i] != nullptr, call, ": params[", i, "]: expected a parameter, got null");
  unscaled_ = true;
  found_inf_ = false;
  if (!options_.enabled) return false;
  // torch: inv_scale = scale.double().reciprocal().float()
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  std::vector<Tensor> grads;
  for (nn::Parameter* p : params)
    if (p->grad.defined() && p->grad.numel() > 0) grads.push_back(p->grad);
  if (multi_tensor_unscale(grads)) {
    found_inf_ = unscale_multi(grads, inv_scale, mode);
    return found_inf_;
  }
  // Every check first (sums of squares enqueued on each grad's stream, then read), as torch checks
  // the values before multiplying.
  std::vector<Tensor> f32(grads.size());
  std::vector<Tensor> sums(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    f32[i] = grads[i].dtype() == DType::f32 ? grads[i] : ops::cast(grads[i], DType::f32);
    sums[i] = ops::sum_squares(f32[i], mode);
  }
  bool inf = false;
  for (std::size_t i = 0; i < grads.size() && !inf; ++i)
    if (!finite_sum(sums[i])) inf = !all_finite_elementwise(f32[i], mode);
  found_inf_ = reducer_ ? reducer_(inf) : inf;
  if (inv_scale != 1.0f) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].dtype() == DType::f32) {
        ops::scale_(grads[i], inv_scale);
      } else {
        ops::scale_(f32[i], inv_scale);
        Tensor back = ops::cast(f32[i], grads[i].dtype());
        grads[i].copy_(back);
      }
    }
  }
  return found_inf_;
}

bool GradScaler::multi_tensor_unscale(const std::vector<Tensor>& grads) {
  if (grads.empty()) return false;
  for (const Tensor& g : grads)
    if (g.dtype() != DType::f32 || !ops::has_multi_tensor_kernels(g.device())) return false;
  return true;
}

// torch's _amp_foreach_non_finite_check_and_unscale_: per device one ops::sum_squares_multi (the
// bits of the per-grad ops::sum_squares), one read of its [n] sums, the exact elementwise check
// only for a grad whose sum is not finite, then one ops::scale_multi_ (the bits of ops::scale_).
bool GradScaler::unscale_multi(std::vector<Tensor>& grads, float inv_scale, Determinism mode) {
  std::vector<const Tensor*> all;
  for (const Tensor& g : grads) all.push_back(&g);
  const std::vector<std::vector<std::size_t>> groups = detail::by_device(all);
  std::vector<Tensor> sums;  // enqueue on every device first, then read
  for (const auto& idx : groups) {
    std::vector<const Tensor*> xs;
    for (std::size_t i : idx) xs.push_back(all[i]);
    sums.push_back(ops::sum_squares_multi(xs, mode));
  }
  bool inf = false;
  for (std::size_t d = 0; d < groups.size() && !inf; ++d) {
    const std::vector<float> host = sums[d].to_vector<float>();
    for (std::size_t j = 0; j < groups[d].size() && !inf; ++j)
      if (!std::isfinite(host[j])) inf = !all_finite_elementwise(grads[groups[d][j]], mode);
  }
  const bool found = reducer_ ? reducer_(inf) : inf;
  if (inv_scale != 1.0f) {
    for (const auto& idx : groups) {
      std::vector<Tensor*> xs;  // handles that share the grads' storage
      for (std::size_t i : idx) xs.push_back(&grads[i]);
      ops::scale_multi_(xs, inv_scale);
    }
  }
  return found;
}

bool GradScaler::step(Optimizer& optimizer, Determinism mode) {
  if (!options_.enabled) {
    optimizer.step();
    unscaled_ = true;
    return true;
  }
  if (!unscaled_) unscale_(optimizer.parameters(), mode);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  DITTO_CHECK(unscaled_, "optim::GradScaler::update: no unscale_() or step() since the last "
                         "update()");
  unscaled_ = false;
  if (!options_.enabled) return;
  // torch's _amp_update_scale_cpu_kernel: float * double, stored as float.
  if (found_inf_) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * options_.backoff_factor);
    growth_tracker_ = 0;
    ++skipped_;
  } else {
    const std::int64_t successful = growth_tracker_ + 1;
    if (successful == options_.growth_interval) {
      const auto grown = static_cast<float>(static_cast<double>(scale_) * options_.growth_factor);
      if (std::isfinite(grown)) scale_ = grown;  // never past f32's range to inf
      growth_tracker_ = 0;
    } else {
      growth_tracker_ = successful;
    }
  }
  found_inf_ = false;
}

std::map<std::string, std::string> GradScaler::state_dict() const {
  return {{"enabled", options_.enabled ? "true" : "false"},
          {"scale", exact_str(scale_)},
          {"growth_factor", exact_str(options_.growth_factor)},
          {"backoff_factor", exact_str(options_.backoff_factor)},
          {"growth_interval", std::to_string(options_.growth_interval)},
          {"_growth_tracker", std::to_string(growth_tracker_)},
          {"skipped_steps", std::to_string(skipped_)}};
}

void GradScaler::load_state_dict(const std::map<std::string, std::string>& state) {
  const char* call = "optim::GradScaler::load_state_dict";
  const std::map<std::string, std::string> own = state_dict();
  for (const auto& [key, value] : own) {
    auto it = state.find(key);
    DITTO_CHECK(it != state.end(), call, ": state: expected the key '", key, "', got none");
    if (key == "scale" || key == "_growth_tracker" || key == "skipped_steps") continue;
    DITTO_CHECK(it->second == value, call, ": ", key, ": the state was saved with ", it->second,
                ", this scaler has ", value);
  }
  for (const auto& [key, value] : state)
    DITTO_CHECK(own.count(key), call, ": state: unexpected key '", key, "'");
  char* end = nullptr;
  const std::string& s = state.at("scale");
  const float scale = std::strtof(s.c_str(), &end);
  DITTO_CHECK(end && *end == '\0' && std::isfinite(scale) && scale > 0.0f, call,
              ": scale: expected a finite float > 0, got '", s, "'");
  std::int64_t tracker = 0, skipped = 0;
  try {
    std::size_t n1 = 0, n2 = 0;
    tracker = std::stoll(state.at("_growth_tracker"), &n1);
    skipped = std::stoll(state.at("skipped_steps"), &n2);
    DITTO_CHECK(n1 == state.at("_growth_tracker").size() && n2 == state.at("skipped_steps").size(),
                call, ": expected integers");
  } catch (const std::logic_error&) {
    throw InvalidArgument(
        ditto::detail::cat(call, ": _growth_tracker / skipped_steps: expected integers, got '",
                           state.at("_growth_tracker"), "' / '", state.at("skipped_steps"), "'"));
  }
  DITTO_CHECK(tracker >= 0 && tracker < options_.growth_interval && skipped >= 0, call,
              ": _growth_tracker: expected in [0, growth_interval), got ", tracker);
  scale_ = scale;
  growth_tracker_ = tracker;
  skipped_ = skipped;
  unscaled_ = false;
  found_inf_ = false;
}

namespace {
constexpr const char* kScalerPrefix = "grad_scaler.";
}  // namespace

void put_scaler_state(const GradScaler& scaler, std::map<std::string, std::string>& options) {
  for (const auto& [key, value] : scaler.state_dict()) options[kScalerPrefix + key] = value;
}

std::map<std::string, std::string> take_scaler_state(std::map<std::string, std::string>& options) {
  std::map<std::string, std::string> state;
  const std::string sp = kScalerPrefix;
  for (auto it = options.begin(); it != options.end();) {
    if (it->first.compare(0, sp.size(), sp) == 0) {
      state[it->first.substr(sp.size())] = it->second;
      it = options.erase(it);
    } else {
      ++it;
    }
  }
  return state;
}

}  // namespace ditto::optim
