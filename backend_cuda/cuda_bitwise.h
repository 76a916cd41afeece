// Internal: the bitwise block algorithm of the CUDA communicators (Note [CUDA bitwise
// collectives]), written once over BlockTransport, the data movement it needs: copy a block from
// rank a to rank b, reduce blocks on a rank's device in the canonical tree, and phases that
// complete together. The in-process NCCL communicator (cuda_communicator.cpp) drives every rank
// through one transport; the one-rank-per-process communicator (cuda_communicator_mpi.cpp) drives
// its own rank through the same transport (cuda_nccl.h), and the algorithm skips what other
// processes do.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend_api/collective_call.h"

namespace ditto::cuda {

/// A buffer of one rank in a collective: its call's send or recv, or its scratch.
enum class Buffer : std::uint8_t { send, recv, scratch };

/// Element `offset` of rank `rank`'s `buffer`.
struct BlockRef {
  int rank = 0;
  Buffer buffer = Buffer::send;
  std::int64_t offset = 0;
};

/// The data movement of the bitwise block algorithm. Offsets and lengths are in elements of the
/// collective's dtype. Calls name any rank; the transport does the parts of the ranks it drives
/// (local(r)) and ignores the rest, which other processes do.
class BlockTransport {
 public:
  virtual ~BlockTransport() = default;
  /// Whether this process drives rank `rank`.
  virtual bool local(int rank) const = 0;
  /// Allocates every local rank's scratch of `elems` elements, ordered on the rank's stream and
  /// freed there after the collective (by the transport's destructor).
  virtual void reserve_scratch(std::int64_t elems) = 0;
  /// The copies between begin_phase() and end_phase() are issued together (ncclGroupStart /
  /// ncclGroupEnd), so the ranks' sends and receives of one phase cannot wait on each other.
  virtual void begin_phase() = 0;
  virtual void end_phase() = 0;
  /// Copies `len` elements from `from` to `to` (different ranks): the sending half on from's
  /// rank, the receiving half on to's, each where local.
  virtual void copy(const BlockRef& from, const BlockRef& to, std::int64_t len) = 0;
  /// Rank `rank`'s part of the in-place all-gather of every rank's recv block q (elements
  /// [q * per, (q + 1) * per)) into every recv: the copies of the blocks to every other rank, in
  /// one NCCL call. Inside a phase.
  virtual void all_gather_recv(int rank, std::int64_t per) = 0;
  /// On local rank `rank`'s stream: dst[i] = op over q of srcs[q][i] in the canonical tree over
  /// q (launch_comm_reduce, with the collective's op), for i in [0, len).
  virtual void reduce(int rank, const std::vector<BlockRef>& srcs, const BlockRef& dst,
                      std::int64_t len) = 0;
};

/// Block length of element slices: ceil(count / n) rounded up to 64 elements, so that every
/// slice of an aligned buffer stays 16-byte aligned (the comm kernel's vector path).
std::int64_t slice_length(std::int64_t count, int n);

/// Bitwise all_reduce, reduce or reduce_scatter of `call` (every rank's call matches it) over
/// the `n` ranks of the transport (Note [CUDA bitwise collectives]). Enqueues only; throws what
/// the transport throws.
void bitwise_collective(BlockTransport& t, const detail::CollectiveCall& call, int n);

}  // namespace ditto::cuda
