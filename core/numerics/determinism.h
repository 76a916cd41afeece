// Determinism modes and the canonical reduction tree (../DESIGN.md, "The determinism contract").
//
// Note [Canonical tree]
// Reductions across ranks (and, in the trainer, across the K micro-shards of a batch) combine
// contributions in one pairwise tree over indices:
//   sum(lo, hi) = sum(lo, mid) + sum(mid, hi),  mid = lo + largest power of two strictly below hi-lo
// A leaf (hi - lo == 1) is the contribution itself. For power-of-two counts the tree over ranks
// composes with the subtree each rank computed over its micro-shards, so the result does not depend
// on how many devices share the work. `fast` mode is free to use any order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ditto {

enum class Determinism : std::uint8_t {
  bitwise,  ///< fixed operation order: identical bits across backends and power-of-two device counts
  fast,     ///< each backend's fastest path; agrees with bitwise within a tolerance
};

/// Whether `d` is one of the enumerators (a Determinism cast from a bad int is not).
constexpr bool is_valid_determinism(Determinism d) {
  return d == Determinism::bitwise || d == Determinism::fast;
}

constexpr const char* determinism_name(Determinism d) {
  return d == Determinism::bitwise ? "bitwise" : "fast";
}

/// Parse "bitwise" / "fast"; throws InvalidArgument otherwise.
Determinism parse_determinism(std::string_view s);

/// Split point of the canonical tree over [lo, hi), hi - lo >= 2 (Note [Canonical tree]).
constexpr std::int64_t tree_mid(std::int64_t lo, std::int64_t hi) {
  std::int64_t n = hi - lo, p = 1;
  while (p * 2 < n) p *= 2;
  return lo + p;
}

}  // namespace ditto
