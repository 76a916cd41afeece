// Trainer (trainer.h): the run's setup (backend, devices, the TrainerExtensions, output paths),
// the epoch and iteration loops shared by DataParallel and DDP, checkpoints and the final metrics.
#include "core/train/trainer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>

#include "core/base/error.h"
#include "core/distributed/distributed.h"
#include "core/io/file.h"
#include "core/runtime/extensions.h"
#include "core/train/cost_meter.h"
#include "core/train/grad_accumulation.h"
#include "core/train/launcher.h"
#include "core/train/trainer_extension.h"

namespace ditto::train {

void validate(const TrainerConfig& c);  // trainer_config.cpp

/// The started run: its backend and devices, and how ranks meet between epochs.
struct Trainer::Run {
  Backend* be = nullptr;
  std::vector<Device> devs;  // dp and ddp threads: every device; mpirun: this process's one
  bool processes = false;    // ddp ranks are MPI processes
  int n_dev = 0;             // devices (ranks) of the whole run
  CostMeter* meter = nullptr;
  RankBarrier* barrier = nullptr;  // ddp threads
  // TrainerConfig::stop: the step after which every rank (thread) stops, and the value it held
  // (FitResult::stop_signal).
  std::atomic<std::int64_t> stop_at{std::numeric_limits<std::int64_t>::max()};
  std::atomic<int> stop_value{0};

  RunContext context() const { return {*be, devs, n_dev, processes, dist::rank() == 0}; }
  bool predicts(const TrainerConfig& c) const {
    for (const auto& e : c.extensions)
      if (e->predicts()) return true;
    return false;
  }

  void epoch_begin() const {
    if (barrier)
      barrier->arrive([this] {
        if (meter) meter->epoch_begin();
      });
    else if (meter)
      meter->epoch_begin();
  }
  void epoch_end(std::int64_t steps, std::int64_t samples) const {
    // The same counts on every rank: the last one to arrive records them.
    if (barrier)
      barrier->arrive([&] {
        if (meter) meter->epoch_end(steps, samples);
      });
    else if (meter)
      meter->epoch_end(steps, samples);
  }
  // Around a reported step when an extension predicts (`timed`): its virtual time, every rank
  // idle at both.
  bool timed = false;
  void step_mark_begin() const {
    if (!timed || !meter) return;
    if (barrier)
      barrier->arrive([this] { meter->mark_begin(); });
    else
      meter->mark_begin();
  }
  double step_mark_end() const {
    if (!timed || !meter) return 0;
    if (barrier)
      barrier->arrive([this] { meter->mark_end(); });  // the last to arrive
    else
      meter->mark_end();
    return meter->last_step_s();
  }
};

namespace {

std::string model_name(const TrainerConfig& c, const DataSource& data) {
  if (!c.model_name.empty() || c.make_model) return c.model_name;
  std::ostringstream arch;
  arch << data.num_inputs();
  for (std::int64_t h : c.hidden) arch << '-' << h;
  arch << '-' << data.num_outputs();
  return arch.str();
}

/// The default MLP's sizes (no make_model) in 64 bits: each layer's weight in f32 bytes (in x out
/// x 4) and the parameter count fit in int64 (Note [GPT sizes in 64 bits], gpt_recipe.cpp, for
/// the GPT's): --hidden 4611686018427387904 failed in the first step ("Linear: expected
/// in_features * out_features <= ...", exit 1), not as a usage error naming the option. A model
/// within them that no machine holds fails as before, at its first allocation (OutOfMemory).
void check_mlp_sizes(const TrainerConfig& c, const DataSource& data) {
  if (c.make_model) return;
  std::vector<std::int64_t> sizes{data.num_inputs()};
  sizes.insert(sizes.end(), c.hidden.begin(), c.hidden.end());
  sizes.push_back(data.num_outputs());
  std::int64_t params = 0;
  bool fits = true;
  for (std::size_t i = 0; fits && i + 1 < sizes.size(); ++i) {
    std::int64_t weights = 0, bytes = 0;
    fits = !__builtin_mul_overflow(sizes[i], sizes[i + 1], &weights) &&
           !__builtin_mul_overflow(weights, std::int64_t(4), &bytes) &&
           !__builtin_add_overflow(params, weights, &params) &&
           !__builtin_add_overflow(params, sizes[i + 1], &params);  // the biases
  }
  if (fits) return;
  std::string hidden;
  for (std::int64_t h : c.hidden) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
  throw InvalidArgument(detail::cat(
      c.name_of("hidden"),
      ": expected layer sizes whose weights' f32 bytes (in x out x 4) and parameter count fit in "
      "64 bits, got '",
      hidden, "' (the model ", model_name(c, data), ")"));
}

/// The checkpoint a run resumed from at step `step` ("" for a run that did not resume).
std::string resumed_checkpoint(const TrainerConfig& c, std::int64_t step) {
  if (c.resume_dir.empty()) return "";
  return checkpoint_run_dir(c.resume_dir) + "/" + checkpoint_step_name(step);
}

/// The checkpoint directory is created and locked (lock_checkpoint_dir; by rank 0: `lead`) at
/// startup, so that a long run is not lost when it ends. A fresh run (no resume_dir) refuses a
/// directory that holds checkpoints: its own would mix with them (the rotation keeps the two
/// newest steps of either run, and a later resume takes whichever is newest). The errors name
/// the directory as the caller gave it (`given`; c.checkpoint_dir is fit()'s absolute path).
void check_output_paths(const TrainerConfig& c, const std::string& given, bool lead) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string& ck = c.checkpoint_dir;
  if (!ck.empty() && lead) {
    // A checkpoint itself (DIR/step-N, which --resume and --init-from take) is not a directory
    // to save in: the new run's latest, lock and step-N would nest inside that checkpoint
    // (tester5), and the rotation of DIR's run would remove them with it.
    const std::string parent = checkpoint_run_dir(ck);
    DITTO_CHECK(parent == ck, c.name_of("checkpoint_dir"),
                ": expected a directory to save checkpoints in, got '", given,
                "', which is itself a checkpoint (a step-N of the run in '", parent,
                "'): pass that directory (with ", c.name_of("resume_dir"), " ", given,
                " to continue from this step) or another one");
    fs::create_directories(ck, ec);
    DITTO_CHECK(!ec, c.name_of("checkpoint_dir"), ": cannot create directory '", given,
                "': ", ec.message());
    DITTO_CHECK(::access(ck.c_str(), W_OK | X_OK) == 0, c.name_of("checkpoint_dir"),
                ": expected a writable directory, got '", given, "': ", std::strerror(errno));
    try {
      lock_checkpoint_dir(ck);  // a second run on the same directory fails here, not mid-run
    } catch (const Error& e) {
      throw Error(detail::cat(c.name_of("checkpoint_dir"), ": ", e.what()));
    }
    // A resume from another directory (--resume A --checkpoint B) is a fresh run for B: B's own
    // checkpoints would mix with A's continuation as a fresh run's would (B's `latest` switched
    // to A's step, B's newer steps kept beside it). A's DIR/step-N counts as A.
    const std::string from = checkpoint_run_dir(c.resume_dir);
    if (c.resume_dir.empty() || io::same_file_key(from) != io::same_file_key(ck)) {
      const std::vector<std::string> found = checkpoint_entries(ck, c.name_of("checkpoint_dir"));
      std::string names;
      for (const std::string& f : found) names += (names.empty() ? "" : ", ") + f;
      if (c.resume_dir.empty())
        DITTO_CHECK(found.empty(), c.name_of("checkpoint_dir"),
                    ": expected a directory without checkpoints for a fresh run (no ",
                    c.name_of("resume_dir"), "), got '", given, "', which holds another run's (",
                    names, "): the two runs' checkpoints would mix; to continue that run, pass ",
                    c.name_of("resume_dir"), " ", given,
                    "; to start over, remove them or choose another directory");
      else
        DITTO_CHECK(found.empty(), c.name_of("checkpoint_dir"),
                    ": expected a directory without checkpoints when resuming from another one (",
                    c.name_of("resume_dir"), " '", c.resume_dir, "'), got '", given,
                    "', which holds another run's (", names,
                    "): the two runs' checkpoints would mix; to continue the run in '", given,
                    "', pass ", c.name_of("resume_dir"), " ", given, "; to continue '",
                    c.resume_dir, "' there, remove them or choose another directory");
    }
  }
}

// Note [Checkpoint failures]
// A checkpoint that cannot be written (a full disk, EFBIG) never leaves a partial one behind
// (save_checkpoint removes its DIR/step-N.tmp) and is reported with the step it was for and the
// newest checkpoint still on disk. What happens to the run depends on which one failed:
//   - the final one (after the last step, the periodic one of that step included): the run is
//     over and its result must not be lost with it: fit() returns as usual, on_finish runs (the
//     GPT's sample and --export), and the error is in FitResult::output_errors, which ditto-train
//     prints after the final line (exit 1, as for a --trace that could not be written);
//   - a periodic one (checkpoint_every): the run stops with the error (exit 1), as nanoGPT's
//     train.py does when torch.save raises and Lightning's ModelCheckpoint does: a run that went on
//     would keep training for hours with no checkpoint it could resume from, on a disk that is
//     still full at its end; the older checkpoint is left, and --resume continues from it;
//   - a graceful stop's (SIGTERM, Ctrl-C): the error, as that checkpoint was the stop's point.

/// Which checkpoint save_or_report saves: one every checkpoint_every steps, the one after the
/// last step, or a graceful stop's.
enum class CheckpointKind { periodic, final, stop };

/// Rank 0's save of the checkpoint of step `step` (Note [Checkpoint failures]): a
/// failed periodic or stop checkpoint ends the run (an Error saying which step was not written
/// and the newest on disk); a failed final one is recorded in `res.output_errors`, so that the
/// result, on_finish (the sample, the exports) and the caller's report still come.
template <typename Save>
void save_or_report(const TrainerConfig& c, std::int64_t step, CheckpointKind kind, FitResult& res,
                    const std::string& resumed_from, const Save& save) {
  try {
    save();
  } catch (const InvalidArgument&) {  // the settings' (an alias of no parameter): not the disk's
    throw;
  } catch (const std::exception& e) {
    const std::string& dir = c.checkpoint_dir;
    std::string newest = "none";
    try {
      std::string latest = io::read_file(dir + "/latest", 4096, "resume");
      while (!latest.empty() && (latest.back() == '\n' || latest.back() == ' ')) latest.pop_back();
      if (!latest.empty()) newest = dir + "/" + latest;
    } catch (const std::exception&) {  // none yet: "none"
    }
    // --resume A --checkpoint B: none in B yet, but A's is on disk (tester: "none" sent the user
    // to start over).
    if (newest == "none" && !resumed_from.empty())
      newest = resumed_from + " (the checkpoint this run resumed from)";
    const std::string what = detail::cat(c.name_of("checkpoint_dir"), ": the ",
                                         kind == CheckpointKind::final  ? "final checkpoint"
                                         : kind == CheckpointKind::stop ? "stop checkpoint"
                                                                        : "checkpoint",
                                         " of step ", step, " was not written: ", e.what(),
                                         "; newest checkpoint on disk: ", newest);
    if (kind == CheckpointKind::periodic)
      throw Error(what + " (the run stops, as nanoGPT's does when torch.save fails: free space "
                         "and resume from it)");
    if (kind == CheckpointKind::stop) throw Error(what);
    res.output_errors.push_back(what);
  }
}

/// The settings every rank of a run must share (check_ranks_agree at fit()'s start): the caller's
/// (TrainerConfig::rank_settings) first, then what the model, the data, the loop and the
/// collectives depend on, named as the user knows them, and the extensions'.
RankSettings agreed_settings(const TrainerConfig& c, const DataSource& data) {
  auto g = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  std::ostringstream hidden;
  for (std::size_t i = 0; i < c.hidden.size(); ++i) hidden << (i ? "," : "") << c.hidden[i];
  RankSettings s = c.rank_settings;
  s.insert(s.end(),
           {{c.name_of("backend"), c.backend},
            {c.name_of("trainer"), trainer_kind_name(c.trainer)},
            {c.name_of("determinism"), determinism_name(c.determinism)},
            {c.name_of("dtype"), dtype_name(c.dtype)},
            {c.name_of("model_name"), c.model_name},
            {c.name_of("make_model"), c.make_model ? "set" : "unset"},
            {c.name_of("hidden"), hidden.str()},
            {"data inputs", std::to_string(data.num_inputs())},
            {"data outputs", std::to_string(data.num_outputs())},
            {c.name_of("optimizer"), c.optimizer},
            {c.name_of("lr"), g(c.effective_lr())},
            {c.name_of("momentum"), g(c.momentum)},
            {c.name_of("weight_decay"), g(c.weight_decay)},
            {c.name_of("loss"), c.loss},
            {c.name_of("batch_size"), std::to_string(c.batch_size)},
            {c.name_of("epochs"), std::to_string(c.epochs)},
            {c.name_of("max_iters"), std::to_string(c.max_iters)},
            {c.name_of("eval_interval"), std::to_string(c.eval_interval)},
            {c.name_of("eval_iters"), std::to_string(c.eval_iters)},
            {c.name_of("eval_only"), c.eval_only ? "true" : "false"},
            {c.name_of("eval_batch_size"), std::to_string(c.eval_batch_size)},
            {c.name_of("seed"), std::to_string(c.seed)},
            {c.name_of("micro_shards"), std::to_string(c.micro_shards)},
            {c.name_of("bucket_cap_mb"), g(c.bucket_cap_mb)},
            {c.name_of("grad_clip"), g(c.grad_clip)},
            {c.name_of("zero_stage"), std::to_string(c.zero_stage)},
            {c.name_of("grad_accum_steps"), std::to_string(c.grad_accum_steps)},
            {c.name_of("dry_run"), c.dry_run ? "true" : "false"},
            {c.name_of("checkpoint_dir"), c.checkpoint_dir.empty() ? "unset" : "set"},
            {c.name_of("checkpoint_every"), std::to_string(c.checkpoint_every)},
            {c.name_of("resume_dir"), c.resume_dir},
            {c.name_of("comm_timeout_ms"), std::to_string(c.comm_timeout_ms)},
            {c.name_of("allow_nonfinite_loss"), c.allow_nonfinite_loss ? "true" : "false"}});
  for (const auto& [k, v] : data.checkpoint_config()) s.emplace_back("data " + k, v);
  for (const auto& [k, v] : c.checkpoint_settings) s.emplace_back(k, v);
  for (const auto& e : c.extensions)
    for (auto& kv : e->settings(c)) s.push_back(std::move(kv));
  // Each name once, the first entry kept: the caller's c.rank_settings come first and name some
  // of these too (ditto-train's --lr, --batch-size, --checkpoint, as the user wrote them).
  // settings_disagreement compares a name given twice occurrence by occurrence, but one entry
  // per name is what a reader of the exchanged settings expects (tester C, C2).
  RankSettings unique;
  std::set<std::string> names;
  for (auto& kv : s)
    if (names.insert(kv.first).second) unique.push_back(std::move(kv));
  return unique;
}

/// After optimizer step `step` (0-based): stops the run on a NaN or inf loss (its share of it
/// on a ddp rank) unless config.allow_nonfinite_loss; `where` is the position in the epoch.
void check_loss(const TrainerConfig& c, Replica& rep, double loss_sum, std::int64_t rows,
                std::int64_t step, const std::string& where) {
  if (std::isfinite(loss_sum) || c.allow_nonfinite_loss) return;
  std::ostringstream rank;
  if (Communicator* comm = rep.communicator()) rank << " on rank " << comm->rank();
  const double loss = rows > 0 ? loss_sum / static_cast<double>(rows) : loss_sum;
  throw Error(detail::cat("Trainer: step ", step, where, ": the training loss", rank.str(), " is ",
                          std::isnan(loss) ? "nan"
                          : loss > 0       ? "inf"
                                           : "-inf",
                          ", expected a finite loss (the model diverged or the data holds "
                          "extreme values: lower the learning rate, clip the gradients, or set ",
                          c.name_of("allow_nonfinite_loss"), " to keep going)"));
}

/// fit()'s checks of the settings on `devices` devices (ranks) before the backend, which
/// Trainer::check makes too: check_devices, and fast mode's rows of every micro-step of every
/// rank (check_micro_batch_rows, which Replica::step applies to each batch) for the shortest
/// batch the run reaches, not only for batch_size: an epoch's last batch when the training rows
/// are not a multiple of it (DataSource::shortest_batch_rows; in iteration mode a source's
/// step_batch reaches it at step B - 1 of every B, B = batches_per_epoch). Before, a setting
/// refused only there was accepted by Trainer::check (ditto-train's out-of-memory hint offered
/// it) and by fit() until the end of the first epoch.
void check_settings(const TrainerConfig& c, const DataSource& data, long long devices) {
  check_devices(c, devices);
  if (c.eval_only || c.grad_accum_steps == 1) return;  // no step, or no split
  const std::int64_t batches = data.batches_per_epoch(c.batch_size);
  const bool reached = batches > 0 && (c.max_iters > 0 ? c.max_iters >= batches : c.epochs >= 1);
  if (reached)
    check_micro_batch_rows(c, static_cast<int>(devices), data.shortest_batch_rows(c.batch_size));
}

}  // namespace

/// Before optimizer step `step` (counted over the whole run, resumed runs included): the
/// backend's step (faults, trace), the model's (dropout masks) and the schedule's learning rate.
void Trainer::begin_step(Run& run, Replica& rep, std::int64_t step) const {
  run.be->begin_step(step);
  rep.model().set_step(step);
  if (config_.lr_schedule) rep.optimizer().set_lr(config_.lr_schedule(step));
}

bool Trainer::stop_due(Run& run, Replica& rep, std::int64_t done) const {
  if (!config_.stop) return false;
  const int value = config_.stop->load();
  const bool asked = value != 0;
  if (run.processes) {  // the ranks agree, on the stop and on its value (the asked ranks' least)
    if (rep.sum_over_ranks(asked ? 1.0 : 0.0) == 0) return false;
    run.stop_value = static_cast<int>(
        rep.min_over_ranks(asked ? value : std::numeric_limits<std::int64_t>::max()));
    return true;
  }
  if (asked) {
    int no_value = 0;
    run.stop_value.compare_exchange_strong(no_value, value);  // before stop_at: read once due
    // ddp threads: a rank that sees the request after step `done` may be the last to finish
    // it, another already past this check and inside step done + 1 (which needs this rank's
    // collectives to end): every rank stops after done + 1, which none has passed. dp: here.
    std::int64_t none = std::numeric_limits<std::int64_t>::max();
    run.stop_at.compare_exchange_strong(none, run.barrier ? done + 1 : done);
  }
  return done >= run.stop_at.load();
}

void Trainer::last_step_begins(Run& run, Replica& rep) const {
  if ((run.processes || rep.lead()) && callbacks_.on_last_step) callbacks_.on_last_step();
}

void Trainer::stop_begins(Run& run, Replica& rep, FitResult& res, std::int64_t step,
                          bool saved) const {
  if (!res.stopped) return;
  res.stop_signal = run.stop_value.load();  // stop_due's, agreed by the ranks
  if ((run.processes || rep.lead()) && callbacks_.on_stop) callbacks_.on_stop(step, saved);
}

void Trainer::stop_checkpoint_written(Replica& rep, const FitResult& res, std::int64_t step,
                                      std::int64_t saved_step, const std::string& path) const {
  // saved_step: the stop's own checkpoint, or the periodic one of the step it stopped after.
  if (res.stopped && rep.lead() && saved_step == step && !path.empty() &&
      callbacks_.on_stop_checkpoint)
    callbacks_.on_stop_checkpoint(path, step);
}

bool Trainer::logs_step(std::int64_t step) const {
  return config_.log_interval > 0 && !config_.dry_run && step % config_.log_interval == 0;
}

void Trainer::report_step(Run& run, Replica& rep, StepMetrics m, double loss_sum,
                          double vtime_s) const {
  if (!rep.lead() || !callbacks_.on_step) return;
  const std::int64_t rows = rep.rows_of(m.samples);
  m.loss = rows > 0 ? loss_sum / static_cast<double>(rows) : 0.0;
  if (run.timed && run.meter && vtime_s > 0) {
    m.predicted_time_s = vtime_s;
    const MfuPeak peak = run.meter->peak();
    m.peak_flops = peak.flops;
    m.peak_name = peak.name;
    if (config_.flops_per_sample > 0 && m.peak_flops > 0)
      m.mfu = config_.flops_per_sample * static_cast<double>(m.samples) /
              (vtime_s * run.n_dev * m.peak_flops);
  }
  callbacks_.on_step(m);
}

Trainer::Trainer(TrainerConfig config, std::shared_ptr<DataSource> data, TrainerCallbacks callbacks)
    : config_(std::move(config)), data_(std::move(data)), callbacks_(std::move(callbacks)) {
  DITTO_CHECK(data_ != nullptr, "Trainer: data: expected a data source, got null");
  validate(config_);
  check_mlp_sizes(config_, *data_);
}

Trainer::~Trainer() = default;

TrainerState Trainer::initial_state() const {
  const TrainerConfig& c = config_;
  TrainerState ts;  // the run's position: saved by checkpoints, restored by a resume
  ts.seed = c.seed;
  const int devices = dist::is_initialized() ? dist::world_size() : c.devices;
  ts.config = {{"model", model_name(c, *data_)},
               {"optimizer", c.optimizer},
               {"loss", c.loss},
               {"batch_size", std::to_string(c.batch_size)},
               {"seed", std::to_string(c.seed)},
               {"determinism", determinism_name(c.determinism)},
               {"micro_shards", std::to_string(c.micro_shards)},
               {"devices", std::to_string(devices)}};
  for (const auto& [k, v] : data_->checkpoint_config()) ts.config[k] = v;
  for (const auto& [k, v] : c.checkpoint_settings) ts.config[k] = v;
  if (c.max_iters > 0) ts.config["loop"] = "iterations";  // epoch mode records none (as before)
  if (c.dtype != DType::f32) ts.config["dtype"] = dtype_name(c.dtype);  // f32 records none
  return ts;
}

TrainerState Trainer::resume(Replica& rep, const TrainerState& fresh, bool lead, bool report) {
  std::set<std::string> may_differ;  // bitwise results do not depend on the device count
  if (config_.determinism == Determinism::bitwise) may_differ.insert("devices");
  // Fast mode does not shard the batch (options.cpp: --micro-shards "does nothing in this run"):
  // a resume with another value trains the same steps (tester: it was refused).
  else
    may_differ.insert("micro_shards");
  std::ostringstream quiet;  // the other ranks load the same checkpoint quietly
  std::ostream& log = !lead ? quiet : config_.log ? *config_.log : std::cerr;
  // Checkpoints written before the data's fingerprint was recorded have none: accepted, with
  // a warning (a fingerprint that differs is refused).
  const std::map<std::string, std::string> may_be_missing{
      {"data_fnv1a", "the data's fingerprint (that this run trains on the checkpoint's data)"}};
  // An f32 run records no dtype: a checkpoint without one is f32 (both values named).
  TrainerState ts = resume_checkpoint(config_.resume_dir, rep.model(), rep.optimizer(),
                                      fresh.config, may_differ, log, may_be_missing,
                                      {{"dtype", dtype_name(DType::f32)}}, config_.field_names);
  if (config_.max_iters > 0 && !config_.eval_only)  // eval_only evaluates any step
    DITTO_CHECK(ts.step <= config_.max_iters, config_.name_of("resume_dir"),
                ": the checkpoint is past step ", ts.step, ", expected ",
                config_.name_of("max_iters"), " >= ", ts.step, ", got ", config_.max_iters);
  else if (ts.batch == 0)  // at the end of epoch ts.epoch (1-based)
    DITTO_CHECK(ts.epoch <= config_.epochs, config_.name_of("resume_dir"),
                ": the checkpoint is past the end of epoch ", ts.epoch, ", expected ",
                config_.name_of("epochs"), " >= ", ts.epoch, ", got ", config_.epochs);
  else  // inside epoch ts.epoch + 1: fewer epochs would end the run on a partial epoch
    DITTO_CHECK(ts.epoch < config_.epochs, config_.name_of("resume_dir"),
                ": the checkpoint is inside epoch ", ts.epoch + 1, " (after batch ", ts.batch,
                "), expected ", config_.name_of("epochs"), " >= ", ts.epoch + 1, ", got ",
                config_.epochs);
  // Only a resume that every check let through is reported ("resumed from ...").
  if (report && lead && callbacks_.on_resume) callbacks_.on_resume(config_.resume_dir, ts);
  return ts;
}

void Trainer::plan_run(Run& run, std::string& name, BackendOptions& bopts) const {
  const TrainerConfig& c = config_;
  DITTO_CHECK(!run.processes || c.trainer == TrainerKind::ddp, c.name_of("trainer"),
              ": under mpirun each process is one rank, which needs ddp (DataParallel drives "
              "every device from one process), got '",
              trainer_kind_name(c.trainer), "'");
  run.n_dev = static_cast<int>(run_devices(c));
  name = resolve_backend_name(c.backend);
  // A dry run (Note [Dry run], backend_sim/sim_backend.h) prices the whole cluster in one
  // process; the backend must run dry (init_backend refuses it otherwise) and price the work.
  DITTO_CHECK(!c.dry_run || !run.processes, c.name_of("dry_run"),
              ": expected one process "
              "(a dry run prices the whole cluster in one), got mpirun with ",
              dist::world_size(), " processes");
  // Under mpirun a process holds the one device of its rank: a backend of virtual devices
  // makes only that one, one of physical devices sees every device of its node and the rank
  // takes its local rank's (BackendOptions::one_rank_per_process).
  if (!run.processes) bopts.device_count = run.n_dev;
  bopts.one_rank_per_process = run.processes;
  if (c.memory_capacity) bopts.memory_capacity = *c.memory_capacity;
  bopts.dry_run = c.dry_run;
  bopts.allow_tf32 = c.allow_tf32;
  const RunPlan plan{name, run.processes, run.processes ? dist::world_size() : 1, run.n_dev};
  for (const auto& e : c.extensions) e->plan(c, plan, bopts);
}

void Trainer::check(TrainerConfig config, std::shared_ptr<DataSource> data) {
  const Trainer t(std::move(config), std::move(data));  // the constructor's validation
  Run run;
  run.processes = dist::is_initialized();
  std::string name;
  BackendOptions bopts;
  t.plan_run(run, name, bopts);                    // fit()'s first step
  check_settings(t.config_, *t.data_, run.n_dev);  // and its second's, before the backend
}

FitResult Trainer::fit() {
  // fit() restarts the process-wide backend (init_backend): a second run at the same time would
  // pull the devices from under the first one.
  static std::atomic<bool> running{false};
  DITTO_CHECK(!running.exchange(true),
              "Trainer::fit: another fit() is running in this process "
              "(it owns the process-wide backend): expected one fit() at a time");
  // A relative checkpoint_dir is resolved once, here: a chdir during the run (a callback's) does
  // not move the checkpoints. The caller's path is put back when fit() returns.
  struct Done {
    std::string& dir;
    std::string given;
    ~Done() {
      dir = std::move(given);
      running = false;
    }
  } done{config_.checkpoint_dir, config_.checkpoint_dir};
  if (!config_.checkpoint_dir.empty()) {
    std::error_code ec;  // (no working directory: the path as given, which then fails as before)
    const std::filesystem::path abs = std::filesystem::absolute(config_.checkpoint_dir, ec);
    if (!ec) config_.checkpoint_dir = abs.string();
  }
  const TrainerConfig& c = config_;
  Run run;
  // Under mpirun (dist::init): one rank per process, the ranks = the processes.
  run.processes = dist::is_initialized();
  // torchrun's rendezvous: processes that disagree fail together, naming the setting, before
  // anything of the run (the backend, a communicator they could not share). A process that
  // refuses its own settings in one of the steps below (a backend it cannot start, a path that
  // rank 0 alone cannot write) sends its error in that step's exchange instead, so the others
  // fail at once naming it rather than wait for it (check_ranks_agree with `refused`). Each
  // exchange of agreeing processes is one 24-byte allgather.
  const std::int64_t timeout_ms =
      c.comm_timeout_ms > 0 ? c.comm_timeout_ms : CommOptions{}.timeout_ms;
  auto step = [&](const RankSettings& settings, const std::function<void()>& checks) {
    std::exception_ptr refused;
    try {
      checks();
    } catch (...) {
      if (!run.processes) throw;
      refused = std::current_exception();
    }
    if (run.processes) check_ranks_agree(settings, timeout_ms, refused);
  };
  BackendOptions bopts;
  std::string name;
  step(agreed_settings(c, *data_), [&] { plan_run(run, name, bopts); });  // the settings alone
  step({}, [&] {  // the backend and the output paths
    // After the settings agreed (a process's own micro_shards may not fit the devices because it
    // disagrees: that is said first); before the backend, where a bad split costs nothing.
    check_settings(c, *data_, run.n_dev);
    try {
      run.be = &init_backend(name, bopts);
    } catch (const InvalidArgument& e) {
      if (!c.dry_run) throw;
      throw InvalidArgument(detail::cat(c.name_of("dry_run"),
                                        ": expected a backend that runs "
                                        "dry (BackendOptions::dry_run), got backend '",
                                        name, "': ", e.what()));
    }
    Backend& be = *run.be;
    DITTO_CHECK(!c.dry_run || be.extension<CostModelExtension>(), c.name_of("dry_run"),
                ": expected a backend with a cost model to price the steps it does not run "
                "(CostModelExtension), got backend '",
                be.name(), "'");
    if (!run.processes)
      run.devs = ditto::devices(be.name(), run.n_dev);
    else
      run.devs = {Device(be.name(), dist::local_rank() % be.device_count())};
    // The communicators the run makes take the timeout in their CommOptions (fit_ddp's,
    // DataParallelOptions::comm_timeout_ms): every backend's honour it (cuda: its host-side call
    // matching and its watched waits on NCCL work, then ncclCommAbort). A backend with faults
    // (sim) also gets it for every communicator it makes, as before.
    if (c.comm_timeout_ms != 0)
      if (auto* fx = be.extension<FaultExtension>()) fx->set_comm_timeout(c.comm_timeout_ms);
    for (const auto& e : c.extensions) e->configure(c, run.context());
    // Before training: a bad path must not cost it.
    check_output_paths(c, done.given, dist::rank() == 0);
  });
  // ddp reports its start before any rank builds its replica; rank 0's callback may refuse too
  // (e.g. an output file it cannot open).
  if (c.trainer == TrainerKind::ddp && callbacks_.on_start)
    step({}, [&] {
      if (dist::rank() == 0)
        callbacks_.on_start({run.be->name(), run.n_dev, c.determinism, TrainerKind::ddp,
                             run.processes, model_name(c, *data_), 0, c.effective_lr()});
    });

  try {
    return c.trainer == TrainerKind::ddp ? fit_ddp(run) : fit_dp(run);
  } catch (...) {
    // A failed run can leave kernels queued on the devices' default streams (launched before
    // the failure, the failing rank's own included: the host thread threw, its stream goes on).
    // No kernel of this run may outlive fit(): the caller may exit at once, and a kernel still
    // running on the backend's threads while the process's libraries shut down (the BLAS's,
    // CUDA's) crashed ditto-train after a clean error (TrainerGpt.AFailedRunLeavesNoKernel...).
    // Side streams (DDP's, ZeRO's) drain in their owners' destructors. Errors kept on the
    // streams are this failure's.
    if (run.be)
      for (const Device& d : run.devs) {
        try {
          run.be->default_stream(d.index).synchronize();
        } catch (...) {  // the failure being thrown is the one to report
        }
      }
    // What the extensions keep of the failed run (the trace up to the failure: what filled the
    // device is what an out-of-memory run's user needs to see).
    if (run.be)
      for (const auto& e : c.extensions) try {
          e->failed(c, run.context());
        } catch (...) {  // likewise
        }
    throw;
  }
}

void Trainer::finish(Run& run, FitResult& res) {
  const TrainerConfig& c = config_;
  Backend& be = *run.be;
  res.backend = be.name();
  res.devices = run.n_dev;
  res.determinism = c.determinism;
  res.dtype = c.dtype;
  res.trainer = c.trainer;
  res.epochs = c.max_iters > 0 ? 0 : c.epochs;
  res.max_iters = c.max_iters;
  res.dry_run = c.dry_run;
  // Iteration mode's losses are its evaluations'; epoch mode's training loss is an epoch's.
  res.has_train_loss = c.max_iters > 0 ? c.eval_iters > 0 : c.epochs > 0;
  res.has_eval = c.max_iters > 0 ? c.eval_iters > 0 : data_->eval_set().size() > 0;
  res.lead = dist::rank() == 0;
  if (!res.lead) return;
  if (!run.processes) {
    if (run.predicts(c) && run.meter) res.prediction = run.meter->prediction(res.train_time_s);
    // Memory while the run's replicas (dp) or communicators (ddp) are still alive.
    for (int d = 0; d < static_cast<int>(run.devs.size()); ++d) be.default_stream(d).synchronize();
    for (int d = 0; d < static_cast<int>(run.devs.size()); ++d)
      res.memory.push_back({run.devs[static_cast<std::size_t>(d)].str(), be.memory_stats(d),
                            d == 0 ? res.optimizer_state_bytes : 0});
  }
  for (const auto& e : c.extensions) e->finish(c, run.context(), res);
}

FitResult Trainer::fit_dp(Run& run) {
  Replica rep(config_, *data_, run.devs);
  TrainerState ts = initial_state();
  if (!config_.resume_dir.empty()) ts = resume(rep, ts, true);
  if (callbacks_.on_start)
    callbacks_.on_start({run.be->name(), run.n_dev, config_.determinism, TrainerKind::dp, false,
                         model_name(config_, *data_), rep.model().num_parameters(),
                         config_.effective_lr()});
  CostMeter meter(*run.be, run.n_dev, config_.dtype, config_.flops_per_sample, config_.determinism);
  run.meter = &meter;
  run.timed = run.predicts(config_);
  FitResult res =
      config_.max_iters > 0 ? train_iterations(run, rep, ts) : train_replica(run, rep, ts);
  state_ = ts;
  finish(run, res);
  return res;
}

FitResult Trainer::fit_ddp(Run& run) {
  CommOptions co;  // (fit() reported the start)
  co.determinism = config_.determinism;
  if (config_.comm_timeout_ms > 0) co.timeout_ms = config_.comm_timeout_ms;
  std::unique_ptr<CostMeter> meter;
  std::unique_ptr<RankBarrier> barrier;
  if (!run.processes) {  // the rank threads meet at each epoch's start and end
    meter = std::make_unique<CostMeter>(*run.be, run.n_dev, config_.dtype, config_.flops_per_sample,
                                        config_.determinism);
    barrier = std::make_unique<RankBarrier>(run.n_dev);
  }
  run.meter = meter.get();
  run.timed = run.predicts(config_) && meter;
  run.barrier = barrier.get();
  std::vector<FitResult> results(run.devs.size());
  // Each rank: its own replica (same seed; DDP broadcasts rank 0's parameters anyway) and
  // optimizer. Every rank resumes from the same checkpoint before DDP's first broadcast, so no
  // rank still reads it when rank 0 saves the next one; rank 0 saves, evaluates and reports.
  FitResult res;
  auto body = [&](Communicator& comm) {
    Replica rep(config_, *data_, comm);
    TrainerState ts = initial_state();
    if (!config_.resume_dir.empty() && run.processes) {
      // Each process reads its own DIR (node-local disks): they must have resumed the same
      // step, else their collectives would not match. A rank that cannot resume says why.
      std::exception_ptr refused;
      try {
        ts = resume(rep, ts, rep.lead(), /*report=*/false);
      } catch (...) {
        refused = std::current_exception();
      }
      const std::int64_t timeout =
          config_.comm_timeout_ms > 0 ? config_.comm_timeout_ms : CommOptions{}.timeout_ms;
      check_ranks_agree({{config_.name_of("resume_dir") + " (the step of the checkpoint each "
                                                          "rank resumed from)",
                          std::to_string(ts.step)}},
                        timeout, refused);
      if (rep.lead() && callbacks_.on_resume) callbacks_.on_resume(config_.resume_dir, ts);
    } else if (!config_.resume_dir.empty()) {
      ts = resume(rep, ts, rep.lead());
    }
    FitResult r =
        config_.max_iters > 0 ? train_iterations(run, rep, ts) : train_replica(run, rep, ts);
    comm.stream().synchronize();
    if (rep.lead()) state_ = ts;
    results[run.processes ? 0 : static_cast<std::size_t>(comm.rank())] = std::move(r);
  };
  launch_ranks(run.devs, co, run.barrier, body, [&] {  // the communicators still alive
    res = results[0];
    finish(run, res);
    for (std::size_t d = 0; d < res.memory.size() && d < results.size(); ++d)
      res.memory[d].optimizer_state_bytes = results[d].optimizer_state_bytes;
  });
  return res;
}

void Trainer::end_loop(Replica& rep, const TrainerState& ts, FitResult& res) {
  res.params_checksum = rep.checked_checksum();
  if (const optim::GradScaler* s = rep.grad_scaler()) {
    res.loss_scale = s->scale();
    res.skipped_steps = s->skipped_steps();
  }
  res.optimizer_state_bytes = rep.optimizer().state_bytes();
  res.steps = ts.step;
  if (rep.lead() && callbacks_.on_finish && !res.stopped) callbacks_.on_finish(rep);
}

FitResult Trainer::train_replica(Run& run, Replica& rep, TrainerState& ts) {
  const TrainerConfig& c = config_;
  rep.begin();
  const std::int64_t batches = data_->batches_per_epoch(c.batch_size);
  std::int64_t saved_step = c.resume_dir.empty() ? -1 : ts.step;
  const std::string resumed_from = resumed_checkpoint(c, ts.step);
  FitResult res;
  // A checkpoint holds the epoch's loss sum over every rank (rank 0 starts from it on resume).
  std::string saved_path;  // rank 0's, of saved_step
  auto checkpoint = [&](double loss_sum, CheckpointKind kind) {
    TrainerState saved = ts;
    if (ts.batch != 0) saved.epoch_loss_sum = rep.sum_over_ranks(loss_sum);  // every rank
    rep.prepare_checkpoint();                                                // every rank
    if (rep.lead())
      save_or_report(c, ts.step, kind, res, resumed_from, [&] {
        saved_path = save_checkpoint(c.checkpoint_dir, rep.model(), rep.optimizer(), saved, 2,
                                     c.checkpoint_aliases);
      });
    saved_step = ts.step;
  };
  const std::int64_t first_epoch = ts.epoch + 1;
  if (first_epoch > c.epochs) last_step_begins(run, rep);  // none to take: no stop can come
  for (int epoch = static_cast<int>(first_epoch); epoch <= c.epochs; ++epoch) {
    run.epoch_begin();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = rep.lead() ? ts.epoch_loss_sum : 0.0;  // this rank's share
    std::int64_t seen = ts.epoch_samples, steps = 0;
    for (std::int64_t i = ts.batch; i < batches; ++i) {
      data::Batch b = data_->batch(epoch - 1, i, c.batch_size);
      // A batch of no rows has nothing to train on (it "trained" with loss 0): refused naming it.
      DITTO_CHECK(!b.x.defined() || b.x.dim() == 0 || b.x.size(0) >= 1,
                  "Trainer: the data source's batch ", i, " of epoch ", epoch,
                  ": expected at least one row, got 0");
      // No stop is checked after the last step: the run is complete (Note [Graceful stop]).
      const bool last = epoch == c.epochs && i + 1 == batches;
      if (last) last_step_begins(run, rep);
      const bool logged = logs_step(ts.step);
      if (logged) run.step_mark_begin();
      const auto s0 = std::chrono::steady_clock::now();
      begin_step(run, rep, ts.step);
      const double step_loss = rep.step(b);
      check_loss(c, rep, step_loss, b.x.size(0), ts.step,
                 detail::cat(" (epoch ", epoch, ", batch ", i, " of ", batches, ")"));
      if (logged) {
        const double vt = run.step_mark_end();
        StepMetrics m;
        m.iter = ts.step;
        m.epoch = epoch;
        m.batch = i;
        m.batches = batches;
        m.samples = b.x.size(0);
        m.tokens = b.y.numel();
        m.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
        report_step(run, rep, m, step_loss, vt);
      }
      loss_sum += step_loss;
      seen += b.x.size(0);
      ++steps;
      ts.advance(batches, loss_sum, seen);  // the position after this step
      // The epoch's last step: its checkpoint comes with the epoch's loss, and the check for a
      // stop after its evaluation and line (below).
      if (i + 1 == batches) break;
      if (c.checkpoint_every > 0 && ts.step % c.checkpoint_every == 0)
        checkpoint(loss_sum, CheckpointKind::periodic);
      if (stop_due(run, rep, ts.step)) {
        res.stopped = true;
        break;
      }
    }
    if (res.stopped) {  // the epoch's losses are in the checkpoint; nothing is evaluated
      run.epoch_end(steps, seen);
      break;
    }
    const double total = rep.sum_over_ranks(loss_sum);
    res.train_loss = seen ? total / seen : 0.0;
    ts.train_loss = res.train_loss;  // the checkpoints after this epoch record it
    // The epoch's last step's checkpoint (the last step's: the final one), once the epoch's loss
    // is in ts: before, it was saved inside the loop and held the epoch before's, which a resumed
    // run then reported. Before the evaluation, as inside the loop: a failing evaluation does not
    // lose it; within the epoch's time, as the other checkpoints.
    const bool last_epoch = epoch == c.epochs;
    if (steps > 0 && c.checkpoint_every > 0 && ts.step % c.checkpoint_every == 0)
      checkpoint(0.0, last_epoch ? CheckpointKind::final : CheckpointKind::periodic);  // batch 0
    run.epoch_end(steps, seen);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.train_time_s += dt;
    if (rep.lead() && data_->eval_set().size() > 0)
      res.eval = rep.evaluate(data_->eval_set(), c.eval_batch_size);
    if (rep.lead() && callbacks_.on_epoch) {
      EpochMetrics m{epoch, ts.step, res.train_loss,          res.eval.loss, res.eval.accuracy,
                     seen,  dt,      dt > 0 ? seen / dt : 0.0};
      if (c.dry_run) {  // nothing ran: no losses, accuracy or wall-clock speed, only predictions
        m.dry_run = true;
        m.train_loss = m.val_loss = m.val_acc = m.epoch_time_s = m.samples_per_s = 0;
      }
      if (run.meter) {
        m.predicted_time_s = run.meter->last_epoch_s();
        m.predicted_samples_per_s = m.predicted_time_s > 0 ? seen / m.predicted_time_s : 0.0;
      }
      callbacks_.on_epoch(m);
    }
    // The check for a stop after the epoch's last step, once its line is out (before, a stop
    // there ended the run without it, and its resume starts at the next epoch); none after the
    // run's last step: the run is complete.
    if (steps > 0 && !last_epoch && stop_due(run, rep, ts.step)) {
      res.stopped = true;
      break;
    }
  }
  // No epoch ran (epochs 0, or the resume of a finished run): the model as it is, evaluated,
  // and the loss its last epoch trained with (not 0 as if untrained).
  if (static_cast<int>(first_epoch) > c.epochs && !res.stopped) {
    res.train_loss = ts.train_loss;
    if (rep.lead() && data_->eval_set().size() > 0)
      res.eval = rep.evaluate(data_->eval_set(), c.eval_batch_size);
  }
  stop_begins(run, rep, res, ts.step, saved_step == ts.step);
  if (!c.checkpoint_dir.empty() && ts.step != saved_step)  // stopped: each rank's share
    checkpoint(rep.lead() || res.stopped ? ts.epoch_loss_sum : 0.0,
               res.stopped ? CheckpointKind::stop : CheckpointKind::final);
  stop_checkpoint_written(rep, res, ts.step, saved_step, saved_path);
  end_loop(rep, ts, res);
  return res;
}

FitResult Trainer::train_iterations(Run& run, Replica& rep, TrainerState& ts) {
  const TrainerConfig& c = config_;
  rep.begin();
  std::int64_t saved_step = c.resume_dir.empty() ? -1 : ts.step;
  const std::string resumed_from = resumed_checkpoint(c, ts.step);
  std::string saved_path;  // rank 0's, of saved_step
  FitResult res;
  auto checkpoint = [&](CheckpointKind kind) {
    rep.prepare_checkpoint();  // every rank
    if (rep.lead())
      save_or_report(c, ts.step, kind, res, resumed_from, [&] {
        saved_path = save_checkpoint(c.checkpoint_dir, rep.model(), rep.optimizer(), ts, 2,
                                     c.checkpoint_aliases);
      });
    saved_step = ts.step;
  };
  auto eval_due = [&](std::int64_t s) {
    return c.eval_iters > 0 &&
           ((c.eval_interval > 0 && s % c.eval_interval == 0) || s == c.max_iters);
  };
  const std::int64_t first = ts.step;  // of this run (a resumed one starts later)
  std::int64_t interval_tokens = 0;
  double interval_s = 0;
  // The learning rate of the last step taken (of step 0 before it), as evaluations report it.
  double lr =
      c.lr_schedule ? c.lr_schedule(std::max<std::int64_t>(ts.step - 1, 0)) : rep.optimizer().lr();
  if (ts.step >= c.max_iters || c.eval_only) last_step_begins(run, rep);  // none to take
  for (;;) {
    // Every rank calls eval_loss_on_every_rank: under ddp each evaluates its rows where the loss
    // allows (Note [Evaluation in pieces], replica.cpp), else it returns at once; rank 0 reports.
    const bool evaluate = eval_due(ts.step) || (c.eval_only && c.eval_iters > 0);
    const double train_loss =
        evaluate ? rep.eval_loss_on_every_rank(*data_, EvalSplit::train, c.eval_iters, c.batch_size)
                 : 0.0;
    const double val_loss =
        evaluate ? rep.eval_loss_on_every_rank(*data_, EvalSplit::val, c.eval_iters, c.batch_size)
                 : 0.0;
    if (rep.lead() && evaluate) {
      EvalMetrics m;
      m.step = ts.step;
      m.max_iters = c.max_iters;
      m.dry_run = c.dry_run;      // nothing ran: no losses or wall-clock speed to report
      m.eval_only = c.eval_only;  // nothing trains: no learning rate to report
      m.train_loss = train_loss;
      m.val_loss = val_loss;
      m.lr = lr;
      m.tokens = interval_tokens;
      m.interval_time_s = interval_s;
      m.tokens_per_s = interval_s > 0 ? static_cast<double>(interval_tokens) / interval_s : 0.0;
      m.elapsed_s = res.train_time_s;
      const std::int64_t done = ts.step - first;
      m.eta_s = done > 0 ? res.train_time_s / static_cast<double>(done) *
                               static_cast<double>(c.max_iters - ts.step)
                         : 0.0;
      res.train_loss = m.train_loss;
      res.eval.loss = m.val_loss;
      interval_tokens = 0;
      interval_s = 0;
      if (callbacks_.on_eval) callbacks_.on_eval(m);
    }
    if (ts.step >= c.max_iters || c.eval_only) break;
    // Train up to the next evaluation (or the end); the meter and the clock skip evaluations.
    std::int64_t next = c.max_iters;
    if (c.eval_interval > 0)
      next = std::min(next, (ts.step / c.eval_interval + 1) * c.eval_interval);
    run.epoch_begin();
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t steps = 0, samples = 0, tokens = 0;
    for (; ts.step < next; ++steps) {
      // Only this replica's rows are read (a ddp rank's: Note [Token batches]).
      const auto [lo, hi] = rep.row_range(c.batch_size);
      data::Batch b = data_->step_batch_rows(ts.step, c.batch_size, lo, hi);
      // No stop is checked after the last step: the run is complete (Note [Graceful stop]).
      const bool last = ts.step + 1 >= c.max_iters;
      if (last) last_step_begins(run, rep);
      const bool logged = logs_step(ts.step);
      if (logged) run.step_mark_begin();
      const auto s0 = std::chrono::steady_clock::now();
      begin_step(run, rep, ts.step);
      lr = rep.optimizer().lr();
      const double step_loss = rep.step(b);
      check_loss(c, rep, step_loss, b.x.size(0), ts.step, "");
      if (logged) {
        const double vt = run.step_mark_end();
        StepMetrics m;
        m.iter = ts.step;
        m.samples = b.x.size(0);
        m.tokens = b.y.numel();
        m.time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
        report_step(run, rep, m, step_loss, vt);
      }
      samples += b.x.size(0);
      tokens += b.y.numel();
      ++ts.step;
      if (c.checkpoint_every > 0 && ts.step % c.checkpoint_every == 0)  // the last step's: final
        checkpoint(last ? CheckpointKind::final : CheckpointKind::periodic);
      if (!last && stop_due(run, rep, ts.step)) {  // after the last step: the run is complete
        res.stopped = true;
        ++steps;
        break;
      }
    }
    run.epoch_end(steps, samples);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.train_time_s += dt;
    interval_s += dt;
    interval_tokens += tokens;
    if (res.stopped) break;
  }
  stop_begins(run, rep, res, ts.step, saved_step == ts.step);
  if (!c.checkpoint_dir.empty() && ts.step != saved_step && !c.eval_only)
    checkpoint(res.stopped ? CheckpointKind::stop : CheckpointKind::final);
  stop_checkpoint_written(rep, res, ts.step, saved_step, saved_path);
  end_loop(rep, ts, res);
  return res;
}

}  // namespace ditto::train
