// Trainer: ditto's training loop, one for DataParallel and DistributedDataParallel alike (ranks as
// threads, or as MPI processes under mpirun: core/train/launcher.h). fit() runs the epochs over a
// DataSource (or, with TrainerConfig::max_iters, that many optimizer steps with an evaluation
// every eval_interval steps, as nanoGPT's train.py), reports each epoch or evaluation through
// callbacks (TrainerCallbacks; a JSON-lines writer is in
// core/train/metrics.h), saves and resumes checkpoints (core/checkpoint/checkpoint.h), and returns
// the final metrics: losses, accuracy, the parameter checksum, the cost model's prediction and
// every device's memory. It knows no backend by name: what a backend adds (the simulator's cluster,
// stragglers, trace, faults: sim::SimRun) comes in through TrainerConfig::extensions
// (core/train/trainer_extension.h). One replica of the run is a Replica (core/train/replica.h).
// ditto-train is options -> TrainerConfig -> Trainer.
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

#include "core/checkpoint/checkpoint.h"
#include "core/comm/communicator.h"
#include "core/data/data_source.h"
#include "core/runtime/backend.h"
#include "core/train/metrics.h"
#include "core/train/replica.h"
#include "core/train/trainer_config.h"

namespace ditto::train {

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
  /// At the end, with rank 0's trained replica (its model and optimizer), before it is freed;
  /// on rank 0 alone (ddp: the other ranks call no collective with it), so only what needs no
  /// other rank: Replica::eval_loss (nanoGPT's last estimate_loss) and evaluate, say.
  std::function<void(Replica&)> on_finish;
  /// Once, when no stop request (TrainerConfig::stop) can end the run any more: as its last
  /// optimizer step begins, after the check for a stop that followed the step before (or at the
  /// start, when no step is left to take). In every process (under mpirun each calls it; in one
  /// process rank 0's thread), not in a stopped run. For a signal handler's message: Note
  /// [Graceful stop]'s stop_handlers_last_step.
  std::function<void()> on_last_step;
  /// A stopped run's checkpoint (TrainerConfig::stop) is on disk at `path` (DIR/step-N, N =
  /// `step`): once, on rank 0, as soon as its save returned (or, when the stop came at a step
  /// whose periodic checkpoint was just written, that one's). For a signal handler's message:
  /// Note [Graceful stop]'s stop_handlers_stop_checkpoint_written.
  std::function<void(const std::string& path, std::int64_t step)> on_stop_checkpoint;
  /// A stopped run (TrainerConfig::stop) stops after step `step` (counted over the run, resumed
  /// runs included): once, before its checkpoint is saved (rank 0 saves DIR/step-N), or with
  /// `saved` when the step's periodic checkpoint, saved just before, is the stop's; in every
  /// process (under mpirun each calls it; in one process rank 0's thread); never in a run that
  /// completes. Under mpirun only rank 0 learns that the checkpoint is on disk
  /// (on_stop_checkpoint): for the other processes' signal handler messages, Note [Graceful
  /// stop]'s stop_handlers_stop_due.
  std::function<void(std::int64_t step, bool saved)> on_stop;
};

class Trainer {
 public:
  /// Validates `config` (InvalidArgument naming the field: config.name_of), nothing else yet.
  Trainer(TrainerConfig config, std::shared_ptr<DataSource> data, TrainerCallbacks callbacks = {});
  ~Trainer();

  /// Runs the whole job: starts the backend (init_backend with the config's devices and memory),
  /// lets the config's extensions configure it (TrainerExtension), checks the output paths,
  /// resumes, trains config.epochs epochs (checkpointing), evaluates and returns the final
  /// metrics (rank 0's; under mpirun every process returns its own, lead set on rank 0). A rank's
  /// failure aborts the others; the error thrown is the root one (launcher.h). One fit() at a
  /// time per process (it restarts the process-wide backend): a second one while another runs
  /// throws InvalidArgument. Throws InvalidArgument for settings the backend or run cannot take,
  /// and what training throws.
  FitResult fit();

  /// Throws the InvalidArgument that a run of `config` on `data` would throw for its settings
  /// before it starts anything: the constructor's validation and fit()'s checks of the settings
  /// against the run (mpirun's processes, the devices in all, the extensions' plans: a dry run's,
  /// a simulated cluster's; fast mode's micro-steps against the shortest batch the run reaches,
  /// DataSource::shortest_batch_rows); returns when there is none. Starts nothing, reads no data.
  /// For advice that names a setting to change (ditto-train's out-of-memory hint): only one that
  /// the same run would accept. Under mpirun, this process's view (no exchange with the others).
  static void check(TrainerConfig config, std::shared_ptr<DataSource> data);

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
  /// Both loops' end: the checksum (every rank's equal), the loss scaler's state, the
  /// optimizer's state bytes, the steps, and rank 0's on_finish unless stopped.
  void end_loop(Replica& rep, const TrainerState& ts, FitResult& res);
  /// The final metrics beyond the loop's: prediction, memory, the extensions' reports.
  void finish(Run& run, FitResult& res);
  /// After optimizer step `done` (counted over the run): whether config.stop ends the run here,
  /// the same answer on every rank (TrainerConfig::stop).
  bool stop_due(Run& run, Replica& rep, std::int64_t done) const;
  /// fit()'s checks of the settings alone (Trainer::check): sets run.n_dev, the backend's `name`
  /// and `options` as the settings and the extensions' plans give them.
  void plan_run(Run& run, std::string& name, BackendOptions& options) const;
  /// Calls callbacks_.on_last_step on this process's first replica (TrainerCallbacks).
  void last_step_begins(Run& run, Replica& rep) const;
  /// A stopped run: `res.stop_signal` (the value stop_due agreed on), then callbacks_.on_stop
  /// with its last step `step`, in every process, before the stop checkpoint is saved
  /// (TrainerCallbacks::on_stop).
  void stop_begins(Run& run, Replica& rep, FitResult& res, std::int64_t step, bool saved) const;
  /// A stopped run, on rank 0: callbacks_.on_stop_checkpoint with `path`, when the checkpoint
  /// of its last step `step` was saved (saved_step) there.
  void stop_checkpoint_written(Replica& rep, const FitResult& res, std::int64_t step,
                               std::int64_t saved_step, const std::string& path) const;
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
