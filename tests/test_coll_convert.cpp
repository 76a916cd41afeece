// The simulator's fast small-float conversions (backend_sim/sim_small_float.h), used by the
// reductions over ranks, against the one conversion of core/numerics/float_formats.h that the
// CUDA kernels share: every code of f16, bf16, e4m3 and e5m2 decoded, and f32 -> small on a
// sweep of f32 bit patterns (every 4093rd) plus the neighbourhood of each boundary, bit for bit,
// element by element and by block.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "backend_sim/sim_small_float.h"
#include "core/numerics/float_formats.h"

namespace ditto {
namespace {

template <typename T>
void check_every_code() {
  constexpr unsigned kCodes = sizeof(T) == 1 ? 256u : 65536u;
  std::vector<T> codes;
  for (unsigned c = 0; c < kCodes; ++c) {
    T x;
    x.bits = static_cast<decltype(x.bits)>(c);
    codes.push_back(x);
  }
  std::vector<float> block(codes.size());
  sim::to_f32_block(codes.data(), block.data(), static_cast<std::int64_t>(codes.size()));
  int wrong = 0;
  for (unsigned c = 0; c < kCodes; ++c) {
    const std::uint32_t want = std::bit_cast<std::uint32_t>(codes[c].to_float());
    if (std::bit_cast<std::uint32_t>(sim::to_f32_fast(codes[c])) != want ||
        std::bit_cast<std::uint32_t>(block[c]) != want) {
      if (++wrong <= 5) ADD_FAILURE() << "code 0x" << std::hex << c << ": want 0x" << want;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(CollConvert, DecodingEveryCodeMatchesFloatFormats) {
  check_every_code<float16>();
  check_every_code<bfloat16>();
  check_every_code<float8_e4m3>();
  check_every_code<float8_e5m2>();
}

template <typename T>
void check_rounding(const std::vector<std::uint32_t>& patterns) {
  std::vector<float> values;
  for (std::uint32_t u : patterns) values.push_back(std::bit_cast<float>(u));
  std::vector<T> block(values.size());
  sim::from_f32_block(values.data(), block.data(), static_cast<std::int64_t>(values.size()));
  int wrong = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto want = T::from(values[i]).bits;
    if (sim::from_f32_fast<T>(values[i]).bits != want || block[i].bits != want) {
      if (++wrong <= 5)
        ADD_FAILURE() << "f32 0x" << std::hex << patterns[i] << ": want 0x" << want << ", got 0x"
                      << sim::from_f32_fast<T>(values[i]).bits << " / 0x" << block[i].bits;
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(CollConvert, RoundingF32MatchesFloatFormatsOnASweepAndAtEveryBoundary) {
  std::vector<std::uint32_t> patterns;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 4093)
    patterns.push_back(static_cast<std::uint32_t>(u));
  // Around zero, f32 subnormals, the f16 subnormal / normal / overflow limits, the bf16 and f16
  // rounding ties near 1, f32's largest finite, inf and NaN; both signs.
  for (std::uint32_t b :
       {0x00000000u, 0x00800000u, 0x33000000u, 0x33800000u, 0x387fc000u, 0x38800000u, 0x3f800000u,
        0x3f808000u, 0x3f801000u, 0x477fe000u, 0x477ff000u, 0x47800000u, 0x7f7f8000u, 0x7f7fffffu,
        0x7f800000u, 0x7fc00000u})
    for (std::uint32_t sign : {0u, 0x80000000u})
      for (std::int64_t d = -300; d <= 300; ++d)
        patterns.push_back(sign | static_cast<std::uint32_t>((std::int64_t(b) + d) & 0x7fffffff));
  check_rounding<float16>(patterns);
  check_rounding<bfloat16>(patterns);
  check_rounding<float8_e4m3>(patterns);
  check_rounding<float8_e5m2>(patterns);
}

}  // namespace
}  // namespace ditto
