// Streaming evaluation of the canonical reduction tree and the k-tile walk of micro-sharded
// reductions, shared by the CUDA kernels (backend_cuda/cuda_kernels.cu) and host tests
// (tests/test_canonical_tree.cpp). Every function is DITTO_HD (__host__ __device__ under nvcc),
// so the order of operations a GPU kernel performs is checked on the host, bit for bit, against
// the simulator's recursive evaluation of the same tree.
//
// Note [Streaming canonical tree]
// The canonical tree (Note [Canonical tree], core/numerics/determinism.h) splits [lo, hi) at
// lo + p, p the largest power of two below hi - lo. Over n leaves it is therefore
//   B1 + (B2 + (... + Bq))
// where B1, B2, ... are complete binary trees over consecutive runs of leaves whose sizes are the
// powers of two in the binary expansion of n, largest first (the left part of every split is a
// complete tree of p leaves, the right part the canonical tree of the rest). A binary counter
// builds exactly these nodes while the leaves arrive in ascending order: after leaf s is pushed,
// merge the top two entries while they have the same size (that happens ctz(s + 1) times), always
// as add(older, newer); at the end fold the stack from the top, v = add(entry, v). Entries
// alive at once: at most popcount of a number <= n, i.e. tree_stack_depth(n). A kernel can then
// walk its leaves in one pass (a GEMM tile runs the shards in row order) and keep only that many
// partial results, where a recursive evaluation would need them all or a second pass.
#pragma once

#include <cstdint>

#include "core/numerics/canonical_math.h"

namespace ditto::canonical {

/// Entries a TreeStack needs for `leaves` leaves: max popcount(n) over 1 <= n <= leaves, which
/// is bit_width(leaves + 1) - 1 (1 for one leaf, 6 for 64, 7 for 127).
DITTO_HD constexpr int tree_stack_depth(std::int64_t leaves) {
  int width = 0;
  for (std::uint64_t v = static_cast<std::uint64_t>(leaves) + 1; v != 0; v >>= 1) ++width;
  return width - 1;
}

/// The canonical tree over leaves pushed in ascending order (Note [Streaming canonical tree]);
/// each leaf is W floats reduced elementwise. Depth >= tree_stack_depth(number of leaves).
template <int W, int Depth>
struct TreeStack {
  float entry[Depth][W];
  int top = 0;

  /// Push leaf number `leaf` (0, 1, 2, ... in order) with value x; x is clobbered.
  DITTO_HD void push(std::int64_t leaf, float (&x)[W]) {
    for (std::uint64_t c = static_cast<std::uint64_t>(leaf) + 1; (c & 1u) == 0; c >>= 1) {
      --top;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int e = 0; e < W; ++e) x[e] = add(entry[top][e], x[e]);
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int e = 0; e < W; ++e) entry[top][e] = x[e];
    ++top;
  }

  /// The root of the tree over all leaves pushed so far (at least one) into x.
  DITTO_HD void result(float (&x)[W]) const {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int e = 0; e < W; ++e) x[e] = entry[top - 1][e];
    for (int t = top - 2; t >= 0; --t) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int e = 0; e < W; ++e) x[e] = add(entry[t][e], x[e]);
    }
  }
};

/// The k-tiles of a micro-sharded reduction in the order a tiled kernel consumes them (Note
/// [Micro-shards], core/numerics/micro_shards.h): shards ascending; nonempty shard s, rows
/// [b[s], b[s+1]), is cut into tiles of at most `tile` rows starting at b[s] (the last one may be
/// short; a tile never spans two shards); empty shards have no tile. `Bounds` is anything with
/// `std::int64_t operator[](int) const` over shards + 1 non-decreasing offsets. A plain GEMM is
/// the case of one shard [0, K).
template <class Bounds>
struct ShardTiles {
  Bounds b;
  int shards = 0;
  int tile = 1;
  int shard = 0;         ///< shard of the current tile; == shards once the walk is done
  std::int64_t k0 = 0;   ///< current tile: rows [k0, k1)
  std::int64_t k1 = 0;

  /// Positions the walk on the first tile. Shards [0, shard) are then empty.
  DITTO_HD ShardTiles(Bounds bounds, int n_shards, int tile_rows)
      : b(bounds), shards(n_shards), tile(tile_rows) {
    shard = next_nonempty(0);
    if (!done()) set_tile(b[shard]);
  }

  DITTO_HD bool done() const { return shard >= shards; }

  /// True when the current tile ends its shard.
  DITTO_HD bool last_of_shard() const { return k1 == b[shard + 1]; }

  /// Move to the next tile. When the current one ended its shard, shards strictly between the
  /// old and the new `shard` (or up to `shards` when done) are empty.
  DITTO_HD void advance() {
    if (last_of_shard()) {
      shard = next_nonempty(shard + 1);
      if (done()) return;
      set_tile(b[shard]);
    } else {
      set_tile(k1);
    }
  }

 private:
  DITTO_HD int next_nonempty(int s) const {
    while (s < shards && b[s] == b[s + 1]) ++s;
    return s;
  }
  DITTO_HD void set_tile(std::int64_t start) {
    const std::int64_t end = b[shard + 1];
    k0 = start;
    k1 = end - start < tile ? end : start + tile;
  }
};

}  // namespace ditto::canonical
