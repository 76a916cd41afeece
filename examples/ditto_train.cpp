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
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
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
#include "core/base/error.h"
#include "core/distributed/distributed.h"
#include "core/io/file.h"
#include "core/train/cost_meter.h"
#include "core/train/gpt_recipe.h"
#include "core/train/graceful_stop.h"
#include "core/train/grad_accumulation.h"
#include "core/train/launcher.h"
#include "core/train/metrics_format.h"
#include "core/train/trainer.h"
#include "examples/bundled_data.h"
#include "examples/cli_common.h"

using namespace ditto;

namespace {

struct Args {
  std::string backend = "sim", data = ditto_examples::bundled_data_path("digits.csv"),
              header = "auto", hidden = "128";
  std::string determinism = "bitwise", trainer = "dp", jsonl, model = "mlp", dtype = "f32";
  std::int64_t label_column = -1;
  std::int64_t classes = 0;        // --classes; 0: the largest label + 1
  std::int64_t log_interval = -1;  // --log-interval; -1: the model's default
  double val_fraction = 0.2, sim_memory_gib = 80.0;
  std::vector<std::string> stragglers;  // "DEVICE:FACTOR"
  bool verbose = false;                 // --verbose: the predicted step's kernel table
  std::set<std::string> given;          // the options given on the command line
  train::TrainerConfig cfg;
  train::GptSettings gpt;  // --model gpt's options (their fields: --n-layer n_layer)
  sim::SimRunOptions sim;  // --profile, --interconnect, --nodes, --trace, ...
};

/// The options of the MLP only (the GPT's are those of the "GPT ..." groups of --help).
const std::set<std::string> kMlpOnly{"--hidden",    "--epochs",       "--label-column",
                                     "--header",    "--val-fraction", "--loss",
                                     "--optimizer", "--momentum",     "--classes"};

/// --hidden: "" is no hidden layer; otherwise every comma-separated item must be a size.
std::vector<std::int64_t> parse_sizes(const std::string& text) {
  std::vector<std::int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (!text.empty() && std::getline(ss, item, ',')) {
    DITTO_CHECK(!item.empty() && text.back() != ',',
                "--hidden: expected comma-separated positive "
                "sizes such as 128 or 256,128 ('' for no hidden layer), got '",
                text,
                "' (an "
                "empty item)");
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    DITTO_CHECK(*end == '\0' && errno == 0 && v > 0,
                "--hidden: "
                "expected comma-separated positive sizes such as 128 or 256,128, got '",
                text, "'");
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

/// The most classes of the MLP, inferred from the labels (the largest + 1) or given by --classes:
/// a stray label such as 100000 would otherwise build a 100001-way output layer silently.
constexpr std::int64_t kMaxInferredClasses = 65536;

/// The MLP's data: --data's rows, the model's classes --classes N (every label < N, as
/// torch.nn.CrossEntropyLoss's targets < C), else the largest label + 1 up to kMaxInferredClasses.
std::shared_ptr<train::CsvDataSource> open_rows(const Args& a, const data::CsvOptions& csv) {
  auto rows = std::make_shared<train::CsvDataSource>(a.data, csv, a.val_fraction, a.cfg.seed);
  const std::int64_t inferred = rows->num_outputs();  // the largest label + 1
  if (!a.given.count("--classes")) {
    DITTO_CHECK(inferred <= kMaxInferredClasses, "--data: ", a.data, ": the largest label is ",
                inferred - 1, ", which would make a model of ", inferred,
                " classes: expected "
                "labels 0..",
                kMaxInferredClasses - 1,
                " (the most classes ditto-train's model "
                "has)");
    return rows;
  }
  DITTO_CHECK(a.classes >= 1 && a.classes <= kMaxInferredClasses,
              "--classes: expected an "
              "integer in 1..",
              kMaxInferredClasses, ", got ", a.classes);
  DITTO_CHECK(a.classes >= inferred,
              "--classes: expected a number of classes greater than every "
              "label (the largest in ",
              a.data, " is ", inferred - 1, "), got ", a.classes);
  rows->set_num_classes(a.classes, "--classes");
  return rows;
}

train::RankSettings cli_settings(const CLI::App& app, const Args& a, const train::DataSource* data);

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

/// Options that do nothing in this run, or that change what bitwise mode promises, said once at
/// the start on stderr ("ditto-train: warning: ..."), as PyTorch warns for an ignored setting.
void warn_settings(const Args& a, const train::TrainerConfig& c, long long devices) {
  auto warn = [](const std::string& s) {
    std::fprintf(stderr, "ditto-train: warning: %s\n", s.c_str());
  };
  if (a.given.count("--bucket-cap-mb") && c.trainer != train::TrainerKind::ddp)
    warn("--bucket-cap-mb: sizes --trainer ddp's gradient buckets; DataParallel (--trainer dp) "
         "has none, so it does nothing in this run");
  if (a.given.count("--micro-shards") && c.determinism != Determinism::bitwise)
    warn("--micro-shards: splits the batch in --determinism bitwise only; fast mode does not use "
         "it, so it does nothing in this run");
  if (c.determinism == Determinism::bitwise && (devices & (devices - 1)) != 0)
    warn("--devices" + std::string(a.sim.nodes > 1 ? " x --nodes" : "") + ": " +
         std::to_string(devices) +
         " devices, not a power of two: the params_checksum is the "
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
      DITTO_CHECK(k >= 1 && k <= kMaxMicroShards && (k & (k - 1)) == 0,
                  "--micro-shards: "
                  "expected a power of two in 1..",
                  kMaxMicroShards, ", got ", k);
      DITTO_CHECK(k >= devices,
                  "--micro-shards: bitwise mode gives every device at least one "
                  "micro-shard: expected a power of two >= ",
                  devices, " (the devices), got ", k,
                  a.given.count("--micro-shards") ? "" : " (the default)");
    }
    train::check_grad_accumulation(c, static_cast<int>(devices));  // already names the options
    DITTO_CHECK(c.zero_stage == 0 || c.trainer == train::TrainerKind::ddp, "--zero-stage ",
                c.zero_stage,
                ": expected --trainer ddp (ZeRO shards the optimizer state over "
                "DDP's ranks), got --trainer ",
                train::trainer_kind_name(c.trainer));
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
                                   "a100-sxm-40gb, rtx4070-laptop or a .json file, got '",
                                   p, "'"));
    }
}

/// One run of the parsed command line; `a` is the Args `app`'s options write to (its defaults
/// settled here, in place, so that cli_settings compares the effective values).
int run(Args& a, const CLI::App& app) {
  train::TrainerConfig& c = a.cfg;
  train::GptSettings& g = a.gpt;
  const bool processes = dist::is_initialized(), lead = dist::rank() == 0;
  std::shared_ptr<train::CsvDataSource> rows;
  train::GptRun gpt_run;
  std::shared_ptr<train::DataSource> data;
  const bool gpt = a.model == "gpt";
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
    for (const CLI::Option* o : app.get_options())
      DITTO_CHECK(gpt || !o->count() || o->get_group().rfind("GPT", 0) != 0, o->get_name(),
                  ": expected --model gpt, got --model mlp");
    data::CsvOptions csv;
    csv.label_column = a.label_column;
    if (a.header == "yes")
      csv.header = data::CsvHeader::yes;
    else if (a.header == "no")
      csv.header = data::CsvHeader::no;
    else
      DITTO_CHECK(a.header == "auto", "--header: expected auto, yes or no, got '", a.header, "'");
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
    DITTO_CHECK(!a.given.count("--verbose") || !a.sim.profile.empty(),
                "--verbose: prints the cost "
                "model's table of the predicted step: expected --profile (or --dry-run --profile) "
                "with it, got none");
    for (const std::string opt : {"--interconnect", "--straggler"})
      DITTO_CHECK((processes && opt == "--straggler") || !a.given.count(opt) ||
                      !a.sim.profile.empty() || !a.sim.trace.empty(),
                  opt,
                  ": changes only the cost model's predicted times: expected --profile (or "
                  "--trace) with it, got neither");
    // Without the cost model --nodes N only multiplies the devices (and, past a power of two,
    // changes the checksum): --devices says that.
    DITTO_CHECK(processes || a.sim.nodes == 1 || !a.sim.profile.empty() || !a.sim.trace.empty(),
                "--nodes: the nodes are the cost model's cluster (InfiniBand between them): "
                "expected --profile (or --trace) with it, got neither (without them --nodes ",
                a.sim.nodes, " would only train on ", a.sim.nodes, " x ", c.devices, " = ",
                static_cast<long long>(a.sim.nodes) * c.devices, " devices; --devices ",
                static_cast<long long>(a.sim.nodes) * c.devices, " does that)");
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
    if (processes && !a.given.count("--trainer")) a.trainer = "ddp";  // the default there
    c.trainer = train::parse_trainer_kind(a.trainer, "--trainer");
    if (processes)  // (--trainer dp under mpirun: the Trainer's check)
      DITTO_CHECK(!a.given.count("--devices") || c.devices == dist::world_size(),
                  "--devices: "
                  "under mpirun the ranks are the ",
                  dist::world_size(), " processes: expected ", dist::world_size(),
                  " or no --devices, got ", c.devices);
    check_option_values(
        a, c, processes ? dist::world_size() : static_cast<long long>(c.devices) * a.sim.nodes);
    std::string why;
    c.backend = resolve_backend_name(a.backend, &why);
    if (a.backend == "auto" && c.backend != "cuda" && lead)
      std::printf("ditto-train: --backend auto: using the simulator (%s)\n", why.c_str());
    // (--dry-run on another backend or under mpirun: sim::SimRun's check, with the Trainer's)
    DITTO_CHECK(!c.dry_run || !a.sim.profile.empty(), "--dry-run: expected --profile (the GPU to "
                                                      "predict for, e.g. a100-sxm-80gb), got none");

    if (gpt && !a.given.count("--data"))
      a.data = ditto_examples::bundled_data_path("shakespeare.txt");
    // --trace and --metrics-jsonl are written: not over --data, each other, or a checkpoint's.
    io::check_outputs_are_not_inputs(
        {{"--trace", a.sim.trace}, {"--metrics-jsonl", a.jsonl}}, {{"--data", a.data}},
        {{"--checkpoint", c.checkpoint_dir}, {"--resume", c.resume_dir}});
    if (gpt) {
      for (const std::string& opt : kMlpOnly)
        DITTO_CHECK(!a.given.count(opt), opt,
                    ": expected --model mlp (the GPT's options are "
                    "nanoGPT's: --max-iters, not --epochs, with AdamW and cross-entropy), got "
                    "--model gpt");
      g.data = a.data;
      gpt_run = train::configure_gpt(g, c);
      data = gpt_run.source;
    } else {
      data = rows = open_rows(a, csv);
    }
    DITTO_CHECK(a.log_interval >= 0 || !a.given.count("--log-interval"),
                "--log-interval: "
                "expected an integer >= 0 (0: no progress lines), got ",
                a.log_interval);
    if (a.given.count("--log-interval")) {
      c.log_interval = a.log_interval;
    } else {  // the GPT's 10; the MLP's 100 in epochs longer than that (the epoch lines suffice)
      c.log_interval = gpt ? 10 : data->batches_per_epoch(c.batch_size) > 100 ? 100 : 0;
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
  // What fails after training (the sample, writing the trace or a JSON line) must not lose the
  // run's result: its error is kept and reported after the final line and JSON record, exit 1.
  std::vector<std::string> late_errors;
  auto out = [](const std::string& lines) {
    std::fputs(lines.c_str(), stdout);
    std::fflush(stdout);
  };
  train::TrainerCallbacks cb;
  cb.on_resume = [&](const std::string& dir, const TrainerState& ts) {
    out(train::format_resume("ditto-train", dir, ts, gpt));
  };
  cb.on_start = [&](const train::RunInfo& r) {
    if (!a.jsonl.empty() && lead) try {
        jsonl = std::make_unique<train::JsonLinesWriter>(a.jsonl);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(detail::cat("--metrics-jsonl: ", e.what()));
      }
    if (gpt_run.init_weights) out(train::format_init_from("ditto-train", g, *gpt_run.init_weights));
    out(gpt ? train::format_gpt_start("ditto-train", r, g, c, gpt_run) +
                  train::format_grad_accum("ditto-train", c)
            : train::format_start("ditto-train", r, c, a.data, rows.get()));
  };
  cb.on_epoch = [&](const train::EpochMetrics& m) {
    out(train::format_epoch(m));
    if (jsonl) jsonl->write(m);
  };
  cb.on_eval = [&](const train::EvalMetrics& m) {
    out(train::format_eval(m));
    if (jsonl) jsonl->write(m);
  };
  cb.on_step = [&](const train::StepMetrics& m) {
    out(train::format_step(m, a.sim.profile, c.dtype));
    if (jsonl) jsonl->write(m);
  };
  if (gpt)
    cb.on_finish = [&](train::Replica& rep) {
      try {
        const std::string s =
            train::format_sample(g, gpt_run, train::gpt_sample(rep, g, gpt_run, c.seed), c.seed);
        std::fwrite(s.data(), 1, s.size(), stdout);  // every byte, NULs too
      } catch (const std::exception& e) {
        late_errors.push_back(detail::cat("--sample: ", e.what()));
      }
      try {
        train::export_gpt(g, rep, gpt_run.model, [&](const std::string& file, const char* what) {
          out("ditto-train: exported " + file + " (" + what + ")\n");
        });
      } catch (const std::exception& e) {
        late_errors.push_back(detail::cat("--export: ", e.what()));
      }
    };
  if (!c.checkpoint_dir.empty())  // Note [Graceful stop]
    c.stop = train::install_stop_handlers(c.checkpoint_dir, "ditto-train");
  std::optional<train::Trainer> trainer;
  try {
    trainer.emplace(c, data, cb);  // TrainerConfig's validation and sim::SimRun's
  } catch (const InvalidArgument& e) {
    if (!processes) rethrow_usage(e);
    train::refuse_run(std::current_exception(), agree_timeout_ms);
  }
  if (lead)  // after the config's validation: about settings that are valid
    warn_settings(a, c,
                  processes ? dist::world_size() : static_cast<long long>(c.devices) * a.sim.nodes);
  train::FitResult r = trainer->fit();
  if (r.stopped) {
    if (r.lead)
      out(train::format_stopped("ditto-train", train::stop_signal(), r.steps, c.checkpoint_dir));
    std::fflush(stdout);
    return 128 + train::stop_signal();
  }
  if (!r.lead) return 0;
  const std::int64_t tokens_per_sample = gpt ? g.block_size : 0;
  const sim::SimRunReport& sim = sim_run->report();
  for (const std::string& f : sim.unfired_faults)
    std::printf("ditto-train: note: --fault %s never took effect (no such step, allocation or "
                "communicator collective in this run)\n",
                f.c_str());
  out(train::format_final(r, tokens_per_sample));
  if (r.prediction)
    out(train::format_prediction(*r.prediction, r.dtype, r.dry_run, tokens_per_sample));
  out(train::format_memory(r.memory));
  if (!sim.trace.empty())
    std::printf("trace: wrote %s (Chrome trace JSON; open in https://ui.perfetto.dev)\n",
                sim.trace.c_str());
  if (gpt && r.prediction)
    out(train::format_gpt_prediction(*r.prediction, r.memory, gpt_run.model, c));
  if (a.verbose && r.prediction)
    out(train::format_predicted_kernels(*r.prediction, c.determinism, c.dtype));
  late_errors.insert(late_errors.end(), r.output_errors.begin(), r.output_errors.end());
  if (jsonl) try {
      jsonl->write(r);
    } catch (const std::exception& e) {
      late_errors.push_back(detail::cat("--metrics-jsonl: ", e.what()));
    }
  std::fflush(stdout);
  for (const std::string& e : late_errors)
    std::fprintf(stderr,
                 "ditto-train: error: after training (the result above is complete): "
                 "%s\n",
                 e.c_str());
  return late_errors.empty() ? 0 : 1;
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
  dist::finalize();
  return rc;
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
/// --log-interval (rank 0 writes them), --help and --version. `data`: the run's data (the effective
/// --classes).
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
      value = canonical_value(
          const_cast<CLI::Option*>(opt)->capture_default_str()->get_default_str(), false);
      if (flag) value = value.empty() ? "false" : canonical_value(value, true);
      if (value == "[]") value = "(none)";  // a repeatable option not given
    }
    out.emplace_back(name, value);
  }
  // --lr last: when not given it follows --optimizer (and --model), which then differs first.
  const auto lr_at =
      std::find_if(out.begin(), out.end(), [](const auto& s) { return s.first == "--lr"; });
  if (lr_at != out.end()) std::rotate(lr_at, lr_at + 1, out.end());
  return out;
}

/// ditto-train's command line.
int cli_main(int argc, char** argv) {
  Args a;
  train::TrainerConfig& c = a.cfg;
  train::GptSettings& g = a.gpt;
  c.field_names = {{"epochs", "--epochs"},
                   {"lr", "--lr"},
                   {"batch_size", "--batch-size"},
                   {"devices", "--devices"},
                   {"nodes", "--nodes"},
                   {"loss", "--loss"},
                   {"optimizer", "--optimizer"},
                   {"checkpoint_every", "--checkpoint-every"},
                   {"checkpoint_dir", "--checkpoint"},
                   {"resume_dir", "--resume"},
                   {"trace", "--trace"},
                   {"profile", "--profile"},
                   {"backend", "--backend"},
                   {"stragglers", "--straggler"},
                   {"faults", "--fault"},
                   {"comm_timeout_ms", "--comm-timeout-ms"},
                   {"trainer", "--trainer"},
                   {"bucket_cap_mb", "--bucket-cap-mb"},
                   {"hidden", "--hidden"},
                   {"dtype", "--dtype"},
                   {"micro_shards", "--micro-shards"},
                   {"grad_accum_steps", "--grad-accum-steps"},
                   {"zero_stage", "--zero-stage"},
                   {"dry_run", "--dry-run"},
                   {"allow_nonfinite_loss", "--allow-nonfinite-loss"},
                   {"allow_tf32", "--allow-tf32"},
                   {"momentum", "--momentum"},
                   {"weight_decay", "--weight-decay"}};
  float lr = 0.05f;
  CLI::App app{"ditto-train: data-parallel training (an MLP on CSV rows, or nanoGPT's character "
               "GPT with --model gpt) on simulated or real GPUs"};
  // A repeated option: the last value wins (argparse's store); --straggler, --fault and --export
  // collect (each --export writes its file).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  // An option, and what its value must be (`must`, for the parser's conversion errors:
  // "--devices: expected an integer in 1..65536, got 'abc'"); with_default's --help shows its
  // default.
  std::map<std::string, std::string> expected;
  auto plain = [&](const char* name, auto& value, const char* help, const char* must = nullptr) {
    if (must) expected[name] = must;
    return app.add_option(name, value, help);
  };
  auto with_default = [&](const char* name, auto& value, const char* help,
                          const char* must = nullptr) {
    return plain(name, value, help, must)->capture_default_str();
  };
  with_default("--model", a.model,
               "mlp (on --data CSV rows) or gpt (nanoGPT's character model on --data text, "
               "default the bundled shakespeare.txt; its options below)");
  with_default("--backend", a.backend, "sim, cuda or auto (cuda when a GPU is usable)");
  with_default("--devices", c.devices, "number of devices (data-parallel replicas)",
               "an integer in 1..65536");
  with_default("--data", a.data,
               "CSV file: numeric features, integer class label (--model gpt: "
               "a text file, default the bundled shakespeare.txt, or token files: llm.c shards "
               "or nanoGPT's train.bin, one file, a comma list or a glob; see --data-format)");
  with_default("--label-column", a.label_column, "label column (negative counts from the end)",
               "an integer");
  plain("--classes", a.classes,
        "classes of the model's output (every label < N, as CrossEntropyLoss's "
        "num_classes; default the largest label + 1; at most 65536, labels 0..65535)",
        "an integer in 1..65536");
  with_default("--header", a.header, "first row is a header: auto, yes or no");
  with_default("--hidden", a.hidden,
               "hidden layer sizes, comma-separated (e.g. 256,128; '' for no hidden layer)");
  with_default("--epochs", c.epochs, "training epochs", "an integer >= 0");
  with_default("--batch-size", c.batch_size,
               "global batch size (split over the devices; --model gpt: default 12)",
               "an integer >= 1");
  plain("--lr", lr,
        "learning rate (default 0.05 for sgd, 0.001 for adam; --model gpt: "
        "the peak of the schedule, default 0.001)",
        "a number > 0");
  with_default("--momentum", c.momentum, "SGD momentum", "a number");
  with_default("--loss", c.loss, "cross-entropy or mse (on one-hot targets)");
  with_default("--optimizer", c.optimizer, "sgd or adam");
  with_default("--micro-shards", c.micro_shards,
               "micro-shards K of a batch in bitwise mode (power of two >= devices)",
               "a power of two >= --devices");
  with_default("--grad-accum-steps", c.grad_accum_steps,
               "micro-steps per optimizer step (nanoGPT's gradient_accumulation_steps; ddp: "
               "no_sync on all but the last): each takes a contiguous part of --batch-size; "
               "bitwise: a power of two with micro-shards divisible by it x devices, the same "
               "bits as 1",
               "an integer >= 1");
  with_default("--weight-decay", c.weight_decay,
               "SGD weight decay (--model gpt: AdamW's, on the 2-D weights, default 0.1)",
               "a number >= 0");
  with_default("--seed", c.seed, "seed for initialisation, split and shuffling", "an integer >= 0")
      ->check(ditto_cli::non_negative())
      ->check(ditto_cli::uint64_value());
  with_default("--val-fraction", a.val_fraction, "fraction of rows held out for validation",
               "a number in (0, 1)");
  with_default("--determinism", a.determinism,
               "bitwise (same bits for any power-of-two device count) or fast");
  with_default("--dtype", a.dtype,
               "f32, or mixed precision bf16 / f16: parameters, activations and gradients "
               "stored in that dtype, f32 master weights and optimizer state (f16 adds dynamic "
               "loss scaling, as torch's GradScaler)");
  with_default("--sim-memory-gib", a.sim_memory_gib, "memory capacity of each simulated device",
               "a size in GiB > 0");
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
  with_default("--nodes", a.sim.nodes, "sim: nodes of --devices GPUs each (InfiniBand between)",
               "an integer in 1..4096");
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
  plain("--checkpoint-every", c.checkpoint_every, "optimizer steps between checkpoints",
        "an integer >= 0");
  app.add_option("--resume", c.resume_dir,
                 "resume from the newest usable checkpoint in DIR; auto: from --checkpoint's DIR "
                 "when it holds one, else start fresh (a restart loop's every run)");
  with_default("--trainer", a.trainer,
               "dp (DataParallel, one controller thread) or ddp (DistributedDataParallel, a "
               "thread per rank; under mpirun a process per rank, the default there)");
  with_default("--bucket-cap-mb", c.bucket_cap_mb, "ddp: gradient bucket size cap in MiB",
               "a size in MiB > 0");
  with_default("--zero-stage", c.zero_stage,
               "ddp: 1 shards the optimizer state over the ranks (ZeRO-1, llm.c's -z 1; "
               "gradients reduce_scatter, parameters all_gather), 0 none",
               "0 or 1");
  app.add_option("--fault", a.sim.faults,
                 "sim: inject a fault (repeatable): fail:device=D,step=S | "
                 "alloc:device=D,after=N | skip-collective:rank=R,index=K")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  with_default("--comm-timeout-ms", c.comm_timeout_ms,
               "sim: timeout of every communicator in ms (0: their own; at most 2^31)",
               "an integer in 0..2147483648");
  app.add_option("--metrics-jsonl", a.jsonl,
                 "write each epoch's metrics and the final ones as JSON lines to this file");
  plain("--log-interval", a.log_interval,
        "steps between progress lines 'iter N: loss L, time Tms[, mfu M%]' (nanoGPT's "
        "log_interval; also JSON lines): default 10 for --model gpt; the MLP's default "
        "100 prints only in epochs longer than that; 0: none",
        "an integer >= 0");
  const char* group = "GPT (--model gpt; nanoGPT's options and CPU defaults)";
  auto opt = [&](const char* name, auto& value, const char* help, const char* must = nullptr) {
    with_default(name, value, help, must)->group(group);
  };
  opt("--n-layer", g.n_layer, "transformer blocks", "an integer in 1..85");
  opt("--n-head", g.n_head, "attention heads (n_embd % n_head == 0)", "an integer >= 1");
  opt("--n-embd", g.n_embd, "embedding width", "an integer >= 1");
  opt("--block-size", g.block_size, "context length in characters", "an integer >= 1");
  opt("--max-iters", g.max_iters, "optimizer steps", "an integer >= 1");
  opt("--eval-interval", g.eval_interval, "steps between evaluations (also at 0 and the end)",
      "an integer >= 1");
  opt("--eval-iters", g.eval_iters, "batches per split per evaluation (fixed windows)",
      "an integer >= 0");
  opt("--min-lr", g.min_lr, "learning rate at the end of the cosine decay", "a number >= 0");
  opt("--warmup-iters", g.warmup_iters, "steps of linear warm-up", "an integer >= 0");
  opt("--lr-decay-iters", g.lr_decay_iters, "step where the cosine decay reaches --min-lr",
      "an integer > --warmup-iters");
  opt("--grad-clip", g.grad_clip, "clip the gradients' global norm to this (0: off)",
      "a number >= 0");
  opt("--dropout", g.dropout, "dropout probability of every dropout site", "a number in [0, 1)");
  app.add_flag("--bias", g.bias, "biases in the Linears and LayerNorms (default: none)")
      ->group(group);
  opt("--beta1", g.beta1, "AdamW beta1", "a number in [0, 1)");
  opt("--beta2", g.beta2, "AdamW beta2", "a number in [0, 1)");
  opt("--sample", g.sample, "characters to generate at the end (0: none)", "an integer >= 0");
  opt("--temperature", g.temperature, "sampling temperature", "a number > 0");
  opt("--top-k", g.top_k, "sample among the k likeliest characters (0: all)", "an integer >= 0");
  opt("--preset", g.preset,
      "nanoGPT's GPT-2 size: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl (block 1024, vocab "
      "50304, biases; explicit --n-layer etc. win)");
  opt("--vocab-size", g.vocab_size,
      "rows of wte (0: the text's vocabulary, llm.c's tokenizer's 50257 / 128256; --preset: "
      "50304); nanoGPT's .bin tokens need it: meta.pkl's vocab_size, 50304 for GPT-2 BPE",
      "an integer >= 0");
  opt("--data-format", g.data_format,
      "what --data holds: auto (llm.c shards by their magic 20240520 / 20240801, else nanoGPT "
      "uint16 tokens for a name ending in .bin, else a text), text, llmc or nanogpt");
  opt("--val-data", g.val_data,
      "validation token files (a file, comma list or glob; default: --data's name with its last "
      "'train' made 'val' and a shard number any: fineweb_val_*.bin, val.bin beside train.bin)");
  group = "GPT weights (--model gpt; nanoGPT's init_from and eval_only)";
  app.add_option("--init-from", g.init_from,
                 "start from the weights in FILE, its format told by content: an llm.c model "
                 "file (gpt2_124M.bin, f32 or bf16), Hugging Face GPT-2 safetensors "
                 "(model.safetensors; n_head from a config.json beside it, a GPT-2 size or "
                 "--n-head) or a ditto checkpoint directory (its parameters only); the model's "
                 "configuration is the file's")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--export", g.export_files,
                 "write the trained model at the end: llmc FILE (llm.c's model file, f32), "
                 "llmc-bf16 FILE (bf16) or hf FILE (Hugging Face GPT-2 safetensors); repeat it "
                 "to write several files")
      ->expected(2)
      ->type_name("FORMAT FILE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group(group);
  app.add_flag("--eval-only", g.eval_only,
               "evaluate --eval-iters batches of each split once and stop: no training, no "
               "checkpoint (needs --init-from or --resume)")
      ->group(group);
  ditto_cli::add_version(app, "ditto-train");
  ditto_cli::check_numeric_values(app, expected);  // '' refused, 010 decimal
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = ditto_cli::parse_error(app, e, "ditto-train", expected);
    const bool version = dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr;
    return rc == 0 ? leave_mpi_job(rc, argc, argv, version ? "--version" : "--help") : rc;
  }
  // The GPT's errors name each field by its option (GptSettings::field_names): --x-y sets x_y.
  for (const CLI::Option* o : app.get_options()) {
    std::string field = o->get_name().substr(2);
    std::replace(field.begin(), field.end(), '-', '_');
    g.field_names[field] = o->get_name();
    if (o->count() > 0) a.given.insert(o->get_name()), g.given.insert(field);
  }
  if (app.count("--lr") > 0) c.lr = lr;
  if (table) {  // the alias of ditto-predict-table (examples/ditto_predict_table.cpp)
    const sim::PredictionTables t = sim::prediction_tables();
    std::fputs(t.text.c_str(), stdout);
    if (t.unexplained > 0)
      std::fprintf(stderr, "ditto-train: --predict-table: %s\n", t.failure().c_str());
    return t.unexplained > 0 ? 1 : 0;
  }
  int rc = 1;
  try {
    // Started by mpirun: this process is one rank (--trainer ddp), the job's processes the ranks.
    if (dist::launched_by_mpirun()) dist::init(&argc, &argv);
    rc = run(a, app);  // under mpirun it checks that the processes agree before training
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
  dist::finalize();  // after every communicator is gone (they live in run)
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  io::occupy_closed_std_fds();  // Note [Lost output], core/io/file.h
  // A write past `ulimit -f` fails with EFBIG (a ditto::Error naming the file) instead of
  // SIGXFSZ killing the run with no message and a half-written checkpoint left behind.
  std::signal(SIGXFSZ, SIG_IGN);
  return io::close_stdout(cli_main(argc, argv), "ditto-train");
}
