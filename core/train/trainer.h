// Trainer: ditto's training loop, one for DataParallel and DistributedDataParallel alike (ranks as
// threads, or as MPI processes under mpirun: core/train/launcher.h). fit() runs the epochs over a
// DataSource (or, with TrainerConfig::max_iters, that many optimizer steps with an evaluation
// every eval_interval steps, as nanoGPT's train.py), reports each epoch or evaluation through
// callbacks (TrainerCallbacks; a JSON-lines writer is in
// core/train/metrics.h), saves and resumes checkpoints (core/io/checkpoint.h), and returns the
// final metrics: losses, accuracy, the parameter checksum, the cost model's prediction and every
// device's memory. ditto-train is options -> TrainerConfig -> Trainer.
//
//   ditto::train::TrainerConfig cfg;            // MLP 64-128-10, SGD, 4 sim devices, bitwise
//   auto data = std::make_shared<ditto::train::CsvDataSource>("digits.csv",
//                                                             ditto::data::CsvOptions{}, 0.2, 0);
//   ditto::train::FitResult r = ditto::train::Trainer(cfg, data).fit();
//   std::printf("%016llx\n", (unsigned long long)r.params_checksum);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/io/checkpoint.h"
#include "core/runtime/backend.h"
#include "core/train/data_source.h"
#include "core/train/metrics.h"
#include "core/train/trainer_config.h"

namespace ditto::optim {
class GradScaler;
class MasterWeights;
}  // namespace ditto::optim

namespace ditto::parallel {
class DataParallel;
class DistributedDataParallel;
}  // namespace ditto::parallel

namespace ditto::train {

class Replica;

/// What fit() reports as it goes; each is called on rank 0 only (the process of rank 0 under
/// mpirun), from the thread that runs it. Unset ones are skipped.
struct TrainerCallbacks {
  std::function<void(const RunInfo&)> on_start;  ///< dp: after a resume; ddp: before the ranks
  /// After loading checkpoint `dir` (the position it holds), once every check of the resume
  /// passed (a refused resume reports none).
  std::function<void(const std::string& dir, const TrainerState&)> on_resume;
  std::function<void(const EpochMetrics&)> on_epoch;  ///< after each epoch's evaluation
  std::function<void(const EvalMetrics&)> on_eval;    ///< iteration mode: each evaluation
  /// Rank 0, after every TrainerConfig::log_interval-th step (both modes; not in a dry run).
  std::function<void(const StepMetrics&)> on_step;
  /// At the end, with rank 0's trained replica (its model and optimizer), before it is freed.
  std::function<void(Replica&)> on_finish;
};

/// FNV-1a (64-bit) over the raw bytes of every parameter of `m` in its own dtype (f32: 4 bytes an
/// element, bf16 / f16: 2), in parameters() order: two runs compare with one number
/// (ditto-train's params_checksum). For an f32 model these are the bytes of flat_parameters, so
/// the checksum of every f32 run is unchanged by mixed precision. Blocks.
std::uint64_t params_checksum(nn::Module& m);

/// Every parameter of `m` converted to f32 (exact for bf16 / f16), in parameters() order,
/// concatenated on the host (blocks).
std::vector<float> flat_parameters(nn::Module& m);

/// One replica of a run: the model, optimizer and loss, built from the config's factories (the
/// same seed everywhere: replicas start equal) and, after begin(), wrapped in DataParallel over
/// every device (dp) or DistributedDataParallel on one rank (ddp). step() and evaluate() are the
/// loop's two operations; a custom loop may call them directly.
class Replica {
 public:
  /// dp: DataParallel over `devices` (the model on devices[0]).
  Replica(const TrainerConfig& config, const DataSource& data, std::vector<Device> devices);
  /// ddp: the rank `comm.rank()` of `comm`, on comm.device(). The loss divides by the global
  /// batch (Note [DDP loss scaling]), so the bits equal DataParallel's in bitwise mode.
  Replica(const TrainerConfig& config, const DataSource& data, Communicator comm);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  /// Wraps the model (ddp: broadcasts rank 0's parameters). Call after loading a checkpoint
  /// into model() and before the first step; step() calls it when not yet done.
  void begin();
  /// One optimizer step on global batch `b` (host tensors; a ddp rank takes its rows) in
  /// config.grad_accum_steps micro-steps (Note [Gradient accumulation],
  /// core/train/grad_accumulation.h: the same bits as one micro-step in bitwise mode), with the
  /// gradients clipped to config.grad_clip (optim::clip_grad_norm_) when it is > 0. Returns
  /// this replica's share of the batch's summed loss (mean loss x rows; dp: the whole batch;
  /// with micro-steps the sum of theirs, equal to K = 1's up to rounding). Throws
  /// InvalidArgument when the batch cannot be split in grad_accum_steps micro-steps (fast mode:
  /// fewer rows than micro-steps on a replica; check_micro_batch_rows).
  double step(const data::Batch& b);
  /// Iteration mode's evaluation (nanoGPT's estimate_loss): the mean over k < iters of the loss
  /// of data.eval_batch(split, k, batch_size), the model in eval mode (set_training(false),
  /// restored after), no gradients. Under ddp the rank evaluates alone on its device.
  double eval_loss(DataSource& data, EvalSplit split, std::int64_t iters,
                   std::int64_t batch_size);
  /// Mean loss and accuracy (argmax of the outputs against y's labels) over `ds`, in batches of
  /// `batch_size`, no gradients.
  Evaluation evaluate(const data::Dataset& ds, std::int64_t batch_size);
  /// The rows of a global batch of `n` rows this replica trains on: dp all n, ddp its rank's
  /// (DistributedDataParallel::local_rows; its micro-steps split those).
  std::int64_t rows_of(std::int64_t n) const;
  /// Those rows as [first, end) of the global batch: dp [0, n), ddp local_rows(n).
  std::pair<std::int64_t, std::int64_t> row_range(std::int64_t n) const;
  /// Sum of `v` over the ranks (ddp: an all_reduce in f32, as a checkpoint stores it); dp: v.
  double sum_over_ranks(double v);
  /// Throws InvalidArgument when the ranks' parameters differ (ddp), naming the ranks.
  std::uint64_t checked_checksum();

  nn::Module& model() { return *model_; }
  /// The optimizer; with TrainerConfig::dtype bf16 / f16 an optim::MasterWeights over the
  /// factory's optimizer (Note [Master weights]).
  optim::Optimizer& optimizer() { return *opt_; }
  /// The f16 run's loss scaler (TrainerConfig::grad_scaler), else null.
  optim::GradScaler* grad_scaler() { return scaler_.get(); }
  bool lead() const { return !comm_ || comm_->rank() == 0; }
  Communicator* communicator() { return comm_ ? &*comm_ : nullptr; }
  /// Every rank, before the lead saves a checkpoint: ZeRO-1 gathers its sharded optimizer state
  /// to rank 0 in the unsharded layout (ZeroRedundancyOptimizer::consolidate_state_dict);
  /// nothing otherwise.
  void prepare_checkpoint();

 private:
  void build(const TrainerConfig& config, const DataSource& data, const Device& device);
  Tensor target(const Tensor& y, std::int64_t outputs, const Device& device) const;
  /// d(final)/d(loss) for Loss::backward: the GradScaler's scale (f16), else undefined (1).
  Tensor loss_grad(const Device& device) const;
  /// After backward: [master grads, unscale / inf check], clip, step, [scale update].
  void optimizer_step();
  /// Whether the optimizer's step reduces the gradients over the ranks itself (ZeRO-1's
  /// reduce_scatter), so that every micro-step's backward runs under no_sync.
  bool optimizer_reduces_gradients() const;

  const TrainerConfig& config_;
  std::vector<Device> devices_;
  std::optional<Communicator> comm_;
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> opt_;
  optim::MasterWeights* master_ = nullptr;  // opt_ itself when dtype is bf16 / f16
  std::unique_ptr<optim::GradScaler> scaler_;
  std::unique_ptr<nn::Loss> criterion_, eval_criterion_;
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

class Trainer {
 public:
  /// Validates `config` (InvalidArgument naming the field: config.name_of), nothing else yet.
  Trainer(TrainerConfig config, std::shared_ptr<DataSource> data, TrainerCallbacks callbacks = {});
  ~Trainer();

  /// Runs the whole job: starts the backend (init_backend with the config's devices and memory),
  /// sets up the simulator's cost model and faults (Backend::extension), checks the output paths,
  /// resumes, trains config.epochs epochs (checkpointing), evaluates and returns the final
  /// metrics (rank 0's; under mpirun every process returns its own, lead set on rank 0). A rank's
  /// failure aborts the others; the error thrown is the root one (launcher.h). One fit() at a
  /// time per process (it restarts the process-wide backend): a second one while another runs
  /// throws InvalidArgument. Throws InvalidArgument for settings the backend or run cannot take,
  /// and what training throws.
  FitResult fit();

  const TrainerConfig& config() const { return config_; }
  /// The run's position after fit() (or the resumed one).
  const TrainerState& state() const { return state_; }

 private:
  struct Run;
  FitResult fit_dp(Run& run);
  FitResult fit_ddp(Run& run);
  /// The epoch loop of one replica; returns rank 0's metrics of the last epoch.
  FitResult train_replica(Run& run, Replica& rep, TrainerState& ts);
  /// The iteration loop (config.max_iters > 0) of one replica; rank 0's last evaluation.
  FitResult train_iterations(Run& run, Replica& rep, TrainerState& ts);
  /// The final metrics beyond the loop's: unfired faults, prediction, memory, trace.
  void finish(Run& run, FitResult& res);
  /// After optimizer step `done` (counted over the run): whether config.stop ends the run here,
  /// the same answer on every rank (TrainerConfig::stop).
  bool stop_due(Run& run, Replica& rep, std::int64_t done) const;
  /// Before optimizer step `step`: the backend's, the model's step and the schedule's lr.
  void begin_step(Run& run, Replica& rep, std::int64_t step) const;
  /// Whether step `step` (0-based) is reported (log_interval); every rank agrees.
  bool logs_step(std::int64_t step) const;
  /// Rank 0's on_step for step `iter`, its summed loss `loss_sum` over `rows` rows of this
  /// replica, `samples` / `tokens` of the global batch, wall clock `time_s`, virtual `vtime_s`.
  void report_step(Run& run, Replica& rep, StepMetrics m, double loss_sum, double vtime_s) const;
  TrainerState initial_state() const;
  /// Resumes from config.resume_dir; reports it (on_resume, rank 0) unless !report.
  TrainerState resume(Replica& rep, const TrainerState& fresh, bool lead, bool report = true);

  TrainerConfig config_;
  std::shared_ptr<DataSource> data_;
  TrainerCallbacks callbacks_;
  TrainerState state_;
};

}  // namespace ditto::train
