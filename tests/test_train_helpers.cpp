// The library homes of what ditto-train used to do itself (issue 30): the report lines
// (core/train/metrics_format.h), --resume auto's lookup (holds_checkpoint), the output-path
// checks (core/io/file.h), --classes (CsvDataSource::set_num_classes), the graceful stop
// (core/train/graceful_stop.h) and nanoGPT's recipe (core/train/gpt_recipe.h), each with the
// values and messages ditto-train prints (the CLI tests check them end to end).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "core/checkpoint/checkpoint.h"
#include "core/data/data_source.h"
#include "core/io/file.h"
#include "core/nn/gpt.h"
#include "core/train/cost_meter.h"
#include "core/train/gpt_recipe.h"
#include "core/train/graceful_stop.h"
#include "core/train/metrics_format.h"
#include "temp_files.h"
#include "test_util.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using test::expect_invalid;

std::string fresh_dir(const std::string& name) { return test::fresh_dir("trainhelpers", name); }

TEST(MetricsFormat, StepLineIsNanoGptsWithTheEpochPositionAndPrediction) {
  train::StepMetrics m;
  m.iter = 7;
  m.loss = 1.23456;
  m.time_s = 0.0125;
  EXPECT_EQ(train::format_step(m, "", DType::f32), "iter 7: loss 1.2346, time 12.50ms\n");
  m.epoch = 2;
  m.batch = 3;
  m.batches = 23;
  m.mfu = 0.5;
  m.predicted_time_s = 0.001;
  EXPECT_EQ(train::format_step(m, "h100-sxm", DType::bf16),
            "iter 7: loss 1.2346, time 12.50ms, mfu 50.00% (epoch 2, batch 4 of 23; predicted "
            "1.000ms on h100-sxm, mfu of its BF16 peak)\n");
}

TEST(MetricsFormat, FinalLineSaysOnlyWhatTheRunMeasured) {
  train::FitResult r;
  r.backend = "sim";
  r.devices = 4;
  r.epochs = 20;
  r.train_loss = 0.25;
  r.eval = {0.5, 0.9};
  r.train_time_s = 1.5;
  r.params_checksum = 0x1234;
  EXPECT_EQ(train::format_final(r),
            "final: backend=sim devices=4 determinism=bitwise epochs=20 train_loss=0.250000 "
            "val_loss=0.500000 val_acc=0.9000 train_time_s=1.500 "
            "params_checksum=0000000000001234\n");
  r.dry_run = true;  // nothing ran: no losses, no checksum
  r.steps = 2;
  r.dtype = DType::bf16;
  r.trainer = train::TrainerKind::ddp;
  EXPECT_EQ(train::format_final(r, 1024),
            "final: backend=sim devices=4 determinism=bitwise dtype=bf16 trainer=ddp iters=2 "
            "train_time_s=1.500\n");
  r.loss_scale = 65536.0f;
  r.skipped_steps = 3;
  EXPECT_NE(train::format_final(r).find("\ngrad_scaler: scale=65536 skipped_steps=3 (f16 "
                                        "dynamic loss scaling)\n"),
            std::string::npos);
}

// A real run's prediction prices the simulator's own kernels, a dry run's the CUDA backend's
// (docs/prediction.md): the real run's line says so and points to --dry-run; the dry run's does
// not (its line is the GPU's prediction).
TEST(MetricsFormat, ARealRunsPredictionSaysItPricedTheSimulatorsKernels) {
  train::CostPrediction p;
  p.devices = 2;
  p.device_name = "NVIDIA H100 SXM5 80GB";
  p.interconnect = "nvlink";
  p.step_time_s = 1.4869e-3;
  p.samples_per_s = 10760;
  p.comm_share = 0.1;
  p.peak_flops = 67e12;
  p.mfu = 0.01;
  p.measured_step_time_s = 0.5;
  p.measured_samples_per_s = 32;
  const std::string note = "; the simulator's own kernels: --dry-run prices a GPU's)";
  const std::string gpt = train::format_prediction(p, DType::bf16, false, 128);
  EXPECT_EQ(gpt.substr(0, gpt.find('\n')),
            "predicted: 2 x NVIDIA H100 SXM5 80GB (1 node, nvlink) step_time=1.4869 ms "
            "samples/s=10760 tokens/s=1377280 comm_share=10.0% (virtual time" +
                note);
  const std::string mlp = train::format_prediction(p, DType::f32, false, 0);
  EXPECT_NE(mlp.find("mfu=1% (virtual time; FP32 peak 67.0 TFLOP/s per GPU" + note + "\n"),
            std::string::npos)
      << mlp;
  EXPECT_NE(mlp.find("\nmeasured:  CPU simulator"), std::string::npos) << mlp;
  for (std::int64_t tokens : {0, 128}) {
    const std::string dry = train::format_prediction(p, DType::bf16, true, tokens);
    EXPECT_EQ(dry.find("simulator's own kernels"), std::string::npos) << dry;
    EXPECT_EQ(dry.find("measured:"), std::string::npos) << dry;
  }
}

// MFU is of the peak of the unit the run's matrix products are priced on, each dtype its own: a
// JSON profile with "f16_tflops": 125 and no "bf16_tflops" (a V100: its BF16 rate the loader's
// FP32 fallback, 15.7) priced f16 GEMMs at FP16 125 but gave "mfu=424.5% of BF16 peak 15.7".
TEST(MetricsFormat, MfuIsOfTheRunDtypesOwnPeak) {
  CostRates v100;
  v100.fp32_flops = v100.tf32_flops = v100.bf16_flops = 15.7e12;  // the loader's fallbacks
  v100.f16_flops = 125e12;
  const auto peak = [&](DType t, bool tf32) {
    const train::MfuPeak p = train::mfu_peak(v100, 15.7e12, t, tf32);
    return std::pair<double, std::string>{p.flops, p.name};
  };
  using Peak = std::pair<double, std::string>;
  EXPECT_EQ(peak(DType::f16, false), (Peak{125e12, "FP16"}));
  EXPECT_EQ(peak(DType::bf16, false), (Peak{15.7e12, "BF16"}));
  EXPECT_EQ(peak(DType::f32, false), (Peak{15.7e12, "FP32"}));
  EXPECT_EQ(peak(DType::f32, true), (Peak{15.7e12, "TF32"}));
  CostRates h100{67e12, 494.7e12, 989.5e12, 989.5e12};
  EXPECT_EQ(train::mfu_peak(h100, 67e12, DType::f32, true).flops, 494.7e12);
  EXPECT_EQ(std::string(train::mfu_peak(h100, 67e12, DType::f16, false).name), "FP16");
  // A rate the cost model does not give is FP32's, named so.
  EXPECT_EQ(std::string(train::mfu_peak(CostRates{}, 67e12, DType::bf16, false).name), "FP32");
  EXPECT_EQ(train::mfu_peak(CostRates{}, 67e12, DType::bf16, false).flops, 67e12);

  // The GPT's line: GPT-2 124M at 4 x 1024 tokens, 1 V100 at 0.53 of its FP16 peak.
  nn::GPTConfig m;
  m.block_size = 1024;
  m.vocab_size = 50257;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  train::TrainerConfig c;
  c.dtype = DType::f16;
  c.determinism = Determinism::fast;
  c.batch_size = 4;
  train::CostPrediction p;
  p.devices = 1;
  p.peak_flops = 15.7e12;
  p.bf16_peak_flops = 15.7e12;
  p.rates = v100;
  const double flops_per_token = train::gpt_flops_per_token(m);
  p.samples_per_s = 0.53 * 125e12 / flops_per_token / 1024;
  const std::string line = train::format_gpt_prediction(p, {}, m, c);
  EXPECT_NE(line.find("; mfu=53.0% of FP16 peak 125 TFLOP/s per GPU with nanoGPT's estimate_mfu"),
            std::string::npos)
      << line;
  // The predicted: line names the meter's peak (mfu_peak_name), the step line the run's.
  p.mfu = 0.53;
  p.mfu_peak_flops = 125e12;
  p.mfu_peak_name = "FP16";
  EXPECT_NE(train::format_prediction(p, DType::f16, true, 0)
                .find(" mfu=53% (virtual time; FP16 peak 125.0 TFLOP/s per GPU)"),
            std::string::npos);
  train::StepMetrics s;
  s.mfu = 0.53;
  s.predicted_time_s = 0.1;
  s.peak_name = "FP16";
  EXPECT_NE(train::format_step(s, "v100.json", DType::f16).find("mfu of its FP16 peak)"),
            std::string::npos);
}

// --verbose's table: the kernel column as wide as its longest name (layernorm_backward_params, 25
// characters, overflowed the 24 it had and pushed its row's figures one column right).
TEST(MetricsFormat, KernelTableColumnsFitTheLongestName) {
  train::CostPrediction p;
  p.step_time_s = 1e-3;
  p.steps = 1;
  p.kernels = {{"gemm_ex", "tensor core bf16", 147, 6.07e12, 1.17e10, 600000000},
               {"layernorm_backward_params", "memory", 25, 2.668e9, 1.414e9, 400000000}};
  const std::string t = train::format_step_kernels(p, "title:");
  std::vector<std::string> lines;
  for (std::size_t at = 0, nl; (nl = t.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(t.substr(at, nl - at));
  ASSERT_EQ(lines.size(), 6u) << t;  // title, header, 2 rows, total, predicted step
  EXPECT_EQ(lines[1], "  kernel                     per step       GFLOP          MB  unit      "
                      "              time ms   share");
  EXPECT_EQ(lines[2], "  gemm_ex                         147    6070.000   11700.000  tensor core "
                      "bf16         0.6000   60.0%");
  EXPECT_EQ(lines[3], "  layernorm_backward_params        25       2.668    1414.000  memory      "
                      "             0.4000   40.0%");
  for (std::size_t i = 2; i < lines.size(); ++i) EXPECT_EQ(lines[i].size(), lines[1].size()) << i;
}

TEST(MetricsFormat, MemoryEpochAndEvalLines) {
  train::DeviceMemory d;
  d.device = "sim:0";
  d.stats.in_use = 1048576;
  d.stats.peak = 3 * 1048576 / 2;
  d.stats.capacity = 2097152;
  EXPECT_EQ(train::format_memory({d}), "memory: sim:0 live=1.00 MiB peak=1.50 MiB capacity=2.00 "
                                       "MiB optimizer_state=0.00 MiB\n");
  train::EpochMetrics e;
  e.epoch = 3;
  e.train_loss = 0.5;
  e.val_loss = 0.25;
  e.val_acc = 0.75;
  e.samples_per_s = 1000;
  EXPECT_EQ(train::format_epoch(e), "epoch   3  train_loss=0.5000  val_loss=0.2500  "
                                    "val_acc=0.7500  samples/s=1000\n");
  train::EvalMetrics v;
  v.step = 250;
  v.train_loss = 1.5;
  v.val_loss = 1.75;
  v.lr = 1e-3;
  v.tokens_per_s = 2000;
  v.eta_s = 3725;
  EXPECT_EQ(train::format_eval(v), "step 250: train loss 1.5000, val loss 1.7500 (lr 1.000e-03, "
                                   "2000 tokens/s, ETA 1:02:05)\n");
  // --eval-only trains nothing: nanoGPT's eval_only line, no learning rate (session 56, B4).
  v.eval_only = true;
  EXPECT_EQ(train::format_eval(v), "step 250: train loss 1.5000, val loss 1.7500\n");
}

// A diverged run's NaN loss prints as "nan" whatever its sign bit (x86's inf - inf gives the
// negative default NaN, a GPU its positive canonical NaN: Note [NaN bits]), so the simulator's and
// a GPU's logs of one run stay equal.
TEST(MetricsFormat, NanLossesPrintWithoutTheirSign) {
  const double neg = -std::numeric_limits<double>::quiet_NaN();
  ASSERT_TRUE(std::signbit(neg));
  train::StepMetrics m;
  m.iter = 3;
  m.loss = neg;
  m.time_s = 0.001;
  EXPECT_EQ(train::format_step(m, "", DType::f32), "iter 3: loss nan, time 1.00ms\n");
  train::EvalMetrics v;
  v.step = 4;
  v.train_loss = neg;
  v.val_loss = neg;
  v.lr = 1e-3;
  EXPECT_EQ(train::format_eval(v), "step 4: train loss nan, val loss nan (lr 1.000e-03)\n");
  train::EpochMetrics e;
  e.epoch = 1;
  e.train_loss = neg;
  e.val_loss = neg;
  e.val_acc = 0.5;
  e.samples_per_s = 10;
  EXPECT_EQ(train::format_epoch(e),
            "epoch   1  train_loss=nan  val_loss=nan  val_acc=0.5000  samples/s=10\n");
  train::FitResult r;
  r.backend = "sim";
  r.devices = 1;
  r.epochs = 1;
  r.has_train_loss = true;
  r.train_loss = neg;
  r.has_eval = true;
  r.eval = {neg, 0.5};
  r.train_time_s = 1;
  r.params_checksum = 1;
  EXPECT_EQ(train::format_final(r),
            "final: backend=sim devices=1 determinism=bitwise epochs=1 train_loss=nan "
            "val_loss=nan val_acc=0.5000 train_time_s=1.000 params_checksum=0000000000000001\n");
}

TEST(HoldsCheckpoint, LatestOrAStepDirectoryButNotATemporaryOne) {
  const std::string dir = fresh_dir("holds");
  EXPECT_FALSE(holds_checkpoint(dir + "/missing"));
  EXPECT_FALSE(holds_checkpoint(dir));
  fs::create_directory(dir + "/step-00000005.tmp");
  EXPECT_FALSE(holds_checkpoint(dir));
  fs::create_directory(dir + "/step-00000005");  // damaged or not: an error on resume
  EXPECT_TRUE(holds_checkpoint(dir));
  const std::string file = dir + "/afile";
  std::ofstream(file) << "x";
  expect_invalid([&] { holds_checkpoint(file, "--resume auto --checkpoint"); },
                 "--resume auto --checkpoint: expected a checkpoint directory (or one to create), "
                 "got '" +
                     file + "', which is not a directory");
}

TEST(OutputPaths, AnOutputIsNeitherAnInputNorAnotherOutputNorInsideADirectory) {
  const std::string dir = fresh_dir("outputs");
  const std::string data = dir + "/data.csv";
  io::check_outputs_are_not_inputs({{"--trace", dir + "/t.json"}, {"--metrics-jsonl", ""}},
                                   {{"--data", data}}, {{"--checkpoint", ""}});
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--trace", dir + "/./data.csv"}}, {{"--data", data}},
                                         {});
      },
      "--trace: expected a file other than --data '" + data + "', got '" + dir +
          "/./data.csv', which it would overwrite");
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--trace", dir + "/m"}, {"--metrics-jsonl", dir + "/m"}},
                                         {{"--data", data}}, {});
      },
      "--metrics-jsonl: expected a file other than --trace '");
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--trace", dir + "/ck/latest"}}, {},
                                         {{"--checkpoint", dir + "/ck"}});
      },
      "--trace: expected a file outside the --checkpoint directory '" + dir + "/ck', got '");
}

// The same file by identity (a hard link: no path comparison sees it), and an existing
// read-only output refused by its mode bits (for root too), as --export's.
TEST(OutputPaths, AnOutputIsComparedByIdentityAndMustBeWritableByItsMode) {
  const std::string dir = fresh_dir("outputs_identity");
  const std::string val = dir + "/val.bin", link = dir + "/link.bin";
  std::ofstream(val) << "tokens";
  ASSERT_EQ(::link(val.c_str(), link.c_str()), 0);
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--export llmc", link}}, {{"--val-data", val}}, {});
      },
      "--export llmc: expected a file other than --val-data '" + val + "', got '" + link +
          "', which it would overwrite");
  const std::string ro = dir + "/ro.txt";
  std::ofstream(ro) << "keep";
  ASSERT_EQ(::chmod(ro.c_str(), 0444), 0);
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--metrics-jsonl", ro}}, {}, {});
      },
      "--metrics-jsonl: expected a file it may replace, got '" + ro +
          "': Permission denied / read-only: remove it or chmod u+w");
  ASSERT_EQ(::chmod(ro.c_str(), 0644), 0);
  io::check_outputs_are_not_inputs({{"--metrics-jsonl", ro}, {"--trace", "/dev/stdout"}}, {}, {});
}

// A dangling symbolic link is the file its target names (what the write creates: resolve_links,
// as write_file_atomic and open(2) follow it), so an output given as one is compared like that
// path: with an input or an earlier output of that name, and with the directories (all missing
// yet: no stat identity). Before, the link's own path was compared, and each of these passed.
TEST(OutputPaths, ADanglingLinkIsComparedAsTheFileItNames) {
  const std::string dir = fresh_dir("outputs_dangling");
  const std::string to_trace = dir + "/to_trace.json", to_val = dir + "/to_val.bin",
                    to_ck = dir + "/to_ck", chain = dir + "/chain";
  ASSERT_EQ(::symlink("t.json", to_trace.c_str()), 0);  // relative: dir/t.json, not made yet
  ASSERT_EQ(::symlink((dir + "/val.bin").c_str(), to_val.c_str()), 0);
  ASSERT_EQ(::symlink("ck/latest", to_ck.c_str()), 0);
  ASSERT_EQ(::symlink("to_trace.json", chain.c_str()), 0);  // a chain: chain -> to_trace -> t.json
  // Another output of that name.
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs(
            {{"--trace", dir + "/t.json"}, {"--metrics-jsonl", to_trace}}, {}, {});
      },
      "--metrics-jsonl: expected a file other than --trace '" + dir + "/t.json', got '" + to_trace +
          "', which it would overwrite");
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--trace", chain}, {"--metrics-jsonl", to_trace}}, {},
                                         {});
      },
      "--metrics-jsonl: expected a file other than --trace '");
  // An input of that name (missing too), and an input given through the link.
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--export llmc", to_val}},
                                         {{"--val-data", dir + "/val.bin"}}, {});
      },
      "--export llmc: expected a file other than --val-data '" + dir + "/val.bin', got '" + to_val +
          "'");
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--export llmc", dir + "/val.bin"}},
                                         {{"--val-data", to_val}}, {});
      },
      "--export llmc: expected a file other than --val-data '");
  // Inside a directory.
  expect_invalid(
      [&] {
        io::check_outputs_are_not_inputs({{"--trace", to_ck}}, {}, {{"--checkpoint", dir + "/ck"}});
      },
      "--trace: expected a file outside the --checkpoint directory '" + dir + "/ck', got '" +
          to_ck + "'");
  // Different files stay different.
  io::check_outputs_are_not_inputs({{"--trace", to_trace}, {"--metrics-jsonl", to_val}},
                                   {{"--data", dir + "/data.csv"}},
                                   {{"--checkpoint", dir + "/c2"}});
}

TEST(OutputPaths, AReplaceableOutputIsARegularFileInAWritableDirectory) {
  const std::string dir = fresh_dir("replaceable");
  io::check_replaceable_output(dir + "/new.bin", "--export llmc");
  EXPECT_TRUE(test::temp_leftovers(dir).empty());  // the probe is removed
  EXPECT_FALSE(fs::exists(dir + "/new.bin"));
  expect_invalid([&] { io::check_replaceable_output(dir, "--export hf"); },
                 "--export hf: expected a regular file (or none: it is created), got '" + dir +
                     "', a directory");
  expect_invalid([&] { io::check_replaceable_output(dir + "/no/x.bin", "--export hf"); },
                 "--export hf: expected a file in an existing directory, got '" + dir +
                     "/no/x.bin' (no directory '" + dir + "/no')");
}

// tester5: a FIFO was refused as one "opening it would block until a reader comes", also when a
// reader was there. Refused either way (a file written into a pipe can end half-way), with one
// message that holds for both, and without opening it (the check never blocks: no reader here
// would otherwise hang the test).
TEST(OutputPaths, AFifoIsRefusedWithOrWithoutAReaderWithoutOpeningIt) {
  const std::string dir = fresh_dir("replaceable_fifo");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string want =
      "--export llmc: expected a regular file (or none: it is created), got '" + fifo +
      "', a FIFO (a named pipe: the file is written whole, to a temporary file renamed into "
      "place, which a pipe cannot be; a write into a pipe that ended half-way would leave its "
      "reader a partial file: write a file and copy it into the pipe)";
  expect_invalid([&] { io::check_replaceable_output(fifo, "--export llmc"); }, want);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);  // a reader waits on it
  ASSERT_GE(reader, 0);
  expect_invalid([&] { io::check_replaceable_output(fifo, "--export llmc"); }, want);
  // Through a symbolic link: the same, naming the link and what it points at.
  fs::create_symlink("fifo", dir + "/to_fifo");
  expect_invalid([&] { io::check_replaceable_output(dir + "/to_fifo", "--export llmc"); },
                 "--export llmc: expected a regular file (or none: it is created), got '" + dir +
                     "/to_fifo' (a symbolic link to '" + dir + "/fifo'), a FIFO (a named pipe");
  char byte = 0;
  EXPECT_EQ(::read(reader, &byte, 1), 0);  // nothing was written into it
  ::close(reader);
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
}

// tester5: a dangling symbolic link into a missing directory passed the start check, which
// probed the directory beside the link, and the --export failed after training (exit 1). The
// write follows the link (Note [Atomic write]: open(link, "wb") creates its target), so the
// check probes the target's directory, as the write will; a dangling link into an existing
// directory passes (the export creates the target), and a loop of links is refused.
TEST(OutputPaths, AReplaceableOutputBehindASymbolicLinkIsCheckedWhereTheWriteGoes) {
  const std::string dir = fresh_dir("replaceable_links");
  fs::create_symlink("missing/model.bin", dir + "/dangling.bin");
  expect_invalid([&] { io::check_replaceable_output(dir + "/dangling.bin", "--export llmc"); },
                 "--export llmc: expected a file in an existing directory, got '" + dir +
                     "/dangling.bin' (a symbolic link to '" + dir +
                     "/missing/model.bin'; no directory '" + dir + "/missing')");
  fs::create_directory(dir + "/out");
  fs::create_symlink("out/model.bin", dir + "/later.bin");
  io::check_replaceable_output(dir + "/later.bin", "--export llmc");
  EXPECT_TRUE(test::temp_leftovers(dir + "/out").empty());  // the probe, beside the target
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  EXPECT_FALSE(fs::exists(dir + "/out/model.bin"));
  fs::create_symlink("loop_b", dir + "/loop_a");
  fs::create_symlink("loop_a", dir + "/loop_b");
  expect_invalid([&] { io::check_replaceable_output(dir + "/loop_a", "--trace"); },
                 "--trace: expected a file or a symbolic link to one, got '" + dir +
                     "/loop_a' (io::resolve_links: cannot resolve symbolic link '" + dir +
                     "/loop_a': Too many levels of symbolic links)");
  // A link to a read-only file: its target's mode decides, as the write replaces the target.
  std::ofstream(dir + "/ro.bin") << "keep";
  ASSERT_EQ(::chmod((dir + "/ro.bin").c_str(), 0444), 0);
  fs::create_symlink("ro.bin", dir + "/to_ro.bin");
  expect_invalid([&] { io::check_replaceable_output(dir + "/to_ro.bin", "--export hf"); },
                 "--export hf: expected a file it may replace, got '" + dir + "/ro.bin'");
}

TEST(CsvDataSource, SetNumClassesGivesMoreOutputsThanTheLabelsNeed) {
  const std::string dir = fresh_dir("classes");
  std::ofstream(dir + "/d.csv") << "1,2,0\n3,4,2\n5,6,1\n7,8,0\n9,10,1\n";
  train::CsvDataSource rows(dir + "/d.csv", data::CsvOptions{}, 0.2, 0);
  EXPECT_EQ(rows.num_outputs(), 3);
  rows.set_num_classes(10, "--classes");
  EXPECT_EQ(rows.num_outputs(), 10);
  expect_invalid([&] { rows.set_num_classes(2, "--classes"); },
                 "--classes: expected a number of classes greater than every label (the largest "
                 "is 2), got 2");
}

// The process's SIGINT, SIGTERM and SIGUSR1 dispositions, restored when it goes
// (install_stop_handlers replaces them).
class SavedStopSignals {
 public:
  SavedStopSignals() {
    ::sigaction(SIGINT, nullptr, &int_);
    ::sigaction(SIGTERM, nullptr, &term_);
    ::sigaction(SIGUSR1, nullptr, &usr1_);
  }
  ~SavedStopSignals() {
    ::sigaction(SIGINT, &int_, nullptr);
    ::sigaction(SIGTERM, &term_, nullptr);
    ::sigaction(SIGUSR1, &usr1_, nullptr);
  }
  SavedStopSignals(const SavedStopSignals&) = delete;
  SavedStopSignals& operator=(const SavedStopSignals&) = delete;

 private:
  struct sigaction int_ {
  }, term_{}, usr1_{};
};

TEST(GracefulStop, AFirstSignalSetsTheFlagTheTrainerWatches) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop");
  const std::atomic<int>* stop = train::install_stop_handlers(dir, "test");
  EXPECT_EQ(stop->load(), 0);
  EXPECT_EQ(train::stop_signal(), 0);
  std::raise(SIGTERM);  // the first: finish the step (the second would _exit)
  EXPECT_EQ(stop->load(), SIGTERM);
  EXPECT_STREQ(train::stop_signal_name(train::stop_signal()), "SIGTERM");
}

// Once the run is over, a first signal is recorded without announcing a checkpoint: under
// mpirun, a rank leaving with its own error (a peer refused its arguments) was SIGTERMed by
// mpirun ending the job and said "finishing the current step and writing a checkpoint" (ctest
// Mpi.DittoTrainRankRefusesItsArguments_checkpoint failed now and then on that line).
TEST(GracefulStop, ASignalAfterTheRunIsOverSetsTheFlagWithoutAnnouncingACheckpoint) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_over");
  const std::atomic<int>* stop = train::install_stop_handlers(dir, "test");
  const int before = stop->load();  // 0: install_stop_handlers clears the flag
  train::disarm_stop_handlers();
  testing::internal::CaptureStderr();
  if (before == 0) std::raise(SIGTERM);  // a first signal (a second would _exit)
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "");
  if (before == 0) {
    EXPECT_EQ(stop->load(), SIGTERM);
  }
  // Armed again by the next install: a first signal announces the checkpoint again (checked by
  // AFirstSignalSetsTheFlagTheTrainerWatches when it runs first).
}

// After the last step (the final checkpoint written; ditto-train draws the sample and writes the
// exports), a first Ctrl-C promises no checkpoint and a second one does not say that one was not
// written (tester4: "finishing the current step and writing a checkpoint", then "the stop
// checkpoint was not written" although the final one was complete). In a child process: the
// second signal _exits.
TEST(GracefulStop, SignalsAfterTrainingPromiseNoCheckpoint) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_after_training");
  std::ofstream(dir + "/latest") << "step-00000010\n";
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");  // (snprintf: in the parent, before the fork)
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only async-signal-safe calls: the parent may have threads
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(3);
    train::stop_handlers_training_over();
    std::raise(SIGINT);  // the first: no step to finish, nothing to write
    std::raise(SIGINT);  // the second: _exit(130)
    ::_exit(4);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  EXPECT_EQ(io::read_file(err_path),
            "test: SIGINT received after training: no step left to finish, no checkpoint to write "
            "(newest on disk: " +
                dir +
                "/step-00000010); finishing the output (final line, sample, exports), then "
                "exiting as usual (send it again to exit at once)\n"
                "test: second SIGINT: exiting at once; training was over; newest checkpoint on "
                "disk: " +
                dir + "/step-00000010\n");
}

// Runs `body` in a child process whose stderr goes to `err_path` (only async-signal-safe calls
// in it: the parent may have threads); returns its exit status (-1 when it did not exit).
template <typename Body>
int stderr_of_child(const std::string& err_path, const Body& body) {
  const pid_t child = ::fork();
  if (child < 0) return -2;
  if (child == 0) {
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) ::_exit(3);
    body();
    ::_exit(4);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Two `sig`s in a child process (the first handled, the second _exits): expects exit status
// 128 + sig and returns the child's stderr.
std::string two_signals_in_child(const std::string& err_path, int sig) {
  EXPECT_EQ(stderr_of_child(err_path,
                            [sig] {
                              std::raise(sig);
                              std::raise(sig);
                            }),
            128 + sig)
      << train::stop_signal_name(sig);
  return io::read_file(err_path);
}

// A first signal once no stop can come (the last step began: stop_handlers_last_step, which the
// Trainer's on_last_step calls) says that the run completes as usual, with no stop checkpoint; a
// second that the exit leaves the run incomplete. Before, they said "finishing the current step
// and writing a checkpoint" and "the stop checkpoint was not written", though none was due
// (a stop during the last step lets the run complete).
TEST(GracefulStop, SignalsDuringTheLastStepPromiseTheCompleteRunNotAStopCheckpoint) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_last_step");
  std::ofstream(dir + "/latest") << "step-00000004\n";
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");
  EXPECT_EQ(stderr_of_child(err_path,
                            [] {
                              train::stop_handlers_last_step();
                              std::raise(SIGINT);  // the first: the run completes
                              std::raise(SIGINT);  // the second: _exit(130)
                            }),
            128 + SIGINT);
  EXPECT_EQ(io::read_file(err_path),
            "test: SIGINT received with no step left to stop before: no stop checkpoint; "
            "completing the run as usual (final evaluation, checkpoint, line, sample, exports), "
            "then exiting as usual (send it again to exit at once)\n"
            "test: second SIGINT: exiting at once, before the run completed; newest checkpoint "
            "on disk: " +
                dir + "/step-00000004\n");
}

// A first signal that came before the last step began, but too late to stop the run (before
// training in a run of one step, as ditto_train_stop.sh sends it; or just after the Trainer's
// last check), promised a stop checkpoint: stop_handlers_last_step takes the promise back at once.
TEST(GracefulStop, APromiseOfAStopCheckpointTooLateToKeepIsTakenBack) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_taken_back");
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");
  EXPECT_EQ(stderr_of_child(err_path,
                            [] {
                              std::raise(SIGTERM);  // the first: promises a stop checkpoint
                              train::stop_handlers_last_step();  // takes it back
                              train::stop_handlers_last_step();  // (once)
                              std::raise(SIGTERM);               // the second: _exit(143)
                            }),
            128 + SIGTERM);
  EXPECT_EQ(io::read_file(err_path),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n"
            "test: SIGTERM: no step is left to stop before (the next is the run's last), so no "
            "stop checkpoint after all; completing the run as usual (final evaluation, "
            "checkpoint, line, sample, exports), then exiting as usual (send it again to exit at "
            "once)\n"
            "test: second SIGTERM: exiting at once, before the run completed; newest checkpoint "
            "on disk: none\n");
}

// The plain case keeps its words: a stop announced during a step, then a second signal.
TEST(GracefulStop, ASecondSignalDuringAStopSaysTheStopCheckpointWasNotWritten) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_second");
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");
  EXPECT_EQ(two_signals_in_child(err_path, SIGTERM),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n"
            "test: second SIGTERM: exiting at once; the stop checkpoint was not written; newest "
            "checkpoint on disk: none\n");
}

// A second signal after the stop checkpoint was written (the stopped run finishing: fit()
// returning, ditto-train's "stopped" line, a --trace) said "the stop checkpoint was not written"
// although DIR/latest named it. stop_handlers_stop_checkpoint_written (which the Trainer's
// on_stop_checkpoint calls as the save returns) makes it say that it was, naming it; a first
// signal after it (under mpirun, a process another's signal stopped) promises nothing. The
// first signal and the save are in this process, in order; the second in a child (it _exits).
TEST(GracefulStop, ASecondSignalAfterTheStopCheckpointWasWrittenSaysSo) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_written");
  std::ofstream(dir + "/latest") << "step-00000003\n";
  const std::string err_path = dir + "/stderr";
  const std::atomic<int>* stop = train::install_stop_handlers(dir, "test");
  testing::internal::CaptureStderr();
  std::raise(SIGTERM);  // the first: promises the stop checkpoint
  train::stop_handlers_stop_checkpoint_written(dir + "/step-00000003");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n");
  EXPECT_EQ(stop->load(), SIGTERM);
  EXPECT_EQ(stderr_of_child(err_path, [] { std::raise(SIGTERM); }), 128 + SIGTERM);
  EXPECT_EQ(io::read_file(err_path),
            "test: second SIGTERM: exiting at once; the stop checkpoint was written: " + dir +
                "/step-00000003; newest checkpoint on disk: " + dir + "/step-00000003\n");
  // Still so once the run is over (disarmed on the way out).
  EXPECT_EQ(stderr_of_child(err_path,
                            [] {
                              train::disarm_stop_handlers();
                              std::raise(SIGINT);
                            }),
            128 + SIGINT);
  EXPECT_EQ(io::read_file(err_path),
            "test: second SIGINT: exiting at once; the stop checkpoint was written: " + dir +
                "/step-00000003; newest checkpoint on disk: " + dir + "/step-00000003\n");
  // Under mpirun a process stops when another got the signal: its first signal comes after the
  // stop checkpoint, and promises none.
  train::install_stop_handlers(dir, "test");
  train::stop_handlers_stop_checkpoint_written(dir + "/step-00000003");
  EXPECT_EQ(two_signals_in_child(err_path, SIGINT),
            "test: SIGINT received after the stop checkpoint was written (" + dir +
                "/step-00000003): nothing left to finish or write; exiting as usual (send it "
                "again to exit at once)\n"
                "test: second SIGINT: exiting at once; the stop checkpoint was written: " +
                dir + "/step-00000003; newest checkpoint on disk: " + dir + "/step-00000003\n");
  train::install_stop_handlers(dir, "test");  // the next test's state: a new run
}

// Under mpirun only rank 0 saves the stop checkpoint, so only its process learned that it was
// written (stop_handlers_stop_checkpoint_written): a second signal to the other ranks, with
// DIR/latest naming the checkpoint rank 0 had written, said "the stop checkpoint was not
// written". Every process now learns the stop's step as the run stops (TrainerCallbacks::on_stop
// -> stop_handlers_stop_due) and its handler reads DIR/latest: "not written" before rank 0's save
// lands, "written: DIR/step-N" after. A process another's signal stopped promises nothing.
TEST(GracefulStop, UnderMpirunTheOtherRanksSayWhetherRankZeroWroteTheStopCheckpoint) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_due");
  std::ofstream(dir + "/latest") << "step-00000002\n";  // an older checkpoint
  const std::string err_path = dir + "/stderr";
  // Stopped by another process's signal; rank 0's save has not landed yet.
  train::install_stop_handlers(dir, "test");
  train::stop_handlers_stop_due(3);
  train::stop_handlers_stop_due(9);  // (once per run)
  EXPECT_EQ(two_signals_in_child(err_path, SIGTERM),
            "test: SIGTERM received while the stop checkpoint is written (" + dir +
                "/step-00000003): no step left to finish; exiting as usual (send it again to "
                "exit at once)\n"
                "test: second SIGTERM: exiting at once; the stop checkpoint was not written; "
                "newest checkpoint on disk: " +
                dir + "/step-00000002\n");
  // This process's own signal announced the stop; rank 0 (another process) then wrote it.
  const std::atomic<int>* stop = train::install_stop_handlers(dir, "test");
  testing::internal::CaptureStderr();
  std::raise(SIGTERM);
  train::stop_handlers_stop_due(3);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n");
  EXPECT_EQ(stop->load(), SIGTERM);
  std::ofstream(dir + "/latest") << "step-00000003\n";  // rank 0's save landed
  EXPECT_EQ(stderr_of_child(err_path, [] { std::raise(SIGINT); }), 128 + SIGINT);
  EXPECT_EQ(io::read_file(err_path),
            "test: second SIGINT: exiting at once; the stop checkpoint was written: " + dir +
                "/step-00000003; newest checkpoint on disk: " + dir + "/step-00000003\n");
  // Another process's signal stopped this one, and rank 0's save has landed: as after
  // stop_handlers_stop_checkpoint_written.
  const auto save_latest = [&](const char* name) {  // as a save does: a new file renamed in
    std::ofstream(dir + "/latest.new") << name << "\n";
    ASSERT_EQ(std::rename((dir + "/latest.new").c_str(), (dir + "/latest").c_str()), 0);
  };
  save_latest("step-00000002");
  train::install_stop_handlers(dir, "test");
  train::stop_handlers_stop_due(3);
  save_latest("step-00000003");
  EXPECT_EQ(two_signals_in_child(err_path, SIGINT),
            "test: SIGINT received after the stop checkpoint was written (" + dir +
                "/step-00000003): nothing left to finish or write; exiting as usual (send it "
                "again to exit at once)\n"
                "test: second SIGINT: exiting at once; the stop checkpoint was written: " +
                dir + "/step-00000003; newest checkpoint on disk: " + dir + "/step-00000003\n");
  // A latest that only starts with the name is another checkpoint.
  std::ofstream(dir + "/latest") << "step-000000031\n";
  EXPECT_EQ(stderr_of_child(err_path, [] { std::raise(SIGINT); }), 4);  // (the body's end)
  EXPECT_EQ(io::read_file(err_path),
            "test: SIGINT received while the stop checkpoint is written (" + dir +
                "/step-00000003): no step left to finish; exiting as "
                "usual (send it again to exit at once)\n");
  // A latest that named the step already when the run stopped is an older run's (review: a run
  // resumed from DIR/step-1 into DIR, over a run that had gone to step 3), until a save replaces
  // it; unless the step's own periodic checkpoint, saved before the stop, is the stop's.
  const std::string not_written = "test: second SIGTERM: exiting at once; the stop checkpoint was "
                                  "not written; newest checkpoint on disk: " +
                                  dir + "/step-00000003\n";
  const std::string written = "test: second SIGTERM: exiting at once; the stop checkpoint was "
                              "written: " +
                              dir + "/step-00000003; newest checkpoint on disk: " + dir +
                              "/step-00000003\n";
  const auto second_signal = [&] {
    const std::string err = two_signals_in_child(err_path, SIGTERM);
    return err.substr(err.find('\n') + 1);
  };
  save_latest("step-00000003");  // the older run's
  train::install_stop_handlers(dir, "test");
  train::stop_handlers_stop_due(3);
  EXPECT_EQ(second_signal(), not_written);
  save_latest("step-00000003");  // this run's save
  EXPECT_EQ(second_signal(), written);
  train::install_stop_handlers(dir, "test");
  train::stop_handlers_stop_due(3, true);  // saved just before the stop
  EXPECT_EQ(second_signal(), written);
  train::install_stop_handlers(dir, "test");  // the next test's state: a new run
}

// A FIFO at DIR/latest (or anything whose open waits for a peer): the handler's open blocked
// until a writer came, so the second signal, meant to exit at once, hung the process for good
// (tester: only SIGKILL ended it). It now reads nothing there: "none". The child's alarm turns a
// hang into a failure.
TEST(GracefulStop, ASecondSignalWithAFifoAtLatestStillExitsAtOnce) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_fifo");
  ASSERT_EQ(::mkfifo((dir + "/latest").c_str(), 0644), 0);
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");
  EXPECT_EQ(stderr_of_child(err_path,
                            [] {
                              ::alarm(20);
                              std::raise(SIGTERM);
                              std::raise(SIGTERM);
                            }),
            128 + SIGTERM);
  EXPECT_EQ(io::read_file(err_path),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n"
            "test: second SIGTERM: exiting at once; the stop checkpoint was not written; newest "
            "checkpoint on disk: none\n");
  train::install_stop_handlers(dir, "test");  // the next test's state: a new run
}

// Under mpirun, Ctrl-C (mpirun's SIGINT) and a SIGTERM to mpirun reach the ranks as SIGTERM and
// are followed about a second later by SIGKILL (Open MPI's odls_base_sigkill_timeout): a large
// model's stop checkpoint was cut short (tester: a half-written step-N.tmp, no "stopped" line).
// mpirun forwards SIGUSR1 and lets the ranks finish, as does Slurm's --signal=B:USR1@N: it stops
// the run as SIGTERM does (exit 138), and under mpirun a first SIGINT / SIGTERM says to use it.
TEST(GracefulStop, SigusrOneStopsTheRunAndUnderMpirunTheMessageNamesIt) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_usr1");
  const std::string err_path = dir + "/stderr";
  const std::atomic<int>* stop = train::install_stop_handlers(dir, "test", true);
  testing::internal::CaptureStderr();
  std::raise(SIGUSR1);  // the first: finish the step (the second would _exit)
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n");
  EXPECT_EQ(stop->load(), SIGUSR1);
  EXPECT_STREQ(train::stop_signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(train::format_stopped("test", SIGUSR1, 7, dir),
            "test: stopped by SIGUSR1 after step 7: checkpoint " + dir +
                "/step-00000007 written; resume with --resume " + dir + "\n");
  EXPECT_EQ(stderr_of_child(err_path, [] { std::raise(SIGUSR1); }), 128 + SIGUSR1);
  EXPECT_EQ(io::read_file(err_path),
            "test: second SIGUSR1: exiting at once; the stop checkpoint was not written; newest "
            "checkpoint on disk: none\n");
  // Under mpirun, a SIGTERM's message says how to stop without mpirun's SIGKILL.
  train::install_stop_handlers(dir, "test", true);
  testing::internal::CaptureStderr();
  std::raise(SIGTERM);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once); under mpirun, whose Ctrl-C or SIGTERM kills the ranks about "
            "1 s later, stop a run with `kill -USR1 <mpirun's pid>` instead, which mpirun "
            "forwards to every rank\n");
  // Not outside mpirun.
  train::install_stop_handlers(dir, "test");
  testing::internal::CaptureStderr();
  std::raise(SIGTERM);
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "test: signal received: finishing the current step and writing a checkpoint (send it "
            "again to exit at once)\n");
  train::install_stop_handlers(dir, "test");  // the next test's state: a new run
}

// --resume A --checkpoint B: with no checkpoint in B yet, a signal's "newest checkpoint on disk"
// said "none", though A's, the one the run resumed from, was intact (tester). It names A's now:
// what A/latest names, or the one --resume named (A/step-N); B's own once it has one.
TEST(GracefulStop, NewestOnDiskNamesTheResumeDirectorysCheckpointWhileTheRunsHasNone) {
  const SavedStopSignals saved;
  const std::string a = fresh_dir("stop_resume_a"), b = fresh_dir("stop_resume_b");
  std::ofstream(a + "/latest") << "step-00000005\n";
  const std::string err_path = b + "/stderr";
  const std::string second = "test: second SIGTERM: exiting at once; the stop checkpoint was not "
                             "written; newest checkpoint on disk: ";
  const auto newest_after_two_signals = [&] {
    const std::string err = two_signals_in_child(err_path, SIGTERM);
    const std::size_t at = err.find(second);
    return at == std::string::npos ? err : err.substr(at + second.size());
  };
  train::install_stop_handlers(b, "test", false, a + "/");
  EXPECT_EQ(newest_after_two_signals(), a + "/step-00000005 (in the --resume directory)\n");
  fs::create_directories(a + "/step-00000003");  // a checkpoint: it holds trainer.json
  std::ofstream(a + "/step-00000003/trainer.json") << "{}\n";
  train::install_stop_handlers(b, "test", false, a + "/step-00000003");
  EXPECT_EQ(newest_after_two_signals(), a + "/step-00000003 (the --resume checkpoint)\n");
  std::ofstream(b + "/latest") << "step-00000007\n";  // the run's own
  EXPECT_EQ(newest_after_two_signals(), b + "/step-00000007\n");
  train::install_stop_handlers(a, "test", false, a);  // --resume DIR --checkpoint DIR: DIR's
  EXPECT_EQ(newest_after_two_signals(), a + "/step-00000005\n");
  train::install_stop_handlers(b, "test");  // the next test's state: a new run
}

// The stopped line's resume command is for a shell: a directory with a space or a quote was
// printed as it is, so that pasting it resumed from another directory (tester).
TEST(GracefulStop, TheStoppedLinesResumeCommandQuotesTheDirectoryForAShell) {
  EXPECT_EQ(train::format_stopped("p", SIGTERM, 3, "runs/a b"),
            "p: stopped by SIGTERM after step 3: checkpoint runs/a b/step-00000003 written; "
            "resume with --resume 'runs/a b'\n");
  EXPECT_EQ(train::format_stopped("p", SIGINT, 3, "it's"),
            "p: stopped by SIGINT after step 3: checkpoint it's/step-00000003 written; resume "
            "with --resume 'it'\\''s'\n");
  EXPECT_EQ(train::format_stopped("p", SIGINT, 3, "/tmp/run-1.x@y"),
            "p: stopped by SIGINT after step 3: checkpoint /tmp/run-1.x@y/step-00000003 written; "
            "resume with --resume /tmp/run-1.x@y\n");
}

// Once the run is over (it failed: disarm_stop_handlers without stop_handlers_training_over), a
// first signal is silent and promises nothing, so a second does not say that a stop checkpoint
// was not written (it did, under mpirun ending a failed job: a SIGTERM, then another).
TEST(GracefulStop, ASecondSignalAfterAFailedRunSaysTheRunWasOver) {
  const SavedStopSignals saved;
  const std::string dir = fresh_dir("stop_failed_run");
  std::ofstream(dir + "/latest") << "step-00000002\n";
  const std::string err_path = dir + "/stderr";
  train::install_stop_handlers(dir, "test");
  EXPECT_EQ(stderr_of_child(err_path,
                            [] {
                              train::disarm_stop_handlers();
                              std::raise(SIGTERM);  // recorded without a word
                              std::raise(SIGTERM);  // _exit(143)
                            }),
            128 + SIGTERM);
  EXPECT_EQ(io::read_file(err_path),
            "test: second SIGTERM: exiting at once; the run was over; newest checkpoint on disk: " +
                dir + "/step-00000002\n");
}

TEST(GptRecipe, ConfiguresNanoGptsRunAndNamesFieldsAsTheCallerDoes) {
  train::GptSettings g;
  g.data = DITTO_SHAKESPEARE_TXT;
  train::TrainerConfig c;
  train::GptRun run = train::configure_gpt(g, c);
  ASSERT_TRUE(run.text);
  EXPECT_EQ(c.batch_size, 12);
  EXPECT_EQ(c.max_iters, 2000);
  EXPECT_EQ(c.optimizer, "adamw");
  EXPECT_FLOAT_EQ(*c.lr, 1e-3f);
  EXPECT_EQ(run.model.n_layer, 4);
  EXPECT_EQ(run.model.vocab_size, run.text->vocab_size());
  EXPECT_EQ(c.model_name, "gpt(n_layer=4,n_head=4,n_embd=128,block_size=64,vocab_size=" +
                              std::to_string(run.text->vocab_size()) + ",bias=False,dropout=0)");
  // A field given explicitly keeps the config's value; the names are the caller's.
  train::GptSettings bad;
  bad.data = DITTO_SHAKESPEARE_TXT;
  bad.n_embd = 130;
  bad.field_names = {{"n_embd", "--n-embd"}, {"n_head", "--n-head"}};
  train::TrainerConfig c2;
  expect_invalid([&] { train::configure_gpt(bad, c2); },
                 "--n-embd: expected a multiple of --n-head = 4, got 130");
  bad.field_names.clear();
  expect_invalid([&] { train::configure_gpt(bad, c2); },
                 "GptSettings::n_embd: expected a multiple of GptSettings::n_head = 4, got 130");
}

// Issue 29 (4): nanoGPT's init_from values were read as file names ("cannot open 'resume'").
TEST(GptRecipe, NanoGptsInitFromValuesSayWhatToUseInstead) {
  const std::map<std::string, std::string> instead = {
      {"resume", "to resume a run, give its checkpoint directory to --resume DIR"},
      {"scratch", "to start from scratch, leave --init-from out (the default)"},
      {"gpt2", "to start from gpt2's weights, give a file of them: an llm.c model file"},
      {"gpt2-xl", "to start from gpt2-xl's weights, give a file of them"}};
  for (const auto& [value, says] : instead) {
    train::GptSettings g;
    g.data = DITTO_SHAKESPEARE_TXT;
    g.init_from = value;
    g.given.insert("init_from");
    g.field_names = {{"init_from", "--init-from"}};
    train::TrainerConfig c;
    c.field_names = {{"resume_dir", "--resume"}};
    const std::string got = test::expect_error<InvalidArgument>(
        [&] { train::configure_gpt(g, c); },
        "--init-from: expected a model file or a checkpoint directory, got '" + value +
            "' (nanoGPT's init_from value, not a file here): " + says);
    EXPECT_EQ(got.find("cannot open"), std::string::npos) << got;
  }
}

TEST(GptRecipe, ADryRunWithAPresetNeedsNoDataAndTakesAFewSteps) {
  train::GptSettings g;
  g.preset = "gpt2";
  train::TrainerConfig c;
  c.dry_run = true;
  train::GptRun run = train::configure_gpt(g, c);
  EXPECT_FALSE(run.text);
  EXPECT_FALSE(run.tokens);
  EXPECT_EQ(run.model.vocab_size, 50304);
  EXPECT_EQ(run.model.n_layer, 12);
  EXPECT_EQ(c.max_iters, 2);
  EXPECT_EQ(c.eval_iters, 0);
  EXPECT_EQ(g.sample, 0);
  EXPECT_EQ(run.source->num_outputs(), 50304);
}

// n_layer was capped at 85 (the dropout sites' 8 bits): GPT-3's 96 blocks are accepted with and
// without dropout; with dropout the blocks stop at 21845 and the steps at 2^32 past 85 blocks.
TEST(GptRecipe, DeepModelsAreAcceptedAndTheirDropoutStepsBounded) {
  const auto settings = [](std::int64_t layers, double dropout) {
    train::GptSettings g;
    g.n_layer = layers, g.n_head = 2, g.n_embd = 8, g.block_size = 8, g.vocab_size = 11;
    g.dropout = dropout;
    g.given = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size", "dropout"};
    g.field_names = {
        {"n_layer", "--n-layer"}, {"dropout", "--dropout"}, {"max_iters", "--max-iters"}};
    return g;
  };
  for (double p : {0.0, 0.1}) {
    train::GptSettings g = settings(96, p);
    train::TrainerConfig c;
    c.dry_run = true;
    const train::GptRun run = train::configure_gpt(g, c);
    EXPECT_EQ(run.model.n_layer, 96) << "dropout " << p;
    EXPECT_FLOAT_EQ(run.model.dropout, static_cast<float>(p));
  }
  const auto configure = [](train::GptSettings g) {
    train::TrainerConfig c;
    c.dry_run = true;
    return train::configure_gpt(g, c).model.n_layer;
  };
  expect_invalid([&] { configure(settings(21846, 0.1)); },
                 "--n-layer: expected at most 21845 with --dropout > 0 (each block's dropout "
                 "sites must fit in the 16 bits of Note [Dropout masks]), got 21846");
  EXPECT_EQ(configure(settings(21846, 0.0)), 21846);
  expect_invalid([&] { configure(settings(std::int64_t(1) << 46, 0.0)); },
                 "--n-layer: expected 1..2^46 - 1 (the init streams' layer ids fit in 48 bits), "
                 "got 70368744177664");
  train::GptSettings far = settings(86, 0.1);
  far.max_iters = (std::int64_t(1) << 32) + 1;
  far.given.insert("max_iters");
  expect_invalid([&] { configure(far); },
                 "--max-iters: expected at most 2^32 with --dropout > 0 and --n-layer = 86 (the "
                 "dropout masks' steps, Note [Dropout masks]), got 4294967297");
  far.max_iters = std::int64_t(1) << 32;
  EXPECT_EQ(configure(far), 86);
  far.n_layer = 85, far.max_iters = (std::int64_t(1) << 32) + 1;
  EXPECT_EQ(configure(far), 85);
  far.max_iters = (std::int64_t(1) << 40) + 1;
  expect_invalid([&] { configure(far); }, "--max-iters: expected at most 2^40 with --dropout > 0");
  far.dropout = 0.0;
  EXPECT_EQ(configure(far), 85);
}

}  // namespace
}  // namespace ditto
