// safetensors-info: print what a safetensors file holds (checked as ditto reads it): each tensor's
// name, dtype, shape and values (the first few), and the metadata. For example on a checkpoint:
//
//   build/bin/safetensors-info ckpt/step-00000046/model.safetensors
//   build/bin/safetensors-info --all file.safetensors     # every value
//
// On a file of a ditto checkpoint (its metadata records "ditto.crc32"), the tensor bytes are
// checked against that CRC-32 as read_checkpoint does: a mismatch prints a warning on stderr and
// the exit status is 1.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/safetensors.h"
#include "examples/cli_common.h"

namespace {
constexpr const char* kUsage =
    "usage: safetensors-info [--all] FILE.safetensors\n"
    "  print each tensor's name, dtype, shape and first values (--all: every value) and the\n"
    "  metadata; on a ditto checkpoint's file, also check the CRC-32 it records\n";
}  // namespace

namespace {
// Element i of a host tensor: floats as %.9g (their exact f32/f64 value), integers as integers.
void print_value(const ditto::Tensor& t, std::int64_t i) {
  ditto::visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<const T*>(t.data_ptr())[i];
    if constexpr (std::is_same_v<T, double>)
      std::printf(" %.17g", v);
    else if constexpr (std::is_same_v<T, float> || ditto::is_small_float_v<T>)
      std::printf(" %.9g", double(ditto::convert<float>(v)));
    else if constexpr (std::is_signed_v<T>)
      std::printf(" %" PRId64, static_cast<std::int64_t>(v));
    else
      std::printf(" %" PRIu64, static_cast<std::uint64_t>(v));
  });
}
}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s\n", ditto_cli::version_line("safetensors-info").c_str());
      return 0;
    }
  }
  // Usage errors as the other programs' (examples/cli_common.h): the prefix, exit status 2.
  bool all = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--all") {
      all = true;
    } else if (arg.size() > 1 && arg[0] == '-') {  // a file named so: ./-x
      std::fputs(ditto_cli::usage_error("safetensors-info", "unknown option '" + arg + "'", {arg},
                                        {"--all", "--help", "--version"})
                     .c_str(),
                 stderr);
      return ditto_cli::kUsageError;
    } else {
      files.push_back(arg);
    }
  }
  if (files.size() != 1) {
    std::fprintf(stderr, "safetensors-info: error: expected one FILE.safetensors, got %zu\n%s",
                 files.size(), kUsage);
    return ditto_cli::kUsageError;
  }
  const std::string path = files[0];
  try {
    ditto::io::SafetensorsData d = ditto::io::load_safetensors(path);
    for (const auto& [k, v] : d.metadata) std::printf("metadata %s=%s\n", k.c_str(), v.c_str());
    for (const auto& [name, t] : d.tensors) {
      std::printf("tensor %s %s %s:", name.c_str(), ditto::io::safetensors_dtype(t.dtype()),
                  ditto::shape_str(t.shape()).c_str());
      const std::int64_t n = all ? t.numel() : std::min<std::int64_t>(t.numel(), 6);
      for (std::int64_t i = 0; i < n; ++i) {
        print_value(t, i);
      }
      std::printf("%s\n", n < t.numel() ? " ..." : "");
    }
    try {
      ditto::verify_checkpoint_crc(path, d);
    } catch (const ditto::ParseError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "safetensors-info: warning: %s\n", e.what());
      return 1;
    }
    return 0;
  } catch (const ditto::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "safetensors-info: error: %s\n", e.what());
    return 1;
  }
}
