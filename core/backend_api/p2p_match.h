// Internal, for backends: the matching of point-to-point calls (Communicator::send / recv,
// ncclSend / ncclRecv) and the words their errors use, shared by the simulator, the CUDA backend
// and the multi-process links so that a mismatch or a timeout reads the same everywhere.
//
// Note [Point-to-point matching]
// send and recv are not collectives: they take no part in the ordinal matching of
// core/backend_api/rendezvous.h. They are matched per ORDERED pair of ranks (src, dst) by position:
// the k-th send from rank src to rank dst pairs with the k-th recv on rank dst from rank src
// (k counts from 1, separately for every pair; a send to itself is the pair (r, r)). This is
// NCCL's rule (and MPI's non-overtaking rule for one tag). A pair matches when both sides have
// been posted; they must then have the same count and dtype, else both fail with the same
// InvalidArgument (p2p_mismatch) and the position is used up: the (k+1)-th send pairs with the
// (k+1)-th recv. Which side comes first does not matter; at any moment the posted, unmatched
// calls of a pair are all sends or all recvs. A call whose partner is not posted within
// CommOptions::timeout_ms fails with ditto::Timeout (p2p_timeout_reason) and the communicator is
// aborted, as after a collective's timeout; a rank's failure (Communicator::abort) fails the
// waiting calls at once (AbortState::error_for(p2p_call_label(...))).
// P2PMatcher holds the posted calls of one process; it does not lock (its owner holds a mutex
// around every call, as with Rendezvous). Backends that see only their own rank's calls (one
// rank per process) keep the counters and use the message functions alone.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/backend_api/collective_call.h"
#include "core/base/error.h"
#include "core/runtime/dtype.h"

namespace ditto::detail {

/// The sender and receiver of a send or recv issued by rank `rank` to / from `peer`.
struct P2PPair {
  int src = 0;
  int dst = 0;
  bool operator==(const P2PPair&) const = default;
};
inline P2PPair p2p_pair(CollectiveKind kind, int rank, int peer) {
  return kind == CollectiveKind::send ? P2PPair{rank, peer} : P2PPair{peer, rank};
}

/// "point-to-point #k from rank A to rank B".
inline std::string p2p_label(P2PPair p, std::uint64_t k) {
  return cat("point-to-point #", k, " from rank ", p.src, " to rank ", p.dst);
}

/// "send (point-to-point #k from rank A to rank B)" (or "recv (...)"): how an error names the
/// call, e.g. as the label of AbortState::error_for.
inline std::string p2p_call_label(CollectiveKind kind, P2PPair p, std::uint64_t k) {
  return cat(collective_name(kind), " (", p2p_label(p, k), ")");
}

/// Empty when send #k of pair `p` (send_count elements of send_dtype) and its recv (recv_count
/// of recv_dtype) agree; else the InvalidArgument message both sides throw:
/// "send/recv: rank A sends N elements of f32 to rank B, but rank B receives M elements of bf16
/// from rank A (point-to-point #k from rank A to rank B; a send and its recv must have the same
/// count and dtype)".
inline std::string p2p_mismatch(P2PPair p, std::uint64_t k, std::int64_t send_count,
                                DType send_dtype, std::int64_t recv_count, DType recv_dtype) {
  if (send_count == recv_count && send_dtype == recv_dtype) return {};
  return cat("send/recv: rank ", p.src, " sends ", send_count, " elements of ",
             dtype_name(send_dtype), " to rank ", p.dst, ", but rank ", p.dst, " receives ",
             recv_count, " elements of ", dtype_name(recv_dtype), " from rank ", p.src, " (",
             p2p_label(p, k), "; a send and its recv must have the same count and dtype)");
}

/// The ditto::Timeout reason of a `kind` call (#k of pair `p`) whose partner did not come:
/// "send (point-to-point #k from rank A to rank B): rank B did not post the matching recv from
/// rank A within T ms" / "recv (...): rank A did not post the matching send to rank B within
/// T ms".
inline std::string p2p_timeout_reason(CollectiveKind kind, P2PPair p, std::uint64_t k,
                                      std::int64_t timeout_ms) {
  if (kind == CollectiveKind::send)
    return cat(p2p_call_label(kind, p, k), ": rank ", p.dst,
               " did not post the matching recv from rank ", p.src, " within ", timeout_ms, " ms");
  return cat(p2p_call_label(kind, p, k), ": rank ", p.src,
             " did not post the matching send to rank ", p.dst, " within ", timeout_ms, " ms");
}

/// The posted send / recv calls of a communicator, matched by position per ordered pair (Note
/// [Point-to-point matching]). CallT is CollectiveCall or a backend's record derived from it
/// (kind send or recv, peer, count, dtype read here; a backend adds e.g. its stream or batch).
template <typename CallT = CollectiveCall>
class P2PMatcher {
 public:
  /// A posted call still waiting for its partner.
  struct Pending {
    CallT call;
    int rank = 0;           ///< the rank that posted it
    std::uint64_t seq = 0;  ///< its position k on its pair (from 1)
  };
  /// Two calls that met: `mismatch` is empty when they agree, else what both sides throw.
  struct Match {
    CallT send, recv;
    P2PPair pair;
    std::uint64_t seq = 0;
    std::string mismatch;
  };
  /// The outcome of post(): the call's position, and its match when the partner was posted.
  struct Posted {
    P2PPair pair;
    std::uint64_t seq = 0;
    std::optional<Match> match;
  };

  /// `n`: the communicator's size (ranks and peers in [0, n), checked by core).
  explicit P2PMatcher(int n) : n_(n) {}

  /// Posts rank `rank`'s call (call.kind send or recv, call.peer the other rank). When the
  /// partner of the same position is already posted, both leave the matcher and the match is
  /// returned (the caller moves the data or fails both with match->mismatch); else the call
  /// waits in the matcher.
  Posted post(int rank, CallT call) {
    const bool is_send = call.kind == CollectiveKind::send;
    const P2PPair pair = p2p_pair(call.kind, rank, call.peer);
    Queue& q = pairs_[key(pair)];
    const std::uint64_t seq = is_send ? ++q.sends : ++q.recvs;
    Posted out{pair, seq, std::nullopt};
    // Waiting calls of the pair are all of one side: the other side's, if any, is the partner
    // (the oldest waiting one has the same position, since both sides count in order).
    if (!q.waiting.empty() && (q.waiting.front().call.kind == CollectiveKind::send) != is_send) {
      Pending other = std::move(q.waiting.front());
      q.waiting.pop_front();
      Match m;
      if (is_send) {
        m.send = std::move(call);
        m.recv = std::move(other.call);
      } else {
        m.send = std::move(other.call);
        m.recv = std::move(call);
      }
      m.pair = pair;
      m.seq = seq;
      m.mismatch = p2p_mismatch(pair, seq, m.send.count, m.send.dtype, m.recv.count, m.recv.dtype);
      --waiting_;
      out.match = std::move(m);
      return out;
    }
    q.waiting.push_back(Pending{std::move(call), rank, seq});
    ++waiting_;
    return out;
  }

  /// The position the next `kind` call of pair `p` will get (for messages about a call that
  /// fails before it is posted, e.g. on a failed device).
  std::uint64_t next_seq(CollectiveKind kind, P2PPair p) const {
    auto it = pairs_.find(key(p));
    if (it == pairs_.end()) return 1;
    return (kind == CollectiveKind::send ? it->second.sends : it->second.recvs) + 1;
  }

  /// Number of posted calls waiting for their partner.
  std::size_t waiting() const { return waiting_; }

  /// Calls `f(const Pending&)` for every waiting call (any order).
  template <typename F>
  void for_each_waiting(F&& f) const {
    for (const auto& [k, q] : pairs_)
      for (const Pending& p : q.waiting) f(p);
  }

  /// Removes and returns the waiting calls (the communicator aborted). The position counters
  /// stay (a later call on an aborted communicator fails anyway).
  std::vector<Pending> take_waiting() {
    std::vector<Pending> out;
    out.reserve(waiting_);
    for (auto& [k, q] : pairs_) {
      for (Pending& p : q.waiting) out.push_back(std::move(p));
      q.waiting.clear();
    }
    waiting_ = 0;
    return out;
  }

 private:
  struct Queue {
    std::uint64_t sends = 0, recvs = 0;  ///< calls posted so far on each side
    std::deque<Pending> waiting;         ///< unmatched calls, all sends or all recvs, in order
  };
  std::uint64_t key(P2PPair p) const {
    return static_cast<std::uint64_t>(p.src) * static_cast<std::uint64_t>(n_) +
           static_cast<std::uint64_t>(p.dst);
  }

  const int n_;
  std::unordered_map<std::uint64_t, Queue> pairs_;
  std::size_t waiting_ = 0;
};

}  // namespace ditto::detail
