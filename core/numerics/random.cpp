// Philox 4x32-10 through Random123 (Note [Philox layout] in random.h) and what is built on it.
#include "core/numerics/random.h"

#include <Random123/philox.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/base/error.h"

namespace ditto {

void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2],
                   std::uint32_t out[4]) {
  r123::Philox4x32_R<10> rng;
  r123::Philox4x32_R<10>::ctr_type c = {{counter[0], counter[1], counter[2], counter[3]}};
  r123::Philox4x32_R<10>::key_type k = {{key[0], key[1]}};
  auto r = rng(c, k);
  for (int i = 0; i < 4; ++i) out[i] = r[i];
}

std::uint32_t philox_u32(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t block = index >> 2;
  const std::uint32_t counter[4] = {
      static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
      static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)};
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(seed),
                                static_cast<std::uint32_t>(seed >> 32)};
  std::uint32_t out[4];
  philox4x32_10(counter, key, out);
  return out[index & 3];
}

std::uint64_t philox_u64(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return (static_cast<std::uint64_t>(philox_u32(seed, stream, 2 * index)) << 32) |
         philox_u32(seed, stream, 2 * index + 1);
}

float uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  // 24 bits fit a float's significand exactly, so the result is k * 2^-24 with k < 2^24.
  return static_cast<float>(philox_u32(seed, stream, index) >> 8) * 0x1p-24f;
}

float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float lo, float hi) {
  DITTO_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi,
              "uniform: expected finite lo < hi, got lo = ", lo, ", hi = ", hi);
  const float u = uniform01(seed, stream, index);
  const float x = lo + (hi - lo) * u;
  return x < hi ? x : std::nextafter(hi, lo);
}

std::vector<std::int64_t> permutation(std::int64_t n, std::uint64_t seed, std::uint64_t stream) {
  DITTO_CHECK(n >= 0, "permutation: n: expected n >= 0, got ", n);
  std::vector<std::pair<std::uint64_t, std::int64_t>> keyed(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    keyed[static_cast<std::size_t>(i)] = {philox_u64(seed, stream, static_cast<std::uint64_t>(i)),
                                          i};
  std::sort(keyed.begin(), keyed.end());  // pairs: key first, then index breaks ties
  std::vector<std::int64_t> perm(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = keyed[i].second;
  return perm;
}

}  // namespace ditto
