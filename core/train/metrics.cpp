// JsonLinesWriter and mfu_peak (metrics.h).
#include "core/train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/io/file.h"

namespace ditto::train {

MfuPeak mfu_peak(const CostRates& rates, double fp32_flops, DType dtype, bool tf32) {
  const auto pick = [&](double rate, const char* name) {
    return rate > 0 ? MfuPeak{rate, name} : MfuPeak{fp32_flops, "FP32"};
  };
  if (dtype == DType::bf16) return pick(rates.bf16_flops, "BF16");
  if (dtype == DType::f16) return pick(rates.f16_flops, "FP16");
  if (tf32) return pick(rates.tf32_flops, "TF32");
  return {fp32_flops, "FP32"};
}

JsonLinesWriter::JsonLinesWriter(const std::string& path, bool append) : path_(path) {
  try {
    fd_ = io::open_output_fd(path, "JsonLinesWriter: path", append);
  } catch (const Error& e) {
    throw InvalidArgument(e.what());
  }
}

JsonLinesWriter::~JsonLinesWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JsonLinesWriter::put_line(const std::string& line) {
  io::write_fd(fd_, line + "\n", path_, "JsonLinesWriter");  // one write: never split
}

void JsonLinesWriter::write(const EpochMetrics& m) {
  nlohmann::json j = {{"event", "epoch"}, {"epoch", m.epoch}, {"step", m.step}};
  if (m.dry_run) {  // nothing ran: only what the cost model predicted
    j["dry_run"] = true;
  } else {
    j["train_loss"] = m.train_loss;
    j["val_loss"] = m.val_loss;
    j["val_acc"] = m.val_acc;
  }
  j["samples"] = m.samples;
  if (!m.dry_run) {
    j["epoch_time_s"] = m.epoch_time_s;
    j["samples_per_s"] = m.samples_per_s;
  }
  if (m.predicted_time_s > 0)
    j["predicted"] = {{"epoch_time_s", m.predicted_time_s},
                      {"samples_per_s", m.predicted_samples_per_s}};
  put_line(j.dump());
}

void JsonLinesWriter::write(const EvalMetrics& m) {
  if (m.dry_run) {  // nothing ran: no losses or wall-clock speed (as a dry run's epoch record)
    const nlohmann::json j = {{"event", "eval"}, {"step", m.step}, {"max_iters", m.max_iters},
                              {"dry_run", true}, {"lr", m.lr},     {"tokens", m.tokens}};
    put_line(j.dump());
    return;
  }
  nlohmann::json j = {{"event", "eval"},
                      {"step", m.step},
                      {"max_iters", m.max_iters},
                      {"train_loss", m.train_loss},
                      {"val_loss", m.val_loss},
                      {"lr", m.lr},
                      {"tokens", m.tokens},
                      {"interval_time_s", m.interval_time_s},
                      {"tokens_per_s", m.tokens_per_s},
                      {"elapsed_s", m.elapsed_s},
                      {"eta_s", m.eta_s}};
  if (m.eval_only) j.erase("lr");  // it trains nothing (format_eval's line has none either)
  put_line(j.dump());
}

void JsonLinesWriter::write(const StepMetrics& m) {
  nlohmann::json j = {{"event", "iter"},      {"iter", m.iter},     {"loss", m.loss},
                      {"samples", m.samples}, {"tokens", m.tokens}, {"time_s", m.time_s}};
  if (m.epoch > 0) {
    j["epoch"] = m.epoch;
    j["batch"] = m.batch;
    j["batches"] = m.batches;
  }
  if (m.predicted_time_s > 0) j["predicted_time_s"] = m.predicted_time_s;
  if (m.mfu) j["mfu"] = *m.mfu;
  put_line(j.dump());
}

void JsonLinesWriter::write_resume(const std::string& from, std::int64_t step) {
  put_line(nlohmann::json({{"event", "resume"}, {"step", step}, {"from", from}}).dump());
}

void JsonLinesWriter::write_stopped(const std::string& signal, std::int64_t step,
                                    const std::string& checkpoint) {
  nlohmann::json j = {{"event", "stopped"}, {"step", step}, {"signal", signal}};
  if (!checkpoint.empty()) j["checkpoint"] = checkpoint;
  put_line(j.dump());
}

void JsonLinesWriter::write(const FitResult& r) {
  char sum[32];
  std::snprintf(sum, sizeof sum, "%016" PRIx64, r.params_checksum);
  const bool iterations = r.max_iters > 0;
  nlohmann::json j = {{"event", "final"},
                      {"backend", r.backend},
                      {"devices", r.devices},
                      {"determinism", determinism_name(r.determinism)},
                      {"trainer", trainer_kind_name(r.trainer)}};
  if (iterations)
    j["max_iters"] = r.max_iters;  // the MLP's epochs have no max_iters
  else
    j["epochs"] = r.epochs;
  j["steps"] = r.steps;
  if (r.dry_run) j["dry_run"] = true;
  if (r.has_train_loss && !r.dry_run) j["train_loss"] = r.train_loss;
  if (r.has_eval && !r.dry_run) {
    j["val_loss"] = r.eval.loss;
    if (!iterations) j["val_acc"] = r.eval.accuracy;
  }
  j["train_time_s"] = r.train_time_s;
  if (!r.dry_run) j["params_checksum"] = sum;
  if (r.dtype != DType::f32) j["dtype"] = dtype_name(r.dtype);
  if (r.loss_scale) {
    j["loss_scale"] = *r.loss_scale;
    j["skipped_steps"] = r.skipped_steps;
  }
  if (r.prediction)
    j["predicted"] = {{"step_time_s", r.prediction->step_time_s},
                      {"samples_per_s", r.prediction->samples_per_s},
                      {"comm_share", r.prediction->comm_share},
                      {"mfu", r.prediction->mfu}};
  for (const DeviceMemory& d : r.memory)
    j["memory"].push_back({{"device", d.device},
                           {"in_use", d.stats.in_use},
                           {"peak", d.stats.peak},
                           {"capacity", d.stats.capacity}});
  put_line(j.dump());
}

std::function<void(const EpochMetrics&)> JsonLinesWriter::epoch_callback() {
  return [this](const EpochMetrics& m) { write(m); };
}

std::function<void(const EvalMetrics&)> JsonLinesWriter::eval_callback() {
  return [this](const EvalMetrics& m) { write(m); };
}

}  // namespace ditto::train
