// Pieces ditto-bench's benchmarks share (ditto_bench.cpp's trainer, bench_gpt.cpp's GPT): the
// CSV writer and the two timing loops, one for a model stepped by one host thread (DataParallel
// drives its devices itself) and one for a thread per rank (DistributedDataParallel, as
// `ditto-train --trainer ddp` runs).
#pragma once

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/comm/communicator.h"

namespace ditto::bench {

using Clock = std::chrono::steady_clock;

/// Seconds from t0 to now.
double seconds_since(Clock::time_point t0);

/// Appends rows to `path` (header written when the file is new or empty); no file when empty.
/// Throws Error when the file cannot be opened.
class Csv {
 public:
  Csv(const std::string& path, const std::string& header);
  template <typename... A>
  void row(const A&... a) {
    if (!out_.is_open()) return;
    std::ostringstream s;
    bool first = true;
    ((s << (first ? "" : ",") << a, first = false), ...);
    out_ << s.str() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

/// Steps per second of `step` on this thread: one warm-up call (allocations, replicas, worker
/// threads), one timed call that sets the step count (at least 2, about `seconds` per run), then
/// the median of `reps` timed runs.
double steps_per_s(const std::function<void()>& step, double seconds, int reps);

/// What a rank's thread runs: it builds its model, optimizer and step on its own thread, then
/// calls timed(step) once; steps_per_s_ranks times that step as steps_per_s does.
using RankBody = std::function<void(Communicator& comm,
                                    const std::function<void(const std::function<void()>&)>& timed)>;

/// Steps per second of a thread per rank, one per communicator of `comms`, each running `body`.
/// The ranks agree on the step count and the clock through a barrier. A rank that throws aborts
/// the communicators (the others' collectives fail instead of hanging) and its error is rethrown
/// here after every thread has joined.
double steps_per_s_ranks(std::vector<Communicator>& comms, const RankBody& body, double seconds,
                         int reps);

}  // namespace ditto::bench
