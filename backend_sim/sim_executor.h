// The simulator's shared threads: one bounded pool that runs every virtual device's stream work,
// and one watchdog thread that fires deadlines (collective timeouts).
//
// Note [Sim executor]
// A virtual device does not own an OS thread: each SimStream is a serial queue that, while it has
// work, is scheduled on the process-wide Executor (a fixed pool, by default
// max(4, std::thread::hardware_concurrency()) threads; DITTO_SIM_THREADS=N overrides). So 1024
// virtual devices need no more threads than 4, and memory grows with queued work, not with
// devices. The rule that makes a fixed pool safe: nothing a pool thread runs ever blocks waiting
// for another stream. A stream waiting for an event, or a rank's part of a collective waiting for
// the other ranks, is *parked* (SimStream::enqueue_parked): it holds no thread and is put back on
// the pool by whoever completes its dependency. Only a task written by a user (enqueue) can
// block a pool thread, and then only that thread.
//
// Note [Intra-op parallelism]
// A large kernel of one device (a GEMM: backend_sim/sim_gemm.h, gemm_split) may use the threads
// that no device needs at the moment: Executor::parallel_for cuts it into chunks, claimed one at
// a time through an atomic counter; the caller runs chunks itself, and a helper job posted to
// each idle thread claims chunks too until none is left (a helper that starts late finds none
// and returns). The caller then waits only for chunks already claimed, which are running on
// threads that hold no lock and wait for nothing, so the wait always ends: no new way to block a
// pool thread, and with every thread busy a kernel simply runs alone on its own thread. In
// bitwise mode the chunks are blocks of output elements, never parts of a reduction, so the bits
// do not depend on how many threads took part.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace ditto::sim {

/// The process-wide bounded pool that runs stream work (Note [Sim executor]). Created on first
/// use and never destroyed (its threads are detached, so work may outlive static destructors).
class Executor {
 public:
  static Executor& instance();

  /// The pool's size as configured (DITTO_SIM_THREADS, else max(4, the hardware threads)),
  /// without creating the pool; warns once per process about a DITTO_SIM_THREADS it does not use.
  /// SimBackend calls it when it is made, so the warning does not wait for the pool's first use
  /// (a small run may never use it).
  static int configured_threads();

  /// Run `job` on a pool thread, preferably thread `home` % threads() (after the jobs posted there
  /// before it); returns at once. `job` must not throw (callers catch) and must not block waiting
  /// for other posted jobs.
  void post(std::function<void()> job, std::uint64_t home);

  /// A home for a new stream: round-robin over the threads.
  static std::uint64_t next_home();

  /// Number of pool threads.
  int threads() const { return threads_; }

  /// std::thread::hardware_concurrency() (at least 1), read once. glibc answers each call of
  /// hardware_concurrency() by opening and parsing /sys/devices/system/cpu/online (an openat, a
  /// read and a close): called per GEMM, that was 17% of the 4-device seed model's time.
  static int hardware_threads();

  /// Run body(i) for every i in [0, n), on the calling thread and on pool threads that are idle
  /// (nothing running, nothing queued) when it is called, at most max_helpers of them (-1: one
  /// per other hardware thread); returns when every call has returned. Note [Intra-op
  /// parallelism]: the caller claims chunks like any helper, helpers only take chunks nobody has
  /// claimed, and the caller waits only for chunks that a running thread has claimed, so it never
  /// waits for work that cannot start (safe from a pool thread, with every other thread busy or
  /// parked). `body` must not throw and must not block; calls may run in any order and at once.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& body,
                    int max_helpers = -1);

  /// Whether some pool thread is idle right now (a hint: it may be busy by the time it is asked).
  /// Lets a kernel skip cutting itself into chunks when no thread could help.
  bool has_idle_thread() const;

 private:
  Executor();
  struct Impl;
  Impl* impl_;
  int threads_ = 0;
};

/// One thread that calls functions at deadlines (collective timeouts). Process-wide, never
/// destroyed. Callbacks run on the watchdog thread, without its lock held, one at a time: they
/// must be short and must not block.
class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  static Watchdog& instance();

  /// Call `fn` at `deadline` unless cancelled first; returns an id for cancel().
  std::uint64_t schedule(Clock::time_point deadline, std::function<void()> fn);
  /// Forget the call with `id` if it has not started (a callback already running still runs: it
  /// must check that it is still wanted).
  void cancel(std::uint64_t id);

 private:
  Watchdog();
  struct Impl;
  Impl* impl_;
};

}  // namespace ditto::sim
