#include "backend_sim/sim_executor.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/backend_api/rendezvous.h"  // detail::print_warning
#include "core/base/error.h"

namespace ditto::sim {

namespace {

int pool_size() {
  if (const char* env = std::getenv("DITTO_SIM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
    // A value that is not used is said, once per process (a typo would otherwise run on the
    // default silently).
    static std::once_flag warned;
    std::call_once(warned, [env] {
      detail::print_warning(std::string("ditto: warning: DITTO_SIM_THREADS='") + env +
                            "': expected an integer in 1..1024 (the simulator's worker threads); "
                            "using the default, max(4, the hardware threads)");
    });
  }
  // At least 4: a user task that blocks (tests that hold a stream) then still leaves threads for
  // the other streams, and small device counts overlap as they did with a thread per stream.
  return std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

// ---- Executor -------------------------------------------------------------------------------
//
// One queue per thread: a job posted with home h goes to queue h % T, so each stream (homed at
// creation, round-robin) is normally run by one thread, with no lock shared by all threads: for a
// few devices this is a thread per stream, as before the pool. Jobs queued behind a thread that
// is held by a long task (a user's task that blocks) are stolen: while any job is queued, one
// idle thread polls every kStealPoll and takes jobs that waited that long; the others sleep.
// Stealing only after a poll leaves short waits to the home thread (no migration, no extra
// wake-ups for the many tiny kernels of a small model): with a 1 ms poll, 4 devices trained
// about 15% slower than with no stealing; at 20 ms the difference is lost in the noise.

namespace {
constexpr auto kStealPoll = std::chrono::milliseconds(20);
}  // namespace

struct Executor::Impl {
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    bool sleeping = false;  // in the untimed wait
    bool wake = false;      // asked to poll for others' jobs
    std::atomic<bool> busy{false};
  };
  std::vector<std::unique_ptr<Worker>> workers;
  std::atomic<std::int64_t> queued{0};  // jobs in all queues
  std::atomic<int> pollers{0};          // threads polling for jobs to steal

  // Takes the front job of w's queue; `more` tells whether jobs are left behind it.
  bool pop(Worker& w, std::function<void()>& job, bool wait_lock, bool& more) {
    std::unique_lock lk(w.mu, std::defer_lock);
    if (wait_lock)
      lk.lock();
    else if (!lk.try_lock())
      return false;
    if (w.jobs.empty()) return false;
    job = std::move(w.jobs.front());
    w.jobs.pop_front();
    queued.fetch_sub(1);
    more = !w.jobs.empty();
    return true;
  }

  void loop(std::size_t k) {
    Worker& me = *workers[k];
    const std::size_t t = workers.size();
    std::function<void()> job;
    bool polled = false;  // waited kStealPoll with jobs queued elsewhere
    for (;;) {
      bool more = false;
      std::size_t from = k;
      bool got = pop(me, job, true, more);
      for (std::size_t i = 1; !got && polled && i < t; ++i) {
        from = (k + i) % t;
        got = pop(*workers[from], job, false, more);  // steal
      }
      if (got) {
        if (polled) pollers.fetch_sub(1);
        polled = false;
        // Jobs left behind the one taken wait for this thread (or their home thread), which may
        // block in it: some idle thread must poll for them. Without this a job queued behind a
        // task that blocks, posted while its home thread was idle, waited for nobody.
        if (more) wake_a_poller(from);
        me.busy.store(true);
        job();
        job = nullptr;  // release captures outside any lock
        me.busy.store(false);
        continue;
      }
      std::unique_lock lk(me.mu);
      if (!me.jobs.empty()) continue;
      if (queued.load() > 0 && (polled || pollers.load() == 0)) {
        if (!polled) pollers.fetch_add(1);
        polled = true;
        me.cv.wait_for(lk, kStealPoll);
        continue;
      }
      if (polled) {
        pollers.fetch_sub(1);
        polled = false;
        // A post() between the queued.load() above and the fetch_sub saw this thread still
        // polling and woke nobody: look again before sleeping (both sides are seq_cst, so either
        // the post sees pollers == 0 or this load sees its job).
        if (queued.load() > 0) {
          pollers.fetch_add(1);
          polled = true;
          me.cv.wait_for(lk, kStealPoll);
          continue;
        }
      }
      me.sleeping = true;
      me.cv.wait(lk, [&] { return !me.jobs.empty() || me.wake; });
      me.sleeping = me.wake = false;
      if (me.jobs.empty()) {  // woken to poll: steal what is still queued after kStealPoll
        pollers.fetch_add(1);
        polled = true;
        me.cv.wait_for(lk, kStealPoll);
      }
    }
  }

  // A job went to a busy thread: make sure some idle thread polls for it.
  void wake_a_poller(std::size_t except) {
    if (pollers.load() > 0) return;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      if (i == except) continue;
      Worker& w = *workers[i];
      std::lock_guard lk(w.mu);
      if (!w.sleeping || w.wake) continue;
      w.wake = true;
      w.cv.notify_one();
      return;
    }
  }
};

int Executor::configured_threads() { return pool_size(); }

Executor& Executor::instance() {
  static Executor* e = new Executor();  // never destroyed: see the class comment
  return *e;
}

// A pool thread the system cannot create (std::system_error: no room for its stack under
// `ulimit -v`, too many threads): the pool runs on the threads it got (any number >= 1 is correct,
// Note [Sim executor]), with a warning; none at all is a ditto::Error naming the reason. The
// threads wait for `gate` so that they see the pool's final size.
Executor::Executor() : impl_(new Impl), threads_(pool_size()) {
  for (int i = 0; i < threads_; ++i) impl_->workers.push_back(std::make_unique<Impl::Worker>());
  auto gate = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
  auto open = std::make_shared<bool>(false);
  int created = 0;
  std::string failure;
  for (; created < threads_; ++created) {
    try {
      std::thread([impl = impl_, created, gate, open] {
        {
          std::unique_lock lk(gate->first);
          gate->second.wait(lk, [&] { return *open; });
        }
        impl->loop(static_cast<std::size_t>(created));
      }).detach();
    } catch (const std::system_error& e) {
      failure = e.code().message();
      break;
    }
  }
  if (created == 0)
    throw Error(detail::cat("sim: cannot create the simulator's first pool thread (of ", threads_,
                            "): ", failure, " (raise `ulimit -v` / `ulimit -u`)"));
  if (created < threads_) {
    detail::print_warning(detail::cat("ditto: warning: sim: the simulator's thread pool runs on ",
                                      created, " of its ", threads_, " threads: thread ",
                                      created + 1, " could not be created: ", failure,
                                      " (DITTO_SIM_THREADS=", created, " asks for that many)"));
    impl_->workers.resize(static_cast<std::size_t>(created));
    threads_ = created;
  }
  {
    std::lock_guard lk(gate->first);
    *open = true;
  }
  gate->second.notify_all();
}

void Executor::post(std::function<void()> job, std::uint64_t home) {
  const std::size_t k = home % impl_->workers.size();
  Impl::Worker& w = *impl_->workers[k];
  {
    std::lock_guard lk(w.mu);
    w.jobs.push_back(std::move(job));
    impl_->queued.fetch_add(1);
  }
  w.cv.notify_one();
  if (w.busy.load()) impl_->wake_a_poller(k);
}

namespace {

// The state of one parallel_for, shared with the helper jobs (which may outlive the call: a
// helper that starts after the last chunk was claimed only reads the counter).
struct ParallelRun {
  std::int64_t n = 0;
  const std::function<void(std::int64_t)>* body = nullptr;  // valid while chunks are unclaimed
  std::atomic<std::int64_t> next{0};                        // next chunk to claim
  std::atomic<std::int64_t> done{0};                        // chunks finished

  void run_chunks() {
    for (std::int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      (*body)(i);
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

}  // namespace

void Executor::parallel_for(std::int64_t n, const std::function<void(std::int64_t)>& body,
                            int max_helpers) {
  if (n <= 0) return;
  if (n == 1) {
    body(0);
    return;
  }
  if (max_helpers < 0) max_helpers = hardware_threads() - 1;
  max_helpers = static_cast<int>(std::min<std::int64_t>(max_helpers, n - 1));
  auto run = std::make_shared<ParallelRun>();
  run->n = n;
  run->body = &body;
  // Ask idle threads: not running a job, nothing queued, lock free right now.
  static std::atomic<std::uint64_t> rotate{0};
  const std::size_t t = impl_->workers.size();
  const std::size_t first = static_cast<std::size_t>(rotate.fetch_add(1) % t);
  for (std::size_t i = 0; i < t && max_helpers > 0; ++i) {
    Impl::Worker& w = *impl_->workers[(first + i) % t];
    if (w.busy.load()) continue;
    std::unique_lock lk(w.mu, std::try_to_lock);
    if (!lk.owns_lock() || !w.jobs.empty() || w.busy.load()) continue;
    w.jobs.push_back([run] { run->run_chunks(); });
    impl_->queued.fetch_add(1);
    lk.unlock();
    w.cv.notify_one();
    --max_helpers;
  }
  run->run_chunks();
  // Every chunk is claimed now; those not finished run on threads that wait for nothing.
  while (run->done.load(std::memory_order_acquire) < n) std::this_thread::yield();
}

bool Executor::has_idle_thread() const {
  for (const auto& w : impl_->workers)
    if (!w->busy.load()) {
      std::unique_lock lk(w->mu, std::try_to_lock);
      if (lk.owns_lock() && w->jobs.empty() && !w->busy.load()) return true;
    }
  return false;
}

int Executor::hardware_threads() {
  static const int n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return n;
}

std::uint64_t Executor::next_home() {
  static std::atomic<std::uint64_t> next{0};
  return next.fetch_add(1);
}

// ---- Watchdog -------------------------------------------------------------------------------

struct Watchdog::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t next_id = 1;
  std::map<std::pair<Clock::time_point, std::uint64_t>, std::function<void()>> due;
  std::unordered_map<std::uint64_t, Clock::time_point> when;
  bool started = false;

  void loop() {
    std::unique_lock lk(mu);
    for (;;) {
      if (due.empty()) {
        cv.wait(lk);
        continue;
      }
      auto first = due.begin();
      // A copy: wait_until reads its deadline again after waking, and cancel() may have erased
      // this entry while the lock was released (a reference into the map would dangle).
      const Clock::time_point deadline = first->first.first;
      if (Clock::now() < deadline) {
        cv.wait_until(lk, deadline);
        continue;
      }
      std::function<void()> fn = std::move(first->second);
      when.erase(first->first.second);
      due.erase(first);
      lk.unlock();
      fn();
      fn = nullptr;
      lk.lock();
    }
  }
};

Watchdog& Watchdog::instance() {
  static Watchdog* w = new Watchdog();  // never destroyed, like the Executor
  return *w;
}

Watchdog::Watchdog() : impl_(new Impl) {}

std::uint64_t Watchdog::schedule(Clock::time_point deadline, std::function<void()> fn) {
  std::uint64_t id;
  bool earliest;
  {
    std::lock_guard lk(impl_->mu);
    if (!impl_->started) {  // started on first use: a program without timeouts has no watchdog
      try {
        std::thread([impl = impl_] { impl->loop(); }).detach();
      } catch (const std::system_error& e) {
        throw Error(detail::cat("sim: cannot create the watchdog thread of collective timeouts: ",
                                e.code().message(), " (raise `ulimit -v` / `ulimit -u`)"));
      }
      impl_->started = true;
    }
    id = impl_->next_id++;
    auto it = impl_->due.emplace(std::make_pair(deadline, id), std::move(fn)).first;
    impl_->when.emplace(id, deadline);
    earliest = it == impl_->due.begin();
  }
  if (earliest) impl_->cv.notify_one();  // else the thread already wakes up in time
  return id;
}

void Watchdog::cancel(std::uint64_t id) {
  std::lock_guard lk(impl_->mu);
  auto it = impl_->when.find(id);
  if (it == impl_->when.end()) return;
  impl_->due.erase(std::make_pair(it->second, id));
  impl_->when.erase(it);
}

}  // namespace ditto::sim
