// Attention with dropout on the weights (nanoGPT's attn_dropout; ops::attention /
// attention_backward with p > 0, Note [GPT kernels] in core/numerics/gpt_math.h) on the simulator:
// the kernels equal a plain host reference written here in the Note's order bit for bit, and
// gpt_math.h's row functions (which the CUDA kernels call); forward and backward against a double
// reference with the same mask (finite differences); the mask of rows [a, b) with index_base = a *
// nh*T*T is the slice of the whole batch's; p == 0 draws no mask; bad p is refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/numerics/gpt_math.h"
#include "core/numerics/random.h"
#include "core/runtime/ops.h"
#include "gpt_ops_reference.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using gpt_ref::to_double;
using gpt_ref::Vec;

using GptAttnDropout = SimSuite<8>;

namespace c = canonical;

struct Dims {
  std::int64_t B, T, C, nh;
  std::int64_t hd() const { return C / nh; }
  std::size_t qkv(std::int64_t b, std::int64_t t, int part, std::int64_t h, std::int64_t i) const {
    return static_cast<std::size_t>((b * T + t) * 3 * C + part * C + h * hd() + i);
  }
  std::size_t y(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) const {
    return static_cast<std::size_t>((b * T + t) * C + h * hd() + i);
  }
  std::size_t att(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t u) const {
    return static_cast<std::size_t>(((b * nh + h) * T + t) * T + u);
  }
};

struct Key {
  float p;
  std::uint64_t seed, stream, index_base;
};

std::vector<unsigned char> mask_of(const Dims& d, const Key& k) {
  std::vector<unsigned char> keep(static_cast<std::size_t>(d.B * d.nh * d.T * d.T));
  for (std::size_t i = 0; i < keep.size(); ++i)
    keep[i] = uniform01(k.seed, k.stream, k.index_base + i) >= k.p;  // random.h's
  return keep;
}

// The Note's order written out plainly, from att recomputed from the kernel's stats (which are
// checked against gpt_math.h below): y, and dqkv for dy.
void host_reference(const Dims& d, const Key& k, const std::vector<float>& x,
                    const std::vector<float>& att, const std::vector<float>& g,
                    std::vector<float>& y, std::vector<float>& dx) {
  const std::vector<unsigned char> keep = mask_of(d, k);
  const float s = c::div(1.0f, c::sub(1.0f, k.p));
  const float scale = static_cast<float>(1.0 / std::sqrt(double(d.hd())));
  std::vector<float> a(att.size()), dz(att.size(), 0.0f);
  for (std::size_t i = 0; i < att.size(); ++i) a[i] = keep[i] ? c::mul(att[i], s) : 0.0f;
  y.assign(static_cast<std::size_t>(d.B * d.T * d.C), 0.0f);
  dx.assign(x.size(), 0.0f);
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h) {
      for (std::int64_t t = 0; t < d.T; ++t) {
        for (std::int64_t i = 0; i < d.hd(); ++i) {
          float acc = 0.0f;
          for (std::int64_t u = 0; u <= t; ++u)
            acc = c::fma(a[d.att(b, h, t, u)], x[d.qkv(b, u, 2, h, i)], acc);
          y[d.y(b, t, h, i)] = acc;
        }
        std::vector<float> da(static_cast<std::size_t>(t + 1));
        float dot = 0.0f;
        for (std::int64_t u = 0; u <= t; ++u) {
          float acc = 0.0f;
          for (std::int64_t i = 0; i < d.hd(); ++i)
            acc = c::fma(g[d.y(b, t, h, i)], x[d.qkv(b, u, 2, h, i)], acc);
          da[u] = keep[d.att(b, h, t, u)] ? c::mul(acc, s) : 0.0f;  // s after the dot product
          dot = c::fma(att[d.att(b, h, t, u)], da[u], dot);
        }
        for (std::int64_t u = 0; u <= t; ++u)
          dz[d.att(b, h, t, u)] = c::mul(c::mul(att[d.att(b, h, t, u)], c::sub(da[u], dot)), scale);
      }
      for (std::int64_t i = 0; i < d.hd(); ++i)
        for (std::int64_t t = 0; t < d.T; ++t) {
          float q = 0.0f, kk = 0.0f, v = 0.0f;
          for (std::int64_t u = 0; u <= t; ++u)
            q = c::fma(dz[d.att(b, h, t, u)], x[d.qkv(b, u, 1, h, i)], q);
          for (std::int64_t w = t; w < d.T; ++w) {  // t as the key
            kk = c::fma(dz[d.att(b, h, w, t)], x[d.qkv(b, w, 0, h, i)], kk);
            v = c::fma(a[d.att(b, h, w, t)], g[d.y(b, w, h, i)], v);
          }
          dx[d.qkv(b, t, 0, h, i)] = q;
          dx[d.qkv(b, t, 1, h, i)] = kk;
          dx[d.qkv(b, t, 2, h, i)] = v;
        }
    }
}

// att [B, nh, T, T] from the kernel's stats, written plainly in the Note's order: s_u = (chain
// fma q.k) * scale, att = exp(s_u - m) / sum (Note [Attention memory]: the forward's bits).
std::vector<float> att_from_stats(const Dims& d, const std::vector<float>& x,
                                  const std::vector<float>& stats) {
  const float scale = gpt::attention_scale(d.hd());
  std::vector<float> att(static_cast<std::size_t>(d.B * d.nh * d.T * d.T), 0.0f);
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < d.T; ++t) {
        const std::size_t r = static_cast<std::size_t>(((b * d.nh + h) * d.T + t) * 2);
        for (std::int64_t u = 0; u <= t; ++u) {
          float acc = 0.0f;
          for (std::int64_t i = 0; i < d.hd(); ++i)
            acc = c::fma(x[d.qkv(b, t, 0, h, i)], x[d.qkv(b, u, 1, h, i)], acc);
          att[d.att(b, h, t, u)] =
              c::div(c::exp(c::sub(c::mul(acc, scale), stats[r])), stats[r + 1]);
        }
      }
  return att;
}

// gpt_math.h's per-query functions with the key (what the CUDA kernels run per thread): y, the
// stats, dx.
void gpt_math_rows(const Dims& d, const Key& k, const std::vector<float>& x,
                   const std::vector<float>& g, std::vector<float>& y, std::vector<float>& stats,
                   std::vector<float>& dx) {
  const gpt::AttentionDropout drop{k.p, k.seed, k.stream, k.index_base};
  y.assign(static_cast<std::size_t>(d.B * d.T * d.C), 0.0f);
  std::vector<gpt::SoftmaxStats> st(static_cast<std::size_t>(d.B * d.nh * d.T));
  std::vector<float> pd(st.size());
  dx.assign(x.size(), 0.0f);
  const auto at = [&](std::int64_t b, std::int64_t h, std::int64_t t) {
    return static_cast<std::size_t>((b * d.nh + h) * d.T + t);
  };
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < d.T; ++t)
        st[at(b, h, t)] =
            gpt::attention_query(x.data(), d.T, d.C, d.nh, b, t, h, &y[d.y(b, t, h, 0)], drop);
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h) {
      for (std::int64_t t = 0; t < d.T; ++t)
        pd[at(b, h, t)] =
            gpt::attention_query_backward(g.data(), x.data(), d.T, d.C, d.nh, b, t, h,
                                          st[at(b, h, t)], &dx[d.qkv(b, t, 0, h, 0)], drop);
      for (std::int64_t u = 0; u < d.T; ++u)
        gpt::attention_key_backward(g.data(), x.data(), st.data(), pd.data(), d.T, d.C, d.nh, b, u,
                                    h, &dx[d.qkv(b, u, 1, h, 0)], &dx[d.qkv(b, u, 2, h, 0)], drop);
    }
  stats.clear();
  for (const gpt::SoftmaxStats& s : st) {
    stats.push_back(s.m);
    stats.push_back(s.sum);
  }
}

TEST_F(GptAttnDropout, KernelsEqualTheHostReferenceAndGptMath) {
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(3) << 8) | 1);
  // The last two take the simulator's hd 32 and hd 64 loops.
  for (Dims d : {Dims{2, 7, 12, 3}, Dims{1, 1, 4, 1}, Dims{3, 16, 8, 2}, Dims{2, 9, 64, 2},
                 Dims{1, 6, 64, 1}})
    for (Key k : {Key{0.1f, 1337, stream, 0}, Key{0.5f, 7, stream + 1, (1ull << 32) - 5}}) {
      const std::vector<float> qkv = random_values(d.B * d.T * 3 * d.C, 40, -2, 2);
      const std::vector<float> dy = random_values(d.B * d.T * d.C, 41);
      const Tensor tqkv = upload(qkv, {d.B, d.T, 3 * d.C});
      Tensor att, att0;
      const Tensor y = ops::attention(tqkv, d.nh, att, k.p, k.seed, k.stream, k.index_base);
      const Tensor y0 = ops::attention(tqkv, d.nh, att0);
      const Tensor dqkv = ops::attention_backward(upload(dy, {d.B, d.T, d.C}), tqkv, att, d.nh, k.p,
                                                  k.seed, k.stream, k.index_base);
      // The stats are of the un-dropped softmax: the bits of the call without dropout.
      EXPECT_TRUE(bits_equal(att.to_vector<float>(), att0.to_vector<float>()));
      std::vector<float> y_ref, dx_ref, y_rows, att_rows, dx_rows;
      host_reference(d, k, qkv, att_from_stats(d, qkv, att.to_vector<float>()), dy, y_ref, dx_ref);
      gpt_math_rows(d, k, qkv, dy, y_rows, att_rows, dx_rows);
      EXPECT_TRUE(bits_equal(y.to_vector<float>(), y_ref)) << "T " << d.T << " p " << k.p;
      EXPECT_TRUE(bits_equal(dqkv.to_vector<float>(), dx_ref)) << "T " << d.T << " p " << k.p;
      EXPECT_TRUE(bits_equal(y_rows, y_ref));
      EXPECT_TRUE(bits_equal(att_rows, att.to_vector<float>()));
      EXPECT_TRUE(bits_equal(dx_rows, dx_ref));
      if (d.T > 1) {  // something was dropped: the output is not the undropped one
        EXPECT_FALSE(bits_equal(y.to_vector<float>(), y0.to_vector<float>()));
      }
    }
}

// Double-precision nanoGPT attention with the fixed mask: y = (keep * att / (1 - p)) v.
Vec dropped_attention(const Vec& x, const Dims& d, const std::vector<unsigned char>& keep,
                      double p) {
  Vec att;
  gpt_ref::attention(x, d.B, d.T, d.C, d.nh, &att);
  Vec y(static_cast<std::size_t>(d.B * d.T * d.C), 0.0);
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < d.T; ++t)
        for (std::int64_t u = 0; u <= t; ++u) {
          const double a = keep[d.att(b, h, t, u)] ? att[d.att(b, h, t, u)] / (1 - p) : 0.0;
          for (std::int64_t i = 0; i < d.hd(); ++i)
            y[d.y(b, t, h, i)] += a * x[d.qkv(b, u, 2, h, i)];
        }
  return y;
}

TEST_F(GptAttnDropout, MatchesTheDoubleReferenceAndFiniteDifferences) {
  const Dims d{2, 6, 8, 2};
  const Key k{0.3f, 99, stream_id(kStreamDropout, 5), 17};
  const std::vector<float> qkv = random_values(d.B * d.T * 3 * d.C, 42, -1.5, 1.5);
  const std::vector<float> dy = random_values(d.B * d.T * d.C, 43);
  const std::vector<unsigned char> keep = mask_of(d, k);
  const Tensor tqkv = upload(qkv, {d.B, d.T, 3 * d.C});
  Tensor att;
  const Tensor y = ops::attention(tqkv, d.nh, att, k.p, k.seed, k.stream, k.index_base);
  const Vec want = dropped_attention(to_double(qkv), d, keep, k.p);
  const Vec got = to_double(y);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
  const Vec dyd = to_double(dy);
  const Vec fd = gpt_ref::finite_differences(
      [&](const Vec& v) { return gpt_ref::dot(dyd, dropped_attention(v, d, keep, k.p)); },
      to_double(qkv));
  const Vec dq = to_double(ops::attention_backward(upload(dy, {d.B, d.T, d.C}), tqkv, att, d.nh,
                                                   k.p, k.seed, k.stream, k.index_base));
  double scale = 0;
  for (double v : fd) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.1);
  for (std::size_t i = 0; i < dq.size(); ++i)
    ASSERT_NEAR(dq[i], fd[i], 1e-4 * std::fabs(fd[i]) + 1e-5 * scale) << i;
}

// Note [Dropout masks]: a replica holding rows [a, b) with index_base = a * nh*T*T computes the
// slice of the whole batch's y and dqkv.
TEST_F(GptAttnDropout, RowSliceWithItsIndexBaseIsTheSlice) {
  const Dims d{4, 9, 8, 2};
  const std::int64_t per_row = d.nh * d.T * d.T;
  const Key k{0.2f, 5, stream_id(kStreamDropout, (std::uint64_t(11) << 8) | 4), 0};
  const std::vector<float> qkv = random_values(d.B * d.T * 3 * d.C, 44, -2, 2);
  const std::vector<float> dy = random_values(d.B * d.T * d.C, 45);
  const Tensor tqkv = upload(qkv, {d.B, d.T, 3 * d.C});
  Tensor att;
  const std::vector<float> y =
      ops::attention(tqkv, d.nh, att, k.p, k.seed, k.stream, 0).to_vector<float>();
  const std::vector<float> dx = ops::attention_backward(upload(dy, {d.B, d.T, d.C}), tqkv, att,
                                                        d.nh, k.p, k.seed, k.stream, 0)
                                    .to_vector<float>();
  for (auto [a, b] : {std::pair<std::int64_t, std::int64_t>{1, 3}, {3, 4}, {0, 2}}) {
    const std::size_t qw = static_cast<std::size_t>(d.T * 3 * d.C),
                      yw = static_cast<std::size_t>(d.T * d.C);
    const std::vector<float> sq(qkv.begin() + a * qw, qkv.begin() + b * qw);
    const std::vector<float> sdy(dy.begin() + a * yw, dy.begin() + b * yw);
    const std::uint64_t base = static_cast<std::uint64_t>(a * per_row);
    const Tensor tq = upload(sq, {b - a, d.T, 3 * d.C});
    Tensor satt;
    const std::vector<float> sy =
        ops::attention(tq, d.nh, satt, k.p, k.seed, k.stream, base).to_vector<float>();
    const std::vector<float> sdx = ops::attention_backward(upload(sdy, {b - a, d.T, d.C}), tq, satt,
                                                           d.nh, k.p, k.seed, k.stream, base)
                                       .to_vector<float>();
    EXPECT_TRUE(bits_equal(sy, std::vector<float>(y.begin() + a * yw, y.begin() + b * yw)))
        << "rows " << a << ".." << b;
    EXPECT_TRUE(bits_equal(sdx, std::vector<float>(dx.begin() + a * qw, dx.begin() + b * qw)))
        << "rows " << a << ".." << b;
    // Without the base the replica would draw the first rows' mask: different bits.
    Tensor watt;
    const std::vector<float> wy =
        ops::attention(tq, d.nh, watt, k.p, k.seed, k.stream, 0).to_vector<float>();
    if (a > 0) {
      EXPECT_FALSE(bits_equal(wy, sy)) << "rows " << a << ".." << b;
    }
  }
}

TEST_F(GptAttnDropout, ZeroPDrawsNoMaskAndBadPIsRefused) {
  const Dims d{2, 5, 8, 2};
  const std::vector<float> qkv = random_values(d.B * d.T * 3 * d.C, 46, -2, 2);
  const std::vector<float> dy = random_values(d.B * d.T * d.C, 47);
  const Tensor tqkv = upload(qkv, {d.B, d.T, 3 * d.C}), tdy = upload(dy, {d.B, d.T, d.C});
  Tensor att0, att1;
  const Tensor y0 = ops::attention(tqkv, d.nh, att0);
  const Tensor y1 = ops::attention(tqkv, d.nh, att1, 0.0f, 123, 456, 789);
  EXPECT_TRUE(bits_equal(y0.to_vector<float>(), y1.to_vector<float>()));
  EXPECT_TRUE(bits_equal(
      ops::attention_backward(tdy, tqkv, att0, d.nh).to_vector<float>(),
      ops::attention_backward(tdy, tqkv, att0, d.nh, 0.0f, 123, 456, 789).to_vector<float>()));
  for (float p : {1.0f, -0.1f, 1.5f}) {
    expect_invalid([&] { ops::attention(tqkv, d.nh, att1, p, 1, 2, 3); },
                   "ops::attention: p: expected a drop probability in [0, 1)");
    expect_invalid([&] { ops::attention_backward(tdy, tqkv, att0, d.nh, p, 1, 2, 3); },
                   "ops::attention_backward: p: expected a drop probability in [0, 1)");
  }
}

}  // namespace
}  // namespace ditto
