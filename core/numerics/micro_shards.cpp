// Micro-shard bounds (Note [Micro-shards] in core/numerics/micro_shards.h).
#include "core/numerics/micro_shards.h"

#include "core/base/error.h"

namespace ditto {

namespace {

/// Bounds' structure without a fixed row count: >= 2 entries, starting at 0, non-decreasing.
void check_bounds_shape(const char* call, const std::vector<std::int64_t>& bounds) {
  DITTO_CHECK(bounds.size() >= 2, call,
              ": bounds: expected at least 2 entries (S + 1 row offsets of S >= 1 shards), got ",
              bounds.size());
  DITTO_CHECK(bounds[0] == 0, call, ": bounds: expected bounds[0] == 0, got ", bounds[0]);
  for (std::size_t i = 1; i < bounds.size(); ++i)
    DITTO_CHECK(bounds[i] >= bounds[i - 1], call,
                ": bounds: expected non-decreasing row offsets, got bounds[", i - 1,
                "] = ", bounds[i - 1], " > bounds[", i, "] = ", bounds[i]);
}

}  // namespace

std::vector<std::int64_t> micro_shard_bounds(std::int64_t rows, std::int64_t K) {
  DITTO_CHECK(rows >= 0, "micro_shard_bounds: rows: expected >= 0, got ", rows);
  DITTO_CHECK(K >= 1, "micro_shard_bounds: K: expected >= 1 micro-shards, got ", K);
  std::vector<std::int64_t> b(static_cast<std::size_t>(K) + 1);
  for (std::int64_t i = 0; i <= K; ++i) {
    // floor(i * rows / K) without overflowing i * rows: split rows = q * K + r.
    const std::int64_t q = rows / K, r = rows % K;
    b[static_cast<std::size_t>(i)] = i * q + (i * r) / K;
  }
  return b;
}

std::vector<std::int64_t> local_bounds(const std::vector<std::int64_t>& global,
                                       std::int64_t first_shard, std::int64_t last_shard) {
  check_bounds_shape("local_bounds", global);
  const auto shards = static_cast<std::int64_t>(global.size()) - 1;
  DITTO_CHECK(0 <= first_shard && first_shard < last_shard && last_shard <= shards,
              "local_bounds: [first_shard, last_shard): expected a non-empty range within [0, ",
              shards, "), got [", first_shard, ", ", last_shard, ")");
  std::vector<std::int64_t> b;
  b.reserve(static_cast<std::size_t>(last_shard - first_shard + 1));
  const std::int64_t base = global[static_cast<std::size_t>(first_shard)];
  for (std::int64_t s = first_shard; s <= last_shard; ++s)
    b.push_back(global[static_cast<std::size_t>(s)] - base);
  return b;
}

void check_shard_bounds(const char* call, const std::vector<std::int64_t>& bounds,
                        std::int64_t rows) {
  check_bounds_shape(call, bounds);
  DITTO_CHECK(bounds.back() == rows, call,
              ": bounds: expected the last entry to equal rows = ", rows, ", got ", bounds.back());
}

}  // namespace ditto
