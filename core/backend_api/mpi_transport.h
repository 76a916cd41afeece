// Internal, MPI builds only (included by the *_mpi.cpp files): MPI error checks, waiting on
// nonblocking MPI requests with a deadline, and MpiLink, the part every multi-process
// communicator shares: its own MPI communicator, the exchange of the ranks' calls (call matching
// across processes), timeouts and abort.
//
// Note [Timeouts over MPI]
// A blocking MPI call never returns when a peer does not come, so every MPI operation of a
// collective is nonblocking (MPI_Isend/Irecv, MPI_Ialltoallv, MPI_Iallgatherv, ...) and completed
// by polling (MPI_Testsome) until CommOptions::timeout_ms has passed. The poll backs off (yield,
// then sleeps of up to 1 ms) so that waiting ranks leave the cores to the others (mpirun
// --oversubscribe runs several ranks per core). Each collective starts with the exchange of the
// ranks' calls (kind, count, dtype, op, root and ordinal, point to point, so a timeout can name the
// ranks whose call never arrived); after a timeout the link is aborted, like the in-process
// simulator's communicator: every later call throws BackendError at once. A rank that fails
// (Communicator::abort) sends the others an abort notice in place of its next call, so that they
// fail at once naming it. Requests still pending
// then cannot be cancelled (nonblocking collectives) and may still write their buffers, so the
// link keeps those buffers alive and never frees its MPI communicator; the job should end.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/backend_api/collective_call.h"
#include "core/backend_api/rendezvous.h"
#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/collective_types.h"

namespace ditto::detail::mpi {

[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line,
                                  const std::string& where);

/// DITTO_MPI_CHECK(MPI_Ibarrier(...), where): BackendError
/// "<where>: MPI_Ibarrier(...) failed at core/x_mpi.cpp:12: <MPI's error string>".
#define DITTO_MPI_CHECK(call, where)                                                            \
  do {                                                                                          \
    int ditto_mpi_rc_ = (call);                                                                 \
    if (ditto_mpi_rc_ != MPI_SUCCESS)                                                           \
      ::ditto::detail::mpi::throw_mpi_error(ditto_mpi_rc_, #call, __FILE__, __LINE__, (where)); \
  } while (0)

using Clock = std::chrono::steady_clock;

/// Records that this process can no longer end the job with MPI_Finalize (Note [Ending a job after
/// a communicator error], core/distributed/distributed.h): a timeout left MPI requests pending, or
/// this process failed one of its communicators (MpiLink::abort_by_rank). The first reason is
/// kept (dist::job_failure). Never throws.
void note_job_failure(const std::string& reason) noexcept;
/// The first reason note_job_failure recorded, "" when none.
std::string job_failure();

// Note [MPI work at finalize]
// The simulator's collectives over MPI run on the rank's stream worker (Note [Sim collectives over
// MPI]), queued by a call that returns at once. A program that let its Communicator go without
// synchronizing its stream and called dist::finalize() had a worker still calling MPI after
// MPI_Finalize, which Open MPI answers by aborting the job (tester C, C4: "MPI_Testsome() was
// called after MPI_FINALIZE", exit 1). Each such task holds a QueuedWork from its enqueue until it
// is done (its captures released), and dist::finalize() waits until none is left before
// MPI_Finalize, as ncclCommFinalize flushes the work issued on a communicator: each ends by its
// communicator's timeout (after one timeout the communicator is aborted and the rest throw at
// once). A live Communicator handle holds no QueuedWork: using it after finalize throws
// BackendError (MpiLink::start).

/// One queued or running task of a multi-process communicator that calls MPI (Note [MPI work at
/// finalize]).
class QueuedWork {
 public:
  QueuedWork();
  ~QueuedWork();
  QueuedWork(const QueuedWork&) = delete;
  QueuedWork& operator=(const QueuedWork&) = delete;
};

/// Waits until no QueuedWork is alive (dist::finalize, before MPI_Finalize).
void wait_for_queued_work();

/// Polls `reqs` (MPI_Testsome) until all have completed (they become MPI_REQUEST_NULL) or
/// `deadline` passes; returns false then, with the pending ones left in `reqs`.
bool wait_until(std::vector<MPI_Request>& reqs, Clock::time_point deadline,
                const std::string& where);

/// MPI datatype that moves elements of a ditto dtype: the MPI type of the same C type where MPI has
/// one (f32 MPI_FLOAT, f64 MPI_DOUBLE, i64 MPI_INT64_T, u8 MPI_UINT8_T, ...), else an unsigned
/// integer of the same size (f16 / bf16 MPI_UINT16_T, fp8 MPI_UINT8_T: moved, never reduced).
MPI_Datatype mpi_type(DType dtype);

/// True when MPI's own reductions (MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX on mpi_type(dtype)) compute
/// this dtype's values: f32, f64 and the integers (not f16 / bf16 / fp8, which MPI has no type
/// for).
bool mpi_reduces(DType dtype);

/// One send or recv of a rank's batch of point-to-point calls (Communicator::send / recv issued
/// between group_start and group_end, or alone), as MpiLink::match_p2p matches it.
struct P2POp {
  CollectiveKind kind = CollectiveKind::send;  ///< send or recv
  int peer = 0;
  std::int64_t count = 0;
  DType dtype = DType::f32;
  void* data = nullptr;  ///< this rank's buffer (read by a send, written by a recv)
  std::uint64_t seq =
      0;  ///< set by match_p2p: the position k on its pair (Note [Point-to-point matching])
  std::string mismatch;  ///< set by match_p2p: empty when the partner agrees on count and dtype
};

/// The MPI side of one multi-process communicator (one rank per process): owns a duplicate of
/// MPI_COMM_WORLD (so its messages never meet another communicator's) and the ordinal of the
/// collectives. Methods other than throw_if_aborted() are called by one thread at a time (the
/// rank's collectives run one after another).
class MpiLink {
 public:
  /// Takes `comm` (this communicator's own MPI communicator).
  MpiLink(MPI_Comm comm, const CommOptions& options, std::string what);
  ~MpiLink();
  MpiLink(const MpiLink&) = delete;
  MpiLink& operator=(const MpiLink&) = delete;

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  /// Throws BackendError "<kind>: communicator aborted by an earlier error: ..." once aborted.
  void throw_if_aborted(CollectiveKind kind) const;
  /// Whether the link was aborted (a timeout, a failed rank, Communicator::abort).
  bool aborted() const;

  /// Starts this rank's next collective: sends `call` to every other rank and receives theirs
  /// (Note [Timeouts over MPI]); after comm_warn_after_ms() without every call, prints the slow
  /// collective's warning once (Note [Slow collective warning]). Returns every rank's call in rank
  /// order (pointers are this rank's in its own entry, null in the others) and sets `seq` to the
  /// collective's ordinal. Throws BackendError when aborted; Timeout naming the collective and the
  /// ranks whose call did not come within the timeout (and aborts); InvalidArgument when the calls
  /// do not match (detail::find_call_mismatch: every rank throws the same, and the link stays
  /// usable).
  std::vector<CollectiveCall> start(const CollectiveCall& call, std::uint64_t& seq);

  /// Waits for the collective's data requests (warning once after comm_warn_after_ms(), Note
  /// [Slow collective warning]); at the deadline aborts and throws Timeout naming the collective.
  /// `keep` holds buffers the pending requests may still write after a timeout: the aborted link
  /// keeps them alive.
  void wait(std::vector<MPI_Request>& reqs, CollectiveKind kind, std::uint64_t seq,
            std::shared_ptr<void> keep = {});

  /// Matches a batch of this rank's point-to-point calls with their peers' (Note [Point-to-point
  /// matching] in core/backend_api/p2p_match.h, Note [Point-to-point over MPI] in
  /// core/distributed/mpi_transport_mpi.cpp): gives each op its position k on its ordered pair,
  /// sends each peer a header (k, count, dtype) and receives the peer's, and sets each op's
  /// `mismatch` (p2p_mismatch's text, the same on both sides) when they differ. Throws BackendError
  /// when aborted (also while waiting, when another thread aborts this rank); Timeout
  /// (p2p_timeout_reason, naming both ranks) when a peer's header does not come within the
  /// timeout, and aborts the link.
  void match_p2p(std::vector<P2POp>& ops);

  /// Moves the data of the matched ops of a batch (those with an empty `mismatch`) with
  /// MPI_Isend / MPI_Irecv, every op of the batch at once (a ring of sends and recvs completes).
  /// `keep` as for wait(). Timeout (and abort) when the data does not move within the timeout.
  void move_p2p(const std::vector<P2POp>& ops, std::shared_ptr<void> keep = {});

  /// Communicator::abort on behalf of this rank (ncclCommAbort): marks the link failed and sends
  /// every other rank an abort notice in place of its next call, so that a rank waiting for this
  /// one in a collective's call exchange fails at once with BackendError "<collective> (collective
  /// #n ...): rank <r> failed: <reason>" (the reason cut to 255 bytes), not at the timeout. The
  /// first reason is kept; never throws.
  void abort_by_rank(const std::string& reason) noexcept;

  /// "all_reduce (collective #3 on this communicator)".
  static std::string label(CollectiveKind kind, std::uint64_t seq) {
    return collective_label(kind, seq);
  }
  /// "rank 2 of 4 (MPI)" for error messages.
  const std::string& where() const { return where_; }

 private:
  void abort(std::string reason, bool timeout);
  /// When a wait that starts now warns (Note [Slow collective warning]); max(): never.
  Clock::time_point warn_time() const;
  using Cause = AbortState::Cause;
  /// wait_until, also ending when this link is aborted meanwhile (returns false, aborted set).
  bool wait_or_abort(std::vector<MPI_Request>& reqs, Clock::time_point deadline, bool& aborted);
  /// The aborted link's error for `label`, keeping `keep` alive for pending requests.
  [[noreturn]] void throw_aborted(const std::string& label, std::shared_ptr<void> keep);
  /// Keeps `keep` alive for pending requests, aborts the link with `reason` (a timeout) and
  /// throws Timeout(reason).
  [[noreturn]] void time_out(const std::string& reason,
                             std::initializer_list<std::shared_ptr<void>> keep);
  /// all_to_all_v: every rank's send_counts and recv_counts into `calls` (an MPI_Iallgather)
  /// when every rank called all_to_all_v, so find_call_mismatch can cross-check them.
  void exchange_counts(std::vector<CollectiveCall>& calls, std::uint64_t seq);

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  std::string where_;
  const std::int64_t warn_after_ms_;  ///< Note [Slow collective warning]
  std::atomic<std::uint64_t> seq_{0};
  /// Point-to-point positions so far: sends to rank q, recvs from rank q (the stream's thread).
  std::vector<std::uint64_t> sends_to_, recvs_from_;

  mutable std::mutex mu_;
  AbortState abort_;                            ///< Note [Rendezvous]
  std::vector<std::shared_ptr<void>> orphans_;  ///< buffers of requests left pending by an abort
};

}  // namespace ditto::detail::mpi

namespace ditto::detail {
/// The transport handed to a backend's ProcessCommunicatorFactory (core/runtime/backend_init.h):
/// an MPI communicator of the job's processes, owned by the factory from then on.
struct ProcessLink {
  MPI_Comm comm = MPI_COMM_NULL;
};
}  // namespace ditto::detail
