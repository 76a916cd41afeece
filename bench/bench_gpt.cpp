// `ditto-bench gpt` (bench_gpt.h): nn::GPT training tokens/s with DataParallel and DDP.
#include "bench/bench_gpt.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>

#include "bench/bench_common.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/nn/gpt.h"
#include "core/nn/loss.h"
#include "core/numerics/random.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"

namespace ditto::bench {
namespace {

constexpr double kMaxSeconds = 3600;

nn::GPTConfig model_config(const GptBenchConfig& c) {
  nn::GPTConfig g;
  g.n_layer = c.n_layer;
  g.n_head = c.n_head;
  g.n_embd = c.n_embd;
  g.block_size = c.block_size;
  g.vocab_size = c.vocab_size;
  return g;  // bias false, dropout 0: nanoGPT's CPU configuration
}

/// Random tokens [B, T] i64 on the host (Philox, kStreamSynthetic sub 92 for x, 93 for y).
Tensor tokens(const GptBenchConfig& c, std::uint64_t sub) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(c.batch_size * c.block_size));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = philox_u32(1, stream_id(kStreamSynthetic, sub), i) %
           static_cast<std::uint32_t>(c.vocab_size);
  return Tensor::from_vector(v, {c.batch_size, c.block_size});
}

optim::AdamWOptions adamw_options() {
  optim::AdamWOptions o;
  o.lr = 1e-3;
  o.beta1 = 0.9;
  o.beta2 = 0.99;
  o.weight_decay = 0.1;
  return o;
}

/// One nanoGPT iteration of `model` (behind `forward` / `backward`) on (x, y).
void train_step(const std::function<Tensor()>& forward,
                const std::function<void(const Tensor&)>& backward, nn::GPT& gpt,
                nn::CrossEntropyLoss& loss, optim::AdamW& opt, const Tensor& y, Determinism mode) {
  Tensor out = forward();
  Tensor l = loss.forward(out, y.to(out.device()));
  opt.zero_grad(true);
  backward(loss.backward());
  optim::clip_grad_norm_(gpt.parameters(), 1.0, mode);
  opt.step();
  (void)l.item();  // nanoGPT reads the loss every iteration (and this synchronises)
}

double dp_steps_per_s(const GptBenchConfig& c, int n_dev, Determinism mode) {
  std::vector<Device> devs = devices("sim", n_dev);
  nn::GPT gpt(model_config(c), devs[0], 0);
  parallel::DataParallelOptions o;
  o.determinism = mode;
  parallel::DataParallel dp(gpt, devs, o);
  nn::CrossEntropyLoss loss;
  loss.set_determinism(mode);
  optim::AdamW opt(gpt.parameters(), adamw_options());
  const Tensor x = tokens(c, 92), y = tokens(c, 93);
  auto step = [&] {
    train_step([&] { return dp.forward(x); }, [&](const Tensor& g) { dp.backward(g); }, gpt, loss,
               opt, y, mode);
  };
  return steps_per_s(step, c.seconds, c.reps);
}

double ddp_steps_per_s(const GptBenchConfig& c, int n_dev, Determinism mode) {
  const Tensor x = tokens(c, 92), y = tokens(c, 93);
  CommOptions co;
  co.determinism = mode;
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", n_dev), co);
  auto body = [&](Communicator& comm,
                  const std::function<void(const std::function<void()>&)>& timed) {
    nn::GPT gpt(model_config(c), comm.device(), 0);
    parallel::DistributedDataParallelOptions o;
    o.average_gradients = false;  // the loss divides by the global batch (bitwise = dp's bits)
    parallel::DistributedDataParallel ddp(gpt, comm, o);
    nn::CrossEntropyLoss loss;
    loss.set_determinism(mode);
    loss.set_global_batch(c.batch_size);
    optim::AdamW opt(gpt.parameters(), adamw_options());
    const auto [lo, hi] = ddp.local_rows(c.batch_size);
    const Tensor xr = x.narrow(lo, hi - lo), yr = y.narrow(lo, hi - lo);
    timed([&] {
      train_step([&] { return ddp.forward({xr}, c.batch_size); },
                 [&](const Tensor& g) { ddp.backward(g); }, gpt, loss, opt, yr, mode);
    });
  };
  return steps_per_s_ranks(comms, body, c.seconds, c.reps);
}

}  // namespace

void add_gpt_options(CLI::App* sc, GptBenchConfig& c) {
  sc->add_option("--n-layer", c.n_layer, "Transformer blocks (nanoGPT's n_layer)");
  sc->add_option("--n-head", c.n_head, "Attention heads (n_head)");
  sc->add_option("--n-embd", c.n_embd, "Embedding width (n_embd)");
  sc->add_option("--block-size", c.block_size, "Context length T (block_size)");
  sc->add_option("--batch-size", c.batch_size, "Sequences per step B (batch_size)");
  sc->add_option("--devices", c.devices_list, "Device counts")->delimiter(',');
  sc->add_option("--modes", c.modes, "fast, bitwise")->delimiter(',');
  sc->add_option("--trainers", c.trainers, "dp (DataParallel), ddp (DistributedDataParallel)")
      ->delimiter(',');
  sc->add_option("--train-seconds", c.seconds, "Seconds per timed run");
}

void check_gpt_config(const GptBenchConfig& c) {
  DITTO_CHECK(std::isfinite(c.seconds) && c.seconds > 0 && c.seconds <= kMaxSeconds,
              "ditto-bench: --train-seconds: expected a value > 0 and <= ", kMaxSeconds, ", got ",
              c.seconds);
  for (const std::string& t : c.trainers)
    DITTO_CHECK(t == "dp" || t == "ddp", "ditto-bench: --trainers: expected dp or ddp, got '", t,
                "'");
  for (const std::string& m : c.modes)
    DITTO_CHECK(m == "fast" || m == "bitwise",
                "ditto-bench: --modes: expected fast or bitwise, got '", m, "'");
  for (int d : c.devices_list)
    DITTO_CHECK(d >= 1 && d <= c.batch_size, "ditto-bench: --devices: expected 1 to --batch-size (",
                c.batch_size, ") devices, got ", d);
  DITTO_CHECK(c.batch_size >= 1, "ditto-bench: --batch-size: expected >= 1, got ", c.batch_size);
}

void run_gpt(const GptBenchConfig& c, const std::string& csv_path) {
  check_gpt_config(c);
  BackendOptions bo;
  bo.device_count = std::max(1, *std::max_element(c.devices_list.begin(), c.devices_list.end()));
  init_backend("sim", bo);
  char name[96];
  std::snprintf(name, sizeof name, "gpt-%lldl-%lldh-%lld", static_cast<long long>(c.n_layer),
                static_cast<long long>(c.n_head), static_cast<long long>(c.n_embd));
  Csv csv(csv_path, "model,batch,block_size,devices,determinism,trainer,tokens_per_s,steps_per_s");
  std::printf(
      "#\n# gpt: %s vocab %lld, batch %lld x block %lld, bias off, dropout 0; forward, "
      "cross-entropy, backward, clip 1.0, AdamW; sim backend, median of %d runs of >= %.2f s\n#\n",
      name, static_cast<long long>(c.vocab_size), static_cast<long long>(c.batch_size),
      static_cast<long long>(c.block_size), c.reps, c.seconds);
  std::printf("# %-16s %6s %6s %8s %9s %8s %12s %10s\n", "model", "batch", "block", "devices",
              "mode", "trainer", "tokens/s", "steps/s");
  const double tokens_per_step = static_cast<double>(c.batch_size * c.block_size);
  for (int d : c.devices_list)
    for (const std::string& mode : c.modes) {
      const Determinism det = mode == "bitwise" ? Determinism::bitwise : Determinism::fast;
      for (const std::string& t : c.trainers) {
        const double sps = t == "dp" ? dp_steps_per_s(c, d, det) : ddp_steps_per_s(c, d, det);
        std::printf("  %-16s %6lld %6lld %8d %9s %8s %12.1f %10.3f\n", name,
                    static_cast<long long>(c.batch_size), static_cast<long long>(c.block_size), d,
                    mode.c_str(), t.c_str(), sps * tokens_per_step, sps);
        std::fflush(stdout);
        csv.row(name, c.batch_size, c.block_size, d, mode, t == "dp" ? "DataParallel" : "DDP",
                sps * tokens_per_step, sps);
      }
    }
}

}  // namespace ditto::bench
