// bench_bitwise: bitwise against fast mode, measured in the same run on the same machine.
//
//   build/bin/bench_bitwise [--quick] [--gemm-only] [--csv FILE] [--help] [--version]
//
//   --gemm-only  only part 1 (bench/compare.sh runs this for issue 15's GEMM goal)
//   --csv FILE   also write every row to FILE: benchmark,bitwise,fast,unit,ratio
//
// 1. GEMM GFLOP/s on one simulated device for square sizes (C = A @ B, f32) and the MLP's forward
//    shapes (C = X @ W^T): canonical fma-chain kernel (bitwise) against the fast GEMM (OpenBLAS
//    when the build found it, else Eigen). Large products use the pool's idle threads (Note
//    [Intra-op parallelism]); DITTO_SIM_INTRA_OP=0 measures one thread.
// 2. Trainer samples/s: DataParallel + SGD over 4 simulated devices on (a) the digits MLP
//    64-128-10, batch 64, and (b) an MLP 784-1024-1024-10, batch 256, synthetic data.
// Each figure is the median of several repetitions (the GEMMs' two modes alternate, so that a
// slow spell of the machine falls on both); the ratio column is bitwise / fast.
// Timings are wall-clock on a shared machine: compare ratios, not absolute numbers.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_mlp.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "examples/cli_common.h"

using namespace ditto;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double median_seconds(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(std::move(t));
}

Tensor random(const Shape& s, std::uint64_t seed, const Device& d) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(s)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(seed, stream_id(kStreamSynthetic, 77), i, -1, 1);
  return Tensor::from_vector(v, s, d);
}

// GFLOP/s of C[M, N] = op(A) @ op(B) (op(B) = B^T when trans_b, as Linear's forward: x @ W^T)
// in bitwise and in fast mode. The two modes' repetitions alternate (bitwise, fast, bitwise, ...)
// and each mode's figure is its median, so a slow spell of a shared machine (another VM's burst,
// a frequency change) falls on both modes instead of on one of them; each repetition runs at
// least kRepFlop flops (a few milliseconds), not one short call.
struct GemmRate {
  double bitwise = 0, fast = 0;
};

GemmRate gemm_gflops(std::int64_t M, std::int64_t N, std::int64_t K, bool trans_b, int reps) {
  constexpr double kRepFlop = 1e9;
  Device d("sim", 0);
  Tensor a = random({M, K}, 1, d), b = random(trans_b ? Shape{N, K} : Shape{K, N}, 2, d);
  Tensor c = Tensor::zeros({M, N}, DType::f32, d);
  Stream& s = current_stream(d);
  const double flop = 2.0 * M * N * K;
  const int inner = std::max<int>(1, static_cast<int>(kRepFlop / flop));
  auto rep = [&](Determinism mode) {
    auto t0 = Clock::now();
    for (int i = 0; i < inner; ++i) ops::gemm(a, b, c, false, trans_b, 1.0f, 0.0f, mode);
    s.synchronize();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  rep(Determinism::bitwise);  // warm-up of both
  rep(Determinism::fast);
  std::vector<double> tb, tf;
  for (int r = 0; r < reps; ++r) {
    tb.push_back(rep(Determinism::bitwise));
    tf.push_back(rep(Determinism::fast));
  }
  return {flop * inner / median(tb) / 1e9, flop * inner / median(tf) / 1e9};
}

double trainer_samples_per_s(const std::vector<std::int64_t>& sizes, std::int64_t batch, int steps,
                             int n_dev, Determinism mode, int reps) {
  bench::DpMlp trainer(sizes, n_dev, mode);
  const std::int64_t classes = sizes.back();
  Tensor x = random({batch, sizes.front()}, 3, Device::cpu());
  std::vector<std::int64_t> yv(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < yv.size(); ++i) yv[i] = static_cast<std::int64_t>(i) % classes;
  Tensor y = Tensor::from_vector(yv, {batch});
  auto step = [&] { (void)trainer.step(x, y); };  // the trainer reads the loss every step
  step();                                         // warm-up
  double t = median_seconds(reps, [&] {
    for (int i = 0; i < steps; ++i) step();
  });
  return static_cast<double>(batch) * steps / t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_bitwise: bitwise against fast mode (GEMM GFLOP/s, trainer samples/s), "
               "measured in the same run"};
  bool quick = false;
  bool gemm_only = false;
  std::string csv_path;
  app.add_flag("--quick", quick, "fewer sizes, steps and repetitions (a smoke run)");
  app.add_flag("--gemm-only", gemm_only, "only the GEMM rows (no trainer rows)");
  app.add_option("--csv", csv_path, "also write the rows to this CSV file");
  ditto_cli::add_version(app, "bench_bitwise");
  if (const std::optional<int> rc = ditto_cli::parse(app, argc, argv, "bench_bitwise")) return *rc;
  const int reps = quick ? 3 : 5;
  std::FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (!csv) {
      std::fprintf(stderr, "bench_bitwise: error: --csv: cannot open '%s' for writing: %s\n",
                   csv_path.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(csv, "benchmark,bitwise,fast,unit,ratio\n");
  }
  auto row = [&](const std::string& name, double bw, double fs, const char* unit) {
    if (csv) std::fprintf(csv, "%s,%.3f,%.3f,%s,%.4f\n", name.c_str(), bw, fs, unit, bw / fs);
  };
  BackendOptions bo;
  bo.device_count = 4;
  init_backend("sim", bo);

  std::printf("%-34s %14s %14s %8s\n", "benchmark", "bitwise", "fast", "ratio");
  struct Gemm {
    std::string name;
    std::int64_t M, N, K;
    bool trans_b;
  };
  std::vector<Gemm> gemms;
  for (std::int64_t n : {64, 256, 512, 1024})
    gemms.push_back({"gemm " + std::to_string(n) + "x" + std::to_string(n), n, n, n, false});
  // The MLP 784-1024-1024-10's forward products (x @ W^T), batch 256 and a 4-device shard of 64.
  gemms.push_back({"gemm 256x1024x784 NT (fc1 b256)", 256, 1024, 784, true});
  gemms.push_back({"gemm 256x1024x1024 NT (fc2 b256)", 256, 1024, 1024, true});
  gemms.push_back({"gemm 64x1024x784 NT (fc1 b64)", 64, 1024, 784, true});
  for (const Gemm& g : gemms) {
    if (quick && g.M * g.N * g.K > 512 * 512 * 512) continue;
    const GemmRate rate = gemm_gflops(g.M, g.N, g.K, g.trans_b, quick ? 3 : 15);
    const double bw = rate.bitwise, fs = rate.fast;
    std::printf("%-34s %9.1f GF/s %9.1f GF/s %8.2f\n", g.name.c_str(), bw, fs, bw / fs);
    row(g.name, bw, fs, "GFLOP/s");
  }
  if (gemm_only) {
    if (csv) std::fclose(csv);
    return 0;
  }
  struct Model {
    const char* name;
    std::vector<std::int64_t> sizes;
    std::int64_t batch;
    int steps;
  };
  for (const Model& m :
       {Model{"train 64-128-10 b64 4dev", {64, 128, 10}, 64, 50},
        Model{"train 784-1024-1024-10 b256 4dev", {784, 1024, 1024, 10}, 256, 5}}) {
    double bw = trainer_samples_per_s(m.sizes, m.batch, quick ? m.steps / 2 : m.steps, 4,
                                      Determinism::bitwise, reps);
    double fs = trainer_samples_per_s(m.sizes, m.batch, quick ? m.steps / 2 : m.steps, 4,
                                      Determinism::fast, reps);
    std::printf("%-34s %7.0f smp/s %7.0f smp/s %8.2f\n", m.name, bw, fs, bw / fs);
    row(m.name, bw, fs, "samples/s");
  }
  if (csv) std::fclose(csv);
  return 0;
}
