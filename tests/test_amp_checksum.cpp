// params_checksum over each parameter's raw bytes in its dtype (issue 14's shared decision 5):
// an f32 model hashes the bytes of flat_parameters (every f32 checksum stays), a bf16 / f16 one
// its 2-byte elements; flat_parameters stays f32 (exact upcast).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/nn/sequential.h"
#include "core/train/trainer.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class AmpChecksum : public SimSuite<2> {};

std::uint64_t fnv(const unsigned char* b, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return h;
}

TEST_F(AmpChecksum, F32HashesTheBytesOfFlatParameters) {
  auto m = nn::mlp({6, 5, 3}, Device("sim", 0), 7);
  const std::vector<float> flat = train::flat_parameters(*m);
  const auto* b = reinterpret_cast<const unsigned char*>(flat.data());
  EXPECT_EQ(train::params_checksum(*m), fnv(b, flat.size() * sizeof(float)));
}

TEST_F(AmpChecksum, Bf16AndF16HashTheirOwnTwoBytesAndFlatParametersUpcasts) {
  for (DType dt : {DType::bf16, DType::f16}) {
    auto m = nn::mlp({6, 5, 3}, Device("sim", 0), 7);
    std::vector<float> f32 = train::flat_parameters(*m);
    for (nn::Parameter* p : m->parameters()) p->data = p->data.to(dt);
    std::uint64_t h = 1469598103934665603ull;
    std::vector<float> rounded;
    for (nn::Parameter* p : m->parameters()) {
      Tensor host = p->data.to(Device::cpu());
      ASSERT_EQ(host.nbytes(), static_cast<std::size_t>(host.numel()) * 2);
      h = fnv(static_cast<const unsigned char*>(host.data_ptr()), host.nbytes(), h);
      std::vector<float> v = host.to(DType::f32).to_vector<float>();
      rounded.insert(rounded.end(), v.begin(), v.end());
    }
    EXPECT_EQ(train::params_checksum(*m), h) << dtype_name(dt);
    EXPECT_EQ(train::flat_parameters(*m), rounded) << dtype_name(dt);
    EXPECT_NE(rounded, f32);  // the rounding is visible: these are not the f32 values
  }
}

}  // namespace
}  // namespace ditto
