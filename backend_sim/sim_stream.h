// SimStream / SimEvent: a virtual device's ordered work queue. A stream owns no thread: while it
// has work it is scheduled on the simulator's bounded pool (Note [Sim executor] in
// sim_executor.h), so work on different virtual devices (and different streams of one device)
// still overlaps, and 1024 devices need no 1024 threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend_sim/sim_executor.h"
#include "core/runtime/stream.h"

namespace ditto::sim {

class SimStream;

/// An exception_ptr holding a new E(what, more...), built in place: no copy of the exception (whose
/// reference-counted message another thread may be reading) is left to die on this thread.
template <typename E, typename... More>
std::exception_ptr error_ptr(const std::string& what, const More&... more) {
  try {
    throw E(what, more...);
  } catch (...) {
    return std::current_exception();
  }
}

/// Health of one virtual device, shared by its streams (fault injection, sim_faults.h). Once
/// failed, a device stays failed: its kernels, copies and collectives throw BackendError.
struct DeviceHealth {
  std::atomic<bool> failed{false};
  std::string reason;  ///< e.g. "sim:2: device failed (injected fault fail:device=2,step=5)"
  /// The device's host clock (Note [Host clock], cost_model.h): the latest virtual end of work on
  /// this device that a host thread waited for (a synchronize, an event's synchronize, a
  /// blocking copy), in picoseconds; work launched on the device afterwards starts no earlier.
  /// Only raised (never reset, reset() included: a device's virtual clocks never go back).
  std::atomic<std::int64_t> host_clock{0};

  /// Mark failed with `why` (first reason wins). Thread-safe.
  void fail(const std::string& why);
  /// The reason, or empty while healthy.
  std::string failure() const;
  /// Healthy again (SimBackend::set_faults).
  void reset();

 private:
  mutable std::mutex mu_;
};

/// Wakes a parked stream (SimStream::enqueue_parked). Cheap to copy; call exactly once, from any
/// thread. A non-null `error` is kept by the stream and rethrown by its synchronize().
class Resume {
 public:
  void operator()(std::exception_ptr error = nullptr) const;
  /// The same, for a caller that runs inside a stream's parking task (a collective's last rank):
  /// when the stream's next task parks again (the next collective), this thread runs it right
  /// after the current task instead of handing the stream to another thread (Note [Stream
  /// hand-offs], sim_stream.cpp); otherwise as operator().
  void here(std::exception_ptr error = nullptr) const;

 private:
  friend class SimStream;
  explicit Resume(SimStream* s) : s_(s) {}
  SimStream* s_;
};

/// Completion state shared by an event and the stream tasks that record or wait on it.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   ///< generation of the last record() call
  std::uint64_t completed = 0;  ///< highest generation whose work finished
  /// Virtual time (Note [Virtual time], cost_model.h) at which each recent generation was
  /// reached on the recording stream, in picoseconds.
  std::map<std::uint64_t, std::int64_t> vtimes;
  /// Non-empty when the last completion was recorded on a failed device: streams waiting on it
  /// fail with this reason instead of reading that device's results.
  std::string poison;
  struct Waiter {
    std::uint64_t gen;  ///< wakes when completed >= gen
    Resume resume;
    Device who;  ///< the waiting stream's device, for the poison message
  };
  std::vector<Waiter> waiters;  ///< parked streams
  /// The recording stream's device state, whose host clock a host's synchronize() raises to the
  /// event's virtual time (Note [Host clock], cost_model.h); null when never recorded.
  std::shared_ptr<DeviceHealth> host;

  /// Generation `gen` finished at virtual time `vtime`; `failure`: the recording device's failure
  /// reason (empty while healthy). Resumes the streams parked on it.
  void complete(std::uint64_t gen, std::int64_t vtime, std::string failure);
  /// Blocks the calling (host) thread until generation `gen` completed; returns its virtual time.
  std::int64_t wait_for(std::uint64_t gen);
  /// The virtual time of completed generation `gen` (0 when long pruned). Caller holds `mu`.
  std::int64_t vtime_locked(std::uint64_t gen) const;
};

class SimEvent final : public Event {
 public:
  SimEvent() : state_(std::make_shared<EventState>()) {}
  void synchronize() override;
  bool query() override;
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

class SimStream final : public Stream {
 public:
  /// `health`: the device's fault state (may be null: never fails).
  explicit SimStream(Device device, std::shared_ptr<DeviceHealth> health = nullptr)
      : device_(std::move(device)), health_(std::move(health)), home_(Executor::next_home()) {}
  /// Waits for every queued task (including parked ones) to finish.
  ~SimStream() override;

  Device device() const override { return device_; }
  int device_index() const { return device_.index; }
  /// Waits until the queue is empty and rethrows the first error kept since the last call; every
  /// other synchronize() of this stream waiting at that moment rethrows it too (Note [Concurrent
  /// synchronize], sim_stream.cpp). Work posted to the pool and not started yet runs on the
  /// calling thread meanwhile (Note [Stream hand-offs], sim_stream.cpp).
  void synchronize() override;
  /// synchronize() calls entered so far (for tests: whether host threads wait in one).
  std::uint64_t synchronize_calls() {
    std::lock_guard lk(mu_);
    return sync_tickets_;
  }
  void record(Event& event) override;
  /// Parks the stream (no thread held) until the event completes, then advances its virtual clock
  /// to the event's; fails the stream's later work with BackendError when the event was recorded
  /// on a failed device.
  void wait(const Event& event) override;

  /// Append `task` to the queue; it runs on a pool thread after everything before it.
  /// A ditto::Error (or any exception) thrown by a task is kept and rethrown by synchronize().
  /// On a failed device the task does not run: it fails with the device's BackendError.
  void enqueue(std::function<void()> task);

  /// Enqueue `task` and block until it has run; rethrows the task's own exception (or the
  /// device's BackendError), then any error left by earlier work on the stream. On an idle
  /// stream the task runs at once on the calling thread (Note [Stream hand-offs],
  /// sim_stream.cpp).
  void run_sync(std::function<void()> task);

  /// Append a task that starts something and parks the stream (Note [Sim executor]): in queue
  /// order, `start(resume)` runs on a pool thread; the stream then runs nothing more, and holds no
  /// thread, until `resume(error)` is called (from any thread, possibly inside `start`). If
  /// `start` throws, it must not call resume: the exception is kept as the task's error and the
  /// stream goes on. Runs on failed devices too (`start` checks health() itself).
  void enqueue_parked(std::function<void(Resume)> start);

  /// Appends an internal task that runs even on a failed device (frees, event records).
  void enqueue_internal(std::function<void()> task);

  /// enqueue() for a short task (a small kernel): when nothing is queued or running on the
  /// stream and the calling thread is not itself running stream work, `task` runs at once on the
  /// calling thread, with the stream marked running meanwhile (Note [Inline work],
  /// sim_stream.cpp); otherwise it is queued as by enqueue(). Either way its error is kept for
  /// synchronize(). `task` must be short and must not take a lock the caller may hold.
  void enqueue_short(std::function<void()> task);
  /// enqueue_internal() for a short task, with the same inline rule as enqueue_short().
  void enqueue_internal_short(std::function<void()> task);
  /// enqueue_parked() with the same inline rule: `start` may run at once on the calling thread
  /// (a small collective's arrival, an event wait). `start` must be short.
  void enqueue_parked_short(std::function<void(Resume)> start);

  /// The device's fault state (null: never fails).
  const DeviceHealth* health() const { return health_.get(); }

  /// Virtual clock of this stream in picoseconds (Note [Virtual time], cost_model.h): read and
  /// written only by this stream's tasks, in stream order (and by the last rank to arrive at a
  /// collective while the stream is parked in it, Note [Sim collectives]).
  std::int64_t virtual_now = 0;
  /// Index of this stream among its device's streams (0: the default stream); its trace track.
  int track = 0;

 private:
  friend class Resume;
  struct Task {
    std::function<void()> run;          // a plain task, or
    std::function<void(Resume)> start;  // a parking task
    bool checked = true;                // plain: fail instead of running on a failed device
    bool is_short = false;              // from enqueue_*_short (Note [Inline work])
    std::int64_t floor = 0;             // the host clock when it was launched (Note [Host clock])
  };
  enum class State : std::uint8_t { idle, scheduled, running, parked };
  void push(Task task);
  // Runs `task` (plain or parking) on this thread if it may (Note [Inline work]); else pushes it.
  void push_short(Task task);
  // Runs a plain task with mu_ released: fails it instead on a failed device when it is checked,
  // then drops its captures; returns what it threw.
  std::exception_ptr run_plain(Task& task);
  // After work that ran on a thread outside the pool with the stream running (mu_ held): idle
  // when nothing was queued meanwhile, else the queued work goes to a spinning pool thread or is
  // posted.
  void release_after_inline_locked();
  // Appends `task` (mu_ held); true when the caller must post the stream to the pool.
  bool push_locked(Task task);
  // Posts the stream's drain to the pool: ++posted_ with mu_ held, then post() (with or
  // without mu_; the destructor waits for posted_ == 0, so `this` stays alive).
  void post();
  // Every change a waiting host thread may look for: counted, then announced (mu_ held).
  void bump() {
    changes_.fetch_add(1, std::memory_order_release);
    cv_idle_.notify_all();
  }
  void run_posted();  // the pool's job: claims a scheduled stream and drains it
  // Runs the queue with mu_ held in `lk` (released around each task) and state_ == running.
  // On a pool thread (`done` null): until it is empty or parks, with a budget, then spins for a
  // hand-off (Note [Stream hand-offs]). On a waiting host thread: until `done()` or it parks.
  void drain(std::unique_lock<std::mutex>& lk, const std::function<bool()>* done);
  // Runs a stream claimed by Resume::here while its next task parks; posts it at the first
  // plain task. mu_ held in `lk`, state_ running.
  void drain_claimed(std::unique_lock<std::mutex>& lk);
  // Starts `task` (a parking task, popped from the queue) with mu_ released, then the streams
  // Resume::here claimed meanwhile when this is the outermost drain; returns what it threw.
  // mu_ held in `lk` before and after; on return starting_ is false and resumed_early_ says
  // whether the task resumed the stream before returning.
  std::exception_ptr start_task(std::unique_lock<std::mutex>& lk, Task& task);
  // Runs the streams this thread claimed (Resume::here), until there are none.
  static void run_claimed();
  // Blocks the calling (host) thread until `done()`, running the stream's scheduled work itself.
  void wait_host(std::unique_lock<std::mutex>& lk, const std::function<bool()>& done);
  bool spin_for_handoff(std::unique_lock<std::mutex>& lk);
  void set_state(State s) { state_.store(s, std::memory_order_release); }
  // The device's host clock as a launch from this thread sees it (Note [Host clock],
  // cost_model.h): 0 inside stream work (no host launches there) or without a DeviceHealth.
  std::int64_t host_floor() const;
  // Moves the clock up to the floor a task was launched with (mu_ not needed: stream order).
  void apply_floor(std::int64_t floor) {
    if (floor > virtual_now) virtual_now = floor;
  }
  State state() const { return state_.load(std::memory_order_acquire); }
  void resume(std::exception_ptr error, bool here = false);
  void keep_error_locked(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
  }

  Device device_;
  std::shared_ptr<DeviceHealth> health_;
  const std::uint64_t home_;  // the pool thread that normally runs this stream
  std::mutex mu_;
  std::condition_variable cv_idle_;  // state changes, for waiting host threads and the destructor
  std::deque<Task> queue_;
  // Written with mu_ held; read without it by spinning threads. scheduled: posted to the pool,
  // not yet claimed; running: a thread (pool or host) is draining it.
  std::atomic<State> state_{State::idle};
  std::atomic<std::uint64_t> changes_{0};  // bump()s so far (read by spinning host threads)
  int posted_ = 0;                         // pool jobs posted and not yet run (they touch `this`)
  int host_waiters_ = 0;  // host threads in wait_host (a resume hands the stream to them)
  // A pool thread that just drained the stream waits briefly for more (Note [Stream hand-offs]):
  // 0 none, 1 spinning, 2 handed the stream (state_ running, it drains again).
  std::atomic<int> spin_{0};
  bool starting_ = false;       // a parking task's start() is running on the draining thread
  bool resumed_early_ = false;  // ... and it already called resume
  std::exception_ptr error_;
  // Note [Concurrent synchronize]: synchronize() calls so far (each takes the next ticket), the
  // error the last reporting synchronize() threw, and the last ticket taken when it threw it:
  // every synchronize() that was already waiting then (ticket <= reported_upto_) throws it too.
  std::uint64_t sync_tickets_ = 0;
  std::exception_ptr reported_;
  std::uint64_t reported_upto_ = 0;
};

}  // namespace ditto::sim
