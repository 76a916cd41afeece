// ditto-train: the main job. Trains an MLP data-parallel over several (simulated or real) GPUs on a
// CSV data set (by default the bundled digits set: 8x8 images, 10 classes), or with --model gpt
// nanoGPT's character model (core/train/gpt_recipe.h), and prints one line per epoch and a final
// line with a checksum of every parameter, so two runs compare with one string. Options ->
// TrainerConfig -> Trainer (core/train/trainer.h) -> the lines of core/train/metrics_format.h.
//
//   build/bin/ditto-train                          # 4 simulated GPUs, digits, MLP 64-128-10
//   build/bin/ditto-train --profile h100-sxm --devices 8   # + predicted step time on 8 H100s
//   build/bin/ditto-train --trainer ddp            # DistributedDataParallel, a thread per rank
//   mpirun -np 4 build/bin/ditto-train --trainer ddp   # the same, one rank per process (MPI)
//   build/bin/ditto-train --model gpt              # nanoGPT's Shakespeare character model
//   build/bin/ditto-train --model gpt --preset gpt2 --dry-run --profile a100-sxm-80gb
//       --devices 8 --trainer ddp --batch-size 128  # predict GPT-2 124M on 8 A100s, in seconds
//   build/bin/ditto-train --predict-table          # alias of build/bin/ditto-predict-table
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend_sim/profiles.h"
#include "backend_sim/sim_options.h"
#include "backend_sim/sim_run.h"
#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/distributed/distributed.h"
#include "core/io/file.h"
#include "core/train/graceful_stop.h"
#include "core/train/launcher.h"
#include "core/train/metrics_format.h"
#include "core/train/options.h"
#include "core/train/trainer.h"
#include "examples/bundled_data.h"
#include "examples/cli_common.h"
#include "examples/predict_table.h"

using namespace ditto;

namespace {

struct Args {
  std::string model = "mlp", jsonl;
  bool verbose = false;         // --verbose: the predicted step's kernel table
  bool table = false;           // --predict-table
  std::set<std::string> given;  // the flags given on the command line
  train::TrainerOptions t;      // the Trainer's options (core/train/options.h)
  train::CsvRowsOptions rows{.data = ditto_examples::bundled_data_path("digits.csv")};
  train::GptSettings gpt;      // --model gpt's options (their fields: --n-layer n_layer)
  sim::SimOptions sim;         // --profile, --interconnect, --nodes, --trace, ...
  train::OptionTable options;  // every option, in --help's order
};

/// Every option: ditto-train's own (the model, the outputs), the MLP's data's, the Trainer's, the
/// simulator's and the GPT's, each component's rows stated beside its settings.
train::OptionTable all_options(Args& a) {
  train::OptionTable t{
      train::option("--model", &a.model,
                    "mlp (on --data CSV rows) or gpt (nanoGPT's character model on --data "
                    "text, default the bundled shakespeare.txt; its options below)")};
  for (train::OptionTable part :
       {train::csv_rows_options(a.rows), train::trainer_options(a.t), sim::sim_options(a.sim),
        train::OptionTable{
            train::option(
                "--verbose", &a.verbose,
                "with --profile (e.g. --dry-run): after the prediction, a table of the "
                "predicted step's kernels by kind on device 0: launches, FLOP, bytes, the unit "
                "each is priced on (tensor core, SIMT, memory), time and share of the step"),
            train::option("--predict-table", &a.table,
                          "print the cost model's all_reduce figures and dry runs of llm.c's GPT-2 "
                          "runs next to the published figures, then exit (status 1 if a row is "
                          "outside its tolerance and not a known gap); alone: it uses no other "
                          "option"),
            train::option(
                "--metrics-jsonl", &a.jsonl,
                "write each epoch's metrics and the final ones as JSON lines to this file",
                "a file name")
                .no_default()
                .agree_as(train::Agree::no)},
        train::gpt_options(a.gpt)})
    t.insert(t.end(), part.begin(), part.end());
  return t;
}

/// A usage error found after parsing: an option's value, or a combination of options, that
/// run() or the Trainer's validation refuses ("--FLAG: expected ..., got ..."). ditto-train
/// exits 2 for it, as for the parser's own (argparse's parser.error).
struct UsageError : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

/// `e` as a UsageError when its message is one's: it names an option first and says what was
/// expected and what was got ("--FLAG: expected ..., got ...", "--FLAG x --OTHER: ... expected
/// ..., got ..."); not the contents of --data (a file's problem, not the command line's).
[[noreturn]] void rethrow_usage(const InvalidArgument& e) {
  const std::string m = e.what();
  const std::size_t expected = m.find("expected ");
  if (m.rfind("--", 0) == 0 && m.rfind("--data:", 0) != 0 && expected != std::string::npos &&
      m.find(", got ", expected) != std::string::npos)
    throw UsageError(m);
  throw;
}

/// A usage error of this process's own paths: UsageError (exit 2) in one process; under mpirun an
/// InvalidArgument, which the start-up exchange carries to the other ranks (train::refuse_run)
/// and cli_main reports naming this rank.
[[noreturn]] void path_usage_error(const std::string& message) {
  if (dist::is_initialized()) throw InvalidArgument(message);
  throw UsageError(message);
}

/// --checkpoint DIR, once every setting is valid (a refused run creates nothing) and before
/// training: created with its missing parents (as nanoGPT's os.makedirs(out_dir, exist_ok=True)
/// and torch.save's callers do) and writable, else a usage error (exit 2, as --export's unusable
/// files), naming the flag. On rank 0, which writes the checkpoints.
void create_checkpoint_dir(const train::TrainerConfig& c) {
  const std::string& ck = c.checkpoint_dir;
  if (ck.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(ck, ec);
  if (ec || !std::filesystem::is_directory(ck))
    path_usage_error(detail::cat("--checkpoint: expected a directory it may create or write, got '",
                                 ck, "': cannot create directory '", ck,
                                 "': ", ec ? ec.message() : std::string("Not a directory")));
  if (::access(ck.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    path_usage_error(detail::cat("--checkpoint: expected a directory it may create or write, got '",
                                 ck, "': ", std::strerror(err)));
  }
}

/// The run's other paths, checked before training as --export's files are (usage errors, exit
/// 2, naming the flag): --resume DIR must be a directory (DIR or one of its DIR/step-N);
/// --trace and --metrics-jsonl must be writable where they are (a device, a FIFO, /dev/stdout)
/// or creatable in an existing, writable directory (on rank 0 only, which writes them; every
/// rank reads its own --resume).
void check_run_paths(const train::TrainerConfig& c, const std::string& trace,
                     const std::string& jsonl, bool lead) {
  const std::string& rd = c.resume_dir;
  if (!rd.empty()) {
    struct stat st {};
    std::string got;  // why it is no directory
    if (::stat(rd.c_str(), &st) != 0) {
      got = detail::cat("': ", std::strerror(errno));
    } else if (!S_ISDIR(st.st_mode)) {
      const std::string hint = pytorch_file_hint(rd);  // nanoGPT's ckpt.pt: how to convert it
      got = detail::cat("', ", io::file_type_name(st.st_mode), hint.empty() ? "" : "; ", hint);
    }
    if (!got.empty())
      path_usage_error(detail::cat(
          "--resume: expected a checkpoint directory (the --checkpoint DIR of an earlier run, or "
          "one of its DIR/step-N), got '",
          rd, got));
  }
  if (!lead) return;
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--trace", trace}, {"--metrics-jsonl", jsonl}}) {
    if (path.empty()) continue;
    try {
      if (!io::check_in_place_output(path, flag)) io::check_replaceable_output(path, flag);
    } catch (const Error& e) {
      path_usage_error(e.what());
    }
  }
}

// Note [Out-of-memory hints]
// A device's OutOfMemory names only the allocation that failed ("tried to allocate 2955.72 MiB
// ..."). ditto-train adds what the run needs and what would fit, measured as --dry-run measures
// it: the run's settings run dry on the simulator (Note [Dry run], backend_sim/sim_backend.h:
// nothing is computed or held) with each device's capacity lifted (1 PiB, less past 8 devices),
// for at most two steps (or one epoch), give the fullest device's peak, and at least what stays
// between steps (the bytes still live at the end, the weights, gradients and optimizer state; or,
// where DDP's replicas are gone by then, the optimizer state the run reports). Each candidate
// change is run so too: a smaller micro-batch (--batch-size halved, or --grad-accum-steps doubled
// for the same batch) where a device's micro-batch is above 1, --dtype bf16 for f32, ZeRO-1 on
// more than one device (on one it only adds the f32 gradient shard: Note [GPT-2 memory],
// gpt_config.h). A change is suggested ("to fit: ...") only where its predicted peak fits the
// capacity; when none does, those that lower the peak by 1% or more are named with their peaks,
// and whether what stays between steps alone exceeds the capacity. A run that runs out of even
// the lifted capacity is said to need more than that. Before (tester 7, defect 3; the hint of
// tester 6, F7) a change was offered whenever Trainer::check accepted it: ZeRO-1 on one device,
// a smaller --batch-size at a micro-batch of 1, neither of which fits more, and the refusal never
// said how much the run needs.
// On the simulator only (the capacity of a CUDA device is the driver's), in one process (a dry
// run needs one). Cost: one dry run more than the changes tried. Measured in the check build
// (ASan + UBSan) on a shared 2-core machine (load about 8): gpt2-large in bf16 on one
// rtx4070-laptop at a micro-batch of 1 (no change to try) 0.5 s in all; gpt2-large in f32 on 8
// a100-sxm-40gb at --batch-size 128 (four changes) 9-11 s against 2 s for one dry run of it.

/// The fullest device's peak and live bytes of `c`'s run predicted by a dry run on the simulator
/// with the capacity lifted (Note [Out-of-memory hints]), nullopt where it cannot run (a setting
/// a dry run refuses) or fails.
struct DryPeak {
  std::size_t peak = 0;
  /// At least what stays between steps: the bytes live at the end (dp: the weights, gradients
  /// and optimizer state; ddp's replicas are gone by then, 0) or the optimizer state's.
  std::size_t resident = 0;
  std::string device;  // "sim:0, NVIDIA ..."
  bool more = false;   // it ran out of even the lifted capacity, `peak`: it needs more
};
std::optional<DryPeak> dry_peak(train::TrainerConfig c, std::shared_ptr<train::DataSource> data,
                                const sim::SimRunOptions& run) {
  sim::SimRunOptions o;  // the cluster only: no trace, fault or straggler
  o.profile = run.profile;
  o.interconnect = run.interconnect;
  o.nodes = run.nodes;
  c.extensions.clear();
  const auto devices = static_cast<std::size_t>(std::max(1, c.devices * o.nodes));
  c.backend = "sim";
  c.dry_run = true;
  // Lifted, within the span of Note [Dry addresses] (2^53 bytes in all; each device reserves up to
  // twice its capacity): 1 PiB a device up to 8 devices.
  const std::size_t lifted = std::min(std::size_t(1) << 50, (std::size_t(1) << 53) / devices);
  c.memory_capacity = lifted;
  c.checkpoint_dir.clear();
  c.checkpoint_every = 0;
  c.resume_dir.clear();
  c.stop = nullptr;
  c.log_interval = 0;
  if (c.max_iters > 0)
    c.max_iters = std::min<std::int64_t>(c.max_iters, 2);
  else
    c.epochs = std::min(c.epochs, 1);
  sim::add_sim_run(c, o);
  try {
    const train::FitResult r = train::Trainer(std::move(c), std::move(data)).fit();
    std::optional<DryPeak> out;
    for (const train::DeviceMemory& m : r.memory)
      if (!out || m.stats.peak > out->peak)
        out = DryPeak{m.stats.peak, std::max(m.stats.in_use, m.optimizer_state_bytes), m.device};
    if (out && r.prediction && !r.prediction->device_name.empty())
      out->device += ", " + r.prediction->device_name;
    return out;
  } catch (const OutOfMemory& e) {
    if (e.kind() != OutOfMemory::Kind::device) return std::nullopt;
    return DryPeak{lifted, 0, "sim:0", true};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// What an out-of-memory refusal of `c`'s run adds (Note [Out-of-memory hints]): "; ... the run
/// needs P at its peak on its fullest device (D) of C ...; to fit: ...", or "" where nothing can
/// be predicted.
std::string out_of_memory_hint(const train::TrainerConfig& c,
                               const std::shared_ptr<train::DataSource>& data,
                               const sim::SimRunOptions& run) {
  if (c.backend != "sim" || dist::is_initialized()) return "";
  const std::size_t capacity =
      c.memory_capacity ? *c.memory_capacity
      : !run.profile.empty()
          ? static_cast<std::size_t>(sim::device_profile(run.profile).memory_bytes)
          : BackendOptions{}.memory_capacity;
  const std::optional<DryPeak> need = dry_peak(c, data, run);
  if (!need) return "";
  if (need->more)
    return detail::cat("; a dry run with the capacity lifted to ", train::format_size(need->peak),
                       " a device ran out too: the run needs more than that on a device of ",
                       train::format_size(capacity), ": a smaller model");
  std::string s = detail::cat(
      "; predicted by a dry run with the capacity lifted, the run needs ",
      train::format_size(need->peak), " at its peak on its fullest device (", need->device, ") of ",
      train::format_size(capacity),
      need->resident > 0 ? detail::cat(", at least ", train::format_size(need->resident),
                                       " of it between steps (the weights, gradients and "
                                       "optimizer state)")
                         : std::string());
  if (need->peak <= capacity)
    return s + ": the run's own size fits, so this allocation failed for another reason (an "
               "injected --fault, or memory held elsewhere)";
  // The candidates (Note [Out-of-memory hints]), each predicted by its own dry run.
  struct Change {
    std::string flags, note;  // "--grad-accum-steps 4", "the same batch"
    std::function<void(train::TrainerConfig&)> apply;
  };
  std::vector<Change> changes;
  const std::int64_t all = static_cast<std::int64_t>(c.devices) * run.nodes;
  const std::int64_t per_device = (c.batch_size + all - 1) / all;
  if ((per_device + c.grad_accum_steps - 1) / c.grad_accum_steps > 1) {  // a micro-batch above 1
    const std::int64_t half = c.batch_size / 2, accum = c.grad_accum_steps * 2;
    changes.push_back({detail::cat(c.name_of("batch_size"), " ", half), "",
                       [half](train::TrainerConfig& v) { v.batch_size = half; }});
    changes.push_back({detail::cat(c.name_of("grad_accum_steps"), " ", accum), "the same batch",
                       [accum](train::TrainerConfig& v) { v.grad_accum_steps = accum; }});
  }
  if (c.dtype == DType::f32)
    changes.push_back({detail::cat(c.name_of("dtype"), " bf16"), "",
                       [](train::TrainerConfig& v) { v.dtype = DType::bf16; }});
  if (c.zero_stage == 0 && all > 1)
    changes.push_back(
        {c.trainer == train::TrainerKind::ddp
             ? detail::cat(c.name_of("zero_stage"), " 1")
             : detail::cat(c.name_of("trainer"), " ddp ", c.name_of("zero_stage"), " 1"),
         "", [](train::TrainerConfig& v) {
           v.trainer = train::TrainerKind::ddp;
           v.zero_stage = 1;
         }});
  std::string fit, lower;
  for (const Change& ch : changes) {
    train::TrainerConfig changed = c;
    ch.apply(changed);
    const std::optional<DryPeak> p = dry_peak(std::move(changed), data, run);
    // Refused, or not 1% lower (a smaller --batch-size at a device's micro-batch of 1 can save a
    // few bytes of the step's scalars).
    if (!p || p->more || p->peak > need->peak - need->peak / 100) continue;
    std::string& list = p->peak <= capacity ? fit : lower;
    list +=
        detail::cat(list.empty() ? "" : ", ", ch.flags, " (", ch.note.empty() ? "" : ch.note + "; ",
                    "peak ", train::format_size(p->peak), ")");
  }
  if (!fit.empty()) return s + "; to fit: " + fit;
  if (!lower.empty()) s += "; lower, not enough: " + lower;
  return s + (need->resident > capacity
                  ? "; what stays between steps alone exceeds the capacity: a smaller model or a "
                    "device with more memory"
                  : "; no change of the settings tried fits: a smaller model or a device with "
                    "more memory");
}

/// One run of the parsed command line; `a` is the Args the options wrote to (its defaults
/// settled here, in place, so that the ranks compare the effective values).
int run(Args& a) {
  train::TrainerConfig& c = a.t.config;
  train::GptSettings& g = a.gpt;
  const bool processes = dist::is_initialized(), lead = dist::rank() == 0;
  std::shared_ptr<train::CsvDataSource> rows;
  train::GptRun gpt_run;
  std::shared_ptr<train::DataSource> data;
  std::shared_ptr<sim::SimRun> sim_run;
  const bool gpt = a.model == "gpt";
  // The options' checks, their defaults and the data, refused on this process alone or not:
  // under mpirun the start-up exchange below carries the error instead of the settings, so the
  // other processes fail at once, naming this rank, instead of waiting for it.
  std::exception_ptr refused;
  try {
    DITTO_CHECK(a.model == "mlp" || a.model == "gpt", "--model: expected mlp or gpt, got '",
                a.model, "'");
    for (const train::OptionRow& r : a.options)  // the other model's options
      DITTO_CHECK(r.model.empty() || r.model == a.model || !a.given.count(r.flag), r.flag,
                  ": expected --model ", r.model,
                  r.model == "mlp" ? " (the GPT's options are nanoGPT's: --max-iters, not "
                                     "--epochs, with AdamW and cross-entropy)"
                                   : "",
                  ", got --model ", a.model);
    a.t.apply(a.given);
    DITTO_CHECK(!a.verbose || !a.sim.run.profile.empty(),
                "--verbose: prints the cost model's table of the predicted step: expected "
                "--profile (or --dry-run --profile) with it, got none");
    if (c.resume_dir == "auto") {  // a restart loop's every run: resume when DIR holds one
      DITTO_CHECK(!c.checkpoint_dir.empty(),
                  "--resume auto: expected --checkpoint DIR (auto "
                  "resumes from DIR when it holds a checkpoint, else starts fresh), got no "
                  "--checkpoint");
      const bool found = holds_checkpoint(c.checkpoint_dir, "--resume auto --checkpoint");
      if (lead)
        std::printf(found ? "ditto-train: --resume auto: %s holds a checkpoint: resuming\n"
                          : "ditto-train: --resume auto: no checkpoint in %s: starting fresh\n",
                    c.checkpoint_dir.c_str());
      c.resume_dir = found ? c.checkpoint_dir : std::string();
    }
    if (processes)  // (--trainer dp under mpirun: the Trainer's check)
      DITTO_CHECK(!a.given.count("--devices") || c.devices == dist::world_size(),
                  "--devices: "
                  "under mpirun the ranks are the ",
                  dist::world_size(), " processes: expected ", dist::world_size(),
                  " or no --devices, got ", c.devices);
    // (ZeRO's own check, TrainerConfig's, says "needs"; this one names both options' values.)
    DITTO_CHECK(c.zero_stage == 0 || c.trainer == train::TrainerKind::ddp, "--zero-stage ",
                c.zero_stage,
                ": expected --trainer ddp (ZeRO shards the optimizer state over DDP's ranks), got "
                "--trainer ",
                train::trainer_kind_name(c.trainer));
    std::string why;
    const std::string asked = c.backend;
    c.backend = resolve_backend_name(asked, &why);
    if (asked == "auto" && c.backend != "cuda" && lead)
      std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
    if (gpt && !a.given.count("--data"))
      a.rows.data = ditto_examples::bundled_data_path("shakespeare.txt");
    train::RunInputs inputs{{{"--data", a.rows.data}},
                            {{"--checkpoint", c.checkpoint_dir}, {"--resume", c.resume_dir}}};
    if (gpt) {
      g.data = a.rows.data;
      gpt_run = train::configure_gpt(g, c);  // refuses an --export over what the run reads
      data = gpt_run.source;
      inputs = train::gpt_inputs(g, gpt_run, c);
      for (io::NamedPath& e : train::gpt_exports(g)) inputs.files.push_back(std::move(e));
    }
    // --trace and --metrics-jsonl are written (--metrics-jsonl truncated as the run starts,
    // --trace replaced as it ends): not over a file the run reads (every --data file, the
    // validation files, --init-from), an --export file, each other, or into a checkpoint
    // directory, nor a read-only file; checked before either is opened (the MLP's, before its
    // --data is read).
    io::check_outputs_are_not_inputs({{"--trace", a.sim.run.trace}, {"--metrics-jsonl", a.jsonl}},
                                     inputs.files, inputs.dirs);
    check_run_paths(c, a.sim.run.trace, a.jsonl, lead);
    if (!gpt) data = rows = train::open_csv_rows(a.rows, c);
    DITTO_CHECK(a.t.log_interval >= 0 || !a.given.count("--log-interval"),
                "--log-interval: "
                "expected an integer >= 0 (0: no progress lines), got ",
                a.t.log_interval);
    if (a.given.count("--log-interval")) {
      c.log_interval = a.t.log_interval;
    } else {  // the GPT's 10; the MLP's 100 in epochs longer than that (the epoch lines suffice)
      c.log_interval = gpt ? 10 : data->batches_per_epoch(c.batch_size) > 100 ? 100 : 0;
    }
    sim_run = sim::add_sim_run(c, a.sim.parsed(c));
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
  // By their effective values: --lr the optimizer's or the GPT's default, --devices the
  // processes, --classes the data's (the largest label + 1 when not given).
  if (processes)
    c.rank_settings =
        train::option_settings(a.options, {{"--lr", train::shortest(c.effective_lr())},
                                           {"--devices", std::to_string(dist::world_size())},
                                           {"--classes", std::to_string(data->num_outputs())}});
  // stdout's lines and the --metrics-jsonl file's, and the errors after training.
  // A resumed run continues the --metrics-jsonl file (its first record: the resume's), as
  // TensorBoard's and wandb's resumed runs continue their logs, instead of starting it over.
  train::RunPrinter print(a.jsonl, "--metrics-jsonl", a.sim.run.profile, c.dtype,
                          !c.resume_dir.empty());
  const auto out = train::RunPrinter::out;
  train::TrainerCallbacks cb;
  cb.on_resume = [&](const std::string& dir, const TrainerState& ts) {
    out(train::format_resume("ditto-train", dir, ts, gpt));
    print.resumed(dir, ts.step);
  };
  print.install(cb, [&](const train::RunInfo& r) {
    // --init-from with a --resume that resumes (--resume auto finding a checkpoint, or DIR
    // given): the checkpoint's parameters replace the file's, so its line would mislead.
    const std::string init_line =
        !gpt_run.init_weights ? ""
        : c.resume_dir.empty()
            ? train::format_init_from("ditto-train", g, *gpt_run.init_weights)
            : "ditto-train: --init-from " + g.init_from + " ignored: resuming from " +
                  c.resume_dir + " (--resume wins once its directory holds a checkpoint)\n";
    return init_line + (gpt ? train::format_gpt_start("ditto-train", r, g, c, gpt_run) +
                                  train::format_grad_accum("ditto-train", c)
                            : train::format_start("ditto-train", r, c, a.rows.data, rows.get()));
  });
  if (gpt)
    cb.on_finish = [&](train::Replica& rep) {
      train::stop_handlers_training_over();  // Note [Graceful stop]: no checkpoint is due now
      try {
        const std::string s =
            train::format_sample(g, gpt_run, train::gpt_sample(rep, g, gpt_run, c.seed), c.seed);
        std::fwrite(s.data(), 1, s.size(), stdout);  // every byte, NULs too
      } catch (const std::exception& e) {
        print.late_errors.push_back(detail::cat("--sample: ", e.what()));
      }
      try {
        train::export_gpt(g, rep, gpt_run.model, [&](const std::string& file, const char* what) {
          out("ditto-train: exported " + file + " (" + what + ")\n");
        });
      } catch (const std::exception& e) {
        print.late_errors.push_back(detail::cat("--export: ", e.what()));
      }
    };
  if (!c.checkpoint_dir.empty()) {  // Note [Graceful stop]
    c.stop = train::install_stop_handlers(c.checkpoint_dir, "ditto-train", processes, c.resume_dir);
    cb.on_last_step = [] { train::stop_handlers_last_step(); };  // a signal: no stop checkpoint
    cb.on_stop_checkpoint = [](const std::string& path, std::int64_t) {
      train::stop_handlers_stop_checkpoint_written(path);  // a second signal: it was written
    };
    // Under mpirun: whether rank 0 wrote it, the other processes read from DIR/latest.
    cb.on_stop = [](std::int64_t step, bool saved) { train::stop_handlers_stop_due(step, saved); };
  }
  std::optional<train::Trainer> trainer;
  // Destroyed before the trainer, when the run returns or fails (Note [Graceful stop]).
  struct RunOver {
    ~RunOver() { train::disarm_stop_handlers(); }
  } run_over;
  try {
    trainer.emplace(c, data, cb);  // TrainerConfig's validation and sim::SimRun's
    if (lead) create_checkpoint_dir(c);
  } catch (const InvalidArgument& e) {  // the settings' checks only: usage errors
    if (!processes) throw UsageError(e.what());
    train::refuse_run(std::current_exception(), agree_timeout_ms);
  }
  if (lead)  // after the config's validation: about settings that are valid
    for (const std::string& w : train::config_warnings(c, g.given))
      std::fprintf(stderr, "ditto-train: warning: %s\n", w.c_str());
  if (lead && sim_run)  // the simulated cluster's (more GPUs on a node than a node holds)
    for (const std::string& w : sim_run->warnings(c))
      std::fprintf(stderr, "ditto-train: warning: %s\n", w.c_str());
  std::fflush(stderr);
  train::FitResult r;
  const auto note_trace = [&] {
    const sim::SimRunReport& sim = sim_run->report();
    if (sim.failed_run)
      std::fprintf(stderr,
                   "ditto-train: note: --trace: wrote %s for the failed run: what ran up to the "
                   "failure (Chrome trace JSON; open in https://ui.perfetto.dev)\n",
                   sim.trace.c_str());
    else if (!sim.failed_trace_error.empty())
      std::fprintf(stderr, "ditto-train: warning: --trace: not written for the failed run: %s\n",
                   sim.failed_trace_error.c_str());
    if (!sim.trace_dropped.empty())  // events past the trace's cap
      std::fprintf(stderr, "ditto-train: warning: %s\n", sim.trace_dropped.c_str());
  };
  // The failure is reported by the caller, after what was kept of the run.
  try {
    r = trainer->fit();
  } catch (const OutOfMemory& e) {
    note_trace();
    // A device's memory (OutOfMemory::Kind::device: sim's or CUDA's capacity, not a host
    // allocation's): what the run needs and what would fit (Note [Out-of-memory hints]).
    if (e.kind() != OutOfMemory::Kind::device) throw;
    throw OutOfMemory(detail::cat(e.what(), out_of_memory_hint(c, data, a.sim.run)), e.kind());
  } catch (...) {
    note_trace();
    throw;
  }
  train::stop_handlers_training_over();  // (the MLP's: it has no on_finish)
  if (r.stopped) {
    // An output error with a stop (none comes now: a stop during the last step lets the run
    // complete, and a failed stop checkpoint throws; kept so that no error is ever dropped):
    // no "checkpoint written" line.
    if (r.lead && !r.output_errors.empty()) {
      std::fflush(stdout);
      for (const std::string& e : r.output_errors)
        std::fprintf(stderr, "ditto-train: error: %s\n", e.c_str());
      return 1;
    }
    if (r.lead) {
      out(train::format_stopped("ditto-train", r.stop_signal, r.steps, c.checkpoint_dir));
      print.write_stopped(
          train::stop_signal_name(r.stop_signal), r.steps,
          c.checkpoint_dir.empty() ? "" : c.checkpoint_dir + "/" + checkpoint_step_name(r.steps));
      if (print.finish("ditto-train") != 0) return 1;  // the record could not be written
    }
    std::fflush(stdout);
    // The run's stop signal, not this process's: under mpirun a rank that got none stops with the
    // others and exits as they do (143 / 130), not 128.
    return 128 + r.stop_signal;
  }
  if (!r.lead) return 0;
  const std::int64_t tokens_per_sample = gpt ? g.block_size : 0;
  const sim::SimRunReport& sim = sim_run->report();
  for (const std::string& f : sim.unfired_faults)
    std::printf("ditto-train: note: --fault %s never took effect (no such step, allocation or "
                "communicator collective in this run)\n",
                f.c_str());
  out(train::format_final(r, tokens_per_sample));
  if (r.prediction) {
    // Tester 6, F9: the profile's name ("... 80GB") with another capacity read as the card's.
    train::CostPrediction p = *r.prediction;
    if (c.memory_capacity && !a.sim.run.profile.empty())
      p.device_name += " with " + train::format_mib(*c.memory_capacity) + " (" +
                       c.name_of("memory_capacity") + ")";
    out(train::format_prediction(p, r.dtype, r.dry_run, tokens_per_sample));
  }
  out(train::format_memory(r.memory));
  if (!sim.trace.empty())
    std::printf("trace: wrote %s (Chrome trace JSON; open in https://ui.perfetto.dev)\n",
                sim.trace.c_str());
  if (!sim.trace_dropped.empty()) {  // events past the trace's cap
    std::fflush(stdout);
    std::fprintf(stderr, "ditto-train: warning: %s\n", sim.trace_dropped.c_str());
  }
  if (gpt && r.prediction)
    out(train::format_gpt_prediction(*r.prediction, r.memory, gpt_run.model, c));
  if (a.verbose && r.prediction)
    out(train::format_predicted_kernels(*r.prediction, c.determinism, c.dtype));
  print.late_errors.insert(print.late_errors.end(), r.output_errors.begin(), r.output_errors.end());
  print.write_result(r);
  return print.finish("ditto-train");
}

/// The end of this process's part of an mpirun job (a no-op in one process): dist::finalize, or,
/// when its communication failed (dist::job_failure: a collective timed out, this rank failed its
/// communicator), dist::abort with `rc` once its error is printed, so that mpirun ends the job
/// instead of this process waiting in MPI_Finalize for one that may never come (Note [Ending a
/// job after a communicator error], core/distributed/distributed.h). Returns `rc`.
int end_mpi_job(int rc) {
  if (const std::string failure = dist::job_failure(); !failure.empty()) {
    if (rc == 0) {  // no error reported (--version's exchange that timed out): say why it ends
      std::fflush(stdout);
      std::fprintf(stderr, "ditto-train: error: rank %d: %s\n", dist::rank(), failure.c_str());
    }
    dist::abort(rc == 0 ? 1 : rc);
  }
  dist::finalize();
  return rc;
}

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
        std::make_exception_ptr(InvalidArgument(
            detail::cat("ditto-train ", what,
                        " does not train, and under mpirun every process must run the "
                        "same training command (the other side of an MPMD ':' included)"))));
  } catch (const std::exception&) {  // its own refusal, which the others report
  }
  return end_mpi_job(rc);
}

/// Before dist::init under a launcher's variables: the job sizes mpirun sets
/// (OMPI_COMM_WORLD_SIZE, a PMI launcher's PMI_SIZE) must be what a launcher writes, a
/// decimal number of processes >= 1 that fits an int, and the ranks it sets (PMIx's PMIX_RANK,
/// PMI's PMI_RANK) a decimal rank >= 0; anything else ("abc", "-2", "0" for a size,
/// "99999999999999999999", " 2", "02") was set by hand, and is a usage error (exit 2) naming
/// the variable and its value, not ignored (it made the check after dist::init skip it) nor
/// given to MPI_Init. An empty one is not set (dist::launched_by_mpirun's reading). Returns the
/// variables set, with their values: MPI_Init rewrites some (Open MPI's singleton sets PMIX_RANK
/// to 0), so check_launcher_world compares these.
std::map<std::string, std::string> check_launcher_variables() {
  std::map<std::string, std::string> set;
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    set[var] = v;
    const bool rank = std::string(var).find("RANK") != std::string::npos;
    const std::string value(v);
    bool number = value.size() <= 10 && (value[0] != '0' || (rank && value == "0"));
    long long n = 0;
    for (char ch : value) {
      if (ch < '0' || ch > '9') number = false;
      if (number) n = n * 10 + (ch - '0');
    }
    if (number && n >= (rank ? 0 : 1) && n <= std::numeric_limits<int>::max() - (rank ? 1 : 0))
      continue;
    throw UsageError(detail::cat(
        "environment: ", var, ": expected ",
        rank ? detail::cat("this process's rank (a decimal integer in 0..",
                           std::numeric_limits<int>::max() - 1, ", as mpirun sets it)")
             : detail::cat("a number of processes (a decimal integer in 1..",
                           std::numeric_limits<int>::max(), ", as mpirun sets it)"),
        ", got '", value, "': mpirun did not set it; unset ", var,
        " (and the launcher's other variables) to run this process alone, or start the ranks "
        "with mpirun (docs/mpi.md: `mpirun -np N ditto-train --trainer ddp`)"));
  }
  return set;
}

/// After dist::init under a launcher's variables: a world size or a rank that the variables
/// contradict (OMPI_COMM_WORLD_SIZE=2, PMI_SIZE=2, PMIX_RANK=3 or PMI_RANK=1 set by hand or left
/// from another launch, no mpirun: MPI_Init makes a job of this one process, rank 0) is refused as
/// torchrun's variables are (dist::check_not_torchrun): each process so started would run a
/// whole job of its own. (Tester C, C5: a stale PMIX_RANK alone made a plain run a one-process
/// job without a word, and an error then spoke of "the 1 processes" under mpirun.)
/// `set`: check_launcher_variables' answer, read before MPI_Init.
void check_launcher_world(const std::map<std::string, std::string>& set) {
  for (const auto& [var, v] : set) {
    const bool rank = var.find("RANK") != std::string::npos;
    const long long n = std::stoll(v);  // checked by check_launcher_variables
    if (n == (rank ? dist::rank() : dist::world_size())) continue;
    const int size = dist::world_size(), me = dist::rank();
    dist::finalize();  // this process is no rank of a job: its error says no "rank 0"
    throw InvalidArgument(detail::cat(
        "environment: ", var, "=", v, " is set but ",
        rank ? detail::cat("this process is rank ", me, " of an MPI job of ", size, " process",
                           size == 1 ? "" : "es")
             : detail::cat("the MPI job has ", size, " process", size == 1 ? "" : "es"),
        " (no mpirun started this one: the variable is left from another launch or set by hand): "
        "each process so started would run a whole job of its own. ditto starts its ranks with "
        "mpirun (docs/mpi.md: `mpirun -np N ditto-train --trainer ddp`), or runs N devices in "
        "one process (--devices N); unset ",
        var, " (and the launcher's other variables) to run this process alone"));
  }
}

/// ditto-train's command line.
int cli_main(int argc, char** argv) {
  Args a;
  train::TrainerConfig& c = a.t.config;
  train::GptSettings& g = a.gpt;
  a.options = all_options(a);
  // Errors name the fields by their options (--batch-size); the GPT's fields are GptSettings'.
  c.field_names = g.field_names = train::field_names(a.options);
  for (const train::OptionRow& r : a.options)  // the GPT's rows (gpt_options) are already there
    if (r.model == "gpt") c.field_names.erase(r.field);
  CLI::App app{"ditto-train: data-parallel training (an MLP on CSV rows, or nanoGPT's character "
               "GPT with --model gpt) on simulated or real GPUs"};
  // A repeated option: the last value wins (argparse's store); --straggler, --fault and --export
  // collect (each --export writes its file).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::map<std::string, std::string> expected;  // "--devices": "an integer in 1..65536"
  ditto_cli::bind_options(app, a.options, expected);
  ditto_cli::add_version(app, "ditto-train");
  ditto_cli::check_numeric_values(app, expected);  // '' refused, 010 decimal
  if (const std::string m = ditto_cli::empty_flag_value(app, argc, argv); !m.empty()) {
    std::fputs(ditto_cli::usage_error("ditto-train", m, {}, ditto_cli::option_names(app)).c_str(),
               stderr);
    return ditto_cli::kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc =
        ditto_cli::parse_error(app, e, "ditto-train", expected, train::nanogpt_option_hint);
    const bool version = dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr;
    return rc == 0 ? leave_mpi_job(rc, argc, argv, version ? "--version" : "--help") : rc;
  }
  for (const train::OptionRow& r : a.options)
    if (app.count(r.flag) > 0) a.given.insert(r.flag), g.given.insert(r.field);
  if (a.table) {  // the alias of ditto-predict-table (examples/ditto_predict_table.cpp)
    // Its tables are fixed: another option would be ignored without a word (as
    // ditto-predict-table refuses any argument).
    std::string others;
    for (const std::string& f : a.given)
      if (f != "--predict-table") others += (others.empty() ? "" : ", ") + f;
    if (!others.empty()) {
      std::fprintf(stderr,
                   "ditto-train: error: --predict-table: prints fixed tables and uses no other "
                   "option: expected it alone, got %s\n",
                   others.c_str());
      return ditto_cli::kUsageError;
    }
    return ditto_cli::print_prediction_tables("ditto-train: --predict-table");
  }
  int rc = 1;
  try {
    // Started by mpirun: this process is one rank (--trainer ddp), the job's processes the ranks.
    // Started by torchrun (RANK, WORLD_SIZE): refused, else each process would run a whole job.
    dist::check_not_torchrun("environment");
    if (dist::launched_by_mpirun()) {
      const std::map<std::string, std::string> launcher = check_launcher_variables();
      dist::init(&argc, &argv);
      check_launcher_world(launcher);
    }
    rc = run(a);  // under mpirun it checks that the processes agree before training
  } catch (const UsageError& e) {
    std::fprintf(stderr, "ditto-train: error: %s\n", e.what());
    rc = ditto_cli::kUsageError;
  } catch (const std::exception& e) {
    // A bare std::bad_alloc says only "std::bad_alloc": say what it means.
    const std::string what =
        dynamic_cast<const std::bad_alloc*>(&e) != nullptr
            ? "out of host memory (std::bad_alloc: a host allocation failed; `ulimit -v` may be too "
              "low: use fewer --devices, a smaller model or batch, or raise it)"
            : e.what();
    if (dist::is_initialized())
      std::fprintf(stderr, "ditto-train: error: rank %d: %s\n", dist::rank(), what.c_str());
    else
      std::fprintf(stderr, "ditto-train: error: %s\n", what.c_str());
    rc = 1;
  }
  return end_mpi_job(rc);  // after every communicator is gone (they live in run)
}

}  // namespace

int main(int argc, char** argv) {
  io::occupy_closed_std_fds();  // Note [Lost output], core/io/file.h
  // A write past `ulimit -f` fails with EFBIG (a ditto::Error naming the file) instead of
  // SIGXFSZ killing the run with no message and a half-written checkpoint left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  return io::close_stdout(cli_main(argc, argv), "ditto-train");
}
