// ditto's conversions (Tensor::to(dtype) on the simulator and on the host) against PyTorch's, bit
// for bit: tests/data/dtype_ref.safetensors, written by tools/dtype_reference.py with torch 1.13
// (f32 -> f16 / bf16 over ties, subnormals, overflow, +-0, inf, NaN; f64 -> f16 / bf16 / f32;
// f32 -> i32 / i8 / u8 in range; i64 / i32 / i8 / u8 -> f32 / f16 / bf16). NaN compares as NaN:
// torch canonicalises NaN payloads (f16 0x7E00, bf16 0x7FC0), ditto keeps them (Note [Small
// float conversions]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "core/io/safetensors.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using DtypeReference = test::SimSuite<2>;

bool is_nan(DType t, const std::uint8_t* p) {
  return visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      return false;
    } else {
      T x;
      std::memcpy(&x, p, sizeof(T));
      return std::isnan(convert<double>(x));
    }
  });
}

// Bits of `got` equal `want` element by element (NaN: both NaN); reports the first few.
void expect_same(const std::string& what, const Tensor& in, const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const Tensor g = got.to(Device::cpu());
  const std::size_t es = dtype_size(want.dtype());
  const auto* gp = static_cast<const std::uint8_t*>(g.data_ptr());
  const auto* wp = static_cast<const std::uint8_t*>(want.data_ptr());
  const Tensor in_f64 = in.to(DType::f64);
  int bad = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const std::uint8_t* a = gp + i * es;
    const std::uint8_t* b = wp + i * es;
    const bool same = std::memcmp(a, b, es) == 0 || (is_nan(want.dtype(), a) && is_nan(want.dtype(), b));
    if (!same && ++bad <= 5) {
      std::uint64_t ga = 0, wa = 0;
      std::memcpy(&ga, a, es);
      std::memcpy(&wa, b, es);
      ADD_FAILURE() << what << "[" << i << "] of " << in_f64.data<double>()[i] << ": ditto 0x"
                    << std::hex << ga << ", torch 0x" << wa << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.numel() << " elements differ";
}

TEST_F(DtypeReference, ToDtypeMatchesTorchBitForBit) {
  const io::SafetensorsData d =
      io::load_safetensors(std::string(DITTO_TEST_DATA_DIR) + "/dtype_ref.safetensors");
  int pairs = 0;
  std::int64_t elements = 0;
  for (const auto& [name, want] : d.tensors) {
    const auto at = name.find("_to_");
    if (at == std::string::npos) continue;
    // "f32_to_f16" reads f32_in; "f32_to_i8" reads f32_i8_in (the in-range values).
    const std::string from = name.substr(0, at), to = name.substr(at + 4);
    const Tensor* in = d.find(from + "_" + to + "_in");
    if (in == nullptr) in = d.find(from + "_in");
    ASSERT_NE(in, nullptr) << "no input for " << name;
    expect_same(name + " (host)", *in, in->to(want.dtype()), want);
    expect_same(name + " (sim)", *in, in->to(Device("sim", 1)).to(want.dtype()), want);
    ++pairs;
    elements += want.numel();
  }
  EXPECT_EQ(pairs, 20);  // every conversion the script writes
  EXPECT_GT(elements, 20000);
}

}  // namespace
}  // namespace ditto
