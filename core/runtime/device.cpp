// Device parsing and printing.
#include "core/runtime/device.h"

#include <charconv>

#include "core/base/error.h"
#include "core/runtime/backend.h"

namespace ditto {

Device Device::parse(std::string_view text) {
  auto colon = text.find(':');
  std::string type(text.substr(0, colon));
  DITTO_CHECK(!type.empty(), "Device::parse: expected 'type[:index]' such as 'sim:3', got '", text,
              "'");
  int index = 0;
  if (colon != std::string_view::npos) {
    std::string_view idx = text.substr(colon + 1);
    auto [p, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
    DITTO_CHECK(!idx.empty() && ec == std::errc() && p == idx.data() + idx.size() && index >= 0,
                "Device::parse: expected a non-negative index after ':' in '", text, "'");
  }
  return Device(type, index);
}

std::string Device::str() const { return is_cpu() ? "cpu" : type + ":" + std::to_string(index); }

Backend& Device::backend() const {
  Backend& b = get_backend(type);
  DITTO_CHECK(index >= 0 && index < b.device_count(), "device ", str(), ": index out of range (",
              type, " has ", b.device_count(), " devices)");
  return b;
}

}  // namespace ditto
