// TraceRecorder: the simulator's timeline in Chrome trace JSON (the Trace Event Format that
// Perfetto and chrome://tracing open): one process per virtual device, one thread (track) per
// stream, complete events ("ph": "X") with virtual-time timestamps in microseconds, and a memory
// counter track ("ph": "C") per device. Fed by the cost model (backend_sim/cost_model.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/runtime/extensions.h"

namespace ditto::sim {

struct TraceEvent {
  int device = 0;
  int track = 0;           ///< stream index on its device (0: default stream)
  const char* name = "";   ///< a string literal (kernel, copy or collective name)
  const char* cat = "";    ///< "kernel", "copy", "comm"
  std::int64_t start = 0;  ///< picoseconds
  std::int64_t dur = 0;    ///< picoseconds; counters: 0
  bool counter = false;    ///< memory counter sample: `value` bytes in use
  std::int64_t value = 0;
};

class TraceRecorder {
 public:
  /// The default cap: 4,000,000 events (hundreds of MB of JSON).
  static constexpr std::size_t kDefaultMaxEvents = 4000000;
  /// Keeps at most `max_events`; later events are counted as dropped (the file says how many in
  /// otherData.dropped_events, stats() to the caller, which must say so: SimRun's report).
  explicit TraceRecorder(std::size_t max_events = kDefaultMaxEvents) : max_events_(max_events) {}

  void add(const TraceEvent& e);
  /// The cap from now on (events already kept stay).
  void set_max_events(std::size_t max_events);
  /// The events kept, dropped, the cap and the virtual times of the dropped ones.
  TraceStats stats() const;

  /// Writes the trace to `path` by io::write_file_atomic (Note [Atomic write] in core/io/file.h:
  /// a temporary file and a rename, so a reader never sees a half-written file; a symbolic link
  /// written through, /dev/null or a FIFO written straight into). `device_label` names the device
  /// model in each process name. Throws BackendError naming the path and the OS reason when it
  /// cannot be written, or what it is when it is a directory, block device or socket.
  void write_chrome_json(const std::string& path, const std::string& device_label,
                         int device_count) const;

 private:
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  std::size_t max_events_;
  std::size_t dropped_ = 0;
  std::int64_t first_dropped_ps_ = 0, last_dropped_end_ps_ = 0;  // valid when dropped_ > 0
};

}  // namespace ditto::sim
