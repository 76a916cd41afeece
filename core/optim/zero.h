// optim::ZeroRedundancyOptimizer: ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations
// Toward Training Trillion Parameter Models", 2020; DeepSpeed's stage 1, llm.c's -z 1,
// torch.distributed.optim.ZeroRedundancyOptimizer): every rank keeps the optimizer state (and,
// for bf16 / f16 parameters, the f32 master weights) of 1/N of the parameters only.
//
// Note [ZeRO flat shards]
// All parameters are laid out in one flat index space in the backward's order (reverse
// parameters(), as DDP's buckets: the last layer's gradients come first), each parameter's slot
// starting at a multiple of kSquaresBlock (gpt_math.h) and the total padded to a multiple of
// N x kSquaresBlock (padding elements are zero and belong to no parameter). The flat space is cut
// into chunks of N x C elements (C: ZeroOptions::bucket_cap_mb's elements per rank, a multiple of
// the block; the last chunk shorter, still a multiple of N blocks), and rank r owns the r-th part
// of every chunk: its shard of S = total / N elements is its parts of all chunks, in chunk order
// (DeepSpeed's and llm.c's flat partition, not torch's per-parameter round robin, made
// bucket-major so that each chunk's reduce_scatter needs only the grads of a run of parameters
// in backward order: Note [ZeRO overlapped reduce_scatter]). A parameter may span several
// chunks and ranks; its pieces inside one rank's shard are that rank's segments. step():
//   1. reduce_scatter (sum) of the flat gradients, one chunk at a time: rank r gets its parts,
//      summed over the ranks, in f32 (a copy of the module's grads; grads of bf16 / f16 are
//      upcast after the reduction). Note [Reductions over ranks] (core/numerics/reduce_math.h)
//      is elementwise: an element's sum has the same bits whether all_reduce or reduce_scatter
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
//      an all_gather per chunk then gives every rank every rank's parts of the parameters.
// The collectives go through one buffer of N x C elements, which with the f32 shard lives only
// during step() (with overlap: from the first chunk's reduce_scatter in the backward to the end
// of step()), so the only full-model-sized memory is the model's own parameters and grads (DDP
// under no_sync allocates no buckets); elementwise reductions make the chunking invisible in the
// bits. Checkpoints: consolidate_state_dict gathers the unsharded layout (torch's), so they do
// not depend on N or on this layout. A rank whose shard holds only padding steps one placeholder
// segment of one zero element (its update keeps it zero), so the inner optimizer always has a
// parameter.
//
// Note [ZeRO overlapped reduce_scatter]
// llm.c (multi_gpu_async_reduce_gradient) and DeepSpeed (overlap_comm) reduce_scatter each
// layer's gradients while the backward computes the earlier layers'. ZeroOptions::overlap_comm
// does it for the chunks of Note [ZeRO flat shards]: the layout is in backward order, so chunk c
// holds a run of parameters whose grads the backward completes one after the other, and it is
// ready once grad_ready() has reported each parameter with elements in it (a parameter spanning
// chunks makes each of them wait for it). prepare_overlap() arms it before the backward that
// completes the step's grads (the trainer's last micro-step; not with bitwise gradient
// accumulation, whose grads are final only after the fold: there step() does it all). The
// module's one grad-ready hook belongs to DDP, which passes each ready parameter on
// (DistributedDataParallel::set_grad_ready_observer). Chunks start in index order on every rank
// (the collectives match), each on ZeRO's communication stream after an event of the compute
// stream (DDP's bucket launch): fill, pack, reduce_scatter, upcast into the shard, the same
// operations as step() runs without overlap, so the same bits. step() starts the chunks whose
// parameters were never reported (no grad this step: their slots are packed as zeros, as DDP's
// buckets do, and they get no update), makes the compute stream wait for the communication
// stream, and goes on with the clip, the update and the all_gathers. A grad reported before it
// was final is caught where it can be: one that appears or disappears after its chunk started,
// or one not in the reduce dtype, makes step() throw. The all_gathers stay in step() (the next
// forward needs the parameters: llm.c does the same). Memory: the shard and the buffer live from
// the first chunk's launch, once the backward has freed the last layers' activations.
//
// Note [ZeRO copies]
// The buffer's pieces (one per parameter per rank in a chunk: a GPT-2 124M on 8 ranks has a few
// hundred) move in one launch per list where the backend has multi-tensor kernels
// (ops::has_multi_tensor_kernels: cuda, and the simulator's dry run, which prices cuda's
// launches): per chunk one copy_multi packing the grads into the reduce_scatter's send
// buffer, one upcasting the reduced bf16 / f16 part straight into the f32 shard (no f32
// temporary), one putting this rank's parameter pieces into the all_gather's buffer and one
// taking every other rank's out; per step one rounding every master into its parameter piece.
// The buffer's lists go to Kernels::copy_multi as the pointers and counts ops::copy_multi_ would
// pass for the pieces' tensors (Note [ZeRO piece lists]: a piece a rank, so no tensor a piece);
// the upcast and the rounding go through ops::copy_multi_.
// Elsewhere (the simulator's real run, the host) each piece is a Tensor::copy_ and each
// rounding an ops::cast + copy_, as before. copy_multi_ has the bits of those copies and casts,
// so every parameter's bits are the same either way (tests/test_zero*.cpp run the per-piece
// path; OptimFused.ZeroCopiesTakeTheMultiTensorKernelsWithTheSameBits the multi one).
//
// Note [ZeRO piece lists]
// The copies of Note [ZeRO copies] go piece by piece (each its own copy_ in a real simulator
// run; one list entry each for copy_multi_, whose launches the dry run prices per table of
// pieces): a piece is a parameter's elements inside one rank's part of a chunk, about N + the
// chunk's parameters of them a chunk. Packing the reduce_scatter's send buffer and taking the
// all_gather's pieces out visit every rank's pieces; a rank's segments and the all_gather's
// own pieces only its own. None of them is stored: the chunks of N x C elements tile the flat
// layout, so each chunk keeps only the parameters with elements in it (in index order, so in
// decreasing slot offset), and the pieces of rank q's part [lo, hi) are the run of those
// parameters starting before hi and ending after lo (a binary search, then the run):
// for_each_piece visits them rank by rank, in index order within a part, the order the copies
// have always had. Host memory is then O(parameters + chunks) a rank and the setup O(N log P +
// pieces of this rank) a rank, where every rank's table of every rank's pieces took
// N x chunks x 40 bytes a rank and N x parameters steps a chunk to build: O(N^2) in one dry-run
// process of N ranks (GPT-2 XL dry in bf16 on 512 ranks, one step: 3.7 GB and 110 s of CPU, now
// 0.75 GB and 10 s; tests/test_dry_run.cpp). A step's lists still hold about a piece a rank a
// chunk (what the device is given, and what the dry run prices): they go to Kernels::copy_multi
// as pointers and counts, no tensor made a piece (Note [ZeRO copies]).
//
// Note [ZeRO grad clip]
// clip_grad_norm_ (bitwise) sums per parameter the canonical tree over kSquaresBlock-element
// chains (sum_squares), then the parameters in order in float on the host, then a float sqrt.
// Slots start on block boundaries and every rank's part of a chunk is a multiple of the block,
// so each block of a parameter lies inside one part (one rank's shard, at a block boundary of
// it), and a block that ends in padding has the chain of its real elements (fma(0, 0, acc) =
// acc). Each rank computes its shard's chains (ops::sum_squares_blocks), all_gathers them (a
// copy: exact), and every rank forms, per parameter, the canonical tree over that parameter's
// blocks (found in their owners' shards) and the sum in parameter order, exactly as
// clip_grad_norm_ does: the same norm bits, the same coefficient, the same scaled gradients.
// Fast mode: each rank's shard sum of squares, all_reduce (any order: the bits depend on N and
// on the layout, not on overlap_comm).
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
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/optim/optimizer.h"

namespace ditto {
class Stream;
class Event;
}  // namespace ditto

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
  /// DeepSpeed's overlap_comm (llm.c's multi_gpu_async_reduce_gradient; Note [ZeRO overlapped
  /// reduce_scatter]): after prepare_overlap() each chunk's reduce_scatter runs on a
  /// communication stream as soon as the backward has reported its parameters' grads ready
  /// (grad_ready), overlapping the rest of the backward. The parameters get the bits of false.
  /// false: every reduce_scatter in step(), after the backward.
  bool overlap_comm = false;
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
  /// the parameter's dtype, on its device (before any collective; after prepare_overlap(): after
  /// the reduce_scatters, which every rank then finishes, and also for the grads grad_ready()
  /// describes), and what the collectives throw (Timeout, BackendError naming a failed rank).
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

  /// options.overlap_comm (Note [ZeRO overlapped reduce_scatter]): the next backward completes
  /// the step's gradients (no later accumulation into them: the last micro-step of gradient
  /// accumulation, not one whose grads are folded afterwards), so each chunk's reduce_scatter may
  /// start as soon as grad_ready() has reported every parameter with elements in it. Every rank
  /// calls it before the same backward; step() then finishes the chunks not yet started (grads
  /// never reported: parameters the backward did not reach) and waits for them. Without
  /// overlap_comm it does nothing.
  void prepare_overlap();
  /// The module's grad-ready hook (nn::Module::set_grad_ready_hook, or DDP's observer,
  /// parallel::DistributedDataParallel::set_grad_ready_observer): `p`'s grad is final for this
  /// step. Between prepare_overlap() and step(), launches every chunk whose parameters are all
  /// reported, in chunk order (the same on every rank), each after the compute stream's work so
  /// far: the grads packed into the buffer, reduce_scatter, the upcast into the f32 shard, on the
  /// communication stream (torch DDP's bucket launch). Otherwise, or for a `p` not among the
  /// parameters, it does nothing. A grad that appears or disappears after its chunk started, or
  /// one not of the reduce dtype (nn::grad_dtype of the parameters'), makes step() throw
  /// InvalidArgument naming it.
  void grad_ready(const nn::Parameter& p);
  /// Chunks whose reduce_scatter started in grad_ready() (before step()) in the last step.
  std::size_t chunks_overlapped() const { return chunks_overlapped_; }
  /// The total 2-norm of the reduced gradients before clipping, of the last step() with
  /// max_grad_norm > 0 (clip_grad_norm_'s return value), else 0.
  float last_grad_norm() const { return last_norm_; }

  /// Elements of the flat layout (padded), of one rank's shard, and of one rank's part of a
  /// chunk (the last chunk's parts may be shorter).
  std::int64_t flat_numel() const { return total_; }
  std::int64_t shard_numel() const { return shard_; }
  std::int64_t chunk_numel() const { return chunk_; }
  /// Offset of parameter i's slot in the flat layout (Note [ZeRO flat shards]).
  std::int64_t slot_offset(std::size_t i) const { return offset_.at(i); }
  /// The shard's optimizer and its segment parameters (the pieces of this rank's shard).
  Optimizer& inner() { return *inner_; }
  std::size_t num_segments() const { return segments_.size(); }

 private:
  struct Segment;  // one piece of a parameter inside this rank's shard
  struct Piece;    // one piece of a parameter inside one rank's chunk (for the copies)
  /// Calls f(const Piece&) for every piece of ranks [q0, q1)'s parts of chunk c: rank by rank,
  /// in each part its parameters in index order (the copies' list order). Work O(pieces +
  /// (q1 - q0) log P): no per-rank table (Note [ZeRO piece lists]).
  template <class F>
  void for_each_piece(std::int64_t c, int q0, int q1, F&& f) const;
  void refresh_segments();
  /// Elements of every rank's part of chunk c, and the flat offset of rank q's part.
  std::int64_t part_numel(std::int64_t c) const;
  std::int64_t flat_begin(int q, std::int64_t c) const;
  /// Flat element f's owner and its offset in that rank's shard.
  std::pair<int, std::int64_t> locate(std::int64_t f) const;
  /// A gathered [N x S] (rank-major shards) as the flat layout's [total].
  std::vector<float> to_flat(const std::vector<float>& gathered) const;
  /// Chunk c's reduce_scatter into grad_shard_ through buffer_ (the grads of `has_grad`'s
  /// parameters packed, padding and the others zero), on the current stream.
  void reduce_scatter_chunk(std::int64_t c, const std::vector<bool>& has_grad);
  void launch_ready_chunks();
  /// Overlap: allocates the shard and buffer, launches the chunks not yet started, waits.
  void finish_overlap();
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
  std::vector<std::int64_t> offset_;  // [param]: slot offset
  // [chunk]: the parameters with elements in chunk c, in index order (Note [ZeRO piece lists])
  std::vector<std::vector<std::size_t>> chunk_params_;
  // Note [ZeRO overlapped reduce_scatter]
  bool armed_ = false;                               // prepare_overlap() .. step()
  std::vector<std::vector<std::size_t>> chunks_of_;  // [param]: the chunks it has elements in
  std::vector<std::size_t> pending_;                 // [chunk]: parameters not yet reported
  std::vector<char> reported_;                       // [param]: grad_ready() this step
  std::vector<signed char> packed_;  // [param]: -1 not packed, 0 / 1 had a grad, 2 both
  std::string overlap_error_;        // a grad of the wrong dtype, found packing
  std::size_t next_chunk_ = 0, chunks_overlapped_ = 0;
  DType reduce_dtype_ = DType::f32;  // nn::grad_dtype of the parameters'
  std::unique_ptr<Stream> comm_stream_;
  std::unique_ptr<Event> grads_done_, comm_done_;
  std::vector<Tensor> in_flight_;  // temporaries the communication stream has yet to read
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
