// SimStream / SimEvent: a virtual device's ordered work queue, run by a worker thread of its own,
// so work on different virtual devices (and different streams of one device) really overlaps.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/stream.h"

namespace ditto::sim {

/// Completion state shared by an event and the stream tasks that record or wait on it.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   ///< generation of the last record() call
  std::uint64_t completed = 0;  ///< highest generation whose work finished
  /// Virtual time (Note [Virtual time], cost_model.h) at which each recent generation was
  /// reached on the recording stream, in picoseconds.
  std::map<std::uint64_t, std::int64_t> vtimes;

  void complete(std::uint64_t gen, std::int64_t vtime = 0);
  /// Blocks until generation `gen` completed; returns its virtual time.
  std::int64_t wait_for(std::uint64_t gen);
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
  explicit SimStream(Device device) : device_(std::move(device)) {}
  ~SimStream() override;

  Device device() const override { return device_; }
  int device_index() const { return device_.index; }
  void synchronize() override;
  void record(Event& event) override;
  void wait(const Event& event) override;

  /// Append `task` to the queue; it runs on the worker thread after everything before it.
  /// A ditto::Error (or any exception) thrown by a task is kept and rethrown by synchronize().
  void enqueue(std::function<void()> task);

  /// Enqueue `task` and block until it has run; rethrows the task's own exception.
  void run_sync(std::function<void()> task);

  /// Virtual clock of this stream in picoseconds (Note [Virtual time], cost_model.h): read and
  /// written only by this stream's tasks, in stream order.
  std::int64_t virtual_now = 0;
  /// Index of this stream among its device's streams (0: the default stream); its trace track.
  int track = 0;

 private:
  void worker_loop();

  Device device_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;  // started on first enqueue
};

}  // namespace ditto::sim
