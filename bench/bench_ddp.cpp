// bench_ddp: DistributedDataParallel (a host thread per rank) against DataParallel, and DDP's
// bucket all_reduce overlapping backward against all_reduce after backward, in the same run.
//
//   build/bin/bench_ddp [--quick] [--predict-only] [--help] [--version]
//
// Part 1, predicted (the simulator's cost model, backend_sim/cost_model.h): DDP's step time in
// virtual time on 8 simulated GPUs (H100 SXM on NVLink, and on PCIe 4 where communication is
// slower), with overlap and without, fast mode. Virtual time does not depend on the machine's
// load, so these ratios are what overlap buys on that cluster by the model's account. Printed
// beside them: per step, the busiest device's kernel time (compute) and collective time (comm);
// overlap can at most hide the shorter of the two, so the ratio is bounded by
// (compute + comm) / max(compute, comm). It runs dry (Note [Dry run], sim_backend.h): priced,
// not computed, in seconds, and on the paths the CUDA backend runs (its multi-tensor optimizer
// kernels among them). It used to compute every GEMM on the CPU: the 4096-wide and the deep
// MLP at batch 1024 on 8 ranks, 12 runs, minutes on a loaded machine, with --quick too (tester
// D, D3). --predict-only prints this part alone (docs/performance.md's table, checked by
// ctest Docs.performance).
//
// Part 2, wall clock:
// Model: MLP 784-1024-1024-10 (1.86 M parameters, 7.4 MB of gradients), global batch 256,
// synthetic data, SGD, 4 simulated devices, bitwise mode. Rows: samples/s (median of several
// repetitions) and the ratio to the first row. On the simulator without a cost model the overlap
// is wall-clock concurrency of each device's compute and communication worker threads, so it
// only shows when the machine has cores to spare: compare ratios, not absolute numbers.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "core/comm/communicator.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "examples/cli_common.h"
#include "tests/train_step.h"

using namespace ditto;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRanks = 4;
constexpr std::int64_t kBatch = 256;
const std::vector<std::int64_t> kSizes{784, 1024, 1024, 10};

Tensor random_x(std::uint64_t seed) { return test::random_x(kBatch, kSizes[0], seed, 78); }

Tensor random_y(std::uint64_t seed) { return test::random_y(kBatch, 10, seed, 79); }

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
  auto step = [&] { test::train_step(dp, ce, x, y, &opt); };
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
  double seconds = 0;
  test::rethrow_first(test::run_comm_ranks(kRanks, co, [&](int r, Communicator& comm) {
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
    auto step = [&] { test::train_step(ddp, ce, {xr}, kBatch, yr, &opt); };
    step();
    current_stream(comm.device()).synchronize();
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) step();
    current_stream(comm.device()).synchronize();
    if (r == 0) seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }));
  return seconds;
}

// ---- predicted (cost model) ------------------------------------------------------------------

struct Prediction {
  double step = 0;     ///< virtual seconds per step (latest end over all devices)
  double compute = 0;  ///< per step, the busiest device's kernel time
  double comm = 0;     ///< per step, the busiest device's collective time
};

/// Virtual time of `steps` DDP steps (fast mode, SGD, cross-entropy) on `ranks` devices of
/// `device` linked by `interconnect`: a rank per host thread, all ranks synchronised before the
/// cost model's totals are read.
Prediction predict_ddp(const std::vector<std::int64_t>& sizes, std::int64_t batch, int ranks,
                       const std::string& device, const std::string& interconnect, bool overlap,
                       int steps) {
  BackendOptions bo;
  bo.device_count = ranks;
  bo.dry_run = true;  // virtual time only: the data is never read
  auto* sb = init_backend("sim", bo).extension<sim::SimBackend>();
  sim::ClusterSpec c = sb->cost_model().cluster();
  c.device = sim::device_profile(device);
  c.interconnect = sim::interconnect_profile(interconnect);
  c.nodes = 1;
  c.devices_per_node = ranks;
  sb->cost_model().configure(c);

  std::vector<float> xv(static_cast<std::size_t>(batch * sizes.front()));
  for (std::size_t i = 0; i < xv.size(); ++i)
    xv[i] = uniform(3, stream_id(kStreamSynthetic, 80), i, -1, 1);
  std::vector<std::int64_t> yv(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<std::int64_t>(i) % sizes.back();
  const Tensor x = Tensor::from_vector(xv, {batch, sizes.front()});
  const Tensor y = Tensor::from_vector(yv, {batch});

  CommOptions co;
  co.determinism = Determinism::fast;
  sim::CostTotals before, after;
  int phase = 0;
  auto read = [&]() noexcept { (phase++ == 0 ? before : after) = sb->cost_model().totals(); };
  std::barrier sync_point(ranks, read);
  test::rethrow_first(test::run_comm_ranks(ranks, co, [&](int, Communicator& comm) {
    auto model = nn::mlp(sizes, comm.device(), 0);
    model->set_input_requires_grad(false);
    parallel::DistributedDataParallelOptions o;
    o.overlap = overlap;
    parallel::DistributedDataParallel ddp(*model, comm, o);
    nn::CrossEntropyLoss ce;
    optim::SGD opt(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    const auto [lo, hi] = ddp.local_rows(batch);
    Tensor xr = x.narrow(lo, hi - lo).to(comm.device());
    Tensor yr = y.narrow(lo, hi - lo).to(comm.device());
    auto step = [&] { test::train_step(ddp, ce, xr, yr, &opt); };
    step();  // warm-up
    current_stream(comm.device()).synchronize();
    sync_point.arrive_and_wait();  // every rank idle: `before`
    for (int s = 0; s < steps; ++s) step();
    current_stream(comm.device()).synchronize();
    sync_point.arrive_and_wait();  // `after`
  }));
  Prediction p;
  p.step = sim::to_seconds(after.now - before.now) / steps;
  for (int d = 0; d < ranks; ++d) {
    const auto i = static_cast<std::size_t>(d);
    p.compute = std::max(p.compute, sim::to_seconds(after.compute[i] - before.compute[i]) / steps);
    p.comm = std::max(p.comm, sim::to_seconds(after.comm[i] - before.comm[i]) / steps);
  }
  return p;
}

void run_predictions() {
  struct Case {
    std::vector<std::int64_t> sizes;
    std::int64_t batch;
  };
  // The MLP; a wide one (two 64 MiB weight buckets); a deeper one (7 weight layers of
  // 16 MiB, then the output), where every bucket but the last has backward left to hide behind.
  const std::vector<Case> cases{{{784, 1024, 1024, 10}, 256},
                                {{4096, 4096, 4096, 10}, 1024},
                                {{2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 10}, 1024}};
  const int ranks = 8,
            steps = 1;  // virtual time is deterministic: every step after the warm-up is alike
  std::printf(
      "bench_ddp predicted: DDP step time in virtual time (cost model, dry run), %d ranks, fast "
      "mode, buckets 25 MiB (first 1 MiB), %d steps after a warm-up\n",
      ranks, steps);
  std::printf("%-22s %6s %-20s %11s %11s %7s %11s %11s %7s\n", "model", "batch", "cluster",
              "overlap_ms", "serial_ms", "ratio", "compute_ms", "comm_ms", "bound");
  for (const Case& k : cases) {
    std::string name;
    for (std::int64_t s : k.sizes) {
      if (!name.empty()) name += '-';
      name += std::to_string(s);
    }
    if (name.size() > 22)
      name = std::to_string(k.sizes.front()) + "-" + std::to_string(k.sizes[1]) + "x" +
             std::to_string(k.sizes.size() - 2) + "-" + std::to_string(k.sizes.back());
    for (const char* ic : {"nvlink", "pcie4"}) {
      const Prediction on = predict_ddp(k.sizes, k.batch, ranks, "h100-sxm", ic, true, steps);
      const Prediction off = predict_ddp(k.sizes, k.batch, ranks, "h100-sxm", ic, false, steps);
      const double bound = (off.compute + off.comm) / std::max(off.compute, off.comm);
      std::printf("%-22s %6lld %-20s %11.4f %11.4f %7.3f %11.4f %11.4f %7.3f\n", name.c_str(),
                  static_cast<long long>(k.batch), (std::string("8 x h100-sxm ") + ic).c_str(),
                  on.step * 1e3, off.step * 1e3, off.step / on.step, off.compute * 1e3,
                  off.comm * 1e3, bound);
      std::fflush(stdout);
    }
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_ddp: DistributedDataParallel against DataParallel, and DDP's overlap of "
               "all_reduce with backward (predicted and wall clock)"};
  bool quick = false, predict_only = false;
  app.add_flag("--quick", quick, "fewer sizes, steps and repetitions (a smoke run)");
  app.add_flag("--predict-only", predict_only,
               "only the predicted part (virtual time, a dry run: seconds)");
  ditto_cli::add_version(app, "bench_ddp");
  if (const std::optional<int> rc = ditto_cli::parse(app, argc, argv, "bench_ddp")) return *rc;
  const int steps = quick ? 3 : 10, reps = quick ? 1 : 5;
  run_predictions();
  if (predict_only) return 0;
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
  std::vector<double> sps(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    sps[i] = steps * kBatch / median(times[i]);
    if (i == 0) base = sps[i];
    std::printf("%-36s %12.0f %8.2f\n", rows[i].name, sps[i], sps[i] / base);
  }
  std::printf(
      "overlap speed-up, wall clock (samples/s with overlap / without): bucket 25 MiB %.3f, "
      "bucket 1 MiB %.3f\n",
      sps[1] / sps[4], sps[2] / sps[3]);
  return 0;
}
