#include "backend_sim/sim_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "backend_sim/sim_executor.h"
#include "core/base/error.h"

namespace ditto::sim {

namespace {
// Tasks one stream runs before it lets the pool's other streams have the thread.
constexpr int kDrainBudget = 64;

// The error of a stream on device `who` that waited on an event completed on a failed device.
std::exception_ptr poison_error(const Device& who, const std::string& poison) {
  if (poison.empty()) return nullptr;
  return error_ptr<BackendError>(
      who.str() + ": stream waited on an event recorded on a failed device: " + poison);
}
}  // namespace

namespace {
// Drains running on this thread (Resume::here claims only inside one), and the streams claimed
// by this thread, to run once the current task returns.
thread_local int t_drains = 0;
thread_local std::vector<SimStream*> t_claimed;

// Raises a host clock (Note [Host clock], cost_model.h) to `t` when the caller is a host thread
// (not stream work: a pool thread's drain or a host's drain of the stream it waits on).
void host_waited(DeviceHealth* h, std::int64_t t) {
  if (!h || t_drains > 0) return;
  std::int64_t old = h->host_clock.load(std::memory_order_relaxed);
  while (t > old && !h->host_clock.compare_exchange_weak(old, t, std::memory_order_relaxed)) {
  }
}
}  // namespace

std::int64_t SimStream::host_floor() const {
  return health_ && t_drains == 0 ? health_->host_clock.load(std::memory_order_relaxed) : 0;
}

// ---- DeviceHealth ---------------------------------------------------------------------------

void DeviceHealth::fail(const std::string& why) {
  std::lock_guard lk(mu_);
  if (failed.load()) return;
  reason = why;
  failed.store(true);
}

void DeviceHealth::reset() {
  std::lock_guard lk(mu_);
  failed.store(false);
  reason.clear();
}

std::string DeviceHealth::failure() const {
  if (!failed.load()) return {};
  std::lock_guard lk(mu_);
  return reason;
}

// ---- events ---------------------------------------------------------------------------------

void EventState::complete(std::uint64_t gen, std::int64_t vtime, std::string failure) {
  std::vector<Waiter> ready;
  std::string poisoned;
  {
    std::lock_guard lk(mu);
    if (gen > completed) {
      completed = gen;
      poison = std::move(failure);
    }
    vtimes[gen] = vtime;
    while (vtimes.size() > 64) vtimes.erase(vtimes.begin());  // keep the recent generations
    for (std::size_t i = 0; i < waiters.size();) {
      if (waiters[i].gen <= completed) {
        ready.push_back(waiters[i]);
        waiters[i] = waiters.back();
        waiters.pop_back();
      } else {
        ++i;
      }
    }
    poisoned = poison;
  }
  cv.notify_all();
  // Resume::here: a waiter whose next work is short or parks runs on this thread after the
  // current task (the record's), with no hand-off (Note [Stream hand-offs], Note [Inline work]).
  for (auto& w : ready) w.resume.here(poison_error(w.who, poisoned));
}

std::int64_t EventState::wait_for(std::uint64_t gen) {
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return completed >= gen; });
  return vtime_locked(gen);
}

std::int64_t EventState::vtime_locked(std::uint64_t gen) const {
  auto it = vtimes.lower_bound(gen);  // gen itself unless it was pruned
  return it == vtimes.end() ? 0 : it->second;
}

void SimEvent::synchronize() {
  std::uint64_t gen;
  std::shared_ptr<DeviceHealth> host;
  {
    std::lock_guard lk(state_->mu);
    gen = state_->recorded;
    host = state_->host;
  }
  const std::int64_t vtime = state_->wait_for(gen);
  host_waited(host.get(), vtime);  // Note [Host clock] (cost_model.h)
}

bool SimEvent::query() {
  std::lock_guard lk(state_->mu);
  return state_->completed >= state_->recorded;
}

// ---- the stream -----------------------------------------------------------------------------

// Note [Stream hand-offs]
// Handing a stream from one thread to another costs a futex wake and a context switch (several
// microseconds here, more than a small kernel or a small collective takes), so the stream avoids
// them where it can, without changing what runs in which order:
//  - a host thread that waits on the stream (synchronize, a blocking copy, the destructor) runs
//    the stream's work itself when it finds it posted to the pool and not yet started (state
//    scheduled), and a blocking copy on an idle stream runs at once on the calling thread; the
//    pool job posted earlier then finds the stream claimed and does nothing;
//  - a pool thread that emptied a stream, or saw it park, spins briefly (kSpin, DITTO_SIM_SPIN_US)
//    before it goes back to the pool: work enqueued or a resume in that time is handed to it
//    directly (no post, no wake), and a waiting host thread spins as long before it sleeps. At
//    most hardware_concurrency() - 1 threads spin at once, so spinning never takes the last core,
//    and none while any stream waits for a pool thread (it would be delayed, or lack a core);
//  - a resumed stream whose host thread is waiting on it is handed to that thread (no post);
//  - Resume::here (a collective's last rank resuming the others): a stream whose next task parks
//    again (back-to-back collectives) is claimed by the resuming thread, which runs it right
//    after its current task, while its next tasks park or are short (Note [Inline work]), so
//    only cheap tasks migrate: at the first other plain task the stream goes back to its own
//    thread. An event's completion resumes its waiters the same way. Only the outermost drain on
//    a thread runs its claims, after each task, so no drain nests another.
// Errors are kept and rethrown exactly where they were before: a task's error by the next
// synchronize, a blocking copy's own error first, then an earlier one.

namespace {

// 2 us by default (20 before Note [Inline work]): with small work run inline, what is left to
// wait for is mostly another rank's thread, which a spinning thread keeps off a core when the
// threads outnumber the cores. Measured on 2 cores, two alternating rounds, 20 us against 2 us:
// 10-5-2 on 4 devices DDP 9,387-10,380 against 11,768-12,657 steps/s, DataParallel 4,859-5,088
// against 5,179-5,874; the MLP 784-1024-1024-10 DDP 46.2-47.0 against 49.8-52.1 steps/s; GPT and
// the collectives of 64 KiB to 16 MiB unchanged within the noise.
std::chrono::nanoseconds spin_time() {
  static const std::chrono::nanoseconds t = [] {
    long us = 2;
    if (const char* env = std::getenv("DITTO_SIM_SPIN_US")) {
      char* end = nullptr;
      long v = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && v >= 0 && v <= 100000) us = v;
    }
    return std::chrono::nanoseconds(std::chrono::microseconds(us));
  }();
  return t;
}

std::atomic<int> g_spinners{0};

// Most threads that spin at once: DITTO_SIM_SPINNERS, else the cores.
int spin_cap() {
  if (const char* env = std::getenv("DITTO_SIM_SPINNERS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
  }
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}
// Stream drains posted to the pool and not yet started, over all streams. A thread spins only
// while this is 0: a spinning pool thread would delay the streams queued behind it (1024
// devices on a few threads), and any spinning thread takes a core they need.
std::atomic<std::int64_t> g_waiting_drains{0};

bool take_spin_slot() {
  static const int cap = spin_cap();
  if (spin_time().count() == 0 || g_waiting_drains.load(std::memory_order_relaxed) > 0)
    return false;
  int s = g_spinners.load(std::memory_order_relaxed);
  while (s < cap)
    if (g_spinners.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) return true;
  return false;
}

void give_spin_slot() { g_spinners.fetch_sub(1, std::memory_order_acq_rel); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until `ready()`, spin_time() passed or a stream waits for a pool thread; the last result
// of ready().
template <typename F>
bool spin_until(F ready) {
  const auto until = std::chrono::steady_clock::now() + spin_time();
  for (unsigned i = 1;; ++i) {
    if (ready()) return true;
    if (g_waiting_drains.load(std::memory_order_relaxed) > 0) return false;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) return ready();
  }
}

}  // namespace

void Resume::operator()(std::exception_ptr error) const { s_->resume(std::move(error)); }

void Resume::here(std::exception_ptr error) const { s_->resume(std::move(error), true); }

void SimStream::run_claimed() {
  while (!t_claimed.empty()) {
    SimStream* s = t_claimed.back();
    t_claimed.pop_back();
    std::unique_lock lk(s->mu_);
    s->drain_claimed(lk);
  }
}

std::exception_ptr SimStream::start_task(std::unique_lock<std::mutex>& lk, Task& task) {
  starting_ = true;
  resumed_early_ = false;
  lk.unlock();
  std::exception_ptr err;
  apply_floor(task.floor);
  try {
    task.start(Resume(this));
  } catch (...) {
    err = std::current_exception();
  }
  task = {};
  // Resume::here's streams, by the outermost drain only (in drain_claimed t_drains is past 1).
  if (t_drains == 1 && !t_claimed.empty()) run_claimed();
  lk.lock();
  starting_ = false;
  return err;
}

void SimStream::drain_claimed(std::unique_lock<std::mutex>& lk) {
  ++t_drains;
  for (;;) {
    if (queue_.empty()) {
      set_state(State::idle);
      bump();
      break;
    }
    if (!queue_.front().start && queue_.front().is_short) {  // short work: run it here
      Task task = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      std::exception_ptr err = run_plain(task);
      lk.lock();
      if (err) keep_error_locked(std::move(err));
      continue;
    }
    if (!queue_.front().start) {  // a plain task: its own thread runs it
      if (spin_.load(std::memory_order_acquire) == 1) {
        spin_.store(2, std::memory_order_release);
        break;
      }
      set_state(State::scheduled);
      if (host_waiters_ > 0) {
        bump();
        break;
      }
      ++posted_;
      post();
      break;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (std::exception_ptr err = start_task(lk, task)) {
      keep_error_locked(std::move(err));
      continue;
    }
    if (resumed_early_) continue;
    set_state(State::parked);
    break;
  }
  --t_drains;
}

SimStream::~SimStream() {
  std::unique_lock lk(mu_);
  wait_host(lk, [&] {
    return state() == State::idle && posted_ == 0 && spin_.load(std::memory_order_acquire) == 0;
  });
}

void SimStream::post() {
  g_waiting_drains.fetch_add(1, std::memory_order_relaxed);
  Executor::instance().post([this] { run_posted(); }, home_);
}

bool SimStream::push_locked(Task task) {
  queue_.push_back(std::move(task));
  if (state() != State::idle) return false;  // whoever runs it runs this after what is queued
  if (spin_.load(std::memory_order_acquire) == 1) {  // a pool thread waits for it: hand it over
    set_state(State::running);
    spin_.store(2, std::memory_order_release);
    return false;
  }
  set_state(State::scheduled);
  ++posted_;
  return true;
}

void SimStream::push(Task task) {
  task.floor = host_floor();
  bool post_it;
  {
    std::lock_guard lk(mu_);
    post_it = push_locked(std::move(task));
  }
  if (post_it) post();
}

void SimStream::enqueue(std::function<void()> task) { push({std::move(task), nullptr, true}); }

void SimStream::enqueue_internal(std::function<void()> task) {
  push({std::move(task), nullptr, false});
}

// Note [Inline work]
// A small kernel takes less time than handing it to a pool thread (a futex wake and a context
// switch on each side, tens of microseconds when the cores are shared): the 10-5-2 model on 4
// devices spent most of its step in futex calls. So a short task enqueued on a stream with
// nothing queued or running runs at once on the calling thread, which a pool thread would
// otherwise have run next. Short: the kernels whose KernelCost is below kInlineFlops and
// kInlineBytes (sim_kernels.cpp), device copies up to 256 KiB and frees (sim_backend.cpp), event
// records and waits (below), and the arrival of a collective that moves at most kInlineBytes
// (sim_communicator.cpp, Note [Small collectives]). A stream that Resume::here resumes (an
// event's completion, a collective's end) runs its queued short work on the resuming thread
// (Note [Stream hand-offs]). The stream is marked running
// meanwhile, so work enqueued on it from other threads queues behind it and a host thread
// waiting on it waits for it, as for a pool thread. Stream order, errors (kept for
// synchronize()), fault checks and virtual time are as for enqueue(): only the thread differs.
// Not inline: work enqueued from inside stream work (a pool thread's drain: it would nest
// drains), and any task that may block or take a caller's lock (users' enqueue()).

void SimStream::enqueue_short(std::function<void()> task) {
  push_short({std::move(task), nullptr, true});
}

void SimStream::enqueue_internal_short(std::function<void()> task) {
  push_short({std::move(task), nullptr, false});
}

void SimStream::push_short(Task task) {
  task.is_short = true;
  task.floor = host_floor();
  std::unique_lock lk(mu_);
  if (t_drains > 0 || state() != State::idle || !queue_.empty()) {
    const bool post_it = push_locked(std::move(task));
    lk.unlock();
    if (post_it) post();
    return;
  }
  set_state(State::running);
  if (task.start) {  // a parking task: as drain() starts one
    if (std::exception_ptr err = start_task(lk, task)) {
      keep_error_locked(std::move(err));
      release_after_inline_locked();
    } else if (resumed_early_) {
      release_after_inline_locked();
    } else {
      set_state(State::parked);  // resume() puts the stream back on the pool
    }
    return;
  }
  lk.unlock();
  std::exception_ptr err = run_plain(task);
  lk.lock();
  if (err) keep_error_locked(std::move(err));
  release_after_inline_locked();
}

std::exception_ptr SimStream::run_plain(Task& task) {
  std::exception_ptr err;
  apply_floor(task.floor);
  try {
    if (task.checked && health_ && health_->failed.load()) throw BackendError(health_->failure());
    task.run();
  } catch (...) {
    err = std::current_exception();
  }
  task = {};  // release captures before reporting idle
  return err;
}

void SimStream::release_after_inline_locked() {
  if (queue_.empty()) {
    set_state(State::idle);
    bump();
  } else if (spin_.load(std::memory_order_acquire) == 1) {
    spin_.store(2, std::memory_order_release);
  } else {
    set_state(State::scheduled);
    ++posted_;
    post();
  }
}

void SimStream::enqueue_parked_short(std::function<void(Resume)> start) {
  push_short({nullptr, std::move(start), false});
}

void SimStream::enqueue_parked(std::function<void(Resume)> start) {
  push({nullptr, std::move(start), false});
}

void SimStream::run_posted() {
  g_waiting_drains.fetch_sub(1, std::memory_order_relaxed);
  std::unique_lock lk(mu_);
  --posted_;
  if (state() != State::scheduled) {  // a waiting host thread claimed it meanwhile
    if (posted_ == 0) bump();         // the destructor waits for posted_ == 0
    return;
  }
  set_state(State::running);
  drain(lk, nullptr);
}

bool SimStream::spin_for_handoff(std::unique_lock<std::mutex>& lk) {
  if (!take_spin_slot()) return false;
  spin_.store(1, std::memory_order_release);
  lk.unlock();
  spin_until([&] { return spin_.load(std::memory_order_acquire) != 1; });
  give_spin_slot();
  lk.lock();
  if (spin_.exchange(0, std::memory_order_acq_rel) == 2) return true;  // state_ running: go on
  bump();  // the destructor waits for spin_ == 0
  return false;
}

// Runs the queue until it is empty, a task parks the stream, or (on the pool) the budget is spent
// (then the stream goes to the back of the pool's queue) or (on a waiting host) done() holds.
void SimStream::drain(std::unique_lock<std::mutex>& lk, const std::function<bool()>* done) {
  ++t_drains;
  struct Leave {
    ~Leave() { --t_drains; }
  } leave;
  for (int budget = kDrainBudget;; --budget) {
    if (queue_.empty()) {
      set_state(State::idle);
      bump();
      if (done || !spin_for_handoff(lk)) return;
      budget = kDrainBudget;
      continue;
    }
    if (done ? (*done)() : budget == 0) {                // the pool runs the rest
      if (spin_.load(std::memory_order_acquire) == 1) {  // a pool thread waits for it
        spin_.store(2, std::memory_order_release);
        return;
      }
      set_state(State::scheduled);
      ++posted_;
      post();
      return;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (task.start) {
      if (std::exception_ptr err = start_task(lk, task)) {
        keep_error_locked(std::move(err));
        continue;
      }
      if (resumed_early_) continue;
      set_state(State::parked);  // resume() puts the stream back on the pool
      if (done || !spin_for_handoff(lk)) return;
      budget = kDrainBudget;
      continue;
    }
    lk.unlock();
    std::exception_ptr err = run_plain(task);
    if (t_drains == 1 && !t_claimed.empty()) run_claimed();  // claimed by a nested drain
    lk.lock();
    if (err) keep_error_locked(std::move(err));
  }
}

void SimStream::wait_host(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done) {
  bool spun = false;
  for (;;) {
    if (done()) break;
    if (state() == State::scheduled) {  // posted, not started: run it here (no hand-off)
      set_state(State::running);
      drain(lk, &done);
      spun = false;  // a new wait: spin again before sleeping
      continue;
    }
    const std::uint64_t seen = changes_.load(std::memory_order_acquire);
    ++host_waiters_;
    if (!spun && take_spin_slot()) {
      spun = true;
      lk.unlock();
      spin_until([&] { return changes_.load(std::memory_order_acquire) != seen; });
      give_spin_slot();
      lk.lock();
    } else {
      cv_idle_.wait(lk, [&] { return changes_.load(std::memory_order_acquire) != seen; });
    }
    --host_waiters_;
  }
  // A resume handed the stream to the waiting host threads (no pool job), and this one no longer
  // needs it: the pool runs it.
  if (state() == State::scheduled && posted_ == 0) {
    ++posted_;
    post();
  }
}

void SimStream::resume(std::exception_ptr error, bool here) {
  {
    std::lock_guard lk(mu_);
    if (error) keep_error_locked(std::move(error));
    if (starting_) {  // still inside start() on the draining thread: it carries on
      resumed_early_ = true;
      return;
    }
    if (queue_.empty()) {
      set_state(State::idle);
      bump();
      return;
    }
    if (here && t_drains > 0 && (queue_.front().start || queue_.front().is_short)) {
      // this thread runs it next (no hop): a parking task, or short work (Note [Inline work])
      set_state(State::running);
      t_claimed.push_back(this);
      return;
    }
    if (spin_.load(std::memory_order_acquire) == 1) {  // its pool thread still waits: hand over
      set_state(State::running);
      spin_.store(2, std::memory_order_release);
      return;
    }
    set_state(State::scheduled);
    if (host_waiters_ > 0) {  // a host thread waits on this stream: it runs it
      bump();
      return;
    }
    ++posted_;
  }
  post();
}

// Note [Concurrent synchronize]
// A stream's error is kept until a synchronize() reports it (Stream's contract: then the stream
// is usable again). Several host threads may wait on one stream at once: a rank's thread and a
// logger, or two communicators' ranks on one device's default stream. Each of them waited
// through the failed work, so each must see the error: were only the first to wake told, the
// others would return normally and read buffers the failed collective never wrote (a silent
// wrong result; CUDA reports a stream's error to every cudaStreamSynchronize waiting on it).
// So each synchronize() takes a ticket on entry; the one that reports an error records it with
// the last ticket taken, and a synchronize() holding a ticket up to that one rethrows the same
// error when it wakes. A synchronize() entered after the report starts afresh (it returns
// normally unless later work failed), as before.
void SimStream::synchronize() {
  std::unique_lock lk(mu_);
  const std::uint64_t ticket = ++sync_tickets_;
  wait_host(lk, [&] { return state() == State::idle; });
  // Idle with mu_ held: no task writes the clock meanwhile. Note [Host clock] (cost_model.h).
  host_waited(health_.get(), virtual_now);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    reported_ = e;
    reported_upto_ = sync_tickets_;
    std::rethrow_exception(e);
  }
  if (reported_ && ticket <= reported_upto_) std::rethrow_exception(reported_);
}

void SimStream::run_sync(std::function<void()> task) {
  std::exception_ptr own;  // the task's own error
  // A blocking call: launched at the host clock, and the host waits for its end (Note [Host
  // clock], cost_model.h).
  const std::int64_t floor = host_floor();
  std::int64_t end = 0;
  auto run = [&] {
    try {
      apply_floor(floor);
      if (health_ && health_->failed.load()) throw BackendError(health_->failure());
      task();
      end = virtual_now;
    } catch (...) {
      own = std::current_exception();
    }
  };
  std::unique_lock lk(mu_);
  if (state() == State::idle && queue_.empty()) {
    // Nothing queued before it (Note [Stream hand-offs]): run it now, on this thread. Work
    // enqueued meanwhile queues behind it.
    set_state(State::running);
    lk.unlock();
    run();
    lk.lock();
    release_after_inline_locked();
  } else {
    // The task and this frame share `own` and `ran`: this thread waits until the task is done
    // with them, and the task holds no copy of the exception (so the worker never releases the
    // exception this thread throws).
    bool ran = false;  // guarded by mu_
    const bool post_it = push_locked({[&] {
                                        run();
                                        std::lock_guard g(mu_);
                                        ran = true;
                                        bump();
                                      },
                                      nullptr, false});
    if (post_it) post();
    wait_host(lk, [&] { return ran; });
  }
  host_waited(health_.get(), end);
  if (own) {
    lk.unlock();
    std::rethrow_exception(own);
  }
  // Like cudaMemcpy, report an error left by earlier work on this stream.
  std::exception_ptr earlier;
  std::swap(earlier, error_);
  lk.unlock();
  if (earlier) std::rethrow_exception(earlier);
}

void SimStream::record(Event& event) {
  auto* e = dynamic_cast<SimEvent*>(&event);
  DITTO_CHECK(e, "Stream::record: event of another backend recorded on ", device_.str());
  auto st = e->state();
  std::uint64_t gen;
  {
    std::lock_guard lk(st->mu);
    gen = ++st->recorded;
    st->host = health_;
  }
  // Internal: the event completes even on a failed device (waiters must never hang), carrying
  // the failure to them.
  const DeviceHealth* health = health_.get();
  enqueue_internal_short(
      [this, st, gen, health] { st->complete(gen, virtual_now, health ? health->failure() : ""); });
}

void SimStream::wait(const Event& event) {
  auto* e = dynamic_cast<const SimEvent*>(&event);
  DITTO_CHECK(e, "Stream::wait: event of another backend waited on by ", device_.str());
  auto st = e->state();
  std::uint64_t gen;
  {
    std::lock_guard lk(st->mu);
    gen = st->recorded;
  }
  if (gen == 0) return;
  enqueue_parked_short([st, gen, who = device_](Resume resume) {
    std::exception_ptr error;
    {
      std::lock_guard lk(st->mu);
      if (st->completed < gen) {  // park until complete() resumes us
        st->waiters.push_back({gen, resume, who});
        return;
      }
      error = poison_error(who, st->poison);
    }
    resume(error);
  });
  // Once resumed (in stream order): the stream's clock moves up to the event's.
  enqueue_internal_short([this, st, gen] {
    std::lock_guard lk(st->mu);
    virtual_now = std::max(virtual_now, st->vtime_locked(gen));
  });
}

}  // namespace ditto::sim
