// Replica: one replica of a training run (its model, optimizer and loss, wrapped in DataParallel
// or DistributedDataParallel): the two operations of the Trainer's loop (core/train/trainer.h),
// step() and evaluate(), which a custom loop may call directly; and the parameter checksum that
// two runs compare with.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/data/data_source.h"
#include "core/data/dataset.h"
#include "core/nn/loss.h"
#include "core/nn/module.h"
#include "core/optim/optimizer.h"
#include "core/runtime/device.h"
#include "core/runtime/tensor.h"
#include "core/train/metrics.h"
#include "core/train/trainer_config.h"

namespace ditto::optim {
class GradScaler;
class MasterWeights;
class ZeroRedundancyOptimizer;
}  // namespace ditto::optim

namespace ditto::parallel {
class DataParallel;
class DistributedDataParallel;
}  // namespace ditto::parallel

namespace ditto::train {

/// FNV-1a (64-bit) over the raw bytes of every parameter of `m` in its own dtype (f32: 4 bytes an
/// element, bf16 / f16: 2), in parameters() order, each NaN as its dtype's canonical NaN
/// (canonicalize_nans, Note [NaN bits] in core/runtime/nan_bits.h): two runs compare with one
/// number (ditto-train's params_checksum). For an f32 model without NaNs these are the bytes of
/// flat_parameters, so the checksum of every f32 run is unchanged by mixed precision. Blocks.
std::uint64_t params_checksum(nn::Module& m);

/// Every parameter of `m` converted to f32 (exact for bf16 / f16), in parameters() order,
/// concatenated on the host (blocks).
std::vector<float> flat_parameters(nn::Module& m);

/// One replica of a run: the model, optimizer and loss, built from the config's factories (the
/// same seed everywhere: replicas start equal) and, after begin(), wrapped in DataParallel over
/// every device (dp) or DistributedDataParallel on one rank (ddp). step() and evaluate() are the
/// loop's two operations; a custom loop may call them directly.
class Replica {
 public:
  /// dp: DataParallel over `devices` (the model on devices[0]).
  Replica(const TrainerConfig& config, const DataSource& data, std::vector<Device> devices);
  /// ddp: the rank `comm.rank()` of `comm`, on comm.device(). The loss divides by the global
  /// batch (Note [DDP loss scaling]), so the bits equal DataParallel's in bitwise mode.
  Replica(const TrainerConfig& config, const DataSource& data, Communicator comm);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  /// Wraps the model (ddp: broadcasts rank 0's parameters). Call after loading a checkpoint
  /// into model() and before the first step; step() calls it when not yet done.
  void begin();
  /// One optimizer step on global batch `b` (host tensors; a ddp rank takes its rows) in
  /// config.grad_accum_steps micro-steps (Note [Gradient accumulation],
  /// core/train/grad_accumulation.h: the same bits as one micro-step in bitwise mode), with the
  /// gradients clipped to config.grad_clip (optim::clip_grad_norm_) when it is > 0. Returns
  /// this replica's share of the batch's summed loss (mean loss x rows; dp: the whole batch;
  /// with micro-steps the sum of theirs, equal to K = 1's up to rounding). Throws
  /// InvalidArgument when the batch cannot be split in grad_accum_steps micro-steps (fast mode:
  /// fewer rows than micro-steps on a replica; check_micro_batch_rows).
  double step(const data::Batch& b);
  /// Iteration mode's evaluation (nanoGPT's estimate_loss) by this replica alone: the mean over
  /// k < iters of the loss of data.eval_batch(split, k, batch_size), the model in eval mode
  /// (set_training(false), restored after), no gradients; the same on any device count. dp:
  /// DataParallel's forward over its devices; ddp: a forward of the whole batch on this rank's
  /// one device (memory: the global batch's activations there), not a collective, so any rank
  /// may call it alone (TrainerCallbacks::on_finish, which runs on rank 0 only). Errors: the
  /// model's and the loss's on the batch, InvalidArgument naming eval_batch(split, k).
  double eval_loss(DataSource& data, EvalSplit split, std::int64_t iters, std::int64_t batch_size);
  /// The same loss, as the Trainer evaluates: under ddp where evaluates_in_pieces() a collective
  /// that every rank must call with the same arguments, each forwarding its own rows in pieces
  /// no larger than its training micro-steps and all_reducing the loss's row terms (Note
  /// [Evaluation in pieces], replica.cpp), the ranks first checking that eval_batch gave each of
  /// them the same batch (InvalidArgument on every rank, naming the rows and ranks, where not);
  /// otherwise rank 0 evaluates the whole batch alone and other ranks get 0. Returns rank 0's
  /// result on rank 0.
  double eval_loss_on_every_rank(DataSource& data, EvalSplit split, std::int64_t iters,
                                 std::int64_t batch_size);
  /// Whether eval_loss_on_every_rank runs on every rank of a ddp run (the loss has row terms:
  /// MSELoss, CrossEntropyLoss); false for dp and for a user's loss without them.
  bool evaluates_in_pieces() const;
  /// Mean loss and accuracy (argmax of the outputs against y's labels) over `ds`, in batches of
  /// `batch_size`, no gradients.
  Evaluation evaluate(const data::Dataset& ds, std::int64_t batch_size);
  /// The rows of a global batch of `n` rows this replica trains on: dp all n, ddp its rank's
  /// (DistributedDataParallel::local_rows; its micro-steps split those).
  std::int64_t rows_of(std::int64_t n) const;
  /// Those rows as [first, end) of the global batch: dp [0, n), ddp local_rows(n).
  std::pair<std::int64_t, std::int64_t> row_range(std::int64_t n) const;
  /// Sum of `v` over the ranks (ddp: an all_reduce in f32, as a checkpoint stores it); dp: v.
  double sum_over_ranks(double v);
  /// The smallest `v` over the ranks (ddp: an int64 all_reduce with ReduceOp::min); dp: v.
  std::int64_t min_over_ranks(std::int64_t v);
  /// Throws InvalidArgument when the ranks' parameters differ (ddp), naming the ranks.
  std::uint64_t checked_checksum();

  nn::Module& model() { return *model_; }
  /// The optimizer; with TrainerConfig::dtype bf16 / f16 an optim::MasterWeights over the
  /// factory's optimizer (Note [Master weights]).
  optim::Optimizer& optimizer() { return *opt_; }
  /// The f16 run's loss scaler (TrainerConfig::grad_scaler), else null.
  optim::GradScaler* grad_scaler() { return scaler_.get(); }
  bool lead() const { return !comm_ || comm_->rank() == 0; }
  Communicator* communicator() { return comm_ ? &*comm_ : nullptr; }
  /// Every rank, before the lead saves a checkpoint: ZeRO-1 gathers its sharded optimizer state
  /// to rank 0 in the unsharded layout (ZeroRedundancyOptimizer::consolidate_state_dict);
  /// nothing otherwise.
  void prepare_checkpoint();

 private:
  void build(const TrainerConfig& config, const DataSource& data, const Device& device);
  Tensor target(const Tensor& y, std::int64_t outputs, const Device& device) const;
  /// d(final)/d(loss) for Loss::backward: the GradScaler's scale (f16), else undefined (1).
  Tensor loss_grad(const Device& device) const;
  /// After backward: [master grads, unscale / inf check], clip, step, [scale update].
  void optimizer_step();
  /// Whether the optimizer's step reduces the gradients over the ranks itself (ZeRO-1's
  /// reduce_scatter), so that every micro-step's backward runs under no_sync.
  bool optimizer_reduces_gradients() const;

  const TrainerConfig& config_;
  std::vector<Device> devices_;
  std::optional<Communicator> comm_;
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> opt_;
  optim::MasterWeights* master_ = nullptr;          // opt_ itself when dtype is bf16 / f16
  optim::ZeroRedundancyOptimizer* zero_ = nullptr;  // opt_ itself with zero_stage 1 (ddp)
  std::unique_ptr<optim::GradScaler> scaler_;
  std::unique_ptr<nn::Loss> criterion_, eval_criterion_;
  /// The mean loss of eval batch `b` evaluated in pieces over the ranks (Note [Evaluation in
  /// pieces]); every rank calls it.
  Tensor eval_loss_in_pieces(const data::Batch& b);
  /// The rows of a piece of this rank's `rows` rows: at most a training micro-step's.
  std::int64_t eval_piece_rows(std::int64_t rows) const;
  /// eval_loss (every_rank false) and eval_loss_on_every_rank (true).
  double eval_loss_of(DataSource& data, EvalSplit split, std::int64_t iters,
                      std::int64_t batch_size, bool every_rank);
  /// Under ddp, before evaluating eval batch `k` in pieces: every rank's rows and a CRC-32 of
  /// its x and y, all_gathered; InvalidArgument on every rank where they differ.
  void check_same_eval_batch(const data::Batch& b, EvalSplit split, std::int64_t k);
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
};

}  // namespace ditto::train
