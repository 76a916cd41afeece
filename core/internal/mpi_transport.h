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
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/internal/collective_call.h"
#include "core/comm/communicator.h"
#include "core/runtime/error.h"

namespace ditto::detail::mpi {

[[noreturn]] void throw_mpi_error(int rc, const char* call, const char* file, int line,
                                  const std::string& where);

/// DITTO_MPI_CHECK(MPI_Ibarrier(...), where): BackendError
/// "<where>: MPI_Ibarrier(...) failed at core/x_mpi.cpp:12: <MPI's error string>".
#define DITTO_MPI_CHECK(call, where)                                                      \
  do {                                                                                    \
    int ditto_mpi_rc_ = (call);                                                           \
    if (ditto_mpi_rc_ != MPI_SUCCESS)                                                     \
      ::ditto::detail::mpi::throw_mpi_error(ditto_mpi_rc_, #call, __FILE__, __LINE__, (where)); \
  } while (0)

using Clock = std::chrono::steady_clock;

/// Polls `reqs` (MPI_Testsome) until all have completed (they become MPI_REQUEST_NULL) or
/// `deadline` passes; returns false then, with the pending ones left in `reqs`.
bool wait_until(std::vector<MPI_Request>& reqs, Clock::time_point deadline,
                const std::string& where);

/// MPI datatype of a ditto dtype (f32: MPI_FLOAT, i64: MPI_INT64_T).
MPI_Datatype mpi_type(DType dtype);

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

  /// Starts this rank's next collective: sends `call` to every other rank and receives theirs
  /// (Note [Timeouts over MPI]). Returns every rank's call in rank order (pointers are this
  /// rank's in its own entry, null in the others) and sets `seq` to the collective's ordinal.
  /// Throws BackendError when aborted; Timeout naming the collective and the ranks whose call
  /// did not come within the timeout (and aborts); InvalidArgument when the calls do not match
  /// (detail::find_call_mismatch: every rank throws the same, and the link stays usable).
  std::vector<CollectiveCall> start(const CollectiveCall& call, std::uint64_t& seq);

  /// Waits for the collective's data requests; at the deadline aborts and throws Timeout naming
  /// the collective. `keep` holds buffers the pending requests may still write after a timeout:
  /// the aborted link keeps them alive.
  void wait(std::vector<MPI_Request>& reqs, CollectiveKind kind, std::uint64_t seq,
            std::shared_ptr<void> keep = {});

  /// Communicator::abort on behalf of this rank (ncclCommAbort): marks the link failed and sends
  /// every other rank an abort notice in place of its next call, so that a rank waiting for this
  /// one in a collective's call exchange fails at once with BackendError "<collective> (collective
  /// #n ...): rank <r> failed: <reason>" (the reason cut to 255 bytes), not at the timeout. The
  /// first reason is kept; never throws.
  void abort_by_rank(const std::string& reason) noexcept;

  /// "all_reduce (collective #3 on this communicator)".
  static std::string label(CollectiveKind kind, std::uint64_t seq);
  /// "rank 2 of 4 (MPI)" for error messages.
  const std::string& where() const { return where_; }

 private:
  void abort(std::string reason, bool timeout);

  MPI_Comm comm_ = MPI_COMM_NULL;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  std::string where_;
  std::atomic<std::uint64_t> seq_{0};

  mutable std::mutex mu_;
  bool aborted_ = false;
  bool abort_timeout_ = false;
  bool abort_by_rank_ = false;  ///< a rank failed (abort_by_rank here or elsewhere)
  int failed_rank_ = -1;        ///< that rank (PeerFailure), or -1
  std::string abort_reason_;
  std::vector<std::shared_ptr<void>> orphans_;  ///< buffers of requests left pending by an abort
};

}  // namespace ditto::detail::mpi

namespace ditto::detail {
/// The transport handed to a backend's ProcessCommunicatorFactory (core/internal/backend_init.h):
/// an MPI communicator of the job's processes, owned by the factory from then on.
struct ProcessLink {
  MPI_Comm comm = MPI_COMM_NULL;
};
}  // namespace ditto::detail
