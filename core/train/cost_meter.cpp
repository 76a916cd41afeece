// CostMeter (cost_meter.h).
#include "core/train/cost_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "core/train/metrics_format.h"

namespace ditto::train {

CostMeter::CostMeter(Backend& be, int devices, DType dtype, double flops_per_sample,
                     Determinism determinism)
    : be_(be),
      cost_(be.extension<CostModelExtension>()),
      devices_(devices),
      dtype_(dtype),
      determinism_(determinism),
      flops_per_sample_(flops_per_sample),
      vcomm_ps_(static_cast<std::size_t>(devices), 0) {}

MfuPeak CostMeter::peak() const {
  if (!cost_) return {0, "FP32"};
  const CostRates r = cost_->rates();
  // TF32 only where the cost model priced f32 library GEMMs on it: fast mode (bitwise mode's
  // GEMMs are ditto's own SIMT kernels, Note [Compute units]).
  return mfu_peak(r, cost_->peak_flops(), dtype_,
                  dtype_ == DType::f32 && determinism_ == Determinism::fast && r.allow_tf32);
}

double CostMeter::peak_flops() const { return peak().flops; }

void CostMeter::mark_begin() {
  if (!cost_) return;
  sync();
  mark_ps_ = cost_->totals().now_ps;
}

double CostMeter::mark_end() {
  if (!cost_) return 0;
  sync();
  last_step_s_ = static_cast<double>(cost_->totals().now_ps - mark_ps_) / 1e12;
  return last_step_s_;
}

void CostMeter::sync() const {
  for (int d = 0; d < devices_; ++d) be_.default_stream(d).synchronize();
}

void CostMeter::epoch_begin() {
  if (!cost_) return;
  sync();
  before_ = cost_->totals();
  ledger_before_ = cost_->ledger(0);
}

namespace {
// The row of `rows` with `r`'s name and unit, appended (zero) when there is none.
CostLedgerRow& row_of(std::vector<CostLedgerRow>& rows, const CostLedgerRow& r) {
  for (CostLedgerRow& x : rows)
    if (x.name == r.name && x.unit == r.unit) return x;
  rows.push_back({r.name, r.unit, 0, 0, 0, 0});
  return rows.back();
}
}  // namespace

void CostMeter::epoch_end(std::int64_t steps, std::int64_t samples) {
  steps_ += steps;
  samples_ += samples;
  if (!cost_) return;
  sync();
  CostSnapshot after = cost_->totals();
  vtrain_ps_ += after.now_ps - before_.now_ps;
  last_epoch_s_ = static_cast<double>(after.now_ps - before_.now_ps) / 1e12;
  vflops_ += after.gemm_flops - before_.gemm_flops;
  for (std::size_t d = 0; d < vcomm_ps_.size(); ++d)
    vcomm_ps_[d] += after.comm_ps[d] - before_.comm_ps[d];
  // The ledger only grows: this epoch's work is now's rows minus epoch_begin's.
  for (const CostLedgerRow& r : cost_->ledger(0)) {
    CostLedgerRow delta = r;
    for (const CostLedgerRow& b : ledger_before_)
      if (b.name == r.name && b.unit == r.unit) {
        delta.count -= b.count;
        delta.flops -= b.flops;
        delta.bytes -= b.bytes;
        delta.time_ps -= b.time_ps;
      }
    if (delta.count == 0) continue;
    CostLedgerRow& acc = row_of(ledger_, r);
    acc.count += delta.count;
    acc.flops += delta.flops;
    acc.bytes += delta.bytes;
    acc.time_ps += delta.time_ps;
  }
}

std::optional<CostPrediction> CostMeter::prediction(double train_time_s) const {
  if (!cost_ || steps_ == 0) return std::nullopt;
  CostPrediction p;
  p.devices = devices_;
  p.nodes = cost_->nodes();
  p.device_name = cost_->device_name();
  p.interconnect = cost_->interconnect_name();
  p.peak_flops = cost_->peak_flops();
  p.bf16_peak_flops = cost_->bf16_peak_flops();
  std::tie(p.gemm_efficiency, p.memory_efficiency) = cost_->efficiencies();
  const double vt = static_cast<double>(vtrain_ps_) / 1e12;
  const std::int64_t comm_max = *std::max_element(vcomm_ps_.begin(), vcomm_ps_.end());
  p.step_time_s = vt / static_cast<double>(steps_);
  p.samples_per_s = vt > 0 ? static_cast<double>(samples_) / vt : 0.0;
  p.comm_share = vt > 0 ? static_cast<double>(comm_max) / 1e12 / vt : 0.0;
  const double flops = flops_per_sample_ > 0 ? flops_per_sample_ * static_cast<double>(samples_)
                                             : static_cast<double>(vflops_);
  const MfuPeak mp = peak();
  p.mfu_peak_flops = mp.flops;
  p.mfu_peak_name = mp.name;
  p.mfu = vt > 0 ? flops / (vt * devices_ * mp.flops) : 0.0;
  p.rates = cost_->rates();
  p.steps = steps_;
  p.kernels = ledger_;
  p.measured_step_time_s = train_time_s / static_cast<double>(steps_);
  p.measured_samples_per_s = train_time_s > 0 ? static_cast<double>(samples_) / train_time_s : 0;
  return p;
}

std::string format_step_kernels(const CostPrediction& p, const std::string& title) {
  const double steps = p.steps > 0 ? static_cast<double>(p.steps) : 1.0;
  std::vector<CostLedgerRow> rows = p.kernels;
  std::stable_sort(rows.begin(), rows.end(), [](const CostLedgerRow& a, const CostLedgerRow& b) {
    return a.time_ps > b.time_ps;
  });
  const double step_ms = p.step_time_s * 1e3;
  auto share = [&](double ms) { return step_ms > 0 ? 100.0 * ms / step_ms : 0.0; };
  // The name and unit columns as wide as their longest entry (layernorm_backward_params, 25
  // characters, overflowed a fixed 24 and pushed its row's columns right).
  int name_w = 24, unit_w = 20;
  for (const char* fixed : {"total (sim:0 busy)", "overlap (streams)", "predicted step"})
    name_w = std::max(name_w, static_cast<int>(std::strlen(fixed)));
  for (const CostLedgerRow& r : rows) {
    name_w = std::max(name_w, static_cast<int>(r.name.size()));
    unit_w = std::max(unit_w, static_cast<int>(r.unit.size()));
  }
  std::string out = title + "\n";
  out += strprintf("  %-*s %9s %11s %11s  %-*s %10s %7s\n", name_w, "kernel", "per step", "GFLOP",
                   "MB", unit_w, "unit", "time ms", "share");
  std::int64_t count = 0, time_ps = 0;
  double flops = 0, bytes = 0;
  for (const CostLedgerRow& r : rows) {
    const double ms = static_cast<double>(r.time_ps) / 1e9 / steps;
    out += strprintf("  %-*s %9.4g %11.3f %11.3f  %-*s %10.4f %6.1f%%\n", name_w, r.name.c_str(),
                     static_cast<double>(r.count) / steps, r.flops / steps / 1e9,
                     r.bytes / steps / 1e6, unit_w, r.unit.c_str(), ms, share(ms));
    count += r.count;
    time_ps += r.time_ps;
    flops += r.flops;
    bytes += r.bytes;
  }
  const double total_ms = static_cast<double>(time_ps) / 1e9 / steps;
  out += strprintf("  %-*s %9.4g %11.3f %11.3f  %-*s %10.4f %6.1f%%\n", name_w,
                   "total (sim:0 busy)", static_cast<double>(count) / steps, flops / steps / 1e9,
                   bytes / steps / 1e6, unit_w, "", total_ms, share(total_ms));
  // Device 0's busy time is the step when its work runs back to back on one stream.
  const double rest_ms = step_ms - total_ms;
  if (std::abs(rest_ms) > 5e-7 * std::max(step_ms, 1e-9))
    out += strprintf("  %-*s %9s %11s %11s  %-*s %10.4f %6.1f%%\n", name_w,
                     rest_ms > 0 ? "idle (waits)" : "overlap (streams)", "", "", "", unit_w, "",
                     rest_ms, share(rest_ms));
  out += strprintf("  %-*s %9s %11s %11s  %-*s %10.4f %6.1f%%\n", name_w, "predicted step", "", "",
                   "", unit_w, "", step_ms, 100.0);
  return out;
}

}  // namespace ditto::train
