// ditto-bench: collectives (nccl-tests style), a STREAM-style copy probe and a trainer benchmark,
// in one binary, with optional CSV output.
//
//   build/bin/ditto-bench [all|collectives|stream|trainer|gpt] [options]   (--help lists them)
//
// collectives  all_reduce, all_gather, reduce_scatter, broadcast, reduce (and on request
//              all_to_all, sendrecv, gather, scatter: --ops) over 2, 4, 8 ranks for sizes
//              4 KiB .. 256 MiB, out-of-place and in-place, in any dtype (-d/--dtype, nccl-tests'
//              names; default float), on the simulator (and on CUDA when --backend cuda or auto
//              finds a GPU). Columns as nccl-tests prints them: time (us per call), algbw = size /
//              time, busbw = algbw * factor, #wrong (elements that differ from the expected result
//              after one checked call). Sizes and busbw factors follow nccl-tests'
//              doc/PERFORMANCE.md (bench/bench_collectives.h lists them).
//              memGB/s: the memory traffic an in-memory collective cannot avoid / time (all_reduce:
//              2*N*S / t), to compare with the STREAM copy bandwidth.
// stream       STREAM copy (a[i] = b[i], f64) on all cores, arrays of max(64 MiB, 4 x LLC)
// (STREAM's
//              rule), best of 5; bandwidth counts read + write bytes (STREAM's convention).
// trainer      samples/s of SGD(momentum 0.9) with cross-entropy for the seed model 10-5-2 (batch
//              32) and an MLP 784-1024-1024-10 (batch 256), synthetic host data, 1 and 4 simulated
//              devices, fast and bitwise, for both trainers (--trainers): dp = DataParallel, ddp =
//              DistributedDataParallel with a host thread per rank (as `ditto-train --trainer
//              ddp`). Every step reads the loss (item()). The median of 3 timed runs of >=
//              --seconds.
// gpt          tokens/s of nanoGPT's CPU configuration (bench_gpt.h); not part of `all`.
//
// Each figure is wall-clock on whatever else the machine runs: compare ratios from one run.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_gemm.h"
#include "bench/bench_collectives.h"
#include "bench/bench_common.h"
#include "bench/bench_gpt.h"
#include "bench/bench_mlp.h"
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
using bench::Clock;
using bench::CollConfig;
using bench::Csv;
using bench::kMaxSeconds;
using bench::parse_bytes;
using bench::seconds_since;

namespace {

// ---- STREAM copy ----------------------------------------------------------------------------

struct StreamResult {
  int threads = 0;
  std::size_t bytes_per_array = 0;
  double copy_gbps = 0;  // 1e9 bytes/s, read + write
};

std::size_t default_stream_bytes() {
  long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
  std::size_t b =
      std::max<std::size_t>(std::size_t(64) << 20, 4 * static_cast<std::size_t>(std::max(0L, llc)));
  return std::min<std::size_t>(b, std::size_t(2) << 30);
}

StreamResult run_stream(int threads, std::size_t bytes, int reps) {
  const std::size_t n = bytes / sizeof(double);
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]);
  auto split = [&](int t) {
    return std::pair<std::size_t, std::size_t>(n * t / threads, n * (t + 1) / threads);
  };
  auto parallel = [&](const std::function<void(std::size_t, std::size_t)>& fn) {
    std::vector<std::thread> ts;
    for (int t = 1; t < threads; ++t)
      ts.emplace_back([&, t] {
        auto [lo, hi] = split(t);
        fn(lo, hi);
      });
    auto [lo, hi] = split(0);
    fn(lo, hi);
    for (auto& t : ts) t.join();
  };
  // First touch by the thread that later copies the range (NUMA placement, as STREAM does).
  parallel([&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      a[i] = 1.0;
      b[i] = 2.0;
    }
  });
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    parallel([&](std::size_t lo, std::size_t hi) {
      double* __restrict__ dst = a.get();
      const double* __restrict__ src = b.get();
      for (std::size_t i = lo; i < hi; ++i) dst[i] = src[i];
    });
    best = std::min(best, seconds_since(t0));
  }
  if (a[n / 2] != 2.0) throw Error("ditto-bench stream: copy check failed");
  return {threads, bytes, 2.0 * static_cast<double>(n * sizeof(double)) / best / 1e9};
}

// ---- trainer --------------------------------------------------------------------------------

struct TrainerConfig {
  std::vector<std::string> models = {"10-5-2", "784-1024-1024-10"};
  std::vector<int> devices_list = {1, 4};
  std::vector<std::string> modes = {"fast", "bitwise"};
  std::vector<std::string> trainers = {"dp", "ddp"};
  double seconds = 1.0;
  int reps = 3;
};

std::vector<std::int64_t> parse_model(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, '-')) {
    try {
      out.push_back(std::stoll(part));
    } catch (...) {
      throw InvalidArgument("ditto-bench: --models: expected layer sizes like 784-1024-10, got '" +
                            s + "'");
    }
  }
  DITTO_CHECK(out.size() >= 2, "ditto-bench: --models: expected at least two sizes, got '", s, "'");
  return out;
}

/// The batch the issue fixes for a model: 32 for the seed's 10-5-2, else 256.
std::int64_t default_batch(const std::vector<std::int64_t>& sizes) {
  return sizes.front() <= 64 ? 32 : 256;
}

/// Synthetic batch on the host: x uniform in [-1, 1), y = row index mod classes.
std::pair<Tensor, Tensor> synthetic_batch(const std::vector<std::int64_t>& sizes,
                                          std::int64_t batch) {
  std::vector<float> xv(static_cast<std::size_t>(batch * sizes.front()));
  for (std::size_t i = 0; i < xv.size(); ++i)
    xv[i] = uniform(1, stream_id(kStreamSynthetic, 91), i, -1, 1);
  std::vector<std::int64_t> yv(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<std::int64_t>(i) % sizes.back();
  return {Tensor::from_vector(xv, {batch, sizes.front()}), Tensor::from_vector(yv, {batch})};
}

/// DataParallel samples/s.
double trainer_samples_per_s(const std::vector<std::int64_t>& sizes, std::int64_t batch, int n_dev,
                             Determinism mode, double seconds, int reps) {
  bench::DpMlp trainer(sizes, n_dev, mode);
  const auto xy = synthetic_batch(sizes, batch);
  // A trainer reads the loss every step (and this synchronises).
  auto step = [&] { (void)trainer.step(xy.first, xy.second); };
  return static_cast<double>(batch) * bench::steps_per_s(step, seconds, reps);
}

/// DistributedDataParallel samples/s: a host thread per rank, each running its own loop on its
/// rows of the global batch (local_rows), as `ditto-train --trainer ddp` does. The ranks agree
/// on the step count and the clock through a barrier.
double trainer_samples_per_s_ddp(const std::vector<std::int64_t>& sizes, std::int64_t batch,
                                 int n_dev, Determinism mode, double seconds, int reps) {
  const auto xy = synthetic_batch(sizes, batch);
  const Tensor &x = xy.first, &y = xy.second;
  CommOptions co;
  co.determinism = mode;
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", n_dev), co);
  auto body = [&](Communicator& comm,
                  const std::function<void(const std::function<void()>&)>& timed) {
    auto model = nn::mlp(sizes, comm.device(), 0);
    model->set_input_requires_grad(false);
    parallel::DistributedDataParallelOptions o;
    o.average_gradients = false;  // the loss divides by the global batch (bitwise = dp's bits)
    parallel::DistributedDataParallel ddp(*model, comm, o);
    nn::CrossEntropyLoss loss;
    loss.set_determinism(mode);
    loss.set_global_batch(batch);
    optim::SGD opt(model->parameters(), {.lr = 0.01f, .momentum = 0.9f});
    const auto [lo, hi] = ddp.local_rows(batch);
    const Tensor xr = x.narrow(lo, hi - lo), yr = y.narrow(lo, hi - lo);
    timed([&] {
      Tensor l = test::train_step(ddp, loss, {xr}, batch, yr, &opt);
      (void)l.item();  // this rank's loss, every step (and this synchronises)
    });
  };
  return static_cast<double>(batch) * bench::steps_per_s_ranks(comms, body, seconds, reps);
}

void run_trainer(const TrainerConfig& cfg, Csv& csv) {
  int max_dev = *std::max_element(cfg.devices_list.begin(), cfg.devices_list.end());
  BackendOptions bo;
  bo.device_count = std::max(max_dev, 1);
  init_backend("sim", bo);
  std::printf(
      "#\n# trainer: dp = DataParallel, ddp = DistributedDataParallel (a thread per rank); "
      "SGD(lr 0.01, momentum 0.9) + cross-entropy, synthetic data, sim backend, median of %d "
      "runs of >= %.2f s\n#\n",
      cfg.reps, cfg.seconds);
  std::printf("# %-18s %6s %8s %9s %8s %12s %10s\n", "model", "batch", "devices", "mode", "trainer",
              "samples/s", "steps/s");
  for (const std::string& t : cfg.trainers)
    DITTO_CHECK(t == "dp" || t == "ddp", "ditto-bench: --trainers: expected dp or ddp, got '", t,
                "'");
  for (const std::string& m : cfg.models) {
    std::vector<std::int64_t> sizes = parse_model(m);
    const std::int64_t batch = default_batch(sizes);
    for (int d : cfg.devices_list) {
      for (const std::string& mode : cfg.modes) {
        DITTO_CHECK(mode == "fast" || mode == "bitwise",
                    "ditto-bench: --modes: expected fast or bitwise, got '", mode, "'");
        const Determinism det = mode == "bitwise" ? Determinism::bitwise : Determinism::fast;
        for (const std::string& t : cfg.trainers) {
          const double sps =
              t == "dp" ? trainer_samples_per_s(sizes, batch, d, det, cfg.seconds, cfg.reps)
                        : trainer_samples_per_s_ddp(sizes, batch, d, det, cfg.seconds, cfg.reps);
          const char* trainer = t == "dp" ? "DataParallel" : "DDP";
          std::printf("  %-18s %6lld %8d %9s %8s %12.1f %10.2f\n", m.c_str(),
                      static_cast<long long>(batch), d, mode.c_str(), t.c_str(), sps,
                      sps / static_cast<double>(batch));
          std::fflush(stdout);
          csv.row(m, batch, d, mode, trainer, sps, sps / static_cast<double>(batch));
        }
      }
    }
  }
}

std::string csv_path(const std::string& dir, const char* name) {
  return dir.empty() ? std::string() : dir + "/" + name;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"ditto-bench: collectives (nccl-tests style), STREAM copy probe, trainer samples/s"};
  std::string csv_dir;
  app.add_option("--csv-dir", csv_dir,
                 "Append results to DIR/collectives.csv, stream.csv, trainer.csv, gpt.csv");
  bool quick = false;
  app.add_flag("--quick", quick,
               "Smaller sweep (sizes up to 16M, shorter timings) for a smoke run");
  app.require_subcommand(0, 1);
  // --csv-dir and --quick after the subcommand too (the README's `ditto-bench collectives
  // --csv-dir DIR`): a subcommand hands the options it does not know to this app.
  app.fallthrough();
  ditto_cli::add_version(app, "ditto-bench");

  CollConfig cc;
  auto add_coll = [&](CLI::App* sc) {
    sc->add_option("--backend", cc.backend,
                   "sim, cuda, or auto (sim, plus cuda when a GPU is usable)");
    sc->add_option("--ops", cc.ops,
                   "Collectives to run: all_reduce, all_gather, reduce_scatter, broadcast, reduce, "
                   "all_to_all (alltoall), sendrecv, gather, scatter")
        ->delimiter(',');
    sc->add_option("-d,--dtype", cc.dtypes,
                   "Element types (nccl-tests -d): float, half, bfloat16, double, int8, uint8, "
                   "int32, uint32, int64, uint64, f8e4m3, f8e5m2, ditto's names (f32, bf16, ...), "
                   "or all")
        ->delimiter(',');
    // nccl-tests' short options where ditto has the setting (-g: the ranks one thread drives).
    sc->add_option("-g,--ranks", cc.ranks,
                   "Rank counts, all driven by one thread (nccl-tests -g, GPUs per thread)")
        ->delimiter(',');
    sc->add_option("-b,--min-bytes", cc.min_bytes, "Smallest size (nccl-tests -b)");
    sc->add_option("-e,--max-bytes", cc.max_bytes, "Largest size (nccl-tests -e)");
    sc->add_option("-f,--step-factor", cc.step_factor, "Size multiplier (nccl-tests -f)");
    sc->add_option("--place", cc.place, "out, in or both (out-of-place and in-place)");
    sc->add_option("--determinism", cc.determinism, "fast or bitwise communicators");
    sc->add_option("--coll-seconds", cc.seconds, "Timed seconds per size and placement");
    sc->add_option("-n,--max-iters", cc.max_iters,
                   "Most timed calls per size (nccl-tests -n; fewer once --coll-seconds is spent)");
    sc->add_option("-w,--warmup-iters", cc.warmup,
                   "Untimed calls before the timed ones, per size (nccl-tests -w)");
  };
  StreamResult sr;
  int stream_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string stream_bytes;
  auto add_stream = [&](CLI::App* sc) {
    sc->add_option("--stream-threads", stream_threads,
                   "Threads of the copy probe (default: all cores)");
    sc->add_option("--stream-bytes", stream_bytes, "Bytes per array (default max(64M, 4 x LLC))");
  };
  TrainerConfig tc;
  auto add_trainer = [&](CLI::App* sc) {
    sc->add_option("--models", tc.models, "Models as layer sizes (batch 32 for 10-5-2, else 256)")
        ->delimiter(',');
    sc->add_option("--devices", tc.devices_list, "Device counts")->delimiter(',');
    sc->add_option("--modes", tc.modes, "fast, bitwise")->delimiter(',');
    sc->add_option("--trainers", tc.trainers, "dp (DataParallel), ddp (DistributedDataParallel)")
        ->delimiter(',');
    sc->add_option("--train-seconds", tc.seconds, "Seconds per timed run");
  };
  CLI::App* all = app.add_subcommand("all", "stream, collectives and trainer (the default)");
  CLI::App* coll = app.add_subcommand("collectives", "nccl-tests-style collectives sweep");
  CLI::App* strm = app.add_subcommand("stream", "STREAM copy bandwidth on all cores");
  CLI::App* trn = app.add_subcommand("trainer", "DataParallel and DDP samples/s");
  bench::GptBenchConfig gc;
  CLI::App* gpt = app.add_subcommand("gpt", "GPT tokens/s (nanoGPT's CPU config), dp and ddp");
  bench::add_gpt_options(gpt, gc);
  add_coll(all);
  add_stream(all);
  add_trainer(all);
  add_coll(coll);
  add_stream(strm);
  add_trainer(trn);
  if (const std::optional<int> rc = ditto_cli::parse(app, argc, argv, "ditto-bench")) return *rc;

  const bool do_all = app.get_subcommands().empty() || all->parsed();
  if (quick) {
    if (cc.max_bytes == "256M") cc.max_bytes = "16M";
    cc.seconds = 0.02;
    tc.seconds = gc.seconds = 0.3;
  }
  // Every option is checked before any work, so a bad value costs no sweep.
  if (do_all || coll->parsed()) {
    bench::check_coll_config(cc);
  }
  if (gpt->parsed()) bench::check_gpt_config(gc);
  if (do_all || trn->parsed())
    DITTO_CHECK(std::isfinite(tc.seconds) && tc.seconds > 0 && tc.seconds <= kMaxSeconds,
                "ditto-bench: --train-seconds: expected a value > 0 and <= ", kMaxSeconds, ", got ",
                tc.seconds);
  if (!csv_dir.empty()) {  // made here, so a sweep's CSV files have somewhere to go
    std::error_code ec;
    std::filesystem::create_directories(csv_dir, ec);
    DITTO_CHECK(!ec && std::filesystem::is_directory(csv_dir),
                "ditto-bench: --csv-dir: cannot "
                "create directory '",
                csv_dir, "': ", ec ? ec.message() : "not a directory");
  }
  const auto t_start = Clock::now();
  std::printf("# ditto-bench: %u hardware threads; simulator fast-mode GEMM: %s\n",
              std::thread::hardware_concurrency(), sim::gemm_fast_library());
  int rc = 0;
  if (do_all || strm->parsed()) {
    Csv csv(csv_path(csv_dir, "stream.csv"), "threads,bytes_per_array,copy_GBps");
    const std::size_t b =
        stream_bytes.empty() ? default_stream_bytes() : parse_bytes(stream_bytes, "--stream-bytes");
    DITTO_CHECK(stream_threads >= 1, "ditto-bench: --stream-threads: expected >= 1, got ",
                stream_threads);
    sr = run_stream(stream_threads, b, 5);
    std::printf(
        "# stream copy: threads=%d bytes_per_array=%zu copy=%.2f GB/s (read+write, best of 5)\n",
        sr.threads, sr.bytes_per_array, sr.copy_gbps);
    csv.row(sr.threads, sr.bytes_per_array, sr.copy_gbps);
  }
  if (do_all || coll->parsed()) {
    Csv csv(csv_path(csv_dir, "collectives.csv"), bench::kCollCsvHeader);
    rc |= bench::run_collectives(cc, csv);
  }
  if (do_all || trn->parsed()) {
    Csv csv(csv_path(csv_dir, "trainer.csv"),
            "model,batch,devices,determinism,trainer,samples_per_s,steps_per_s");
    run_trainer(tc, csv);
  }
  if (gpt->parsed()) bench::run_gpt(gc, csv_path(csv_dir, "gpt.csv"));
  std::printf("# ditto-bench: done in %.2f s\n", seconds_since(t_start));
  return rc;
} catch (const std::exception& e) {
  const std::string what = e.what();
  // "ditto-bench: error: <option>: expected ..., got ...", as ditto-train's errors.
  const std::string prefix = "ditto-bench: ";
  std::fflush(stdout);
  std::fprintf(stderr, "ditto-bench: error: %s\n",
               what.rfind(prefix, 0) == 0 ? what.c_str() + prefix.size() : what.c_str());
  return 1;
}
