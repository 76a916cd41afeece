// The MLP the trainer rows of bench_bitwise and ditto-bench time: DataParallel over simulated
// devices, cross-entropy and SGD with momentum, one tests/train_step.h step at a time, the loss
// read every step as a trainer reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/determinism.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "tests/train_step.h"

namespace ditto::bench {

/// nn::mlp(sizes) (seed 0) under DataParallel over sim:0..n_dev-1 in `mode`, with
/// CrossEntropyLoss and SGD (lr 0.01, momentum 0.9).
class DpMlp {
 public:
  DpMlp(const std::vector<std::int64_t>& sizes, int n_dev, Determinism mode)
      : devices_(devices("sim", n_dev)),
        model_(nn::mlp(sizes, devices_[0], 0)),
        dp_(*model_, devices_, options(mode)),
        opt_(model_->parameters(), {.lr = 0.01f, .momentum = 0.9f}) {
    loss_.set_determinism(mode);
  }
  /// One training step on batch (x, y) (host tensors); returns the loss, read (this waits for the
  /// devices).
  float step(const Tensor& x, const Tensor& y) {
    return test::train_step(dp_, loss_, x, y, &opt_).item();
  }

 private:
  static parallel::DataParallelOptions options(Determinism mode) {
    parallel::DataParallelOptions o;
    o.determinism = mode;
    return o;
  }
  std::vector<Device> devices_;
  std::unique_ptr<nn::Module> model_;
  parallel::DataParallel dp_;
  nn::CrossEntropyLoss loss_;
  optim::SGD opt_;
};

}  // namespace ditto::bench
