// The training step the tests and the benchmarks (bench/) write: forward, the loss, zero the
// gradients, backward (DataParallel and DistributedDataParallel reduce the gradients over the
// devices or ranks in it), the optimizer's step; seeded synthetic batches (random_x, random_y);
// and a thread per rank of a communicator, as DistributedDataParallel and ZeRO run. No gtest here:
// bench/ includes this header too (tests/test_util.h has the test-side checks of the ranks'
// errors).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/loss.h"
#include "core/numerics/random.h"
#include "core/optim/optimizer.h"
#include "core/runtime/tensor.h"

namespace ditto::test {

/// A host batch of features [rows, cols] f32, uniform in [-1, 1) from Philox(seed,
/// stream_id(kStreamSynthetic, sub), element index).
inline Tensor random_x(std::int64_t rows, std::int64_t cols, std::uint64_t seed,
                       std::uint64_t sub = 21) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(seed, stream_id(kStreamSynthetic, sub), i, -1, 1);
  return Tensor::from_vector(v, {rows, cols});
}

/// A host batch of labels [rows] i64 in [0, classes): philox_u32(seed,
/// stream_id(kStreamSynthetic, sub), row) % classes.
inline Tensor random_y(std::int64_t rows, std::int64_t classes, std::uint64_t seed,
                       std::uint64_t sub = 22) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = philox_u32(seed, stream_id(kStreamSynthetic, sub), i) % classes;
  return Tensor::from_vector(v, {rows});
}

/// One training step of `model` (an nn::Module, parallel::DataParallel or
/// parallel::DistributedDataParallel: whatever has forward(Tensor) and backward(Tensor)) on input
/// `x` and target `y` (moved to the output's device): forward, loss.forward, then
/// opt->zero_grad(true), model.backward(loss.backward()) and opt->step(). Without an optimizer,
/// only forward and backward (the gradients as a backward leaves them). Returns the loss, a 0-dim
/// tensor on the output's device, unread (nothing waits for the devices).
template <typename Model>
Tensor train_step(Model& model, nn::Loss& loss, const Tensor& x, const Tensor& y,
                  optim::Optimizer* opt = nullptr) {
  Tensor out = model.forward(x);
  Tensor l = loss.forward(out, y.to(out.device()));
  if (opt) opt->zero_grad(true);
  model.backward(loss.backward());
  if (opt) opt->step();
  return l;
}

/// The same step with DistributedDataParallel's forward(inputs, global_batch): this rank's rows
/// of a global batch of `global_batch` rows (Note [DDP loss scaling]).
template <typename Model>
Tensor train_step(Model& model, nn::Loss& loss, const std::vector<Tensor>& inputs,
                  std::int64_t global_batch, const Tensor& y, optim::Optimizer* opt) {
  Tensor out = model.forward(inputs, global_batch);
  Tensor l = loss.forward(out, y.to(out.device()));
  if (opt) opt->zero_grad(true);
  model.backward(loss.backward());
  if (opt) opt->step();
  return l;
}

/// Runs fn(rank, comm) on one std::thread per rank of a new communicator over
/// `backend`:0..world-1 (options `co`) and returns each rank's exception (null where fn returned).
inline std::vector<std::exception_ptr> run_comm_ranks(
    int world, const CommOptions& co, const std::function<void(int, Communicator&)>& fn,
    const std::string& backend = "sim") {
  std::vector<Communicator> comms = Communicator::init_all(devices(backend, world), co);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, comms[static_cast<std::size_t>(r)]);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// Rethrows the lowest rank's exception of run_comm_ranks, if any.
inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// The message of an exception (what()); empty for none or one not derived from std::exception.
inline std::string what_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
  }
  return "";
}

}  // namespace ditto::test
