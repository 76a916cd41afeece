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

/// Enqueues on `stream` (of the current device):
///   for i in [0, len):  v = op over q of srcs[q][i]   (canonical tree over q, Note [Canonical
///                                                      tree]; one source is copied as is)
///                       v = v / srcs.size()          (op avg, f32 only, as ncclAvg)
///                       dsts[d][i] = v               for every d
/// dtype f32 or i64 (i64 arithmetic wraps); the element combine is the simulator's (NaN
/// propagates through min and max). Pointers may lie on any GPU the current device can access
/// (peer access). A destination may be a source at the same element (in place): each element is
/// read and written by one thread. 1 <= srcs.size(), dsts.size() <= kCommMaxPointers.
/// Returns the launch status (nothing is launched when len or dsts is empty).
cudaError_t launch_comm_reduce(cudaStream_t stream, const std::vector<const void*>& srcs,
                               const std::vector<void*>& dsts, std::int64_t len, DType dtype,
                               ReduceOp op);

}  // namespace ditto::cuda
