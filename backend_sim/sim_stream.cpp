#include "backend_sim/sim_stream.h"

#include <algorithm>

#include "core/error.h"

namespace ditto::sim {

void EventState::complete(std::uint64_t gen, std::int64_t vtime) {
  {
    std::lock_guard lk(mu);
    if (gen > completed) completed = gen;
    vtimes[gen] = vtime;
    while (vtimes.size() > 64) vtimes.erase(vtimes.begin());  // keep the recent generations
  }
  cv.notify_all();
}

std::int64_t EventState::wait_for(std::uint64_t gen) {
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return completed >= gen; });
  auto it = vtimes.lower_bound(gen);  // gen itself unless it was pruned
  return it == vtimes.end() ? 0 : it->second;
}

void SimEvent::synchronize() {
  std::uint64_t gen;
  {
    std::lock_guard lk(state_->mu);
    gen = state_->recorded;
  }
  state_->wait_for(gen);
}

bool SimEvent::query() {
  std::lock_guard lk(state_->mu);
  return state_->completed >= state_->recorded;
}

SimStream::~SimStream() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void SimStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(task));
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  }
  cv_work_.notify_one();
}

void SimStream::worker_loop() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop requested and drained
    auto task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    try {
      task();
    } catch (...) {
      std::lock_guard elk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    task = nullptr;  // release captures before reporting idle
    lk.lock();
    busy_ = false;
    if (queue_.empty()) cv_idle_.notify_all();
  }
}

void SimStream::synchronize() {
  std::unique_lock lk(mu_);
  cv_idle_.wait(lk, [&] { return queue_.empty() && !busy_; });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void SimStream::run_sync(std::function<void()> task) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto done = std::make_shared<Done>();
  enqueue([task = std::move(task), done] {
    try {
      task();
    } catch (...) {
      done->error = std::current_exception();
    }
    {
      std::lock_guard lk(done->mu);
      done->done = true;
    }
    done->cv.notify_all();
  });
  std::unique_lock lk(done->mu);
  done->cv.wait(lk, [&] { return done->done; });
  if (done->error) std::rethrow_exception(done->error);
  // Like cudaMemcpy, report an error left by earlier work on this stream.
  std::exception_ptr earlier;
  {
    std::lock_guard elk(mu_);
    std::swap(earlier, error_);
  }
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
  }
  enqueue([this, st, gen] { st->complete(gen, virtual_now); });
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
  enqueue([this, st, gen] { virtual_now = std::max(virtual_now, st->wait_for(gen)); });
}

}  // namespace ditto::sim
