// The simulator's transformer kernels (sim_kernels_gpt.h): Note [GPT kernels] in
// core/numerics/gpt_math.h, evaluated on the host. Where a loop differs from gpt_math.h's
// reference functions it only interleaves independent chains (each keeps its order), which
// tests/test_gpt_ops.cpp checks bit for bit against those functions.
// sim_eigen.h first: its pragma must precede Eigen.
// clang-format off
#include "backend_sim/sim_eigen.h"
#include "backend_sim/sim_kernels_gpt.h"
// clang-format on

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/numerics/canonical_tree.h"
#include "core/numerics/gpt_math.h"
#include "core/numerics/philox.h"

namespace ditto::sim::gpt_kernels {

namespace {

using gpt::add;
using gpt::fma;
using gpt::mul;

// Copies the hd-wide column slice at `col` of T rows of stride `stride` into a transposed
// [hd, T] block: dst[i * T + u] = src[u * stride + col + i].
void transpose_head(const float* src, std::int64_t stride, std::int64_t col, std::int64_t T,
                    std::int64_t hd, float* dst) {
  for (std::int64_t u = 0; u < T; ++u) {
    const float* r = src + u * stride + col;
    for (std::int64_t i = 0; i < hd; ++i) dst[i * T + u] = r[i];
  }
}

// acc[u] = chain over i ascending of fma(a[i], kt[i * T + u], acc[u]) from 0.0f for u <= t: the
// dot products a . k_u of gpt::dot_chain, all u at once: blocks of kDotBlock keys held in
// registers across the whole chain (vectorised across u), the rest one key column at a time.
constexpr std::int64_t kDotBlock = 32;

void dots_transposed(const float* a, const float* kt, std::int64_t t, std::int64_t T,
                     std::int64_t hd, float* acc) {
  const std::int64_t n = t + 1, full = n - n % kDotBlock;
  for (std::int64_t u0 = 0; u0 < full; u0 += kDotBlock) {
    float blk[kDotBlock] = {};
    for (std::int64_t i = 0; i < hd; ++i) {
      const float ai = a[i];
      const float* __restrict k = kt + i * T + u0;
      for (std::int64_t j = 0; j < kDotBlock; ++j) blk[j] = fma(ai, k[j], blk[j]);
    }
    for (std::int64_t j = 0; j < kDotBlock; ++j) acc[u0 + j] = blk[j];
  }
  for (std::int64_t u = full; u < n; ++u) acc[u] = 0.0f;
  for (std::int64_t i = 0; i < hd; ++i) {
    const float ai = a[i];
    const float* __restrict k = kt + i * T;
    float* __restrict o = acc;
    for (std::int64_t u = full; u < n; ++u) o[u] = fma(ai, k[u], o[u]);
  }
}

// gpt::weighted_rows and gpt::attention_key_backward with the head width a constant, so that
// the hd accumulators stay in registers across the chain (the same operations in the same
// order); other widths take gpt_math.h's functions themselves.
template <int HD>
void weighted_rows_hd(const float* w, std::int64_t t, const float* rows, std::int64_t stride,
                      float* out) {
  float acc[HD] = {};
  for (std::int64_t u = 0; u <= t; ++u) {
    const float* __restrict r = rows + u * stride;
    const float a = w[u];
    for (int i = 0; i < HD; ++i) acc[i] = fma(a, r[i], acc[i]);
  }
  std::memcpy(out, acc, sizeof acc);
}

void weighted_rows(const float* w, std::int64_t t, const float* rows, std::int64_t stride,
                   std::int64_t hd, float* out) {
  if (hd == 32) return weighted_rows_hd<32>(w, t, rows, stride, out);
  if (hd == 64) return weighted_rows_hd<64>(w, t, rows, stride, out);
  gpt::weighted_rows(w, t, rows, stride, hd, out);
}

// dk_u = scale * chain_t fma(dpre[t, u], q_t), dv_u = chain_t fma(att[t, u], dy_t), t >= u (the
// chains of gpt::attention_key_backward over one head's rows of att and dpre held on the host,
// [T, T] each); with `scaled` false dk_u is the chain itself (attention with dropout: att_col
// then holds the dropped weights). HD > 0: the head width a constant, the chains in registers;
// HD == 0: `hd` wide, the chains accumulated in dk and dv themselves (the same operations).
template <int HD>
void key_backward_hd(const float* q0, std::int64_t q_stride, const float* g0, std::int64_t g_stride,
                     const float* att_col, const float* dpre_col, std::int64_t T, std::int64_t u,
                     float scale, float* dk, float* dv, bool scaled, std::int64_t hd = HD) {
  constexpr int kMax = HD > 0 ? HD : 1;
  float ak_fixed[kMax] = {}, av_fixed[kMax] = {};
  float* ak = HD > 0 ? ak_fixed : dk;
  float* av = HD > 0 ? av_fixed : dv;
  const std::int64_t n = HD > 0 ? HD : hd;
  if constexpr (HD == 0) {
    for (std::int64_t i = 0; i < n; ++i) ak[i] = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) av[i] = 0.0f;
  }
  for (std::int64_t t = u; t < T; ++t) {
    const float* __restrict q = q0 + t * q_stride;
    const float* __restrict g = g0 + t * g_stride;
    const float d = dpre_col[t * T], a = att_col[t * T];
    for (std::int64_t i = 0; i < n; ++i) ak[i] = fma(d, q[i], ak[i]);
    for (std::int64_t i = 0; i < n; ++i) av[i] = fma(a, g[i], av[i]);
  }
  for (std::int64_t i = 0; i < n; ++i) dk[i] = scaled ? mul(ak[i], scale) : ak[i];
  if constexpr (HD > 0) std::memcpy(dv, av, static_cast<std::size_t>(n) * sizeof(float));
}

void key_backward(std::int64_t hd, const float* q0, std::int64_t q_stride, const float* g0,
                  std::int64_t g_stride, const float* att_col, const float* dpre_col,
                  std::int64_t T, std::int64_t u, float scale, float* dk, float* dv, bool scaled) {
  if (hd == 32)
    return key_backward_hd<32>(q0, q_stride, g0, g_stride, att_col, dpre_col, T, u, scale, dk, dv,
                               scaled);
  if (hd == 64)
    return key_backward_hd<64>(q0, q_stride, g0, g_stride, att_col, dpre_col, T, u, scale, dk, dv,
                               scaled);
  key_backward_hd<0>(q0, q_stride, g0, g_stride, att_col, dpre_col, T, u, scale, dk, dv, scaled,
                     hd);
}

// For each batch b and head h: the head's slice at column `col` + h*hd of qkv [B, T, 3C]
// transposed into `slice` ([hd, T]), then f(b, h, base) with base = qkv's rows of batch b.
template <typename F>
void for_each_head(const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                   std::int64_t nh, std::int64_t col, std::vector<float>& slice, F&& f) {
  const std::int64_t hd = C / nh;
  slice.resize(static_cast<std::size_t>(hd * T));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < nh; ++h) {
      const float* base = qkv + b * T * 3 * C;
      transpose_head(base, 3 * C, col + h * hd, T, hd, slice.data());
      f(b, h, base);
    }
}

// The canonical tree (Note [Canonical tree]) over the shards [lo, hi) of one vocabulary row's
// scatter-add, skipping shards without its rows (exact: Note [GPT kernels], embedding_backward).
// rows[first, last) are the batch rows with that id, ascending; dst gets C floats; scratch
// holds C floats per tree level below. Returns false (dst untouched) when no row lies in [lo, hi).
bool vocab_tree(const float* dy, std::int64_t C, const std::vector<std::int64_t>& bounds,
                const std::int64_t* first, const std::int64_t* last, std::int64_t lo,
                std::int64_t hi, float* dst, float* scratch) {
  if (first == last) return false;
  if (hi - lo == 1) {
    for (std::int64_t c = 0; c < C; ++c) dst[c] = 0.0f;
    for (const std::int64_t* r = first; r != last; ++r) {
      const float* g = dy + *r * C;
      for (std::int64_t c = 0; c < C; ++c) dst[c] = add(dst[c], g[c]);
    }
    return true;
  }
  const std::int64_t mid = tree_mid(lo, hi);
  const std::int64_t* split = std::lower_bound(first, last, bounds[static_cast<std::size_t>(mid)]);
  const bool left = vocab_tree(dy, C, bounds, first, split, lo, mid, dst, scratch);
  const bool right = vocab_tree(dy, C, bounds, split, last, mid, hi, scratch, scratch + C);
  if (left && right)
    for (std::int64_t c = 0; c < C; ++c) dst[c] = add(dst[c], scratch[c]);
  else if (right)
    std::memcpy(dst, scratch, static_cast<std::size_t>(C) * sizeof(float));
  return true;
}

// Flops of one dropout mask element: Philox's 10 rounds of 2 multiplies and ~4 integer
// operations per 4 elements (as dropout_cost), and the comparison.
constexpr double kMaskFlops = 17.0;

// a[u] = drop.apply(row_index + u, x[u], s) for u <= t, one Philox block per 4 consecutive
// indices (dropout below: the same bits as gpt::AttentionDropout::apply element by element). a
// may alias x.
void dropped_row(const float* x, std::int64_t t, std::uint64_t row_index,
                 const gpt::AttentionDropout& drop, float* a) {
  dropout(x, a, t + 1, drop.p, drop.seed, drop.stream, drop.index_base + row_index);
}

}  // namespace

// ---- embedding ----------------------------------------------------------------------------------

void embedding_forward(const std::int64_t* idx, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t T, std::int64_t C, float* out) {
  for (std::int64_t r = 0; r < N; ++r)
    gpt::embedding_row(wte + idx[r] * C, wpe != nullptr ? wpe + (r % T) * C : nullptr, C,
                       out + r * C);
}

KernelCost embedding_forward_cost(std::int64_t N, std::int64_t C, bool wpe) {
  return KernelCost{wpe ? double(N) * C : 0.0, 4.0 * N * C * (wpe ? 3.0 : 2.0) + 8.0 * N};
}

void embedding_backward(const std::int64_t* idx, const float* dy, std::int64_t N, std::int64_t C,
                        std::int64_t V, const std::vector<std::int64_t>& bounds, float* grad_wte,
                        bool accumulate) {
  // Rows grouped by id, ascending within each id (a counting sort).
  std::vector<std::int64_t> start(static_cast<std::size_t>(V) + 1, 0),
      rows(static_cast<std::size_t>(N));
  for (std::int64_t r = 0; r < N; ++r) ++start[static_cast<std::size_t>(idx[r]) + 1];
  for (std::int64_t v = 0; v < V; ++v)
    start[static_cast<std::size_t>(v) + 1] += start[static_cast<std::size_t>(v)];
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  for (std::int64_t r = 0; r < N; ++r) rows[static_cast<std::size_t>(fill[idx[r]]++)] = r;
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  int depth = 0;
  for (std::int64_t p = 1; p < shards; p *= 2) ++depth;
  std::vector<float> work(static_cast<std::size_t>((depth + 1) * C));  // G, then a level each
  for (std::int64_t v = 0; v < V; ++v) {
    const std::int64_t* first = rows.data() + start[static_cast<std::size_t>(v)];
    const std::int64_t* last = rows.data() + start[static_cast<std::size_t>(v) + 1];
    float* g = grad_wte + v * C;
    float* G = work.data();
    if (!vocab_tree(dy, C, bounds, first, last, 0, shards, G, G + C)) std::fill(G, G + C, 0.0f);
    if (accumulate)
      for (std::int64_t c = 0; c < C; ++c) g[c] = add(g[c], G[c]);
    else
      std::memcpy(g, G, static_cast<std::size_t>(C) * sizeof(float));
  }
}

KernelCost embedding_backward_cost(std::int64_t N, std::int64_t C, std::int64_t V,
                                   bool accumulate) {
  return KernelCost{double(N) * C + (accumulate ? double(V) * C : 0.0),
                    4.0 * N * C + 8.0 * N + 4.0 * V * C * (accumulate ? 2.0 : 1.0)};
}

KernelCost embedding_backward_ex_cost(std::int64_t N, std::int64_t C, std::int64_t V,
                                      bool accumulate, DType storage, DType grad_type) {
  KernelCost c = embedding_backward_cost(N, C, V, accumulate);
  c.bytes = double(dtype_size(storage)) * N * C + 8.0 * N +
            double(dtype_size(grad_type)) * V * C * (accumulate ? 2.0 : 1.0);
  c.operands = storage;
  return c;
}

// ---- LayerNorm and GELU -------------------------------------------------------------------------

void layernorm_forward(const float* x, const float* w, const float* b, std::int64_t N,
                       std::int64_t C, float eps, float* y, float* mean, float* rstd) {
  for (std::int64_t r = 0; r < N; ++r)
    gpt::layernorm_row(x + r * C, w, b, C, eps, y + r * C, mean + r, rstd + r);
}

KernelCost layernorm_forward_cost(std::int64_t N, std::int64_t C) {
  return KernelCost{8.0 * N * C, 4.0 * (2.0 * N * C + 3.0 * C + 2.0 * N)};
}

KernelCost layernorm_forward_add_cost(std::int64_t N, std::int64_t C) {
  return KernelCost{9.0 * N * C, 4.0 * (4.0 * N * C + 3.0 * C + 2.0 * N)};
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, std::int64_t N, std::int64_t C, float* dx,
                        float* dy_xhat) {
  for (std::int64_t r = 0; r < N; ++r)
    gpt::layernorm_row_backward(dy + r * C, x + r * C, w, mean[r], rstd[r], C, dx + r * C,
                                dy_xhat + r * C);
}

KernelCost layernorm_backward_cost(std::int64_t N, std::int64_t C) {
  return KernelCost{14.0 * N * C, 4.0 * (4.0 * N * C + C + 2.0 * N)};
}

KernelCost layernorm_backward_add_cost(std::int64_t N, std::int64_t C) {
  return KernelCost{15.0 * N * C, 4.0 * (5.0 * N * C + C + 2.0 * N)};
}

// The branch-free tanh (pmath::tanh_branchless, the same bits as pmath::tanh): these loops
// vectorise, where the branches of the scalar tanh kept every element scalar (GELU was 36% of a
// 4-device GPT step in fast mode).
void gelu_forward(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = gpt::gelu<true>(x[i]);
}

void gelu_backward(const float* x, const float* gy, float* gx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) gx[i] = gpt::gelu_grad<true>(x[i], gy[i]);
}

KernelCost gelu_cost(std::int64_t n, bool backward) {
  // The portable tanh is about 20 flops (expm1 and a division).
  return KernelCost{(backward ? 35.0 : 26.0) * n, (backward ? 12.0 : 8.0) * n};
}

// ---- causal self-attention ----------------------------------------------------------------------

void attention_forward(const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                       std::int64_t nh, float* y, float* stats, const gpt::AttentionDropout& drop) {
  const std::int64_t hd = C / nh, W = 3 * C;
  const float scale = gpt::attention_scale(hd);
  std::vector<float> kt, row(static_cast<std::size_t>(T));  // one row of att, on the host
  std::vector<float> a(drop.active() ? static_cast<std::size_t>(T) : 0);  // one dropped row
  auto* st = reinterpret_cast<gpt::SoftmaxStats*>(stats);
  for_each_head(qkv, B, T, C, nh, C, kt, [&](std::int64_t b, std::int64_t h, const float* base) {
    for (std::int64_t t = 0; t < T; ++t) {
      dots_transposed(base + t * W + h * hd, kt.data(), t, T, hd, row.data());
      for (std::int64_t u = 0; u <= t; ++u) row[u] = mul(row[u], scale);
      st[(b * nh + h) * T + t] = gpt::causal_softmax_row(row.data(), t, T);
      const float* w = row.data();
      if (drop.active()) {  // a = dropout(att row): gpt::attention_query's dropped weights
        dropped_row(row.data(), t, gpt::attention_row_index(nh, T, b, h, t), drop, a.data());
        w = a.data();
      }
      weighted_rows(w, t, base + 2 * C + h * hd, W, hd, y + (b * T + t) * C + h * hd);
    }
  });
}

namespace {
// The (query t, key u <= t) pairs of all batches and heads: T (T + 1) / 2 per head.
double causal_pairs(std::int64_t B, std::int64_t T, std::int64_t nh) {
  return double(B) * nh * T * (T + 1) / 2.0;
}
}  // namespace

// Priced as a fused flash-attention kernel (Note [Attention memory] in core/numerics/gpt_math.h):
// reads qkv, writes y and the stats; no T^2 traffic. matmul_flops: q k^T and att v.
KernelCost attention_forward_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                                  bool dropout) {
  const double hd = double(C) / nh, pairs = causal_pairs(B, T, nh);
  // Per pair: q.k (2 hd), scale, exp (~20), sum, divide, att @ v (2 hd); with dropout a mask
  // element and its scaling.
  const double mask = dropout ? kMaskFlops + 1.0 : 0.0;
  KernelCost c{pairs * (4.0 * hd + 24.0 + mask),
               4.0 * (double(B) * T * 4.0 * C + 2.0 * double(B) * nh * T)};
  c.matmul_flops = pairs * 4.0 * hd;
  return c;
}

void attention_backward(const float* dy, const float* qkv, const float* stats, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t nh, float* dqkv,
                        float* scratch, const gpt::AttentionDropout& drop) {
  const std::int64_t hd = C / nh, W = 3 * C;
  const float scale = gpt::attention_scale(hd);
  const std::size_t TT = static_cast<std::size_t>(T * T);
  // One head's att and dpre (and dropped weights) on the host: the device holds only stats and
  // pd (scratch, [B, nh, T]).
  std::vector<float> vt, kt(static_cast<std::size_t>(hd * T)), att(TT), dpre(TT);
  std::vector<float> a(drop.active() ? TT : 0);
  const auto* st = reinterpret_cast<const gpt::SoftmaxStats*>(stats);
  for_each_head(qkv, B, T, C, nh, 2 * C, vt,
                [&](std::int64_t b, std::int64_t h, const float* base) {
                  transpose_head(base, W, C + h * hd, T, hd, kt.data());
                  const std::int64_t head = (b * nh + h) * T;
                  // att rows recomputed from the stats (gpt::causal_weights_row: the forward's
                  // bits).
                  for (std::int64_t t = 0; t < T; ++t) {
                    float* row = att.data() + t * T;
                    dots_transposed(base + t * W + h * hd, kt.data(), t, T, hd, row);
                    for (std::int64_t u = 0; u <= t; ++u) row[u] = mul(row[u], scale);
                    gpt::causal_weights_row(row, t, T, st[head + t]);
                  }
                  // Pass 1, per query t: dpre[t, :], pd and dq_t (gpt::attention_query_backward).
                  for (std::int64_t t = 0; t < T; ++t) {
                    float* row = dpre.data() + t * T;
                    const float* att_row = att.data() + t * T;
                    const std::uint64_t index = gpt::attention_row_index(nh, T, b, h, t);
                    dots_transposed(dy + (b * T + t) * C + h * hd, vt.data(), t, T, hd, row);
                    if (drop.active())
                      dropped_row(row, t, index, drop, row);  // da = keep ? dp * s : 0
                    scratch[head + t] = gpt::causal_softmax_row_backward(att_row, row, t, T);
                    float* dq = dqkv + (b * T + t) * W + h * hd;
                    if (drop.active()) {
                      for (std::int64_t u = 0; u <= t; ++u) row[u] = mul(row[u], scale);
                      weighted_rows(row, t, base + C + h * hd, W, hd, dq);
                      dropped_row(att_row, t, index, drop, a.data() + t * T);
                    } else {
                      weighted_rows(row, t, base + C + h * hd, W, hd, dq);
                      for (std::int64_t i = 0; i < hd; ++i) dq[i] = mul(dq[i], scale);
                    }
                  }
                  // Pass 2, per key u: dk_u and dv_u over the queries t >= u.
                  const float* w = drop.active() ? a.data() : att.data();
                  for (std::int64_t u = 0; u < T; ++u) {
                    float* dk = dqkv + (b * T + u) * W + C + h * hd;
                    key_backward(hd, base + h * hd, W, dy + b * T * C + h * hd, C, w + u,
                                 dpre.data() + u, T, u, scale, dk, dk + C, !drop.active());
                  }
                });
}

// A fused flash-attention backward (Note [Attention memory]): reads qkv, dy and the stats,
// writes dqkv (and pd); per pair the products as CUDA's two kernels make them
// (cuda_attention.cu, as attention_ex_cost counts them): the query kernel's first pass the
// score and dy.v (for pd), its second the score, dy.v and dpre @ k, the key kernel's the score,
// dy.v and the dk and dv updates: 9 products of 2 hd; the softmax and its backward (~26); with
// dropout the mask twice (dp and the weights of dv), two scalings and the score scale. Given y
// (d_from_y) the first pass is pd = rowsum(dy * y) instead: 7 products, 2 C FLOPs a token and
// y read once.
KernelCost attention_backward_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                                   bool dropout, bool d_from_y) {
  const double hd = double(C) / nh, pairs = causal_pairs(B, T, nh), tokens = double(B) * T;
  const double mask = dropout ? 2.0 * kMaskFlops + 3.0 : 0.0;
  const double products = d_from_y ? 7.0 : 9.0;
  KernelCost c{pairs * (2.0 * products * hd + 26.0 + mask) + (d_from_y ? 2.0 * tokens * C : 0.0),
               4.0 * (tokens * (d_from_y ? 8.0 : 7.0) * C + 3.0 * double(B) * nh * T)};
  c.matmul_flops = pairs * 2.0 * products * hd;
  return c;
}

// ---- dropout ------------------------------------------------------------------------------------

void dropout(const float* x, float* y, std::int64_t n, float p, std::uint64_t seed,
             std::uint64_t stream, std::uint64_t index_base) {
  const float scale = gpt::dropout_scale(p);
  std::uint32_t words[4];
  std::uint64_t block = ~std::uint64_t(0);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint64_t index = index_base + static_cast<std::uint64_t>(i);
    if ((index >> 2) != block) {  // one Philox block per 4 consecutive indices
      block = index >> 2;
      philox::block_at(seed, stream, block, words);
    }
    const bool kept = philox::to_uniform01(words[index & 3]) >= p;
    y[i] = gpt::dropout_apply(kept, x[i], scale);
  }
}

KernelCost dropout_cost(std::int64_t n) {
  // Philox: 10 rounds of 2 multiplies and ~4 integer operations per 4 elements.
  return KernelCost{17.0 * n, 8.0 * n};
}

// ---- sum of squares -----------------------------------------------------------------------------

float sum_squares(const float* x, std::int64_t n, Determinism mode) {
  if (n <= 0) return 0.0f;
  if (mode == Determinism::fast) return Eigen::Map<const Eigen::VectorXf>(x, n).squaredNorm();
  canonical::TreeStack<1, 64> tree;
  const std::int64_t blocks = gpt::squares_blocks(n);
  for (std::int64_t k = 0; k < blocks; ++k) {
    const std::int64_t lo = k * gpt::kSquaresBlock;
    float leaf[1] = {gpt::squares_chain(x + lo, std::min(gpt::kSquaresBlock, n - lo))};
    tree.push(k, leaf);
  }
  float root[1];
  tree.result(root);
  return root[0];
}

KernelCost sum_squares_cost(std::int64_t n) { return KernelCost{2.0 * n, 4.0 * n + 4}; }

}  // namespace ditto::sim::gpt_kernels
