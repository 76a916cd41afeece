// The MPI plumbing the multi-process communicators share (core/backend_api/mpi_transport.h): MPI
// error checks, waiting on nonblocking requests with a deadline, and MpiLink (the exchange of the
// ranks' calls, point-to-point matching, timeouts and abort). Compiled only with DITTO_WITH_MPI;
// the process group that bootstraps it is process_group_mpi.cpp.
//
// Note [Point-to-point over MPI]
// A rank's send / recv calls reach MpiLink as batches (one per group_end, or one call alone), on
// the rank's stream, one batch at a time. match_p2p numbers each call on its ordered pair as
// Note [Point-to-point matching] does (the k-th send from a to b, the k-th recv on b from a) and
// exchanges a small header (k, count, dtype) with the peer: a send posts its header to the
// receiver (kSendHeaderTag) and receives the receiver's (kRecvHeaderTag), a recv the reverse.
// MPI's non-overtaking rule (one tag, one pair of ranks, one communicator) pairs the k-th headers
// of the two sides, so both sides hold both headers and find the same mismatch (p2p_mismatch),
// which both throw; the data of a mismatched pair never moves, the other pairs of the batch
// still move (so their peers do not wait in vain). move_p2p then posts every matched op's
// MPI_Isend / MPI_Irecv (kP2PDataTag) at once and waits for all: a ring inside one group
// completes. Without a group each call is its own batch and waits for its peer before the
// rank's stream goes on: a send followed by a recv on the same stream works unless the ranks'
// first calls form a cycle (every rank sends first in a ring: each waits for a recv that comes
// only after its own send; a send to itself outside a group), which ends in the Timeout of
// p2p_timeout_reason (naming both ranks) and aborts the link. A rank's own Communicator::abort
// ends a waiting batch at once; another process's abort notice is read by the next collective
// only, so a batch waiting for a failed peer ends at the timeout.
#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "core/backend_api/mpi_transport.h"
#include "core/backend_api/p2p_match.h"
#include "core/backend_api/rendezvous.h"

namespace ditto {
namespace detail::mpi {

void throw_mpi_error(int rc, const char* call, const char* file, int line,
                     const std::string& where) {
  std::string f = file ? file : "?";
  for (const char* dir : {"core/", "backend_sim/", "backend_cuda/"})
    if (std::size_t at = f.rfind(dir); at != std::string::npos) {
      f = f.substr(at);
      break;
    }
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof text, "error %d", rc);
  throw BackendError(cat(where, ": ", call, " failed at ", f, ":", line, ": ", text));
}

namespace {
std::mutex g_failure_mu;
std::string* g_failure = nullptr;  // never freed: read until the process ends
}  // namespace

void note_job_failure(const std::string& reason) noexcept {
  std::lock_guard lk(g_failure_mu);
  if (g_failure) return;  // the first reason stays
  try {
    g_failure = new std::string(reason.empty() ? "a communicator failed" : reason);
  } catch (...) {  // no memory for the text: the fact still counts
    static std::string fallback = "a communicator failed";
    g_failure = &fallback;
  }
}

std::string job_failure() {
  std::lock_guard lk(g_failure_mu);
  return g_failure ? *g_failure : std::string();
}

namespace {
struct Queued {
  std::mutex mu;
  std::condition_variable cv;
  std::int64_t count = 0;
};
Queued& queued() {
  static Queued* q = new Queued();  // never destroyed: stream workers may outlive static dtors
  return *q;
}
}  // namespace

QueuedWork::QueuedWork() {
  std::lock_guard lk(queued().mu);
  ++queued().count;
}

QueuedWork::~QueuedWork() {
  Queued& q = queued();
  std::lock_guard lk(q.mu);
  if (--q.count == 0) q.cv.notify_all();
}

void wait_for_queued_work() {
  Queued& q = queued();
  std::unique_lock lk(q.mu);
  q.cv.wait(lk, [&] { return q.count == 0; });
}

bool wait_until(std::vector<MPI_Request>& reqs, Clock::time_point deadline,
                const std::string& where) {
  std::vector<int> done(reqs.size());
  int polls = 0;
  for (;;) {
    int outcount = 0;
    DITTO_MPI_CHECK(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount, done.data(),
                                 MPI_STATUSES_IGNORE),
                    where);
    if (outcount == MPI_UNDEFINED) return true;  // no active request left
    if (outcount > 0) {
      polls = 0;
      continue;
    }
    if (Clock::now() >= deadline) return false;
    // Back off: a waiting rank must not starve the others of the cores (Note [Timeouts over MPI]).
    ++polls;
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 63))));
  }
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::i64: return MPI_INT64_T;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i32: return MPI_INT32_T;
    case DType::u32: return MPI_UINT32_T;
    case DType::u64: return MPI_UINT64_T;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::f8_e4m3:
    case DType::f8_e5m2: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

bool mpi_reduces(DType dtype) {
  return !(dtype == DType::f16 || dtype == DType::bf16 || dtype == DType::f8_e4m3 ||
           dtype == DType::f8_e5m2);
}

// ---- MpiLink ------------------------------------------------------------------------------------

namespace {

// One rank's call as sent to the others (trivially copyable; MPI_BYTE), or its abort notice
// (kind == kAbortKind, with the reason). dtype is the DType's value (core/runtime/dtype.h), op
// the ReduceOp's; scalar is the rank's premul_sum scalar (not matched: each rank its own). The
// count vectors of all_to_all_v follow in a second exchange (exchange_counts).
struct WireCall {
  std::uint64_t seq;
  std::int64_t count;
  double scalar;
  std::int32_t kind, dtype, op, root;
  char reason[256];
};
constexpr std::int32_t kAbortKind = 255;

constexpr int kCallTag = 1;
// Point-to-point (Note [Point-to-point over MPI]): a sender's header to its receiver, a
// receiver's header to its sender, and the data.
constexpr int kSendHeaderTag = 2;
constexpr int kRecvHeaderTag = 3;
constexpr int kP2PDataTag = 4;

struct WireP2P {
  std::uint64_t seq;
  std::int64_t count;
  std::int32_t dtype, pad;
};

}  // namespace

MpiLink::MpiLink(MPI_Comm comm, const CommOptions& options, std::string what)
    : comm_(comm), options_(options), warn_after_ms_(comm_warn_after_ms()) {
  DITTO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), what);
  DITTO_MPI_CHECK(MPI_Comm_size(comm_, &size_), what);
  where_ = cat(what, ", rank ", rank_, " of ", size_, " (MPI)");
}

MpiLink::~MpiLink() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // An aborted link may have requests pending on comm_ (Note [Timeouts over MPI]): leave it.
  if (!finalized && !abort_.aborted() && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiLink::throw_if_aborted(CollectiveKind kind) const {
  std::lock_guard lk(mu_);
  abort_.throw_if_aborted(kind);
}

bool MpiLink::aborted() const {
  std::lock_guard lk(mu_);
  return abort_.aborted();
}

void MpiLink::abort(std::string reason, bool timeout) {
  note_job_failure(reason);  // its requests stay pending (Note [Timeouts over MPI])
  std::lock_guard lk(mu_);
  abort_.abort(timeout ? Cause::timeout : Cause::error, std::move(reason));
}

std::vector<CollectiveCall> MpiLink::start(const CollectiveCall& call, std::uint64_t& seq) {
  throw_if_aborted(call.kind);
  int finalized = 0;
  MPI_Finalized(&finalized);
  DITTO_CHECK_T(BackendError, !finalized, collective_name(call.kind),
                ": MPI was finalized (dist::finalize) while this communicator was alive");
  seq = ++seq_;
  const std::string lbl = label(call.kind, seq);
  std::vector<CollectiveCall> calls(static_cast<std::size_t>(size_));
  calls[static_cast<std::size_t>(rank_)] = call;
  if (size_ == 1) return calls;

  // Buffers live on the heap: after a timeout, pending requests may still use them.
  auto mine = std::make_shared<WireCall>(WireCall{seq,
                                                  call.count,
                                                  call.scalar,
                                                  static_cast<int>(call.kind),
                                                  static_cast<int>(call.dtype),
                                                  static_cast<int>(call.op),
                                                  call.root,
                                                  {}});
  auto theirs = std::make_shared<std::vector<WireCall>>(static_cast<std::size_t>(size_));
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sends(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    DITTO_MPI_CHECK(MPI_Irecv(&(*theirs)[static_cast<std::size_t>(q)], sizeof(WireCall), MPI_BYTE,
                              q, kCallTag, comm_, &recvs[static_cast<std::size_t>(q)]),
                    where_);
    DITTO_MPI_CHECK(MPI_Isend(mine.get(), sizeof(WireCall), MPI_BYTE, q, kCallTag, comm_,
                              &sends[static_cast<std::size_t>(q)]),
                    where_);
  }
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  // Wait for every call, but stop at the first abort notice.
  auto notice = [&]() -> int {
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && recvs[static_cast<std::size_t>(q)] == MPI_REQUEST_NULL &&
          (*theirs)[static_cast<std::size_t>(q)].kind == kAbortKind)
        return q;
    return -1;
  };
  // The ranks whose call has not come.
  auto missing = [&] {
    std::vector<int> m;
    for (int q = 0; q < size_; ++q)
      if (recvs[static_cast<std::size_t>(q)] != MPI_REQUEST_NULL) m.push_back(q);
    return m;
  };
  const Clock::time_point warn_at = warn_time();
  bool arrived = false, warned = false;
  int failed = -1;
  for (;;) {
    const Clock::time_point polled = Clock::now();
    arrived = wait_until(recvs, std::min(deadline, polled + std::chrono::milliseconds(20)), where_);
    failed = notice();
    if (arrived || failed >= 0 || Clock::now() >= deadline) break;
    // Only after a poll that began past the warning's time: a process stopped (SIGSTOP) in the
    // middle of a poll polls once after it resumes, which may not yet receive what came meanwhile.
    if (!warned && polled >= warn_at) {
      warned = true;
      print_warning(wait_warning(lbl, warn_after_ms_, missing(), size_, options_.timeout_ms,
                                 " in MPI processes"));
    }
    std::lock_guard lk(mu_);
    if (abort_.aborted()) break;  // this rank failed meanwhile (abort_by_rank, another thread)
  }
  if (!arrived && failed < 0) {
    std::unique_lock lk(mu_);
    if (abort_.aborted()) {
      std::exception_ptr error = abort_.error_for(lbl);
      orphans_.push_back(mine);
      orphans_.push_back(theirs);
      lk.unlock();
      for (MPI_Request& r : recvs)
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      std::rethrow_exception(error);
    }
  }
  if (failed >= 0) {
    const WireCall& w = (*theirs)[static_cast<std::size_t>(failed)];
    std::string reason = cat(
        "rank ", failed, " failed: ", std::string(w.reason, strnlen(w.reason, sizeof w.reason)));
    for (MPI_Request& r : recvs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    {
      std::lock_guard lk(mu_);
      orphans_.push_back(mine);
      orphans_.push_back(theirs);
      abort_.abort(Cause::peer, reason, failed);
    }
    std::rethrow_exception(peer_failure(cat(lbl, ": ", reason), failed));
  }
  if (!arrived) {
    std::string reason =
        timeout_reason(lbl, options_.timeout_ms, missing(), size_, " in MPI processes");
    for (MPI_Request& r : recvs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    time_out(reason, {mine, theirs});
  }
  if (!wait_until(sends, deadline, where_)) {  // everyone's call came, so ours goes out too
    std::string reason = cat(lbl, ": timed out after ", options_.timeout_ms,
                             " ms sending this rank's call to the others (it is now aborted)");
    time_out(reason, {mine});
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const WireCall& w = (*theirs)[static_cast<std::size_t>(q)];
    DITTO_CHECK_T(InternalError, w.seq == seq, lbl, ": rank ", q, " sent the call of collective #",
                  w.seq);
    CollectiveCall& c = calls[static_cast<std::size_t>(q)];
    c.kind = static_cast<CollectiveKind>(w.kind);
    c.count = w.count;
    c.dtype = static_cast<DType>(w.dtype);
    c.op = static_cast<ReduceOp>(w.op);
    c.root = w.root;
    c.scalar = w.scalar;
  }
  if (call.kind == CollectiveKind::all_to_all_v) exchange_counts(calls, seq);
  std::string mismatch = find_call_mismatch(calls, seq, rank_);  // led by this rank's call
  if (!mismatch.empty()) throw InvalidArgument(mismatch);
  return calls;
}

void MpiLink::exchange_counts(std::vector<CollectiveCall>& calls, std::uint64_t seq) {
  const auto n = static_cast<std::size_t>(size_);
  const bool every = std::all_of(calls.begin(), calls.end(), [](const CollectiveCall& c) {
    return c.kind == CollectiveKind::all_to_all_v;
  });
  if (!every) {  // find_call_mismatch reports the kinds; give the others' vectors their size
    for (std::size_t q = 0; q < n; ++q)
      if (q != static_cast<std::size_t>(rank_) && calls[q].kind == CollectiveKind::all_to_all_v) {
        calls[q].send_counts.assign(n, 0);
        calls[q].recv_counts.assign(n, 0);
      }
    return;
  }
  struct Counts {
    std::vector<std::int64_t> mine, all;
  };
  auto counts = std::make_shared<Counts>();
  const CollectiveCall& me = calls[static_cast<std::size_t>(rank_)];
  counts->mine = me.send_counts;
  counts->mine.insert(counts->mine.end(), me.recv_counts.begin(), me.recv_counts.end());
  DITTO_CHECK_T(InternalError, counts->mine.size() == 2 * n, label(me.kind, seq), ": expected ", n,
                " send and recv counts, got ", counts->mine.size());
  counts->all.resize(2 * n * n);
  std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
  DITTO_MPI_CHECK(
      MPI_Iallgather(counts->mine.data(), static_cast<int>(2 * n), MPI_INT64_T, counts->all.data(),
                     static_cast<int>(2 * n), MPI_INT64_T, comm_, &reqs[0]),
      where_);
  wait(reqs, me.kind, seq, counts);
  for (std::size_t q = 0; q < n; ++q) {
    const std::int64_t* row = counts->all.data() + 2 * n * q;
    calls[q].send_counts.assign(row, row + n);
    calls[q].recv_counts.assign(row + n, row + 2 * n);
  }
}

bool MpiLink::wait_or_abort(std::vector<MPI_Request>& reqs, Clock::time_point deadline,
                            bool& was_aborted) {
  was_aborted = false;
  for (;;) {
    if (wait_until(reqs, std::min(deadline, Clock::now() + std::chrono::milliseconds(20)), where_))
      return true;
    if (aborted()) {
      was_aborted = true;
      return false;
    }
    if (Clock::now() >= deadline) return false;
  }
}

void MpiLink::throw_aborted(const std::string& lbl, std::shared_ptr<void> keep) {
  std::unique_lock lk(mu_);
  std::exception_ptr error = abort_.error_for(lbl);
  if (keep) orphans_.push_back(std::move(keep));
  lk.unlock();
  std::rethrow_exception(error);
}

void MpiLink::time_out(const std::string& reason,
                       std::initializer_list<std::shared_ptr<void>> keep) {
  {
    std::lock_guard lk(mu_);
    for (const std::shared_ptr<void>& k : keep)
      if (k) orphans_.push_back(k);
  }
  abort(reason, true);
  throw Timeout(reason);
}

void MpiLink::match_p2p(std::vector<P2POp>& ops) {
  if (ops.empty()) return;
  throw_if_aborted(ops.front().kind);
  if (sends_to_.empty()) {
    sends_to_.assign(static_cast<std::size_t>(size_), 0);
    recvs_from_.assign(static_cast<std::size_t>(size_), 0);
  }
  struct Headers {
    std::vector<WireP2P> mine, theirs;
  };
  auto h = std::make_shared<Headers>();
  h->mine.resize(ops.size());
  h->theirs.resize(ops.size());
  std::vector<MPI_Request> recvs(ops.size(), MPI_REQUEST_NULL), sends(ops.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    P2POp& op = ops[i];
    const bool is_send = op.kind == CollectiveKind::send;
    const auto peer = static_cast<std::size_t>(op.peer);
    op.seq = is_send ? ++sends_to_[peer] : ++recvs_from_[peer];
    op.mismatch.clear();
    h->mine[i] = WireP2P{op.seq, op.count, static_cast<std::int32_t>(op.dtype), 0};
    DITTO_MPI_CHECK(MPI_Irecv(&h->theirs[i], sizeof(WireP2P), MPI_BYTE, op.peer,
                              is_send ? kRecvHeaderTag : kSendHeaderTag, comm_, &recvs[i]),
                    where_);
    DITTO_MPI_CHECK(MPI_Isend(&h->mine[i], sizeof(WireP2P), MPI_BYTE, op.peer,
                              is_send ? kSendHeaderTag : kRecvHeaderTag, comm_, &sends[i]),
                    where_);
  }
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  bool was_aborted = false;
  const bool arrived =
      wait_or_abort(recvs, deadline, was_aborted) && wait_or_abort(sends, deadline, was_aborted);
  if (!arrived) {
    std::size_t i = 0;  // the first op whose peer's header did not come
    while (i + 1 < ops.size() && recvs[i] == MPI_REQUEST_NULL) ++i;
    const P2POp& op = ops[i];
    const P2PPair pair = p2p_pair(op.kind, rank_, op.peer);
    for (MPI_Request& r : recvs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    if (was_aborted) throw_aborted(p2p_call_label(op.kind, pair, op.seq), h);
    std::string reason = p2p_timeout_reason(op.kind, pair, op.seq, options_.timeout_ms);
    time_out(reason, {h});
  }
  for (std::size_t i = 0; i < ops.size(); ++i) {
    P2POp& op = ops[i];
    const WireP2P& w = h->theirs[i];
    const P2PPair pair = p2p_pair(op.kind, rank_, op.peer);
    DITTO_CHECK_T(InternalError, w.seq == op.seq, p2p_call_label(op.kind, pair, op.seq), ": rank ",
                  op.peer, " sent the header of point-to-point #", w.seq);
    const auto peer_dtype = static_cast<DType>(w.dtype);
    op.mismatch = op.kind == CollectiveKind::send
                      ? p2p_mismatch(pair, op.seq, op.count, op.dtype, w.count, peer_dtype)
                      : p2p_mismatch(pair, op.seq, w.count, peer_dtype, op.count, op.dtype);
    if (op.mismatch.empty() && op.count > INT_MAX)  // both sides see the same count
      op.mismatch = cat(collective_name(op.kind), ": count: at most ", INT_MAX,
                        " elements move in one MPI message, got ", op.count, " (",
                        p2p_label(pair, op.seq), "; split the tensor)");
  }
}

void MpiLink::move_p2p(const std::vector<P2POp>& ops, std::shared_ptr<void> keep) {
  std::vector<MPI_Request> reqs;
  std::vector<std::size_t> op_of;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    if (!op.mismatch.empty() || op.count == 0) continue;
    reqs.push_back(MPI_REQUEST_NULL);
    op_of.push_back(i);
    const int count = static_cast<int>(op.count);
    if (op.kind == CollectiveKind::send)
      DITTO_MPI_CHECK(
          MPI_Isend(op.data, count, mpi_type(op.dtype), op.peer, kP2PDataTag, comm_, &reqs.back()),
          where_);
    else
      DITTO_MPI_CHECK(
          MPI_Irecv(op.data, count, mpi_type(op.dtype), op.peer, kP2PDataTag, comm_, &reqs.back()),
          where_);
  }
  if (reqs.empty()) return;
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  bool was_aborted = false;
  if (wait_or_abort(reqs, deadline, was_aborted)) return;
  std::size_t j = 0;
  while (j + 1 < reqs.size() && reqs[j] == MPI_REQUEST_NULL) ++j;
  const P2POp& op = ops[op_of[j]];
  const std::string lbl = p2p_call_label(op.kind, p2p_pair(op.kind, rank_, op.peer), op.seq);
  if (was_aborted) throw_aborted(lbl, std::move(keep));
  std::string reason = cat(lbl, ": timed out after ", options_.timeout_ms,
                           " ms moving the data between the ranks (MPI; the peer stopped in the "
                           "middle of the transfer; the communicator of ",
                           size_, " ranks is now aborted)");
  time_out(reason, {std::move(keep)});
}

void MpiLink::abort_by_rank(const std::string& reason) noexcept {
  try {
    std::lock_guard lk(mu_);
    if (!abort_.rank_failed(rank_, reason)) return;  // the first reason stays
    // The others may be waiting for this rank in a collective that never comes
    // (Note [Ending a job after a communicator error]).
    note_job_failure(reason);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || size_ == 1) return;
    auto notice = std::make_shared<WireCall>();
    std::memset(notice.get(), 0, sizeof(WireCall));
    notice->seq = seq_.load() + 1;
    notice->kind = kAbortKind;
    std::strncpy(notice->reason, reason.c_str(), sizeof notice->reason - 1);
    orphans_.push_back(notice);  // the sends complete whenever the others receive
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(notice.get(), sizeof(WireCall), MPI_BYTE, q, kCallTag, comm_, &req) ==
          MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  } catch (...) {  // allocation failure of the notice: the flag is already set
  }
}

Clock::time_point MpiLink::warn_time() const {
  return warn_after_ms_ > 0 && warn_after_ms_ < options_.timeout_ms
             ? comm_deadline<Clock>(warn_after_ms_)
             : Clock::time_point::max();
}

void MpiLink::wait(std::vector<MPI_Request>& reqs, CollectiveKind kind, std::uint64_t seq,
                   std::shared_ptr<void> keep) {
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  const Clock::time_point warn_at = warn_time();
  for (bool warned = false;;) {  // Note [Slow collective warning], as in start()
    const Clock::time_point polled = Clock::now();
    if (wait_until(reqs, std::min(deadline, polled + std::chrono::milliseconds(20)), where_))
      return;
    if (Clock::now() >= deadline) break;
    if (!warned && polled >= warn_at) {
      warned = true;
      print_warning(slow_warning(label(kind, seq), warn_after_ms_,
                                 cat("moving data between the ranks (MPI; a rank stopped in the "
                                     "middle of the collective; communicator of ",
                                     size_, " ranks)"),
                                 options_.timeout_ms));
    }
  }
  std::string reason =
      cat(label(kind, seq), ": timed out after ", options_.timeout_ms,
          " ms moving data between the ranks (MPI; a rank stopped in the middle of the "
          "collective; the communicator of ",
          size_, " ranks is now aborted)");
  time_out(reason, {std::move(keep)});
}

}  // namespace detail::mpi

}  // namespace ditto
