// libFuzzer target: io::safetensors_parse (core/io/safetensors.h) on the input's bytes, then
// what a reader does with an accepted file: the checkpoint CRC check, find, and a round trip
// through safetensors_serialize that must parse to the same tensors. Seeds: corpus/safetensors/.
// A ditto::Error is the expected refusal; any other exception or a crash is a finding.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/base/error.h"
#include "core/checkpoint/checkpoint.h"
#include "core/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ditto::io::SafetensorsData d;
  try {
    d = ditto::io::safetensors_parse(bytes, "fuzz.safetensors");
  } catch (const ditto::Error&) {
    return 0;
  }
  try {
    ditto::verify_checkpoint_crc("fuzz.safetensors", d);
  } catch (const ditto::Error&) {
  }
  for (const auto& [name, t] : d.tensors)
    if (d.find(name) == nullptr) std::abort();
  // An accepted file round-trips: same names, shapes, dtypes and bytes.
  std::string again;
  try {
    again = ditto::io::safetensors_serialize(d.tensors, d.metadata);
  } catch (const ditto::Error&) {
    return 0;  // e.g. a tensor named "" (the format allows it, ditto's writer does not)
  }
  ditto::io::SafetensorsData e = ditto::io::safetensors_parse(again, "again.safetensors");
  if (e.tensors.size() != d.tensors.size() || e.metadata != d.metadata) std::abort();
  for (std::size_t i = 0; i < d.tensors.size(); ++i) {
    const ditto::Tensor& a = d.tensors[i].second;
    const ditto::Tensor* b = e.find(d.tensors[i].first);
    if (!b || a.shape() != b->shape() || a.dtype() != b->dtype() || a.nbytes() != b->nbytes() ||
        (a.nbytes() && std::memcmp(a.data_ptr(), b->data_ptr(), a.nbytes()) != 0))
      std::abort();
  }
  return 0;
}
