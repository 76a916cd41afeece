// test_util.h's seeded values, out of line: in the check build the test sources are compiled at
// -O0 and this file at -O1 ahead of them (Note [Test sources at -O0], tests/CMakeLists.txt), so
// that the standard library's random distributions, which ditto's libraries never instantiate,
// run optimised in every test that draws values.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "../test_util.h"

namespace ditto::test {

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<float> mixed_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp10(-4, 4);
  std::vector<float> v(n);
  for (float& x : v) x = mant(gen) * std::pow(10.0f, static_cast<float>(exp10(gen)));
  return v;
}

}  // namespace ditto::test
