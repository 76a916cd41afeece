// Gradient accumulation (nanoGPT's gradient_accumulation_steps, DDP's no_sync): the rows of each
// micro-step of an optimizer step (micro_batch), the checks of TrainerConfig::grad_accum_steps
// against the devices and micro-shards (check_grad_accumulation), and the canonical tree over
// micro-steps that bitwise mode folds the micro-steps' gradients with (GradAccumulator).
// Replica::step (core/train/trainer.h) uses all three.
//
// Note [Gradient accumulation]
// One optimizer step consumes the global batch of B rows (TrainerConfig::batch_size) in K
// micro-steps (grad_accum_steps). Each micro-step runs forward, the loss and backward on a
// contiguous block of the batch; the loss divides by B (Loss::set_global_batch(B)), so every row
// contributes the same gradient term it would in one step of B rows (the per-row terms do not
// depend on which rows share the forward; dropout masks are keyed by the global row,
// Module::first_row, Note [Dropout masks]).
//
// Bitwise mode must give the same bits as one step of B. The step's gradient is the canonical
// tree over the M micro-shards of B (Note [Micro-shards], M = micro_shards, a power of two),
// shard i holding rows [floor(iB/M), floor((i+1)B/M)). Over a power-of-two number of leaves the
// canonical tree is the complete binary tree, so every aligned run of 2^j leaves is one of its
// nodes. With K | M and D | M/K (both then powers of two):
//   dp  (DataParallel over D devices): micro-step k is the block of shards [kS, (k+1)S), S = M/K,
//       with its own micro-shard bounds (the global ones restricted to the block); DataParallel
//       gives device d the shards kS + [dS/D, (d+1)S/D) and its rank tree supplies the nodes
//       above them: the result is node [kS, (k+1)S) of the tree over M;
//   ddp (D ranks): rank r's rows are the shards [rM/D, (r+1)M/D) (local_rows); its micro-step k is
//       the shards rM/D + [kS, (k+1)S), S = M/(DK); its local gradient is that node.
// Folding the K micro-step nodes with the canonical tree over the micro-step index (complete, K a
// power of two) then rebuilds node [0, M) (dp) or node [rM/D, (r+1)M/D) (ddp: the rank's
// subtree, which the bitwise all_reduce combines with the others', Note [DDP loss scaling])
// exactly: the same additions of the same values in the same tree. The node operation is one
// IEEE f32 add per element (ops::reduce_inputs with two inputs: rmath::combine, the add of the
// rank tree and of the sharded reductions), so the bits are those of one step of B for every
// K | M / D and every power-of-two D. The fold is a binary counter (GradAccumulator, Note
// [Streaming canonical tree]): after micro-step k its gradients are pushed and merged with the
// entries below while equal-sized; at most log2(K) + 1 gradient sets are alive.
//
// Hence bitwise mode requires M % (K * D) == 0 (K a power of two <= M / D), checked by
// check_grad_accumulation with the numbers: with K > 1, D must be a power of two (M is one), so
// a count of 3 devices has no --micro-shards that works; the message says so and offers fast
// mode, a power-of-two count or K = 1 instead. Each micro-step's gradients must be its own node,
// not added into the last micro-step's grads by the module (which would be a left-to-right chain):
// the grads are taken out before each micro-step's backward. DDP cannot sync inside the last
// backward (the fold is not done yet): every micro-step runs under no_sync and
// DistributedDataParallel::sync_gradients() all-reduces the folded gradients. Empty micro-steps
// (B < M) are allowed in bitwise mode as empty shards are: their node is zeros.
//
// Fast mode needs no fold: the module accumulates into .grad (torch's behaviour), DDP runs
// no_sync on all but the last micro-step, whose backward overlaps its all_reduce as usual. A
// micro-step is the k-th of K near-equal contiguous parts (floor(k n / K)) of the n rows the
// replica takes (dp: the batch; ddp: local_rows, torch.chunk's part of the batch, as
// DataParallel's fast scatter splits it, not micro-shards), and every micro-step of every rank that
// holds rows must get at least one row: InvalidArgument otherwise (K > n > 0). A rank torch.chunk's
// split gives no rows (a batch of 4 over 3 ranks: 2, 2, 0) runs its K micro-steps empty, as it
// runs its one step at K = 1; it does not bound K (it made the bound 0, "expected at most 0",
// a refusal nothing could satisfy, tester hB 8). Results agree with K = 1 within rounding.
//
// Checkpoints do not record grad_accum_steps: in bitwise mode it does not change the parameters
// (a run may resume with another K), in fast mode it changes only the rounding, as the device
// count does.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/nn/module.h"
#include "core/numerics/determinism.h"

namespace ditto::train {

struct TrainerConfig;

/// The rows of one micro-step: [first_row, end_row) of the global batch, and in bitwise mode the
/// micro-shard bounds of those rows (rebased to 0; Note [Micro-shards]).
struct MicroBatch {
  std::int64_t first_row = 0;
  std::int64_t end_row = 0;
  std::vector<std::int64_t> shard_bounds;  ///< bitwise only; empty in fast mode
  std::int64_t rows() const { return end_row - first_row; }
};

/// Micro-step `step` of `steps` of replica `rank` of `world` (dp: rank 0 of 1, the whole batch)
/// over a global batch of `global_rows` rows with `micro_shards` micro-shards (Note [Gradient
/// accumulation]). bitwise: the shards rank*M/world + [step*S, (step+1)*S), S = M/(world*steps),
/// which needs M % (world * steps) == 0; fast: the step-th of `steps` near-equal parts of the
/// rank's rows (DistributedDataParallel::local_rows' fast split, torch.chunk's part `rank` of
/// `world`: comm::chunk_range; M plays no part). Throws InvalidArgument (naming micro_batch and the
/// numbers) for a bitwise split that does not divide, or out-of-range arguments.
MicroBatch micro_batch(std::int64_t global_rows, std::int64_t micro_shards, int world, int rank,
                       std::int64_t steps, std::int64_t step, Determinism mode);

/// Throws InvalidArgument unless config.grad_accum_steps can split config.batch_size on
/// `devices` devices (ranks): bitwise mode needs grad_accum_steps a power of two and
/// micro_shards % (grad_accum_steps x devices) == 0 (so, above 1 step, devices a power of two);
/// fast mode needs every rank's share of the batch to have none or at least grad_accum_steps
/// rows. The message names the fields as config.name_of does (--grad-accum-steps,
/// --micro-shards, --batch-size; the devices by devices_name: --devices, or mpirun -np under
/// mpirun) and their values.
void check_grad_accumulation(const TrainerConfig& config, int devices);

/// Fast mode's row check for one batch of `rows` rows (an epoch's last batch may be short):
/// every rank's share must have no rows (torch.chunk's split leaves a rank none when the batch is
/// small) or at least config.grad_accum_steps; InvalidArgument otherwise, naming the smallest
/// share that holds rows (so the bound it gives is at least 1).
void check_micro_batch_rows(const TrainerConfig& config, int devices, std::int64_t rows);

/// The canonical tree over micro-step index (Note [Gradient accumulation]): push() takes the
/// parameters' current grads (moving them out: the grads are undefined afterwards) as leaf
/// 0, 1, 2, ...; finish() folds what is left and puts the root back into the parameters' grads.
/// Node operation: older += newer with ops::reduce_inputs (one add per element in the grads'
/// dtype's accumulator, rounded once: f32 for f32 grads). A parameter without a grad in a
/// micro-step counts as zeros. The tensors are those of the parameters given to push(), in order.
class GradAccumulator {
 public:
  /// Push the grads of `params` as the next leaf; merges equal-sized entries (binary counter).
  void push(const std::vector<nn::Parameter*>& params);
  /// Leaves pushed since the last finish().
  std::int64_t leaves() const { return leaves_; }
  /// Puts the root of the tree over every leaf pushed into params' grads (the same params, in the
  /// same order, as pushed) and empties the accumulator. Throws InvalidArgument (naming
  /// GradAccumulator) when nothing was pushed or the parameter count differs.
  void finish(const std::vector<nn::Parameter*>& params);

 private:
  /// Entry: the gradients of a complete subtree of `size` leaves (one tensor per parameter;
  /// undefined: zeros).
  struct Entry {
    std::vector<Tensor> grads;
    std::int64_t size = 0;
  };
  static void add_into(Entry& older, Entry& newer);
  std::vector<Entry> stack_;
  std::int64_t leaves_ = 0;
};

}  // namespace ditto::train
