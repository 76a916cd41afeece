// CudaStream / CudaEvent: ditto's Stream and Event over cudaStream_t / cudaEvent_t. A logical
// device (cuda:i) runs on physical GPU physical_device(); several logical devices may share one GPU
// (oversubscription), each with its own streams.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "core/runtime/stream.h"

namespace ditto::cuda {

/// Sets the current CUDA device for the scope, restoring the previous one (c10::cuda::CUDAGuard).
/// Throws BackendError when the device cannot be made current; the destructor never throws.
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical_device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  ///< device to restore; -1 when the guard did not switch
};

/// How errors name a logical device: "cuda:3 (GPU 0)".
std::string where(const Device& device, int physical_device);

class CudaStream final : public Stream {
 public:
  /// Creates a non-blocking stream on `physical_device` for logical `device`.
  CudaStream(Device device, int physical_device);
  ~CudaStream() override;

  Device device() const override { return device_; }
  /// cudaStreamSynchronize; a failure (e.g. a faulting kernel) throws BackendError naming the
  /// device and the CUDA error.
  void synchronize() override;
  void record(Event& event) override;
  void wait(const Event& event) override;

  cudaStream_t get() const { return stream_; }
  int physical_device() const { return physical_; }

 private:
  Device device_;
  int physical_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent final : public Event {
 public:
  /// An event on `physical_device` (cudaEventDisableTiming: events only order work here).
  explicit CudaEvent(int physical_device);
  ~CudaEvent() override;
  void synchronize() override;
  bool query() override;

  cudaEvent_t get() const { return event_; }
  int physical_device() const { return physical_; }
  /// False until the first record (waiting on an unrecorded event is a no-op, as in CUDA).
  bool recorded() const { return recorded_.load(std::memory_order_acquire); }
  void mark_recorded() { recorded_.store(true, std::memory_order_release); }

 private:
  int physical_;
  cudaEvent_t event_ = nullptr;
  std::atomic<bool> recorded_{false};
};

/// The CudaStream behind `s`; throws InvalidArgument naming `call` for another backend's stream.
CudaStream& as_cuda(Stream& s, const char* call);

}  // namespace ditto::cuda
