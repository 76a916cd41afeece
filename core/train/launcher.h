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

/// Runs `body(comm)` for every rank: under mpirun this process's rank (dist::rank() of
/// dist::world_size(), on devices[0]: Communicator::init_rank); otherwise one thread per device of
/// `devices` (Communicator::init_all). A rank whose body throws aborts its communicator (and
/// `barrier`, when given); once every rank is done, the root error is rethrown. Otherwise
/// `after` (when set) runs on the calling thread while the communicators are still alive.
void launch_ranks(const std::vector<Device>& devices, const CommOptions& options,
                  RankBarrier* barrier, const std::function<void(Communicator&)>& body,
                  const std::function<void()>& after = {});

}  // namespace ditto::train
