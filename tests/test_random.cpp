// Philox 4x32-10 known answers (Random123's kat_vectors), the seed/stream/index layout, uniform
// ranges and permutations.
#include <Random123/philox.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/base/error.h"
#include "core/numerics/random.h"
#include "test_util.h"

namespace ditto {
namespace {

using test::expect_invalid;

TEST(Random, PhiloxKnownAnswers) {
  // Random123 1.14 examples/kat_vectors, "philox4x32 10" lines: counter[4] key[2] -> out[4].
  struct Kat {
    std::uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    std::uint32_t out[4];
    philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.out[i]) << "word " << i;
  }
}

TEST(Random, PhiloxLayoutIsCounterIndexDiv4StreamAndSeedKey) {
  // Note [Philox layout]: key = seed, counter = {index/4 (64 bits), stream (64 bits)}, lane
  // index%4.
  const std::uint64_t seed = 0x0123456789abcdefULL, stream = (5ULL << 32) | 7ULL;
  const std::uint64_t index = (2ULL << 34) + 4 * 9 + 3;  // block (2 << 32) + 9, lane 3
  r123::Philox4x32_R<10> rng;
  r123::Philox4x32_R<10>::ctr_type c = {{9u, 2u, 7u, 5u}};
  r123::Philox4x32_R<10>::key_type k = {{0x89abcdefu, 0x01234567u}};
  EXPECT_EQ(philox_u32(seed, stream, index), rng(c, k)[3]);
  // all-zero inputs give the first known answer word by word
  EXPECT_EQ(philox_u32(0, 0, 0), 0x6627e8d5u);
  EXPECT_EQ(philox_u32(0, 0, 3), 0x9b00dbd8u);
  EXPECT_EQ(philox_u64(0, 0, 0), (0x6627e8d5ULL << 32) | 0xe169c58dULL);
  EXPECT_EQ(philox_u64(0, 0, 1), (0xbc57ac4cULL << 32) | 0x9b00dbd8ULL);
}

TEST(Random, StreamIdSeparatesKinds) {
  EXPECT_EQ(stream_id(kStreamInit, 3), (1ULL << 48) | 3ULL);
  EXPECT_NE(stream_id(kStreamShuffle, 0), stream_id(kStreamSplit, 0));
  EXPECT_NE(philox_u32(1, stream_id(kStreamInit, 0), 0),
            philox_u32(1, stream_id(kStreamInit, 1), 0));
}

TEST(Random, Uniform01IsTop24BitsAndInRange) {
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const float u = uniform01(42, 7, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(
        u, static_cast<float>(philox_u32(42, 7, static_cast<std::uint64_t>(i)) >> 8) / 16777216.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
}

TEST(Random, UniformRangeAndErrors) {
  float lo = 1.0f, hi = -1.0f;
  for (int i = 0; i < 20000; ++i) {
    const float x = uniform(3, 1, static_cast<std::uint64_t>(i), -0.25f, 0.75f);
    ASSERT_GE(x, -0.25f);
    ASSERT_LT(x, 0.75f);
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  EXPECT_LT(lo, -0.24f);
  EXPECT_GT(hi, 0.74f);
  // A range so narrow that lo + (hi - lo) * u rounds up to hi still stays below hi.
  const float a = 1.0f, b = std::nextafter(1.0f, 2.0f);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(uniform(3, 1, static_cast<std::uint64_t>(i), a, b), a);
  expect_invalid([] { uniform(0, 0, 0, 1.0f, 1.0f); }, "uniform: expected finite lo < hi");
}

TEST(Random, PermutationIsAPermutationSortedByKeys) {
  const std::int64_t n = 1000;
  auto p = permutation(n, 11, 5);
  ASSERT_EQ(static_cast<std::int64_t>(p.size()), n);
  std::vector<std::int64_t> sorted = p, iota(static_cast<std::size_t>(n));
  std::sort(sorted.begin(), sorted.end());
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  for (std::size_t i = 1; i < p.size(); ++i)
    ASSERT_LT(philox_u64(11, 5, static_cast<std::uint64_t>(p[i - 1])),
              philox_u64(11, 5, static_cast<std::uint64_t>(p[i])));
  EXPECT_NE(p, iota);  // 1/1000! chance of failing
}

TEST(Random, PermutationDependsOnSeedAndStreamOnly) {
  EXPECT_EQ(permutation(100, 1, 2), permutation(100, 1, 2));
  EXPECT_NE(permutation(100, 1, 2), permutation(100, 2, 2));
  EXPECT_NE(permutation(100, 1, 2), permutation(100, 1, 3));
  EXPECT_TRUE(permutation(0, 1, 2).empty());
  EXPECT_EQ(permutation(1, 1, 2), std::vector<std::int64_t>{0});
  expect_invalid([] { permutation(-1, 0, 0); }, "permutation: n: expected n >= 0, got -1");
}

}  // namespace
}  // namespace ditto
