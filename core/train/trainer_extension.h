// TrainerExtension: what a backend's extras (the simulator's cost model cluster, stragglers,
// trace and faults: backend_sim/sim_run.h) add to a run, without the Trainer knowing the backend
// by name. TrainerConfig::extensions lists them; fit() calls each at fixed points of the run:
//
//   Trainer(config)   validate(config)                       with TrainerConfig's own checks
//   fit(), step 1     settings(config), devices(config, n)   agreed by every rank (mpirun)
//                     plan(config, plan, options)            may refuse; adjusts BackendOptions
//   fit(), step 2     configure(config, run)                 the backend exists (its extension())
//   the loops         predicts()                             reported steps timed, prediction
//   the end (rank 0)  finish(config, run, result)            its report (a trace file, ...)
//   a failed run      failed(config, run)                    what it keeps of the run (a trace)
//
// Each hook throws InvalidArgument naming the setting (config.field_names) for what it refuses.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/device.h"
#include "core/train/trainer_config.h"

namespace ditto::train {

struct FitResult;

/// The run as fit() plans it, before the backend exists.
struct RunPlan {
  std::string backend;     ///< the backend's name ("auto" resolved)
  bool processes = false;  ///< ranks are processes (mpirun): one device each
  int world_size = 1;      ///< processes of the job (1 outside mpirun)
  int devices = 0;         ///< devices (ranks) of the whole run
};

/// The started run, as an extension configures it and reports on it.
struct RunContext {
  Backend& backend;
  const std::vector<Device>& devices;  ///< this process's devices (mpirun: its one)
  int world_devices = 0;               ///< devices (ranks) of the whole run
  bool processes = false;              ///< ranks are processes (mpirun)
  bool lead = true;                    ///< rank 0 (its process under mpirun)
};

class TrainerExtension {
 public:
  virtual ~TrainerExtension() = default;
  /// Its own settings, against the config (Trainer's constructor, after TrainerConfig's checks).
  virtual void validate(const TrainerConfig& config) const { (void)config; }
  /// Settings every rank must agree on (checked once, in fit()'s first step, after the
  /// Trainer's own).
  virtual std::vector<std::pair<std::string, std::string>> settings(
      const TrainerConfig& config) const {
    (void)config;
    return {};
  }
  /// The devices of a single-process run, given `devices` so far (config.devices, or what an
  /// earlier extension made of it): a simulated cluster of N nodes has N x devices.
  virtual int devices(const TrainerConfig& config, int devices) const {
    (void)config;
    return devices;
  }
  /// Before the backend is made: refuses what the plan cannot take (a single-process setting
  /// under mpirun) and adjusts `options` (a device profile's memory).
  virtual void plan(const TrainerConfig& config, const RunPlan& plan,
                    BackendOptions& options) const {
    (void)config, (void)plan, (void)options;
  }
  /// Once the backend exists, before anything runs: configures it through
  /// Backend::extension<T>() (core/runtime/extensions.h) and checks its output paths.
  virtual void configure(const TrainerConfig& config, const RunContext& run) {
    (void)config, (void)run;
  }
  /// Whether the backend's cost model (CostModelExtension) is set up to predict a target: the
  /// Trainer then times the reported steps in its virtual time (StepMetrics::predicted_time_s,
  /// mfu) and reports FitResult::prediction.
  virtual bool predicts() const { return false; }
  /// After training, on rank 0 (every process's communicators still alive): its report (kept
  /// by the extension; what fails here goes to result.output_errors, not lost with the result).
  virtual void finish(const TrainerConfig& config, const RunContext& run, FitResult& result) {
    (void)config, (void)run, (void)result;
  }
  /// After the run failed (a fault, out of memory: anything thrown once configure() ran), in
  /// the process that saw it, its devices' default streams drained, before fit() rethrows:
  /// what it keeps of the run up to the failure (the simulator writes the trace), said in its
  /// own report. fit() drops what this throws: the run's failure is the one reported.
  virtual void failed(const TrainerConfig& config, const RunContext& run) {
    (void)config, (void)run;
  }
};

}  // namespace ditto::train
