// The bitwise block algorithm of the CUDA communicators, once for every transport.
//
// Note [CUDA bitwise collectives]
// In bitwise mode NCCL only moves data; ditto's kernel (cuda_comm_kernels.cu) adds in the
// canonical tree over rank index, element by element, which is exactly the simulator's bitwise
// reduction (Note [Sim collectives]), so the bits agree. Per rank the traffic stays a ring's,
// (N-1)/N of the buffer each way per phase:
//   all_reduce      split the count into N blocks (q * per, per = slice_length(count, N));
//                   (1) all-to-all: rank r copies block q of its send to rank q, into row r of
//                   q's scratch [N, per]; (2) rank r tree-reduces the N copies of block r (its
//                   own straight from send) into block r of its recv; (3) an in-place
//                   all-gather (or, when the blocks are uneven, copies of the reduced blocks)
//                   fills the rest of every recv;
//   reduce_scatter  (1) and (2) with blocks of `count` (rank r's recv is block r's result);
//   reduce          (1), (2) into the scratch (the root: into its recv), then every rank copies
//                   its block to the root;
// broadcast, all_gather and barrier have no arithmetic: NCCL's own collectives serve both modes.
// avg is the tree sum divided by N (as the simulator and ncclAvg); min, max and prod use the
// same tree with their op.
#include "backend_cuda/cuda_bitwise.h"

#include <algorithm>

namespace ditto::cuda {

using Kind = detail::CollectiveKind;

std::int64_t slice_length(std::int64_t count, int n) {
  const std::int64_t per = (count + n - 1) / n;
  return (per + 63) / 64 * 64;
}

void bitwise_collective(BlockTransport& t, const detail::CollectiveCall& call, int n) {
  const Kind kind = call.kind;
  const std::int64_t count = call.count;
  if (count == 0) return;
  // Block q is elements [q * per, q * per + len(q)) of the buffer being reduced.
  const bool scatter = kind == Kind::reduce_scatter;
  const std::int64_t per = scatter ? count : slice_length(count, n);
  auto len = [&](int q) -> std::int64_t {
    return scatter ? count : std::max<std::int64_t>(0, std::min(per, count - q * per));
  };
  t.reserve_scratch(n * per);

  // (1) all-to-all: rank r's block q into row r of rank q's scratch.
  t.begin_phase();
  for (int r = 0; r < n; ++r)
    for (int q = 0; q < n; ++q)
      if (q != r && len(q) > 0)
        t.copy({r, Buffer::send, q * per}, {q, Buffer::scratch, r * per}, len(q));
  t.end_phase();

  // (2) rank r reduces the N copies of its block (its own straight from send).
  for (int r = 0; r < n; ++r) {
    if (!t.local(r) || len(r) == 0) continue;
    std::vector<BlockRef> srcs;
    for (int q = 0; q < n; ++q)
      srcs.push_back(q == r ? BlockRef{r, Buffer::send, r * per}
                            : BlockRef{r, Buffer::scratch, q * per});
    BlockRef dst{r, Buffer::recv, r * per};
    if (scatter)
      dst.offset = 0;
    else if (kind == Kind::reduce && r != call.root)
      dst.buffer = Buffer::scratch;  // the unused row r of the scratch
    t.reduce(r, srcs, dst, len(r));
  }

  // (3) distribute the reduced blocks.
  if (kind == Kind::all_reduce) {
    t.begin_phase();
    if (per * n == count) {  // even blocks: NCCL's in-place all-gather
      for (int r = 0; r < n; ++r)
        if (t.local(r)) t.all_gather_recv(r, per);
    } else {
      for (int r = 0; r < n; ++r)
        for (int q = 0; q < n; ++q)
          if (q != r && len(r) > 0)
            t.copy({r, Buffer::recv, r * per}, {q, Buffer::recv, r * per}, len(r));
    }
    t.end_phase();
  } else if (kind == Kind::reduce) {
    t.begin_phase();
    for (int q = 0; q < n; ++q)
      if (q != call.root && len(q) > 0)
        t.copy({q, Buffer::scratch, q * per}, {call.root, Buffer::recv, q * per}, len(q));
    t.end_phase();
  }
}

}  // namespace ditto::cuda
