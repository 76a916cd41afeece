#include "backend_sim/trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "core/base/error.h"
#include "core/io/file.h"

namespace ditto::sim {

void TraceRecorder::add(const TraceEvent& e) {
  std::lock_guard lk(mu_);
  if (events_.size() >= max_events_) {
    // Streams record concurrently: the earliest start and latest end over the dropped events.
    first_dropped_ps_ = dropped_ == 0 ? e.start : std::min(first_dropped_ps_, e.start);
    last_dropped_end_ps_ =
        dropped_ == 0 ? e.start + e.dur : std::max(last_dropped_end_ps_, e.start + e.dur);
    ++dropped_;
    return;
  }
  events_.push_back(e);
}

void TraceRecorder::set_max_events(std::size_t max_events) {
  std::lock_guard lk(mu_);
  max_events_ = max_events;
}

TraceStats TraceRecorder::stats() const {
  std::lock_guard lk(mu_);
  return {events_.size(), dropped_, max_events_, first_dropped_ps_, last_dropped_end_ps_};
}

void TraceRecorder::write_chrome_json(const std::string& path, const std::string& device_label,
                                      int device_count) const {
  std::vector<TraceEvent> events;
  std::size_t dropped = 0;
  {
    std::lock_guard lk(mu_);
    events = events_;
    dropped = dropped_;
  }
  // Events of one stream were appended in stream order (deterministic); streams interleave by
  // thread scheduling, so order by (device, track, counter) and keep each stream's own order.
  std::stable_sort(events.begin(), events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return std::make_tuple(a.device, a.counter, a.track) <
           std::make_tuple(b.device, b.counter, b.track);
  });
  auto us = [](std::int64_t ps) { return static_cast<double>(ps) / 1e6; };

  nlohmann::json out = nlohmann::json::object();
  nlohmann::json& ev = out["traceEvents"] = nlohmann::json::array();
  std::set<std::pair<int, int>> tracks;
  std::set<int> with_memory;
  for (const auto& e : events) {
    if (e.counter)
      with_memory.insert(e.device);
    else
      tracks.insert({e.device, e.track});
  }
  for (int d = 0; d < device_count; ++d) {
    ev.push_back({{"name", "process_name"},
                  {"ph", "M"},
                  {"pid", d},
                  {"args", {{"name", "sim:" + std::to_string(d) + " (" + device_label + ")"}}}});
    ev.push_back(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", d}, {"args", {{"sort_index", d}}}});
  }
  for (const auto& [d, t] : tracks)
    ev.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", d},
         {"tid", t},
         {"args",
          {{"name", t == 0 ? std::string("stream 0 (default)") : "stream " + std::to_string(t)}}}});
  for (const auto& e : events) {
    if (e.counter) {
      ev.push_back({{"name", "memory"},
                    {"ph", "C"},
                    {"pid", e.device},
                    {"ts", us(e.start)},
                    {"args", {{"in_use_MiB", static_cast<double>(e.value) / 1048576.0}}}});
    } else {
      ev.push_back({{"name", e.name},
                    {"cat", e.cat},
                    {"ph", "X"},
                    {"pid", e.device},
                    {"tid", e.track},
                    {"ts", us(e.start)},
                    {"dur", us(e.dur)}});
    }
  }
  out["displayTimeUnit"] = "ns";
  out["otherData"] = {{"clock", "virtual time of the ditto simulator's cost model"},
                      {"device", device_label},
                      {"dropped_events", dropped}};

  // Through io::write_file_atomic (Note [Atomic write]): a symbolic link is written through,
  // /dev/null or a FIFO straight to it, a directory or block device refused.
  try {
    io::write_file_atomic(path, out.dump() + "\n");  // a line: text after it starts its own
  } catch (const Error& e) {
    throw BackendError(detail::cat("write_trace: ", e.what()));
  }
}

}  // namespace ditto::sim
