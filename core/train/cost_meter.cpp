// CostMeter (cost_meter.h).
#include "core/train/cost_meter.h"

#include <algorithm>
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
}

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
  p.measured_step_time_s = train_time_s / static_cast<double>(steps_);
  p.measured_samples_per_s = train_time_s > 0 ? static_cast<double>(samples_) / train_time_s : 0;
  return p;
}

}  // namespace ditto::train
