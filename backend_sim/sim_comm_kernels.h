// The simulator's reduction over ranks, for every dtype and op: the element arithmetic of
// all_reduce, reduce and reduce_scatter (sim_communicator.cpp), of the communicator over MPI
// (sim_communicator_mpi.cpp) and of Kernels::reduce_inputs (torch.cuda.comm.reduce_add), so all of
// them give the same bits.
//
// The arithmetic is Note [Reductions over ranks] (core/numerics/reduce_math.h): each rank's value
// loaded into the accumulator Acc<T> (times the rank's scalar for premul_sum), combined over ranks
// in the order of the mode (bitwise: the canonical tree over rank index, Note [Canonical tree],
// done on blocks of kReduceBlock elements; fast: left to right), then finished once (avg's
// division, one rounding to T). For f32 and i64 this is the arithmetic the simulator always had
// (same bits); for f32, f64 and the integers the sources are combined in place, without a load.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/numerics/determinism.h"
#include "core/runtime/dtype.h"

namespace ditto::sim {

/// Elements reduced per step (one block of the accumulator per tree level lives in cache).
inline constexpr std::int64_t kReduceBlock = 1024;

/// Receives each finished block of a reduction: `len` (<= kReduceBlock) elements of the output
/// dtype at `block`, the values of elements [offset, offset + len). A non-owning reference to a
/// callable (like llvm::function_ref): the callable must outlive the call it is passed to.
class BlockSink {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, BlockSink>>>
  BlockSink(F&& f)  // NOLINT: implicit, so a lambda can be passed directly
      : ctx_(const_cast<void*>(static_cast<const void*>(&f))),
        fn_([](void* ctx, std::int64_t off, const void* b, std::int64_t len) {
          (*static_cast<std::remove_reference_t<F>*>(ctx))(off, b, len);
        }) {}
  void operator()(std::int64_t off, const void* block, std::int64_t len) const {
    fn_(ctx_, off, block, len);
  }

 private:
  void* ctx_;
  void (*fn_)(void*, std::int64_t, const void*, std::int64_t);
};

/// Reduces elements [begin, end) of every source (srcs[q]: rank q's buffer, of `dtype`) with `op`
/// in `mode` and hands each finished block to `emit`, in increasing offset. `scalars` (srcs.size()
/// entries: rank q's PreMulSum scalar) is read for premul_sum only and must then be non-null; the
/// caller has checked integer scalars (core/comm). A block is emitted after all its sources were
/// read, so `emit` may write into a source at the block's offsets (in-place collectives).
void reduce_range(const std::vector<const void*>& srcs, std::int64_t begin, std::int64_t end,
                  DType dtype, ReduceOp op, Determinism mode, const double* scalars,
                  BlockSink emit);

/// out[i] = op over q of srcs[q][i] for i in [0, count), any dtype and op, exactly as the
/// simulator's communicator reduces across ranks (the note above): the canonical tree over q in
/// bitwise mode, left to right in fast mode; avg divides by srcs.size() (integers truncate).
/// `out` may be one of the sources. `scalars`: see reduce_range (premul_sum only). Used by the
/// communicator over MPI (sim_communicator_mpi.cpp) and SimKernels::reduce_inputs so that their
/// results are the in-process ones, bit for bit.
void reduce_over_ranks(const std::vector<const void*>& srcs, void* out, std::int64_t count,
                       DType dtype, ReduceOp op, Determinism mode, const double* scalars = nullptr);

}  // namespace ditto::sim
