// safetensors-info: print what a safetensors file holds (checked as ditto reads it): each tensor's
// name, dtype, shape and values (the first few), and the metadata. For example on a checkpoint:
//
//   build/bin/safetensors-info ckpt/step-00000046/model.safetensors
//   build/bin/safetensors-info --all file.safetensors     # every value
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/io/safetensors.h"

int main(int argc, char** argv) {
  bool all = argc == 3 && std::strcmp(argv[1], "--all") == 0;
  if (argc != 2 && !all) {
    std::fprintf(stderr, "usage: safetensors-info [--all] FILE.safetensors\n");
    return 2;
  }
  try {
    ditto::io::SafetensorsData d = ditto::io::load_safetensors(argv[argc - 1]);
    for (const auto& [k, v] : d.metadata) std::printf("metadata %s=%s\n", k.c_str(), v.c_str());
    for (const auto& [name, t] : d.tensors) {
      std::printf("tensor %s %s %s:", name.c_str(), ditto::io::safetensors_dtype(t.dtype()),
                  ditto::shape_str(t.shape()).c_str());
      const std::int64_t n = all ? t.numel() : std::min<std::int64_t>(t.numel(), 6);
      for (std::int64_t i = 0; i < n; ++i) {
        if (t.dtype() == ditto::DType::f32) std::printf(" %.9g", double(t.data<float>()[i]));
        else std::printf(" %" PRId64, t.data<std::int64_t>()[i]);
      }
      std::printf("%s\n", n < t.numel() ? " ..." : "");
    }
    return 0;
  } catch (const ditto::Error& e) {
    std::fprintf(stderr, "safetensors-info: error: %s\n", e.what());
    return 1;
  }
}
