// The option tables (core/train/options.h, backend_sim/sim_options.h): the fields each row names,
// the values the ranks of an mpirun job compare, and the checks that moved from ditto-train into
// TrainerConfig's and SimRun's validation (the same messages, naming the options by the rows).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend_sim/profiles.h"
#include "backend_sim/sim_options.h"
#include "core/base/error.h"
#include "core/train/metrics_format.h"
#include "core/train/options.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto::train {
namespace {

using test::digits;

/// Every table of ditto-train, with the values they write to.
struct Tables {
  TrainerOptions t;
  CsvRowsOptions rows;
  GptSettings gpt;
  sim::SimOptions sim;
  OptionTable all() {
    OptionTable out;
    for (OptionTable part :
         {trainer_options(t), csv_rows_options(rows), gpt_options(gpt), sim::sim_options(sim)})
      out.insert(out.end(), part.begin(), part.end());
    return out;
  }
};

TEST(Options, RowsNameTheirFields) {
  Tables tables;
  const OptionTable all = tables.all();
  const std::map<std::string, std::string> names = field_names(all);
  EXPECT_EQ(names.at("batch_size"), "--batch-size");
  EXPECT_EQ(names.at("checkpoint_dir"), "--checkpoint");
  EXPECT_EQ(names.at("resume_dir"), "--resume");
  EXPECT_EQ(names.at("memory_capacity"), "--sim-memory-gib");
  EXPECT_EQ(names.at("stragglers"), "--straggler");
  EXPECT_EQ(names.at("faults"), "--fault");
  EXPECT_EQ(names.at("n_layer"), "--n-layer");
  EXPECT_EQ(names.at("export_files"), "--export");
  EXPECT_EQ(names.at("data"), "--data");
  // One row per flag, each with its help; the models' own rows say so.
  std::set<std::string> flags, mlp, gpt;
  for (const OptionRow& r : all) {
    EXPECT_TRUE(flags.insert(r.flag).second) << r.flag << " twice";
    EXPECT_FALSE(r.help.empty()) << r.flag;
    if (r.model == "mlp") mlp.insert(r.flag);
    if (r.model == "gpt") gpt.insert(r.flag);
  }
  EXPECT_EQ(mlp, (std::set<std::string>{"--hidden", "--epochs", "--label-column", "--header",
                                        "--val-fraction", "--loss", "--optimizer", "--momentum",
                                        "--classes"}));
  EXPECT_EQ(gpt.size(), 25u);
  EXPECT_TRUE(gpt.count("--init-from") && gpt.count("--eval-only") && !gpt.count("--data"));
}

TEST(Options, CanonicalValues) {
  EXPECT_EQ(canonical_value("8", false), "8");
  EXPECT_EQ(canonical_value("8.0", false), "8");
  EXPECT_EQ(canonical_value("8e0", false), "8");
  EXPECT_EQ(canonical_value(".05", false), "0.05");
  EXPECT_EQ(canonical_value("0.050", false), "0.05");
  EXPECT_EQ(canonical_value("-0", false), "0");
  EXPECT_EQ(canonical_value("-0.0", false), "0");
  EXPECT_EQ(canonical_value("ddp", false), "ddp");
  EXPECT_EQ(canonical_value(" 8", false), " 8");  // not a number as given: as it is
  EXPECT_EQ(canonical_value("", true), "true");
  EXPECT_EQ(canonical_value("on", true), "true");
  EXPECT_EQ(canonical_value("no", true), "false");
  EXPECT_EQ(shortest(0.05), "0.05");
  EXPECT_EQ(shortest(0.05f), "0.05");  // the float's, not 0.05000000074505806
  EXPECT_EQ(shortest(1e-4), "0.0001");
}

TEST(Options, SettingsTheRanksCompare) {
  Tables tables;
  tables.t.config.micro_shards = 8;
  tables.t.config.momentum = 0.9f;
  tables.sim.run.faults = {"fail:device=1,step=2", "alloc:device=0,after=3"};
  const RankSettings s = option_settings(tables.all(), {{"--devices", "2"}, {"--lr", "0.1"}});
  std::map<std::string, std::string> m(s.begin(), s.end());
  EXPECT_EQ(m.at("--micro-shards"), "8");
  EXPECT_EQ(m.at("--momentum"), "0.9");  // 0.9f as a float's shortest, like "0.90" given
  EXPECT_EQ(m.at("--devices"), "2");     // the effective value, not the default 4
  EXPECT_EQ(m.at("--bias"), "false");
  EXPECT_EQ(m.at("--fault"), "fail:device=1,step=2 alloc:device=0,after=3");
  EXPECT_EQ(m.at("--straggler"), "(none)");
  EXPECT_EQ(m.at("--hidden"), "128");
  EXPECT_FALSE(m.count("--log-interval"));  // output only: rank 0's
  EXPECT_EQ(s.back(), (std::pair<std::string, std::string>{"--lr", "0.1"}));  // last
  EXPECT_EQ(s.front().first, "--backend");  // then in the table's order
}

TEST(Options, TrainerOptionsApplyTheirText) {
  TrainerOptions o;
  o.config.field_names = field_names(trainer_options(o));
  o.hidden = "256,128";
  o.dtype = "bf16";
  o.lr = 0.1f;
  o.config.dry_run = true;
  o.apply({"--lr"});
  EXPECT_EQ(o.config.hidden, (std::vector<std::int64_t>{256, 128}));
  EXPECT_EQ(o.config.dtype, DType::bf16);
  EXPECT_EQ(o.config.lr, 0.1f);
  EXPECT_EQ(o.config.determinism, Determinism::fast);  // a dry run predicts a production run
  EXPECT_FALSE(o.config.memory_capacity);
  o.dtype = "f64";
  test::expect_invalid([&] { o.apply({}); },
                       "--dtype: expected f32, bf16 or f16 (or nanoGPT's float32, bfloat16, "
                       "float16), got 'f64'");
  // Issue 29 (4): nanoGPT's spellings (torch's dtype names) were refused.
  for (const auto& [torch_name, want] : {std::pair<std::string, DType>{"bfloat16", DType::bf16},
                                         {"float16", DType::f16},
                                         {"float32", DType::f32}}) {
    o.dtype = torch_name;
    o.apply({});
    EXPECT_EQ(o.config.dtype, want) << torch_name;
  }
  o.dtype = "f32";
  o.hidden = "128,";
  test::expect_invalid([&] { o.apply({}); }, "--hidden: expected comma-separated positive sizes");
}

TEST(Options, MovedChecksRefuseInTheConfigsValidation) {
  auto refused = [](TrainerConfig c, const std::string& part) {
    Tables names;
    c.field_names = field_names(names.all());
    test::expect_invalid([&] { Trainer(c, digits()); }, part);
  };
  TrainerConfig c;
  c.momentum = -0.5f;
  refused(c, "--momentum: expected a number >= 0, got -0.5");
  c = TrainerConfig{};
  c.weight_decay = -1;
  refused(c, "--weight-decay: expected a number >= 0, got -1");
  c = TrainerConfig{};
  c.micro_shards = 3;
  refused(c, "--micro-shards: expected a power of two in 1..65536, got 3");
  c.micro_shards = 2;  // 4 devices
  refused(c, "--micro-shards: bitwise mode gives every device at least one micro-shard: expected "
             "a power of two >= 4 (the devices), got 2");
  c.micro_shards = 64;
  c.devices = 128;
  refused(c, "expected a power of two >= 128 (the devices), got 64 (the default)");
  c.determinism = Determinism::fast;  // fast mode has no micro-shards
  EXPECT_NO_THROW(Trainer(c, digits()));
  // A simulated cluster multiplies the devices: SimRun::validate checks the total (2 nodes x 4
  // devices), so the CLI reports it as a usage error (exit status 2) before anything starts (it
  // was refused only in fit(), exit status 1).
  TrainerConfig nodes;
  nodes.trainer = TrainerKind::ddp;  // (DataParallel is one node's: refused across nodes, below)
  nodes.micro_shards = 4;
  nodes.field_names = {{"micro_shards", "--micro-shards"}};
  sim::add_sim_run(nodes, [] {
    sim::SimRunOptions o;
    o.profile = "h100-sxm";
    o.nodes = 2;
    return o;
  }());
  refused(nodes,
          "--micro-shards: bitwise mode gives every device at least one micro-shard: expected a "
          "power of two >= 8 (the devices), got 4");
  // The simulator's, in SimRun::validate: the devices are nodes x devices.
  auto sim_refused = [&](const std::function<void(sim::SimRunOptions&)>& set,
                         const std::string& part, TrainerKind trainer = TrainerKind::ddp) {
    sim::SimRunOptions o;
    set(o);
    TrainerConfig t;
    t.trainer = trainer;
    sim::add_sim_run(t, std::move(o));
    refused(t, part);
  };
  sim_refused(
      [](sim::SimRunOptions& o) {
        o.profile = "h100-sxm";
        o.nodes = 2;
        o.stragglers = {{9, 2.0}};
      },
      "--straggler 9:2: expected a device in 0..7, got 9");
  sim_refused(
      [](sim::SimRunOptions& o) {
        o.profile = "h100-sxm";
        o.stragglers = {{0, -2.0}};
      },
      "--straggler 0:-2: expected a factor in 0.001..1000, got -2");
  sim_refused([](sim::SimRunOptions& o) { o.faults = {"fail:device=9,step=0"}; },
              "--fault 'fail:device=9,step=0': expected a device in 0..3, got 9");
  sim_refused([](sim::SimRunOptions& o) { o.profile = "h300"; },
              "--profile: expected one of h100-sxm, h200, a100-sxm-80gb, a100-sxm-40gb, "
              "rtx4070-laptop or a .json file, got 'h300'");
  sim_refused([](sim::SimRunOptions& o) { o.interconnect = "pcie5"; },
              "--interconnect: changes only the cost model's predicted times: expected --profile "
              "(or --trace) with it, got neither");
  sim_refused([](sim::SimRunOptions& o) { o.nodes = 2; },
              "--nodes: the nodes are the cost model's cluster");
  // Tester 6, F15: DataParallel (one process, one node) across nodes was priced without a word
  // (2 x 8 H100s, 10x DDP's step), a plan that cannot be run.
  sim_refused(
      [](sim::SimRunOptions& o) {
        o.profile = "h100-sxm";
        o.nodes = 2;
      },
      "--nodes 2: DataParallel is one process on one node: expected --trainer ddp "
      "(DistributedDataParallel, a rank a GPU, spans nodes), got --trainer dp",
      TrainerKind::dp);
  TrainerConfig dry;
  dry.dry_run = true;
  sim::add_sim_run(dry, {});
  refused(dry, "--dry-run: expected --profile (the GPU to predict for, e.g. a100-sxm-80gb)");
}

// Tester 6, F12: a JSON profile without "bf16_tflops" priced a bf16 run at the FP32 rate (67
// TFLOP/s for an H100 without its tensor-core field: 32 ms for 4.5) without a word. A run whose
// dtype needs a rate the profile leaves out is refused, naming the field; f32 runs need only
// fp32_tflops, f16 takes bf16_tflops, --allow-tf32 needs tf32_tflops.
TEST(Options, JsonProfileWithoutTheRunsRateRefused) {
  const std::string path = test::fresh_dir("options", "rates") + "/ditto_options_rates.json";
  {
    std::ofstream f(path);
    f << R"({"key": "x", "fp32_tflops": 67, "memory_gib": 80, "memory_bandwidth_gbps": 3350})";
  }
  auto config = [&](DType dtype, bool tf32) {
    TrainerConfig c;
    c.dtype = dtype;
    c.allow_tf32 = tf32;
    c.determinism = Determinism::fast;
    sim::SimRunOptions o;
    o.profile = path;
    sim::add_sim_run(c, std::move(o));
    Tables names;
    c.field_names = field_names(names.all());
    return c;
  };
  test::expect_invalid(
      [&] { Trainer(config(DType::bf16, false), digits()); },
      "--profile " + path +
          ": --dtype bf16 prices its matrix products at the tensor cores' BF16 / FP16 rate: "
          "expected a \"bf16_tflops\" field in " +
          path + ", got none (without it the FP32 rate would be taken)");
  test::expect_invalid([&] { Trainer(config(DType::f16, false), digits()); },
                       "expected a \"bf16_tflops\" (or \"f16_tflops\") field in");
  test::expect_invalid(
      [&] { Trainer(config(DType::f32, true), digits()); },
      "--allow-tf32 prices its matrix products at the tensor cores' TF32 rate: expected a "
      "\"tf32_tflops\" field in");
  EXPECT_NO_THROW(Trainer(config(DType::f32, false), digits()));  // needs fp32_tflops only
  // Its GPUs' links, with no --interconnect: the fallback PCIe Gen4, said (it was not).
  TrainerConfig two = config(DType::f32, false);
  two.devices = 2;
  const std::vector<std::string> warned = sim::SimRun({.profile = path}).warnings(two);
  ASSERT_EQ(warned.size(), 1u);
  EXPECT_EQ(warned[0], "--profile " + path +
                           ": no --interconnect: its GPUs' links priced as pcie4 (PCIe Gen4 x16 "
                           "(no NVLink); InfiniBand NDR between nodes), a JSON profile's default; "
                           "--interconnect nvlink, nvlink3 or pcie5 prices another");
  two.devices = 1;
  EXPECT_TRUE(sim::SimRun({.profile = path}).warnings(two).empty());
  // The links go by the profile's "key" (default_interconnect): one that names a built-in
  // profile gets its links, not the fallback, and no warning (it said "priced as nvlink (...), a
  // JSON profile's default" of an "h100-sxm" key, and of "rtx4070-laptop" that PCIe Gen4 was).
  two.devices = 2;
  for (const char* key : {"h100-sxm", "a100-sxm-40gb", "rtx4070-laptop"}) {
    {
      std::ofstream f(path);
      f << R"({"key": ")" << key
        << R"(", "fp32_tflops": 67, "memory_gib": 80, "memory_bandwidth_gbps": 3350})";
    }
    EXPECT_EQ(sim::default_interconnect(sim::device_profile(path).key),
              sim::default_interconnect(key));
    EXPECT_EQ(sim::SimRun({.profile = path}).warnings(two), std::vector<std::string>{}) << key;
  }
  {
    std::ofstream f(path);
    f << R"({"key": "x", "fp32_tflops": 67, "bf16_tflops": 989.5, "memory_gib": 80,
             "memory_bandwidth_gbps": 3350})";
  }
  EXPECT_NO_THROW(Trainer(config(DType::bf16, false), digits()));
  EXPECT_NO_THROW(Trainer(config(DType::f16, false), digits()));  // f16 at bf16's rate
  std::remove(path.c_str());
}

TEST(Options, StragglersParse) {
  TrainerConfig c;
  Tables names;
  c.field_names = field_names(names.all());
  sim::SimOptions s;
  s.stragglers = {"3:2.5"};
  EXPECT_EQ(s.parsed(c).stragglers, (std::vector<std::pair<int, double>>{{3, 2.5}}));
  s.stragglers = {"3x2"};
  test::expect_invalid([&] { s.parsed(c); },
                       "--straggler: expected DEVICE:FACTOR such as 3:2.5, got '3x2'");
}

TEST(Options, Warnings) {
  TrainerConfig c;
  c.field_names = {{"bucket_cap_mb", "--bucket-cap-mb"}, {"devices", "--devices"}};
  EXPECT_TRUE(config_warnings(c, {}).empty());
  const std::vector<std::string> w = config_warnings(c, {"bucket_cap_mb"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("--bucket-cap-mb: sizes --trainer ddp's gradient buckets", 0), 0u) << w[0];
  // --zero-overlap-comm given where there is no ZeRO-1 (a tester's case: accepted silently).
  c.field_names["zero_overlap_comm"] = "--zero-overlap-comm";
  const std::vector<std::string> z = config_warnings(c, {"zero_overlap_comm"});
  ASSERT_EQ(z.size(), 1u);
  EXPECT_EQ(z[0].rfind("--zero-overlap-comm: overlaps ZeRO-1's reduce_scatters", 0), 0u) << z[0];
  c.trainer = TrainerKind::ddp;
  EXPECT_EQ(config_warnings(c, {"zero_overlap_comm"}).size(), 1u);  // ddp without ZeRO
  c.zero_stage = 1;
  EXPECT_TRUE(config_warnings(c, {"zero_overlap_comm"}).empty());
  c.trainer = TrainerKind::dp;
  c.zero_stage = 0;
  c.devices = 3;
  ASSERT_EQ(config_warnings(c, {}).size(), 1u);
  EXPECT_EQ(config_warnings(c, {})[0].rfind("--devices: 3 devices, not a power of two", 0), 0u);
}

// --allow-tf32 in bitwise mode was accepted without a word (a tester's case): it does nothing
// there.
TEST(Options, AllowTf32InBitwiseModeWarns) {
  TrainerConfig c;
  c.field_names = {{"allow_tf32", "--allow-tf32"}, {"devices", "--devices"}};
  c.allow_tf32 = true;
  c.determinism = Determinism::fast;
  EXPECT_TRUE(config_warnings(c, {"allow_tf32"}).empty());
  c.determinism = Determinism::bitwise;
  const std::vector<std::string> w = config_warnings(c, {"allow_tf32"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].rfind("--allow-tf32: lets fast mode's f32 matrix products run on TF32", 0), 0u)
      << w[0];
  EXPECT_NE(w[0].find("does nothing in this run"), std::string::npos) << w[0];
  c.allow_tf32 = false;  // --allow-tf32=false: nothing to say
  EXPECT_TRUE(config_warnings(c, {"allow_tf32"}).empty());
}

// Likewise with --dtype bf16 / f16 in fast mode (a tester's case): their matrix products run on
// the BF16 / FP16 tensor cores, and TF32 affects only f32 ones.
TEST(Options, AllowTf32WithAHalfDtypeWarns) {
  TrainerConfig c;
  c.field_names = {{"allow_tf32", "--allow-tf32"}, {"dtype", "--dtype"}};
  c.allow_tf32 = true;
  c.determinism = Determinism::fast;
  for (const auto& [dtype, name] : {std::pair{DType::bf16, "bf16"}, std::pair{DType::f16, "f16"}}) {
    c.dtype = dtype;
    const std::vector<std::string> w = config_warnings(c, {"allow_tf32"});
    ASSERT_EQ(w.size(), 1u) << name;
    EXPECT_EQ(w[0], std::string("--allow-tf32: lets fast mode's f32 matrix products run on TF32 "
                                "tensor cores; --dtype ") +
                        name + "'s matrix products run on the " +
                        (dtype == DType::bf16 ? "BF16" : "FP16") +
                        " tensor cores (TF32 affects only f32 ones), so it does nothing in this "
                        "run");
  }
  c.dtype = DType::f32;
  EXPECT_TRUE(config_warnings(c, {"allow_tf32"}).empty());
  c.dtype = DType::bf16;
  c.determinism = Determinism::bitwise;  // bitwise mode's warning, once
  ASSERT_EQ(config_warnings(c, {"allow_tf32"}).size(), 1u);
  EXPECT_NE(config_warnings(c, {"allow_tf32"})[0].find("bitwise mode keeps strict f32"),
            std::string::npos);
}

// --sim-memory-gib with --backend cuda was accepted without a word (a tester's case): the cuda
// backend never reads memory_capacity.
TEST(Options, SimMemoryWithTheCudaBackendWarns) {
  TrainerConfig c;
  c.field_names = {{"memory_capacity", "--sim-memory-gib"}, {"devices", "--devices"}};
  c.backend = "sim";
  EXPECT_TRUE(config_warnings(c, {"memory_capacity"}).empty());
  c.backend = "cuda";
  EXPECT_TRUE(config_warnings(c, {}).empty());
  const std::vector<std::string> w = config_warnings(c, {"memory_capacity"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(
      w[0].rfind("--sim-memory-gib: the capacity of simulated devices; the cuda backend's", 0), 0u)
      << w[0];
}

TEST(Options, CsvRowsClasses) {
  TrainerConfig c;
  CsvRowsOptions o{.data = DITTO_DIGITS_CSV};
  c.field_names = field_names(csv_rows_options(o));
  EXPECT_EQ(open_csv_rows(o, c)->num_outputs(), 10);
  o.classes = 12;
  EXPECT_EQ(open_csv_rows(o, c)->num_outputs(), 12);
  o.classes = 5;
  test::expect_invalid([&] { open_csv_rows(o, c); },
                       "--classes: expected a number of classes greater than every label");
  o.classes = 0;
  o.header = "maybe";
  test::expect_invalid([&] { open_csv_rows(o, c); },
                       "--header: expected auto, yes or no, got 'maybe'");
}

}  // namespace
}  // namespace ditto::train

namespace ditto::train {
namespace {

TEST(RunPrinter, WritesJsonLinesAndKeepsLateErrors) {
  const std::string path = test::fresh_dir("options", "run_printer") + "/run_printer.jsonl";
  RunPrinter p(path, "--metrics-jsonl", "", DType::f32);
  TrainerCallbacks cb;
  p.install(cb, [](const RunInfo&) { return std::string(); });
  ASSERT_TRUE(cb.on_start && cb.on_epoch && cb.on_eval && cb.on_step);
  cb.on_start(RunInfo{});  // opens the file (not before: a refused run leaves it untouched)
  EpochMetrics m;
  m.epoch = 1;
  cb.on_epoch(m);
  p.write_result(FitResult{});
  std::FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  int lines = 0;
  for (int ch; (ch = std::fgetc(f)) != EOF;) lines += ch == '\n';
  std::fclose(f);
  EXPECT_EQ(lines, 2);  // the epoch's and the final record
  EXPECT_EQ(p.finish("prog"), 0);
  p.late_errors.push_back("--sample: no");
  EXPECT_EQ(p.finish("prog"), 1);  // the exit status of a run whose output failed after it

  RunPrinter bad("/nonexistent-dir/m.jsonl", "--metrics-jsonl", "", DType::f32);
  TrainerCallbacks cb2;
  bad.install(cb2, [](const RunInfo&) { return std::string(); });
  test::expect_invalid([&] { cb2.on_start(RunInfo{}); }, "--metrics-jsonl: ");
}

// nanoGPT's train.py settings typed as options (configurator.py's --key=value): ditto's option
// where it has one, what to do where it has none, nothing for other names and for those ditto
// spells the same (its own options take them).
TEST(Options, NanoGptSettingNamesGetDittosOptionOrSayThereIsNone) {
  EXPECT_EQ(nanogpt_option_hint("--out_dir=out"),
            "did you mean --checkpoint? (nanoGPT's out_dir: ditto writes DIR/step-N/ checkpoints "
            "there)");
  EXPECT_EQ(nanogpt_option_hint("--max_iters=5"), "did you mean --max-iters?");
  EXPECT_EQ(nanogpt_option_hint("--learning-rate"), "did you mean --lr? (nanoGPT's learning_rate)");
  EXPECT_EQ(nanogpt_option_hint("--eval_interval"), "did you mean --eval-interval?");
  for (const char* n :
       {"--batch_size", "--block_size", "--n_layer", "--n_head", "--n_embd", "--eval_iters",
        "--log_interval", "--eval_only", "--weight_decay", "--grad_clip", "--warmup_iters",
        "--lr_decay_iters", "--min_lr", "--init_from=resume", "--dataset=shakespeare_char",
        "--gradient_accumulation_steps=4"})
    EXPECT_EQ(nanogpt_option_hint(n).rfind("did you mean --", 0), 0u) << n;
  EXPECT_EQ(nanogpt_option_hint("--compile=False"),
            "nanoGPT's compile has no ditto equivalent: ditto has no torch.compile: its kernels "
            "are compiled ahead of time; leave it out");
  for (const char* n : {"--decay_lr=False", "--always_save_checkpoint=True", "--device=cuda",
                        "--wandb_log=True", "--wandb_project=x", "--wandb_run_name=y"})
    EXPECT_NE(nanogpt_option_hint(n).find(" has no ditto equivalent: "), std::string::npos) << n;
  for (const char* n : {"--epoch", "--dropout=0.1", "--dtype=bfloat16", "--beta2=0.99", "", "--"})
    EXPECT_EQ(nanogpt_option_hint(n), "") << n;
}

}  // namespace
}  // namespace ditto::train
