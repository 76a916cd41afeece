// CostMeter: the virtual time of a run's training loops, from the backend's cost model
// (CostModelExtension, core/runtime/extensions.h; evaluation excluded), and the prediction it
// gives at the end. Inert on a backend without a cost model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/extensions.h"
#include "core/train/metrics.h"

namespace ditto::train {

class CostMeter {
 public:
  /// Meters devices 0..devices-1 of `be`, a run storing `dtype` in `determinism` mode whose model
  /// takes `flops_per_sample` FLOPs a row (TrainerConfig::flops_per_sample; 0: unknown, the MFU
  /// then counts the cost model's GEMM FLOPs).
  CostMeter(Backend& be, int devices, DType dtype = DType::f32, double flops_per_sample = 0,
            Determinism determinism = Determinism::bitwise);

  /// Every device idle, at the start of an epoch's training loop (waits for them).
  void epoch_begin();
  /// The epoch ran `steps` optimizer steps over `samples` rows; waits for every device.
  void epoch_end(std::int64_t steps, std::int64_t samples);

  /// The prediction of the loops metered so far, with `train_time_s` of wall clock and `nodes`
  /// of the cluster; none without a cost model or a step.
  std::optional<CostPrediction> prediction(double train_time_s) const;
  /// The peak FLOP/s per device the run's matrix products are priced at, named (mfu_peak: BF16 /
  /// FP16 tensor cores for bf16 / f16 storage, TF32 for fast-mode f32 with allow_tf32, else
  /// FP32); 0 without a cost model.
  MfuPeak peak() const;
  double peak_flops() const;
  /// Around one step (every device idle at both; waits for them): mark_begin, then mark_end
  /// returns the step's virtual seconds (0 without a cost model), also kept for last_step_s.
  /// Separate from the epoch's totals, which they leave alone.
  void mark_begin();
  double mark_end();
  double last_step_s() const { return last_step_s_; }
  /// Virtual seconds of the last epoch_begin .. epoch_end (0 without a cost model).
  double last_epoch_s() const { return last_epoch_s_; }
  CostModelExtension* cost_model() const { return cost_; }

 private:
  void sync() const;
  Backend& be_;
  CostModelExtension* cost_;
  int devices_;
  DType dtype_;
  Determinism determinism_;
  double flops_per_sample_;
  CostSnapshot before_;
  std::int64_t mark_ps_ = 0;
  double last_step_s_ = 0;
  double last_epoch_s_ = 0;
  std::int64_t vtrain_ps_ = 0;
  std::uint64_t vflops_ = 0;
  std::vector<std::int64_t> vcomm_ps_;
  std::int64_t steps_ = 0, samples_ = 0;
  std::vector<CostLedgerRow> ledger_before_;  // device 0's ledger at epoch_begin
  std::vector<CostLedgerRow> ledger_;         // its work in the metered loops
};

/// The predicted step's work on device 0 (CostPrediction::kernels divided by its steps), one
/// line per name and unit, longest first: name, launches per step, GFLOP, MB, the unit it is
/// priced on (Note [Compute units], backend_sim/cost_model.h), time (ms) and share of the
/// predicted step; then a total line whose time is the sum of the rows, and, when the step is
/// not that sum (waits, work overlapping on other streams, several devices), a line with the
/// difference. `title` heads the table. ditto-train --verbose prints it.
std::string format_step_kernels(const CostPrediction& p, const std::string& title);

}  // namespace ditto::train
