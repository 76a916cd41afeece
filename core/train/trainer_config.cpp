// TrainerConfig's helpers, the names of TrainerKind, and the config's validation.
#include "core/train/trainer_config.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"
#include "core/train/grad_accumulation.h"
#include "core/train/trainer_extension.h"

namespace ditto::train {

const char* trainer_kind_name(TrainerKind k) { return k == TrainerKind::ddp ? "ddp" : "dp"; }

TrainerKind parse_trainer_kind(const std::string& text, const std::string& field) {
  if (text == "dp") return TrainerKind::dp;
  DITTO_CHECK(text == "ddp", field, ": expected dp or ddp, got '", text, "'");
  return TrainerKind::ddp;
}

std::string TrainerConfig::name_of(const std::string& field) const {
  auto it = field_names.find(field);
  return it != field_names.end() ? it->second : "TrainerConfig::" + field;
}

float TrainerConfig::effective_lr() const {
  if (lr) return *lr;
  return optimizer == "adam" ? 0.001f : 0.05f;
}

long long run_devices(const TrainerConfig& c) {
  if (dist::is_initialized()) return dist::world_size();
  long long devices = c.devices;  // a single process's: a simulated cluster may multiply them
  for (const auto& e : c.extensions)
    if (e) devices = e->devices(c, static_cast<int>(devices));
  return devices;
}

std::string devices_name(const TrainerConfig& c, long long devices) {
  if (dist::is_initialized()) return "mpirun -np";
  if (devices != c.devices) return c.name_of("devices") + " x " + c.name_of("nodes");
  return c.name_of("devices");
}

void check_devices(const TrainerConfig& c, long long devices) {
  const auto n = [&](const char* field) { return c.name_of(field); };
  if (c.determinism == Determinism::bitwise) {
    const std::int64_t k = c.micro_shards;
    DITTO_CHECK(k >= 1 && k <= kMaxMicroShards && (k & (k - 1)) == 0, n("micro_shards"),
                ": expected a power of two in 1..", kMaxMicroShards, ", got ", k);
    DITTO_CHECK(k >= devices, n("micro_shards"),
                ": bitwise mode gives every device at least one micro-shard: expected a power of "
                "two >= ",
                devices, " (the devices), got ", k,
                k == kDefaultMicroShards ? " (the default)" : "");
  }
  check_grad_accumulation(c, static_cast<int>(devices));  // before the backend: costs nothing
}

/// Every check of a config that needs no backend or data (Trainer's constructor).
void validate(const TrainerConfig& c) {
  auto n = [&](const char* field) { return c.name_of(field); };
  DITTO_CHECK(c.epochs >= 0, n("epochs"), ": expected >= 0, got ", c.epochs);
  DITTO_CHECK(!c.lr || (std::isfinite(*c.lr) && *c.lr > 0), n("lr"),
              ": expected a finite value > 0, got ", c.lr.value_or(0));
  DITTO_CHECK(c.batch_size >= 1, n("batch_size"), ": expected >= 1, got ", c.batch_size);
  DITTO_CHECK(c.eval_batch_size >= 1, n("eval_batch_size"), ": expected >= 1, got ",
              c.eval_batch_size);
  DITTO_CHECK(c.devices >= 1, n("devices"), ": expected >= 1, got ", c.devices);
  // A backend name nothing is registered under: refused here, before anything starts (fit()'s
  // init_backend said so, after the run's setup: exit status 1 in ditto-train, not 2).
  const std::vector<std::string> known = registered_backends();
  if (c.backend != "auto" && std::find(known.begin(), known.end(), c.backend) == known.end()) {
    std::string names;
    for (const std::string& k : known) names += k + ", ";
    throw InvalidArgument(
        detail::cat(n("backend"), ": expected one of ", names, "auto, got '", c.backend, "'"));
  }
  DITTO_CHECK(!c.memory_capacity || *c.memory_capacity > 0, n("memory_capacity"),
              ": expected bytes > 0, got 0");
  DITTO_CHECK(c.comm_timeout_ms >= 0 && c.comm_timeout_ms <= kMaxCommTimeoutMs,
              n("comm_timeout_ms"), ": expected 0 (the communicators' own) to ", kMaxCommTimeoutMs,
              " ms (2^31, about 24.9 days), got ", c.comm_timeout_ms);
  DITTO_CHECK(c.make_loss || c.loss == "cross-entropy" || c.loss == "mse", n("loss"),
              ": expected cross-entropy or mse, got '", c.loss, "'");
  DITTO_CHECK(c.make_optimizer || c.optimizer == "sgd" || c.optimizer == "adam", n("optimizer"),
              ": expected sgd or adam, got '", c.optimizer, "'");
  DITTO_CHECK(c.checkpoint_every >= 0 && (c.checkpoint_every == 0 || !c.checkpoint_dir.empty()),
              n("checkpoint_every"), ": expected >= 0, with ", n("checkpoint_dir"), " DIR, got ",
              c.checkpoint_every, c.checkpoint_dir.empty() ? " without " : "",
              c.checkpoint_dir.empty() ? n("checkpoint_dir") : "");
  // A dry run holds no tensor data: its checkpoints would be all zeros, and saving them would
  // rotate a real run's checkpoints out of the directory.
  DITTO_CHECK(!c.dry_run || c.checkpoint_dir.empty(), n("checkpoint_dir"), ": expected none with ",
              n("dry_run"),
              " (a dry run holds no tensor data, so its "
              "checkpoints would be all zeros), got '",
              c.checkpoint_dir, "'");
  DITTO_CHECK(c.bucket_cap_mb > 0 && std::isfinite(c.bucket_cap_mb), n("bucket_cap_mb"),
              ": expected a finite size in MiB > 0, got ", c.bucket_cap_mb);
  DITTO_CHECK(c.max_iters >= 0, n("max_iters"), ": expected >= 0 (0: epoch mode), got ",
              c.max_iters);
  DITTO_CHECK(c.eval_interval >= 0, n("eval_interval"),
              ": expected >= 0 (0: at the end only), "
              "got ",
              c.eval_interval);
  DITTO_CHECK(c.eval_iters >= 0, n("eval_iters"), ": expected >= 0 (0: no evaluation), got ",
              c.eval_iters);
  DITTO_CHECK(!c.eval_only || c.max_iters > 0, n("eval_only"), ": expected iteration mode (",
              n("max_iters"), " > 0: nanoGPT's loop, whose evaluation it runs), got ",
              n("max_iters"), " ", c.max_iters);
  DITTO_CHECK(!c.eval_only || c.checkpoint_dir.empty(), n("checkpoint_dir"),
              ": expected none "
              "with ",
              n("eval_only"), " (it trains nothing and writes no checkpoint), got '",
              c.checkpoint_dir, "'");
  DITTO_CHECK(std::isfinite(c.grad_clip) && c.grad_clip >= 0, n("grad_clip"),
              ": expected a finite max_norm >= 0 (0: no clipping), got ", c.grad_clip);
  DITTO_CHECK(c.dtype == DType::f32 || c.dtype == DType::bf16 || c.dtype == DType::f16, n("dtype"),
              ": expected f32, bf16 or f16, got ",
              is_valid_dtype(c.dtype) ? dtype_name(c.dtype) : "an invalid DType");
  DITTO_CHECK(c.zero_stage == 0 || c.zero_stage == 1, n("zero_stage"),
              ": expected 0 (none) or 1 (optimizer state sharded), got ", c.zero_stage);
  DITTO_CHECK(c.zero_stage == 0 || c.trainer == TrainerKind::ddp, n("zero_stage"), " ",
              c.zero_stage, " needs ", n("trainer"),
              " ddp (ZeRO shards the optimizer over "
              "DDP's ranks), got ",
              trainer_kind_name(c.trainer));
  DITTO_CHECK(c.log_interval >= 0, n("log_interval"),
              ": expected >= 0 (0: no progress "
              "lines), got ",
              c.log_interval);
  DITTO_CHECK(std::isfinite(c.flops_per_sample) && c.flops_per_sample >= 0, n("flops_per_sample"),
              ": expected a finite value >= 0 (0: unknown), got ", c.flops_per_sample);
  DITTO_CHECK(c.grad_accum_steps >= 1, n("grad_accum_steps"), ": expected >= 1, got ",
              c.grad_accum_steps);
  // torch.optim.SGD's "Invalid momentum value" / "Invalid weight_decay value".
  DITTO_CHECK(std::isfinite(c.momentum) && c.momentum >= 0, n("momentum"),
              ": expected a number >= 0, got ", c.momentum);
  DITTO_CHECK(std::isfinite(c.weight_decay) && c.weight_decay >= 0, n("weight_decay"),
              ": expected a number >= 0, got ", c.weight_decay);
  for (const auto& h : c.hidden)
    DITTO_CHECK(h > 0, n("hidden"), ": expected positive sizes, got ", h);
  for (const auto& e : c.extensions) {
    DITTO_CHECK(e != nullptr, n("extensions"), ": expected extensions, got a null one");
    e->validate(c);
  }
  // Against this process's devices (the extensions may multiply them: fit() checks the total).
  // Not under mpirun: there a refusal must reach the other processes, which only fit()'s
  // exchanges carry (a constructor that throws on one rank would leave the others waiting), and
  // processes that disagree on the settings must first hear that (Mpi.Communicator_np8).
  if (!dist::is_initialized()) check_devices(c, c.devices);
}

}  // namespace ditto::train
