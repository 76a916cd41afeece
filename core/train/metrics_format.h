// What a Trainer reports, as the lines ditto-train prints (core/train/metrics.h's structs as
// text): nanoGPT's progress line, the epoch and evaluation lines, the final line with the
// parameter checksum, the cost model's prediction and each device's memory. Each function
// returns its lines, each ending in '\n' ("" when there is nothing to say).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/data/data_source.h"
#include "core/runtime/dtype.h"
#include "core/train/metrics.h"
#include "core/train/trainer.h"

namespace ditto::train {

/// printf's text as a std::string (the report lines' formatting).
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

/// "12.34 MiB".
std::string format_mib(std::size_t bytes);
/// "12.34 MiB" below 1 GiB, else "3.45 GiB": a memory figure in a unit that shows it (a small
/// model's peak in GiB read "0.00 GiB").
std::string format_size(std::size_t bytes);

/// The run as it starts, after `prog`: ddp's "trainer=ddp backend=... ranks=N (threads|processes)
/// ... bucket_cap_mb=..." or the MLP's "backend=... devices=... model=... params=... data=...
/// rows=... (train N, val M) batch=... epochs=... loss=... optimizer=... lr=... momentum=...
/// seed=...", `data` the data's name and `rows` its CSV (null: no rows figures); then, with
/// gradient accumulation, "PROG: grad_accum_steps=K (micro-steps per optimizer step of batch B)".
std::string format_start(const std::string& prog, const RunInfo& r, const TrainerConfig& c,
                         const std::string& data, const CsvDataSource* rows);

/// "PROG: grad_accum_steps=K (...)" when c.grad_accum_steps > 1, else "".
std::string format_grad_accum(const std::string& prog, const TrainerConfig& c);

/// "PROG: resumed from DIR at step N" and in epoch mode " (epoch E, batch B)".
std::string format_resume(const std::string& prog, const std::string& dir, const TrainerState& ts,
                          bool iteration_mode);

/// "PROG: stopped by SIGTERM after step N: checkpoint DIR/step-0000000N written; resume with
/// --resume DIR" (Note [Graceful stop]).
std::string format_stopped(const std::string& prog, int sig, std::int64_t steps,
                           const std::string& checkpoint_dir);

/// The predicted step's kernels by kind on device 0 (format_step_kernels) under a title naming
/// the run's determinism, dtype and the steps metered.
std::string format_predicted_kernels(const CostPrediction& p, Determinism determinism, DType dtype);

/// nanoGPT's progress line, "iter N: loss L, time Tms, mfu M%" (train.py's format; its iter_num
/// is the step just taken, 0-based): the mfu only when set (m.mfu: a cost model profile), then in
/// parentheses the MLP's position in its epoch ("epoch E, batch B of N") and the step's predicted
/// time on `profile` (the device profile's name) with the peak the mfu is of (m.peak_name, or
/// when unset `dtype`'s: FP32 for f32, BF16 for bf16, FP16 for f16).
std::string format_step(const StepMetrics& m, const std::string& profile, DType dtype);

/// "epoch   E  train_loss=... val_loss=... val_acc=... samples/s=...", or in a dry run the
/// epoch's predicted time and samples/s.
std::string format_epoch(const EpochMetrics& m);

/// nanoGPT's evaluation line "step N: train loss X, val loss Y (lr L, T tokens/s, ETA h:mm:ss)"
/// (tokens/s and ETA after step 0 only); a dry run's (EvalMetrics::dry_run) has no losses or
/// speed: "step N: no losses (dry run: nothing ran; lr L)".
std::string format_eval(const EvalMetrics& m);

/// "final: backend=... devices=... determinism=... [dtype=...] [trainer=ddp] epochs=E|iters=N
/// [train_loss=...] [val_loss=...] [val_acc=...] train_time_s=... [params_checksum=...]", only
/// what the run measured (FitResult::has_train_loss, has_eval; no losses or checksum of a dry
/// run); `tokens_per_sample` > 0 (a GPT's block size): iteration mode, no val_acc. Then f16's
/// "grad_scaler: scale=S skipped_steps=N" line when the run had a loss scaler.
std::string format_final(const FitResult& r, std::int64_t tokens_per_sample = 0);

/// The cost model's prediction, "predicted: D x DEVICE (N nodes, LINK) step_time=... samples/s=...
/// [tokens/s=...] comm_share=...% mfu=..." and, unless `dry_run` (nothing ran), the wall clock's
/// "measured:  CPU simulator step_time=..." line; a real run's prediction (not `dry_run`) says it
/// priced "the simulator's own kernels: --dry-run prices a GPU's" (the CUDA backend's kernels,
/// docs/prediction.md). `dtype`: the run's (which peak the mfu is of);
/// `tokens_per_sample` > 0: tokens/s too, and no mfu (a GPT's is nanoGPT's estimate, printed
/// on its own line: gpt_recipe.h's format_gpt_prediction).
std::string format_prediction(const CostPrediction& p, DType dtype, bool dry_run,
                              std::int64_t tokens_per_sample = 0);

/// "memory: DEVICE live=... peak=... capacity=... optimizer_state=..." for each device.
std::string format_memory(const std::vector<DeviceMemory>& memory);

/// How a command line prints a run (ditto-train's): each report's lines on stdout as they come
/// (flushed, one write each) and, with a JSON-lines file, the same reports as JSON lines
/// (JsonLinesWriter), opened when the run starts (after every check, so a refused run leaves the
/// file untouched). What fails after training (a JSON line, a sample, a trace) must not lose the
/// run's result: it is kept in late_errors and reported after the result (finish).
class RunPrinter {
 public:
  /// `jsonl`: the JSON-lines file ("": none), its errors prefixed "`jsonl_name`: "; `profile`
  /// and `dtype`: format_step's.
  /// `append`: the run resumes (--resume), so the file continues its first part's records
  /// instead of starting over (a resume's record first: resumed).
  RunPrinter(std::string jsonl, std::string jsonl_name, std::string profile, DType dtype,
             bool append = false);
  ~RunPrinter();
  RunPrinter(const RunPrinter&) = delete;
  RunPrinter& operator=(const RunPrinter&) = delete;

  /// Sets cb.on_start (opens the JSON-lines file, then prints `start`'s lines), on_epoch, on_eval
  /// and on_step (format_epoch / format_eval / format_step, and their JSON lines): rank 0's, as
  /// every callback. The printer must outlive fit().
  void install(TrainerCallbacks& cb, std::function<std::string(const RunInfo&)> start);
  /// `lines` on stdout, flushed.
  static void out(const std::string& lines);
  /// The run's final JSON record (when the file is open); a failure is a late error.
  void write_result(const FitResult& r);
  /// The resume's record (TrainerCallbacks::on_resume: checkpoint directory `from`, step
  /// `step`), written as the file opens when on_start has not opened it yet.
  void resumed(const std::string& from, std::int64_t step);
  /// A stopped run's last record (signal name, its step, its checkpoint or ""); a failure is a
  /// late error.
  void write_stopped(const std::string& signal, std::int64_t step, const std::string& checkpoint);
  /// The errors after training, "WHAT: why" each.
  std::vector<std::string> late_errors;
  /// Flushes stdout, prints each late error on stderr ("PROG: error: after training (the result
  /// above is complete): E"); returns the exit status, 0 when there were none, else 1.
  int finish(const std::string& prog);

 private:
  std::string jsonl_, jsonl_name_, profile_;
  DType dtype_;
  bool append_ = false;
  std::unique_ptr<JsonLinesWriter> writer_;
  std::optional<std::pair<std::string, std::int64_t>> resume_;  // before the file opened
};

}  // namespace ditto::train
