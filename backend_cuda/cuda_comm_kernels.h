// Internal: the device kernel of the CUDA communicator (cuda_communicator.cpp, Note [CUDA
// collectives]), defined in cuda_comm_kernels.cu. One kernel serves every collective: it reduces
// element i of several sources (the ranks' buffers, or the slices NCCL delivered) in the
// canonical tree order and writes the result to one or more destinations.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/comm/communicator.h"

namespace ditto::cuda {

/// Most sources, and most destinations, of one launch_comm_reduce (the ranks of an in-GPU
/// communicator).
inline constexpr int kCommMaxPointers = 1024;

/// Enqueues on `stream` (of the current device), with Acc, load_scaled, combine and finish of
/// core/numerics/reduce_math.h (Note [Reductions over ranks]):
///   for i in [0, len):  a = op over q of load_scaled(srcs[q][i], scalars[q])  (in Acc<dtype>, the
///                                                  canonical tree over q, Note [Canonical tree])
///                       dsts[d][i] = finish(a)    (avg divides by srcs.size(); one rounding)
/// for every d. One source with op sum, prod, min or max is a copy of the bits. Any dtype;
/// `scalars` (srcs.size() entries, each rank's premul_sum scalar; null: all 1) is read on the
/// host and used only for premul_sum. Pointers may lie on any GPU the current device can access
/// (peer access). A destination may be a source at the same element (in place): each element is
/// read and written by one thread. 1 <= srcs.size(), dsts.size() <= kCommMaxPointers.
/// Returns the launch status (nothing is launched when len or dsts is empty).
cudaError_t launch_comm_reduce(cudaStream_t stream, const std::vector<const void*>& srcs,
                               const std::vector<void*>& dsts, std::int64_t len, DType dtype,
                               ReduceOp op, const double* scalars = nullptr);

}  // namespace ditto::cuda
