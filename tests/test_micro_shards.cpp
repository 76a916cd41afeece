// Micro-sharded batch reductions of bitwise mode (Note [Micro-shards],
// core/numerics/micro_shards.h): micro_shard_bounds / local_bounds, ops::gemm_tn_sharded,
// ops::sum_rows_sharded and ops::sum_sharded against a host scalar reference of their exact
// definition (shard counts 1, 2, 3, 8, 64; empty and uneven shards; accumulate on and off), the
// property they exist for (the same bits for 1, 2, 4 and 8 devices sharing a batch, while a plain
// ascending sum differs), and their argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using Bounds = std::vector<std::int64_t>;

// ---- host reference of the exact definition --------------------------------------------------

// Canonical tree (Note [Canonical tree]) over partials[lo, hi), elementwise, written from the
// definition: sum(lo, hi) = sum(lo, mid) + sum(mid, hi), mid = lo + largest power of 2 < hi - lo.
std::vector<float> ref_tree(const std::vector<std::vector<float>>& partials, std::size_t lo,
                            std::size_t hi) {
  if (hi - lo == 1) return partials[lo];
  std::size_t p = 1;
  while (2 * p < hi - lo) p *= 2;
  std::vector<float> left = ref_tree(partials, lo, lo + p);
  const std::vector<float> right = ref_tree(partials, lo + p, hi);
  for (std::size_t i = 0; i < left.size(); ++i) left[i] = left[i] + right[i];
  return left;
}

// P_s[i, j] = fma chain over the shard's rows of a[r, i] * b[r, j]; a [rows, M], b [rows, N].
std::vector<float> ref_gemm_tn_sharded(const std::vector<float>& a, const std::vector<float>& b,
                                       std::int64_t M, std::int64_t N, const Bounds& bounds) {
  std::vector<std::vector<float>> partials;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    std::vector<float> p(static_cast<std::size_t>(M * N));
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        float acc = 0.0f;
        for (std::int64_t r = bounds[s]; r < bounds[s + 1]; ++r)
          acc = std::fma(a[r * M + i], b[r * N + j], acc);
        p[i * N + j] = acc;
      }
    partials.push_back(std::move(p));
  }
  return ref_tree(partials, 0, partials.size());
}

// Partial of shard s: acc = acc + x[r, c] over its rows ascending, from 0.
std::vector<float> ref_sum_rows_sharded(const std::vector<float>& x, std::int64_t cols,
                                        const Bounds& bounds) {
  std::vector<std::vector<float>> partials;
  for (std::size_t s = 0; s + 1 < bounds.size(); ++s) {
    std::vector<float> p(static_cast<std::size_t>(cols), 0.0f);
    for (std::int64_t r = bounds[s]; r < bounds[s + 1]; ++r)
      for (std::int64_t c = 0; c < cols; ++c) p[c] = p[c] + x[r * cols + c];
    partials.push_back(std::move(p));
  }
  return ref_tree(partials, 0, partials.size());
}

// Bounds of S shards of `rows` rows with random (uneven, possibly empty) sizes.
Bounds random_bounds(std::int64_t rows, std::int64_t S, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> cut(0, rows);
  Bounds b(static_cast<std::size_t>(S) + 1);
  b[0] = 0;
  b[static_cast<std::size_t>(S)] = rows;
  for (std::int64_t i = 1; i < S; ++i) b[static_cast<std::size_t>(i)] = cut(gen);
  std::sort(b.begin(), b.end());
  return b;
}

// Every (rows, bounds) case: micro_shard_bounds and random uneven cuts for S in {1, 2, 3, 8, 64},
// rows below S (empty shards), and zero rows.
struct ShardCase {
  std::int64_t rows;
  Bounds bounds;
};
std::vector<ShardCase> shard_cases() {
  std::vector<ShardCase> cases;
  std::uint32_t seed = 100;
  for (std::int64_t S : {1, 2, 3, 8, 64})
    for (std::int64_t rows :
         {std::int64_t{0}, std::int64_t{5}, std::int64_t{37}, std::int64_t{130}}) {
      cases.push_back({rows, micro_shard_bounds(rows, S)});
      if (S > 1 && rows > 0) cases.push_back({rows, random_bounds(rows, S, seed++)});
    }
  return cases;
}

std::string bounds_str(const Bounds& b) {
  std::string s = "{";
  for (std::size_t i = 0; i < b.size(); ++i) s += (i ? ", " : "") + std::to_string(b[i]);
  return s + "}";
}

class MicroShards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 16;
    init_backend("sim", o);
  }
};

// ---- bounds helpers
// ------------------------------------------------------------------------------

TEST_F(MicroShards, MicroShardBoundsAreFloorOfIRowsOverK) {
  EXPECT_EQ(micro_shard_bounds(10, 4), (Bounds{0, 2, 5, 7, 10}));
  EXPECT_EQ(micro_shard_bounds(3, 8), (Bounds{0, 0, 0, 1, 1, 1, 2, 2, 3}));
  EXPECT_EQ(micro_shard_bounds(0, 2), (Bounds{0, 0, 0}));
  EXPECT_EQ(micro_shard_bounds(7, 1), (Bounds{0, 7}));
  for (std::int64_t rows : {1, 63, 64, 65, 1000, 123457})
    for (std::int64_t K : {1, 2, 3, 8, 64}) {
      const Bounds b = micro_shard_bounds(rows, K);
      ASSERT_EQ(b.size(), static_cast<std::size_t>(K) + 1);
      for (std::int64_t i = 0; i <= K; ++i)
        EXPECT_EQ(b[static_cast<std::size_t>(i)], (i * rows) / K) << rows << " " << K << " " << i;
    }
  // No overflow of i * rows for huge batches.
  const std::int64_t big = std::int64_t{1} << 60;
  EXPECT_EQ(micro_shard_bounds(big, 8)[7], big / 8 * 7);
}

TEST_F(MicroShards, LocalBoundsRebaseARunOfShards) {
  const Bounds g = micro_shard_bounds(10, 4);  // {0, 2, 5, 7, 10}
  EXPECT_EQ(local_bounds(g, 0, 4), g);
  EXPECT_EQ(local_bounds(g, 1, 3), (Bounds{0, 3, 5}));
  EXPECT_EQ(local_bounds(g, 3, 4), (Bounds{0, 3}));
}

TEST_F(MicroShards, BoundsHelperErrors) {
  EXPECT_THROW_MSG(micro_shard_bounds(10, 0), InvalidArgument,
                   "micro_shard_bounds: K: expected >= 1 micro-shards, got 0");
  EXPECT_THROW_MSG(micro_shard_bounds(-1, 4), InvalidArgument,
                   "micro_shard_bounds: rows: expected >= 0, got -1");
  const Bounds g = {0, 2, 5};
  EXPECT_THROW_MSG(local_bounds(g, 1, 1), InvalidArgument,
                   "local_bounds: [first_shard, last_shard): expected a non-empty range within "
                   "[0, 2), got [1, 1)");
  EXPECT_THROW_MSG(local_bounds(g, 0, 3), InvalidArgument, "got [0, 3)");
  EXPECT_THROW_MSG(local_bounds(g, -1, 1), InvalidArgument, "got [-1, 1)");
  EXPECT_THROW_MSG(local_bounds({0}, 0, 1), InvalidArgument,
                   "local_bounds: bounds: expected at least 2 entries");
  EXPECT_THROW_MSG(local_bounds({1, 2}, 0, 1), InvalidArgument,
                   "local_bounds: bounds: expected bounds[0] == 0, got 1");
  EXPECT_THROW_MSG(local_bounds({0, 3, 2}, 0, 1), InvalidArgument,
                   "expected non-decreasing row offsets, got bounds[1] = 3 > bounds[2] = 2");
}

// ---- kernels against the reference
// ---------------------------------------------------------------

TEST_F(MicroShards, GemmTnShardedEqualsScalarReferenceBitForBit) {
  // (M, N): small, and past one 64 x 256 tile of the kernel in both directions.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{3, 17}, {70, 260}};
  std::uint32_t seed = 1;
  for (const auto& [M, N] : shapes)
    for (const ShardCase& sc : shard_cases()) {
      if (M * N > 1000 && sc.bounds.size() > 9) continue;  // keep the big shape to S <= 8
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "M=" << M << " N=" << N << " rows=" << sc.rows
                     << " bounds=" << bounds_str(sc.bounds) << " accumulate=" << accumulate);
        const std::vector<float> a = mixed_values(static_cast<std::size_t>(sc.rows * M), seed++);
        const std::vector<float> b = mixed_values(static_cast<std::size_t>(sc.rows * N), seed++);
        const std::vector<float> c0 = mixed_values(static_cast<std::size_t>(M * N), seed++);
        Tensor ta = Tensor::from_vector(a, {sc.rows, M}, sim_device(1));
        Tensor tb = Tensor::from_vector(b, {sc.rows, N}, sim_device(1));
        Tensor tc = Tensor::from_vector(c0, {M, N}, sim_device(1));
        ops::gemm_tn_sharded(ta, tb, tc, sc.bounds, accumulate);
        std::vector<float> want = ref_gemm_tn_sharded(a, b, M, N, sc.bounds);
        if (accumulate)
          for (std::size_t i = 0; i < want.size(); ++i) want[i] = c0[i] + want[i];
        ASSERT_TRUE(bits_equal(tc.to_vector<float>(), want));
      }
    }
}

TEST_F(MicroShards, EmptyShardsGivePositiveZero) {
  // rows = 0: every partial is +0, so T is +0 and accumulate leaves c as it was (-0 + +0 = +0).
  Tensor ta = Tensor::zeros({0, 2}, DType::f32, sim_device(2));
  Tensor tb = Tensor::zeros({0, 3}, DType::f32, sim_device(2));
  Tensor tc = Tensor::full({2, 3}, -7.0f, sim_device(2));
  ops::gemm_tn_sharded(ta, tb, tc, {0, 0, 0}, false);
  for (float v : tc.to_vector<float>()) EXPECT_EQ(std::bit_cast<std::uint32_t>(v), 0u);
  Tensor x = Tensor::zeros({0, 4}, DType::f32, sim_device(2));
  Tensor out = Tensor::full({4}, -0.0f, sim_device(2));
  ops::sum_rows_sharded(x, out, {0, 0}, true);
  for (float v : out.to_vector<float>()) EXPECT_EQ(std::bit_cast<std::uint32_t>(v), 0u);
  Tensor s = ops::sum_sharded(Tensor::zeros({0}, DType::f32, sim_device(2)), {0, 0, 0, 0}, 3.0f);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(s.item()), 0u);
}

TEST_F(MicroShards, SumRowsShardedEqualsScalarReferenceBitForBit) {
  std::uint32_t seed = 500;
  for (std::int64_t cols : {1, 19, 1100})  // 1100: more than one 1024-column block
    for (const ShardCase& sc : shard_cases())
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cols=" << cols << " rows=" << sc.rows << " bounds="
                                          << bounds_str(sc.bounds) << " accumulate=" << accumulate);
        const std::vector<float> x = mixed_values(static_cast<std::size_t>(sc.rows * cols), seed++);
        const std::vector<float> o0 = mixed_values(static_cast<std::size_t>(cols), seed++);
        Tensor tx = Tensor::from_vector(x, {sc.rows, cols}, sim_device(3));
        Tensor out = Tensor::from_vector(o0, {cols}, sim_device(3));
        ops::sum_rows_sharded(tx, out, sc.bounds, accumulate);
        std::vector<float> want = ref_sum_rows_sharded(x, cols, sc.bounds);
        if (accumulate)
          for (std::size_t i = 0; i < want.size(); ++i) want[i] = o0[i] + want[i];
        ASSERT_TRUE(bits_equal(out.to_vector<float>(), want));
      }
}

TEST_F(MicroShards, SumShardedEqualsScalarReferenceBitForBit) {
  std::uint32_t seed = 900;
  for (const ShardCase& sc : shard_cases())
    for (float scale : {1.0f, 1.0f / 3.0f}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << sc.rows << " bounds=" << bounds_str(sc.bounds)
                                        << " scale=" << scale);
      const std::vector<float> x = mixed_values(static_cast<std::size_t>(sc.rows), seed++);
      Tensor tx = Tensor::from_vector(x, {sc.rows}, sim_device(4));
      const Tensor got = ops::sum_sharded(tx, sc.bounds, scale);
      EXPECT_EQ(got.dim(), 0);
      const float t = ref_sum_rows_sharded(x, 1, sc.bounds)[0];
      ASSERT_TRUE(bits_equal({got.item()}, {scale * t}));
    }
}

// ---- the property micro-shards exist for
// ---------------------------------------------------------

// Batch reductions of one Linear layer computed by D devices, each holding K / D consecutive
// micro-shards of the batch and reducing its rows with local bounds, the D partial results then
// combined with ops::sum_inputs in bitwise mode (the canonical tree over devices).
struct BatchGrads {
  std::vector<float> dw, db, loss;
};

BatchGrads reduce_on_devices(const std::vector<float>& dy, const std::vector<float>& x,
                             const std::vector<float>& losses, std::int64_t rows, std::int64_t M,
                             std::int64_t N, std::int64_t K, int D) {
  const Bounds global = micro_shard_bounds(rows, K);
  std::vector<Tensor> dws, dbs, ls;
  for (int d = 0; d < D; ++d) {
    const std::int64_t first = d * K / D, last = (d + 1) * K / D;
    const Bounds local = local_bounds(global, first, last);
    const std::int64_t r0 = global[static_cast<std::size_t>(first)], n = local.back();
    auto rows_of = [&](const std::vector<float>& v, std::int64_t width) {
      return std::vector<float>(v.begin() + r0 * width, v.begin() + (r0 + n) * width);
    };
    const Device dev = sim_device(d);
    Tensor tdy = Tensor::from_vector(rows_of(dy, M), {n, M}, dev);
    Tensor tx = Tensor::from_vector(rows_of(x, N), {n, N}, dev);
    Tensor tl = Tensor::from_vector(rows_of(losses, 1), {n}, dev);
    Tensor dw = Tensor::empty({M, N}, DType::f32, dev);
    Tensor db = Tensor::empty({M}, DType::f32, dev);
    ops::gemm_tn_sharded(tdy, tx, dw, local, /*accumulate=*/false);
    ops::sum_rows_sharded(tdy, db, local, /*accumulate=*/false);
    // The unscaled sum: scaling each device's part first would change the bits of the tree.
    ls.push_back(ops::sum_sharded(tl, local, 1.0f).view({1}).to(sim_device(0)));
    dws.push_back(dw.to(sim_device(0)));
    dbs.push_back(db.to(sim_device(0)));
  }
  Tensor dw = Tensor::empty({M, N}, DType::f32, sim_device(0));
  Tensor db = Tensor::empty({M}, DType::f32, sim_device(0));
  Tensor loss = Tensor::empty({1}, DType::f32, sim_device(0));
  ops::sum_inputs(dws, dw, Determinism::bitwise);
  ops::sum_inputs(dbs, db, Determinism::bitwise);
  ops::sum_inputs(ls, loss, Determinism::bitwise);
  return {dw.to_vector<float>(), db.to_vector<float>(), loss.to_vector<float>()};
}

TEST_F(MicroShards, SameBitsForOneTwoFourAndEightDevices) {
  const std::int64_t K = 64, M = 5, N = 7;
  for (std::int64_t rows : {64, 200}) {  // one row per shard; and 3-4 rows per shard
    SCOPED_TRACE(::testing::Message() << "rows=" << rows);
    const std::vector<float> dy = mixed_values(static_cast<std::size_t>(rows * M), 11);
    const std::vector<float> x = mixed_values(static_cast<std::size_t>(rows * N), 12);
    const std::vector<float> losses = mixed_values(static_cast<std::size_t>(rows), 13);
    const BatchGrads one = reduce_on_devices(dy, x, losses, rows, M, N, K, 1);
    // The single-device result is the reference's definition.
    const Bounds global = micro_shard_bounds(rows, K);
    ASSERT_TRUE(bits_equal(one.dw, ref_gemm_tn_sharded(dy, x, M, N, global)));
    ASSERT_TRUE(bits_equal(one.db, ref_sum_rows_sharded(dy, M, global)));
    ASSERT_TRUE(bits_equal(one.loss, ref_sum_rows_sharded(losses, 1, global)));
    for (int D : {2, 4, 8}) {
      SCOPED_TRACE(::testing::Message() << "D=" << D);
      const BatchGrads many = reduce_on_devices(dy, x, losses, rows, M, N, K, D);
      EXPECT_TRUE(bits_equal(many.dw, one.dw));
      EXPECT_TRUE(bits_equal(many.db, one.db));
      EXPECT_TRUE(bits_equal(many.loss, one.loss));
    }
    // Order matters on these data: a plain ascending reduction over all rows (the canonical GEMM
    // and row sum of bitwise mode without micro-shards) gives other bits.
    Tensor tdy = Tensor::from_vector(dy, {rows, M}, sim_device(0));
    Tensor tx = Tensor::from_vector(x, {rows, N}, sim_device(0));
    const Tensor plain_dw = ops::matmul(tdy, tx, /*trans_a=*/true, false, Determinism::bitwise);
    Tensor plain_db = Tensor::empty({M}, DType::f32, sim_device(0));
    ops::sum_rows(tdy, plain_db, 0.0f, Determinism::bitwise);
    const Tensor plain_loss =
        ops::sum(Tensor::from_vector(losses, {rows}, sim_device(0)), 1.0f, Determinism::bitwise);
    EXPECT_TRUE(any_bits_differ(plain_dw.to_vector<float>(), one.dw));
    EXPECT_TRUE(any_bits_differ(plain_db.to_vector<float>(), one.db));
    EXPECT_TRUE(any_bits_differ({plain_loss.item()}, one.loss));
  }
}

// ---- errors
// --------------------------------------------------------------------------------------

TEST_F(MicroShards, ArgumentErrors) {
  Tensor a = Tensor::zeros({6, 2}, DType::f32, sim_device(5));
  Tensor b = Tensor::zeros({6, 3}, DType::f32, sim_device(5));
  Tensor c = Tensor::zeros({2, 3}, DType::f32, sim_device(5));
  const Bounds ok = {0, 3, 6};
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b, c, {0}, false), InvalidArgument,
                   "ops::gemm_tn_sharded: bounds: expected at least 2 entries");
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b, c, {1, 6}, false), InvalidArgument,
                   "ops::gemm_tn_sharded: bounds: expected bounds[0] == 0, got 1");
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b, c, {0, 4, 3, 6}, false), InvalidArgument,
                   "ops::gemm_tn_sharded: bounds: expected non-decreasing row offsets, got "
                   "bounds[1] = 4 > bounds[2] = 3");
  EXPECT_THROW_MSG(
      ops::gemm_tn_sharded(a, b, c, {0, 3, 5}, false), InvalidArgument,
      "ops::gemm_tn_sharded: bounds: expected the last entry to equal rows = 6, got 5");
  Tensor b5 = Tensor::zeros({5, 3}, DType::f32, sim_device(5));
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b5, c, ok, false), InvalidArgument,
                   "ops::gemm_tn_sharded: b: expected [rows, N] with rows = 6");
  Tensor c_bad = Tensor::zeros({3, 2}, DType::f32, sim_device(5));
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b, c_bad, ok, false), InvalidArgument,
                   "ops::gemm_tn_sharded: c: expected [M, N] = [2, 3]");
  Tensor b_other = Tensor::zeros({6, 3}, DType::f32, sim_device(6));
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a, b_other, c, ok, false), InvalidArgument,
                   "ops::gemm_tn_sharded: b: expected a tensor on sim:5");
  Tensor big = Tensor::zeros({18, 2}, DType::f32, sim_device(5));
  Tensor a_shared = big.narrow(0, 6);  // c below is the first 6 floats of the same buffer
  Tensor c_shared = big.narrow(0, 3).view({2, 3});
  EXPECT_THROW_MSG(ops::gemm_tn_sharded(a_shared, b, c_shared, ok, false), InvalidArgument,
                   "ops::gemm_tn_sharded: c: must not share memory with a");

  Tensor x = Tensor::zeros({6, 4}, DType::f32, sim_device(5));
  Tensor out = Tensor::zeros({4}, DType::f32, sim_device(5));
  EXPECT_THROW_MSG(ops::sum_rows_sharded(x, out, {0, 7}, false), InvalidArgument,
                   "ops::sum_rows_sharded: bounds: expected the last entry to equal rows = 6");
  Tensor out3 = Tensor::zeros({3}, DType::f32, sim_device(5));
  EXPECT_THROW_MSG(ops::sum_rows_sharded(x, out3, ok, false), InvalidArgument,
                   "ops::sum_rows_sharded: out: expected [cols] = [4]");
  Tensor labels = Tensor::zeros({6}, DType::i64, sim_device(5));
  EXPECT_THROW_MSG(ops::sum_sharded(labels, ok, 1.0f), InvalidArgument,
                   "ops::sum_sharded: x: expected dtype f32");
  EXPECT_THROW_MSG(ops::sum_sharded(x, ok, 1.0f), InvalidArgument,
                   "ops::sum_sharded: x: expected a 1-dim tensor [n]");
  EXPECT_THROW_MSG(ops::sum_sharded(Tensor::zeros({6}, DType::f32, sim_device(5)), {0, 2}, 1.0f),
                   InvalidArgument,
                   "ops::sum_sharded: bounds: expected the last entry to equal "
                   "rows = 6, got 2");
  EXPECT_THROW_MSG(ops::sum_sharded(Tensor::zeros({6}, DType::f32, Device::cpu()), ok, 1.0f),
                   InvalidArgument, "ops::sum_sharded: x: expected a tensor on a device");
}

}  // namespace
}  // namespace ditto
