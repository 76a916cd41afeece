// SimRun: what the simulator adds to a Trainer's run (train::TrainerExtension,
// core/train/trainer_extension.h): the cost model's cluster (a device profile, the interconnect,
// nodes), stragglers, a Chrome trace and injected faults, set from SimRunOptions; its report
// (the trace written, the faults that never fired) after fit(). The Trainer knows none of them:
//
//   ditto::train::TrainerConfig cfg;
//   auto sim = ditto::sim::add_sim_run(cfg, {.profile = "h100-sxm", .trace = "t.json"});
//   ditto::train::FitResult r = ditto::train::Trainer(cfg, data).fit();
//   // r.prediction: the step time on H100s; sim->report().trace: "t.json"
//
// Errors name the options by TrainerConfig::field_names ("profile" -> "--profile"), else as
// "SimRunOptions::<field>".
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/train/trainer_extension.h"

namespace ditto::sim {

/// The GPUs one node of a real cluster holds: an HGX / DGX board's 8 (one NVSwitch), the most a
/// PCIe server commonly holds too. SimRun::warnings names a cluster whose nodes hold more.
inline constexpr int kGpusPerNode = 8;

/// SimRunOptions::trace_max_events by default (TraceRecorder's own default, backend_sim/trace.h).
inline constexpr std::size_t kDefaultTraceMaxEvents = 4000000;

struct SimRunOptions {
  /// Cost model device profile (backend_sim/profiles.h: h100-sxm, a100-sxm-80gb, ... or a .json
  /// file): the Trainer reports a prediction (FitResult::prediction) and the predicted time of
  /// each reported step; the devices get its memory unless TrainerConfig::memory_capacity is
  /// set. "": none.
  std::string profile;
  std::string interconnect = "auto";  ///< auto (the profile's), nvlink, pcie5, ...
  /// Nodes of TrainerConfig::devices devices each, all simulated in this process (InfiniBand
  /// between them): the run has nodes x devices devices. 1..4096, at most 65536 devices in all.
  int nodes = 1;
  std::vector<std::pair<int, double>> stragglers;  ///< (device, slowdown factor)
  std::string trace;  ///< Chrome trace file written at the end; "": none
  /// The most events the trace keeps (the first recorded); those past it are dropped, counted in
  /// the file's otherData.dropped_events and said by SimRunReport::trace_dropped.
  std::size_t trace_max_events = kDefaultTraceMaxEvents;
  std::vector<std::string> faults;  ///< fault specs (backend_sim/sim_faults.h)
};

/// What the run left (read after fit(), on rank 0).
struct SimRunReport {
  /// The trace file written, or "": at the end of the run, or (failed_run) after it failed.
  std::string trace;
  /// The trace is of a run that failed: what ran up to the failure (SimRun::failed).
  bool failed_run = false;
  /// Why the trace of a failed run could not be written, or "" (a finished run's failure to
  /// write it goes to FitResult::output_errors).
  std::string failed_trace_error;
  /// The trace written lacks events past its cap (SimRunOptions::trace_max_events): how many,
  /// from which virtual time, and the cap, said as a warning ("--trace: wrote FILE without 898000
  /// of its events ..."); "" when it holds them all.
  std::string trace_dropped;
  std::vector<std::string> unfired_faults;  ///< fault specs that never took effect
};

class SimRun final : public train::TrainerExtension {
 public:
  explicit SimRun(SimRunOptions options) : o_(std::move(options)) {}
  const SimRunOptions& options() const { return o_; }
  const SimRunReport& report() const { return report_; }

  /// nodes, devices x nodes; a dry run needs the sim backend in one process; the profile,
  /// trace, stragglers, nodes and faults need the sim backend (or auto) when one is named.
  void validate(const train::TrainerConfig& c) const override;
  /// What the cluster's settings price that no real cluster has, said once at the run's start
  /// (ditto-train prints each as a warning; nothing is refused or priced differently): with the
  /// cost model (a profile or a trace), more than kGpusPerNode GPUs per node (config.devices) are
  /// priced as one node of them on its node-local interconnect (NVLink / NVSwitch, PCIe), e.g.
  /// "--devices 64: 64 GPUs on one node ... use --nodes 8 --devices 8". Errors name the options
  /// as validate() does.
  std::vector<std::string> warnings(const train::TrainerConfig& c) const;
  std::vector<std::pair<std::string, std::string>> settings(
      const train::TrainerConfig& c) const override;
  int devices(const train::TrainerConfig& c, int devices) const override {
    (void)c;
    return devices * o_.nodes;
  }
  /// Under mpirun none of its options (each process holds one device); a profile's memory; a
  /// dry run's devices whose capacities the span of Note [Dry addresses] cannot hold, refused.
  void plan(const train::TrainerConfig& c, const train::RunPlan& plan,
            BackendOptions& options) const override;
  /// The cost model's cluster, stragglers and tracing, the faults (the backend's
  /// CostModelExtension and FaultExtension: without them none may be set), the trace's path.
  void configure(const train::TrainerConfig& c, const train::RunContext& run) override;
  bool predicts() const override { return !o_.profile.empty(); }
  /// The unfired faults; writes the trace (a failure goes to result.output_errors).
  void finish(const train::TrainerConfig& c, const train::RunContext& run,
              train::FitResult& result) override;
  /// Writes the trace of what ran before the failure (report().failed_run), or says why not
  /// (report().failed_trace_error); never throws.
  void failed(const train::TrainerConfig& c, const train::RunContext& run) override;

 private:
  SimRunOptions o_;
  SimRunReport report_;
};

/// Adds a SimRun with `options` to `config.extensions` and returns it (for its report).
std::shared_ptr<SimRun> add_sim_run(train::TrainerConfig& config, SimRunOptions options);

}  // namespace ditto::sim
