// Micro-shard bounds of a global batch (../DESIGN.md, "The determinism contract", rule 2):
// host-only helpers that say which rows of a batch form each micro-shard, and which rows a device
// holding a run of micro-shards sees. The kernels that reduce over them are
// ops::gemm_tn_sharded, ops::sum_rows_sharded and ops::sum_sharded (core/runtime/ops.h).
//
// Note [Micro-shards]
// A reduction over the batch (a weight gradient dW = dY^T X, a bias gradient, the mean loss) must
// give the same bits whether one device or D devices share the batch. Summing each device's rows
// in order and then adding the device results would not: the grouping of the additions changes
// with D. So the batch of B rows is cut into a fixed number K of micro-shards (K a power of two,
// at least the largest device count supported), shard i holding rows
//   [floor(i * B / K), floor((i + 1) * B / K))          (micro_shard_bounds(B, K))
// Inside a shard rows are accumulated in ascending order from 0.0f (one fma per step for a dot
// product, one add for a sum); the K shard partials are combined with the canonical tree of
// Note [Canonical tree] (core/numerics/determinism.h). When D (a power of two dividing K) devices each
// hold K / D consecutive shards, device d holding shards [a, b) = [d*K/D, (d+1)*K/D) reduces its
// rows with the subtree over [a, b) (its own rows, bounds local_bounds(global, a, b)); that
// subtree is exactly a node of the tree over K shards, and the canonical tree over the D device
// results (ops::sum_inputs or an all-reduce in bitwise mode) supplies the nodes above it. The
// result is therefore the same for every such D, bit for bit. The trainer scatters a batch
// along micro-shard boundaries so that this holds.
#pragma once

#include <cstdint>
#include <vector>

namespace ditto {

/// K used when nothing else is said (a layer run outside DataParallel, a loss): a power of two
/// at least as large as any device count bitwise mode is meant to agree across.
constexpr std::int64_t kDefaultMicroShards = 64;
/// Largest K DataParallel accepts (each shard costs a partial result in the batch reductions).
constexpr std::int64_t kMaxMicroShards = 65536;

/// Bounds of K micro-shards of `rows` rows: entry i is floor(i * rows / K), i = 0..K (K + 1
/// entries, first 0, last rows; shards are empty when rows < K). Throws InvalidArgument for
/// rows < 0 or K < 1.
std::vector<std::int64_t> micro_shard_bounds(std::int64_t rows, std::int64_t K);

/// Bounds of the shards [first_shard, last_shard) of `global` (as micro_shard_bounds returns),
/// rebased so that they start at 0: the bounds a device holding those shards' rows passes to the
/// sharded ops. Throws InvalidArgument when `global` is not valid bounds (at least 2 entries,
/// starting at 0, non-decreasing) or unless 0 <= first_shard < last_shard <= global.size() - 1.
std::vector<std::int64_t> local_bounds(const std::vector<std::int64_t>& global,
                                       std::int64_t first_shard, std::int64_t last_shard);

/// Throws InvalidArgument unless `bounds` are valid bounds of a reduction over `rows` rows: at
/// least 2 entries, bounds[0] == 0, non-decreasing, bounds.back() == rows. `call` names the op.
void check_shard_bounds(const char* call, const std::vector<std::int64_t>& bounds,
                        std::int64_t rows);

}  // namespace ditto
