// Stream and Event: ordered queues of work on one device (mirror cudaStream_t / cudaEvent_t).
//
// Work enqueued on a stream runs in order; work on different streams (and different devices) may
// overlap. An error raised by work on a stream is kept and rethrown by the next synchronize() of
// that stream, and by every other synchronize() of it waiting at that moment (like CUDA's sticky
// errors, but cleared once reported).
#pragma once

#include <memory>

#include "core/base/non_copyable.h"
#include "core/runtime/device.h"

namespace ditto {

class Event;

class Stream : public NonCopyable {
 public:
  /// The device this stream runs on.
  virtual Device device() const = 0;

  /// Block the calling thread until all work enqueued so far has finished. Rethrows the first
  /// ditto::Error raised by that work (then the stream is usable again); threads waiting in
  /// synchronize() on the same stream at once all rethrow it (cudaStreamSynchronize).
  virtual void synchronize() = 0;

  /// Mark the current end of this stream in `event` (cudaEventRecord).
  virtual void record(Event& event) = 0;

  /// Make later work on this stream wait until `event` has completed (cudaStreamWaitEvent).
  /// An event never recorded counts as completed.
  virtual void wait(const Event& event) = 0;
};

class Event : public NonCopyable {
 public:
  /// Block until the work recorded before this event has finished.
  virtual void synchronize() = 0;

  /// True when that work has finished (or the event was never recorded).
  virtual bool query() = 0;
};

}  // namespace ditto

namespace ditto {

/// The stream that ops on `device` enqueue to from this thread: the device's default stream
/// unless a StreamGuard on this thread selected another (torch.cuda.current_stream).
Stream& current_stream(const Device& device);

/// Makes `stream` the current stream of its device for this thread until destroyed
/// (c10::cuda::CUDAStreamGuard).
class StreamGuard {
 public:
  explicit StreamGuard(Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Device device_;
  Stream* previous_;
};

}  // namespace ditto
