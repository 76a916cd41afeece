// The simulator's send / recv (Note [Sim point-to-point] in sim_communicator_p2p.h).
#include "backend_sim/sim_communicator_p2p.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "backend_sim/sim_executor.h"
#include "core/base/error.h"

namespace ditto::sim {

using Kind = detail::CollectiveKind;
using detail::P2PPair;

/// A rank's calls run together (Note [Sim point-to-point]).
struct SimP2P::Batch {
  int rank = 0;
  SimStream* stream = nullptr;
  std::vector<detail::CollectiveCall> calls;
  AbortFn abort;
  // Set when the stream reaches the batch (under mu_):
  bool started = false;
  std::optional<Resume> resume;
  VTime arrival = 0;        // the stream's clock when it started
  VTime begin = kVTimeMax;  // earliest start of its transfers
  VTime end = 0;            // latest end of its transfers
  double bytes = 0;         // bytes it sends and receives
  std::vector<P2PPair> pairs;
  std::vector<std::uint64_t> seqs;
  std::vector<char> waiting;  // per call: posted, partner not yet
  std::size_t pending = 0;    // calls not done (waiting or being copied)
  std::exception_ptr error;   // the first failure of one of its calls
  std::optional<std::uint64_t> timer;

  const char* trace_name() const {
    bool sends = false, recvs = false;
    for (const auto& c : calls) (c.kind == Kind::send ? sends : recvs) = true;
    return sends && recvs ? "send_recv" : sends ? "send" : "recv";
  }
};

struct SimP2P::Call : detail::CollectiveCall {
  Call() = default;
  Call(const detail::CollectiveCall& c, std::shared_ptr<Batch> b, std::size_t i)
      : detail::CollectiveCall(c), batch(std::move(b)), index(i) {}
  std::shared_ptr<Batch> batch;
  std::size_t index = 0;
};

struct SimP2P::Copy {
  Call send, recv;
};

namespace {

// One point-to-point message of `bytes` from device `src` to device `dst` (global indices), in
// seconds: the cost model's send (Note [Collective model]: one message over the link between
// the two devices), or a local copy for a send to oneself.
double message_seconds(const ClusterSpec& cluster, double bytes, int src, int dst) {
  const std::vector<int> devices = src == dst ? std::vector<int>{src} : std::vector<int>{src, dst};
  return collective_time(cluster, Kind::send, bytes, devices).seconds;
}

}  // namespace

SimP2P::SimP2P(std::vector<int> devices, std::int64_t timeout_ms, std::shared_ptr<CostModel> cost)
    : devices_(std::move(devices)),
      timeout_ms_(timeout_ms),
      cost_(std::move(cost)),
      matcher_(std::make_unique<detail::P2PMatcher<Call>>(static_cast<int>(devices_.size()))) {}

SimP2P::~SimP2P() = default;

// ---- groups and enqueueing ------------------------------------------------------------------

void SimP2P::group_start() {
  std::lock_guard lk(mu_);
  groups_.try_emplace(std::this_thread::get_id());
}

void SimP2P::group_end() {
  std::vector<std::shared_ptr<Batch>> batches;
  {
    std::lock_guard lk(mu_);
    auto it = groups_.find(std::this_thread::get_id());
    if (it == groups_.end()) return;
    batches = std::move(it->second);
    groups_.erase(it);
  }
  for (auto& b : batches)
    b->stream->enqueue_parked([self = shared_from_this(), b](Resume r) { self->start(b, r); });
}

void SimP2P::enqueue(int rank, SimStream& stream, const detail::CollectiveCall& call,
                     AbortFn abort) {
  {
    std::lock_guard lk(mu_);
    auto it = groups_.find(std::this_thread::get_id());
    if (it != groups_.end()) {
      auto& batches = it->second;
      auto b = std::find_if(batches.begin(), batches.end(),
                            [&](const auto& x) { return x->rank == rank && x->stream == &stream; });
      if (b == batches.end()) {
        batches.push_back(std::make_shared<Batch>());
        batches.back()->rank = rank;
        batches.back()->stream = &stream;
        batches.back()->abort = std::move(abort);
        b = batches.end() - 1;
      }
      (*b)->calls.push_back(call);
      return;
    }
  }
  auto b = std::make_shared<Batch>();
  b->rank = rank;
  b->stream = &stream;
  b->abort = std::move(abort);
  b->calls.push_back(call);
  stream.enqueue_parked([self = shared_from_this(), b](Resume r) { self->start(b, r); });
}

// ---- running a batch ------------------------------------------------------------------------

// The parking task of a batch, on a pool thread, in its stream's order.
void SimP2P::start(const std::shared_ptr<Batch>& batch, Resume resume) {
  std::vector<Copy> copies;
  std::vector<std::shared_ptr<Batch>> done;
  {
    std::unique_lock lk(mu_);
    const detail::CollectiveCall& first = batch->calls.front();
    abort_.throw_if_aborted(first.kind);  // throws before anything is posted: no resume
    const DeviceHealth* health = batch->stream->health();
    if (health && health->failed.load()) {
      // As a collective on a failed device: the rank fails, the communicator is aborted.
      const P2PPair pair = detail::p2p_pair(first.kind, batch->rank, first.peer);
      const std::string fault = health->failure();
      const std::string why = detail::cat(
          detail::p2p_call_label(first.kind, pair, matcher_->next_seq(first.kind, pair)), ": rank ",
          batch->rank, " failed: ", fault);
      AbortFn abort = batch->abort;
      lk.unlock();
      abort(Cause::error, why, batch->rank);
      throw BackendError(fault);
    }
    batch->started = true;
    batch->resume = resume;
    batch->arrival = batch->end = batch->stream->virtual_now;
    post_locked(batch, copies, done);
    if (batch->pending > 0 && !batch->timer &&
        std::any_of(batch->waiting.begin(), batch->waiting.end(), [](char w) { return w != 0; }))
      batch->timer = Watchdog::instance().schedule(
          detail::comm_deadline<Clock>(timeout_ms_),
          [self = shared_from_this(), batch] { self->on_timeout(batch); });
  }
  copy_and_finish(copies, done);
}

void SimP2P::post_locked(const std::shared_ptr<Batch>& batch, std::vector<Copy>& copies,
                         std::vector<std::shared_ptr<Batch>>& done) {
  Batch& b = *batch;
  const std::size_t n = b.calls.size();
  b.pairs.resize(n);
  b.seqs.resize(n);
  b.waiting.assign(n, 0);
  b.pending = n;
  for (std::size_t i = 0; i < n; ++i) {
    const detail::CollectiveCall& c = b.calls[i];
    b.bytes += static_cast<double>(c.count) * static_cast<double>(dtype_size(c.dtype));
    auto posted = matcher_->post(b.rank, Call(c, batch, i));
    b.pairs[i] = posted.pair;
    b.seqs[i] = posted.seq;
    if (!posted.match) {
      b.waiting[i] = 1;
      continue;
    }
    detail::P2PMatcher<Call>::Match& m = *posted.match;
    m.send.batch->waiting[m.send.index] = 0;
    m.recv.batch->waiting[m.recv.index] = 0;
    if (!m.mismatch.empty()) {
      // Both sides fail with the same message, each with its own exception object.
      call_done_locked(m.send.batch, m.send.index, error_ptr<InvalidArgument>(m.mismatch), done);
      call_done_locked(m.recv.batch, m.recv.index, error_ptr<InvalidArgument>(m.mismatch), done);
      continue;
    }
    copies.push_back(Copy{std::move(m.send), std::move(m.recv)});
  }
}

void SimP2P::call_done_locked(const std::shared_ptr<Batch>& batch, std::size_t index,
                              std::exception_ptr error, std::vector<std::shared_ptr<Batch>>& done) {
  Batch& b = *batch;
  b.waiting[index] = 0;
  if (error && !b.error) b.error = std::move(error);
  if (--b.pending > 0) return;
  if (b.timer) Watchdog::instance().cancel(*b.timer);
  b.timer.reset();
  b.abort = nullptr;  // it holds the owner, which holds this object
  done.push_back(batch);
}

// Copies the matched pairs (mu_ not held: both sides' streams stay parked until their calls are
// done, so the buffers stay put), then marks them done and resumes the batches that finished.
void SimP2P::copy_and_finish(std::vector<Copy>& copies, std::vector<std::shared_ptr<Batch>>& done) {
  const bool dry = cost_ && cost_->dry_run();  // Note [Dry run] (sim_backend.h)
  for (const Copy& c : copies) {
    const std::size_t bytes = static_cast<std::size_t>(c.send.count) * dtype_size(c.send.dtype);
    if (!dry && bytes > 0 && c.recv.recv != c.send.send)
      std::memmove(c.recv.recv, c.send.send, bytes);
  }
  if (!copies.empty()) {
    std::lock_guard lk(mu_);
    for (const Copy& c : copies) {
      Batch& s = *c.send.batch;
      Batch& r = *c.recv.batch;
      if (cost_) {
        const double bytes =
            static_cast<double>(c.send.count) * static_cast<double>(dtype_size(c.send.dtype));
        const auto src = static_cast<std::size_t>(s.rank), dst = static_cast<std::size_t>(r.rank);
        const VTime start = std::max(s.arrival, r.arrival);
        const double seconds =
            message_seconds(cost_->cluster(), bytes, devices_[src], devices_[dst]);
        const VTime end = vtime_add(start, to_vtime(seconds));
        for (Batch* b : {&s, &r}) {
          b->begin = std::min(b->begin, start);
          b->end = std::max(b->end, end);
        }
      }
      call_done_locked(c.send.batch, c.send.index, nullptr, done);
      call_done_locked(c.recv.batch, c.recv.index, nullptr, done);
    }
  }
  resume_done(done);
}

void SimP2P::resume_done(const std::vector<std::shared_ptr<Batch>>& done) {
  for (const auto& b : done) {
    // The batch's stream is parked (or runs this very start()): its clock is ours to move.
    if (cost_ && !b->error && b->begin <= b->end) {
      CollectiveEstimate est;
      est.seconds = to_seconds(b->end - b->begin);
      cost_->on_collective(*b->stream, b->trace_name(), b->begin, est, b->bytes);
    }
    (*b->resume)(std::exchange(b->error, nullptr));  // the stream holds the only reference
  }
}

// ---- timeouts and abort -----------------------------------------------------------------------

void SimP2P::on_timeout(const std::shared_ptr<Batch>& batch) {
  std::string why;
  AbortFn abort;
  {
    std::lock_guard lk(mu_);
    if (abort_.aborted() || batch->pending == 0) return;  // finished meanwhile
    const auto it = std::find(batch->waiting.begin(), batch->waiting.end(), 1);
    if (it == batch->waiting.end()) return;  // only copies under way: they finish
    const auto i = static_cast<std::size_t>(it - batch->waiting.begin());
    why = detail::p2p_timeout_reason(batch->calls[i].kind, batch->pairs[i], batch->seqs[i],
                                     timeout_ms_);
    abort = batch->abort;
  }
  if (abort) abort(Cause::timeout, std::move(why), -1);  // the owner calls abort() back
}

void SimP2P::abort(const detail::AbortState& state) noexcept {
  std::vector<std::shared_ptr<Batch>> done;
  try {
    std::lock_guard lk(mu_);
    if (!abort_.aborted()) abort_ = state;
    for (auto& w : matcher_->take_waiting()) {
      const Batch& b = *w.call.batch;
      const std::size_t i = w.call.index;
      call_done_locked(
          w.call.batch, i,
          abort_.error_for(detail::p2p_call_label(b.calls[i].kind, b.pairs[i], b.seqs[i])), done);
    }
  } catch (...) {  // out of memory building a message: the batches still resume below
  }
  resume_done(done);
}

}  // namespace ditto::sim
