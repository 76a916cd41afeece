// Note [NaN bits] (core/runtime/nan_bits.h): all NaNs of one dtype are one value for the bitwise
// contract. canonicalize_nans finds every NaN of the six float dtypes (and nothing else: inf, the
// largest finite values, integers), params_checksum hashes a model holding NaNs of both signs and
// with payloads as the same model with canonical NaNs (and a model without NaNs as its raw
// bytes: test_amp_checksum.cpp), and the test helper bits_equal counts any NaN equal to any NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/nn/sequential.h"
#include "core/runtime/nan_bits.h"
#include "core/train/replica.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class NanBits : public SimSuite<2> {};

TEST_F(NanBits, CanonicalNanIsEveryBitButTheSign) {
  EXPECT_EQ(canonical_nan_bits(DType::f32), 0x7fffffffull);
  EXPECT_EQ(canonical_nan_bits(DType::f64), 0x7fffffffffffffffull);
  EXPECT_EQ(canonical_nan_bits(DType::f16), 0x7fffull);
  EXPECT_EQ(canonical_nan_bits(DType::bf16), 0x7fffull);
  EXPECT_EQ(canonical_nan_bits(DType::f8_e4m3), 0x7full);
  EXPECT_EQ(canonical_nan_bits(DType::f8_e5m2), 0x7full);
  EXPECT_THROW_MSG(canonical_nan_bits(DType::i32), InvalidArgument,
                   "canonical_nan_bits: t: expected a floating-point dtype, got i32");
}

// Per dtype: patterns that are NaN (both signs, quiet and signalling, smallest and largest
// payload) and the neighbours that are not (inf, the largest finite value, zero, -0).
struct NanCase {
  DType t;
  std::vector<std::uint64_t> nan, not_nan;
};

std::vector<NanCase> nan_bits_cases() {
  return {
      {DType::f32,
       {0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fffffff, 0xffffffff, 0xffc00123},
       {0x7f800000, 0xff800000, 0x7f7fffff, 0xff7fffff, 0, 0x80000000, 0x3f800000}},
      {DType::f64,
       {0x7ff8000000000000, 0xfff8000000000000, 0x7ff0000000000001, 0xfff0123456789abc,
        0xffffffffffffffff},
       {0x7ff0000000000000, 0xfff0000000000000, 0x7fefffffffffffff, 0, 0x8000000000000000}},
      {DType::f16,
       {0x7e00, 0xfe00, 0x7c01, 0xfc01, 0x7fff, 0xffff},
       {0x7c00, 0xfc00, 0x7bff, 0xfbff, 0, 0x8000, 0x3c00}},
      {DType::bf16,
       {0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff, 0xffff},
       {0x7f80, 0xff80, 0x7f7f, 0xff7f, 0, 0x8000, 0x3f80}},
      {DType::f8_e4m3, {0x7f, 0xff}, {0x7e, 0xfe, 0x78, 0, 0x80, 0x38}},
      {DType::f8_e5m2, {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}, {0x7c, 0xfc, 0x7b, 0xfb, 0, 0x80}},
  };
}

TEST_F(NanBits, CanonicalizeRewritesEveryNanAndNothingElse) {
  for (const NanCase& c : nan_bits_cases()) {
    const std::size_t es = dtype_size(c.t);
    std::vector<std::uint64_t> all = c.nan;
    all.insert(all.end(), c.not_nan.begin(), c.not_nan.end());
    std::vector<std::uint8_t> buf(all.size() * es);
    for (std::size_t i = 0; i < all.size(); ++i) std::memcpy(&buf[i * es], &all[i], es);
    for (std::size_t i = 0; i < all.size(); ++i)
      EXPECT_EQ(is_nan_bits(c.t, &buf[i * es]), i < c.nan.size())
          << dtype_name(c.t) << " 0x" << std::hex << all[i];
    EXPECT_EQ(canonicalize_nans(c.t, buf.data(), static_cast<std::int64_t>(all.size())),
              static_cast<std::int64_t>(c.nan.size()))
        << dtype_name(c.t);
    for (std::size_t i = 0; i < all.size(); ++i) {
      std::uint64_t got = 0;
      std::memcpy(&got, &buf[i * es], es);
      EXPECT_EQ(got, i < c.nan.size() ? canonical_nan_bits(c.t) : all[i])
          << dtype_name(c.t) << " element " << i;
    }
  }
  // Integers have no NaN: all-ones bytes stay.
  std::vector<std::uint8_t> ints(16, 0xff);
  for (DType t : {DType::i8, DType::u8, DType::i32, DType::u32, DType::i64, DType::u64}) {
    EXPECT_FALSE(is_nan_bits(t, ints.data())) << dtype_name(t);
    EXPECT_EQ(canonicalize_nans(t, ints.data(), static_cast<std::int64_t>(16 / dtype_size(t))), 0);
  }
  EXPECT_EQ(ints, std::vector<std::uint8_t>(16, 0xff));
}

// The parameters of a small MLP in dtype dt with NaNs written into them as f32 bit patterns
// (converted to dt by ditto's conversion, which keeps sign and top payload bits).
std::unique_ptr<nn::Module> nan_bits_model(DType dt, const std::vector<std::uint32_t>& nans) {
  auto m = nn::mlp({6, 5, 3}, Device("sim", 0), 7);
  std::size_t k = 0;
  for (nn::Parameter* p : m->parameters()) {
    std::vector<float> v = p->data.to_vector<float>();
    for (std::size_t i = 0; i < v.size() && k < nans.size(); i += 3)
      v[i] = std::bit_cast<float>(nans[k++]);
    p->data = Tensor::from_vector(v, p->data.shape()).to(dt).to(Device("sim", 0));
  }
  return m;
}

TEST_F(NanBits, ParamsChecksumHashesEveryNanAsTheCanonicalOne) {
  // Both signs, quiet and signalling, x86's default NaN, payloads; against all canonical.
  const std::vector<std::uint32_t> mixed = {0xffc00000, 0x7fc00000, 0x7f800001, 0xff812345,
                                            0x7fffffff, 0xffffffff, 0xffc00123, 0x7fa00000};
  const std::vector<std::uint32_t> canonical(mixed.size(), 0x7fffffffu);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    auto a = nan_bits_model(dt, mixed), b = nan_bits_model(dt, canonical);
    // The raw bytes differ (the NaNs kept their bits through the conversion) ...
    std::vector<std::uint8_t> ra, rb;
    for (nn::Parameter* p : a->parameters()) {
      auto v = tensor_bytes(p->data);
      ra.insert(ra.end(), v.begin(), v.end());
    }
    for (nn::Parameter* p : b->parameters()) {
      auto v = tensor_bytes(p->data);
      rb.insert(rb.end(), v.begin(), v.end());
    }
    ASSERT_NE(ra, rb) << dtype_name(dt);
    // ... the checksums do not, and the model without NaNs hashes otherwise.
    EXPECT_EQ(train::params_checksum(*a), train::params_checksum(*b)) << dtype_name(dt);
    EXPECT_NE(train::params_checksum(*a), train::params_checksum(*nan_bits_model(dt, {})))
        << dtype_name(dt);
    // params_checksum leaves the parameters' own bytes as they were.
    std::vector<std::uint8_t> again;
    for (nn::Parameter* p : a->parameters()) {
      auto v = tensor_bytes(p->data);
      again.insert(again.end(), v.begin(), v.end());
    }
    EXPECT_EQ(again, ra) << dtype_name(dt);
  }
}

TEST_F(NanBits, BitsEqualCountsAnyNanEqualToAnyNanAndNothingElse) {
  const float qnan = std::bit_cast<float>(0x7fc00000u), neg = std::bit_cast<float>(0xffc00000u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(bits_equal({qnan, 1.0f}, {neg, 1.0f}));
  EXPECT_TRUE(bits_equal({std::bit_cast<float>(0x7f800001u)}, {std::bit_cast<float>(0xffffffffu)}));
  EXPECT_FALSE(bits_equal({qnan}, {inf}));
  EXPECT_FALSE(bits_equal({qnan}, {0.0f}));
  EXPECT_FALSE(bits_equal({0.0f}, {-0.0f}));
  EXPECT_FALSE(bits_equal({1.0f}, {std::nextafter(1.0f, 2.0f)}));
  // nan_canonical_bytes: the tensor's bytes with canonical NaNs, tensor_bytes exactly.
  Tensor t = Tensor::from_vector(std::vector<float>{neg, 2.0f}, {2}).to(Device("sim", 0));
  const std::vector<std::uint8_t> raw = tensor_bytes(t), can = nan_canonical_bytes(t);
  std::uint32_t r0, c0, c1;
  std::memcpy(&r0, raw.data(), 4);
  std::memcpy(&c0, can.data(), 4);
  std::memcpy(&c1, can.data() + 4, 4);
  EXPECT_EQ(r0, 0xffc00000u);
  EXPECT_EQ(c0, 0x7fffffffu);
  EXPECT_EQ(c1, 0x40000000u);
}

}  // namespace
}  // namespace ditto
