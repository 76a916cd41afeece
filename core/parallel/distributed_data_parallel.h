// parallel::DistributedDataParallel: SPMD data parallelism, as torch.nn.parallel.
// DistributedDataParallel does it. Each rank (a host thread here, or a process) holds its own
// replica of the module on its own device, runs its own forward and backward on its part of the
// global batch, and has its own optimizer; DDP keeps the replicas equal by
//   - at construction: checking that every rank's parameters have the same shapes and dtypes
//     (rank 0's signature of each parameter broadcast, one number per rank all_gathered) and
//     broadcasting parameters from rank 0;
//   - in backward: all-reducing the gradients, grouped into buckets (parameters in reverse order,
//     as PyTorch assigns them, since backward produces the last layer's gradients first; the
//     first bucket is capped at first_bucket_cap_mb, later ones at bucket_cap_mb). A bucket's
//     all_reduce starts on a communication stream of the rank's device as soon as all of its
//     gradients are ready (Module::set_grad_ready_hook), so it overlaps the rest of backward.
//     Buckets start in index order on every rank. backward() returns when the gradients are
//     reduced (the host waits for the communication stream, which also rethrows its errors).
//
// DDP does not care how its Communicator was made (Communicator::init_all in one process, or one
// rank per process): it takes the handle of its own rank. The module's parameters must be on
// comm.device().
//
// Note [DDP loss scaling]
// PyTorch's DDP takes each rank's loss as a mean over the rank's own samples and divides the
// summed gradients by the world size; for equal shares that is the gradient of the mean over the
// global batch. In Determinism::bitwise that route would not reproduce DataParallel's bits
// (x / b_r summed over ranks then / D rounds differently from the one division by B that
// DataParallel's loss does over the gathered batch). So ditto folds the division by the world
// size into the loss: the loss divides by the GLOBAL batch size B (Loss::set_global_batch), every
// rank's gradients are then exactly its rows' terms of DataParallel's gradient, and DDP sums
// them (average_gradients = false). Each rank takes the rows of the micro-shards DataParallel
// would give device `rank` in bitwise mode (local_rows(); fast mode takes torch.chunk's part,
// as DataParallel's fast scatter does), whose weight and bias gradients are the subtree of the
// canonical micro-shard tree over those shards (Note [Micro-shards], core/numerics/micro_shards.h);
// the bitwise all_reduce combines the ranks with the canonical tree over rank index, the nodes
// above them. The all_reduce is element-wise, so a fused bucket gives the same bits as a per-tensor
// all_reduce, whatever the bucket size or overlap. The result equals DataParallel's bits for the
// same seed, batch and micro_shards, for any power-of-two world size <= micro_shards.
//
// Note [DDP gradient dtype]
// Parameters may be f32, bf16 or f16 (mixed precision, Note [Mixed precision]). A bucket holds
// gradients of one dtype, all-reduced in that dtype: the grad dtype rule of issue 14 (the one
// nn::grad_dtype states): fast mode reduces in the parameter's dtype (llm.c's bf16 gradients and
// bf16 all_reduce: half the bytes of f32), bitwise mode in f32 (a bf16 sum rounded at each
// device's subtree would depend on the device count; f32 keeps Note [DDP loss scaling] exact).
// A model with several gradient dtypes gets separate buckets per dtype, as torch's
// compute_bucket_assignment_by_size keys its buckets by dtype; bucket sizes count the
// gradient's bytes. A grad a module allocated in another dtype is converted into its bucket slot
// (and, after the synchronised backward, is a view of that slot, in the bucket's dtype). f32
// models get exactly the buckets, bytes and bits they had before.
//
// Failure behaviour: a rank that fails inside a DDP call (forward, backward, join) calls
// Communicator::abort with its error before rethrowing, so the other ranks' collectives fail at
// once with "rank R failed: ..." (BackendError) instead of waiting for the timeout; a rank that
// never calls a collective makes the others fail with ditto::Timeout naming it after
// CommOptions::timeout_ms. A DDP destroyed while an exception unwinds its rank's stack (the
// training loop threw elsewhere) aborts the communicator too. Call abort() yourself to report a
// failure of your own code with its message.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/module.h"

namespace ditto::parallel {

struct DistributedDataParallelOptions {
  /// Bucket size cap in MiB (torch: bucket_cap_mb). A parameter larger than the cap gets a
  /// bucket of its own. > 0.
  double bucket_cap_mb = 25.0;
  /// Cap of the first bucket (the last parameters, whose gradients come first) in MiB (torch:
  /// dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB), so communication starts early. > 0.
  double first_bucket_cap_mb = 1.0;
  /// Start each bucket's all_reduce during backward as soon as its gradients are ready. false:
  /// all buckets are all-reduced after backward (for benchmarks comparing the two).
  bool overlap = true;
  /// Divide the summed gradients by the world size (PyTorch's behaviour; the loss is a mean over
  /// the rank's own samples). false: only sum, the loss divides by the global batch
  /// (Loss::set_global_batch; Note [DDP loss scaling]); bitwise runs that must equal
  /// DataParallel use false.
  bool average_gradients = true;
  /// Micro-shards K of a global batch (Note [Micro-shards]); a power of two in [1,
  /// kMaxMicroShards], in bitwise mode at least the world size. Used by local_rows() and
  /// forward(inputs, global_batch) in bitwise mode only (fast mode splits as torch.chunk).
  std::int64_t micro_shards = 64;
  /// Broadcast parameters from rank 0 at construction (torch does, always).
  bool broadcast_parameters = true;
};

class DistributedDataParallel {
 public:
  /// Wrap `module` (not owned; must outlive this object; one DDP per module, as its grad-ready
  /// hook is the module's one hook) for the rank of `comm`. Every rank must
  /// construct its DDP at the same point (the constructor runs collectives). Reduction order
  /// (fast / bitwise) is comm.options().determinism; it is set on the module. Throws
  /// InvalidArgument for bad options, a parameter not on comm.device() or not f32 / bf16 / f16
  /// (Note [DDP gradient dtype]), or when the
  /// ranks' parameters differ ("... parameter 1 ('0.bias') is [128] f32 on rank 0 but [64] f32 on
  /// rank 2"), the same error on every rank.
  DistributedDataParallel(nn::Module& module, Communicator comm,
                          DistributedDataParallelOptions options = {});
  /// Aborts the communicator when destroyed by an exception unwinding its rank's stack.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  /// Rows [begin, end) of a global batch of `global_batch` rows that this rank processes, split
  /// as DataParallel splits a batch in the same determinism mode: bitwise, the rows of
  /// micro-shards [rank * K / D, (rank + 1) * K / D) (K = micro_shards, D = world size; Note
  /// [DDP loss scaling]); fast, part `rank` of torch.chunk's D parts (comm::chunk_range: parts of
  /// ceil(B / D) rows, 8 each for 24 rows over 3 ranks; K plays no part). Possibly empty for a
  /// small batch. Throws InvalidArgument for global_batch < 0.
  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t global_batch) const;
  /// local_rows(global_batch) of rank `rank` (0 <= rank < size()): the rows another rank takes.
  std::pair<std::int64_t, std::int64_t> rows_of_rank(std::int64_t global_batch, int rank) const;

  /// Forward of this rank's replica on its own inputs (any device; moved to comm.device()).
  Tensor forward(const Tensor& input);
  Tensor forward(const std::vector<Tensor>& inputs);
  /// Forward on this rank's part of a global batch of `global_batch` rows: inputs hold exactly
  /// the rows local_rows(global_batch) names (InvalidArgument otherwise); the module reduces its
  /// gradients over those rows' micro-shards (Note [DDP loss scaling]) and its first_row() is set
  /// to local_rows(global_batch).first (Note [Dropout masks]), in both determinism modes. The
  /// forwards without global_batch leave first_row() as the caller set it. training() and step()
  /// are the module's own (DDP holds no replica).
  Tensor forward(const std::vector<Tensor>& inputs, std::int64_t global_batch);
  /// Forward on rows [first_row, first_row + B) of the global batch (B = inputs[0].size(0), the
  /// same for every input), e.g. one micro-step of gradient accumulation (Note [Gradient
  /// accumulation], core/train/grad_accumulation.h): first_row() is set to first_row (Note
  /// [Dropout masks]) and, in bitwise mode, the module reduces its gradients over `shard_bounds`
  /// (those rows' micro-shard bounds rebased to 0; ignored in fast mode). Throws InvalidArgument
  /// for first_row < 0, inputs of unequal rows or bad bounds (bitwise), after aborting the
  /// communicator as every forward does.
  Tensor forward(const std::vector<Tensor>& inputs, std::int64_t first_row,
                 const std::vector<std::int64_t>& shard_bounds);

  /// Backward of the last forward (grad_output on any device), then the gradient all_reduce
  /// (unless inside no_sync()). Accumulates into the parameters' grads like the module's own
  /// backward; with sync the grads then hold the sum over ranks (or the average, per
  /// average_gradients) of everything accumulated since they were last zeroed. Returns the
  /// module's input gradient. After a synchronised backward each parameter's grad is a view of
  /// its slot in its bucket (torch's gradient_as_bucket_view=True), overwritten by the next
  /// synchronised backward: clone a grad to keep it. Throws what the module and the communicator
  /// throw (Timeout, BackendError naming the failed rank and the collective), after aborting the
  /// communicator for its own errors.
  Tensor backward(const Tensor& grad_output = Tensor());

  /// All-reduce the parameters' current grads now, through the buckets, as a synchronised
  /// backward does after the module's backward (the same bits: the all_reduce is elementwise),
  /// without overlap; inside or outside no_sync(). The grads then hold the sum over ranks (or the
  /// average, per average_gradients) and are views of the buckets, as after backward(). For
  /// gradients prepared between backward and the all_reduce: bitwise gradient accumulation folds
  /// the micro-steps' grads (every backward under no_sync), then calls this (Note [Gradient
  /// accumulation]). Every rank must call it at the same point. Throws InvalidArgument with
  /// enable_join(), and what the communicator throws (after aborting it).
  void sync_gradients();

  /// RAII guard of DDP.no_sync(): backward()s while it lives only accumulate local gradients;
  /// the first synchronised backward after it all-reduces everything accumulated.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) {
      ddp.sync_ = false;
    }
    ~NoSync() { ddp_.sync_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }

  /// Uneven inputs (torch.distributed.algorithms.Join). After enable_join(), every forward first
  /// runs a small all_reduce in which each rank says whether it is still training; a rank out of
  /// batches calls join(), which answers those all_reduces with "joined" and shadows the others'
  /// gradient all_reduces with zeros (so their sums hold only the active ranks' gradients; with
  /// average_gradients they are still divided by the full world size, as torch does by default)
  /// until every rank has joined; then the parameters of the last rank to join are broadcast to
  /// all (torch's _sync_final_model), so the replicas end equal. Every rank calls join() once
  /// after its last step. Every rank must call enable_join() (or none). Ranks that disagree on
  /// no_sync in one step fail with InvalidArgument. Without enable_join(), a rank that stops
  /// early makes the others fail with Timeout naming it.
  void enable_join() { join_enabled_ = true; }
  bool join_enabled() const { return join_enabled_; }
  /// See enable_join(). Returns the number of steps this rank shadowed. Throws InvalidArgument
  /// unless enable_join() was called.
  std::int64_t join();

  /// Calls `observer` with each parameter of the module once its grad is ready in a backward
  /// (the module's grad-ready hook, which DDP holds: Module::set_grad_ready_hook), once per
  /// parameter and backward, after DDP's own bucket handling, inside no_sync() too: for an
  /// optimizer that reduces the gradients itself while the backward runs (ZeRO-1's overlap_comm,
  /// optim::ZeroRedundancyOptimizer::grad_ready; DeepSpeed's engine hooks the same way).
  /// Parameters the backward does not reach are not reported. An empty function removes it.
  /// What it throws fails the backward (after aborting the communicator).
  void set_grad_ready_observer(std::function<void(nn::Parameter&)> observer) {
    observer_ = std::move(observer);
  }

  /// Report a failure of this rank (Communicator::abort with "reason"); never throws.
  void abort(const std::string& reason) const noexcept;

  nn::Module& module() { return module_; }
  const Communicator& communicator() const { return comm_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  /// Buckets of the last backward whose all_reduce started while the module's backward was still
  /// running (overlapping it); 0 without overlap or inside no_sync.
  std::size_t buckets_overlapped() const { return buckets_overlapped_; }
  /// The buckets: indices into module().parameters(), bucket 0 first (reduced first).
  const std::vector<std::vector<std::size_t>>& bucket_indices() const { return bucket_params_; }
  /// The dtype bucket b all-reduces in (Note [DDP gradient dtype]).
  DType bucket_dtype(std::size_t b) const;
  /// The dtype DDP reduces parameter `p`'s gradient in: f32 in bitwise mode, p's own in fast.
  DType grad_dtype_of(const nn::Parameter& p) const;

 private:
  struct Bucket;
  void build_buckets();
  void check_parameters();
  void broadcast_from(int root);
  /// Join protocol's per-step all_reduce; returns whether the active ranks sync this step.
  bool exchange_join_flags(int my_flag, std::vector<std::int64_t>* flags);
  void on_grad_ready(nn::Parameter& p);
  /// The tail of every row-aware forward: the join flags, the micro-shard bounds (bitwise), the
  /// first row, the inputs onto comm.device(), the module's forward. No checks, no try.
  Tensor forward_rows(const std::vector<Tensor>& inputs, std::int64_t first_row,
                      const std::vector<std::int64_t>& shard_bounds);
  void launch_ready_buckets();
  void launch(std::size_t b);
  void finish_backward();
  void shadow_all_reduces();
  [[noreturn]] void fail(const char* call);

  nn::Module& module_;
  Communicator comm_;
  DistributedDataParallelOptions options_;
  Determinism mode_;
  /// Points each parameter's grad_home at its bucket slot (on) or clears it (Note [DDP grads as
  /// bucket views]); a bucket not yet allocated (the first step) gives none.
  void set_grad_homes(bool on);
  std::vector<nn::Parameter*> params_;
  std::vector<std::vector<std::size_t>> bucket_params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unordered_map<const nn::Parameter*, std::size_t> index_of_;  // -> index in params_
  std::vector<std::size_t> bucket_of_;                              // parameter index -> bucket
  std::vector<char> ready_;                       // parameter ready in this backward
  std::function<void(nn::Parameter&)> observer_;  // set_grad_ready_observer
  std::unique_ptr<Stream> comm_stream_;
  std::unique_ptr<Event> grads_done_;  // compute stream, before a bucket's all_reduce
  std::unique_ptr<Event> comm_done_;
  std::size_t next_bucket_ = 0;  // buckets launch in index order
  std::size_t buckets_overlapped_ = 0;
  bool in_backward_ = false;
  bool sync_ = true;
  bool join_enabled_ = false;
  std::vector<int> last_active_;  // ranks active in the last step someone trained
  int uncaught_at_construction_ = 0;
};

}  // namespace ditto::parallel
