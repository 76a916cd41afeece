// nanoGPT's learning-rate schedule (train.py get_lr): linear warmup, cosine decay to min_lr,
// then min_lr.
#pragma once

#include <cstdint>

namespace ditto::optim {

/// nanoGPT's train.py get_lr(it), for iteration it >= 0:
///   it < warmup_iters:   learning_rate * (it + 1) / (warmup_iters + 1)
///   it > lr_decay_iters: min_lr
///   else:                decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
///                        min_lr + 0.5 * (1 + cos(pi * decay_ratio)) * (learning_rate - min_lr)
/// in double, as Python evaluates it (std::cos is the C library's cos, which Python's math.cos
/// calls). lr_decay_iters == warmup_iters (an empty decay, a division by zero in nanoGPT) gives
/// min_lr from warmup_iters on, the value the formula takes at decay_ratio = 1. Throws
/// InvalidArgument for it < 0, warmup_iters < 0, lr_decay_iters < warmup_iters, or a rate that
/// is negative or not finite.
double nanogpt_lr(std::int64_t it, double learning_rate, std::int64_t warmup_iters,
                  std::int64_t lr_decay_iters, double min_lr);

/// nanoGPT's schedule settings, with the defaults of its train.py (GPT-2 on OpenWebText);
/// config/train_shakespeare_char.py uses learning_rate 1e-3, warmup_iters 100,
/// lr_decay_iters 5000 (= max_iters), min_lr 1e-4.
struct NanoGPTSchedule {
  double learning_rate = 6e-4;
  std::int64_t warmup_iters = 2000;
  std::int64_t lr_decay_iters = 600000;
  double min_lr = 6e-5;
  bool decay_lr = true;  ///< false: learning_rate at every iteration (train.py's decay_lr)

  /// The rate of iteration it: nanogpt_lr(...) or, without decay_lr, learning_rate (throws as
  /// nanogpt_lr does).
  double operator()(std::int64_t it) const;
};

}  // namespace ditto::optim
