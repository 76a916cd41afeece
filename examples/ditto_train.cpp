// ditto-train: the main job. Trains an MLP data-parallel over several (simulated or real) GPUs on a
// CSV data set (by default the bundled digits set: 8x8 images, 10 classes) and prints one line per
// epoch and a final line with a checksum of every parameter, so two runs compare with one string.
//
//   build/bin/ditto-train                          # 4 simulated GPUs, digits, MLP 64-128-10
//   build/bin/ditto-train --devices 1              # same model on one device
//   build/bin/ditto-train --profile h100-sxm --devices 8   # + predicted step time on 8 H100s
//   build/bin/ditto-train --predict-table          # cost model vs published NCCL figures
//   build/bin/ditto-train --trainer ddp            # DistributedDataParallel, a thread per rank
//   mpirun -np 4 build/bin/ditto-train --trainer ddp   # the same, one rank per process (MPI)
//   build/bin/ditto-train --help
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <tuple>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "backend_sim/published.h"
#include "backend_sim/sim_backend.h"
#include "core/runtime/backend.h"
#include "core/io/checkpoint.h"
#include "core/data/csv.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/dist/distributed.h"
#include "core/runtime/error.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/micro_shards.h"
#include "core/optim/adam.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "examples/bundled_data.h"

using namespace ditto;

namespace {

struct Args {
  std::string backend = "sim";
  int devices = 4;
  std::string data = ditto_examples::bundled_data_path("digits.csv");
  std::int64_t label_column = -1;
  std::string header = "auto";
  std::string hidden = "128";
  int epochs = 20;
  std::int64_t batch_size = 64;
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  std::uint64_t seed = 0;
  double val_fraction = 0.2;
  std::string determinism = "bitwise";
  std::string loss = "cross-entropy";
  std::string optimizer = "sgd";
  bool lr_given = false;
  bool devices_given = false;
  bool trainer_given = false;
  std::int64_t micro_shards = kDefaultMicroShards;
  double sim_memory_gib = 80.0;
  bool sim_memory_given = false;
  // Cost model (sim backend): backend_sim/cost_model.h.
  std::string profile;             // empty: no prediction printed
  std::string interconnect = "auto";
  int nodes = 1;
  std::string trace;
  std::vector<std::string> stragglers;  // "DEVICE:FACTOR"
  std::string checkpoint, resume;     // checkpoint directories (core/io/checkpoint.h)
  std::int64_t checkpoint_every = 0;  // optimizer steps between checkpoints (0: at the end only)
  std::string trainer = "dp";
  double bucket_cap_mb = 25.0;
  std::vector<std::string> faults;      // --fault SPEC (backend_sim/sim_faults.h)
  std::int64_t comm_timeout_ms = 0;     // 0: the communicators' own timeout
  std::set<std::string> given;          // the string options given on the command line
};

/// Sets up the simulator's cost model from --profile/--interconnect/--nodes/--straggler/--trace.
void configure_cost_model(const Args& a, Backend& be, int total_devices) {
  auto* sb = dynamic_cast<sim::SimBackend*>(&be);
  if (!sb) {
    DITTO_CHECK(a.profile.empty() && a.trace.empty() && a.stragglers.empty() && a.nodes == 1,
                "--profile, --trace, --straggler and --nodes: expected the sim backend, got ",
                be.name());
    return;
  }
  sim::CostModel& cm = sb->cost_model();
  sim::ClusterSpec c = cm.cluster();
  if (!a.profile.empty()) c.device = sim::device_profile(a.profile);
  std::string ic = a.interconnect;
  if (ic == "auto") ic = sim::default_interconnect(c.device.key);
  c.interconnect = sim::interconnect_profile(ic);
  c.nodes = a.nodes;
  c.devices_per_node = total_devices / a.nodes;
  cm.configure(c);
  for (const std::string& s : a.stragglers) {
    const auto colon = s.find(':');
    int dev = -1;
    double factor = 0;
    bool ok = colon != std::string::npos;
    try {
      std::size_t u1 = 0, u2 = 0;
      if (ok) {
        dev = std::stoi(s.substr(0, colon), &u1);
        factor = std::stod(s.substr(colon + 1), &u2);
        ok = u1 == colon && u2 == s.size() - colon - 1;
      }
    } catch (...) {
      ok = false;
    }
    DITTO_CHECK(ok, "--straggler: expected DEVICE:FACTOR such as 3:2.5, got '", s, "'");
    cm.set_slowdown(dev, factor);
  }
  if (!a.trace.empty()) cm.set_tracing(true);
}

/// --checkpoint DIR is created (rank 0 saves; `lead`) and --trace FILE's directory must exist and
/// be writable, at startup, so that a long run is not lost when it ends.
void check_output_paths(const Args& a, bool lead) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!a.checkpoint.empty() && lead) {
    fs::create_directories(a.checkpoint, ec);
    DITTO_CHECK(!ec, "--checkpoint: cannot create directory '", a.checkpoint, "': ", ec.message());
    DITTO_CHECK(::access(a.checkpoint.c_str(), W_OK | X_OK) == 0, "--checkpoint: expected a "
                "writable directory, got '", a.checkpoint, "': ", std::strerror(errno));
  }
  if (!a.trace.empty()) {
    DITTO_CHECK(!fs::is_directory(a.trace, ec), "--trace: expected a file name, got '", a.trace,
                "', a directory");
    fs::path dir = fs::path(a.trace).parent_path();
    if (dir.empty()) dir = ".";
    DITTO_CHECK(fs::is_directory(dir, ec), "--trace: expected a file in an existing directory, "
                "got '", a.trace, "' (no directory '", dir.string(), "')");
    DITTO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--trace: expected a file in a "
                "writable directory, got '", a.trace, "': '", dir.string(), "': ",
                std::strerror(errno));
  }
}

void sync_all(Backend& be, int n) {
  for (int d = 0; d < n; ++d) be.default_stream(d).synchronize();
}

std::string mib(std::size_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / 1048576.0);
  return buf;
}

/// The loss's target for a batch: the labels themselves (cross-entropy) or their one-hot
/// encoding as f32 [N, C] (MSE), on `device`.
Tensor make_target(const Tensor& labels, std::int64_t classes, bool mse, const Device& device) {
  if (!mse) return labels.to(device);
  std::vector<std::int64_t> y = labels.to_vector<std::int64_t>();
  std::vector<float> onehot(y.size() * static_cast<std::size_t>(classes), 0.0f);
  for (std::size_t r = 0; r < y.size(); ++r) onehot[r * classes + y[r]] = 1.0f;
  return Tensor::from_vector(onehot, {static_cast<std::int64_t>(y.size()), classes}, device);
}

/// --hidden: "" is no hidden layer; otherwise every comma-separated item must be a size.
std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  if (text.empty()) return out;
  DITTO_CHECK(text.back() != ',', "--hidden: expected comma-separated positive sizes such as 128 "
              "or 256,128 ('' for no hidden layer), got '", text, "' (an empty item)");
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    DITTO_CHECK(!item.empty(), "--hidden: expected comma-separated positive sizes such as 128 or "
                "256,128 ('' for no hidden layer), got '", text, "' (an empty item)");
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    DITTO_CHECK(used == item.size() && v > 0, "--hidden: expected comma-separated positive sizes "
                                              "such as 128 or 256,128, got '", text, "'");
    out.push_back(v);
  }
  return out;
}

/// FNV-1a over the bytes of every parameter, in order.
std::uint64_t params_checksum(nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (nn::Parameter* p : m.parameters()) {
    std::vector<float> v = p->data.to_vector<float>();
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    for (std::size_t i = 0; i < v.size() * sizeof(float); ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  return h;
}

struct Eval {
  double loss = 0, acc = 0;
};

/// `dp`: DataParallel, or OnDevice (one replica).
template <typename Model>
Eval evaluate(Model& dp, nn::Loss& criterion, bool mse,
              const data::Dataset& ds, std::int64_t batch_size) {
  data::DataLoader loader(ds, batch_size, /*shuffle=*/false);
  double loss_sum = 0;
  std::int64_t correct = 0, seen = 0;
  for (data::Batch b : loader) {
    Tensor logits = dp.forward(b.x);
    Tensor y = make_target(b.y, logits.size(1), mse, logits.device());
    loss_sum += static_cast<double>(criterion.forward(logits, y).item()) * b.x.size(0);
    std::vector<float> l = logits.to_vector<float>();
    std::vector<std::int64_t> t = b.y.to_vector<std::int64_t>();
    const std::int64_t classes = logits.size(1);
    for (std::size_t r = 0; r < t.size(); ++r) {
      std::int64_t best = 0;
      for (std::int64_t c = 1; c < classes; ++c)
        if (l[r * classes + c] > l[r * classes + best]) best = c;
      correct += best == t[r];
    }
    seen += b.x.size(0);
  }
  return {seen ? loss_sum / seen : 0.0, seen ? static_cast<double>(correct) / seen : 0.0};
}

/// A module fed on its device (evaluation of a DDP replica).
struct OnDevice {
  nn::Module& module;
  Device device;
  Tensor forward(const Tensor& x) { return module.forward(x.to(device)); }
};

std::unique_ptr<optim::Optimizer> make_optimizer(const Args& a, nn::Module& m, float lr) {
  if (a.optimizer == "adam") {
    optim::AdamOptions ao;
    ao.lr = lr;
    ao.weight_decay = a.weight_decay;
    return std::make_unique<optim::Adam>(m.parameters(), ao);
  }
  optim::SGDOptions so;
  so.lr = lr;
  so.momentum = a.momentum;
  so.weight_decay = a.weight_decay;
  return std::make_unique<optim::SGD>(m.parameters(), so);
}

/// The model, optimizer and loss of one trainer (dp: the model DataParallel replicates; ddp: one
/// rank's replica), on `device`. The same seed everywhere: every replica starts equal.
struct Setup {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<nn::Loss> criterion;
};

Setup make_setup(const Args& a, const std::vector<std::int64_t>& sizes, const Device& device,
                 Determinism mode, float lr) {
  Setup s;
  s.model = nn::mlp(sizes, device, a.seed);
  s.model->set_input_requires_grad(false);
  if (a.loss == "mse") s.criterion = std::make_unique<nn::MSELoss>();
  else s.criterion = std::make_unique<nn::CrossEntropyLoss>();
  s.criterion->set_determinism(mode);
  s.opt = make_optimizer(a, *s.model, lr);
  return s;
}

std::string arch_name(const std::vector<std::int64_t>& sizes) {
  std::string arch;
  for (std::size_t i = 0; i < sizes.size(); ++i) arch += (i ? "-" : "") + std::to_string(sizes[i]);
  return arch;
}

/// The run's position at its start (step 0), with the settings a checkpoint must agree on.
TrainerState initial_state(const Args& a, const std::vector<std::int64_t>& sizes,
                           const data::Dataset& train, Determinism mode) {
  TrainerState ts;  // the run's position: saved by --checkpoint, restored by --resume
  ts.seed = a.seed;
  ts.config = {{"model", arch_name(sizes)}, {"optimizer", a.optimizer}, {"loss", a.loss},
               {"batch_size", std::to_string(a.batch_size)}, {"seed", std::to_string(a.seed)},
               {"train_rows", std::to_string(train.size())},
               {"val_fraction", std::to_string(a.val_fraction)},
               {"determinism", determinism_name(mode)},
               {"micro_shards", std::to_string(a.micro_shards)},
               {"devices", std::to_string(a.devices)}};
  return ts;
}

/// --resume: loads the newest usable checkpoint of a.resume into `s` and returns its position.
/// `lead`: this caller reports (skipped checkpoints on stderr, the "resumed from" line); the other
/// ddp ranks load the same checkpoint quietly.
TrainerState resume_from(const Args& a, Setup& s, const TrainerState& fresh, Determinism mode,
                         bool lead) {
  std::set<std::string> may_differ;  // bitwise results do not depend on the device count
  if (mode == Determinism::bitwise) may_differ.insert("devices");
  std::ostringstream quiet;
  TrainerState ts = resume_checkpoint(a.resume, *s.model, *s.opt, fresh.config, may_differ,
                                      lead ? static_cast<std::ostream&>(std::cerr) : quiet);
  if (lead)
    std::printf("ditto-train: resumed from %s at step %" PRId64 " (epoch %" PRId64
                ", batch %" PRId64 ")\n", a.resume.c_str(), ts.step, ts.epoch + 1, ts.batch);
  DITTO_CHECK(ts.epoch <= a.epochs, "--resume: the checkpoint is past the end of epoch ",
              ts.epoch, ", expected --epochs >= ", ts.epoch, ", got ", a.epochs);
  return ts;
}

void print_epoch(int epoch, double train_loss, const Eval& ev, std::int64_t seen, double dt) {
  std::printf("epoch %3d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  samples/s=%.0f\n", epoch,
              train_loss, ev.loss, ev.acc, dt > 0 ? seen / dt : 0.0);
  std::fflush(stdout);
}

/// The virtual time of the training loops (cost model, sim backend; evaluation excluded) and
/// what the `predicted:`/`measured:` lines divide it by. Inert on other backends.
struct CostMeter {
  sim::SimBackend* simb = nullptr;
  int n_dev = 0;
  sim::CostTotals before;
  sim::VTime vtrain = 0;
  std::uint64_t vflops = 0;
  std::vector<sim::VTime> vcomm;
  std::int64_t steps = 0, samples = 0;

  CostMeter(Backend& be, int devices)
      : simb(dynamic_cast<sim::SimBackend*>(&be)), n_dev(devices),
        vcomm(static_cast<std::size_t>(devices), 0) {}

  /// Every device idle, at the start of an epoch's training loop.
  void epoch_begin(Backend& be) {
    if (!simb) return;
    sync_all(be, n_dev);
    before = simb->cost_model().totals();
  }
  /// The epoch ran `steps` optimizer steps over `seen` samples; waits for every device.
  void epoch_end(Backend& be, std::int64_t epoch_steps, std::int64_t seen) {
    steps += epoch_steps;
    samples += seen;
    if (!simb) return;
    sync_all(be, n_dev);
    sim::CostTotals after = simb->cost_model().totals();
    vtrain += after.now - before.now;
    vflops += after.gemm_flops - before.gemm_flops;
    for (int d = 0; d < n_dev; ++d) vcomm[d] += after.comm[d] - before.comm[d];
  }
};

/// Before the final line: the --fault specs that never fired.
void note_unfired_faults(Backend& be) {
  if (auto* sim_be = dynamic_cast<sim::SimBackend*>(&be))
    for (const std::string& f : sim_be->unfired_faults())
      std::printf("ditto-train: note: --fault %s never took effect (no such step, allocation or "
                  "communicator collective in this run)\n",
                  f.c_str());
}

void print_final(const Backend& be, int n_dev, Determinism mode, bool ddp, int epochs,
                 double train_loss, const Eval& ev, double train_time, std::uint64_t checksum) {
  std::printf("final: backend=%s devices=%d determinism=%s%s epochs=%d train_loss=%.6f "
              "val_loss=%.6f val_acc=%.4f train_time_s=%.3f params_checksum=%016" PRIx64 "\n",
              be.name().c_str(), n_dev, determinism_name(mode), ddp ? " trainer=ddp" : "", epochs,
              train_loss, ev.loss, ev.acc, train_time, checksum);
}

/// After the final line (single-process runs): the cost model's prediction (--profile), every
/// device's memory, the trace (--trace).
void print_epilogue(const Args& a, Backend& be, const std::vector<Device>& devs,
                    const CostMeter& m, double train_time) {
  const int n_dev = static_cast<int>(devs.size());
  sim::SimBackend* simb = m.simb;
  if (simb && !a.profile.empty() && m.steps > 0) {
    const sim::ClusterSpec& c = simb->cost_model().cluster();
    const double vt = sim::to_seconds(m.vtrain);
    sim::VTime comm_max = *std::max_element(m.vcomm.begin(), m.vcomm.end());
    std::printf("predicted: %d x %s (%d node%s, %s) step_time=%.4f ms samples/s=%.0f "
                "comm_share=%.1f%% mfu=%.3g%% (virtual time; FP32 peak %.1f TFLOP/s per GPU)\n"
                "measured:  CPU simulator step_time=%.4f ms samples/s=%.0f (wall clock)\n",
                n_dev, c.device.name.c_str(), a.nodes, a.nodes > 1 ? "s" : "",
                c.interconnect.key.c_str(), vt / m.steps * 1e3, vt > 0 ? m.samples / vt : 0.0,
                vt > 0 ? 100.0 * sim::to_seconds(comm_max) / vt : 0.0,
                vt > 0 ? 100.0 * static_cast<double>(m.vflops) / (vt * n_dev * c.device.fp32_flops)
                       : 0.0,
                c.device.fp32_flops / 1e12, train_time / m.steps * 1e3,
                train_time > 0 ? m.samples / train_time : 0.0);
  }
  if (simb) sync_all(be, n_dev);
  for (int d = 0; d < n_dev; ++d) {
    MemoryStats mem = be.memory_stats(d);
    std::printf("memory: %s live=%s peak=%s capacity=%s\n", devs[d].str().c_str(),
                mib(mem.in_use).c_str(), mib(mem.peak).c_str(), mib(mem.capacity).c_str());
  }
  if (simb && !a.trace.empty()) {
    simb->cost_model().write_trace(a.trace);
    std::printf("trace: wrote %s (Chrome trace JSON; open in https://ui.perfetto.dev)\n",
                a.trace.c_str());
  }
}

/// The rank threads of one --trainer ddp run meet at each epoch's start and end, so that the cost
/// model's totals are read while every rank is between epochs (the dp trainer's CostMeter). A
/// rank that fails calls abort(): the others throw instead of waiting for it.
class EpochSync {
 public:
  EpochSync(int ranks, CostMeter& meter, Backend& be) : ranks_(ranks), meter_(meter), be_(be) {}

  void epoch_begin() { arrive([this] { meter_.epoch_begin(be_); }); }
  void epoch_end(std::int64_t steps, std::int64_t seen) {
    arrive([&] { meter_.epoch_end(be_, steps, seen); });  // the same counts on every rank
  }
  void abort(int rank, const std::string& why) {
    {
      std::lock_guard lk(mu_);
      if (failure_.empty()) failure_ = detail::cat("rank ", rank, " failed: ", why);
    }
    cv_.notify_all();
  }

 private:
  // Waits for every rank; the last to arrive runs `last` first.
  void arrive(const std::function<void()>& last) {
    std::unique_lock lk(mu_);
    if (!failure_.empty()) throw BackendError(detail::cat("ditto-train: ", failure_));
    const std::uint64_t gen = generation_;
    if (++arrived_ == ranks_) {
      try {
        last();
      } catch (const std::exception& e) {
        failure_ = detail::cat("the epoch's cost snapshot failed: ", e.what());
        cv_.notify_all();
        throw;
      }
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return generation_ != gen || !failure_.empty(); });
    if (generation_ == gen) throw BackendError(detail::cat("ditto-train: ", failure_));
  }

  const int ranks_;
  CostMeter& meter_;
  Backend& be_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string failure_;  // non-empty: a rank failed
};

struct RankResult {
  double train_loss = 0, train_time = 0;
  Eval ev;
  std::uint64_t checksum = 0;
};

/// --trainer ddp: the training loop of one rank (one host thread, or one process under mpirun).
/// Its own replica (same seed; DDP broadcasts rank 0's parameters anyway), its own optimizer and
/// the same shuffled DataLoader as every rank; it takes rows local_rows() of each global batch, the
/// loss divides by the global batch (Note [DDP loss scaling]), so in bitwise mode the parameters
/// equal DataParallel's bit for bit. Every rank resumes from the same --resume checkpoint (before
/// DDP's first broadcast, so no rank still reads it when rank 0 saves the next one); rank 0 saves
/// the checkpoints, evaluates and prints the epoch lines. `sync`: the rank threads' epoch
/// barrier (null under mpirun).
RankResult train_rank(const Args& a, Backend& be, Communicator comm,
                      const std::vector<std::int64_t>& sizes, const data::Dataset& train,
                      const data::Dataset& val, float lr, EpochSync* sync) {
  const Device dev = comm.device();
  const Determinism mode = comm.options().determinism;
  const bool mse = a.loss == "mse", lead = comm.rank() == 0;
  const std::int64_t classes = sizes.back();
  Setup s = make_setup(a, sizes, dev, mode, lr);
  std::unique_ptr<nn::Loss> eval_criterion = s.criterion->clone();
  eval_criterion->set_determinism(mode);
  TrainerState ts = initial_state(a, sizes, train, mode);
  if (!a.resume.empty()) ts = resume_from(a, s, ts, mode, lead);
  std::int64_t saved_step = a.resume.empty() ? -1 : ts.step;
  parallel::DistributedDataParallelOptions o;
  o.bucket_cap_mb = a.bucket_cap_mb;
  o.micro_shards = a.micro_shards;
  o.average_gradients = false;
  parallel::DistributedDataParallel ddp(*s.model, comm, o);
  // A checkpoint holds the epoch's loss sum over every rank: rank 0 starts from it on resume.
  auto checkpoint = [&](double loss_sum) {
    TrainerState saved = ts;
    if (ts.batch != 0) {  // mid-epoch: sum the ranks' shares (every rank takes part)
      Tensor t = Tensor::from_vector(std::vector<float>{static_cast<float>(loss_sum)}, {1}, dev);
      comm.all_reduce(t);
      saved.epoch_loss_sum = t.item();
    }
    if (lead) save_checkpoint(a.checkpoint, *s.model, *s.opt, saved);
    saved_step = ts.step;
  };
  data::DataLoader loader(train, a.batch_size, /*shuffle=*/true, a.seed, /*drop_last=*/false);
  RankResult res;
  OnDevice replica{*s.model, dev};
  for (int epoch = static_cast<int>(ts.epoch) + 1; epoch <= a.epochs; ++epoch) {
    loader.set_epoch(epoch - 1, ts.batch);
    if (sync) sync->epoch_begin();
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = lead ? ts.epoch_loss_sum : 0.0;  // this rank's share of the epoch's loss
    std::int64_t seen = ts.epoch_samples, steps = 0;
    for (std::int64_t i = ts.batch; i < loader.size(); ++i) {
      data::Batch b = loader.batch(i);
      be.begin_step(ts.step);  // counted over the whole run, resumed runs included
      const std::int64_t n = b.x.size(0);
      const auto [lo, hi] = ddp.local_rows(n);
      s.criterion->set_global_batch(n);
      Tensor out = ddp.forward({b.x.narrow(lo, hi - lo)}, n);
      Tensor loss =
          s.criterion->forward(out, make_target(b.y.narrow(lo, hi - lo), classes, mse, dev));
      s.opt->zero_grad(true);
      ddp.backward(s.criterion->backward());
      s.opt->step();
      loss_sum += static_cast<double>(loss.item()) * n;
      seen += n;
      ++steps;
      ts.advance(loader.size(), loss_sum, seen);  // the position after this step
      if (a.checkpoint_every > 0 && ts.step % a.checkpoint_every == 0) checkpoint(loss_sum);
    }
    Tensor total = Tensor::from_vector(std::vector<float>{static_cast<float>(loss_sum)}, {1}, dev);
    comm.all_reduce(total);
    res.train_loss = seen ? static_cast<double>(total.item()) / seen : 0.0;
    if (sync) sync->epoch_end(steps, seen);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.train_time += dt;
    if (!lead) continue;
    res.ev = evaluate(replica, *eval_criterion, mse, val, 512);
    print_epoch(epoch, res.train_loss, res.ev, seen, dt);
  }
  if (lead && a.epochs == 0) res.ev = evaluate(replica, *eval_criterion, mse, val, 512);
  if (!a.checkpoint.empty() && ts.step != saved_step) checkpoint(0.0);
  // Every rank must end with the same parameters.
  res.checksum = params_checksum(*s.model);
  Tensor mine = Tensor::from_vector(std::vector<std::int64_t>{static_cast<std::int64_t>(res.checksum)}, {1}, dev);
  Tensor all = Tensor::empty({comm.size()}, DType::i64, dev);
  comm.all_gather(mine, all);
  std::vector<std::int64_t> sums = all.to_vector<std::int64_t>();
  for (int r = 1; r < comm.size(); ++r)
    DITTO_CHECK(sums[static_cast<std::size_t>(r)] == sums[0], "--trainer ddp: rank ", r,
                " ended with params_checksum ", std::hex, sums[static_cast<std::size_t>(r)],
                ", rank 0 with ", sums[0], " (the replicas diverged)");
  return res;
}

/// --trainer ddp under mpirun: this process is rank dist::rank() of dist::world_size(), on its
/// one device `dev`; the communicator spans the processes (Communicator::init_rank). Rank 0
/// prints.
int run_ddp_process(const Args& a, Determinism mode, Backend& be, const Device& dev,
                    const std::vector<std::int64_t>& sizes, const data::Dataset& train,
                    const data::Dataset& val, float lr) {
  CommOptions co;
  co.determinism = mode;
  Communicator comm = Communicator::init_rank(dev, dist::world_size(), dist::rank(), co);
  RankResult res;
  try {
    res = train_rank(a, be, comm, sizes, train, val, lr, nullptr);
  } catch (const std::exception& e) {
    comm.abort(e.what());  // the other processes fail now, naming this rank
    throw;
  }
  comm.stream().synchronize();
  if (comm.rank() == 0) {
    note_unfired_faults(be);
    print_final(be, comm.size(), mode, true, a.epochs, res.train_loss, res.ev, res.train_time,
                res.checksum);
  }
  return 0;
}

/// Whether rank `r`'s error `what` was caused by another rank's failure: the communicator's
/// "<collective>: rank <q> failed: ..." or "communicator aborted by an earlier error: ...", or the
/// epoch barrier's "ditto-train: rank <q> failed: ...", with q != r.
bool caused_by_another_rank(const std::string& what, int r) {
  if (what.find("communicator aborted by an earlier error") != std::string::npos) return true;
  for (std::size_t pos = what.find("rank "); pos != std::string::npos;
       pos = what.find("rank ", pos + 1)) {
    std::size_t end = pos + 5;
    while (end < what.size() && what[end] >= '0' && what[end] <= '9') ++end;
    if (end == pos + 5 || what.compare(end, 9, " failed: ") != 0) continue;
    if (std::stoll(what.substr(pos + 5, end - pos - 5)) != r) return true;
  }
  return false;
}

/// The error to report of the (rank, error) pairs of a failed ddp run (in the order the ranks
/// failed): the first one a rank raised on its own, not one caused by another rank's abort
/// (which may arrive first: the aborting rank still unwinds), else the first.
std::exception_ptr root_error(const std::vector<std::pair<int, std::exception_ptr>>& errors) {
  for (const auto& [r, e] : errors) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      if (!caused_by_another_rank(x.what(), r)) return e;
    } catch (...) {
      return e;
    }
  }
  return errors.front().second;
}

/// --trainer ddp: one host thread per rank, ranks = the devices; prints like the dp trainer
/// (epoch lines, final line, prediction, memory, trace). The first rank to fail aborts the
/// communicator and the epoch barrier, so the others fail at once naming it; its error is the
/// one thrown (root_error), whichever rank's error arrives first.
int run_ddp(const Args& a, Determinism mode, Backend& be, const std::vector<Device>& devs,
            const std::vector<std::int64_t>& sizes, const data::Dataset& train,
            const data::Dataset& val, float lr) {
  CommOptions co;
  co.determinism = mode;
  std::vector<Communicator> comms = Communicator::init_all(devs, co);
  const int n = static_cast<int>(devs.size());
  CostMeter meter(be, n);
  EpochSync sync(n, meter, be);
  std::vector<RankResult> results(devs.size());
  std::mutex errors_mu;
  std::vector<std::pair<int, std::exception_ptr>> errors;  // (rank, error), in the order they failed
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        results[r] = train_rank(a, be, comms[r], sizes, train, val, lr, &sync);
      } catch (const std::exception& e) {
        {
          std::lock_guard lk(errors_mu);
          errors.emplace_back(r, std::current_exception());
        }
        comms[r].abort(e.what());  // the other ranks fail now, naming this rank
        sync.abort(r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (!errors.empty()) std::rethrow_exception(root_error(errors));
  const RankResult& res = results[0];
  note_unfired_faults(be);
  print_final(be, n, mode, true, a.epochs, res.train_loss, res.ev, res.train_time, res.checksum);
  print_epilogue(a, be, devs, meter, res.train_time);
  return 0;
}

int run(Args a) {
  Determinism mode = parse_determinism(a.determinism);
  data::CsvOptions csv;
  csv.label_column = a.label_column;
  if (a.header == "yes") csv.header = data::CsvHeader::yes;
  else if (a.header == "no") csv.header = data::CsvHeader::no;
  else DITTO_CHECK(a.header == "auto", "--header: expected auto, yes or no, got '", a.header, "'");
  DITTO_CHECK(a.epochs >= 0, "--epochs: expected >= 0, got ", a.epochs);
  DITTO_CHECK(std::isfinite(a.lr) && a.lr > 0, "--lr: expected a finite value > 0, got ", a.lr);
  DITTO_CHECK(a.batch_size >= 1, "--batch-size: expected >= 1, got ", a.batch_size);
  DITTO_CHECK(a.val_fraction > 0 && a.val_fraction < 1, "--val-fraction: expected a value in (0, 1), got ",
              a.val_fraction);
  // The byte count must fit in size_t: converting a larger (or infinite) double is undefined.
  constexpr double kMaxSimMemoryGib = double(std::uint64_t(1) << 34);  // 2^34 GiB = 2^64 bytes
  DITTO_CHECK(a.nodes >= 1 && a.nodes <= 4096, "--nodes: expected 1..4096, got ", a.nodes);
  DITTO_CHECK(static_cast<long long>(a.devices) * a.nodes <= 65536,
              "--devices x --nodes: expected at most 65536 devices in all, got ", a.devices,
              " x ", a.nodes);
  DITTO_CHECK(a.sim_memory_gib > 0 && a.sim_memory_gib < kMaxSimMemoryGib,
              "--sim-memory-gib: expected a size in GiB > 0 and < 17179869184 (16 EiB), got ",
              a.sim_memory_gib);
  std::vector<std::int64_t> hidden = parse_sizes(a.hidden);
  // An empty path would silently mean "not given".
  for (const auto& [opt, value, what] :
       {std::tuple{"--checkpoint", &a.checkpoint, "a directory"},
        std::tuple{"--resume", &a.resume, "a checkpoint directory"},
        std::tuple{"--trace", &a.trace, "a file name"},
        std::tuple{"--profile", &a.profile, "a profile name or .json file"}})
    DITTO_CHECK(!a.given.count(opt) || !value->empty(), opt, ": expected ", what,
                ", got an empty string");
  DITTO_CHECK(a.comm_timeout_ms >= 0 && a.comm_timeout_ms <= kMaxCommTimeoutMs,
              "--comm-timeout-ms: expected 0 (the communicators' own) to ", kMaxCommTimeoutMs,
              " ms (2^31, about 24.9 days), got ", a.comm_timeout_ms);
  DITTO_CHECK(a.loss == "cross-entropy" || a.loss == "mse",
              "--loss: expected cross-entropy or mse, got '", a.loss, "'");
  DITTO_CHECK(a.optimizer == "sgd" || a.optimizer == "adam",
              "--optimizer: expected sgd or adam, got '", a.optimizer, "'");
  DITTO_CHECK(a.checkpoint_every >= 0 && (a.checkpoint_every == 0 || !a.checkpoint.empty()),
              "--checkpoint-every: expected >= 0, with --checkpoint DIR, got ", a.checkpoint_every,
              a.checkpoint.empty() ? " without --checkpoint" : "");
  const bool mse = a.loss == "mse";
  const float lr = a.lr_given ? a.lr : (a.optimizer == "adam" ? 0.001f : a.lr);

  DITTO_CHECK(a.trainer == "dp" || a.trainer == "ddp", "--trainer: expected dp or ddp, got '",
              a.trainer, "'");
  // Under mpirun (dist::init in main): one rank per process, the ranks = the processes.
  const bool processes = dist::is_initialized();
  const bool lead = dist::rank() == 0;
  if (processes) {
    if (!a.trainer_given) a.trainer = "ddp";
    DITTO_CHECK(a.trainer == "ddp", "--trainer: under mpirun each process is one rank, which "
                "needs --trainer ddp (DataParallel drives every device from one process), got '",
                a.trainer, "'");
    DITTO_CHECK(!a.devices_given || a.devices == dist::world_size(), "--devices: under mpirun "
                "the ranks are the ", dist::world_size(), " processes: expected ",
                dist::world_size(), " or no --devices, got ", a.devices);
    a.devices = dist::world_size();
  }

  std::string why;
  std::string backend = resolve_backend_name(a.backend, &why);
  if (a.backend == "auto" && backend != "cuda" && lead)
    std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
  const int n_dev = a.devices * a.nodes;  // --devices per node
  BackendOptions bopts;
  // Under mpirun a sim process holds only its rank's virtual device; a cuda process sees every
  // GPU of its node and takes the one of its local rank.
  if (!processes) bopts.device_count = n_dev;
  else if (backend != "cuda") bopts.device_count = 1;
  bopts.memory_capacity = static_cast<std::size_t>(a.sim_memory_gib * double(1ull << 30));
  if (!a.profile.empty() && !a.sim_memory_given)  // the profile's memory is the capacity
    bopts.memory_capacity = static_cast<std::size_t>(sim::device_profile(a.profile).memory_bytes);
  Backend& be = init_backend(backend, bopts);
  std::vector<Device> devs;
  if (!processes) {
    devs = ditto::devices(be.name(), n_dev);
  } else {
    int local = dist::local_rank();
    devs = {Device(be.name(), local % be.device_count())};
  }
  DITTO_CHECK(!processes || (a.profile.empty() && a.trace.empty() && a.stragglers.empty() && a.nodes == 1),
              "--profile, --trace, --straggler and --nodes: expected a single-process run, got mpirun "
              "with ", dist::world_size(), " processes (the cost model sees one process's devices)");
  DITTO_CHECK(!processes || a.faults.empty(),
              "--fault: expected a single-process run, got mpirun with ", dist::world_size(),
              " processes (each process holds one device, so fault devices and ranks would not "
              "match the job's)");
  configure_cost_model(a, be, static_cast<int>(devs.size()));
  auto* simb = dynamic_cast<sim::SimBackend*>(&be);
  if (!a.faults.empty() || a.comm_timeout_ms != 0) {
    DITTO_CHECK(simb, "--fault/--comm-timeout-ms: expected --backend sim, got ", be.name());
    sim::FaultConfig fc;
    for (const std::string& f : a.faults) fc.faults.push_back(sim::parse_fault(f, "--fault"));
    if (a.comm_timeout_ms > 0) fc.comm_timeout_ms = a.comm_timeout_ms;
    simb->set_faults(fc);
  }

  check_output_paths(a, lead);  // before training: a bad path must not cost the run

  data::Dataset all = data::read_csv(a.data, csv);
  data::Split split = data::train_val_split(all, a.val_fraction, a.seed);
  data::Standardizer stdz = data::Standardizer::fit(split.train);
  data::Dataset train = stdz.apply(split.train), val = stdz.apply(split.val);
  const std::int64_t classes = data::num_classes(all);

  std::vector<std::int64_t> sizes{all.num_features()};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(classes);
  DITTO_CHECK(a.bucket_cap_mb > 0 && std::isfinite(a.bucket_cap_mb),
              "--bucket-cap-mb: expected a finite size in MiB > 0, got ", a.bucket_cap_mb);
  if (a.trainer == "ddp") {
    if (lead) {
      std::printf("ditto-train: trainer=ddp backend=%s ranks=%d (%s) determinism=%s data=%s "
                  "batch=%" PRId64 " epochs=%d bucket_cap_mb=%g\n",
                  be.name().c_str(), n_dev, processes ? "processes" : "threads",
                  determinism_name(mode), a.data.c_str(), a.batch_size, a.epochs,
                  a.bucket_cap_mb);
      std::fflush(stdout);
    }
    if (processes) return run_ddp_process(a, mode, be, devs[0], sizes, train, val, lr);
    return run_ddp(a, mode, be, devs, sizes, train, val, lr);
  }
  Setup s = make_setup(a, sizes, devs[0], mode, lr);
  nn::Sequential& model = *s.model;
  parallel::DataParallelOptions dpo;
  dpo.determinism = mode;
  dpo.micro_shards = a.micro_shards;
  parallel::DataParallel dp(model, devs, dpo);

  TrainerState ts = initial_state(a, sizes, train, mode);
  if (!a.resume.empty()) ts = resume_from(a, s, ts, mode, true);
  std::int64_t saved_step = a.resume.empty() ? -1 : ts.step;
  std::printf("ditto-train: backend=%s devices=%d determinism=%s model=%s params=%" PRId64
              " data=%s rows=%" PRId64 " (train %" PRId64 ", val %" PRId64 ") batch=%" PRId64
              " epochs=%d loss=%s optimizer=%s lr=%g momentum=%g seed=%" PRIu64 "\n",
              be.name().c_str(), n_dev, determinism_name(mode), arch_name(sizes).c_str(),
              model.num_parameters(), a.data.c_str(), all.size(), train.size(), val.size(),
              a.batch_size, a.epochs, a.loss.c_str(), a.optimizer.c_str(), lr,
              a.optimizer == "sgd" ? a.momentum : 0.0f, a.seed);
  std::fflush(stdout);

  data::DataLoader loader(train, a.batch_size, /*shuffle=*/true, a.seed, /*drop_last=*/false);
  double train_time = 0, train_loss = 0;
  CostMeter meter(be, n_dev);
  Eval ev{};
  for (int epoch = static_cast<int>(ts.epoch) + 1; epoch <= a.epochs; ++epoch) {
    loader.set_epoch(epoch - 1, ts.batch);
    meter.epoch_begin(be);
    auto t0 = std::chrono::steady_clock::now();
    double loss_sum = ts.epoch_loss_sum;
    std::int64_t seen = ts.epoch_samples, steps = 0;
    for (std::int64_t i = ts.batch; i < loader.size(); ++i) {
      data::Batch b = loader.batch(i);
      be.begin_step(ts.step);  // counted over the whole run, resumed runs included
      Tensor out = dp.forward(b.x);
      Tensor loss = s.criterion->forward(out, make_target(b.y, classes, mse, out.device()));
      s.opt->zero_grad(true);
      dp.backward(s.criterion->backward());
      s.opt->step();
      loss_sum += static_cast<double>(loss.item()) * b.x.size(0);
      seen += b.x.size(0);
      ++steps;
      ts.advance(loader.size(), loss_sum, seen);  // the position after this step
      if (a.checkpoint_every > 0 && ts.step % a.checkpoint_every == 0) {
        save_checkpoint(a.checkpoint, model, *s.opt, ts);
        saved_step = ts.step;
      }
    }
    meter.epoch_end(be, steps, seen);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train_time += dt;
    train_loss = seen ? loss_sum / seen : 0.0;
    ev = evaluate(dp, *s.criterion, mse, val, 512);
    print_epoch(epoch, train_loss, ev, seen, dt);
  }
  if (a.epochs == 0) ev = evaluate(dp, *s.criterion, mse, val, 512);
  if (!a.checkpoint.empty() && ts.step != saved_step)
    save_checkpoint(a.checkpoint, model, *s.opt, ts);
  note_unfired_faults(be);
  print_final(be, n_dev, mode, false, a.epochs, train_loss, ev, train_time,
              params_checksum(model));
  print_epilogue(a, be, devs, meter, train_time);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"ditto-train: data-parallel MLP training on simulated or real GPUs"};
  app.add_option("--backend", a.backend, "sim, cuda or auto (cuda when a GPU is usable)")
      ->capture_default_str();
  app.add_option("--devices", a.devices, "number of devices (data-parallel replicas)")
      ->capture_default_str();
  app.add_option("--data", a.data, "CSV file: numeric features, integer class label")
      ->capture_default_str();
  app.add_option("--label-column", a.label_column, "label column (negative counts from the end)")
      ->capture_default_str();
  app.add_option("--header", a.header, "first row is a header: auto, yes or no")
      ->capture_default_str();
  app.add_option("--hidden", a.hidden,
                 "hidden layer sizes, comma-separated (e.g. 256,128; '' for no hidden layer)")
      ->capture_default_str();
  app.add_option("--epochs", a.epochs, "training epochs")->capture_default_str();
  app.add_option("--batch-size", a.batch_size, "global batch size (split over the devices)")
      ->capture_default_str();
  app.add_option("--lr", a.lr, "learning rate (default 0.05 for sgd, 0.001 for adam)");
  app.add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--loss", a.loss, "cross-entropy or mse (on one-hot targets)")
      ->capture_default_str();
  app.add_option("--optimizer", a.optimizer, "sgd or adam")->capture_default_str();
  app.add_option("--micro-shards", a.micro_shards,
                 "micro-shards K of a batch in bitwise mode (power of two >= devices)")
      ->capture_default_str();
  app.add_option("--weight-decay", a.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--seed", a.seed, "seed for initialisation, split and shuffling")
      ->capture_default_str();
  app.add_option("--val-fraction", a.val_fraction, "fraction of rows held out for validation")
      ->capture_default_str();
  app.add_option("--determinism", a.determinism,
                 "bitwise (same bits for any power-of-two device count) or fast")
      ->capture_default_str();
  app.add_option("--sim-memory-gib", a.sim_memory_gib, "memory capacity of each simulated device")
      ->capture_default_str();
  app.add_option("--profile", a.profile,
                 "sim: device profile for the cost model and memory capacity (h100-sxm, h200, "
                 "a100-sxm-80gb, rtx4070-laptop, or a .json file); prints the predicted step");
  app.add_option("--interconnect", a.interconnect,
                 "sim: links between GPUs: auto, nvlink, nvlink3, pcie5, pcie4")
      ->capture_default_str();
  app.add_option("--nodes", a.nodes, "sim: nodes of --devices GPUs each (InfiniBand between)")
      ->capture_default_str();
  app.add_option("--trace", a.trace, "sim: write a Chrome trace JSON (Perfetto) to this file");
  app.add_option("--straggler", a.stragglers,
                 "sim: DEVICE:FACTOR, that device's kernels take FACTOR times longer (repeatable)");
  bool table = false;
  app.add_flag("--predict-table", table,
               "print the cost model's all_reduce figures next to published ones, then exit");
  app.add_option("--checkpoint", a.checkpoint, "directory to save checkpoints in (and at the end)");
  app.add_option("--checkpoint-every", a.checkpoint_every, "optimizer steps between checkpoints");
  app.add_option("--resume", a.resume, "resume from the newest usable checkpoint in DIR");
  app.add_option("--trainer", a.trainer,
                 "dp (DataParallel, one controller thread) or ddp (DistributedDataParallel, a "
                 "thread per rank; under mpirun a process per rank, the default there)")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", a.bucket_cap_mb, "ddp: gradient bucket size cap in MiB")
      ->capture_default_str();
  app.add_option("--fault", a.faults,
                 "sim: inject a fault (repeatable): fail:device=D,step=S | "
                 "alloc:device=D,after=N | skip-collective:rank=R,index=K");
  app.add_option("--comm-timeout-ms", a.comm_timeout_ms,
                 "sim: timeout of every communicator in ms (0: their own; at most 2^31)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  a.lr_given = app.count("--lr") > 0;
  a.sim_memory_given = app.count("--sim-memory-gib") > 0;
  a.devices_given = app.count("--devices") > 0;
  a.trainer_given = app.count("--trainer") > 0;
  for (const char* opt : {"--checkpoint", "--resume", "--trace", "--profile"})
    if (app.count(opt) > 0) a.given.insert(opt);
  if (table) {
    std::fputs(sim::format_published_table(sim::published_comparisons()).c_str(), stdout);
    return 0;
  }
  int rc = 1;
  try {
    // Started by mpirun: this process is one rank (--trainer ddp), the job's processes the ranks.
    if (dist::launched_by_mpirun()) dist::init(&argc, &argv);
    rc = run(a);
  } catch (const std::exception& e) {
    if (dist::is_initialized())
      std::fprintf(stderr, "ditto-train: error: rank %d: %s\n", dist::rank(), e.what());
    else
      std::fprintf(stderr, "ditto-train: error: %s\n", e.what());
    rc = 1;
  }
  dist::finalize();  // after every communicator is gone (they live in run)
  return rc;
}
