// parallel_apply on a small persistent pool of host threads (created on first use and kept), so a
// training step does not pay for thread creation twice per step. One thread per replica up to
// max_threads(); past that (e.g. 1024 simulated devices) thread k of T runs replicas k, k + T,
// k + 2T, ..., so the thread count stays bounded.
#include "core/parallel/parallel_apply.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

#include "core/base/error.h"

namespace ditto::parallel {

namespace {

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {  // what() is only "std::bad_alloc"
    return "out of host memory (std::bad_alloc: a host allocation failed; `ulimit -v` may be "
           "too low)";
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

/// Most host threads one parallel_apply uses (the caller included).
int max_threads() {
  static const int n = std::max(16, static_cast<int>(std::thread::hardware_concurrency()));
  return n;
}

/// Workers that each run one job at a time. run(n, fn) runs fn(0..n-1) on the caller (thread 0)
/// and T - 1 = min(n, max_threads()) - 1 workers, thread k running indices k, k + T, ..., and
/// returns when all have finished. One run at a time (callers are serialised).
class Pool {
 public:
  static Pool& instance() {
    static Pool* p = new Pool();  // never destroyed: workers may outlive static destructors
    return *p;
  }

  void run(int n, const std::function<void(int)>& fn) {
    std::lock_guard run_lock(run_mu_);
    int helpers = std::min(n, max_threads()) - 1;
    {
      std::lock_guard lk(mu_);
      while (static_cast<int>(workers_.size()) < helpers) {
        const int id = static_cast<int>(workers_.size()) + 1;
        try {
          workers_.emplace_back([this, id] { loop(id); });
        } catch (const std::system_error&) {
          // No room for another thread (`ulimit -v`, `ulimit -u`): the workers there are take
          // more indices each (any stride >= 1 runs every index).
          helpers = static_cast<int>(workers_.size());
          break;
        }
        workers_.back().detach();
      }
      job_ = &fn;
      count_ = n;
      active_ = helpers + 1;
      pending_ = helpers;
      ++generation_;
    }
    cv_work_.notify_all();
    take(fn, 0, n, helpers + 1);
    std::unique_lock lk(mu_);
    cv_done_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void loop(int id) {
    std::uint64_t seen = 0;
    std::unique_lock lk(mu_);
    for (;;) {
      cv_work_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (id >= active_) continue;  // this run needs fewer workers
      const std::function<void(int)>* job = job_;
      const int n = count_, stride = active_;
      lk.unlock();
      take(*job, id, n, stride);
      lk.lock();
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }

  // Thread `first` of `stride`: fn catches everything (see parallel_apply).
  static void take(const std::function<void(int)>& fn, int first, int n, int stride) {
    for (int i = first; i < n; i += stride) fn(i);
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::vector<std::thread> workers_;
  const std::function<void(int)>* job_ = nullptr;
  int count_ = 0;  // indices of the current run
  int active_ = 0;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace

void parallel_apply(const std::vector<Device>& devices, const char* what,
                    const std::function<void(int)>& fn) {
  const int n = static_cast<int>(devices.size());
  if (n == 0) return;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::function<void(int)> run = [&](int i) {
    try {
      fn(i);
    } catch (...) {
      errors[static_cast<std::size_t>(i)] = std::current_exception();
    }
  };
  // A replica that itself calls parallel_apply (nested data parallelism) must not wait for the pool
  // it is running on: nested calls get threads of their own.
  thread_local bool t_in_pool = false;
  std::function<void(int)> marked = [&](int i) {
    const bool saved = t_in_pool;
    t_in_pool = true;
    run(i);
    t_in_pool = saved;
  };
  if (n == 1) {
    run(0);
  } else if (t_in_pool) {
    const int stride = std::min(n, max_threads());
    auto take = [&](int first) {
      for (int i = first; i < n; i += stride) marked(i);
    };
    std::vector<std::thread> threads;
    std::vector<int> here{0};  // the strides this thread takes: 0, and those no thread could take
    for (int k = 1; k < stride; ++k) {
      try {
        threads.emplace_back(take, k);
      } catch (const std::system_error&) {  // no room for another thread: run its part here
        here.push_back(k);
      }
    }
    for (int k : here) take(k);
    for (auto& t : threads) t.join();
  } else {
    Pool::instance().run(n, marked);
  }
  for (int i = 0; i < n; ++i) {
    if (!errors[static_cast<std::size_t>(i)]) continue;
    std::string msg =
        detail::cat("DataParallel: replica ", i, " on ", devices[static_cast<std::size_t>(i)].str(),
                    " failed in ", what, ": ", message_of(errors[static_cast<std::size_t>(i)]));
    try {
      std::rethrow_exception(errors[static_cast<std::size_t>(i)]);
    } catch (const OutOfMemory& e) {
      throw OutOfMemory(msg, e.kind());
    } catch (const std::bad_alloc&) {
      throw OutOfMemory(msg, OutOfMemory::Kind::host);
    } catch (const Timeout&) {
      throw Timeout(msg);
    } catch (const BackendError&) {
      throw BackendError(msg);
    } catch (const InvalidArgument&) {
      throw InvalidArgument(msg);
    } catch (...) {
      throw Error(msg);
    }
  }
}

}  // namespace ditto::parallel
