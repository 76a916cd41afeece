// Philox 4x32-10 as DITTO_HD functions (__host__ __device__ under nvcc), for kernels that draw
// random numbers themselves (dropout masks, Note [Dropout masks] in core/numerics/gpt_math.h).
// Bit for bit the numbers of core/numerics/random.h's philox4x32_10 / philox_u32 / uniform01
// (which go through Random123 on the host): the same rounds and constants (Random123's
// philox.h: multipliers 0xD2511F53, 0xCD9E8D57, Weyl key bumps 0x9E3779B9, 0xBB67AE85) and the
// same counter layout (Note [Philox layout] in random.h). tests/test_gpt_ops.cpp checks the
// equality on many (seed, stream, index). Header-only.
#pragma once

#include <cstdint>

#include "core/numerics/portable_math.h"  // defines DITTO_HD

namespace ditto::philox {

inline constexpr std::uint32_t kM0 = 0xD2511F53u;  // Random123 PHILOX_M4x32_0
inline constexpr std::uint32_t kM1 = 0xCD9E8D57u;  // Random123 PHILOX_M4x32_1
inline constexpr std::uint32_t kW0 = 0x9E3779B9u;  // golden ratio (PHILOX_W32_0)
inline constexpr std::uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1 (PHILOX_W32_1)

/// The raw Philox4x32-10 block of `counter` under `key` into out[0..3] (Random123's
/// philox4x32(ctr, key) with 10 rounds; equals ditto::philox4x32_10).
DITTO_HD inline void block(const std::uint32_t counter[4], const std::uint32_t key[2],
                           std::uint32_t out[4]) {
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key is bumped before every round but the first
      k0 += kW0;
      k1 += kW1;
    }
    const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c2;
    c0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;  // hi1 ^ c1 ^ k0
    c1 = static_cast<std::uint32_t>(p1);                 // lo1
    c2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;  // hi0 ^ c3 ^ k1
    c3 = static_cast<std::uint32_t>(p0);                 // lo0
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/// The 4 words of block number `block_index` (indices 4*block_index .. 4*block_index + 3) of
/// stream `stream` under `seed` (Note [Philox layout]): a kernel drawing consecutive indices
/// computes one block per 4 of them.
DITTO_HD inline void block_at(std::uint64_t seed, std::uint64_t stream, std::uint64_t block_index,
                              std::uint32_t out[4]) {
  const std::uint32_t counter[4] = {
      static_cast<std::uint32_t>(block_index), static_cast<std::uint32_t>(block_index >> 32),
      static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)};
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(seed),
                                static_cast<std::uint32_t>(seed >> 32)};
  block(counter, key, out);
}

/// Random 32-bit word number `index` of stream `stream` under `seed` (= ditto::philox_u32).
DITTO_HD inline std::uint32_t u32(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint32_t out[4];
  block_at(seed, stream, index >> 2, out);
  return out[index & 3];
}

/// A 32-bit word as a uniform float in [0, 1) with 24 random bits: (w >> 8) * 2^-24 (exact).
DITTO_HD inline float to_uniform01(std::uint32_t w) {
  return static_cast<float>(w >> 8) * 0x1p-24f;
}

/// Uniform float in [0, 1) (= ditto::uniform01).
DITTO_HD inline float uniform01(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return to_uniform01(u32(seed, stream, index));
}

}  // namespace ditto::philox
