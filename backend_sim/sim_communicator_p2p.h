// The simulator's point-to-point calls (Communicator::send / recv, ncclSend / ncclRecv) of one
// communicator: batches per rank, matching by position (core/backend_api/p2p_match.h), host copies,
// timeouts, abort and virtual time.
//
// Note [Sim point-to-point]
// A rank's send and recv calls issued by one host thread between group_start() and group_end()
// (CommunicatorImpl's group hooks, which core calls per thread; one thread may drive several
// ranks) form ONE batch per rank and stream, enqueued as one parked task on that stream at
// group_end (after whatever the thread enqueued on the stream inside the group, collectives
// included). Outside a group each call is a batch of one, enqueued at once. When the stream
// reaches a batch, it posts all its calls to the communicator's P2PMatcher (Note
// [Point-to-point matching]): every call whose partner is already posted is matched, and the
// pair's bytes are copied (memcpy: device memory is host memory) by the thread of the batch
// that completed the match, outside the lock; the other calls wait, and the batch's stream parks
// (no thread held, Note [Sim executor]). A batch's stream resumes when every one of its calls is
// done; a mismatched pair (count or dtype) fails both batches with the same InvalidArgument and
// the communicator stays usable, as after a collective's mismatch.
// So a ring in one group (every rank sends to r+1 and receives from r-1) completes, driven by
// one thread or by a thread per rank, and so does a send to oneself in a group. Without a group,
// a rank's send and its recv are two batches run in order on its stream: a send blocks the
// stream until its recv is posted, so the calls must not form a cycle (rank 0 sends to 1 then
// receives from 1, while rank 1 receives from 0 then sends to 0 works; both sending first, a ring
// of ungrouped sends, or an ungrouped send to oneself waits until the timeout, as with NCCL).
// Timeouts: a batch whose calls are not all matched arms a deadline on the Watchdog
// (CommOptions::timeout_ms after it started); when it passes, the communicator is aborted with
// the ditto::Timeout reason of the batch's first waiting call ("send (point-to-point #k from
// rank A to rank B): rank B did not post the matching recv from rank A within T ms"), and every
// parked batch and collective fails with it. An abort from elsewhere (a collective's timeout,
// Communicator::abort of a failed rank, a failed device) fails every parked batch at once with
// AbortState::error_for(its call's label), e.g. "recv (point-to-point #1 from rank 2 to rank 0):
// rank 2 failed: <reason>"; batches that start later throw "send: communicator aborted by an
// earlier error: ...". A copy under way when the abort comes finishes first (the streams of both
// sides stay parked until it has), so no buffer is freed under a copy.
// Virtual time (Note [Virtual time], cost_model.h): a pair's transfer starts when the later of
// its two batches started (their stream clocks at arrival) and lasts one point-to-point message
// over the link between the two devices (collective_time's send: a + h + S / B; a local copy
// for a send to oneself); the transfers of one batch overlap (NCCL runs them on separate
// channels): the batch is busy from its first transfer's start to its last one's end, where its
// stream clock then stands. A mismatched or failed batch costs nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/cost_model.h"
#include "backend_sim/sim_stream.h"
#include "core/backend_api/p2p_match.h"
#include "core/backend_api/rendezvous.h"

namespace ditto::sim {

/// The point-to-point calls of one simulator communicator (Note [Sim point-to-point]). Made with
/// std::make_shared (its parked tasks and timers hold it).
class SimP2P : public std::enable_shared_from_this<SimP2P> {
 public:
  using Cause = detail::AbortState::Cause;
  /// Aborts the owning communicator (its first reason stays), which then calls abort() here with
  /// its abort state: how a point-to-point timeout or failed device reaches the collectives.
  /// Called without SimP2P's lock held; must not throw.
  using AbortFn = std::function<void(Cause cause, std::string reason, int failed_rank)>;

  /// `devices`: the global device index of each rank (for the cost model); `timeout_ms`: the
  /// communicator's timeout; `cost` may be null (no virtual time).
  SimP2P(std::vector<int> devices, std::int64_t timeout_ms, std::shared_ptr<CostModel> cost);
  ~SimP2P();

  /// Rank `rank`'s send or recv (`call.kind`; core checked the arguments, the owner that the
  /// communicator is not aborted) on `stream`, a stream of the rank's device. Inside a group of
  /// the calling thread it joins that group's batch for (rank, stream); else it is enqueued now
  /// as a batch of one. `abort` is how this batch aborts the owner (AbortFn).
  void enqueue(int rank, SimStream& stream, const detail::CollectiveCall& call, AbortFn abort);

  /// CommunicatorImpl::group_start / group_end of the calling thread: the batches collected in
  /// between are enqueued, in the order of their first call, by group_end.
  void group_start();
  void group_end();

  /// The owner aborted with `state` (its AbortState, copied): parked batches fail now, later
  /// ones when their stream reaches them.
  void abort(const detail::AbortState& state) noexcept;

 private:
  struct Batch;
  struct Call;  // a CollectiveCall with its batch and index, as the matcher holds it
  struct Copy;  // a matched pair whose bytes are to be copied
  using Clock = std::chrono::steady_clock;

  void start(const std::shared_ptr<Batch>& batch, Resume resume);
  /// Posts the batch's calls (mu_ held); matched pairs go to `copies`.
  void post_locked(const std::shared_ptr<Batch>& batch, std::vector<Copy>& copies,
                   std::vector<std::shared_ptr<Batch>>& done);
  /// Marks call `index` of `batch` done with `error` (may be null); a batch whose calls are all
  /// done is appended to `done` (mu_ held).
  void call_done_locked(const std::shared_ptr<Batch>& batch, std::size_t index,
                        std::exception_ptr error, std::vector<std::shared_ptr<Batch>>& done);
  void copy_and_finish(std::vector<Copy>& copies, std::vector<std::shared_ptr<Batch>>& done);
  /// Charges virtual time and resumes the finished batches (mu_ not held).
  void resume_done(const std::vector<std::shared_ptr<Batch>>& done);
  void on_timeout(const std::shared_ptr<Batch>& batch);

  const std::vector<int> devices_;
  const std::int64_t timeout_ms_;
  const std::shared_ptr<CostModel> cost_;

  std::mutex mu_;  // guards everything below
  std::unique_ptr<detail::P2PMatcher<Call>> matcher_;
  detail::AbortState abort_;  // a copy of the owner's, once it aborted
  std::map<std::thread::id, std::vector<std::shared_ptr<Batch>>> groups_;  // open groups
};

}  // namespace ditto::sim
