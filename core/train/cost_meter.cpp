// CostMeter (cost_meter.h).
#include "core/train/cost_meter.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <tuple>

namespace ditto::train {

CostMeter::CostMeter(Backend& be, int devices, DType dtype, double flops_per_sample)
    : be_(be), cost_(be.extension<CostModelExtension>()), devices_(devices), dtype_(dtype),
      flops_per_sample_(flops_per_sample), vcomm_ps_(static_cast<std::size_t>(devices), 0) {}

double CostMeter::peak_flops() const {
  if (!cost_) return 0;
  const double tc = cost_->bf16_peak_flops();
  return dtype_ != DType::f32 && tc > 0 ? tc : cost_->peak_flops();
}

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
  const double flops = flops_per_sample_ > 0
                           ? flops_per_sample_ * static_cast<double>(samples_)
                           : static_cast<double>(vflops_);
  p.mfu = vt > 0 ? flops / (vt * devices_ * peak_flops()) : 0.0;
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
  std::string out = title + "\n";
  char buf[256];
  std::snprintf(buf, sizeof buf, "  %-24s %9s %11s %11s  %-20s %10s %7s\n", "kernel",
                "per step", "GFLOP", "MB", "unit", "time ms", "share");
  out += buf;
  std::int64_t count = 0, time_ps = 0;
  double flops = 0, bytes = 0;
  for (const CostLedgerRow& r : rows) {
    const double ms = static_cast<double>(r.time_ps) / 1e9 / steps;
    std::snprintf(buf, sizeof buf, "  %-24s %9.4g %11.3f %11.3f  %-20s %10.4f %6.1f%%\n",
                  r.name.c_str(), static_cast<double>(r.count) / steps, r.flops / steps / 1e9,
                  r.bytes / steps / 1e6, r.unit.c_str(), ms, share(ms));
    out += buf;
    count += r.count;
    time_ps += r.time_ps;
    flops += r.flops;
    bytes += r.bytes;
  }
  const double total_ms = static_cast<double>(time_ps) / 1e9 / steps;
  std::snprintf(buf, sizeof buf, "  %-24s %9.4g %11.3f %11.3f  %-20s %10.4f %6.1f%%\n",
                "total (sim:0 busy)", static_cast<double>(count) / steps, flops / steps / 1e9,
                bytes / steps / 1e6, "", total_ms, share(total_ms));
  out += buf;
  // Device 0's busy time is the step when its work runs back to back on one stream.
  const double rest_ms = step_ms - total_ms;
  if (std::abs(rest_ms) > 5e-7 * std::max(step_ms, 1e-9)) {
    std::snprintf(buf, sizeof buf, "  %-24s %9s %11s %11s  %-20s %10.4f %6.1f%%\n",
                  rest_ms > 0 ? "idle (waits)" : "overlap (streams)", "", "", "", "", rest_ms,
                  share(rest_ms));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "  %-24s %9s %11s %11s  %-20s %10.4f %6.1f%%\n",
                "predicted step", "", "", "", "", step_ms, 100.0);
  out += buf;
  return out;
}

}  // namespace ditto::train
