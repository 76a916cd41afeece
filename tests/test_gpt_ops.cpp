// The transformer kernels (ops::embedding .. ops::sum_squares, core/runtime/ops.h) on the
// simulator, and the DITTO_HD numerics they share with CUDA (core/numerics/gpt_math.h,
// core/numerics/philox.h).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/numerics/philox.h"
#include "core/numerics/random.h"
#include "tests/test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

TEST(GptPhilox, EqualsRandomCpp) {
  const std::uint64_t seeds[] = {0, 1, 1337, 0xFFFFFFFFull, 0x123456789ABCDEF0ull, ~0ull};
  const std::uint64_t streams[] = {0, stream_id(kStreamDropout, (7u << 8) | 3),
                                   stream_id(kStreamSample, 0), stream_id(kStreamBatch, 99),
                                   ~0ull};
  int checked = 0;
  for (std::uint64_t seed : seeds)
    for (std::uint64_t stream : streams)
      for (std::uint64_t k = 0; k < 600; ++k) {
        // Small indices, indices across the 2^32 block boundary and huge ones.
        const std::uint64_t index = k < 200 ? k : k < 400 ? (std::uint64_t(1) << 34) - 200 + k
                                                          : ~0ull - k;
        ASSERT_EQ(philox::u32(seed, stream, index), philox_u32(seed, stream, index))
            << "seed " << seed << " stream " << stream << " index " << index;
        ASSERT_EQ(bits(philox::uniform01(seed, stream, index)),
                  bits(uniform01(seed, stream, index)));
        ++checked;
      }
  EXPECT_EQ(checked, 6 * 5 * 600);
  std::uint32_t ctr[4] = {1, 2, 3, 4}, key[2] = {5, 6}, a[4], b[4];
  philox::block(ctr, key, a);
  philox4x32_10(ctr, key, b);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]);
}

}  // namespace
}  // namespace ditto
