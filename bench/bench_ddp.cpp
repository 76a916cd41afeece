// bench_ddp: DistributedDataParallel (a host thread per rank) against DataParallel, and DDP's
// bucket all_reduce overlapping backward against all_reduce after backward, in the same run.
//
//   build/bin/bench_ddp [--quick]
//
// Model: MLP 784-1024-1024-10 (1.86 M parameters, 7.4 MB of gradients), global batch 256,
// synthetic data, SGD, 4 simulated devices, bitwise mode. Rows: samples/s (median of several
// repetitions) and the ratio to the first row. On the simulator without a cost model the overlap
// is wall-clock concurrency of each device's compute and communication worker threads, so it
// only shows when the machine has cores to spare: compare ratios, not absolute numbers.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/communicator.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/random.h"

using namespace ditto;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRanks = 4;
constexpr std::int64_t kBatch = 256;
const std::vector<std::int64_t> kSizes{784, 1024, 1024, 10};

Tensor random_x(std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(kBatch * kSizes[0]));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed, stream_id(kStreamSynthetic, 78), i, -1, 1);
  return Tensor::from_vector(v, {kBatch, kSizes[0]});
}

Tensor random_y(std::uint64_t seed) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(kBatch));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = philox_u32(seed, stream_id(kStreamSynthetic, 79), i) % 10;
  return Tensor::from_vector(v, {kBatch});
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Seconds for `steps` DataParallel steps.
double time_dp(int steps, const Tensor& x, const Tensor& y) {
  auto devs = devices("sim", kRanks);
  auto model = nn::mlp(kSizes, devs[0], 0);
  model->set_input_requires_grad(false);
  parallel::DataParallelOptions o;
  o.determinism = Determinism::bitwise;
  parallel::DataParallel dp(*model, devs, o);
  nn::CrossEntropyLoss ce;
  ce.set_determinism(Determinism::bitwise);
  optim::SGD opt(model->parameters(), {});
  auto step = [&] {
    Tensor out = dp.forward(x);
    ce.forward(out, y.to(out.device()));
    opt.zero_grad(true);
    dp.backward(ce.backward());
    opt.step();
  };
  step();  // warm-up
  current_stream(devs[0]).synchronize();
  auto t0 = Clock::now();
  for (int s = 0; s < steps; ++s) step();
  current_stream(devs[0]).synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Seconds for `steps` DDP steps (rank 0's clock; the ranks run in lockstep).
double time_ddp(int steps, const Tensor& x, const Tensor& y, bool overlap, double cap_mb) {
  CommOptions co;
  co.determinism = Determinism::bitwise;
  auto comms = Communicator::init_all(devices("sim", kRanks), co);
  double seconds = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      Communicator& comm = comms[static_cast<std::size_t>(r)];
      auto model = nn::mlp(kSizes, comm.device(), 0);
      model->set_input_requires_grad(false);
      parallel::DistributedDataParallelOptions o;
      o.overlap = overlap;
      o.bucket_cap_mb = cap_mb;
      o.average_gradients = false;
      parallel::DistributedDataParallel ddp(*model, comm, o);
      nn::CrossEntropyLoss ce;
      ce.set_determinism(Determinism::bitwise);
      ce.set_global_batch(kBatch);
      optim::SGD opt(model->parameters(), {});
      const auto [lo, hi] = ddp.local_rows(kBatch);
      Tensor xr = x.narrow(lo, hi - lo).to(comm.device());
      Tensor yr = y.narrow(lo, hi - lo).to(comm.device());
      auto step = [&] {
        Tensor out = ddp.forward({xr}, kBatch);
        ce.forward(out, yr);
        opt.zero_grad(true);
        ddp.backward(ce.backward());
        opt.step();
      };
      step();
      current_stream(comm.device()).synchronize();
      auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) step();
      current_stream(comm.device()).synchronize();
      if (r == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int steps = quick ? 3 : 10, reps = quick ? 1 : 5;
  BackendOptions bo;
  bo.device_count = kRanks;
  init_backend("sim", bo);
  Tensor x = random_x(1), y = random_y(1);
  struct Row {
    const char* name;
    std::function<double()> run;
  };
  std::vector<Row> rows{
      {"DataParallel (1 controller thread)", [&] { return time_dp(steps, x, y); }},
      {"DDP overlap, bucket 25 MiB", [&] { return time_ddp(steps, x, y, true, 25.0); }},
      {"DDP overlap, bucket 1 MiB", [&] { return time_ddp(steps, x, y, true, 1.0); }},
      {"DDP no overlap, bucket 1 MiB", [&] { return time_ddp(steps, x, y, false, 1.0); }},
      {"DDP no overlap, bucket 25 MiB", [&] { return time_ddp(steps, x, y, false, 25.0); }},
  };
  std::printf("bench_ddp: MLP 784-1024-1024-10, batch %lld, %d simulated devices, bitwise, %d "
              "steps x %d reps (median); machine threads: %u\n",
              static_cast<long long>(kBatch), kRanks, steps, reps,
              std::thread::hardware_concurrency());
  std::printf("%-36s %12s %8s\n", "trainer", "samples/s", "ratio");
  std::vector<std::vector<double>> times(rows.size());
  for (int rep = 0; rep < reps; ++rep)  // interleaved, so load changes hit every row alike
    for (std::size_t i = 0; i < rows.size(); ++i) times[i].push_back(rows[i].run());
  double base = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double sps = steps * kBatch / median(times[i]);
    if (i == 0) base = sps;
    std::printf("%-36s %12.0f %8.2f\n", rows[i].name, sps, sps / base);
  }
  return 0;
}
