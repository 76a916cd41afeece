// nanoGPT's get_lr, with argument checks.
#include "core/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/base/error.h"

namespace ditto::optim {

namespace {
void check_rate(const char* name, double v) {
  DITTO_CHECK(std::isfinite(v) && v >= 0.0, "optim::nanogpt_lr: ", name,
              ": expected a finite value >= 0, got ", v);
}
}  // namespace

double nanogpt_lr(std::int64_t it, double learning_rate, std::int64_t warmup_iters,
                  std::int64_t lr_decay_iters, double min_lr) {
  DITTO_CHECK(it >= 0, "optim::nanogpt_lr: it: expected >= 0, got ", it);
  DITTO_CHECK(warmup_iters >= 0, "optim::nanogpt_lr: warmup_iters: expected >= 0, got ",
              warmup_iters);
  DITTO_CHECK(lr_decay_iters >= warmup_iters,
              "optim::nanogpt_lr: lr_decay_iters: expected >= ", "warmup_iters (", warmup_iters,
              "), got ", lr_decay_iters);
  check_rate("learning_rate", learning_rate);
  check_rate("min_lr", min_lr);
  // 1) linear warmup for warmup_iters steps
  if (it < warmup_iters)
    return learning_rate * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
  // 2) after lr_decay_iters, min_lr (also the end of an empty decay)
  if (it > lr_decay_iters || lr_decay_iters == warmup_iters) return min_lr;
  // 3) in between, cosine decay down to min_lr
  const double decay_ratio =
      static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
  return min_lr + coeff * (learning_rate - min_lr);
}

double NanoGPTSchedule::operator()(std::int64_t it) const {
  if (!decay_lr) {
    DITTO_CHECK(it >= 0, "optim::NanoGPTSchedule: it: expected >= 0, got ", it);
    return learning_rate;
  }
  return nanogpt_lr(it, learning_rate, warmup_iters, lr_decay_iters, min_lr);
}

}  // namespace ditto::optim
