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
    Device who;         ///< the waiting stream's device, for the poison message
  };
  std::vector<Waiter> waiters;  ///< parked streams

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
  void synchronize() override;
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
  /// device's BackendError), then any error left by earlier work on the stream.
  void run_sync(std::function<void()> task);

  /// Append a task that starts something and parks the stream (Note [Sim executor]): in queue
  /// order, `start(resume)` runs on a pool thread; the stream then runs nothing more, and holds no
  /// thread, until `resume(error)` is called (from any thread, possibly inside `start`). If
  /// `start` throws, it must not call resume: the exception is kept as the task's error and the
  /// stream goes on. Runs on failed devices too (`start` checks health() itself).
  void enqueue_parked(std::function<void(Resume)> start);

  /// Appends an internal task that runs even on a failed device (frees, event records).
  void enqueue_internal(std::function<void()> task);

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
    std::function<void()> run;           // a plain task, or
    std::function<void(Resume)> start;   // a parking task
    bool checked = true;                 // plain: fail instead of running on a failed device
  };
  void push(Task task);
  void post_drain();
  void drain();  // runs on a pool thread
  void resume(std::exception_ptr error);
  void keep_error_locked(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
  }

  Device device_;
  std::shared_ptr<DeviceHealth> health_;
  const std::uint64_t home_;  // the pool thread that normally runs this stream
  std::mutex mu_;
  std::condition_variable cv_idle_;
  std::deque<Task> queue_;
  enum class State : std::uint8_t { idle, scheduled, parked };
  State state_ = State::idle;  // scheduled: posted to the pool or running there
  bool starting_ = false;      // a parking task's start() is running on the draining thread
  bool resumed_early_ = false; // ... and it already called resume
  std::exception_ptr error_;
};

}  // namespace ditto::sim
