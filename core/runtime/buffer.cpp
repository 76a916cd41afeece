#include "core/runtime/buffer.h"

#include "core/base/error.h"
#include "core/runtime/backend.h"

namespace ditto {

Buffer::Buffer(const Device& device, std::size_t bytes)
    : device_(device), backend_(get_backend_ptr(device.type)), bytes_(bytes) {
  DITTO_CHECK(device.index >= 0 && device.index < backend_->device_count(), "allocate: device ",
              device.str(), " out of range (", device.type, " has ", backend_->device_count(),
              " devices)");
  ptr_ = backend_->allocate(device.index, bytes);
}

Buffer::~Buffer() {
  if (ptr_) backend_->deallocate(device_.index, ptr_, bytes_);
}

}  // namespace ditto
