// Device: a backend name and an index ("sim:3", "cuda:0", "cpu"), a small validated value type
// (mirrors c10::Device). "cpu" is the host: tensors there are plain host memory.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace ditto {

class Backend;

struct Device {
  std::string type = "cpu";  ///< backend name: "cpu", "sim", "cuda"
  int index = 0;             ///< device ordinal within the backend (0 for "cpu")

  Device() = default;
  Device(std::string t, int i) : type(std::move(t)), index(i) {}

  /// The host device.
  static Device cpu() { return Device("cpu", 0); }

  /// Parse "sim:3", "cuda:0", "cpu" (index defaults to 0). Throws InvalidArgument on bad text.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == "cpu"; }

  /// "sim:3"; the host prints as "cpu".
  std::string str() const;

  /// The live backend instance that owns this device. Throws InvalidArgument when the backend is
  /// unknown or the index is out of range.
  Backend& backend() const;

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
  friend bool operator<(const Device& a, const Device& b) {
    return a.type != b.type ? a.type < b.type : a.index < b.index;
  }
  friend std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
};

}  // namespace ditto

template <>
struct std::hash<ditto::Device> {
  size_t operator()(const ditto::Device& d) const noexcept {
    return std::hash<std::string>()(d.type) * 31u + static_cast<size_t>(d.index);
  }
};
