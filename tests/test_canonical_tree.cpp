// The order of operations of the CUDA bitwise kernels, checked on the host (no GPU needed):
// canonical::TreeStack (Note [Streaming canonical tree], core/numerics/canonical_tree.h) against
// the recursive canonical tree of core/numerics/determinism.h, canonical::ShardTiles' walk over
// micro-shards, and host mirrors of the per-element loops of backend_cuda/cuda_kernels.cu (the
// tiled GEMM with its -0/+0 padding, gemm_tn_sharded, sum_rows_sharded, sum_sharded) against the
// simulator's kernels, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/numerics/canonical_math.h"
#include "core/numerics/canonical_tree.h"
#include "core/numerics/determinism.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

namespace cm = canonical;
using Bounds = std::vector<std::int64_t>;

constexpr int kTile = 8;  // rows per k-tile, as kBK in cuda_kernels.cu

// Mixed magnitudes (1e-4 .. 1e4, both signs) and a few signed zeros, so that order shows.
std::vector<float> mixed_values_with_zeros(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exp10(-4, 4);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<float> v(n);
  for (float& x : v) {
    const int p = pick(gen);
    x = p == 0 ? 0.0f : p == 1 ? -0.0f : mant(gen) * std::pow(10.0f, float(exp10(gen)));
  }
  return v;
}

Bounds random_bounds(std::int64_t rows, std::int64_t S, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> cut(0, rows);
  Bounds b(static_cast<std::size_t>(S) + 1, 0);
  b.back() = rows;
  for (std::int64_t i = 1; i < S; ++i) b[static_cast<std::size_t>(i)] = cut(gen);
  std::sort(b.begin(), b.end());
  return b;
}

struct VecBounds {
  const std::int64_t* b;
  std::int64_t operator[](int i) const { return b[i]; }
};

// The canonical tree written from its definition (Note [Canonical tree]).
float recursive_tree(const std::vector<float>& leaves, std::int64_t lo, std::int64_t hi) {
  if (hi - lo == 1) return leaves[static_cast<std::size_t>(lo)];
  const std::int64_t mid = tree_mid(lo, hi);
  return cm::add(recursive_tree(leaves, lo, mid), recursive_tree(leaves, mid, hi));
}

class CanonicalTree : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 16;
    init_backend("sim", o);
  }
  static Device dev() { return Device("sim", 0); }
};

TEST_F(CanonicalTree, StackDepthIsTheLargestPopcount) {
  EXPECT_EQ(cm::tree_stack_depth(1), 1);
  EXPECT_EQ(cm::tree_stack_depth(2), 1);
  EXPECT_EQ(cm::tree_stack_depth(3), 2);
  EXPECT_EQ(cm::tree_stack_depth(64), 6);
  EXPECT_EQ(cm::tree_stack_depth(126), 6);
  EXPECT_EQ(cm::tree_stack_depth(127), 7);
  static_assert(cm::tree_stack_depth(64) == 6);
}

// Every leaf count 1..300: the streaming evaluation gives the recursive tree's bits (signed
// zeros included), elementwise over W = 2, and never holds more than tree_stack_depth(n) entries.
TEST_F(CanonicalTree, StreamingTreeEqualsRecursiveTree) {
  for (std::int64_t n = 1; n <= 300; ++n) {
    const std::vector<float> a =
        mixed_values_with_zeros(static_cast<std::size_t>(n), 7u + unsigned(n));
    const std::vector<float> b =
        mixed_values_with_zeros(static_cast<std::size_t>(n), 9000u + unsigned(n));
    cm::TreeStack<2, 64> tree;
    int max_top = 0;
    for (std::int64_t s = 0; s < n; ++s) {
      float x[2] = {a[static_cast<std::size_t>(s)], b[static_cast<std::size_t>(s)]};
      tree.push(s, x);
      max_top = std::max(max_top, tree.top);
    }
    float r[2];
    tree.result(r);
    EXPECT_EQ(bits(r[0]), bits(recursive_tree(a, 0, n))) << "n = " << n;
    EXPECT_EQ(bits(r[1]), bits(recursive_tree(b, 0, n))) << "n = " << n;
    EXPECT_EQ(max_top, cm::tree_stack_depth(n)) << "n = " << n;
  }
}

// The walk visits every row of every nonempty shard once, in ascending order, in tiles of at most
// kTile rows that never span two shards, and reports each shard's end where it is.
TEST_F(CanonicalTree, ShardTilesCoverEveryShardInOrder) {
  std::vector<Bounds> cases = {{0, 0}, {0, 5}, {0, 8}, {0, 17}, {0, 0, 0, 3}, {0, 3, 3, 3}};
  for (std::int64_t S : {2, 3, 8, 64})
    for (std::int64_t rows : {0, 5, 37, 130}) {
      cases.push_back(micro_shard_bounds(rows, S));
      cases.push_back(random_bounds(rows, S, 31u * unsigned(S) + unsigned(rows)));
    }
  for (const Bounds& b : cases) {
    const int S = static_cast<int>(b.size()) - 1;
    cm::ShardTiles<VecBounds> w(VecBounds{b.data()}, S, kTile);
    std::vector<int> finished;  // shards in the order the kernel pushes them
    for (int s = 0; s < w.shard; ++s) {
      EXPECT_EQ(b[s], b[s + 1]);
      finished.push_back(s);
    }
    std::int64_t row = 0;
    while (!w.done()) {
      EXPECT_EQ(w.k0, row);  // shards are contiguous: each tile starts where the last ended
      EXPECT_GT(w.k1, w.k0);
      EXPECT_LE(w.k1 - w.k0, kTile);
      EXPECT_GE(w.k0, b[w.shard]);
      EXPECT_LE(w.k1, b[w.shard + 1]);
      row = w.k1;
      const bool ends = w.last_of_shard();
      const int shard = w.shard;
      w.advance();
      if (ends) {
        finished.push_back(shard);
        for (int s = shard + 1; s < w.shard; ++s) {
          EXPECT_EQ(b[s], b[s + 1]);
          finished.push_back(s);
        }
      }
    }
    EXPECT_EQ(row, b.back());
    ASSERT_EQ(static_cast<int>(finished.size()), S);
    for (int s = 0; s < S; ++s) EXPECT_EQ(finished[s], s);
  }
}

// Host mirror of one thread's accumulator in gemm_kernel (cuda_kernels.cu): tiles of kTile rows
// from ShardTiles, padded with A = -0.0f, B = +0.0f; for the sharded kernel each shard's chain is
// pushed on a TreeStack when its last tile is done. a(k), b(k) give op(A)[i, k], op(B)[k, j].
template <class AF, class BF>
float kernel_chain(const AF& a, const BF& b, const Bounds& bounds, bool sharded) {
  const int S = static_cast<int>(bounds.size()) - 1;
  cm::TreeStack<1, 64> tree;
  float acc[1] = {0.0f};
  cm::ShardTiles<VecBounds> cur(VecBounds{bounds.data()}, S, kTile);
  if (sharded)
    for (int s = 0; s < cur.shard; ++s) {
      tree.push(s, acc);
      acc[0] = 0.0f;
    }
  while (!cur.done()) {
    const bool ends = cur.last_of_shard();
    const int shard = cur.shard;
    const std::int64_t k0 = cur.k0, k1 = cur.k1;
    cur.advance();
    for (std::int64_t k = k0; k < k0 + kTile; ++k)
      acc[0] = cm::dot_step(k < k1 ? a(k) : -0.0f, k < k1 ? b(k) : 0.0f, acc[0]);
    if (sharded && ends) {
      tree.push(shard, acc);
      acc[0] = 0.0f;
      for (int s = shard + 1; s < cur.shard; ++s) {
        tree.push(s, acc);
        acc[0] = 0.0f;
      }
    }
  }
  if (sharded) tree.result(acc);
  return acc[0];
}

TEST_F(CanonicalTree, TiledGemmOrderMatchesSimulator) {
  struct Case {
    std::int64_t M, N, K;
    float alpha, beta;
  };
  const Case cases[] = {{5, 7, 13, 1.0f, 0.0f}, {3, 4, 8, 0.5f, 0.0f}, {6, 2, 17, 1.5f, -0.75f},
                        {4, 3, 0, 2.0f, 0.5f},  {1, 1, 1, 1.0f, 1.0f}, {9, 5, 40, 1.0f, 0.0f}};
  std::uint32_t seed = 1;
  for (const Case& c : cases)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const auto A = mixed_values_with_zeros(static_cast<std::size_t>(c.M * c.K), seed++);
      const auto B = mixed_values_with_zeros(static_cast<std::size_t>(c.K * c.N), seed++);
      const auto C0 = mixed_values_with_zeros(static_cast<std::size_t>(c.M * c.N), seed++);
      Tensor a = Tensor::from_vector(A, ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, dev());
      Tensor b = Tensor::from_vector(B, tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, dev());
      Tensor out = Tensor::from_vector(C0, {c.M, c.N}, dev());
      ops::gemm(a, b, out, ta, tb, c.alpha, c.beta, Determinism::bitwise);
      std::vector<float> want(static_cast<std::size_t>(c.M * c.N));
      for (std::int64_t i = 0; i < c.M; ++i)
        for (std::int64_t j = 0; j < c.N; ++j) {
          auto av = [&](std::int64_t k) { return ta ? A[k * c.M + i] : A[i * c.K + k]; };
          auto bv = [&](std::int64_t k) { return tb ? B[j * c.K + k] : B[k * c.N + j]; };
          const float chain = kernel_chain(av, bv, {0, c.K}, false);
          want[i * c.N + j] = cm::gemm_epilogue(chain, c.alpha, c.beta, C0[i * c.N + j]);
        }
      EXPECT_TRUE(bits_equal(out.to_vector<float>(), want))
          << c.M << "x" << c.N << "x" << c.K << " trans " << ta << tb;
    }
}

// A chain that ends at -0.0f (products that underflow to -0) stays -0.0f through the padding of
// its last tile; padding both operands with +0.0f would turn it into +0.0f.
TEST_F(CanonicalTree, PaddingKeepsANegativeZeroChain) {
  const std::vector<float> A = {-1e-30f, -1e-30f, -1e-30f};
  const std::vector<float> B = {1e-30f, 1e-30f, 1e-30f};
  Tensor a = Tensor::from_vector(A, {1, 3}, dev());
  Tensor b = Tensor::from_vector(B, {3, 1}, dev());
  const float sim = ops::matmul(a, b, false, false, Determinism::bitwise).item();
  auto av = [&](std::int64_t k) { return A[k]; };
  auto bv = [&](std::int64_t k) { return B[k]; };
  const float kernel = kernel_chain(av, bv, {0, 3}, false);
  EXPECT_TRUE(std::signbit(sim));
  EXPECT_EQ(sim, 0.0f);
  EXPECT_EQ(bits(kernel), bits(sim));
  float naive = 0.0f;
  for (int k = 0; k < kTile; ++k) naive = cm::fma(k < 3 ? A[k] : 0.0f, k < 3 ? B[k] : 0.0f, naive);
  EXPECT_FALSE(std::signbit(naive));
}

std::vector<Bounds> shard_cases(std::int64_t rows) {
  std::vector<Bounds> cases;
  for (std::int64_t S : {1, 2, 3, 8, 64}) {
    cases.push_back(micro_shard_bounds(rows, S));
    if (S > 1 && rows > 0)
      cases.push_back(random_bounds(rows, S, 77u * unsigned(S) + unsigned(rows)));
  }
  return cases;
}

TEST_F(CanonicalTree, ShardedGemmOrderMatchesSimulator) {
  const std::int64_t M = 5, N = 6;
  std::uint32_t seed = 500;
  for (std::int64_t rows : {0, 5, 37, 130})
    for (const Bounds& bounds : shard_cases(rows))
      for (bool accumulate : {false, true}) {
        const auto A = mixed_values_with_zeros(static_cast<std::size_t>(rows * M), seed++);
        const auto B = mixed_values_with_zeros(static_cast<std::size_t>(rows * N), seed++);
        const auto C0 = mixed_values_with_zeros(static_cast<std::size_t>(M * N), seed++);
        Tensor a = Tensor::from_vector(A, {rows, M}, dev());
        Tensor b = Tensor::from_vector(B, {rows, N}, dev());
        Tensor c = Tensor::from_vector(C0, {M, N}, dev());
        ops::gemm_tn_sharded(a, b, c, bounds, accumulate);
        std::vector<float> want(static_cast<std::size_t>(M * N));
        for (std::int64_t i = 0; i < M; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            auto av = [&](std::int64_t r) { return A[r * M + i]; };
            auto bv = [&](std::int64_t r) { return B[r * N + j]; };
            const float t = kernel_chain(av, bv, bounds, true);
            want[i * N + j] = accumulate ? cm::add(C0[i * N + j], t) : t;
          }
        EXPECT_TRUE(bits_equal(c.to_vector<float>(), want))
            << "rows " << rows << " shards " << bounds.size() - 1 << " accumulate " << accumulate;
      }
}

// Mirrors of sum_rows_sharded_kernel (one column) and sum_sharded_kernel.
float kernel_sharded_sum(const Bounds& bounds, const std::vector<float>& x, std::int64_t stride,
                         std::int64_t offset) {
  cm::TreeStack<1, 64> tree;
  float v[1];
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    float acc = 0.0f;
    for (std::int64_t r = bounds[s]; r < bounds[s + 1]; ++r)
      acc = cm::sum_step(acc, x[static_cast<std::size_t>(r * stride + offset)]);
    v[0] = acc;
    tree.push(static_cast<std::int64_t>(s), v);
  }
  tree.result(v);
  return v[0];
}

TEST_F(CanonicalTree, ShardedSumsMatchSimulator) {
  const std::int64_t cols = 7;
  std::uint32_t seed = 900;
  for (std::int64_t rows : {0, 5, 37, 130})
    for (const Bounds& bounds : shard_cases(rows)) {
      const auto X = mixed_values_with_zeros(static_cast<std::size_t>(rows * cols), seed++);
      const auto O = mixed_values_with_zeros(static_cast<std::size_t>(cols), seed++);
      Tensor x = Tensor::from_vector(X, {rows, cols}, dev());
      Tensor out = Tensor::from_vector(O, {cols}, dev());
      ops::sum_rows_sharded(x, out, bounds, true);
      std::vector<float> want(static_cast<std::size_t>(cols));
      for (std::int64_t c = 0; c < cols; ++c)
        want[c] = cm::add(O[c], kernel_sharded_sum(bounds, X, cols, c));
      EXPECT_TRUE(bits_equal(out.to_vector<float>(), want)) << "rows " << rows;

      const auto V = mixed_values_with_zeros(static_cast<std::size_t>(rows), seed++);
      Tensor v = Tensor::from_vector(V, {rows}, dev());
      const float got = ops::sum_sharded(v, bounds, 0.25f).item();
      EXPECT_EQ(bits(got), bits(cm::mul(0.25f, kernel_sharded_sum(bounds, V, 1, 0))))
          << "rows " << rows << " shards " << bounds.size() - 1;
    }
}

}  // namespace
}  // namespace ditto
