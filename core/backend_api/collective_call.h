// Internal, for backends: one rank's collective call as a communicator records it, and the check
// that every rank of a collective made the same call (same collective, count, dtype, op, root).
// The simulator and the CUDA backend share it, so a mismatch reads the same on both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/collective_types.h"
#include "core/runtime/dtype.h"

namespace ditto::detail {

// The kinds are public (core/runtime/collective_types.h): the cost model names them too.
using ditto::collective_name;
using ditto::CollectiveKind;

inline bool uses_op(CollectiveKind k) {
  return k == CollectiveKind::all_reduce || k == CollectiveKind::reduce ||
         k == CollectiveKind::reduce_scatter;
}
inline bool uses_root(CollectiveKind k) {
  return k == CollectiveKind::reduce || k == CollectiveKind::broadcast ||
         k == CollectiveKind::gather || k == CollectiveKind::scatter;
}
/// send / recv: point-to-point, matched per pair of ranks, not by the collective ordinal.
inline bool is_p2p(CollectiveKind k) {
  return k == CollectiveKind::send || k == CollectiveKind::recv;
}

/// One rank's call, as published to the other ranks. Backends may derive to add their own fields.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  std::int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;  ///< reduce, broadcast, gather, scatter
  /// premul_sum: this rank's scalar (ranks may differ; not matched).
  double scalar = 1.0;
  /// send / recv: the other rank.
  int peer = 0;
  /// all_to_all_v: size() entries each, in elements (count is unused: 0). Matched across ranks
  /// as send_counts[q] of rank r == recv_counts[r] of rank q.
  std::vector<std::int64_t> send_counts, send_displs, recv_counts, recv_displs;
};

/// The record of one rank's call (the all_to_all_v vectors and the peer are set afterwards).
inline CollectiveCall call_record(CollectiveKind kind, const void* send, void* recv,
                                  std::int64_t count, DType dtype, ReduceOp op = ReduceOp::sum,
                                  int root = 0, double scalar = 1.0) {
  CollectiveCall c;
  c.kind = kind;
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  c.scalar = scalar;
  return c;
}

/// Empty when every rank's call matches rank 0's (and, for all_to_all_v, every rank's
/// send_counts[q] is rank q's recv_counts[r]); else the error message every rank throws.
/// `calls[r]` is rank r's call of collective #seq; CallT is CollectiveCall or derives from it.
/// The message starts with the name of rank `self`'s collective (a process of an mpirun job
/// reports its own call; tester C, C7: rank 1's broadcast failed with "all_reduce: rank 1 called
/// broadcast, ..."), rank 0's by default (the in-process communicators: one message for all).
template <typename CallT>
std::string find_call_mismatch(const std::vector<CallT>& calls, std::uint64_t seq, int self = 0) {
  const CollectiveCall& c0 = calls[0];
  const std::string where =
      cat(" (collective #", seq,
          " on this communicator; every rank must call the same collectives in the same order "
          "with the same count, dtype, op and root)");
  const char* name = collective_name(calls[static_cast<std::size_t>(self)].kind);
  for (std::size_t q = 1; q < calls.size(); ++q) {
    const CollectiveCall& c = calls[q];
    if (c.kind != c0.kind)
      return cat(name, ": rank ", q, " called ", collective_name(c.kind), ", rank 0 called ",
                 collective_name(c0.kind), where);
    if (c.kind == CollectiveKind::barrier) continue;
    if (c.count != c0.count)
      return cat(name, ": rank ", q, " called with count ", c.count, ", rank 0 with count ",
                 c0.count, where);
    if (c.dtype != c0.dtype)
      return cat(name, ": rank ", q, " called with dtype ", dtype_name(c.dtype),
                 ", rank 0 with dtype ", dtype_name(c0.dtype), where);
    if (uses_op(c.kind) && c.op != c0.op)
      return cat(name, ": rank ", q, " called with op ", reduce_op_name(c.op), ", rank 0 with op ",
                 reduce_op_name(c0.op), where);
    if (uses_root(c.kind) && c.root != c0.root)
      return cat(name, ": rank ", q, " called with root ", c.root, ", rank 0 with root ", c0.root,
                 where);
  }
  if (c0.kind == CollectiveKind::all_to_all_v) {
    // What rank r sends to rank q must be what q expects from r.
    const std::size_t n = calls.size();
    for (std::size_t r = 0; r < n; ++r) {
      const CollectiveCall& c = calls[r];
      if (c.send_counts.size() != n || c.recv_counts.size() != n)
        return cat(name, ": rank ", r, " called with ", c.send_counts.size(), " send_counts and ",
                   c.recv_counts.size(), " recv_counts for ", n, " ranks", where);
    }
    for (std::size_t r = 0; r < n; ++r)
      for (std::size_t q = 0; q < n; ++q) {
        const std::int64_t sent = calls[r].send_counts[q], expected = calls[q].recv_counts[r];
        if (sent != expected)
          return cat(name, ": rank ", r, " sends ", sent, " elements to rank ", q, " (send_counts[",
                     q, "]), but rank ", q, " expects ", expected, " from rank ", r,
                     " (recv_counts[", r, "])", where);
      }
  }
  return {};
}

}  // namespace ditto::detail
