// optim::ZeroRedundancyOptimizer: ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations
// Toward Training Trillion Parameter Models", 2020; DeepSpeed's stage 1, llm.c's -z 1,
// torch.distributed.optim.ZeroRedundancyOptimizer): every rank keeps the optimizer state (and,
// for bf16 / f16 parameters, the f32 master weights) of 1/N of the parameters only.
//
// Note [ZeRO flat shards]
// All parameters are laid out in one flat index space, in parameters() order, each parameter's
// slot starting at a multiple of kSquaresBlock (gpt_math.h) and the total padded to a multiple of
// N x kSquaresBlock (padding elements are zero and belong to no parameter). Rank r owns the
// contiguous shard [r S, (r + 1) S), S = total / N (llm.c's and DeepSpeed's flat partition, not
// torch's per-parameter round robin). step():
//   1. reduce_scatter (sum) of the flat gradients: rank r gets its shard of the gradient summed
//      over the ranks, in f32 (a copy of the module's grads; grads of bf16 / f16 are upcast
//      after the reduction). Note [Reductions over ranks] (core/numerics/reduce_math.h) is
//      elementwise: an element's sum has the same bits whether all_reduce or reduce_scatter
//      formed it, so the shard holds exactly the bits DDP's all_reduce would have given.
//   2. the clip (ZeroOptions::max_grad_norm), if any, as optim::clip_grad_norm_ over the full
//      reduced gradients: Note [ZeRO grad clip].
//   3. the inner optimizer (built by the caller's factory, so SGD, Adam and AdamW and their
//      state_dict all work unchanged) steps "segment" Parameters, one per piece of a parameter
//      inside this rank's shard: data = the f32 master of the piece (for f32 parameters a view of
//      the parameter itself: no copy, no rounding), grad = a view of the reduced shard. A piece
//      of a parameter with dim >= 2 is shaped [1, n], of a 1-dim one [n], so nanoGPT's dim-based
//      AdamW groups (weight decay on the matrices) put each piece in its parameter's group. Every
//      update here (SGD, Adam, AdamW's decay) is elementwise with per-parameter scalars that only
//      depend on the step count, so the pieces get the bits the unsharded optimizer gives them.
//   4. masters that are not the parameters (bf16 / f16) are rounded once into the parameters;
//      an all_gather then gives every rank every shard's parameters.
// The collectives go in chunks (ZeroOptions::bucket_cap_mb, DeepSpeed's reduce_bucket_size and
// allgather_bucket_size) through one buffer of N chunks, which with the f32 shard lives only
// during step(), so the only full-model-sized memory is the model's own parameters and grads
// (DDP under no_sync allocates no buckets); elementwise reductions make the chunking invisible
// in the bits. Checkpoints: consolidate_state_dict gathers the unsharded layout (torch's). A rank
// whose shard holds only padding steps one placeholder segment of one zero element (its update
// keeps it zero), so the inner optimizer always has a parameter.
//
// Note [ZeRO copies]
// The buffer's pieces (one per parameter per rank in a chunk: a GPT-2 124M on 8 ranks has a few
// hundred) move in one launch per list where the backend has multi-tensor kernels
// (ops::has_multi_tensor_kernels: cuda, and the simulator's dry run, which prices cuda's
// launches): per chunk one ops::copy_multi_ packing the grads into the reduce_scatter's send
// buffer, one upcasting the reduced bf16 / f16 part straight into the f32 shard (no f32
// temporary), one putting this rank's parameter pieces into the all_gather's buffer and one
// taking every other rank's out; per step one rounding every master into its parameter piece.
// Elsewhere (the simulator's real run, the host) each piece is a Tensor::copy_ and each
// rounding an ops::cast + copy_, as before. copy_multi_ has the bits of those copies and casts,
// so every parameter's bits are the same either way (tests/test_zero*.cpp run the per-piece
// path; OptimFused.ZeroCopiesTakeTheMultiTensorKernelsWithTheSameBits the multi one).
//
// Note [ZeRO grad clip]
// clip_grad_norm_ (bitwise) sums per parameter the canonical tree over kSquaresBlock-element
// chains (sum_squares), then the parameters in order in float on the host, then a float sqrt.
// Slots start on block boundaries and S is a multiple of the block, so each block of a parameter
// lies inside one rank's shard, and a block that ends in padding has the chain of its real
// elements (fma(0, 0, acc) = acc). Each rank computes its shard's chains (ops::
// sum_squares_blocks), all_gathers them (a copy: exact), and every rank forms, per parameter, the
// canonical tree over that parameter's blocks and the sum in parameter order, exactly as
// clip_grad_norm_ does: the same norm bits, the same coefficient, the same scaled gradients.
// Fast mode: each rank's shard sum of squares, all_reduce (any order).
//
// Note [ZeRO mixed precision]
// With bf16 / f16 parameters (Note [Mixed precision], core/runtime/mixed_precision.h) ZeRO takes
// over optim::MasterWeights' role for the shard, and gives its bits:
//   - masters: rank r holds f32 masters only of the pieces inside its shard, made once by the
//     exact upcast of the parameter (as MasterWeights makes them) and from then on the truth; the
//     inner optimizer steps them. Optimizer state per rank: (4 master + 8 AdamW moments) bytes x
//     N_params / N = 12 / N bytes per parameter (state_bytes), where MasterWeights holds 12.
//   - gradients: in bitwise mode the module's grads are f32 (nn::grad_dtype) and reduce_scatter
//     in f32; in fast mode they have the parameter's dtype and reduce_scatter in it (llm.c's bf16
//     reduce-scatter), each element rounded once after the rank sum (Note [Reductions over
//     ranks]), then upcast exactly into the f32 shard. Either way the shard holds the bits DDP's
//     all_reduce of the same grads would have given.
//   - f16's GradScaler (attach_grad_scaler): the reduced, still scaled shard is unscaled and
//     checked for inf / NaN on each rank; the ranks agree by an all_reduce (max) of the found
//     flag, so when one rank's shard holds the inf every rank skips the step (no master, moment
//     or parameter changes) and updates the scale the same way; torch's GradScaler semantics.
//   - update: after the inner step each master is rounded once (round to nearest even) into its
//     piece of the parameter; all_gather then copies the pieces in the parameter dtype (a copy:
//     exact), so every rank holds the parameters MasterWeights would have produced.
// Each piece's update is elementwise and its rounding happens once, so the bits do not depend on
// N or on the shard boundaries (tests/test_zero_mixed.cpp). consolidate_state_dict writes
// MasterWeights' layout (master.<i>, option master_weights=f32), so a checkpoint of a ZeRO run
// loads into a run without ZeRO and back.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/optim/optimizer.h"

namespace ditto::optim {

class GradScaler;

/// Builds the optimizer that updates one rank's shard (the same signature as
/// train::OptimizerFactory): an optimizer over `params` with learning rate `lr`. (Not
/// MasterWeights' InnerOptimizerFactory, which takes the masters only.)
using ZeroInnerFactory =
    std::function<std::unique_ptr<Optimizer>(std::vector<nn::Parameter*> params, float lr)>;

struct ZeroOptions {
  /// torch.nn.utils.clip_grad_norm_'s max_norm applied to the reduced gradients inside step()
  /// (Note [ZeRO grad clip]); 0: no clipping. Finite and >= 0.
  double max_grad_norm = 0.0;
  /// Cap in MiB of one chunk of the reduce_scatter / all_gather (all ranks' parts together,
  /// DeepSpeed's reduce_bucket_size); the chunk is at least one kSquaresBlock per rank. > 0.
  double bucket_cap_mb = 25.0;
};

class ZeroRedundancyOptimizer : public Optimizer {
 public:
  /// ZeRO-1 over `params` (every rank passes its replica's parameters in the same order, with
  /// the same shapes; they must be on comm.device()) and the ranks of `comm`; `make_inner`
  /// builds the shard's optimizer with learning rate `lr` over the segment Parameters (Note
  /// [ZeRO flat shards]). Reduction order (bitwise / fast) is comm.options().determinism.
  /// Throws InvalidArgument for a parameter not on comm.device() (naming it), bad options
  /// (naming the field), a factory that returns null, and what Optimizer's constructor and the
  /// factory throw. Runs no collective.
  ZeroRedundancyOptimizer(std::vector<nn::Parameter*> params, Communicator comm,
                          const ZeroInnerFactory& make_inner, float lr, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  /// Every rank calls it (collectives): reduce_scatter the grads, clip, update this rank's shard,
  /// all_gather the parameters (Note [ZeRO flat shards]). Afterwards every rank's parameters are
  /// what the unsharded optimizer would have made of the grads summed over the ranks (bitwise:
  /// the same bits); the module's grads are left as they were (local, not reduced). A parameter
  /// whose grad is undefined (on every rank alike, as DDP's ranks agree) gets no update and no
  /// state, as torch. Throws InvalidArgument for a grad not of its parameter's shape, dtype f32 or
  /// the parameter's dtype, on its device (before any collective), and what the collectives
  /// throw (Timeout, BackendError naming a failed rank).
  void step() override;
  void set_lr(double lr) override;
  double lr() const override { return inner_->lr(); }
  /// torch's ZeroRedundancyOptimizer.consolidate_state_dict(to): every rank calls it
  /// (collectives: one all_gather per state key over the flat layout, one all_reduce of the step
  /// counts); rank `to` then holds the state in the unsharded optimizer's layout (the factory's
  /// optimizer over all parameters: its type, options and "state.<i>.<key>" tensors of each
  /// parameter's shape), which state_dict() returns, so a checkpoint of a ZeRO run loads into a
  /// run without ZeRO and back. Throws InvalidArgument for `to` outside [0, ranks).
  void consolidate_state_dict(int to = 0);
  /// The state consolidate_state_dict() gathered (on its `to` rank; copied). Throws
  /// InvalidArgument on any other rank or before consolidate_state_dict(), as torch does.
  OptimizerState state_dict() const override;
  /// Takes the unsharded optimizer's state (a state_dict of the factory's optimizer over all
  /// parameters, e.g. from a run without ZeRO or from consolidate_state_dict), checks it as that
  /// optimizer would (InvalidArgument naming the first difference, before changing anything),
  /// and keeps this rank's pieces. Every rank calls it with the same state; runs no collective.
  void load_state_dict(const OptimizerState& state) override;

  /// Bytes of optimizer state this rank holds: the inner optimizer's state tensors plus f32
  /// masters that are not the parameters themselves (bf16 / f16), i.e. about 1/N of the
  /// unsharded optimizer's (Adam / AdamW over bf16 parameters: 12 bytes per parameter / N).
  /// Blocks (reads the inner state_dict's sizes).
  std::size_t state_bytes() const override;
  /// f16 (torch.amp.GradScaler with ZeRO): step() unscales the reduced shard with `scaler`
  /// (GradScaler::unscale_ on the segments; found_inf all_reduced with max over the ranks, so
  /// every rank skips alike) before the clip, and skips the update and the all_gather on
  /// inf / NaN; the caller calls scaler->update() after step(). Its state travels in
  /// consolidate_state_dict / load_state_dict as "grad_scaler.<key>" options (as MasterWeights).
  /// Not owned; null detaches. Sets the scaler's found_inf reducer (this optimizer must outlive
  /// the scaler's use).
  void attach_grad_scaler(GradScaler* scaler);
  /// The total 2-norm of the reduced gradients before clipping, of the last step() with
  /// max_grad_norm > 0 (clip_grad_norm_'s return value), else 0.
  float last_grad_norm() const { return last_norm_; }

  /// Elements of the flat layout (padded), of one rank's shard, and of one chunk per rank.
  std::int64_t flat_numel() const { return total_; }
  std::int64_t shard_numel() const { return shard_; }
  std::int64_t chunk_numel() const { return chunk_; }
  /// Offset of parameter i's slot in the flat layout.
  std::int64_t slot_offset(std::size_t i) const { return offset_.at(i); }
  /// The shard's optimizer and its segment parameters (the pieces of this rank's shard).
  Optimizer& inner() { return *inner_; }
  std::size_t num_segments() const { return segments_.size(); }

 private:
  struct Segment;  // one piece of a parameter inside this rank's shard
  struct Piece;    // one piece of a parameter inside one rank's chunk (for the copies)
  void refresh_segments();
  float clip(Determinism mode, const std::vector<bool>& has_grad);

  /// The factory's optimizer over all parameters (no state until a step: cheap), for the
  /// unsharded layout's type, options and checks.
  std::unique_ptr<Optimizer> unsharded() const;
  /// Position j of inner_->parameters() (its state.<j>) -> index into segments_.
  std::vector<std::size_t> inner_order() const;
  /// What unsharded() is built over: params_ (f32), else f32 host stand-ins of their shapes.
  const std::vector<nn::Parameter*>& layout_params() const;
  /// Position i of o.parameters() (an optimizer over layout_params()) -> index into params_.
  std::vector<std::size_t> param_order(const Optimizer& o) const;

  Communicator comm_;
  ZeroOptions options_;
  ZeroInnerFactory make_inner_;
  std::unique_ptr<OptimizerState> consolidated_;  // on the `to` rank of consolidate_state_dict
  int ranks_ = 1, rank_ = 0;
  std::int64_t total_ = 0, shard_ = 0, chunk_ = 0, chunks_ = 0;
  std::vector<std::int64_t> offset_;                // [param]: slot offset
  std::vector<std::vector<Piece>> pieces_;          // [chunk]: pieces of every rank's chunk c
  std::vector<std::unique_ptr<Segment>> segments_;  // this rank's
  std::unique_ptr<Optimizer> inner_;
  Tensor grad_shard_;  // [S] f32: the reduced shard (during step() only)
  Tensor buffer_;      // [N * chunk]: the collectives' buffer (during step() only)
  float last_norm_ = 0.0f;
  DType param_dtype_ = DType::f32;
  GradScaler* scaler_ = nullptr;
  mutable std::vector<std::unique_ptr<nn::Parameter>> layout_;  // f32 stand-ins (bf16 / f16)
  mutable std::vector<nn::Parameter*> layout_ptrs_;
};

}  // namespace ditto::optim
