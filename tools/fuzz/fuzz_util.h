// Helpers shared by the libFuzzer targets of tools/fuzz/ (README.md there).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ditto_fuzz {

// A scratch directory of this process (in /dev/shm when it exists: a file per input is cheap
// there), removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const char* base = fs::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string d = std::string(base) + "/ditto-fuzz-" + std::to_string(::getpid());
    fs::create_directories(d);
    static std::string to_remove = d;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(to_remove, ec);
    });
    return d;
  }();
  return dir;
}

// Write `bytes` to `path` (plain stdio, so that the parser under test is the only ditto code run).
inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::abort();
  if (std::fclose(f) != 0) std::abort();
}

// `data` cut at each occurrence of `sep` (the parts of a multi-file input).
inline std::vector<std::string_view> split(std::string_view data, std::string_view sep) {
  std::vector<std::string_view> parts;
  for (;;) {
    const std::size_t p = data.find(sep);
    if (p == std::string_view::npos) {
      parts.push_back(data);
      return parts;
    }
    parts.push_back(data.substr(0, p));
    data.remove_prefix(p + sep.size());
  }
}

}  // namespace ditto_fuzz
