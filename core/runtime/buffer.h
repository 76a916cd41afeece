// Buffer: RAII, move-only ownership of device memory. A buffer knows its device and keeps its
// backend instance alive; destruction frees stream-ordered (after pending work on the device's
// default stream).
#pragma once

#include <cstddef>
#include <memory>

#include "core/runtime/device.h"

namespace ditto {

class Backend;

class Buffer {
 public:
  /// Allocate `bytes` on `device`. Throws OutOfMemory / InvalidArgument.
  Buffer(const Device& device, std::size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  const Device& device() const { return device_; }
  Backend& backend() const { return *backend_; }

 private:
  Device device_;
  std::shared_ptr<Backend> backend_;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ditto
