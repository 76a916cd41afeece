#include "backend_sim/sim_executor.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace ditto::sim {

namespace {

int pool_size() {
  if (const char* env = std::getenv("DITTO_SIM_THREADS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 1024) return static_cast<int>(v);
  }
  // At least 4: a user task that blocks (tests that hold a stream) then still leaves threads for
  // the other streams, and small device counts overlap as they did with a thread per stream.
  return std::max(4, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

// ---- Executor -------------------------------------------------------------------------------

struct Executor::Impl {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;

  void loop() {
    std::unique_lock lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return !jobs.empty(); });
      std::function<void()> job = std::move(jobs.front());
      jobs.pop_front();
      lk.unlock();
      job();
      job = nullptr;  // release captures outside the lock
      lk.lock();
    }
  }
};

Executor& Executor::instance() {
  static Executor* e = new Executor();  // never destroyed: see the class comment
  return *e;
}

Executor::Executor() : impl_(new Impl), threads_(pool_size()) {
  for (int i = 0; i < threads_; ++i) std::thread([impl = impl_] { impl->loop(); }).detach();
}

void Executor::post(std::function<void()> job) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->jobs.push_back(std::move(job));
  }
  impl_->cv.notify_one();
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
      if (Clock::now() < first->first.first) {
        cv.wait_until(lk, first->first.first);
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
      impl_->started = true;
      std::thread([impl = impl_] { impl->loop(); }).detach();
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
