// Bits of the transformer kernels (Note [GPT kernels], Note [Dropout masks] in
// core/numerics/gpt_math.h): the simulator's kernels equal gpt_math.h's reference row functions
// (which the CUDA kernels call) bit for bit; embedding_backward over micro-shards gives the same
// bits on 1, 2, 4 and 8 devices and equals the canonical tree written out by hand, as does
// sum_squares over its blocks; dropout masks are Philox's, the same for any slice of the rows;
// philox.h equals random.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numerics/canonical_math.h"
#include "core/numerics/determinism.h"
#include "core/numerics/gpt_math.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/philox.h"
#include "core/numerics/random.h"
#include "core/runtime/ops.h"
#include "gpt_ops_reference.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using GptBits = SimSuite<8>;

/// The canonical tree (Note [Canonical tree]) over leaves[lo, hi), elementwise, by recursion.
std::vector<float> hand_tree(const std::vector<std::vector<float>>& leaves, std::int64_t lo,
                             std::int64_t hi) {
  if (hi - lo == 1) return leaves[static_cast<std::size_t>(lo)];
  const std::int64_t mid = tree_mid(lo, hi);
  std::vector<float> l = hand_tree(leaves, lo, mid);
  const std::vector<float> r = hand_tree(leaves, mid, hi);
  for (std::size_t i = 0; i < l.size(); ++i) l[i] = l[i] + r[i];
  return l;
}

TEST(GptPhilox, EqualsRandomCpp) {
  const std::uint64_t seeds[] = {0, 1, 1337, 0xFFFFFFFFull, 0x123456789ABCDEF0ull, ~0ull};
  const std::uint64_t streams[] = {0, stream_id(kStreamDropout, (7u << 8) | 3),
                                   stream_id(kStreamSample, 0), stream_id(kStreamBatch, 99), ~0ull};
  int checked = 0;
  for (std::uint64_t seed : seeds)
    for (std::uint64_t stream : streams)
      for (std::uint64_t k = 0; k < 600; ++k) {
        // Small indices, indices across the 2^32 block boundary and huge ones.
        const std::uint64_t index = k < 200   ? k
                                    : k < 400 ? (std::uint64_t(1) << 34) - 300 + k
                                              : ~0ull - k;
        ASSERT_EQ(philox::u32(seed, stream, index), philox_u32(seed, stream, index))
            << "seed " << seed << " stream " << stream << " index " << index;
        ASSERT_EQ(bits(philox::uniform01(seed, stream, index)),
                  bits(uniform01(seed, stream, index)));
        ++checked;
      }
  EXPECT_EQ(checked, 6 * 5 * 600);
  const std::uint32_t ctr[4] = {1, 2, 3, 4}, key[2] = {5, 6};
  std::uint32_t a[4], b[4];
  philox::block(ctr, key, a);
  philox4x32_10(ctr, key, b);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a[i], b[i]);
}

// The simulator's attention interleaves the chains of gpt_math.h (keys transposed per head,
// blocks of 32 keys, head widths 32 and 64 held in registers, one head's att rows held on the
// host in backward); the bits (y, the stats, dqkv) must be those of the per-query reference
// functions, which recompute every score, run here on the host.
void expect_attention_is_gpt_math(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh) {
  const std::int64_t hd = C / nh;
  std::vector<float> qkv = mixed_values(B * T * 3 * C, 30);
  for (float& x : qkv) x *= 1e-3f;  // |scores| moderate: every exp contributes
  const std::vector<float> dy = mixed_values(B * T * C, 31);
  std::vector<float> y(B * T * C), stats, dqkv(B * T * 3 * C);
  std::vector<gpt::SoftmaxStats> st(B * nh * T);
  std::vector<float> pd(B * nh * T);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        st[(b * nh + h) * T + t] =
            gpt::attention_query(qkv.data(), T, C, nh, b, t, h, &y[(b * T + t) * C + h * hd]);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h) {
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t i = (b * nh + h) * T + t;
        pd[i] = gpt::attention_query_backward(dy.data(), qkv.data(), T, C, nh, b, t, h, st[i],
                                              &dqkv[(b * T + t) * 3 * C + h * hd]);
      }
      for (std::int64_t u = 0; u < T; ++u) {
        float* dk = &dqkv[(b * T + u) * 3 * C + C + h * hd];
        gpt::attention_key_backward(dy.data(), qkv.data(), st.data(), pd.data(), T, C, nh, b, u, h,
                                    dk, dk + C);
      }
    }
  for (const gpt::SoftmaxStats& s : st) {
    stats.push_back(s.m);
    stats.push_back(s.sum);
  }
  const Tensor tqkv = upload(qkv, {B, T, 3 * C});
  Tensor tatt;
  const Tensor ty = ops::attention(tqkv, nh, tatt);
  SCOPED_TRACE(::testing::Message() << B << "x" << T << "x" << C << " heads " << nh);
  EXPECT_TRUE(bits_equal(ty.to_vector<float>(), y));
  EXPECT_TRUE(bits_equal(tatt.to_vector<float>(), stats));
  const Tensor tdq = ops::attention_backward(upload(dy, {B, T, C}), tqkv, tatt, nh);
  EXPECT_TRUE(bits_equal(tdq.to_vector<float>(), dqkv));
}

TEST_F(GptBits, AttentionEqualsGptMathReference) {
  expect_attention_is_gpt_math(2, 7, 12, 3);   // hd 4
  expect_attention_is_gpt_math(1, 40, 64, 2);  // hd 32, a full block of 32 keys and a tail
  expect_attention_is_gpt_math(2, 33, 64, 1);  // hd 64
}

// causal_softmax_row takes exp_nonpositive where it equals canonical::exp and canonical::exp
// elsewhere: the same bits as the plain loop of Note [GPT kernels], at the range's edge too.
TEST(GptMath, CausalSoftmaxRowIsThePlainSoftmax) {
  const float inf = INFINITY, nan = NAN;
  const std::vector<std::vector<float>> rows = {
      {0.0f, -1.0f, 3.5f, -80.0f, -86.0f, -86.5f, -100.0f, -200.0f, -inf, 2.0f},
      {-inf, 5.0f, 5.0f - 86.0f, 5.0f - 85.99f, 5.0f - 86.01f, 5.0f - 103.9f, 5.0f - 104.1f},
      {1.0f, nan, 2.0f},
      {inf, 1.0f},
      {-inf, -inf},
      {0.25f}};
  for (const std::vector<float>& s : rows) {
    const auto n = static_cast<std::int64_t>(s.size());
    std::vector<float> want(n + 2, 0.0f), got(s);
    float m = -inf, sum = 0.0f;
    for (float x : s) m = m < x ? x : m;
    for (std::int64_t u = 0; u < n; ++u) sum = sum + (want[u] = canonical::exp(s[u] - m));
    for (std::int64_t u = 0; u < n; ++u) want[u] = want[u] / sum;
    got.resize(n + 2, 5.0f);
    gpt::causal_softmax_row(got.data(), n - 1, n + 2);
    EXPECT_TRUE(bits_equal(got, want)) << "row of " << n;
  }
  for (float x = -86.0f; x <= 0.0f; x += 0.37f)
    ASSERT_EQ(bits(gpt::exp_nonpositive(x)), bits(canonical::exp(x))) << x;
  EXPECT_EQ(bits(gpt::exp_nonpositive(gpt::kExpFastMin)), bits(canonical::exp(gpt::kExpFastMin)));
}

TEST_F(GptBits, LayerNormAndGeluEqualGptMathReference) {
  const std::int64_t N = 5, C = 33;
  const std::vector<float> x = mixed_values(N * C, 32), w = mixed_values(C, 33);
  const std::vector<float> b = mixed_values(C, 34), dy = mixed_values(N * C, 35);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dxh(N * C), g(N * C), gg(N * C);
  for (std::int64_t r = 0; r < N; ++r) {
    gpt::layernorm_row(&x[r * C], w.data(), b.data(), C, 1e-5f, &y[r * C], &mean[r], &rstd[r]);
    gpt::layernorm_row_backward(&dy[r * C], &x[r * C], w.data(), mean[r], rstd[r], C, &dx[r * C],
                                &dxh[r * C]);
  }
  for (std::int64_t i = 0; i < N * C; ++i) {
    g[i] = gpt::gelu(x[i] * 1e-3f);
    gg[i] = gpt::gelu_grad(x[i] * 1e-3f, dy[i]);
  }
  Tensor tm, tr, tdxh;
  const Tensor tx = upload(x, {N, C}), tw = upload(w, {C});
  const Tensor ty = ops::layernorm(tx, tw, upload(b, {C}), 1e-5f, tm, tr);
  EXPECT_TRUE(bits_equal(ty.to_vector<float>(), y));
  EXPECT_TRUE(bits_equal(tm.to_vector<float>(), mean));
  EXPECT_TRUE(bits_equal(tr.to_vector<float>(), rstd));
  const Tensor tdx = ops::layernorm_backward(upload(dy, {N, C}), tx, tw, tm, tr, tdxh);
  EXPECT_TRUE(bits_equal(tdx.to_vector<float>(), dx));
  EXPECT_TRUE(bits_equal(tdxh.to_vector<float>(), dxh));
  std::vector<float> xs(x);
  for (float& v : xs) v *= 1e-3f;
  const Tensor txs = upload(xs, {N * C});
  EXPECT_TRUE(bits_equal(ops::gelu(txs).to_vector<float>(), g));
  EXPECT_TRUE(bits_equal(ops::gelu_backward(txs, upload(dy, {N * C})).to_vector<float>(), gg));
}

// Note [Dropout masks]: element i is kept iff uniform01(seed, stream, index_base + i) >= p
// (random.cpp's), and a replica holding rows [a, b) with index_base = a * row draws the slice
// of the one-device mask.
TEST_F(GptBits, DropoutMaskIsPhiloxAndSlicesAgree) {
  const std::int64_t rows = 12, E = 37;  // E odd: slices start mid Philox block
  const float p = 0.25f, scale = 1.0f / (1.0f - p);
  const std::uint64_t seed = 7, stream = stream_id(kStreamDropout, (3u << 8) | 1);
  const std::vector<float> x = mixed_values(rows * E, 36);
  const std::vector<float> full =
      ops::dropout(upload(x, {rows, E}), p, seed, stream, 0).to_vector<float>();
  for (std::int64_t i = 0; i < rows * E; ++i) {
    const bool kept = uniform01(seed, stream, static_cast<std::uint64_t>(i)) >= p;
    ASSERT_EQ(bits(full[i]), bits(kept ? x[i] * scale : 0.0f)) << i;
  }
  for (auto [a, b] : {std::pair<std::int64_t, std::int64_t>{0, 6}, {6, 12}, {3, 4}, {5, 11}}) {
    const std::vector<float> part(x.begin() + a * E, x.begin() + b * E);
    const Device dev("sim", static_cast<int>(a % 8));
    const std::vector<float> got =
        ops::dropout(upload(part, {b - a, E}, dev), p, seed, stream, a * E).to_vector<float>();
    EXPECT_TRUE(bits_equal(got, std::vector<float>(full.begin() + a * E, full.begin() + b * E)))
        << "rows [" << a << ", " << b << ")";
  }
  // A different step or site draws a different mask.
  const std::vector<float> other =
      ops::dropout(upload(x, {rows, E}), p, seed, stream_id(kStreamDropout, (4u << 8) | 1), 0)
          .to_vector<float>();
  EXPECT_TRUE(any_bits_differ(other, full));
}

// embedding_backward over K micro-shards of the token rows (sample bounds scaled by T): D
// devices each reduce their K / D shards, the D results combined by the canonical tree
// (ops::sum_inputs, bitwise) equal the one-device result and the tree written out by hand,
// bit for bit; fast mode's single shard is the ordered scatter-add.
TEST_F(GptBits, EmbeddingBackwardIsTheSameOnOneToEightDevices) {
  const std::int64_t B = 16, T = 5, C = 6, V = 9, K = 16, N = B * T;
  std::vector<std::int64_t> idx(N);
  for (std::int64_t i = 0; i < N; ++i) idx[i] = (i * i * 3 + i / 7) % (V - 1);  // id V-1 absent
  const std::vector<float> dy = mixed_values(N * C, 37);
  std::vector<std::int64_t> bounds = micro_shard_bounds(B, K);
  for (std::int64_t& x : bounds) x *= T;
  // By hand: per shard, per id, the ascending chain from 0; the canonical tree over all shards.
  std::vector<std::vector<float>> leaves;
  for (std::int64_t s = 0; s < K; ++s) {
    std::vector<float> leaf(V * C, 0.0f);
    for (std::int64_t r = bounds[s]; r < bounds[s + 1]; ++r)
      for (std::int64_t c = 0; c < C; ++c) leaf[idx[r] * C + c] += dy[r * C + c];
    leaves.push_back(leaf);
  }
  std::vector<float> want = hand_tree(leaves, 0, K);
  const std::vector<float> prior = mixed_values(V * C, 38);
  for (bool accumulate : {false, true}) {
    std::vector<float> expect = want;
    if (accumulate)
      for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = prior[i] + want[i];
    for (int D : {1, 2, 4, 8}) {
      std::vector<Tensor> parts;
      for (int d = 0; d < D; ++d) {
        const std::vector<std::int64_t> local = local_bounds(bounds, d * K / D, (d + 1) * K / D);
        const std::int64_t r0 = bounds[d * K / D], r1 = bounds[(d + 1) * K / D];
        const Device dev("sim", d);
        const Tensor tidx = Tensor::from_vector(
            std::vector<std::int64_t>(idx.begin() + r0, idx.begin() + r1), {r1 - r0}, dev);
        Tensor g = Tensor::zeros({V, C}, DType::f32, dev);
        ops::embedding_backward(
            tidx,
            upload(std::vector<float>(dy.begin() + r0 * C, dy.begin() + r1 * C), {r1 - r0, C}, dev),
            g, local, false);
        parts.push_back(g.to(kOpsDevice));
      }
      Tensor total = upload(accumulate ? prior : std::vector<float>(V * C, 0.0f), {V, C});
      Tensor sum = Tensor::zeros({V, C}, DType::f32, kOpsDevice);
      ops::sum_inputs(parts, sum, Determinism::bitwise);
      total = accumulate ? ops::add(total, sum) : sum;
      EXPECT_TRUE(bits_equal(total.to_vector<float>(), expect)) << D << " devices";
    }
    // One device, all shards, accumulating in the kernel itself.
    Tensor g1 = upload(accumulate ? prior : std::vector<float>(V * C, 7.0f), {V, C});
    ops::embedding_backward(Tensor::from_vector(idx, {B, T}, kOpsDevice), upload(dy, {B, T, C}), g1,
                            bounds, accumulate);
    EXPECT_TRUE(bits_equal(g1.to_vector<float>(), expect)) << "accumulate " << accumulate;
  }
  // Fast mode's bounds {0, N}: one ascending scatter-add per id.
  std::vector<float> ordered(V * C, 0.0f);
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t c = 0; c < C; ++c) ordered[idx[r] * C + c] += dy[r * C + c];
  Tensor g = Tensor::zeros({V, C}, DType::f32, kOpsDevice);
  ops::embedding_backward(Tensor::from_vector(idx, {B, T}, kOpsDevice), upload(dy, {B, T, C}), g,
                          {0, N}, false);
  EXPECT_TRUE(bits_equal(g.to_vector<float>(), ordered));
  EXPECT_TRUE(any_bits_differ(ordered, want));  // the inputs do show the order
}

// sum_squares, bitwise: blocks of kSquaresBlock, each an fma chain, combined by the canonical
// tree over the block index.
TEST_F(GptBits, SumSquaresBitwiseIsTheBlockTree) {
  for (std::int64_t n : {0, 1, 4096, 4097, 5 * 4096 + 3, 9 * 4096}) {
    const std::vector<float> x = mixed_values(static_cast<std::size_t>(n), 39);
    float want = 0.0f;
    if (n > 0) {
      std::vector<std::vector<float>> leaves;
      for (std::int64_t lo = 0; lo < n; lo += gpt::kSquaresBlock) {
        float acc = 0.0f;
        for (std::int64_t i = lo; i < std::min(n, lo + gpt::kSquaresBlock); ++i)
          acc = std::fma(x[i], x[i], acc);
        leaves.push_back({acc});
      }
      want = hand_tree(leaves, 0, static_cast<std::int64_t>(leaves.size()))[0];
    }
    const float got = ops::sum_squares(upload(x, {n}), Determinism::bitwise).item();
    EXPECT_EQ(bits(got), bits(want)) << n;
  }
}

}  // namespace
}  // namespace ditto
