// The report lines of core/train/metrics_format.h.
#include "core/train/metrics_format.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/numerics/determinism.h"
#include "core/train/cost_meter.h"
#include "core/train/graceful_stop.h"

namespace ditto::train {

std::string strprintf(const char* format, ...) {
  std::va_list args, again;
  va_start(args, format);
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, format, args);
  va_end(args);
  std::string s(static_cast<std::size_t>(n > 0 ? n : 0), '\0');
  std::vsnprintf(s.data(), s.size() + 1, format, again);
  va_end(again);
  return s;
}

namespace {

// A loss or accuracy as printed: a NaN without its sign. The sign of a NaN made by arithmetic is
// the machine's (x86 gives the negative default NaN for inf - inf, a GPU its positive canonical
// one: Note [NaN bits]), and printf writes it ("-nan"), so the simulator's and a GPU's logs of one
// diverged run would differ in it.
double loggable(double x) { return std::isnan(x) ? std::fabs(x) : x; }

std::string hms(double s) {
  const auto t = static_cast<long long>(s + 0.5);
  return strprintf("%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
}

}  // namespace

std::string format_mib(std::size_t b) {
  return strprintf("%.2f MiB", static_cast<double>(b) / 1048576.0);
}

std::string format_size(std::size_t b) {
  return b < (std::size_t(1) << 30) ? format_mib(b)
                                    : strprintf("%.2f GiB", static_cast<double>(b) / 1073741824.0);
}

std::string format_start(const std::string& prog, const RunInfo& r, const TrainerConfig& c,
                         const std::string& data, const CsvDataSource* rows) {
  std::string s;
  if (r.trainer == TrainerKind::ddp)
    s = strprintf("%s: trainer=ddp backend=%s ranks=%d (%s) determinism=%s data=%s batch=%" PRId64
                  " epochs=%d bucket_cap_mb=%g\n",
                  prog.c_str(), r.backend.c_str(), r.devices, r.processes ? "processes" : "threads",
                  determinism_name(r.determinism), data.c_str(), c.batch_size, c.epochs,
                  c.bucket_cap_mb);
  else
    s = strprintf("%s: backend=%s devices=%d determinism=%s model=%s params=%" PRId64
                  " data=%s rows=%" PRId64 " (train %" PRId64 ", val %" PRId64 ") batch=%" PRId64
                  " epochs=%d loss=%s "
                  "optimizer=%s lr=%g momentum=%g seed=%" PRIu64 "\n",
                  prog.c_str(), r.backend.c_str(), r.devices, determinism_name(r.determinism),
                  r.model.c_str(), r.params, data.c_str(), rows ? rows->rows() : 0,
                  rows ? rows->train_size() : 0, rows ? rows->eval_set().size() : 0, c.batch_size,
                  c.epochs, c.loss.c_str(), c.optimizer.c_str(), r.lr,
                  c.optimizer == "sgd" ? c.momentum : 0.0f, c.seed);
  return s + format_grad_accum(prog, c);
}

std::string format_grad_accum(const std::string& prog, const TrainerConfig& c) {
  if (c.grad_accum_steps <= 1) return "";
  return strprintf("%s: grad_accum_steps=%" PRId64
                   " (micro-steps per optimizer step of batch %" PRId64 ")\n",
                   prog.c_str(), c.grad_accum_steps, c.batch_size);
}

std::string format_resume(const std::string& prog, const std::string& dir, const TrainerState& ts,
                          bool iteration_mode) {
  if (iteration_mode)  // the step is the whole position
    return strprintf("%s: resumed from %s at step %" PRId64 "\n", prog.c_str(), dir.c_str(),
                     ts.step);
  return strprintf("%s: resumed from %s at step %" PRId64 " (epoch %" PRId64 ", batch %" PRId64
                   ")\n",
                   prog.c_str(), dir.c_str(), ts.step, ts.epoch + 1, ts.batch);
}

namespace {

// `s` as one shell word: as it is when it needs no quoting, else in single quotes (a ' as '\'').
std::string shell_word(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("_./-+=:,@%", ch) != nullptr;
  });
  if (plain) return s;
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

std::string format_stopped(const std::string& prog, int sig, std::int64_t steps,
                           const std::string& dir) {
  // The resume command is for copying into a shell: a directory with spaces is quoted (tester).
  return strprintf("%s: stopped by %s after step %" PRId64 ": checkpoint %s/%s written; resume "
                   "with --resume %s\n",
                   prog.c_str(), stop_signal_name(sig), steps, dir.c_str(),
                   checkpoint_step_name(steps).c_str(), shell_word(dir).c_str());
}

std::string format_predicted_kernels(const CostPrediction& p, Determinism determinism,
                                     DType dtype) {
  return format_step_kernels(
      p, detail::cat("predicted step, kernels by kind on sim:0 (determinism=",
                     determinism_name(determinism), " dtype=", dtype_name(dtype),
                     p.rates.allow_tf32 ? " allow_tf32" : "",
                     "; per step, mean "
                     "of ",
                     p.steps, " step", p.steps == 1 ? "" : "s",
                     "; units: Note [Compute units] in "
                     "backend_sim/cost_model.h):"));
}

std::string format_step(const StepMetrics& m, const std::string& profile, DType dtype) {
  std::string s = strprintf("iter %" PRId64 ": loss %.4f, time %.2fms", m.iter, loggable(m.loss),
                            m.time_s * 1e3);
  if (m.mfu) s += strprintf(", mfu %.2f%%", 100.0 * *m.mfu);
  std::string where;
  if (m.epoch > 0)
    where = strprintf("epoch %d, batch %" PRId64 " of %" PRId64, m.epoch, m.batch + 1, m.batches);
  if (m.predicted_time_s > 0) {
    const char* peak = m.peak_name            ? m.peak_name
                       : dtype == DType::bf16 ? "BF16"
                       : dtype == DType::f16  ? "FP16"
                                              : "FP32";
    where += (where.empty() ? "" : "; ") +
             strprintf("predicted %.3fms on %s%s%s%s", m.predicted_time_s * 1e3, profile.c_str(),
                       m.mfu ? ", mfu of its " : "", m.mfu ? peak : "", m.mfu ? " peak" : "");
  }
  if (!where.empty()) s += " (" + where + ")";
  return s + "\n";
}

std::string format_epoch(const EpochMetrics& m) {
  if (m.dry_run)  // nothing ran: no losses or accuracy, only the cost model's prediction
    return strprintf(
        "epoch %3d  predicted: epoch_time=%.4f ms samples/s=%.0f (dry run: nothing ran)\n", m.epoch,
        m.predicted_time_s * 1e3, m.predicted_samples_per_s);
  return strprintf("epoch %3d  train_loss=%.4f  val_loss=%.4f  val_acc=%.4f  samples/s=%.0f\n",
                   m.epoch, loggable(m.train_loss), loggable(m.val_loss), loggable(m.val_acc),
                   m.samples_per_s);
}

std::string format_eval(const EvalMetrics& m) {
  if (m.dry_run)  // nothing ran: no losses, and the wall clock measured no training
    return strprintf("step %" PRId64 ": no losses (dry run: nothing ran; lr %.3e)\n", m.step, m.lr);
  std::string s = strprintf("step %" PRId64 ": train loss %.4f, val loss %.4f", m.step,
                            loggable(m.train_loss), loggable(m.val_loss));
  if (m.eval_only) return s + "\n";  // it trains nothing: no learning rate, no speed
  s += strprintf(" (lr %.3e", m.lr);
  if (m.step > 0 && m.tokens_per_s > 0)
    s += strprintf(", %.0f tokens/s, ETA %s", m.tokens_per_s, hms(m.eta_s).c_str());
  return s + ")\n";
}

std::string format_final(const FitResult& r, std::int64_t tokens_per_sample) {
  const std::string loop = tokens_per_sample > 0 ? strprintf("iters=%" PRId64, r.steps)
                                                 : strprintf("epochs=%d", r.epochs);
  // Only what the run measured: no losses or checksum of a dry run (nothing ran), no training
  // loss without an epoch (--epochs 0), no evaluation the run did not make (--eval-iters 0).
  const bool measured = !r.dry_run;
  std::string losses;
  if (measured && r.has_train_loss) losses += strprintf(" train_loss=%.6f", loggable(r.train_loss));
  if (measured && r.has_eval) {
    losses += strprintf(" val_loss=%.6f", loggable(r.eval.loss));
    if (tokens_per_sample == 0)  // the GPT's evaluation is its loss only
      losses += strprintf(" val_acc=%.4f", loggable(r.eval.accuracy));
  }
  const std::string checksum =
      measured ? strprintf(" params_checksum=%016" PRIx64, r.params_checksum) : std::string();
  // f32 runs print the line they always printed.
  const std::string dtype =
      r.dtype != DType::f32 ? std::string(" dtype=") + dtype_name(r.dtype) : "";
  std::string s =
      strprintf("final: backend=%s devices=%d determinism=%s%s%s %s%s train_time_s=%.3f%s\n",
                r.backend.c_str(), r.devices, determinism_name(r.determinism), dtype.c_str(),
                r.trainer == TrainerKind::ddp ? " trainer=ddp" : "", loop.c_str(), losses.c_str(),
                r.train_time_s, checksum.c_str());
  if (r.loss_scale)
    s += strprintf("grad_scaler: scale=%g skipped_steps=%" PRId64 " (f16 dynamic loss scaling)\n",
                   static_cast<double>(*r.loss_scale), r.skipped_steps);
  return s;
}

std::string format_prediction(const CostPrediction& p, DType dtype, bool dry_run,
                              std::int64_t tokens_per_sample) {
  std::string tokens, measured_tokens;
  if (tokens_per_sample > 0) {
    const double t = static_cast<double>(tokens_per_sample);
    tokens = strprintf(" tokens/s=%.0f", p.samples_per_s * t);
    measured_tokens = strprintf(" tokens/s=%.0f", p.measured_samples_per_s * t);
  }
  // MFU against the peak the run's matrix products are priced at (mfu_peak, named there: FP32,
  // TF32, or the BF16 / FP16 tensor cores of bf16 / f16 storage, Note [Mixed precision]); one
  // made by hand, without it, is FP32's or the dtype's.
  MfuPeak peak{p.mfu_peak_flops, p.mfu_peak_name};
  if (peak.flops <= 0) peak = mfu_peak(p.rates, p.peak_flops, dtype, false);
  // A real run prices the simulator's own kernels as it ran them, not the CUDA backend's that a
  // dry run prices (docs/prediction.md): the two differ, and the dry run is what a GPU runs.
  const char* priced = dry_run ? "" : "; the simulator's own kernels: --dry-run prices a GPU's";
  std::string mfu = strprintf(" (virtual time%s)", priced);
  if (tokens_per_sample == 0)
    mfu = strprintf(" mfu=%.3g%% (virtual time; %s peak %.1f TFLOP/s per GPU%s)", 100.0 * p.mfu,
                    peak.name, peak.flops / 1e12, priced);
  std::string s = strprintf("predicted: %d x %s (%d node%s, %s) step_time=%.4f ms samples/s=%.0f%s "
                            "comm_share=%.1f%%%s\n",
                            p.devices, p.device_name.c_str(), p.nodes, p.nodes > 1 ? "s" : "",
                            p.interconnect.c_str(), p.step_time_s * 1e3, p.samples_per_s,
                            tokens.c_str(), 100.0 * p.comm_share, mfu.c_str());
  if (!dry_run)  // a dry run executed nothing: its wall clock measures no training
    s += strprintf("measured:  CPU simulator step_time=%.4f ms samples/s=%.0f%s (wall clock)\n",
                   p.measured_step_time_s * 1e3, p.measured_samples_per_s, measured_tokens.c_str());
  return s;
}

std::string format_memory(const std::vector<DeviceMemory>& memory) {
  std::string s;
  for (const DeviceMemory& m : memory)
    s += strprintf("memory: %s live=%s peak=%s capacity=%s optimizer_state=%s\n", m.device.c_str(),
                   format_mib(m.stats.in_use).c_str(), format_mib(m.stats.peak).c_str(),
                   format_mib(m.stats.capacity).c_str(),
                   format_mib(m.optimizer_state_bytes).c_str());
  return s;
}

RunPrinter::RunPrinter(std::string jsonl, std::string jsonl_name, std::string profile, DType dtype,
                       bool append)
    : jsonl_(std::move(jsonl)),
      jsonl_name_(std::move(jsonl_name)),
      profile_(std::move(profile)),
      dtype_(dtype),
      append_(append) {}

RunPrinter::~RunPrinter() = default;

void RunPrinter::out(const std::string& lines) {
  std::fputs(lines.c_str(), stdout);
  std::fflush(stdout);
}

void RunPrinter::install(TrainerCallbacks& cb, std::function<std::string(const RunInfo&)> start) {
  cb.on_start = [this, start = std::move(start)](const RunInfo& r) {
    if (!jsonl_.empty()) try {
        writer_ = std::make_unique<JsonLinesWriter>(jsonl_, append_);
        if (resume_) writer_->write_resume(resume_->first, resume_->second);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(detail::cat(jsonl_name_, ": ", e.what()));
      }
    out(start(r));
  };
  cb.on_epoch = [this](const EpochMetrics& m) {
    out(format_epoch(m));
    if (writer_) writer_->write(m);
  };
  cb.on_eval = [this](const EvalMetrics& m) {
    out(format_eval(m));
    if (writer_) writer_->write(m);
  };
  cb.on_step = [this](const StepMetrics& m) {
    out(format_step(m, profile_, dtype_));
    if (writer_) writer_->write(m);
  };
}

void RunPrinter::write_result(const FitResult& r) {
  if (writer_) try {
      writer_->write(r);
    } catch (const std::exception& e) {
      late_errors.push_back(detail::cat(jsonl_name_, ": ", e.what()));
    }
}

void RunPrinter::resumed(const std::string& from, std::int64_t step) {
  if (jsonl_.empty()) return;
  if (!writer_) {  // dp: the resume comes before on_start opens the file
    resume_.emplace(from, step);
    return;
  }
  writer_->write_resume(from, step);
}

void RunPrinter::write_stopped(const std::string& signal, std::int64_t step,
                               const std::string& checkpoint) {
  if (writer_) try {
      writer_->write_stopped(signal, step, checkpoint);
    } catch (const std::exception& e) {
      late_errors.push_back(detail::cat(jsonl_name_, ": ", e.what()));
    }
}

int RunPrinter::finish(const std::string& prog) {
  std::fflush(stdout);
  for (const std::string& e : late_errors)
    std::fprintf(stderr, "%s: error: after training (the result above is complete): %s\n",
                 prog.c_str(), e.c_str());
  return late_errors.empty() ? 0 : 1;
}

}  // namespace ditto::train
