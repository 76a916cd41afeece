#include "backend_sim/sim_stream.h"

#include <algorithm>
#include <utility>

#include "backend_sim/sim_executor.h"
#include "core/runtime/error.h"

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
  for (auto& w : ready) w.resume(poison_error(w.who, poisoned));
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

// ---- the stream -----------------------------------------------------------------------------

void Resume::operator()(std::exception_ptr error) const { s_->resume(std::move(error)); }

SimStream::~SimStream() {
  std::unique_lock lk(mu_);
  cv_idle_.wait(lk, [&] { return state_ == State::idle; });
}

void SimStream::push(Task task) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(task));
    if (state_ != State::idle) return;  // the pool runs it after what is queued
    state_ = State::scheduled;
  }
  post_drain();
}

void SimStream::post_drain() {
  Executor::instance().post([this] { drain(); }, home_);
}

void SimStream::enqueue(std::function<void()> task) { push({std::move(task), nullptr, true}); }

void SimStream::enqueue_internal(std::function<void()> task) {
  push({std::move(task), nullptr, false});
}

void SimStream::enqueue_parked(std::function<void(Resume)> start) {
  push({nullptr, std::move(start), false});
}

// Runs the queue on a pool thread until it is empty, a task parks the stream, or the budget is
// spent (then the stream goes to the back of the pool's queue).
void SimStream::drain() {
  std::unique_lock lk(mu_);
  for (int budget = kDrainBudget;; --budget) {
    if (queue_.empty()) {
      state_ = State::idle;
      cv_idle_.notify_all();
      return;
    }
    if (budget == 0) {  // stays scheduled
      lk.unlock();
      post_drain();
      return;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    if (task.start) {
      starting_ = true;
      resumed_early_ = false;
      lk.unlock();
      std::exception_ptr err;
      try {
        task.start(Resume(this));
      } catch (...) {
        err = std::current_exception();
      }
      task = {};
      lk.lock();
      starting_ = false;
      if (err) {
        keep_error_locked(std::move(err));
        continue;
      }
      if (resumed_early_) continue;
      state_ = State::parked;  // resume() puts the stream back on the pool
      return;
    }
    lk.unlock();
    std::exception_ptr err;
    try {
      if (task.checked && health_ && health_->failed.load())
        throw BackendError(health_->failure());
      task.run();
    } catch (...) {
      err = std::current_exception();
    }
    task = {};  // release captures before reporting idle
    lk.lock();
    if (err) keep_error_locked(std::move(err));
  }
}

void SimStream::resume(std::exception_ptr error) {
  {
    std::lock_guard lk(mu_);
    if (error) keep_error_locked(std::move(error));
    if (starting_) {  // still inside start() on the draining thread: it carries on
      resumed_early_ = true;
      return;
    }
    if (queue_.empty()) {
      state_ = State::idle;
      cv_idle_.notify_all();
      return;
    }
    state_ = State::scheduled;
  }
  post_drain();
}

void SimStream::synchronize() {
  std::unique_lock lk(mu_);
  cv_idle_.wait(lk, [&] { return state_ == State::idle; });
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
  const DeviceHealth* health = health_.get();
  push({[task = std::move(task), done, health] {
          try {
            if (health && health->failed.load()) throw BackendError(health->failure());
            task();
          } catch (...) {
            done->error = std::current_exception();
          }
          {
            std::lock_guard lk(done->mu);
            done->done = true;
          }
          done->cv.notify_all();
        },
        nullptr, false});
  std::unique_lock lk(done->mu);
  done->cv.wait(lk, [&] { return done->done; });
  // Take the exception out of `done`: the worker destroys its copy of `done` (the task) later,
  // and must not be the one to release the exception this thread is throwing (TSan saw the
  // exception's destructor on the worker race with the caller's what()).
  if (std::exception_ptr e = std::exchange(done->error, nullptr)) {
    lk.unlock();
    std::rethrow_exception(e);
  }
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
  // Internal: the event completes even on a failed device (waiters must never hang), carrying
  // the failure to them.
  const DeviceHealth* health = health_.get();
  enqueue_internal([this, st, gen, health] {
    st->complete(gen, virtual_now, health ? health->failure() : "");
  });
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
  enqueue_parked([st, gen, who = device_](Resume resume) {
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
  enqueue_internal([this, st, gen] {
    std::lock_guard lk(st->mu);
    virtual_now = std::max(virtual_now, st->vtime_locked(gen));
  });
}

}  // namespace ditto::sim
