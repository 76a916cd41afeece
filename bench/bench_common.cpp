// ditto-bench's shared timing loops and CSV writer (bench_common.h).
#include "bench/bench_common.h"

#include <algorithm>
#include <barrier>
#include <exception>
#include <thread>

#include "core/base/error.h"

namespace ditto::bench {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Csv::Csv(const std::string& path, const std::string& header) {
  if (path.empty()) return;
  std::ifstream probe(path);
  const bool fresh = !probe.good() || probe.peek() == std::ifstream::traits_type::eof();
  out_.open(path, std::ios::app);
  if (!out_) throw Error("ditto-bench: cannot open " + path + " for writing");
  if (fresh) out_ << header << '\n';
}

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

double steps_per_s(const std::function<void()>& step, double seconds, int reps) {
  step();  // warm-up
  auto t0 = Clock::now();
  step();  // timed: sets the step count
  const int steps = std::max(2, static_cast<int>(seconds / std::max(1e-6, seconds_since(t0))));
  std::vector<double> rates;
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < steps; ++i) step();
    rates.push_back(steps / seconds_since(t0));
  }
  return median(rates);
}

double steps_per_s_ranks(std::vector<Communicator>& comms, const RankBody& body, double seconds,
                         int reps) {
  const int n = static_cast<int>(comms.size());
  // Barrier phases: 0 after the warm-up step, 1 after one timed step (sets the step count), then
  // the start (even) and end (odd) of each timed run.
  int phase = 0, steps = 2;
  Clock::time_point t0, t_run;
  std::vector<double> rates;
  rates.reserve(static_cast<std::size_t>(reps));
  auto on_phase = [&]() noexcept {
    if (phase == 0) {
      t0 = Clock::now();
    } else if (phase == 1) {
      steps = std::max(2, static_cast<int>(seconds / std::max(1e-6, seconds_since(t0))));
    } else if (phase % 2 == 0) {
      t_run = Clock::now();
    } else {
      rates.push_back(steps / seconds_since(t_run));
    }
    ++phase;
  };
  std::barrier sync_point(n, on_phase);
  auto timed = [&](const std::function<void()>& step) {
    step();  // warm-up (allocations, worker threads)
    sync_point.arrive_and_wait();
    step();  // timed: sets the step count
    sync_point.arrive_and_wait();
    for (int rep = 0; rep < reps; ++rep) {
      sync_point.arrive_and_wait();
      for (int i = 0; i < steps; ++i) step();
      sync_point.arrive_and_wait();
    }
  };
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Communicator& comm = comms[static_cast<std::size_t>(r)];
      try {
        body(comm, timed);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        comm.abort("ditto-bench: rank " + std::to_string(r) + " failed");
        sync_point.arrive_and_drop();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return median(rates);
}

}  // namespace ditto::bench
