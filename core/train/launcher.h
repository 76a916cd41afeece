// The launcher of ranks: one host thread per device in this process, or, when the process was
// started by mpirun (dist::is_initialized()), this process's one rank. The first rank to fail
// aborts its communicator and the RankBarrier, so the others fail at once with a PeerFailure
// naming it; the error rethrown is the root one (root_error): by type and field, not by message.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/device.h"

namespace ditto::train {

/// The ranks of one process meet here (e.g. at each epoch's start and end, so that the cost
/// model's totals are read while every rank is between epochs). A failed rank calls abort(): the
/// others throw PeerFailure naming it instead of waiting.
class RankBarrier {
 public:
  explicit RankBarrier(int ranks) : ranks_(ranks) {}
  /// Waits for every rank; the last to arrive runs `last` first (its exception aborts the
  /// barrier and is rethrown on that rank). Throws PeerFailure once aborted.
  void arrive(const std::function<void()>& last);
  /// Every waiting and later arrive() throws PeerFailure "rank R failed: <why>" (first call wins).
  void abort(int rank, const std::string& why);

 private:
  [[noreturn]] void throw_failure() const;
  const int ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::string failure_;  // non-empty: aborted
  int failed_rank_ = -1;
};

/// Of the (rank, error) pairs of a failed run in the order the ranks failed: the first error a
/// rank raised on its own (not a PeerFailure whose failed_rank() is another rank or unknown),
/// else the first.
std::exception_ptr root_error(const std::vector<std::pair<int, std::exception_ptr>>& errors);

/// Settings of one rank that must agree across ranks, in a canonical order: (name, value) pairs
/// such as {"--micro-shards", "8"}, named as the user knows them (a command-line option).
using RankSettings = std::vector<std::pair<std::string, std::string>>;

/// The first disagreement among the ranks' settings (`per_rank[r]` is rank r's), "" when they all
/// agree: "ranks disagree on NAME: rank 0 has A, rank R has B", for the first rank R (in rank
/// order) that differs from rank 0 and the first name (in rank 0's order, then R's) on which they
/// differ; a name one of them lacks, or an empty value, has "(not set)". A name given twice is
/// compared occurrence by occurrence (its k-th value against the other's k-th).
std::string settings_disagreement(const std::vector<RankSettings>& per_rank);

/// The configuration check at a run's start, as torchrun's rendezvous: under mpirun
/// (dist::is_initialized) every process contributes `mine` (dist::all_gather_text: one
/// fixed-size record of its hash, the settings themselves only when the hashes differ), and
/// every process throws the same InvalidArgument (settings_disagreement) on a mismatch. Call it
/// before anything that depends on the settings (a communicator, a validation that could fail on
/// one rank only). Collective under mpirun; outside it a no-op (the ranks are threads sharing
/// one configuration: see launch_ranks' `settings`). Throws Timeout when a process does not
/// arrive within `timeout_ms`.
void check_ranks_agree(const RankSettings& mine,
                       std::int64_t timeout_ms = CommOptions{}.timeout_ms);

/// check_ranks_agree for a rank that may have refused its own arguments or inputs before the
/// run (its --data file missing, a path only it cannot write): `refused` (when set) is that
/// error, carried in the exchange instead of the rank's settings, so that no rank waits for a
/// timeout on a rank that will never arrive. When some rank refused, a refusing rank rethrows
/// its own `refused` and every other rank throws PeerFailure "rank R refused its arguments:
/// <its error>" (failed_rank() R, the first refusing rank; "(and N more ranks)" when others
/// refused too); otherwise a disagreement among the settings throws as check_ranks_agree's.
/// Outside mpirun (or with one process) it rethrows `refused` when set.
void check_ranks_agree(const RankSettings& mine, std::int64_t timeout_ms,
                       const std::exception_ptr& refused);

/// A process of an mpirun job that refuses its arguments before Trainer::fit (a --data file it
/// cannot read, a setting its Trainer refuses): joins fit()'s first exchange (check_ranks_agree)
/// carrying `refused`, so that every other rank fails at once naming this one ("rank R refused
/// its arguments: ...") instead of waiting for it, then rethrows `refused`. Outside mpirun it
/// only rethrows. `refused` must be set.
[[noreturn]] void refuse_run(const std::exception_ptr& refused,
                             std::int64_t timeout_ms = CommOptions{}.timeout_ms);

/// Runs `body(comm)` for every rank: under mpirun this process's rank (dist::rank() of
/// dist::world_size(), on devices[0]: Communicator::init_rank); otherwise one thread per device of
/// `devices` (Communicator::init_all). A rank whose body throws (anything, also an exception not
/// derived from std::exception, e.g. a callback's `throw 42`) aborts its communicator (and
/// `barrier`, when given); once every rank is done, the root error is rethrown as it was thrown
/// (the others see PeerFailure naming that rank). Otherwise
/// `after` (when set) runs on the calling thread while the communicators are still alive.
/// Before any communicator exists the ranks check that they agree (check_ranks_agree): on
/// `settings(rank)` when given, and under mpirun also on options.determinism (named
/// "CommOptions::determinism"; one process's CommOptions can differ from another's); a mismatch
/// throws InvalidArgument naming the setting, both values and both ranks, on every rank, and no
/// body runs. A `settings(rank)` that throws is that rank refusing its arguments: under mpirun
/// every other process then throws PeerFailure "rank R refused its arguments: ..." at once (not
/// after the timeout); with threads the exception propagates before any rank starts.
/// A rank's thread that cannot be created (std::thread's std::system_error: no room for its
/// stack under `ulimit -v`, too many threads) is a ditto::Error "launch_ranks: cannot create the
/// thread of rank R of N: <system reason> (...)": the ranks already started are failed naming R
/// and joined before it is thrown.
void launch_ranks(const std::vector<Device>& devices, const CommOptions& options,
                  RankBarrier* barrier, const std::function<void(Communicator&)>& body,
                  const std::function<void()>& after = {},
                  const std::function<RankSettings(int rank)>& settings = {});

/// Test-only: when set to a rank r >= 0, launch_ranks fails to create rank r's thread as the
/// system would (Resource temporarily unavailable). -1 (the default) unsets it. Not thread-safe.
int& rank_thread_failure_for_testing();

}  // namespace ditto::train
