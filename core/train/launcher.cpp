// launch_ranks, RankBarrier and root_error (launcher.h).
#include "core/train/launcher.h"

#include <thread>

#include "core/dist/distributed.h"
#include "core/runtime/error.h"

namespace ditto::train {

void RankBarrier::throw_failure() const {
  throw PeerFailure(detail::cat("rank barrier: ", failure_), failed_rank_);
}

void RankBarrier::arrive(const std::function<void()>& last) {
  std::unique_lock lk(mu_);
  if (!failure_.empty()) throw_failure();
  const std::uint64_t gen = generation_;
  if (++arrived_ == ranks_) {
    try {
      if (last) last();
    } catch (const std::exception& e) {
      failure_ = detail::cat("the epoch's cost snapshot failed: ", e.what());
      cv_.notify_all();
      throw;
    }
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lk, [&] { return generation_ != gen || !failure_.empty(); });
  if (generation_ == gen) throw_failure();
}

void RankBarrier::abort(int rank, const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (failure_.empty()) {
      failure_ = detail::cat("rank ", rank, " failed: ", why);
      failed_rank_ = rank;
    }
  }
  cv_.notify_all();
}

std::exception_ptr root_error(const std::vector<std::pair<int, std::exception_ptr>>& errors) {
  for (const auto& [r, e] : errors) {
    try {
      std::rethrow_exception(e);
    } catch (const PeerFailure& p) {
      if (p.failed_rank() == r) return e;  // this rank's own failure, echoed back to it
    } catch (...) {
      return e;
    }
  }
  return errors.front().second;
}

void launch_ranks(const std::vector<Device>& devices, const CommOptions& options,
                  RankBarrier* barrier, const std::function<void(Communicator&)>& body,
                  const std::function<void()>& after) {
  if (dist::is_initialized()) {
    DITTO_CHECK(!devices.empty(), "launch_ranks: devices: expected this process's device");
    Communicator comm =
        Communicator::init_rank(devices[0], dist::world_size(), dist::rank(), options);
    try {
      body(comm);
    } catch (const std::exception& e) {
      comm.abort(e.what());  // the other processes fail now, naming this rank
      throw;
    }
    if (after) after();
    return;
  }
  std::vector<Communicator> comms = Communicator::init_all(devices, options);
  std::mutex errors_mu;
  std::vector<std::pair<int, std::exception_ptr>> errors;  // in the order the ranks failed
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(comms.size()); ++r)
    threads.emplace_back([&, r] {
      try {
        body(comms[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        {
          std::lock_guard lk(errors_mu);
          errors.emplace_back(r, std::current_exception());
        }
        comms[static_cast<std::size_t>(r)].abort(e.what());  // the others fail now, naming r
        if (barrier) barrier->abort(r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (!errors.empty()) std::rethrow_exception(root_error(errors));
  if (after) after();
}

}  // namespace ditto::train
