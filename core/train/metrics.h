// What a Trainer reports: the run as it starts (RunInfo), each epoch (EpochMetrics), and the end
// (FitResult: losses, accuracy, the parameter checksum, the cost model's prediction, memory per
// device). JsonLinesWriter writes them as JSON lines (one object per line, "event" naming which).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/runtime/backend.h"
#include "core/runtime/extensions.h"
#include "core/train/trainer_config.h"

namespace ditto::train {

struct Evaluation {
  double loss = 0;      ///< mean loss per row
  double accuracy = 0;  ///< fraction of rows whose largest output is the label
};

/// The run as fit() starts it.
struct RunInfo {
  std::string backend;
  int devices = 0;  ///< devices (dp) or ranks (ddp)
  Determinism determinism = Determinism::bitwise;
  TrainerKind trainer = TrainerKind::dp;
  bool processes = false;   ///< ddp ranks are MPI processes (else threads)
  std::string model;        ///< model name ("64-128-10")
  std::int64_t params = 0;  ///< parameters of the model (dp; 0 for ddp, reported before build)
  float lr = 0;
};

/// One epoch, after its evaluation.
struct EpochMetrics {
  int epoch = 0;          ///< 1-based
  std::int64_t step = 0;  ///< optimizer steps so far, over the whole run
  double train_loss = 0;  ///< mean training loss over the epoch's rows
  double val_loss = 0, val_acc = 0;
  std::int64_t samples = 0;  ///< rows trained on this epoch
  double epoch_time_s = 0;   ///< wall clock of the epoch's training (evaluation excluded)
  double samples_per_s = 0;
  /// A dry run's epoch (TrainerConfig::dry_run): nothing ran, so train_loss, val_loss, val_acc,
  /// epoch_time_s and samples_per_s mean nothing (0); only the predicted_* fields are set.
  bool dry_run = false;
  /// The epoch's training in the cost model's virtual time (--profile; 0 without a cost model),
  /// and samples / that time.
  double predicted_time_s = 0, predicted_samples_per_s = 0;
};

/// One evaluation of iteration mode (TrainerConfig::max_iters; nanoGPT's "step N: train loss X,
/// val loss Y"), with the training speed since the previous one.
struct EvalMetrics {
  std::int64_t step = 0;  ///< optimizer steps so far (0: before the first)
  std::int64_t max_iters = 0;
  double train_loss = 0, val_loss = 0;  ///< mean loss over eval_iters fixed batches of each split
  double lr = 0;               ///< learning rate of the last step taken (of step 0 at step 0)
  std::int64_t tokens = 0;     ///< targets trained on since the previous evaluation (B x T a step)
  double interval_time_s = 0;  ///< wall clock of that training (evaluations excluded)
  double tokens_per_s = 0;     ///< tokens / interval_time_s (0 at step 0)
  double elapsed_s = 0;        ///< this run's training wall clock so far
  double eta_s = 0;            ///< remaining steps x this run's mean step time so far
  /// A dry run's evaluation (TrainerConfig::dry_run): nothing ran, so the losses and the wall-
  /// clock fields (interval_time_s, tokens_per_s, elapsed_s, eta_s) mean nothing and are neither
  /// printed nor written (format_eval, JsonLinesWriter); step, max_iters, lr and tokens are set.
  bool dry_run = false;
  /// An eval_only run's one evaluation (TrainerConfig::eval_only): no step was or will be taken,
  /// so lr means nothing and is neither printed nor written (nanoGPT's eval_only prints "step N:
  /// train loss X, val loss Y" alone).
  bool eval_only = false;
};

/// One optimizer step's progress, reported every TrainerConfig::log_interval steps by rank 0
/// (TrainerCallbacks::on_step; nanoGPT's "iter N: loss L, time T ms, mfu M%"). Not reported in a
/// dry run (nothing ran).
struct StepMetrics {
  std::int64_t iter = 0;   ///< the step just taken, 0-based over the whole run (nanoGPT's iter_num)
  int epoch = 0;           ///< epoch mode: the epoch (1-based); iteration mode: 0
  std::int64_t batch = 0;  ///< epoch mode: the batch of the epoch (0-based)
  std::int64_t batches = 0;  ///< epoch mode: the epoch's batches
  /// The step's mean training loss over rank 0's rows: dp the whole batch; ddp rank 0's own rows
  /// (nanoGPT logs its master process's loss.item() too: no collective is added for it).
  double loss = 0;
  std::int64_t samples = 0;  ///< rows of the global batch
  std::int64_t tokens = 0;   ///< targets of the global batch (B x T for a GPT; B for the MLP)
  double time_s = 0;         ///< wall clock of the step (nanoGPT's dt)
  /// When an extension predicts (TrainerExtension::predicts; sim::SimRunOptions::profile): the
  /// step's virtual time on the profiled GPUs and their peak FLOP/s per device for the run's
  /// dtype (mfu_peak: what the matrix products are priced at); 0 otherwise.
  double predicted_time_s = 0, peak_flops = 0;
  /// peak_flops's unit (MfuPeak::name: "BF16", "FP16", "TF32", "FP32"); null: the dtype's own.
  const char* peak_name = nullptr;
  /// Model FLOPs utilisation as nanoGPT's estimate_mfu: TrainerConfig::flops_per_sample x samples
  /// / (predicted_time_s x devices x peak_flops); unset without a profile or flops_per_sample
  /// (no meaningful peak: the simulator's wall clock is a CPU's).
  std::optional<double> mfu;
};

/// The cost model's prediction of the training loops (virtual time, evaluation excluded) and
/// what the CPU simulator measured.
struct CostPrediction {
  int devices = 0, nodes = 1;
  std::string device_name, interconnect;
  double step_time_s = 0, samples_per_s = 0;
  double comm_share = 0;  ///< slowest device's communication time / total (0..1)
  /// Model FLOPs utilisation (0..1): FLOPs / (time x devices x the dtype's peak, mfu_peak: the
  /// unit the matrix products are priced on), the FLOPs TrainerConfig::flops_per_sample x samples
  /// (nanoGPT's estimate_mfu for ditto-train's GPT), else the GEMM FLOPs the cost model priced.
  double mfu = 0;
  double peak_flops = 0;       ///< FP32 FLOP/s per device
  double bf16_peak_flops = 0;  ///< BF16 tensor-core FLOP/s per device (dense)
  /// The peak `mfu` is of (mfu_peak's, for the run's dtype and TF32 use).
  double mfu_peak_flops = 0;
  const char* mfu_peak_name = "FP32";
  /// The profile's achieved efficiencies (Note [Achieved efficiency], backend_sim/profiles.h).
  double gemm_efficiency = 1, memory_efficiency = 1;
  double measured_step_time_s = 0, measured_samples_per_s = 0;  ///< wall clock
  /// The rates the cost model priced at (Note [Compute units], backend_sim/cost_model.h).
  CostRates rates;
  /// Optimizer steps metered (the training loops' steps; `kernels` sums over them).
  std::int64_t steps = 0;
  /// Device 0's priced work in the metered loops, by name and unit, summed over `steps` steps
  /// (ditto-train --dry-run --verbose prints it per step).
  std::vector<CostLedgerRow> kernels;
};

/// The peak FLOP/s per device that a run's MFU is of, and its name: the unit the run's matrix
/// products are priced on (Note [Compute units], backend_sim/cost_model.h), as nanoGPT's and
/// llm.c's estimate_mfu take the peak of the dtype they train in.
struct MfuPeak {
  double flops = 0;
  const char* name = "FP32";  ///< "BF16", "FP16", "TF32" or "FP32"
};
/// bf16: rates.bf16_flops ("BF16"); f16: rates.f16_flops ("FP16", not BF16's: a profile may give
/// only one of them, e.g. a V100's FP16 125 TFLOP/s and no BF16); f32 with `tf32` (fast mode and
/// allow_tf32: the library GEMMs on TF32 tensor cores): rates.tf32_flops ("TF32"); else
/// `fp32_flops` ("FP32"). A tensor-core rate the cost model does not give (0) is FP32's, named
/// "FP32", as kernel_price prices it then.
MfuPeak mfu_peak(const CostRates& rates, double fp32_flops, DType dtype, bool tf32);

struct DeviceMemory {
  std::string device;  ///< "sim:0"
  MemoryStats stats;
  /// Bytes of optimizer state on this device (Optimizer::state_bytes: momentum buffers, Adam's
  /// moments; with ZeRO-1 this rank's shard of them, about 1/N). dp: all on the first device.
  std::size_t optimizer_state_bytes = 0;
};

struct FitResult {
  bool lead = true;  ///< this is rank 0's result (the others carry only the checksum)
  std::string backend;
  int devices = 0;
  Determinism determinism = Determinism::bitwise;
  TrainerKind trainer = TrainerKind::dp;
  int epochs = 0;
  std::int64_t max_iters = 0;  ///< iteration mode (TrainerConfig::max_iters), else 0
  std::int64_t steps = 0;      ///< optimizer steps of the whole run
  double train_loss = 0;       ///< last epoch's (iteration mode: the last evaluation's)
  Evaluation eval;             ///< after the last epoch (iteration mode: val loss, accuracy 0)
  double train_time_s = 0;     ///< wall clock of this run's training loops
  std::uint64_t params_checksum = 0;  ///< params_checksum(model), equal on every rank
  DType dtype = DType::f32;           ///< TrainerConfig::dtype (the parameters' storage)
  /// f16 with a GradScaler: its scale at the end and the steps it skipped (inf / NaN grads).
  std::optional<float> loss_scale;
  std::int64_t skipped_steps = 0;
  std::size_t optimizer_state_bytes = 0;  ///< this rank's optimizer's (Optimizer::state_bytes)
  /// The backend's cost model's prediction, when an extension set it up to predict
  /// (TrainerExtension::predicts: sim::SimRunOptions::profile) and steps > 0.
  std::optional<CostPrediction> prediction;
  std::vector<DeviceMemory> memory;  ///< single-process runs: every device
  /// What the run measured, so that a report prints no zero for what did not happen: a
  /// training loss (epoch mode: epochs > 0; iteration mode: an evaluation ran), an evaluation
  /// (eval set rows or eval_iters > 0), neither in a dry run (no kernel ran: the losses and the
  /// checksum are 0, not the model's).
  bool has_train_loss = true, has_eval = true;
  bool dry_run = false;  ///< TrainerConfig::dry_run
  /// TrainerConfig::stop ended the run after `steps` steps (its checkpoint written, when a
  /// checkpoint_dir is set); the losses are those of the last evaluation before it.
  bool stopped = false;
  /// The value TrainerConfig::stop held when it stopped the run (ditto-train: the signal's
  /// number, for its exit status 128 + it), 0 when it did not; the same in every process: under
  /// mpirun a rank that got no signal stops with the others and reports theirs (the smallest
  /// value among the ranks that were asked).
  int stop_signal = 0;
  /// What failed after training without losing this result (an extension's output, e.g. the
  /// simulator's trace: the file was checked at the start, but a disk can fill up): each error's
  /// message; the caller reports them after the result (ditto-train: after its final line, exit
  /// status 1).
  std::vector<std::string> output_errors;
};

/// JSON lines: {"event":"epoch",...} per epoch, {"event":"eval",...} per evaluation of iteration
/// mode, {"event":"iter",...} per logged step (StepMetrics; "mfu" only when set) and
/// {"event":"final",...}, and around a stop and a resume {"event":"stopped","step":N,
/// "signal":"SIGTERM","checkpoint":"DIR/step-N"} (the run's last record) and {"event":"resume",
/// "step":N,"from":"DIR"} (the first of the resumed run's, which continues the file: records of
/// steps past N above it, from a run that ended after its last checkpoint, are superseded by
/// those below it) (fields as named in the structs; the checksum as 16 hex digits; only
/// what the run measured: no losses, accuracy, checksum or wall-clock speed of a dry run (its
/// epoch and eval records carry "dry_run":true), no "epochs" or "val_acc"
/// in iteration mode, no train_loss / val_loss / val_acc that FitResult says were not measured).
/// `path` is opened by io::open_output_fd: /dev/stdout (any descriptor's name) is written in
/// place, between the lines printf prints (stdout is flushed before each line, and each line is
/// one write), a regular file is truncated (`append`: appended to). Throws InvalidArgument when
/// `path` cannot be opened or a write of 0 bytes to it fails (/dev/full: at the start, not after
/// the run); each write throws ditto::Error naming the file and the OS reason when it fails
/// ("JsonLinesWriter: cannot write '/dev/full': No space left on device").
class JsonLinesWriter {
 public:
  explicit JsonLinesWriter(const std::string& path, bool append = false);
  ~JsonLinesWriter();
  JsonLinesWriter(const JsonLinesWriter&) = delete;
  JsonLinesWriter& operator=(const JsonLinesWriter&) = delete;
  void write(const EpochMetrics& m);
  void write(const EvalMetrics& m);
  void write(const StepMetrics& m);
  void write(const FitResult& r);
  /// {"event":"resume","step":`step`,"from":`from`}: a resumed run's first record.
  void write_resume(const std::string& from, std::int64_t step);
  /// {"event":"stopped","step":`step`,"signal":`signal`,"checkpoint":`checkpoint`} ("" : none).
  void write_stopped(const std::string& signal, std::int64_t step, const std::string& checkpoint);
  /// A TrainerCallbacks::on_epoch that writes to this writer (which must outlive it).
  std::function<void(const EpochMetrics&)> epoch_callback();
  /// A TrainerCallbacks::on_eval that writes to this writer.
  std::function<void(const EvalMetrics&)> eval_callback();

 private:
  void put_line(const std::string& line);  // the line and '\n', flushed; throws on error
  std::string path_;
  int fd_ = -1;
};

}  // namespace ditto::train
