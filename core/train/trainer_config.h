// TrainerConfig: everything one training run is set up with (what ditto-train's options map to).
// The model, optimizer, loss and target encoding are built through factories, defaulting to the
// MLP / SGD or Adam / cross-entropy or MSE of ditto-train, so another model (a GPT over token
// windows) plugs in without a new loop. Trainer (core/train/trainer.h) validates it once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/loss.h"
#include "core/nn/module.h"
#include "core/numerics/determinism.h"
#include "core/numerics/micro_shards.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/optimizer.h"
#include "core/runtime/backend.h"
#include "core/runtime/device.h"
#include "core/runtime/tensor.h"

namespace ditto::train {

class TrainerExtension;

/// dp: torch.nn.DataParallel (one controller thread drives every device); ddp:
/// DistributedDataParallel (a thread per rank, or under mpirun a process per rank).
enum class TrainerKind : std::uint8_t { dp, ddp };
const char* trainer_kind_name(TrainerKind k);
/// "dp" or "ddp"; throws InvalidArgument naming `field` otherwise.
TrainerKind parse_trainer_kind(const std::string& text, const std::string& field = "trainer");

/// A model on `device` (every rank calls it with the same config: replicas start equal).
using ModelFactory = std::function<std::unique_ptr<nn::Module>(const Device& device)>;
/// An optimizer over `params` with learning rate `lr`.
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<nn::Parameter*> params, float lr)>;
using LossFactory = std::function<std::unique_ptr<nn::Loss>()>;
/// The loss's target for a batch's y (host tensor) given the model's `outputs` per row, on
/// `device` (default: the labels for cross-entropy, their one-hot f32 [N, outputs] for MSE).
using TargetFactory =
    std::function<Tensor(const Tensor& y, std::int64_t outputs, const Device& device)>;

struct TrainerConfig {
  // ---- backend and devices
  std::string backend{kDefaultBackend};  ///< a registered backend, or "auto"
  int devices = 4;  ///< devices (ranks) per node; under mpirun: ignored (the processes)
  /// Bytes per device of a backend of virtual devices (BackendOptions::memory_capacity); unset:
  /// an extension's (a device profile's memory: TrainerExtension::plan), else the backend's
  /// default (80 GiB).
  std::optional<std::size_t> memory_capacity;

  // ---- model, optimizer, loss
  std::vector<std::int64_t> hidden{128};  ///< default model: MLP features-hidden...-outputs
  ModelFactory make_model;                ///< unset: that MLP, seeded with `seed`
  std::string model_name;                 ///< checkpoint "model" setting; "": the MLP's sizes
  std::string optimizer = "sgd";          ///< sgd | adam (when make_optimizer is unset)
  std::optional<float> lr;                ///< unset: 0.05 for sgd, 0.001 for adam
  float momentum = 0.9f;                  ///< sgd
  float weight_decay = 0.0f;
  OptimizerFactory make_optimizer;
  std::string loss = "cross-entropy";  ///< cross-entropy | mse (when make_loss is unset)
  LossFactory make_loss;
  TargetFactory make_target;
  /// The model's backward does not read its output (nn::GPT's logits; configure_gpt sets it):
  /// the training step may then run a CrossEntropyLoss's forward and backward in one pass
  /// (CrossEntropyLoss::forward_backward, CUDA fast mode), its gradient written over the output.
  /// False (a model ending in, e.g., nn::ReLU saves its output for its backward): forward, then
  /// backward.
  bool loss_may_overwrite_output = false;

  // ---- the loop
  std::int64_t batch_size = 64;  ///< global batch (split over the devices)
  int epochs = 20;
  std::uint64_t seed = 0;  ///< initialisation and shuffling
  Determinism determinism = Determinism::bitwise;
  std::int64_t micro_shards = kDefaultMicroShards;
  TrainerKind trainer = TrainerKind::dp;
  double bucket_cap_mb = 25.0;  ///< ddp
  std::int64_t eval_batch_size = 512;

  // ---- iteration mode (nanoGPT's train.py loop): max_iters > 0 trains max_iters optimizer steps
  // on DataSource::step_batch(step) instead of `epochs` epochs, and evaluates the mean loss of
  // eval_iters fixed batches of each split (DataSource::eval_batch, batch_size rows each) with
  // the model in eval mode (set_training(false)) at step 0, every eval_interval steps and at the
  // end (TrainerCallbacks::on_eval). The model's step (Module::set_step) is the global step.
  std::int64_t max_iters = 0;      ///< 0: epoch mode
  std::int64_t eval_interval = 0;  ///< steps between evaluations; 0: at the end only
  std::int64_t eval_iters = 0;     ///< batches per split per evaluation; 0: no evaluation
  /// nanoGPT's eval_only: iteration mode without training. fit() builds (and resumes) the model,
  /// evaluates eval_iters batches of each split once at the resumed step (0 for a fresh run), then
  /// ends: no optimizer step, no checkpoint (checkpoint_dir must be empty), on_finish still
  /// called. Needs max_iters > 0 (iteration mode); a resumed step past max_iters is accepted.
  bool eval_only = false;
  /// Learning rate of step `it` (0-based), set with Optimizer::set_lr before that step (both
  /// modes); unset: the optimizer's own, constant (e.g. optim/lr_schedule.h's nanoGPT schedule).
  std::function<double(std::int64_t it)> lr_schedule;
  /// torch.nn.utils.clip_grad_norm_'s max_norm, applied between backward and the optimizer step
  /// (optim::clip_grad_norm_, both modes); 0: no clipping.
  double grad_clip = 0.0;
  /// A step whose training loss is NaN or inf stops the run with ditto::Error naming the step
  /// and the loss (torch.autograd.detect_anomaly's, llm.c's outlier check's stop), after that
  /// step's update and before any checkpoint of it; true: keep going. f16's GradScaler skips
  /// steps whose gradients overflow either way (their loss is finite).
  bool allow_nonfinite_loss = false;
  /// Steps between progress reports (TrainerCallbacks::on_step, StepMetrics; nanoGPT's
  /// log_interval): after steps 0, N, 2N, ... of the run (0-based); 0: none. Not in a dry run.
  std::int64_t log_interval = 0;
  /// The model's FLOPs per training row (forward and backward), for the MFU of StepMetrics and
  /// CostPrediction (nanoGPT's estimate_mfu: 6N + 12 L H Q T a token, times the block size);
  /// 0: unknown (the step's MFU is not reported; the prediction counts the GEMM FLOPs).
  double flops_per_sample = 0;

  // ---- GPT-2 scale (mixed precision, ZeRO-1, gradient accumulation, dry run)
  /// Storage dtype of the parameters, activations and gradients: f32, bf16 or f16. bf16 / f16
  /// are mixed precision as llm.c and torch.autocast: every kernel computes in f32 and rounds its
  /// outputs once to `dtype` (Note [Mixed precision], core/runtime/mixed_precision.h); the
  /// optimizer keeps f32 master weights and f32 state; DDP all-reduces the gradients in `dtype`;
  /// f16 adds dynamic loss scaling (grad_scaler, torch.cuda.amp.GradScaler).
  DType dtype = DType::f32;
  /// dtype f16 only: dynamic loss scaling (torch.amp.GradScaler's options and defaults: 2^16,
  /// growth 2 after 2000 clean steps, backoff 0.5; enabled = false turns it off). bf16 and f32
  /// use none (bf16 has f32's exponent range, as torch's autocast bf16 needs no scaler).
  optim::GradScalerOptions grad_scaler;
  /// ZeRO stage (llm.c's -z, torch's ZeroRedundancyOptimizer): 0 none; 1 every rank keeps 1/N of
  /// the optimizer state (f32 master weights and moments): gradients reduce_scatter, each rank
  /// updates its shard, parameters all_gather. ddp only.
  int zero_stage = 0;
  /// zero_stage 1: each chunk's reduce_scatter runs on a communication stream during the
  /// backward that completes the step's gradients, as soon as its parameters' grads are ready
  /// (optim::ZeroOptions::overlap_comm, DeepSpeed's overlap_comm, llm.c's behaviour; not with
  /// bitwise gradient accumulation, whose grads are final only after the fold). The same bits
  /// either way; false: every reduce_scatter after the backward, in the optimizer's step.
  bool zero_overlap_comm = true;
  /// Micro-steps per optimizer step (nanoGPT's gradient_accumulation_steps): each rank runs its
  /// share of the global batch in grad_accum_steps forward/backward passes, DDP's no_sync on all
  /// but the last. batch_size stays the global batch of one optimizer step. Bitwise mode: a
  /// power of two with micro_shards divisible by grad_accum_steps x devices, and the parameters
  /// come out the same bits as with 1 (Note [Gradient accumulation],
  /// core/train/grad_accumulation.h); fast mode: any value up to the smallest rank's rows.
  std::int64_t grad_accum_steps = 1;
  /// Run every step through the backend's cost model and memory accounting without executing
  /// kernels and without host memory for tensor data (BackendOptions::dry_run: a backend that
  /// runs dry and has a cost model, CostModelExtension; one process; loss values are then 0).
  /// No checkpoint_dir with it (Error: its checkpoints would be all zeros).
  bool dry_run = false;
  /// Fast-mode f32 matrix products may run on TF32 tensor cores (BackendOptions::allow_tf32;
  /// torch.backends.cuda.matmul.allow_tf32). Off by default: f32 stays strict f32. Bitwise mode
  /// ignores it.
  bool allow_tf32 = false;

  // ---- checkpoints (core/checkpoint/checkpoint.h)
  /// "": none; else saved at the end (and every N steps). A relative path is resolved once, at
  /// fit()'s start (std::filesystem::absolute): a chdir during fit() does not move the
  /// checkpoints. Without resume_dir (a fresh run) it must hold no checkpoint (DIR/latest or
  /// DIR/step-N): fit() refuses one that does before training (InvalidArgument naming DIR, the
  /// checkpoints found and resume_dir), as the fresh run's checkpoints would mix with the
  /// other run's; other files may be there.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;  ///< optimizer steps between checkpoints; 0: at the end only
  std::string resume_dir;             ///< "": fresh start
  /// A graceful stop (torchrun's SIGTERM, Ctrl-C): when *stop becomes non-zero (a signal
  /// handler may set it), the run ends after the optimizer step in progress, every rank after
  /// the same one, writes a checkpoint of that step into checkpoint_dir (when set) and returns
  /// with FitResult::stopped (no further evaluation, no on_finish); a request that comes during
  /// the run's last step lets the run complete (nothing is left to stop: the final evaluation,
  /// checkpoint and on_finish come, and FitResult::stopped is false). Null: never. Must outlive
  /// fit(). Under mpirun the ranks agree with one 8-byte all-reduce per step; in one process
  /// without a collective.
  const std::atomic<int>* stop = nullptr;
  /// More settings a checkpoint records and a resume must match (a GPT's config, the schedule),
  /// beside the Trainer's own ("model", "optimizer", "batch_size", ...) and the data source's.
  std::map<std::string, std::string> checkpoint_settings;
  /// Extra names of parameters in model.safetensors: {alias, parameter name}, each written as a
  /// copy of the parameter (safetensors has no shared tensors), e.g. {"lm_head.weight",
  /// "transformer.wte.weight"} for nanoGPT's tied head (save_checkpoint's aliases).
  std::vector<std::pair<std::string, std::string>> checkpoint_aliases;

  /// The communicators' timeout (ms; torch.distributed's init_process_group timeout): the
  /// CommOptions::timeout_ms of the communicators the run makes (ddp's, DataParallel's), on any
  /// backend, and through the backend's FaultExtension (core/runtime/extensions.h) where it has
  /// one (sim: every communicator it makes); under mpirun also the start-up agreement's. 0: the
  /// communicators' own (CommOptions::timeout_ms).
  std::int64_t comm_timeout_ms = 0;

  // ---- what the backend adds (core/train/trainer_extension.h)
  /// Extensions fit() calls at fixed points of the run: the simulator's cluster, stragglers,
  /// trace and faults are sim::SimRun (backend_sim/sim_run.h). Shared: a caller keeps its
  /// pointer to read the extension's report after fit().
  std::vector<std::shared_ptr<TrainerExtension>> extensions;
  /// More settings every rank of an mpirun job must agree on ({name, value}, e.g. a command
  /// line's options by their effective values), compared in fit()'s first step before the
  /// Trainer's own, so a difference is named as the caller knows it.
  std::vector<std::pair<std::string, std::string>> rank_settings;

  /// How errors name a field: {"batch_size", "--batch-size"} for a command line; a field not
  /// listed is named "TrainerConfig::<field>".
  std::map<std::string, std::string> field_names;
  /// Where skipped checkpoints are reported on resume (rank 0 only); null: std::cerr.
  std::ostream* log = nullptr;

  /// The name errors use for `field`.
  std::string name_of(const std::string& field) const;
  /// The learning rate in effect (lr, or the optimizer's default).
  float effective_lr() const;
};

/// The devices of a run of `c`: under mpirun (dist::is_initialized) the processes, else
/// c.devices as its extensions multiply them (a simulated cluster's nodes x devices).
long long run_devices(const TrainerConfig& c);

/// How messages name where a run's `devices` (run_devices') come from: "mpirun -np" under
/// mpirun (the world size: --devices does not set it there), c.name_of("devices") + " x " +
/// c.name_of("nodes") when a simulated cluster multiplies c.devices, else c.name_of("devices").
std::string devices_name(const TrainerConfig& c, long long devices);

/// The checks of `c` against the run's `devices`: bitwise mode's micro_shards a power of two in
/// 1..kMaxMicroShards and at least the devices (every device gets a micro-shard), and the
/// gradient accumulation's split (check_grad_accumulation). InvalidArgument naming the fields
/// (c.name_of). The Trainer's validation runs them on this process's devices (not under mpirun),
/// fit() on the total once the processes agree on the settings.
void check_devices(const TrainerConfig& c, long long devices);

}  // namespace ditto::train
