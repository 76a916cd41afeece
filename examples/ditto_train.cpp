// ditto-train: the main job. Trains an MLP data-parallel over several (simulated or real) GPUs on a
// CSV data set (by default the bundled digits set: 8x8 images, 10 classes) and prints one line per
// epoch and a final line with a checksum of every parameter, so two runs compare with one string.
// The loop is the library's Trainer (core/train/trainer.h): this program maps options to a
// TrainerConfig and prints what the Trainer reports.
//
//   build/bin/ditto-train                          # 4 simulated GPUs, digits, MLP 64-128-10
//   build/bin/ditto-train --devices 1              # same model on one device
//   build/bin/ditto-train --profile h100-sxm --devices 8   # + predicted step time on 8 H100s
//   build/bin/ditto-train --predict-table          # cost model vs published NCCL figures
//   build/bin/ditto-train --trainer ddp            # DistributedDataParallel, a thread per rank
//   mpirun -np 4 build/bin/ditto-train --trainer ddp   # the same, one rank per process (MPI)
//   build/bin/ditto-train --metrics-jsonl m.jsonl  # + one JSON line per epoch and at the end
//   build/bin/ditto-train --model gpt              # nanoGPT's Shakespeare character model
//   build/bin/ditto-train --model gpt --preset gpt2 --dry-run --profile a100-sxm-80gb
//       --devices 8 --trainer ddp --batch-size 128  # predict GPT-2 124M on 8 A100s, in seconds
//   build/bin/ditto-train --help
// The GPT's options and output are in ditto_train_gpt.cpp.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <new>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend_sim/cost_model.h"
#include "backend_sim/profiles.h"
#include "backend_sim/published.h"
#include "backend_sim/sim_faults.h"
#include "backend_sim/sim_run.h"
#include "core/dist/distributed.h"
#include "core/runtime/error.h"
#include "core/train/cost_meter.h"
#include "core/train/grad_accumulation.h"
#include "core/train/launcher.h"
#include "core/train/trainer.h"
#include "examples/bundled_data.h"
#include "examples/cli_common.h"
#include "examples/ditto_train_gpt.h"
#include "examples/ditto_train_weights.h"

using namespace ditto;

namespace {

struct Args {
  std::string backend = "sim", data = ditto_examples::bundled_data_path("digits.csv"), header = "auto", hidden = "128";
  std::string determinism = "bitwise", trainer = "dp", jsonl, model = "mlp", dtype = "f32";
  std::int64_t label_column = -1;
  std::int64_t classes = 0;  // --classes; 0: the largest label + 1
  std::int64_t log_interval = -1;  // --log-interval; -1: the model's default
  double val_fraction = 0.2, sim_memory_gib = 80.0;
  std::vector<std::string> stragglers;  // "DEVICE:FACTOR"
  bool verbose = false;                  // --verbose: the predicted step's kernel table
  std::set<std::string> given;          // the options given on the command line
  train::TrainerConfig cfg;
  ditto_train::GptOptions gpt;
  ditto_train::WeightsOptions weights;  // --init-from, --export, --eval-only
  sim::SimRunOptions sim;               // --profile, --interconnect, --nodes, --trace, ...
};

/// What a nested run (--predict-table's dry runs) hands back instead of printing: the result, or
/// the error it stopped with.
struct Capture {
  train::FitResult result;
  std::string error;
};

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

/// --straggler DEVICE:FACTOR.
std::pair<int, double> parse_straggler(const std::string& s) {
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
  return {dev, factor};
}

/// The most classes of ditto-train's model, inferred from the labels (the largest + 1) or given
/// by --classes: a stray label such as 100000 would otherwise build a 100001-way output layer
/// silently.
constexpr std::int64_t kMaxInferredClasses = 65536;

/// A data source whose model has `classes` outputs (--classes), more than its labels need.
class WithClasses final : public train::DataSource {
 public:
  WithClasses(std::shared_ptr<train::DataSource> s, std::int64_t classes)
      : s_(std::move(s)), classes_(classes) {}
  std::int64_t batches_per_epoch(std::int64_t b) const override { return s_->batches_per_epoch(b); }
  data::Batch batch(std::int64_t e, std::int64_t i, std::int64_t b) override {
    return s_->batch(e, i, b);
  }
  const data::Dataset& eval_set() const override { return s_->eval_set(); }
  std::int64_t train_size() const override { return s_->train_size(); }
  std::int64_t num_inputs() const override { return s_->num_inputs(); }
  std::int64_t num_outputs() const override { return classes_; }
  std::map<std::string, std::string> checkpoint_config() const override {
    return s_->checkpoint_config();
  }
  data::Batch step_batch(std::int64_t step, std::int64_t b) override {
    return s_->step_batch(step, b);
  }
  data::Batch eval_batch(train::EvalSplit split, std::int64_t k, std::int64_t b) override {
    return s_->eval_batch(split, k, b);
  }

 private:
  std::shared_ptr<train::DataSource> s_;
  std::int64_t classes_;
};

/// The model's classes: --classes N (every label < N, as torch.nn.CrossEntropyLoss's targets
/// < C), else the largest label + 1, refused past kMaxInferredClasses.
std::shared_ptr<train::DataSource> with_classes(std::shared_ptr<train::CsvDataSource> rows,
                                                const Args& a) {
  const std::int64_t inferred = rows->num_outputs();  // the largest label + 1
  if (!a.given.count("--classes")) {
    DITTO_CHECK(inferred <= kMaxInferredClasses, "--data: ", a.data, ": the largest label is ",
                inferred - 1, ", which would make a model of ", inferred, " classes: expected "
                "labels 0..", kMaxInferredClasses - 1, " (the most classes ditto-train's model "
                "has)");
    return rows;
  }
  DITTO_CHECK(a.classes >= 1 && a.classes <= kMaxInferredClasses, "--classes: expected an "
              "integer in 1..", kMaxInferredClasses, ", got ", a.classes);
  DITTO_CHECK(a.classes >= inferred, "--classes: expected a number of classes greater than every "
              "label (the largest in ", a.data, " is ", inferred - 1, "), got ", a.classes);
  if (a.classes == inferred) return rows;
  return std::make_shared<WithClasses>(std::move(rows), a.classes);
}

/// --trace and --metrics-jsonl are written: refused when one names the file of --data (a typo
/// would overwrite the data set), the other's file (one would overwrite the other), or a file
/// inside the --checkpoint or --resume directory (DIR/latest, a checkpoint's files).
void check_outputs_are_not_inputs(const Args& a, const train::TrainerConfig& c) {
  namespace fs = std::filesystem;
  auto key = [](const std::string& p) {  // the same file by any spelling, existing or not
    std::error_code ec;
    fs::path k = fs::weakly_canonical(fs::absolute(p, ec), ec);
    return ec ? fs::path(p).lexically_normal() : k;
  };
  std::vector<std::pair<const char*, std::string>> outputs;
  if (!a.sim.trace.empty()) outputs.emplace_back("--trace", a.sim.trace);
  if (!a.jsonl.empty()) outputs.emplace_back("--metrics-jsonl", a.jsonl);
  std::vector<std::pair<const char*, std::string>> others{{"--data", a.data}};
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [opt, path] = outputs[i];
    const fs::path k = key(path);
    for (const auto& [other, other_path] : others)
      DITTO_CHECK(k != key(other_path), opt, ": expected a file other than ", other, "'s, got '",
                  path, "' (", other, " '", other_path, "'), which it would overwrite");
    for (const auto& [dir_opt, dir] : {std::pair{"--checkpoint", c.checkpoint_dir},
                                       std::pair{"--resume", c.resume_dir}}) {
      if (dir.empty() || dir == "auto") continue;
      const fs::path d = key(dir);
      const fs::path rel = k.lexically_relative(d);
      DITTO_CHECK(rel.empty() || *rel.begin() == "..", opt, ": expected a file outside the ",
                  dir_opt, " directory '", dir, "', got '", path, "'");
    }
    others.emplace_back(opt, path);
  }
}

/// --resume auto: DIR (--checkpoint) when it holds a checkpoint (DIR/latest or a DIR/step-N,
/// usable or not: a damaged one is an error, not a fresh start over it), else "" (a fresh start),
/// saying which on stdout (`lead`).
std::string resolve_resume_auto(const std::string& checkpoint_dir, bool lead) {
  DITTO_CHECK(!checkpoint_dir.empty(), "--resume auto: expected --checkpoint DIR (auto resumes "
              "from DIR when it holds a checkpoint, else starts fresh), got no --checkpoint");
  namespace fs = std::filesystem;
  std::error_code ec;
  // A file (or anything not a directory) is refused before "starting fresh" is said: the run
  // could never write its checkpoints there.
  DITTO_CHECK(!fs::exists(checkpoint_dir, ec) || fs::is_directory(checkpoint_dir, ec),
              "--resume auto --checkpoint: expected a checkpoint directory (or one to create), "
              "got '", checkpoint_dir, "', which is not a directory");
  bool found = fs::exists(fs::path(checkpoint_dir) / "latest", ec);
  if (!found && fs::is_directory(checkpoint_dir, ec))
    for (const auto& e : fs::directory_iterator(checkpoint_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step-", 0) == 0 && n.find(".tmp") == std::string::npos) found = true;
    }
  if (lead) {
    if (found)
      std::printf("ditto-train: --resume auto: %s holds a checkpoint: resuming\n",
                  checkpoint_dir.c_str());
    else
      std::printf("ditto-train: --resume auto: no checkpoint in %s: starting fresh\n",
                  checkpoint_dir.c_str());
  }
  return found ? checkpoint_dir : std::string();
}

// Note [Graceful stop]: with --checkpoint, a first SIGINT (Ctrl-C) or SIGTERM (torchrun's,
// a scheduler's) sets g_stop; the Trainer ends after the optimizer step in progress
// (TrainerConfig::stop), writes its checkpoint, and ditto-train exits with 128 + the signal
// (130, 143), the shell's status for a process the signal ended. A second signal exits at once
// with that status, as an impatient user expects, and says so on stderr: the stop checkpoint was
// not finished, and the newest complete checkpoint on disk is the one DIR/latest names (read in
// the handler with open/read/write only, all async-signal-safe), or none. (GNU `timeout -s TERM`
// signals the process and then its group, so a run under it gets two SIGTERMs at once.) Without
// --checkpoint there is nothing to keep: the default action (the process ends at once).
std::atomic<int> g_stop{0};
char g_latest_path[4096];  // "DIR/latest", set before the handlers are installed
char g_checkpoint_dir[4096];

extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(sig) != 0) {
    char buf[8192];
    std::size_t n = 0;
    auto put = [&](const char* t) {
      while (*t && n < sizeof buf - 1) buf[n++] = *t++;
    };
    put(sig == SIGINT ? "ditto-train: second SIGINT: exiting at once; the stop checkpoint was "
                        "not written; newest checkpoint on disk: "
                      : "ditto-train: second SIGTERM: exiting at once; the stop checkpoint was "
                        "not written; newest checkpoint on disk: ");
    char name[64] = {};
    ssize_t got = -1;
    const int fd = ::open(g_latest_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      got = ::read(fd, name, sizeof name - 1);
      ::close(fd);
    }
    while (got > 0 && (name[got - 1] == '\n' || name[got - 1] == ' ')) name[--got] = 0;
    if (got > 0) {
      put(g_checkpoint_dir);
      put("/");
      put(name);
    } else {
      put("none");
    }
    put("\n");
    [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, buf, n);
    ::_exit(128 + sig);
  }
  static const char msg[] = "ditto-train: signal received: finishing the current step and "
                            "writing a checkpoint (send it again to exit at once)\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
}

void install_stop_handlers(const std::string& checkpoint_dir) {
  std::snprintf(g_checkpoint_dir, sizeof g_checkpoint_dir, "%s", checkpoint_dir.c_str());
  std::snprintf(g_latest_path, sizeof g_latest_path, "%s/latest", checkpoint_dir.c_str());
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    // A signal the parent ignores stays ignored (nohup, a shell's background job's SIGINT).
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
}

std::string mib(std::size_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / 1048576.0);
  return buf;
}

/// The final lines; `tokens_per_sample` > 0 (the GPT's block_size): iterations instead of
/// epochs, and the prediction's tokens/s too.
/// nanoGPT's progress line, "iter N: loss L, time Tms, mfu M%" (train.py's format; its iter_num
/// is the step just taken, 0-based): the mfu only with a --profile, of the step's virtual time
/// on the profiled GPUs against the peak of the run's dtype (there is no meaningful peak for the
/// simulator's wall clock, a CPU's), and the MLP's position in its epoch.
void print_step(const train::StepMetrics& m, const train::TrainerConfig& c,
                const std::string& profile) {
  std::printf("iter %" PRId64 ": loss %.4f, time %.2fms", m.iter, m.loss, m.time_s * 1e3);
  if (m.mfu) std::printf(", mfu %.2f%%", 100.0 * *m.mfu);
  std::string where;
  if (m.epoch > 0)
    where = "epoch " + std::to_string(m.epoch) + ", batch " + std::to_string(m.batch + 1) +
            " of " + std::to_string(m.batches);
  if (m.predicted_time_s > 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "predicted %.3fms on %s%s", m.predicted_time_s * 1e3,
                  profile.c_str(), m.mfu ? (c.dtype == DType::f32 ? ", mfu of its FP32 peak"
                                                                    : ", mfu of its BF16 peak")
                                           : "");
    where += (where.empty() ? "" : "; ") + std::string(buf);
  }
  if (!where.empty()) std::printf(" (%s)", where.c_str());
  std::printf("\n");
  std::fflush(stdout);
}

void print_final(const train::FitResult& r, const sim::SimRunReport& sim,
                 std::int64_t tokens_per_sample = 0) {
  for (const std::string& f : sim.unfired_faults)
    std::printf("ditto-train: note: --fault %s never took effect (no such step, allocation or "
                "communicator collective in this run)\n", f.c_str());
  char loop[64];
  if (tokens_per_sample > 0)
    std::snprintf(loop, sizeof loop, "iters=%" PRId64, r.steps);
  else
    std::snprintf(loop, sizeof loop, "epochs=%d", r.epochs);
  // Only what the run measured: no losses or checksum of a dry run (nothing ran), no training
  // loss without an epoch (--epochs 0), no evaluation the run did not make (--eval-iters 0).
  const bool measured = !r.dry_run;
  std::string losses;
  char buf[64];
  if (measured && r.has_train_loss) {
    std::snprintf(buf, sizeof buf, " train_loss=%.6f", r.train_loss);
    losses += buf;
  }
  if (measured && r.has_eval) {
    std::snprintf(buf, sizeof buf, " val_loss=%.6f", r.eval.loss);
    losses += buf;
    if (tokens_per_sample == 0) {  // the GPT's evaluation is its loss only
      std::snprintf(buf, sizeof buf, " val_acc=%.4f", r.eval.accuracy);
      losses += buf;
    }
  }
  char checksum[64] = "";
  if (measured)
    std::snprintf(checksum, sizeof checksum, " params_checksum=%016" PRIx64, r.params_checksum);
  std::string dtype;  // f32 runs print the line they always printed
  if (r.dtype != DType::f32) dtype = std::string(" dtype=") + dtype_name(r.dtype);
  std::printf("final: backend=%s devices=%d determinism=%s%s%s %s%s train_time_s=%.3f%s\n",
              r.backend.c_str(), r.devices, determinism_name(r.determinism), dtype.c_str(),
              r.trainer == train::TrainerKind::ddp ? " trainer=ddp" : "", loop, losses.c_str(),
              r.train_time_s, checksum);
  if (r.loss_scale)
    std::printf("grad_scaler: scale=%g skipped_steps=%" PRId64 " (f16 dynamic loss scaling)\n",
                static_cast<double>(*r.loss_scale), r.skipped_steps);
  if (const auto& p = r.prediction) {
    char tokens[64] = "", measured_tokens[64] = "";
    if (tokens_per_sample > 0) {
      const double t = static_cast<double>(tokens_per_sample);
      std::snprintf(tokens, sizeof tokens, " tokens/s=%.0f", p->samples_per_s * t);
      std::snprintf(measured_tokens, sizeof measured_tokens, " tokens/s=%.0f",
                    p->measured_samples_per_s * t);
    }
    // MFU against the peak the run's matrix products are priced at: FP32 for f32, the BF16
    // tensor-core peak for bf16 / f16 storage (Note [Mixed precision]); the GPT's is nanoGPT's
    // estimate_mfu, on its own line (print_gpt_prediction), so it is printed once.
    const bool tc = r.dtype != DType::f32 && p->bf16_peak_flops > 0;
    const double peak = tc ? p->bf16_peak_flops : p->peak_flops;
    char mfu[160] = " (virtual time)";
    if (tokens_per_sample == 0)
      std::snprintf(mfu, sizeof mfu, " mfu=%.3g%% (virtual time; %s peak %.1f TFLOP/s per GPU)",
                    100.0 * p->mfu, tc ? "BF16" : "FP32", peak / 1e12);
    std::printf("predicted: %d x %s (%d node%s, %s) step_time=%.4f ms samples/s=%.0f%s "
                "comm_share=%.1f%%%s\n",
                p->devices, p->device_name.c_str(), p->nodes, p->nodes > 1 ? "s" : "",
                p->interconnect.c_str(), p->step_time_s * 1e3, p->samples_per_s, tokens,
                100.0 * p->comm_share, mfu);
    if (!r.dry_run)  // a dry run executed nothing: its wall clock measures no training
      std::printf("measured:  CPU simulator step_time=%.4f ms samples/s=%.0f%s (wall clock)\n",
                  p->measured_step_time_s * 1e3, p->measured_samples_per_s, measured_tokens);
  }
  for (const train::DeviceMemory& m : r.memory)
    std::printf("memory: %s live=%s peak=%s capacity=%s optimizer_state=%s\n",
                m.device.c_str(), mib(m.stats.in_use).c_str(), mib(m.stats.peak).c_str(),
                mib(m.stats.capacity).c_str(), mib(m.optimizer_state_bytes).c_str());
  if (!sim.trace.empty())
    std::printf("trace: wrote %s (Chrome trace JSON; open in https://ui.perfetto.dev)\n",
                sim.trace.c_str());
}

train::RankSettings cli_settings(const CLI::App& app, const Args& a,
                                 const train::DataSource* data);

/// A usage error found after parsing: an option's value, or a combination of options, that
/// run() or the Trainer's validation refuses ("--FLAG: expected ..., got ..."). ditto-train
/// exits 2 for it, as for the parser's own (argparse's parser.error).
struct UsageError : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

/// Whether `message` is a usage error's: it names an option first and says what was expected and
/// what was got ("--FLAG: expected ..., got ...", "--FLAG x --OTHER: ... expected ..., got ...");
/// not the contents of --data (a file's problem, not the command line's).
bool is_usage_message(const std::string& message) {
  if (message.rfind("--", 0) != 0 || message.rfind("--data:", 0) == 0) return false;
  const std::size_t expected = message.find("expected ");
  return expected != std::string::npos && message.find(", got ", expected) != std::string::npos;
}

/// `e` as a UsageError when it is one (is_usage_message), else itself.
[[noreturn]] void rethrow_usage(const InvalidArgument& e) {
  if (is_usage_message(e.what())) throw UsageError(e.what());
  throw;
}

/// What each numeric option's value must be, for the parser's conversion errors
/// ("--devices: expected an integer in 1..65536, got 'abc'").
const std::map<std::string, std::string>& expected_values() {
  static const std::map<std::string, std::string> m{
      {"--devices", "an integer in 1..65536"}, {"--label-column", "an integer"},
      {"--classes", "an integer in 1..65536"}, {"--epochs", "an integer >= 0"},
      {"--batch-size", "an integer >= 1"}, {"--lr", "a number > 0"},
      {"--momentum", "a number"}, {"--micro-shards", "a power of two >= --devices"},
      {"--grad-accum-steps", "an integer >= 1"}, {"--weight-decay", "a number >= 0"},
      {"--val-fraction", "a number in (0, 1)"}, {"--sim-memory-gib", "a size in GiB > 0"},
      {"--nodes", "an integer in 1..4096"}, {"--checkpoint-every", "an integer >= 0"},
      {"--bucket-cap-mb", "a size in MiB > 0"}, {"--zero-stage", "0 or 1"},
      {"--comm-timeout-ms", "an integer in 0..2147483648"},
      {"--log-interval", "an integer >= 0"}, {"--n-layer", "an integer in 1..85"},
      {"--n-head", "an integer >= 1"}, {"--n-embd", "an integer >= 1"},
      {"--block-size", "an integer >= 1"}, {"--max-iters", "an integer >= 1"},
      {"--eval-interval", "an integer >= 1"}, {"--eval-iters", "an integer >= 0"},
      {"--min-lr", "a number >= 0"}, {"--warmup-iters", "an integer >= 0"},
      {"--lr-decay-iters", "an integer > --warmup-iters"}, {"--grad-clip", "a number >= 0"},
      {"--dropout", "a number in [0, 1)"}, {"--beta1", "a number in [0, 1)"},
      {"--beta2", "a number in [0, 1)"}, {"--sample", "an integer >= 0"},
      {"--temperature", "a number > 0"}, {"--top-k", "an integer >= 0"},
      {"--vocab-size", "an integer >= 0"}, {"--seed", "an integer >= 0"}};
  return m;
}

/// Options that do nothing in this run, or that change what bitwise mode promises, said once at
/// the start on stderr ("ditto-train: warning: ..."), as PyTorch warns for an ignored setting.
void warn_settings(const Args& a, const train::TrainerConfig& c, long long devices) {
  auto warn = [](const std::string& s) { std::fprintf(stderr, "ditto-train: warning: %s\n", s.c_str()); };
  if (a.given.count("--bucket-cap-mb") && c.trainer != train::TrainerKind::ddp)
    warn("--bucket-cap-mb: sizes --trainer ddp's gradient buckets; DataParallel (--trainer dp) "
         "has none, so it does nothing in this run");
  if (a.given.count("--micro-shards") && c.determinism != Determinism::bitwise)
    warn("--micro-shards: splits the batch in --determinism bitwise only; fast mode does not use "
         "it, so it does nothing in this run");
  if (c.determinism == Determinism::bitwise && (devices & (devices - 1)) != 0)
    warn("--devices" + std::string(a.sim.nodes > 1 ? " x --nodes" : "") + ": " +
         std::to_string(devices) + " devices, not a power of two: the params_checksum is the "
         "same from run to run but differs from the one every power-of-two device count (1, 2, "
         "4, ...) gives (bitwise mode splits the batch in power-of-two micro-shards, Note "
         "[Micro-shards])");
  std::fflush(stderr);
}

/// The option values the library would refuse only once training starts, under its own names
/// (optim::SGD: momentum, DataParallel: micro_shards, set_slowdown: device, device_profile:,
/// SimBackend::set_faults): refused here first as usage errors naming the option ("--FLAG:
/// expected ..., got ..."; exit status 2). `devices`: the run's devices (x --nodes; the ranks).
void check_option_values(const Args& a, const train::TrainerConfig& c, long long devices) {
  try {
    DITTO_CHECK(c.batch_size >= 1, "--batch-size: expected an integer >= 1, got ", c.batch_size);
    // torch.optim.SGD's "Invalid momentum value" / "Invalid weight_decay value".
    DITTO_CHECK(std::isfinite(c.momentum) && c.momentum >= 0,
                "--momentum: expected a number >= 0, got ", c.momentum);
    DITTO_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0,
                "--weight-decay: expected a number >= 0, got ", c.weight_decay);
    if (c.determinism == Determinism::bitwise) {
      const std::int64_t k = c.micro_shards;
      DITTO_CHECK(k >= 1 && k <= kMaxMicroShards && (k & (k - 1)) == 0, "--micro-shards: "
                  "expected a power of two in 1..", kMaxMicroShards, ", got ", k);
      DITTO_CHECK(k >= devices, "--micro-shards: bitwise mode gives every device at least one "
                  "micro-shard: expected a power of two >= ", devices, " (the devices), got ", k,
                  a.given.count("--micro-shards") ? "" : " (the default)");
    }
    train::check_grad_accumulation(c, static_cast<int>(devices));  // already names the options
    DITTO_CHECK(c.zero_stage == 0 || c.trainer == train::TrainerKind::ddp, "--zero-stage ",
                c.zero_stage, ": expected --trainer ddp (ZeRO shards the optimizer state over "
                "DDP's ranks), got --trainer ", train::trainer_kind_name(c.trainer));
    for (const auto& [device, factor] : a.sim.stragglers) {
      DITTO_CHECK(device >= 0 && device < devices, "--straggler ", device, ":", factor,
                  ": expected a device in 0..", devices - 1, ", got ", device);
      DITTO_CHECK(std::isfinite(factor) && factor >= sim::CostModel::kMinSlowdown &&
                      factor <= sim::CostModel::kMaxSlowdown,
                  "--straggler ", device, ":", factor, ": expected a factor in ",
                  sim::CostModel::kMinSlowdown, "..", sim::CostModel::kMaxSlowdown, ", got ",
                  factor);
    }
    for (const std::string& spec : a.sim.faults) {
      const sim::Fault f = sim::parse_fault(spec, "--fault");  // names --fault and the spec
      const bool skip = f.kind == sim::Fault::Kind::skip_collective;
      const int d = skip ? f.rank : f.device;
      DITTO_CHECK(d >= 0 && d < devices, "--fault '", spec, "': expected a ",
                  skip ? "rank" : "device", " in 0..", devices - 1, ", got ", d);
    }
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  // A profile name (a .json file's own errors, its contents, stay the library's).
  const std::string& p = a.sim.profile;
  if (!p.empty() && (p.size() < 5 || p.compare(p.size() - 5, 5, ".json") != 0)) try {
      sim::device_profile(p);
    } catch (const InvalidArgument& e) {
      throw UsageError(detail::cat("--profile: expected one of h100-sxm, h200, a100-sxm-80gb, "
                                   "a100-sxm-40gb, rtx4070-laptop or a .json file, got '", p,
                                   "'"));
    }
}

/// One run of the parsed command line; `a` is the Args `app`'s options write to (its defaults
/// settled here, in place, so that cli_settings compares the effective values).
int run(Args& a, const CLI::App& app, Capture* capture) {
  train::TrainerConfig& c = a.cfg;
  const bool processes = dist::is_initialized(), lead = dist::rank() == 0;
  std::shared_ptr<train::CsvDataSource> rows;
  ditto_train::GptData text;
  std::shared_ptr<train::DataSource> data;
  const bool gpt = a.model == "gpt";
  std::shared_ptr<const io::GptWeights> init_weights;  // --init-from's, shared by the replicas
  // The options' checks, their defaults and the data, refused on this process alone or not:
  // under mpirun the start-up exchange below carries the error instead of the settings, so the
  // other processes fail at once, naming this rank, instead of waiting for it.
  std::exception_ptr refused;
  try {
    // A dry run predicts a production run: fast mode (llm.c's, nanoGPT's) unless asked otherwise.
    if (c.dry_run && !a.given.count("--determinism")) a.determinism = "fast";
    c.determinism = parse_determinism(a.determinism);
    DITTO_CHECK(a.dtype == "f32" || a.dtype == "bf16" || a.dtype == "f16",
                "--dtype: expected f32, bf16 or f16, got '", a.dtype, "'");
    c.dtype = a.dtype == "bf16" ? DType::bf16 : a.dtype == "f16" ? DType::f16 : DType::f32;
    DITTO_CHECK(a.model == "mlp" || a.model == "gpt", "--model: expected mlp or gpt, got '",
                a.model, "'");
    if (!gpt) {
      for (const std::string& opt : ditto_train::gpt_only_options())
        DITTO_CHECK(!a.given.count(opt), opt, ": expected --model gpt, got --model mlp");
      for (const std::string& opt : ditto_train::weights_options())
        DITTO_CHECK(!a.given.count(opt), opt, ": expected --model gpt, got --model mlp");
    }
    data::CsvOptions csv;
    csv.label_column = a.label_column;
    if (a.header == "yes") csv.header = data::CsvHeader::yes;
    else if (a.header == "no") csv.header = data::CsvHeader::no;
    else DITTO_CHECK(a.header == "auto", "--header: expected auto, yes or no, got '", a.header,
                     "'");
    DITTO_CHECK(a.val_fraction > 0 && a.val_fraction < 1,
                "--val-fraction: expected a value in (0, 1), got ", a.val_fraction);
    // The byte count must fit in size_t: converting a larger (or infinite) double is undefined.
    constexpr double kMaxSimMemoryGib = double(std::uint64_t(1) << 34);  // 2^34 GiB = 2^64 bytes
    DITTO_CHECK(a.sim_memory_gib > 0 && a.sim_memory_gib < kMaxSimMemoryGib,
                "--sim-memory-gib: expected a size in GiB > 0 and < 17179869184 (16 EiB), got ",
                a.sim_memory_gib);
    if (a.given.count("--sim-memory-gib"))
      c.memory_capacity = static_cast<std::size_t>(a.sim_memory_gib * double(1ull << 30));
    c.hidden = parse_sizes(a.hidden);
    // An empty path would silently mean "not given".
    for (const auto& [opt, value, what] :
         {std::tuple{"--checkpoint", &c.checkpoint_dir, "a directory"},
          std::tuple{"--resume", &c.resume_dir, "a checkpoint directory"},
          std::tuple{"--trace", &a.sim.trace, "a file name"},
          std::tuple{"--profile", &a.sim.profile, "a profile name or .json file"},
          std::tuple{"--metrics-jsonl", &a.jsonl, "a file name"}})
      DITTO_CHECK(!a.given.count(opt) || !value->empty(), opt, ": expected ", what,
                  ", got an empty string");
    for (const std::string& s : a.stragglers) a.sim.stragglers.push_back(parse_straggler(s));
    // They change only the cost model's virtual times, which --profile (the predicted: line) or
    // --trace shows; without either they would be silently ignored (under mpirun the Trainer
    // refuses --straggler whatever comes with it: its own error).
    DITTO_CHECK(!a.given.count("--verbose") || !a.sim.profile.empty(), "--verbose: prints the cost "
                "model's table of the predicted step: expected --profile (or --dry-run --profile) "
                "with it, got none");
    for (const std::string opt : {"--interconnect", "--straggler"})
      DITTO_CHECK((processes && opt == "--straggler") || !a.given.count(opt) ||
                      !a.sim.profile.empty() || !a.sim.trace.empty(),
                  opt, ": changes only the cost model's predicted times: expected --profile (or "
                  "--trace) with it, got neither");
    // Without the cost model --nodes N only multiplies the devices (and, past a power of two,
    // changes the checksum): --devices says that.
    DITTO_CHECK(processes || a.sim.nodes == 1 || !a.sim.profile.empty() || !a.sim.trace.empty(),
                "--nodes: "
                "the nodes are the cost model's cluster (InfiniBand between them): expected "
                "--profile (or --trace) with it, got neither (without them --nodes ", a.sim.nodes,
                " would only train on ", a.sim.nodes, " x ", c.devices, " = ",
                static_cast<long long>(a.sim.nodes) * c.devices, " devices; --devices ",
                static_cast<long long>(a.sim.nodes) * c.devices, " does that)");
    if (c.resume_dir == "auto") c.resume_dir = resolve_resume_auto(c.checkpoint_dir, lead);
    if (processes && !a.given.count("--trainer")) a.trainer = "ddp";  // the default there
    c.trainer = train::parse_trainer_kind(a.trainer, "--trainer");
    if (processes)  // (--trainer dp under mpirun: the Trainer's check)
      DITTO_CHECK(!a.given.count("--devices") || c.devices == dist::world_size(), "--devices: "
                  "under mpirun the ranks are the ", dist::world_size(), " processes: expected ",
                  dist::world_size(), " or no --devices, got ", c.devices);
    check_option_values(a, c, processes ? dist::world_size()
                                        : static_cast<long long>(c.devices) * a.sim.nodes);
    std::string why;
    c.backend = resolve_backend_name(a.backend, &why);
    if (a.backend == "auto" && c.backend != "cuda" && lead)
      std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
    // (--dry-run on another backend or under mpirun: sim::SimRun's check, with the Trainer's)
    DITTO_CHECK(!c.dry_run || !a.sim.profile.empty(), "--dry-run: expected --profile (the GPU to "
                "predict for, e.g. a100-sxm-80gb), got none");

    if (gpt && !a.given.count("--data"))
      a.data = ditto_examples::bundled_data_path("shakespeare.txt");
    check_outputs_are_not_inputs(a, c);
    if (gpt) {
      init_weights = ditto_train::apply_init_from(a.weights, a.gpt, a.given);
      ditto_train::apply_preset(a.gpt, a.given);
      if (c.dry_run) {  // a prediction: a few steps, no evaluation or sample unless asked for
        if (!a.given.count("--max-iters")) a.gpt.max_iters = 2;
        if (!a.given.count("--eval-iters")) a.gpt.eval_iters = 0;
        if (!a.given.count("--sample")) a.gpt.sample = 0;
        if (!a.given.count("--lr-decay-iters"))
          a.gpt.lr_decay_iters = std::max(a.gpt.max_iters, a.gpt.warmup_iters + 1);
      }
      text = ditto_train::configure_gpt(a.gpt, a.given, a.data, c);
      ditto_train::configure_weights(a.weights, init_weights, a.gpt, a.given, a.data, c);
      data = text.source;
    } else {
      rows = std::make_shared<train::CsvDataSource>(a.data, csv, a.val_fraction, c.seed);
      data = with_classes(rows, a);
    }
    DITTO_CHECK(a.log_interval >= 0 || !a.given.count("--log-interval"), "--log-interval: "
                "expected an integer >= 0 (0: no progress lines), got ", a.log_interval);
    if (gpt) {
      c.log_interval = a.given.count("--log-interval") ? a.log_interval : 10;
    } else if (a.given.count("--log-interval")) {
      c.log_interval = a.log_interval;
    } else {  // a line per 100 steps, in epochs longer than that (the epoch lines are enough)
      c.log_interval = data->batches_per_epoch(c.batch_size) > 100 ? 100 : 0;
    }
  } catch (const InvalidArgument& e) {
    if (!processes) rethrow_usage(e);
    refused = std::current_exception();
  } catch (...) {
    if (!processes) throw;
    refused = std::current_exception();
  }
  // torchrun's rendezvous, in Trainer::fit's first step: processes given different options fail
  // together, each naming the option (compared first, by their effective values), both values
  // and both ranks. One that refused its own (here or in the Trainer's validation) joins that
  // exchange with its error, so that the others fail at once naming it (train::refuse_run).
  const std::int64_t agree_timeout_ms =
      c.comm_timeout_ms > 0 ? c.comm_timeout_ms : CommOptions{}.timeout_ms;
  if (refused) train::refuse_run(refused, agree_timeout_ms);
  if (processes) c.rank_settings = cli_settings(app, a, data.get());
  const std::shared_ptr<sim::SimRun> sim_run = sim::add_sim_run(c, a.sim);
  // Opened when the run starts (after every check), so a refused run leaves FILE untouched.
  std::unique_ptr<train::JsonLinesWriter> jsonl;
  auto open_jsonl = [&] {
    if (!a.jsonl.empty() && lead) try {
        jsonl = std::make_unique<train::JsonLinesWriter>(a.jsonl);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(detail::cat("--metrics-jsonl: ", e.what()));
      }
  };
  train::TrainerCallbacks cb;
  cb.on_resume = [gpt](const std::string& dir, const TrainerState& ts) {
    if (gpt)  // iteration mode: the step is the whole position
      std::printf("ditto-train: resumed from %s at step %" PRId64 "\n", dir.c_str(), ts.step);
    else
      std::printf("ditto-train: resumed from %s at step %" PRId64 " (epoch %" PRId64
                  ", batch %" PRId64 ")\n", dir.c_str(), ts.step, ts.epoch + 1, ts.batch);
  };
  cb.on_start = [&](const train::RunInfo& r) {
    open_jsonl();
    if (init_weights) ditto_train::print_init_from(a.weights, *init_weights);
    if (gpt)
      ditto_train::print_gpt_start(r, a.gpt, c, text);
    else if (r.trainer == train::TrainerKind::ddp)
      std::printf("ditto-train: trainer=ddp backend=%s ranks=%d (%s) determinism=%s data=%s "
                  "batch=%" PRId64 " epochs=%d bucket_cap_mb=%g\n", r.backend.c_str(),
                  r.devices, r.processes ? "processes" : "threads",
                  determinism_name(r.determinism), a.data.c_str(), c.batch_size, c.epochs,
                  c.bucket_cap_mb);
    else
      std::printf("ditto-train: backend=%s devices=%d determinism=%s model=%s params=%" PRId64
                  " data=%s rows=%" PRId64 " (train %" PRId64 ", val %" PRId64 ") batch=%" PRId64
                  " epochs=%d loss=%s optimizer=%s lr=%g momentum=%g seed=%" PRIu64 "\n",
                  r.backend.c_str(), r.devices, determinism_name(r.determinism),
                  r.model.c_str(), r.params, a.data.c_str(), rows->rows(), rows->train_size(),
                  rows->eval_set().size(), c.batch_size, c.epochs, c.loss.c_str(),
                  c.optimizer.c_str(), r.lr, c.optimizer == "sgd" ? c.momentum : 0.0f, c.seed);
    if (c.grad_accum_steps > 1)
      std::printf("ditto-train: grad_accum_steps=%" PRId64 " (micro-steps per optimizer step of "
                  "batch %" PRId64 ")\n", c.grad_accum_steps, c.batch_size);
    std::fflush(stdout);
  };
  cb.on_epoch = [&](const train::EpochMetrics& m) {
    if (m.dry_run)  // nothing ran: no losses or accuracy, only the cost model's prediction
      std::printf("epoch %3d  predicted: epoch_time=%.4f ms samples/s=%.0f (dry run: nothing "
                  "ran)\n", m.epoch, m.predicted_time_s * 1e3, m.predicted_samples_per_s);
    else
      std::printf("epoch %3d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  samples/s=%.0f\n",
                  m.epoch, m.train_loss, m.val_loss, m.val_acc, m.samples_per_s);
    std::fflush(stdout);
    if (jsonl) jsonl->write(m);
  };
  cb.on_eval = [&](const train::EvalMetrics& m) {
    ditto_train::print_gpt_eval(m);
    if (jsonl) jsonl->write(m);
  };
  // What fails after training (the sample, writing the trace or a JSON line) must not lose the
  // run's result: its error is kept and reported after the final line and JSON record, exit 1.
  std::vector<std::string> late_errors;
  cb.on_step = [&](const train::StepMetrics& m) {
    print_step(m, c, a.sim.profile);
    if (jsonl) jsonl->write(m);
  };
  if (gpt)
    cb.on_finish = [&](train::Replica& rep) {
      try {
        const std::string sample = ditto_train::gpt_sample(rep, a.gpt, text, c.seed);
        if (!sample.empty()) {
          if (text.tokens)  // token ids (no tokenizer here: tiktoken's gpt2 decodes them)
            std::printf("sample (%" PRId64 " token ids, temperature %g, top_k %" PRId64
                        ", seed %" PRIu64 "):\n", a.gpt.sample, a.gpt.temperature, a.gpt.top_k,
                        c.seed);
          else
            std::printf("sample (%zu characters, temperature %g, top_k %" PRId64 ", seed %"
                        PRIu64 "):\n", sample.size(), a.gpt.temperature, a.gpt.top_k, c.seed);
          std::fwrite(sample.data(), 1, sample.size(), stdout);  // every byte, NULs too
          std::fputc('\n', stdout);
        }
      } catch (const std::exception& e) {
        late_errors.push_back(detail::cat("--sample: ", e.what()));
      }
      try {
        ditto_train::export_model(a.weights, rep, text.model);
      } catch (const std::exception& e) {
        late_errors.push_back(detail::cat("--export: ", e.what()));
      }
    };
  if (!c.checkpoint_dir.empty() && !capture) {  // Note [Graceful stop]
    c.stop = &g_stop;
    install_stop_handlers(c.checkpoint_dir);
  }
  std::optional<train::Trainer> trainer;
  try {
    trainer.emplace(c, data, cb);  // TrainerConfig's validation and sim::SimRun's
  } catch (const InvalidArgument& e) {
    if (!processes) rethrow_usage(e);
    train::refuse_run(std::current_exception(), agree_timeout_ms);
  }
  if (lead && !capture)  // after the config's validation: about settings that are valid
    warn_settings(a, c, processes ? dist::world_size() : static_cast<long long>(c.devices) * a.sim.nodes);
  train::FitResult r = trainer->fit();
  if (capture) capture->result = r;
  if (r.stopped) {
    const int sig = g_stop.load();
    if (r.lead)
      std::printf("ditto-train: stopped by %s after step %" PRId64 ": checkpoint %s/step-%08"
                  PRId64 " written; resume with --resume %s\n",
                  sig == SIGINT ? "SIGINT" : "SIGTERM", r.steps, c.checkpoint_dir.c_str(),
                  r.steps, c.checkpoint_dir.c_str());
    std::fflush(stdout);
    return 128 + sig;
  }
  if (!r.lead) return 0;
  print_final(r, sim_run->report(), gpt ? a.gpt.block_size : 0);
  if (gpt) ditto_train::print_gpt_prediction(r, text, c);
  if (a.verbose && r.prediction) {
    const std::string title = detail::cat(
        "predicted step, kernels by kind on sim:0 (determinism=", determinism_name(c.determinism),
        " dtype=", dtype_name(c.dtype), r.prediction->rates.allow_tf32 ? " allow_tf32" : "",
        "; per step, mean of ", r.prediction->steps, " step", r.prediction->steps == 1 ? "" : "s",
        "; units: Note [Compute units] in backend_sim/cost_model.h):");
    std::fputs(train::format_step_kernels(*r.prediction, title).c_str(), stdout);
  }
  late_errors.insert(late_errors.end(), r.output_errors.begin(), r.output_errors.end());
  if (jsonl) try {
      jsonl->write(r);
    } catch (const std::exception& e) {
      late_errors.push_back(detail::cat("--metrics-jsonl: ", e.what()));
    }
  std::fflush(stdout);
  if (late_errors.empty()) return 0;
  if (capture) {
    capture->error = late_errors.front();
    return 1;
  }
  for (const std::string& e : late_errors)
    std::fprintf(stderr, "ditto-train: error: after training (the result above is complete): "
                 "%s\n", e.c_str());
  return 1;
}

int cli_main(int argc, char** argv, Capture* capture);

/// A process of an mpirun job that leaves before training with status 0 (--help, --version):
/// MPI_Init of the ranks that train waits for every process of the job, so it would wait forever
/// (`mpirun -np 1 ditto-train : -np 1 ditto-train --version`; mpirun ends a job only when a
/// process fails). This one joins the job and refuses in the settings agreement
/// (check_ranks_agree), so those ranks fail at once naming it. Returns `rc`.
int leave_mpi_job(int rc, int argc, char** argv, const std::string& what) {
  if (!dist::launched_by_mpirun() || dist::is_initialized()) return rc;
  try {
    dist::init(&argc, &argv);
    train::check_ranks_agree(
        {}, CommOptions{}.timeout_ms,
        std::make_exception_ptr(InvalidArgument(detail::cat(
            "ditto-train ", what, " does not train, and under mpirun every process must run the "
            "same training command (the other side of an MPMD ':' included)"))));
  } catch (const std::exception&) {  // its own refusal, which the others report
  }
  dist::finalize();
  return rc;
}

/// stdout goes to /dev/null while this lives (a nested run's own lines stay out of the table).
class QuietStdout {
 public:
  QuietStdout() {
    std::fflush(stdout);
    saved_ = ::dup(STDOUT_FILENO);
    const int null = ::open("/dev/null", O_WRONLY);
    if (saved_ >= 0 && null >= 0) ::dup2(null, STDOUT_FILENO);
    if (null >= 0) ::close(null);
  }
  ~QuietStdout() {
    std::fflush(stdout);
    if (saved_ >= 0) {
      ::dup2(saved_, STDOUT_FILENO);
      ::close(saved_);
    }
  }
  QuietStdout(const QuietStdout&) = delete;
  QuietStdout& operator=(const QuietStdout&) = delete;

 private:
  int saved_ = -1;
};

/// --predict-table's second table: each published training run's dry run (sim::training_cases,
/// Note [Published figures]) made as `ditto-train <its args>` in this process, its tokens/s
/// (samples/s x the sequence length) and largest per-device peak memory.
std::vector<sim::TrainingComparison> run_training_cases() {
  std::vector<sim::TrainingComparison> rows;
  for (const sim::TrainingCase& tc : sim::training_cases()) {
    sim::TrainingComparison row;
    row.c = tc;
    std::vector<std::string> args{"ditto-train"};
    args.insert(args.end(), tc.args.begin(), tc.args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    Capture cap;
    int rc = 1;
    {
      QuietStdout quiet;
      rc = cli_main(static_cast<int>(args.size()), argv.data(), &cap);
    }
    if (rc != 0 && cap.error.empty()) cap.error = "exit status " + std::to_string(rc);
    row.error = cap.error;
    if (row.error.empty()) {
      if (const auto& p = cap.result.prediction) {
        row.predicted_step_s = p->step_time_s;
        row.predicted = p->samples_per_s * static_cast<double>(tc.seq_len);
      } else {
        row.error = "the run made no prediction";
      }
      for (const train::DeviceMemory& m : cap.result.memory)
        row.peak_memory_gib = std::max(row.peak_memory_gib,
                                       static_cast<double>(m.stats.peak) / 1073741824.0);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

/// The shortest %g text that reads back as `v` (0.05, not 0.050000000000000003).
std::string shortest(double v) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

/// A value as compared across ranks: a number in one spelling (8, 8.0 and 8e0 are 8; 0.05 and .05
/// the same double), a flag's true / false in one spelling, anything else as it is.
std::string canonical_value(const std::string& v, bool flag) {
  if (flag) {
    if (v.empty() || v == "1" || v == "true" || v == "on" || v == "yes") return "true";
    if (v == "0" || v == "false" || v == "off" || v == "no") return "false";
    return v;
  }
  if (v.empty() || std::isspace(static_cast<unsigned char>(v.front()))) return v;
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(v.c_str(), &end, 10);
  if (*end == '\0' && errno == 0) return std::to_string(i);
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (*end != '\0' || errno != 0) return v;
  return shortest(d == 0 ? 0.0 : d);  // -0 is 0
}

/// The options every process of an mpirun job must agree on, by their effective values (after
/// run() settled the defaults in `a`, so an option left at its default and the same value given
/// explicitly agree), in --help's order: every option but the output-only --metrics-jsonl and
/// --log-interval (rank 0 writes them), --help and --version. `data`: the run's data (the effective --classes).
train::RankSettings cli_settings(const CLI::App& app, const Args& a,
                                 const train::DataSource* data) {
  const train::TrainerConfig& c = a.cfg;
  // Options whose variable is not the effective value: --lr's (the optimizer's or the GPT's
  // default when not given), --classes' (0: the largest label + 1), --devices' (the processes).
  // --lr as the float it is (0.05, not the double nearest that float).
  const float lr = c.effective_lr();
  std::string lr_text = shortest(lr);
  for (int digits = 1; digits <= 9; ++digits) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(lr));
    if (std::strtof(buf, nullptr) == lr) {
      lr_text = buf;
      break;
    }
  }
  std::map<std::string, std::string> effective{{"--lr", lr_text},
                                               {"--devices", std::to_string(dist::world_size())}};
  if (data) effective["--classes"] = std::to_string(data->num_outputs());
  train::RankSettings out;
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (name.rfind("--", 0) != 0 || name == "--help" || name == "--version" ||
        name == "--metrics-jsonl" || name == "--log-interval")
      continue;
    const bool flag = opt->get_expected_min() == 0;
    std::string value;
    if (auto it = effective.find(name); it != effective.end()) {
      value = it->second;
    } else if (opt->count() > 0) {  // as given (the variable holds it; its text is exact)
      std::vector<std::string> given = opt->results();
      if (opt->get_multi_option_policy() == CLI::MultiOptionPolicy::TakeLast && given.size() > 1)
        given.erase(given.begin(), given.end() - 1);  // the value in effect (the last)
      for (const std::string& r : given)
        value += (value.empty() ? "" : " ") + canonical_value(r, flag);
      if (flag && value.empty()) value = "true";
    } else {  // not given: the variable's value now, after run() settled its default
      value = canonical_value(const_cast<CLI::Option*>(opt)->capture_default_str()
                                  ->get_default_str(), false);
      if (flag) value = value.empty() ? "false" : canonical_value(value, true);
      if (value == "[]") value = "(none)";  // a repeatable option not given
    }
    out.emplace_back(name, value);
  }
  // --lr last: when not given it follows --optimizer (and --model), which then differs first.
  const auto lr_at = std::find_if(out.begin(), out.end(), [](const auto& s) {
    return s.first == "--lr";
  });
  if (lr_at != out.end()) std::rotate(lr_at, lr_at + 1, out.end());
  return out;
}

/// ditto-train's command line; `capture` (nested runs of --predict-table): the run's result or
/// error is stored there instead of printed.
int cli_main(int argc, char** argv, Capture* capture) {
  Args a;
  train::TrainerConfig& c = a.cfg;
  c.field_names = {{"epochs", "--epochs"}, {"lr", "--lr"}, {"batch_size", "--batch-size"},
                   {"devices", "--devices"}, {"nodes", "--nodes"}, {"loss", "--loss"},
                   {"optimizer", "--optimizer"}, {"checkpoint_every", "--checkpoint-every"},
                   {"checkpoint_dir", "--checkpoint"}, {"resume_dir", "--resume"},
                   {"trace", "--trace"}, {"profile", "--profile"}, {"backend", "--backend"},
                   {"stragglers", "--straggler"}, {"faults", "--fault"},
                   {"comm_timeout_ms", "--comm-timeout-ms"}, {"trainer", "--trainer"},
                   {"bucket_cap_mb", "--bucket-cap-mb"}, {"hidden", "--hidden"},
                   {"dtype", "--dtype"}, {"micro_shards", "--micro-shards"},
                   {"grad_accum_steps", "--grad-accum-steps"}, {"zero_stage", "--zero-stage"},
                   {"dry_run", "--dry-run"}, {"allow_nonfinite_loss", "--allow-nonfinite-loss"},
                   {"allow_tf32", "--allow-tf32"},
                   {"momentum", "--momentum"}, {"weight_decay", "--weight-decay"}};
  float lr = 0.05f;
  CLI::App app{"ditto-train: data-parallel training (an MLP on CSV rows, or nanoGPT's character "
               "GPT with --model gpt) on simulated or real GPUs"};
  // A repeated option: the last value wins (argparse's store); --straggler, --fault and --export
  // collect (each --export writes its file).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // An option whose --help shows its default.
  auto with_default = [&app](const char* name, auto& value, const char* help) {
    return app.add_option(name, value, help)->capture_default_str();
  };
  with_default("--model", a.model,
               "mlp (on --data CSV rows) or gpt (nanoGPT's character model on --data text, "
               "default the bundled shakespeare.txt; its options below)");
  with_default("--backend", a.backend, "sim, cuda or auto (cuda when a GPU is usable)");
  with_default("--devices", c.devices, "number of devices (data-parallel replicas)");
  with_default("--data", a.data, "CSV file: numeric features, integer class label (--model gpt: "
               "a text file, default the bundled shakespeare.txt, or token files: llm.c shards "
               "or nanoGPT's train.bin, one file, a comma list or a glob; see --data-format)");
  with_default("--label-column", a.label_column, "label column (negative counts from the end)");
  app.add_option("--classes", a.classes,
                 "classes of the model's output (every label < N, as CrossEntropyLoss's "
                 "num_classes; default the largest label + 1; at most 65536, labels 0..65535)");
  with_default("--header", a.header, "first row is a header: auto, yes or no");
  with_default("--hidden", a.hidden,
               "hidden layer sizes, comma-separated (e.g. 256,128; '' for no hidden layer)");
  with_default("--epochs", c.epochs, "training epochs");
  with_default("--batch-size", c.batch_size,
               "global batch size (split over the devices; --model gpt: default 12)");
  app.add_option("--lr", lr, "learning rate (default 0.05 for sgd, 0.001 for adam; --model gpt: "
                             "the peak of the schedule, default 0.001)");
  with_default("--momentum", c.momentum, "SGD momentum");
  with_default("--loss", c.loss, "cross-entropy or mse (on one-hot targets)");
  with_default("--optimizer", c.optimizer, "sgd or adam");
  with_default("--micro-shards", c.micro_shards,
               "micro-shards K of a batch in bitwise mode (power of two >= devices)");
  with_default("--grad-accum-steps", c.grad_accum_steps,
               "micro-steps per optimizer step (nanoGPT's gradient_accumulation_steps; ddp: "
               "no_sync on all but the last): each takes a contiguous part of --batch-size; "
               "bitwise: a power of two with micro-shards divisible by it x devices, the same "
               "bits as 1");
  with_default("--weight-decay", c.weight_decay,
               "SGD weight decay (--model gpt: AdamW's, on the 2-D weights, default 0.1)");
  with_default("--seed", c.seed, "seed for initialisation, split and shuffling")
      ->check(ditto_cli::non_negative())
      ->check(ditto_cli::uint64_value());
  with_default("--val-fraction", a.val_fraction, "fraction of rows held out for validation");
  with_default("--determinism", a.determinism,
               "bitwise (same bits for any power-of-two device count) or fast");
  with_default("--dtype", a.dtype,
               "f32, or mixed precision bf16 / f16: parameters, activations and gradients "
               "stored in that dtype, f32 master weights and optimizer state (f16 adds dynamic "
               "loss scaling, as torch's GradScaler)");
  with_default("--sim-memory-gib", a.sim_memory_gib, "memory capacity of each simulated device");
  app.add_option("--profile", a.sim.profile,
                 "sim: device profile for the cost model and memory capacity (h100-sxm, h200, "
                 "a100-sxm-80gb, a100-sxm-40gb, rtx4070-laptop, or a .json file); prints the "
                 "predicted step");
  app.add_flag("--dry-run", c.dry_run,
               "sim: price every kernel, copy and collective and account every allocation "
               "without running them or holding tensor data (predicts a large model's step time "
               "and memory in seconds; fast determinism unless --determinism is given)");
  app.add_flag("--allow-tf32", c.allow_tf32,
               "fast mode: f32 matrix products may run on TF32 tensor cores (cuda: cuBLASLt's "
               "CUBLAS_COMPUTE_32F_FAST_TF32; torch's allow_tf32). Default: strict f32");
  app.add_flag("--allow-nonfinite-loss", c.allow_nonfinite_loss,
               "keep training after a step whose loss is NaN or inf (default: stop with an "
               "error naming the step)");
  with_default("--interconnect", a.sim.interconnect,
               "sim: links between GPUs: auto, nvlink, nvlink3, pcie5, pcie4");
  with_default("--nodes", a.sim.nodes, "sim: nodes of --devices GPUs each (InfiniBand between)");
  app.add_option("--trace", a.sim.trace, "sim: write a Chrome trace JSON (Perfetto) to this file");
  app.add_flag("--verbose", a.verbose,
               "with --profile (e.g. --dry-run): after the prediction, a table of the predicted "
               "step's kernels by kind on device 0: launches, FLOP, bytes, the unit each is "
               "priced on (tensor core, SIMT, memory), time and share of the step");
  app.add_option("--straggler", a.stragglers,
                 "sim: DEVICE:FACTOR, that device's kernels take FACTOR times longer (repeatable)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  bool table = false;
  app.add_flag("--predict-table", table,
               "print the cost model's all_reduce figures and dry runs of llm.c's GPT-2 runs next "
               "to the published figures, then exit (status 1 if a row is outside its tolerance "
               "and not a known gap)");
  app.add_option("--checkpoint", c.checkpoint_dir,
                 "directory to save checkpoints in (and at the end)");
  app.add_option("--checkpoint-every", c.checkpoint_every, "optimizer steps between checkpoints");
  app.add_option("--resume", c.resume_dir,
                 "resume from the newest usable checkpoint in DIR; auto: from --checkpoint's DIR "
                 "when it holds one, else start fresh (a restart loop's every run)");
  with_default("--trainer", a.trainer,
               "dp (DataParallel, one controller thread) or ddp (DistributedDataParallel, a "
               "thread per rank; under mpirun a process per rank, the default there)");
  with_default("--bucket-cap-mb", c.bucket_cap_mb, "ddp: gradient bucket size cap in MiB");
  with_default("--zero-stage", c.zero_stage,
               "ddp: 1 shards the optimizer state over the ranks (ZeRO-1, llm.c's -z 1; "
               "gradients reduce_scatter, parameters all_gather), 0 none");
  app.add_option("--fault", a.sim.faults,
                 "sim: inject a fault (repeatable): fail:device=D,step=S | "
                 "alloc:device=D,after=N | skip-collective:rank=R,index=K")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  with_default("--comm-timeout-ms", c.comm_timeout_ms,
               "sim: timeout of every communicator in ms (0: their own; at most 2^31)");
  app.add_option("--metrics-jsonl", a.jsonl,
                 "write each epoch's metrics and the final ones as JSON lines to this file");
  app.add_option("--log-interval", a.log_interval,
                 "steps between progress lines 'iter N: loss L, time Tms[, mfu M%]' (nanoGPT's "
                 "log_interval; also JSON lines): default 10 for --model gpt; the MLP's default "
                 "100 prints only in epochs longer than that; 0: none");
  ditto_train::add_gpt_options(app, a.gpt);
  ditto_train::add_weights_options(app, a.weights);
  ditto_cli::add_version(app, "ditto-train");
  ditto_cli::check_numeric_values(app, expected_values());  // '' refused, 010 decimal
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (capture && e.get_exit_code() != 0) {
      capture->error = e.what();
      return ditto_cli::kUsageError;
    }
    const int rc = ditto_cli::parse_error(app, e, "ditto-train", expected_values());
    const bool version = dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr;
    return rc == 0 ? leave_mpi_job(rc, argc, argv, version ? "--version" : "--help") : rc;
  }
  std::set<std::string> named{"--checkpoint", "--resume", "--trace", "--profile", "--devices",
                              "--trainer", "--sim-memory-gib", "--metrics-jsonl", "--data",
                              "--batch-size", "--lr", "--weight-decay", "--determinism",
                              "--interconnect", "--straggler", "--classes", "--log-interval",
                              "--bucket-cap-mb", "--micro-shards", "--verbose"};
  named.insert(ditto_train::gpt_only_options().begin(), ditto_train::gpt_only_options().end());
  named.insert(ditto_train::mlp_only_options().begin(), ditto_train::mlp_only_options().end());
  named.insert(ditto_train::weights_options().begin(), ditto_train::weights_options().end());
  for (const std::string& opt : named)
    if (app.count(opt) > 0) a.given.insert(opt);
  if (app.count("--lr") > 0) c.lr = lr;
  if (table) {
    // Exit status 1 when a row is outside its tolerance without being a known gap (Note
    // [Published figures]): the ctest then fails instead of the table drifting silently.
    const auto nccl = sim::published_comparisons();
    std::fputs(sim::format_published_table(nccl).c_str(), stdout);
    std::fputs("\n", stdout);
    const auto training = run_training_cases();
    std::fputs(sim::format_training_table(training).c_str(), stdout);
    int unexplained = 0;
    for (const auto& r : nccl) unexplained += !r.within_tolerance() && !r.known_gap;
    for (const auto& r : training) unexplained += !r.within_tolerance() && !r.c.known_gap;
    if (unexplained > 0)
      std::fprintf(stderr, "ditto-train: --predict-table: %d row%s outside %s tolerance and not "
                   "a known gap (marked FAIL)\n", unexplained, unexplained > 1 ? "s" : "",
                   unexplained > 1 ? "their" : "its");
    return unexplained > 0 ? 1 : 0;
  }
  int rc = 1;
  try {
    // Started by mpirun: this process is one rank (--trainer ddp), the job's processes the ranks.
    if (dist::launched_by_mpirun()) dist::init(&argc, &argv);
    rc = run(a, app, capture);  // under mpirun it checks that the processes agree before training
  } catch (const UsageError& e) {
    if (capture)
      capture->error = e.what();
    else
      std::fprintf(stderr, "ditto-train: error: %s\n", e.what());
    rc = ditto_cli::kUsageError;
  } catch (const std::exception& e) {
    // A bare std::bad_alloc says only "std::bad_alloc": say what it means.
    const std::string what = dynamic_cast<const std::bad_alloc*>(&e) != nullptr
        ? "out of host memory (std::bad_alloc: a host allocation failed; `ulimit -v` may be too "
          "low: use fewer --devices, a smaller model or batch, or raise it)"
        : e.what();
    if (capture)
      capture->error = what;
    else if (dist::is_initialized())
      std::fprintf(stderr, "ditto-train: error: rank %d: %s\n", dist::rank(), what.c_str());
    else
      std::fprintf(stderr, "ditto-train: error: %s\n", what.c_str());
    rc = 1;
  }
  if (!capture) dist::finalize();  // after every communicator is gone (they live in run)
  return rc;
}

}  // namespace

namespace {

// Note [Lost output]: the results go to stdout; a run whose stdout cannot be written (`>
// /dev/full`, a closed descriptor `>&-`, a full disk) must not exit 0 with every line lost. As
// coreutils' close_stdout: at exit stdout is flushed and closed, and an error on it (now or on an
// earlier write) prints "ditto-train: error: cannot write the results to stdout: <reason>" on
// stderr and exits 1. A descriptor 0, 1 or 2 closed at the start is first taken by /dev/null
// opened read-only, so that no file ditto opens (a checkpoint's) becomes "stdout" and gets the
// result lines, and writes to it fail with EBADF as they would on the closed descriptor.
void occupy_closed_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int got = ::open("/dev/null", O_RDONLY);  // the lowest free descriptor: `fd`
    if (got >= 0 && got != fd) ::close(got);
  }
}

int close_stdout(int rc) {
  int err = std::fflush(stdout) != 0 ? errno : 0;
  const bool failed = err != 0 || std::ferror(stdout);
  if (failed && err == 0) {  // an earlier write failed: its reason, from a write of 0 bytes
    char none = 0;
    err = ::write(STDOUT_FILENO, &none, 0) < 0 ? errno : EIO;
  }
  if (std::fclose(stdout) != 0 && !failed) err = errno;
  if (!failed && err == 0) return rc;
  std::fprintf(stderr, "ditto-train: error: cannot write the results to stdout: %s\n",
               std::strerror(err));
  return rc != 0 ? rc : 1;
}

}  // namespace

int main(int argc, char** argv) {
  occupy_closed_std_fds();
  // A write past `ulimit -f` fails with EFBIG (a ditto::Error naming the file) instead of
  // SIGXFSZ killing the run with no message and a half-written checkpoint left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  return close_stdout(cli_main(argc, argv, nullptr));
}
