// Internal, for backends: the rendezvous every communicator shares. It matches the ranks' calls
// by their ordinal, holds each collective's deadline, names the ranks that never came, and keeps
// the abort state (ncclCommAbort), so that the simulator, the CUDA backend and the multi-process
// links report a mismatch, a timeout or a failed rank in the same words.
//
// Note [Rendezvous]
// Rank r's k-th call on a communicator is its call of collective #k. Rendezvous::enter(r) opens
// (or finds) round #k, whose deadline is armed by the first rank to reach it: now +
// CommOptions::timeout_ms (detail::comm_deadline). Rendezvous::arrive publishes the rank's call;
// the LAST rank to arrive closes the round, checks that the calls match (find_call_mismatch: a
// mismatch fails every rank of #k with the same InvalidArgument and the communicator stays
// usable) and runs the collective. Each backend waits its own way (the simulator parks the ranks'
// streams and arms a watchdog; CUDA blocks the calling host threads on a condition variable;
// MPI polls its requests), but when the deadline passes with ranks missing, the waiters fail with
// Timeout(timeout_reason(...)), which names them, and the communicator is aborted.
// AbortState keeps the first abort's reason: later calls throw at once with
// "<collective>: communicator aborted by an earlier error: <reason>", and the ranks waiting when
// it happened get AbortState::error_for(their label). A rank that fails (Communicator::abort, a
// failed device) is a peer failure: "<collective> (collective #n ...): rank R failed: <reason>",
// built by peer_failure(), the one place that gives that error its type.
// Neither class locks: the communicator that owns them holds its mutex around every call.
//
// Note [Slow collective warning]
// A rank that never arrives used to be silent until the timeout (300 s by default: the default
// GPT trainer's "nothing happens" for five minutes). When a round has waited
// comm_warn_after_ms() (10 s; DITTO_COMM_WARN_AFTER_MS=N sets N ms, 0 turns it off) since its
// first rank arrived, the backend's waiter prints one line to stderr, once per round:
//   ditto: warning: all_reduce (collective #3 on this communicator): waited 10 s for rank 2
//   (communicator of 4 ranks); it fails with a timeout after 300000 ms
// (Rendezvous::warn_if_due; the backends wake at Rendezvous::next_due; under mpirun
// MpiLink::start, whose exchange of the ranks' calls is the rendezvous, prints it since this
// rank's call, "(communicator of 4 ranks in MPI processes)": before (tester C, C3) a rank of an
// mpirun job waited silently until the timeout). torch's
// ProcessGroupNCCL watchdog and NCCL_DEBUG=WARN give such progress-less lines too; this is one.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backend_api/collective_call.h"

namespace ditto::detail {

/// "all_reduce (collective #3 on this communicator)": how errors name collective #seq.
std::string collective_label(CollectiveKind kind, std::uint64_t seq);

/// "rank 3" or "ranks 2, 3".
std::string ranks_str(const std::vector<int>& ranks);

/// "<label>: timed out after <timeout_ms> ms waiting for <ranks> (communicator of <n> ranks<in>;
/// it is now aborted)"; `in` qualifies the ranks, e.g. " in MPI processes".
std::string timeout_reason(const std::string& label, std::int64_t timeout_ms,
                           const std::vector<int>& missing, int n, const char* in = "");

/// How long a round waits before its warning (Note [Slow collective warning]): the environment
/// variable DITTO_COMM_WARN_AFTER_MS (a non-negative integer of ms, 0: never), read on each
/// call, else 10000. A value that is not such an integer is ignored (10000).
std::int64_t comm_warn_after_ms();

/// "ditto: warning: <label>: waited <s> s <what>; it fails with a timeout after <timeout_ms> ms"
/// (<s> s, or <ms> ms when not whole seconds).
std::string slow_warning(const std::string& label, std::int64_t waited_ms, const std::string& what,
                         std::int64_t timeout_ms);

/// slow_warning's "... waited <s> s for <ranks> (communicator of <n> ranks<in>); it fails with a
/// timeout after <timeout_ms> ms"; `in` as timeout_reason's.
std::string wait_warning(const std::string& label, std::int64_t waited_ms,
                         const std::vector<int>& missing, int n, std::int64_t timeout_ms,
                         const char* in = "");

/// Prints `line` and a newline to stderr at once (one write, so lines of several threads do not
/// interleave).
void print_warning(const std::string& line) noexcept;

/// The error of a collective that fails because rank `failed_rank` failed; `message` says so
/// ("... rank R failed: <reason>"). The one place such errors are made: their type changes here.
std::exception_ptr peer_failure(const std::string& message, int failed_rank);

/// One communicator's abort state (ncclCommAbort): set once, the first reason kept.
class AbortState {
 public:
  enum class Cause : std::uint8_t {
    error,    ///< a failure of the communicator itself (enqueue failed, misuse)
    timeout,  ///< a rank did not arrive in time
    peer      ///< a rank failed (Communicator::abort): reason "rank R failed: ..."
  };

  bool aborted() const { return aborted_; }
  Cause cause() const { return cause_; }
  const std::string& reason() const { return reason_; }
  /// The rank that failed, or -1.
  int failed_rank() const { return failed_rank_; }

  /// Aborts with `reason`; false (nothing changes) when already aborted. `failed_rank` (>= 0)
  /// when a rank's failure caused it (the reason then names that rank).
  bool abort(Cause cause, std::string reason, int failed_rank = -1) noexcept;
  /// Communicator::abort on behalf of `rank`: abort(peer, "rank <rank> failed: <reason>", rank);
  /// false when already aborted. Never throws: when the message cannot be built, only the flag
  /// is set (the flag is what matters).
  bool rank_failed(int rank, const std::string& reason) noexcept;

  /// Throws, once aborted, PeerFailure "<kind>: communicator aborted by an earlier error:
  /// <reason>" (core/base/error.h; failed_rank() is the rank that failed, or -1).
  void throw_if_aborted(CollectiveKind kind) const;
  /// What a rank that waited in collective `label` throws now that the communicator is aborted:
  /// Timeout(reason) after a timeout; "<label>: <reason>" when a rank failed (peer_failure);
  /// else BackendError(reason).
  std::exception_ptr error_for(const std::string& label) const;

 private:
  bool aborted_ = false;
  Cause cause_ = Cause::error;
  int failed_rank_ = -1;
  std::string reason_;
};

/// The ranks' calls of each collective, matched by ordinal (Note [Rendezvous]). CallT is
/// CollectiveCall or a backend's call record derived from it (e.g. with the rank's stream).
template <typename CallT>
class Rendezvous {
 public:
  using Clock = std::chrono::steady_clock;

  /// Collective #seq while its ranks arrive, and its outcome for waiters that block.
  struct Round {
    Round(int n, std::uint64_t ordinal, Clock::time_point due, Clock::time_point warn)
        : seq(ordinal),
          deadline(due),
          warn_at(warn),
          calls(static_cast<std::size_t>(n)),
          here(static_cast<std::size_t>(n), 0) {}
    enum class State : std::uint8_t { waiting, done, failed };

    const std::uint64_t seq;
    const Clock::time_point deadline;  ///< the first rank's arrival + timeout
    const Clock::time_point warn_at;   ///< Note [Slow collective warning]; max(): never
    bool warned = false;
    std::vector<CallT> calls;  ///< calls[r]: rank r's call, once here[r]
    std::vector<char> here;
    int arrived = 0;
    State state = State::waiting;
    std::exception_ptr error;  ///< when failed: what every rank throws

    /// The ranks whose call has not arrived.
    std::vector<int> missing() const {
      std::vector<int> m;
      for (std::size_t q = 0; q < here.size(); ++q)
        if (!here[q]) m.push_back(static_cast<int>(q));
      return m;
    }
  };

  Rendezvous(int n, std::int64_t timeout_ms)
      : n_(n),
        timeout_ms_(timeout_ms),
        warn_after_ms_(comm_warn_after_ms()),
        seq_(static_cast<std::size_t>(n), 0) {}

  int size() const { return n_; }
  std::int64_t timeout_ms() const { return timeout_ms_; }
  AbortState& abort_state() { return abort_; }
  const AbortState& abort_state() const { return abort_; }

  /// Rank `rank`'s next collective: counts it and returns its round, opened (with its deadline)
  /// by the first rank to reach it.
  std::shared_ptr<Round> enter(int rank) {
    const std::uint64_t seq = ++seq_[static_cast<std::size_t>(rank)];
    std::shared_ptr<Round>& slot = open_[seq];
    if (!slot) {
      const Clock::time_point due = comm_deadline<Clock>(timeout_ms_);
      const Clock::time_point warn = warn_after_ms_ > 0 && warn_after_ms_ < timeout_ms_
                                         ? comm_deadline<Clock>(warn_after_ms_)
                                         : Clock::time_point::max();
      slot = std::make_shared<Round>(n_, seq, due, warn);
    }
    return slot;
  }

  /// When a waiter of `round` should wake next: its warning time until it has warned, then its
  /// deadline (Note [Slow collective warning]).
  Clock::time_point next_due(const Round& round) const {
    return round.warned ? round.deadline : std::min(round.warn_at, round.deadline);
  }

  /// Prints the round's warning (naming the ranks missing) when its time has come and it has
  /// not been printed; `kind` is the waiter's call. Note [Slow collective warning].
  void warn_if_due(Round& round, CollectiveKind kind) const {
    if (round.warned || round.state != Round::State::waiting || Clock::now() < round.warn_at)
      return;
    round.warned = true;
    print_warning(wait_warning(collective_label(kind, round.seq), warn_after_ms_, round.missing(),
                               n_, timeout_ms_));
  }

  /// Publishes rank `rank`'s call in `round`; true when it completes the round, which is then
  /// closed (no longer open): the caller checks mismatch() and runs the collective.
  bool arrive(Round& round, int rank, CallT call) {
    round.calls[static_cast<std::size_t>(rank)] = std::move(call);
    round.here[static_cast<std::size_t>(rank)] = 1;
    if (++round.arrived < n_) return false;
    open_.erase(round.seq);
    return true;
  }

  /// Empty when every rank's call matches rank 0's; else what every rank throws.
  std::string mismatch(const Round& round) const {
    return find_call_mismatch(round.calls, round.seq);
  }

  /// The Timeout reason of `round` for a waiter whose call is `kind`.
  std::string timeout_reason(const Round& round, CollectiveKind kind) const {
    return detail::timeout_reason(collective_label(kind, round.seq), timeout_ms_, round.missing(),
                                  n_);
  }

  /// Whether round #seq is still open (some rank has not arrived).
  bool is_open(std::uint64_t seq) const { return open_.count(seq) != 0; }
  /// The open rounds, by ordinal.
  const std::map<std::uint64_t, std::shared_ptr<Round>>& open() const { return open_; }
  /// Forgets the open rounds (the communicator aborted; their waiters were told).
  void close_all() { open_.clear(); }

 private:
  const int n_;
  const std::int64_t timeout_ms_;
  const std::int64_t warn_after_ms_;  ///< Note [Slow collective warning]
  std::vector<std::uint64_t> seq_;    ///< calls entered per rank
  std::map<std::uint64_t, std::shared_ptr<Round>> open_;
  AbortState abort_;
};

}  // namespace ditto::detail
