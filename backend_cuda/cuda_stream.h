// CudaStream / CudaEvent: ditto's Stream and Event over cudaStream_t / cudaEvent_t. A logical
// device (cuda:i) runs on physical GPU physical_device(); several logical devices may share one GPU
// (oversubscription), each with its own streams.
#pragma once

#include <cuda_runtime.h>

#include "core/stream.h"

namespace ditto::cuda {

/// Sets the current CUDA device for the scope, restoring the previous one (c10::cuda::CUDAGuard).
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical_device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaStream final : public Stream {
 public:
  /// Creates a non-blocking stream on `physical_device` for logical `device`.
  CudaStream(Device device, int physical_device);
  ~CudaStream() override;

  Device device() const override { return device_; }
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
  explicit CudaEvent(int physical_device);
  ~CudaEvent() override;
  void synchronize() override;
  bool query() override;

  cudaEvent_t get() const { return event_; }
  /// False until the first record (waiting on an unrecorded event is a no-op, as in CUDA).
  bool recorded() const { return recorded_; }
  void mark_recorded() { recorded_ = true; }

 private:
  int physical_;
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

/// The CudaStream behind `s`; throws InvalidArgument naming `call` for another backend's stream.
CudaStream& as_cuda(Stream& s, const char* call);

}  // namespace ditto::cuda
