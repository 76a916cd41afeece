// The simulator's collectives: shared-memory all_reduce, reduce, broadcast, all_gather,
// reduce_scatter, all_to_all, all_to_all_v, gather, scatter and barrier across virtual devices,
// on every dtype and op, with call matching, timeouts and abort.
//
// Note [Sim collectives]
// Every virtual device's memory is host memory of this process, so a collective needs no
// transport: the ranks' buffers are read and written directly once all of them have arrived. No
// thread ever blocks waiting for the other ranks (Note [Sim executor] in sim_executor.h). Each
// rank's call enqueues ONE parking task on the given stream; when the stream reaches it:
//   1. the rank publishes its call (kind, pointers, count, dtype, op, root) in its slot of the
//      shared state and parks its stream (no thread held). The first rank to arrive arms a
//      deadline on the Watchdog;
//   2. the LAST rank to arrive disarms it and checks that every rank called the same collective
//      with the same count, dtype, op and root (a mismatch fails every rank with the same
//      InvalidArgument, e.g. "all_reduce: rank 2 called with count 10, rank 0 with count 12 ...",
//      and nothing is written);
//   3. it then splits the data work into per-rank shares, run as jobs on the pool (its own thread
//      takes the first), so that every byte moves about once and the ranks work in parallel:
//        all_reduce      share r reduces element slice r (ceil(count / N) elements) across all
//                        ranks' send buffers into a small local block, then writes the block into
//                        every rank's recv at slice r;
//        reduce          the same, writing only the root's recv;
//        broadcast       share r copies slice r of the root's send into every recv;
//        all_gather      share r copies rank r's send into every recv at offset r * count;
//        reduce_scatter  share r reduces block r across all ranks' send into rank r's recv;
//        all_to_all      share r copies rank r's send block q into rank q's recv at block r;
//        all_to_all_v    the same with each rank's counts and displacements;
//        gather          share r copies rank r's send into the root's recv at offset r * count;
//        scatter         share r copies block r of the root's send into rank r's recv;
//        barrier         nothing;
//      Only share r touches slice (or block) r of any buffer, so in-place calls (send == recv, or
//      send inside recv for all_gather / recv inside send for reduce_scatter) are race-free: the
//      reduction of a slice is finished in the local block before it is written back;
//   4. the job that finishes last resumes every rank's stream, so that no rank goes on (and lets
//      its stream reuse or free its buffers, or publish its next call) while shares still read or
//      write them.
// Virtual time (Note [Virtual time], cost_model.h): each rank's stream clock is read when it
// arrives; the last rank to arrive (step 2, while every other stream is parked) starts the
// collective at the latest arrival and moves every rank's clock to that start plus the cost
// model's estimate, before anything is resumed. A mismatched call costs nothing.
// The element reduction over ranks (sim_comm_kernels.h, Note [Reductions over ranks] in
// core/numerics/reduce_math.h) follows the canonical tree over rank index in Determinism::bitwise
// (Note [Canonical tree], done on blocks of elements) and runs left to right in fast mode, in the
// accumulator of the dtype, rounded once; premul_sum scales each rank's values by its own scalar.
// Point-to-point calls (send / recv) are not collectives: enqueue() hands them to their own
// matching (sim_communicator_p2p.h).
//
// Matching, the deadline and the abort state are the shared rendezvous's (Note [Rendezvous],
// core/backend_api/rendezvous.h), so the messages read as on every backend. When the deadline
// (CommOptions::timeout_ms after the first arrival) passes before the last rank arrives, every
// waiting rank fails with ditto::Timeout naming the collective, its ordinal on this communicator
// and the ranks that never arrived; the communicator is then aborted: queued tasks fail when
// they run, and every later call throws BackendError at once (like ncclCommAbort). A
// rank whose device failed (fault injection, sim_faults.h) aborts it at once instead, and the
// others fail with a BackendError naming that rank, "<collective>: rank R failed: <reason>",
// the message parked ranks get when a rank's trainer calls Communicator::abort(reason) (DDP does
// when a rank's step throws); later calls throw "<collective>: communicator aborted by an earlier
// error: " and the reason. A mismatch does not abort: all ranks fail that one call together and
// stay in step.
//
// Like NCCL, a single host thread must enqueue the call on every rank before it blocks on any of
// them (e.g. a blocking host copy on a rank's stream), or the ranks wait for each other until the
// timeout. A rank's collectives must run one at a time (issue them on one stream per rank, or
// order the streams); a second collective starting on a rank whose previous one is still running
// aborts the communicator with an error that says so.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_comm_kernels.h"
#include "backend_sim/sim_communicator_p2p.h"
#include "backend_sim/sim_executor.h"
#include "core/backend_api/collective_call.h"
#include "core/backend_api/rendezvous.h"
#include "core/base/error.h"

namespace ditto::sim {
namespace {

using Kind = detail::CollectiveKind;
using Call = detail::CollectiveCall;
using detail::uses_op;
using detail::uses_root;
inline const char* kind_name(Kind k) { return detail::collective_name(k); }

// ---- stores of finished blocks ----------------------------------------------------------------

// Note [Streaming stores]
// A collective over large buffers writes each destination line once and does not read it again
// soon; an ordinary store first reads the line (read-for-ownership), so every written byte costs a
// read too, and evicts lines the reduction still needs (out-of-place all_reduce of 4 MiB over 4
// ranks ran 4x slower than in-place here). When a call writes more than kStreamBytes in all (more
// than a core's L2), the finished blocks go out with non-temporal stores where the CPU has them
// (x86; one sfence at the end of each job's shares orders them before the job counts itself
// done and the last job resumes the ranks, Note [Sim collectives]).
// Only the store instruction changes: the values are the same bits.
constexpr std::size_t kStreamBytes = std::size_t(4) << 20;
constexpr std::int64_t kCopyBlock = 4096;  // elements per block of broadcast / all_gather copies

// Note [Small collectives]
// Posting a share to another pool thread costs a wake-up and a context switch (several
// microseconds, more than moving a few hundred KiB takes on one core), so a call that writes at
// most kInlineBytes in all, and reads at most that much in a reduction (a 64 KiB broadcast,
// all_gather or all_reduce over 8 ranks writes 512 KiB), runs whole on the thread of the last
// rank to arrive: no job is posted. Before, a 64 KiB broadcast over 4 ranks (256 KiB, counted as
// one rank's buffer times the ranks) was split into 4 jobs. The other ranks' streams are resumed
// from there (Resume::here): one whose next task is again a collective (back-to-back calls)
// carries on on that same thread, others are handed to their pool threads, with no wake-up while
// these still spin on them (Note [Stream hand-offs], sim_stream.cpp). A small call's arrival is
// short work (Note [Inline work], sim_stream.cpp): on an idle stream it runs on the enqueuing
// thread at once, so one host thread that issues a small collective on every rank (a benchmark,
// DataParallel) runs the whole call itself, with no pool thread woken; 64 KiB broadcasts over 2
// ranks went from 0.35x OpenMPI to 2-3.5x. The shares and the order of every reduction are the
// same: only which thread runs them changes.
constexpr std::int64_t kInlineBytes = std::int64_t(512) << 10;

inline void store_block(void* dst, const void* src, std::size_t bytes, bool stream) {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  if (stream) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
#if defined(__AVX512F__)
    constexpr std::size_t kVec = 64;
#elif defined(__AVX__)
    constexpr std::size_t kVec = 32;
#else
    constexpr std::size_t kVec = 16;
#endif
    // Unaligned head with ordinary stores, aligned body streamed, tail ordinary.
    std::size_t head = (kVec - reinterpret_cast<std::uintptr_t>(d) % kVec) % kVec;
    if (head > bytes) head = bytes;
    std::memcpy(d, s, head);
    std::size_t i = head;
    for (; i + kVec <= bytes; i += kVec) {
#if defined(__AVX512F__)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i),
                          _mm512_loadu_si512(reinterpret_cast<const void*>(s + i)));
#elif defined(__AVX__)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
#else
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
#endif
    }
    std::memcpy(d + i, s + i, bytes - i);
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, bytes);
}

inline void store_fence(bool stream) {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  if (stream) _mm_sfence();
#endif
  (void)stream;
}

// ---- the communicator -----------------------------------------------------------------------

// One rank's call as its round holds it: the call, the rank's stream and its clock at arrival.
struct SimCall : Call {
  SimCall() = default;
  SimCall(const Call& c, SimStream* s, VTime t) : Call(c), stream(s), arrival(t) {}
  SimStream* stream = nullptr;
  VTime arrival{};
};

using Cause = detail::AbortState::Cause;

class SimCommunicator final : public CommunicatorImpl,
                              public std::enable_shared_from_this<SimCommunicator> {
 public:
  SimCommunicator(std::vector<int> devices, const CommOptions& options,
                  std::shared_ptr<CostModel> cost, std::shared_ptr<FaultState> faults)
      : devices_(std::move(devices)),
        options_(options),
        cost_(std::move(cost)),
        n_(static_cast<int>(devices_.size())),
        faults_(std::move(faults)),
        rv_(n_, faults_ ? faults_->config.comm_timeout_ms.value_or(options.timeout_ms)
                        : options.timeout_ms),
        in_flight_(devices_.size(), 0),
        labels_(devices_.size()),
        waiters_(devices_.size()),
        p2p_(std::make_shared<SimP2P>(devices_, rv_.timeout_ms(), cost_)) {}

  // Throws at once when aborted; otherwise enqueues the rank's parking task.
  void enqueue(int rank, Stream& s, const Call& call) override {
    SimStream& ss = as_sim(s, kind_name(call.kind));
    {
      std::lock_guard lk(mu_);
      rv_.abort_state().throw_if_aborted(call.kind);
    }
    if (detail::is_p2p(
            call.kind)) {  // send / recv: Note [Sim point-to-point], sim_communicator_p2p.h
      p2p_->enqueue(rank, ss, call, [self = shared_from_this()](Cause c, std::string why, int f) {
        std::unique_lock lk(self->mu_);
        self->abort_locked(lk, c, std::move(why), f);
      });
      return;
    }
    auto start = [self = shared_from_this(), rank, call, &ss](Resume r) {
      self->arrive(rank, call, ss, r);
    };
    // A small call's arrival may run on this thread at once, and when it is the last rank's the
    // whole call with it (Note [Inline work], sim_stream.cpp; Note [Small collectives]): a
    // host thread that issues a small collective on every rank runs it with no hand-off. A large
    // one is left to the pool, so that the host (DDP's bucket all_reduce) goes on meanwhile.
    if (inline_bytes(call) <= kInlineBytes)
      ss.enqueue_parked_short(std::move(start));
    else
      ss.enqueue_parked(std::move(start));
  }

  void group_start() override { p2p_->group_start(); }
  void group_end() override { p2p_->group_end(); }

  void abort(int rank, const std::string& reason) noexcept override {
    std::unique_lock lk(mu_);
    if (rv_.abort_state().rank_failed(rank, reason)) release_parked(lk);  // else the first stays
  }

 private:
  using Round = detail::Rendezvous<SimCall>::Round;

  // One collective whose ranks have all arrived: the calls, the shares still running, and the
  // streams to resume when they are done (Note [Sim collectives], steps 3 and 4).
  struct Work {
    std::vector<SimCall> calls;
    std::vector<Resume> resumes;
    std::string mismatch;         // non-empty: every rank fails with it, nothing runs
    std::atomic<int> pending{0};  // jobs still running
    std::mutex mu;
    std::exception_ptr error;  // first error of a job (host out of memory)
  };

  // Aborts with `reason` (the first reason stays) and resumes every parked rank with the error
  // AbortState::error_for gives its collective. Called with `lk` held; returns with it released.
  void abort_locked(std::unique_lock<std::mutex>& lk, Cause cause, std::string reason,
                    int failed_rank = -1) {
    rv_.abort_state().abort(cause, std::move(reason), failed_rank);
    release_parked(lk);
  }

  void release_parked(std::unique_lock<std::mutex>& lk) {
    if (timer_) Watchdog::instance().cancel(*timer_);
    timer_.reset();
    // Dropped once the lock is released (a caller holds another reference meanwhile).
    const std::shared_ptr<SimCommunicator> keep = std::move(keep_alive_);
    std::vector<std::pair<Resume, std::exception_ptr>> parked;
    for (std::size_t q = 0; q < waiters_.size(); ++q)
      if (waiters_[q]) {
        // One exception object per rank: each stream rethrows its own (none shared by threads).
        parked.emplace_back(*waiters_[q], rv_.abort_state().error_for(detail::collective_label(
                                              labels_[q].first, labels_[q].second)));
        waiters_[q].reset();
        in_flight_[q] = 0;
      }
    rv_.close_all();
    const detail::AbortState state = rv_.abort_state();
    lk.unlock();
    // Moved: this thread keeps no reference to an exception the resumed rank may be reading.
    for (auto& [r, error] : parked) r(std::move(error));
    p2p_->abort(state);  // its parked batches fail too
  }

  bool skipped(int rank, std::uint64_t seq) const {
    if (!faults_) return false;
    const auto& faults = faults_->config.faults;
    for (std::size_t i = 0; i < faults.size(); ++i) {
      const Fault& f = faults[i];
      if (f.kind == Fault::Kind::skip_collective && f.rank == rank &&
          static_cast<std::uint64_t>(f.index) + 1 == seq) {
        faults_->fired[i].store(true);
        return true;
      }
    }
    return false;
  }

  // The parking task of one rank, on a pool thread (Note [Sim collectives], steps 1 and 2).
  void arrive(int rank, const Call& call, SimStream& stream, Resume resume) {
    const DeviceHealth* health = stream.health();
    std::unique_lock lk(mu_);
    rv_.abort_state().throw_if_aborted(call.kind);
    const auto r = static_cast<std::size_t>(rank);
    const std::shared_ptr<Round> round = rv_.enter(rank);
    // Built only for an error: a string per rank per call was a visible part of a small call.
    auto label = [&] { return detail::collective_label(call.kind, round->seq); };
    if (in_flight_[r]) {
      std::string why = detail::cat(label(), ": rank ", rank,
                                    " started a collective while its previous one was still "
                                    "running (on another stream); a rank's collectives must run "
                                    "one at a time");
      abort_locked(lk, Cause::error, why);
      throw BackendError(why);
    }
    if (health && health->failed.load()) {
      // The message parked peers get when this rank's trainer aborts (Communicator::abort).
      const std::string fault = health->failure();
      abort_locked(lk, Cause::error, detail::cat(label(), ": rank ", rank, " failed: ", fault),
                   rank);
      throw BackendError(fault);
    }
    in_flight_[r] = 1;
    waiters_[r] = resume;
    labels_[r] = {call.kind, round->seq};
    // Injected fault: parked, but never arrives.
    if (skipped(rank, round->seq) ||
        !rv_.arrive(*round, rank, SimCall(call, &stream, stream.virtual_now))) {
      if (round->seq != pending_seq_) {  // the first rank to park in this round
        pending_seq_ = round->seq;
        pending_kind_ = call.kind;
        if (!keep_alive_) keep_alive_ = shared_from_this();
      }
      // else it re-arms itself (Note [Lazy deadline]; its first wake may be the round's warning,
      // Note [Slow collective warning])
      if (!timer_) arm_timeout(rv_.next_due(*round));
      return;
    }

    // Last to arrive: run the collective. The deadline stays armed (Note [Lazy deadline]).
    const std::shared_ptr<SimCommunicator> keep = std::move(keep_alive_);  // `self` holds us too
    auto work = std::make_shared<Work>();
    work->calls = std::move(round->calls);
    work->mismatch = detail::find_call_mismatch(work->calls, round->seq);
    work->resumes.reserve(waiters_.size());
    for (auto& w : waiters_) {
      work->resumes.push_back(*w);
      w.reset();
    }
    if (work->mismatch.empty()) charge(work->calls);
    lk.unlock();
    if (!work->mismatch.empty() || (cost_ && cost_->dry_run())) {  // dry: priced, not run
      finish(*work);
      return;
    }
    // Shares: one job per hardware thread (at most one per rank), each a contiguous range of
    // shares; a small call runs whole on this thread (Note [Small collectives]). Not one per
    // pool thread: the pool has at least 4 threads, and on a 2-core machine 4 jobs of streaming
    // copies time-share the 2 cores and evict each other's blocks (16 MiB all_reduce over 8
    // ranks: median 2NS/t 31.3 -> 33.7 GB/s, 64 MiB 33.9 -> 36.9, 14 alternating runs).
    const Call& c = work->calls[0];
    // Bytes written, or read by a reduction (count from every rank), whichever is more.
    const std::int64_t moved =
        std::max(written_elements(work->calls), c.kind == Kind::all_to_all_v ? 0 : c.count * n_) *
        static_cast<std::int64_t>(dtype_size(c.dtype));
    const int jobs = moved <= kInlineBytes ? 1 : std::min(n_, Executor::hardware_threads());
    work->pending.store(jobs);
    for (int j = 1; j < jobs; ++j)
      Executor::instance().post(
          [self = shared_from_this(), work, j, jobs] { self->run_job(work, j, jobs); },
          static_cast<std::uint64_t>(j));
    run_job(work, 0, jobs);
  }

  // Note [Lazy deadline]
  // Each round's deadline is its first arrival + the timeout (Note [Rendezvous]). Arming and
  // cancelling a Watchdog call per collective woke the watchdog thread each time (a futex wake
  // and two context switches per collective, most of a small collective's cost), so the call is
  // armed once and left armed when a round completes: when it fires, it times out the open
  // round if that round's deadline has passed, re-arms itself for the open round's deadline if
  // not (rounds open one after the other, so that deadline is later), and disarms when no round
  // is open; the next rank to park arms it again. The timeout thus fires at the same time as
  // before. The callback holds the communicator weakly; while ranks are parked, keep_alive_ holds
  // it (parked ranks do not, and must still time out when every handle is gone).
  void arm_timeout(Watchdog::Clock::time_point due) {
    timer_ = Watchdog::instance().schedule(due, [weak = weak_from_this()] {
      if (const auto self = weak.lock()) self->on_timeout();
    });
  }

  void on_timeout() {
    std::unique_lock lk(mu_);
    timer_.reset();
    if (rv_.abort_state().aborted() || rv_.open().empty()) return;  // nothing waits: disarmed
    Round& round = *rv_.open().begin()->second;
    // The warning first, also when this wake is late enough to be the deadline's too.
    rv_.warn_if_due(round, pending_kind_);
    if (Watchdog::Clock::now() < round.deadline) {  // a later round's, or only its warning's time
      arm_timeout(rv_.next_due(round));
      return;
    }
    std::string why = rv_.timeout_reason(round, pending_kind_);
    abort_locked(lk, Cause::timeout, std::move(why));
  }

  // Virtual time (Note [Virtual time], cost_model.h): the collective starts when the last rank
  // arrived and lasts the cost model's estimate; every rank's stream clock moves to its end.
  // Called by the last rank to arrive, with mu_ held, while every other rank's stream is parked.
  void charge(const std::vector<SimCall>& calls) {
    if (!cost_) return;
    VTime start = calls[0].arrival;
    for (const SimCall& c : calls) start = std::max(start, c.arrival);
    const Call& call = calls[0];
    const double bytes = collective_bytes(calls);
    const CollectiveEstimate est = collective_time(cost_->cluster(), call.kind, bytes, devices_);
    for (const SimCall& c : calls)
      cost_->on_collective(*c.stream, kind_name(call.kind), start, est, bytes);
  }

  // The bytes per rank the cost model is given (Note [Collective model], cost_model.h): the
  // buffer for all_reduce / reduce / broadcast, the full buffer of all_gather / reduce_scatter /
  // all_to_all, the root's buffer for gather / scatter, and for all_to_all_v the largest amount
  // any rank sends or receives.
  double collective_bytes(const std::vector<SimCall>& calls) const {
    const Call& c = calls[0];
    const auto elem = static_cast<double>(dtype_size(c.dtype));
    switch (c.kind) {
      case Kind::barrier: return 0;
      case Kind::all_gather:
      case Kind::reduce_scatter:
      case Kind::all_to_all:
      case Kind::gather:
      case Kind::scatter: return static_cast<double>(c.count) * n_ * elem;
      case Kind::all_to_all_v: {
        std::int64_t most = 0;
        for (const SimCall& call : calls) {
          std::int64_t sent = 0, received = 0;
          for (std::int64_t k : call.send_counts) sent += k;
          for (std::int64_t k : call.recv_counts) received += k;
          most = std::max({most, sent, received});
        }
        return static_cast<double>(most) * elem;
      }
      default: return static_cast<double>(c.count) * elem;
    }
  }

  void run_job(const std::shared_ptr<Work>& work, int job, int jobs) {
    try {
      const std::int64_t lo = std::int64_t(job) * n_ / jobs, hi = std::int64_t(job + 1) * n_ / jobs;
      shares(work->calls, lo, hi);
    } catch (...) {
      std::lock_guard lk(work->mu);
      if (!work->error) work->error = std::current_exception();
    }
    if (work->pending.fetch_sub(1) == 1) finish(*work);
  }

  // Step 4: the ranks may go on.
  void finish(Work& work) {
    {
      std::lock_guard lk(mu_);
      std::fill(in_flight_.begin(), in_flight_.end(), 0);
    }
    std::string failed;  // a job's error (host out of memory), rethrown by every rank
    if (work.error) {
      try {
        std::rethrow_exception(work.error);
      } catch (const std::exception& e) {
        failed = e.what();
      } catch (...) {
        failed = "unknown exception";
      }
    }
    // Resume::here: a rank whose next task is its next collective carries on on this thread (the
    // last rank's, or the last job's), with no hand-off (Note [Small collectives]).
    for (const Resume& r : work.resumes) {  // one exception object per rank
      if (!work.mismatch.empty())
        r.here(error_ptr<InvalidArgument>(work.mismatch));
      else if (work.error)
        r.here(error_ptr<BackendError>(failed));
      else
        r.here();
    }
  }

  // Shares [lo, hi) of the data movement of one collective (Note [Sim collectives], step 3), on
  // bytes: only the reductions look at the dtype (sim_comm_kernels.h).
  void shares(const std::vector<SimCall>& calls, std::int64_t lo_share, std::int64_t hi_share) {
    const Call& c = calls[0];
    const std::int64_t count = c.count;
    const auto n = static_cast<std::int64_t>(n_);
    const std::size_t elem = dtype_size(c.dtype);
    std::vector<const char*> sends(static_cast<std::size_t>(n));
    std::vector<char*> recvs(static_cast<std::size_t>(n));
    std::vector<double> scalars;  // premul_sum: each rank's own scalar
    for (std::int64_t q = 0; q < n; ++q) {
      sends[q] = static_cast<const char*>(calls[q].send);
      recvs[q] = static_cast<char*>(calls[q].recv);
      if (c.op == ReduceOp::premul_sum) scalars.push_back(calls[q].scalar);
    }
    const double* scalar_ptr = scalars.empty() ? nullptr : scalars.data();
    const Determinism mode = options_.determinism;
    auto at = [elem](std::int64_t elems) { return static_cast<std::size_t>(elems) * elem; };
    // Note [Streaming stores]: destination bytes written by the whole call (all ranks) past
    // kStreamBytes are streamed; in place the destination lines were just read: keep them.
    bool stream = at(written_elements(calls)) >= kStreamBytes;
    switch (c.kind) {
      case Kind::all_reduce: stream = stream && sends[0] != recvs[0]; break;
      case Kind::reduce: stream = stream && sends[c.root] != recvs[c.root]; break;
      // reduce_scatter in place: each recv is its rank's block of its send (rank 0's: at offset 0).
      case Kind::reduce_scatter: stream = stream && sends[0] != recvs[0]; break;
      default: break;
    }
    // Reduces elements [lo, hi) of `srcs` (one buffer per rank) into dst(q) for each q of dsts.
    auto reduce_into = [&](const std::vector<const void*>& srcs, std::int64_t lo, std::int64_t hi,
                           std::int64_t first_dst, std::int64_t end_dst, auto dst_of) {
      reduce_range(srcs, lo, hi, c.dtype, c.op, mode, scalar_ptr,
                   [&](std::int64_t off, const void* b, std::int64_t len) {
                     for (std::int64_t q = first_dst; q < end_dst; ++q)
                       store_block(dst_of(q) + at(off), b, at(len), stream);
                   });
    };
    // A copy of `elems` elements; nothing when in place.
    auto copy = [&](char* dst, const char* src, std::int64_t elems) {
      if (dst != src && elems > 0) store_block(dst, src, at(elems), stream);
    };
    std::vector<const void*> all_sends(sends.begin(), sends.end());
    // Element slice r of [0, count) when the work is split N ways.
    const std::int64_t per = (count + n - 1) / n;
    for (std::int64_t rank = lo_share; rank < hi_share; ++rank) {
      const std::int64_t lo = std::min(count, rank * per), hi = std::min(count, lo + per);
      switch (c.kind) {
        case Kind::all_reduce:
          reduce_into(all_sends, lo, hi, 0, n, [&](std::int64_t q) { return recvs[q]; });
          break;
        case Kind::reduce:
          reduce_into(all_sends, lo, hi, c.root, c.root + 1,
                      [&](std::int64_t q) { return recvs[q]; });
          break;
        case Kind::broadcast: {
          // Block by block, each block of the root's slice into every recv while it is in cache.
          const char* src = sends[c.root];
          for (std::int64_t off = lo; off < hi; off += kCopyBlock)
            for (std::int64_t q = 0; q < n; ++q)
              copy(recvs[q] + at(off), src + at(off), std::min(kCopyBlock, hi - off));
          break;
        }
        case Kind::all_gather:
          for (std::int64_t off = 0; off < count; off += kCopyBlock)
            for (std::int64_t q = 0; q < n; ++q)
              copy(recvs[q] + at(rank * count + off), sends[rank] + at(off),
                   std::min(kCopyBlock, count - off));
          break;
        case Kind::reduce_scatter: {
          std::vector<const void*> blocks(static_cast<std::size_t>(n));
          for (std::int64_t q = 0; q < n; ++q) blocks[q] = sends[q] + at(rank * count);
          reduce_into(blocks, 0, count, rank, rank + 1, [&](std::int64_t q) { return recvs[q]; });
          break;
        }
        // Share r moves what rank r sends: its block q into rank q's recv at block r.
        case Kind::all_to_all:
          for (std::int64_t q = 0; q < n; ++q)
            copy(recvs[q] + at(rank * count), sends[rank] + at(q * count), count);
          break;
        case Kind::all_to_all_v: {
          const Call& from = calls[rank];
          for (std::int64_t q = 0; q < n; ++q)
            copy(recvs[q] + at(calls[q].recv_displs[rank]), sends[rank] + at(from.send_displs[q]),
                 from.send_counts[q]);
          break;
        }
        case Kind::gather: copy(recvs[c.root] + at(rank * count), sends[rank], count); break;
        case Kind::scatter: copy(recvs[rank], sends[c.root] + at(rank * count), count); break;
        case Kind::barrier:
        case Kind::send:  // point-to-point calls do not come here (enqueue routes them)
        case Kind::recv: break;
      }
    }
    store_fence(stream);  // before run_job counts this job done (Note [Streaming stores])
  }

  // The bytes the whole call writes, or reads in a reduction, estimated from one rank's call
  // (written_elements and arrive() use every rank's); all_to_all_v: never small.
  std::int64_t inline_bytes(const Call& c) const {
    const auto n = static_cast<std::int64_t>(n_);
    const auto elem = static_cast<std::int64_t>(dtype_size(c.dtype));
    switch (c.kind) {
      case Kind::all_to_all_v: return std::numeric_limits<std::int64_t>::max();
      case Kind::all_gather:
      case Kind::all_to_all: return c.count * n * n * elem;
      default: return c.count * n * elem;
    }
  }

  // Elements written into the destinations by the whole call, all ranks together.
  std::int64_t written_elements(const std::vector<SimCall>& calls) const {
    const Call& c = calls[0];
    const auto n = static_cast<std::int64_t>(n_);
    switch (c.kind) {
      case Kind::reduce: return c.count;
      case Kind::all_gather:
      case Kind::all_to_all: return c.count * n * n;
      case Kind::all_to_all_v: {
        std::int64_t total = 0;
        for (const SimCall& call : calls)
          for (std::int64_t k : call.send_counts) total += k;
        return total;
      }
      default: return c.count * n;
    }
  }

  const std::vector<int> devices_;
  const CommOptions options_;
  const std::shared_ptr<CostModel> cost_;
  const int n_;
  const std::shared_ptr<FaultState> faults_;  // injected faults (may be null)

  std::mutex mu_;  // guards everything below
  // Matching, deadline and abort state; its timeout is options_.timeout_ms or the fault config's
  // override. At most one round is open at a time: every rank that arrived is parked.
  detail::Rendezvous<SimCall> rv_;
  std::vector<char> in_flight_;  // in_flight_[r]: rank r's collective has not finished
  std::vector<std::pair<Kind, std::uint64_t>> labels_;  // each parked rank's collective and ordinal
  std::vector<std::optional<Resume>> waiters_;          // parked ranks of the open round
  std::optional<std::uint64_t> timer_;  // Watchdog id of the deadline (Note [Lazy deadline])
  std::uint64_t pending_seq_ = 0;       // the last round a rank parked in, and
  Kind pending_kind_ = Kind::barrier;   // ... its first parked call's kind, for the timeout
  std::shared_ptr<SimCommunicator> keep_alive_;  // set while ranks are parked
  const std::shared_ptr<SimP2P> p2p_;            // send / recv (its own lock; aborted from here)
};

}  // namespace

std::shared_ptr<CommunicatorImpl> make_sim_communicator(const std::vector<int>& devices,
                                                        const CommOptions& options,
                                                        std::shared_ptr<CostModel> cost,
                                                        std::shared_ptr<FaultState> faults) {
  return std::make_shared<SimCommunicator>(devices, options, std::move(cost), std::move(faults));
}

}  // namespace ditto::sim
