// The transformer kernels' arithmetic (Kernels::embedding_forward .. sum_squares in
// core/runtime/backend.h) as DITTO_HD row-level functions, shared by the simulator
// (backend_sim/sim_kernels_gpt.cpp) and the CUDA kernels, so both evaluate the same IEEE 754
// operations in the same order and agree bit for bit (../DESIGN.md, "The determinism contract").
//
// Note [GPT kernels]
// Every rounding is spelled with canonical_math.h's add/sub/mul/div/fma (Note [Rounded
// primitives]); exp and tanh are the portable ones (Note [Portable math]). Every accumulation is
// one chain in ascending index order starting from 0.0f. Implementations may run rows, queries,
// keys and output elements in any order or in parallel, and may vectorise across independent
// chains, but must never split, reorder or re-associate a chain. Per kernel:
//   embedding_forward   out[r, c] = add(wte[idx[r], c], wpe[r % T, c])   (wte only if no wpe)
//   embedding_backward  per vocabulary row v and shard s: chain acc = add(acc, dy[r, c]) over the
//                       rows r of s with idx[r] == v, ascending; shards combined by the canonical
//                       tree (Note [Canonical tree]); then grad = accumulate ? add(grad, G) : G,
//                       for every v (also those absent from the batch, G = +0). A chain from
//                       +0.0f never yields -0.0f and neither does add of two such values, so
//                       add(+0, x) == x for every partial: a kernel may skip the shards (or
//                       subtrees) where v is absent and gets the same bits.
//   layernorm_row       mean = div(chain add x, C); var = div(chain fma(d, d) with d = sub(x,
//                       mean), C); rstd = div(1, sqrt(add(var, eps))); xhat = mul(sub(x, mean),
//                       rstd); y = b ? fma(xhat, w, b) : mul(xhat, w)
//   layernorm_row_backward  g = mul(dy, w); xhat as above; sg = chain add g; sgx = chain
//                       fma(g, xhat); dx = mul(rstd, sub(sub(g, div(sg, C)), mul(xhat, div(sgx,
//                       C)))); dy_xhat = mul(dy, xhat)
//   gelu, gelu_grad     below (tanh form, constants float(sqrt(2/pi)) and 0.044715f)
//   attention_query     per (b, h, t): s_u = mul(chain_i fma(q[i], k_u[i]), scale) for u <= t;
//                       m = max s_u (std::max fold from -inf); e_u = exp(sub(s_u, m)); sum =
//                       chain add e_u; att[u] = div(e_u, sum), 0 for u > t; y[i] = chain_u
//                       fma(att[u], v_u[i]) over u = 0..t. att is not stored: the row's stats
//                       {m, sum} are (Note [Attention memory])
//   attention_query_backward  per (b, h, t): att[u] = div(exp(sub(s_u, m)), sum) recomputed
//                       from the stored stats (the forward's bits); dp_u = chain_i fma(dy[i],
//                       v_u[i]); pd = chain_u fma(att[u], dp_u); dpre[u] = mul(att[u], sub(dp_u,
//                       pd)) for u <= t; dq[i] = mul(chain_u fma(dpre[u], k_u[i]) over u <= t,
//                       scale); pd is kept per query for the second pass
//   attention_key_backward  per (b, h, u): att[t, u], dp[t, u] and dpre[t, u] recomputed as above
//                       (with the query's stats and pd); dk[i] = mul(chain_t fma(dpre[t, u],
//                       q_t[i]), scale) and dv[i] = chain_t fma(att[t, u], dy_t[i]), t = u..T-1
//                       ascending
//   attention with dropout (p > 0, nanoGPT's attn_dropout between the softmax and att @ v):
//                       keep[t, u] = dropout_keep(seed, stream, index_base + ((b nh + h) T + t) T
//                       + u, p) (the flat index into att [B, nh, T, T]; Note [Dropout masks]),
//                       s = dropout_scale(p), a[t, u] = keep ? mul(att[t, u], s) : 0. stats are
//                       the un-dropped softmax. Forward: y[i] = chain_u fma(a[u], v_u[i]) over
//                       u = 0..t (dropped terms stay in the chain as fma(0, v, acc)). Backward:
//                       dp_u = chain_i fma(dy[i], v_u[i]); da_u = keep ? mul(dp_u, s) : 0 (s
//                       multiplies the finished dot product); pd = chain_u fma(att[u], da_u);
//                       dpre[u] = mul(mul(att[u], sub(da_u, pd)), scale) (the score scale
//                       applied per element here, so dq[i] = chain_u fma(dpre[u], k_u[i]) and
//                       dk[i] = chain_t fma(dpre[t, u], q_t[i]) are not scaled after the chain);
//                       dv[i] = chain_t fma(a[t, u], dy_t[i]). This is the order of the host
//                       path nn::CausalSelfAttention used before these kernels took the key
//                       (core/nn/attention_dropout.cpp, removed), so a GPT's bits with dropout
//                       did not change. p == 0 draws no mask and is the order of the two entries
//                       above (score scale after the dq and dk chains).
//   dropout             kept = uniform01(seed, stream, index) >= p (Note [Dropout masks]); y =
//                       kept ? mul(x, scale) : 0 with scale = div(1, sub(1, p))
//   sum_squares         bitwise: blocks of kSquaresBlock elements, each chain fma(x, x, acc);
//                       the blocks combined by the canonical tree over the block index; n == 0
//                       gives +0
// `scale` of attention is float(1 / sqrt(double(hd))) (attention_scale), as PyTorch's
// 1.0 / math.sqrt(k.size(-1)) becomes a float when it multiplies a float tensor. Layouts: qkv
// [B, T, 3C] with q, k, v at columns [0, C), [C, 2C), [2C, 3C), head h at h*hd within each; att
// and dpre (never stored whole) index as [B, nh, T, T]; stats [B, nh, T, 2] ({m, sum}); pd
// [B, nh, T]; y and dy [B, T, C], dqkv as qkv.
//
// Note [Attention memory]
// att [B, nh, T, T] is never stored on the device: the forward keeps each query's softmax
// statistics {m, sum} (8 bytes) and the backward recomputes every weight from them,
// div(exp(sub(s_u, m)), sum), which are exactly the forward's bits (the same operations on the
// same inputs), so recomputation changes no result. This is flash attention's memory
// (FlashAttention, Dao et al. 2022, section 3.1: the softmax normaliser kept, the attention
// matrix recomputed in backward; llm.c with cuDNN), not its arithmetic: ditto's chains stay the
// ascending ones above, where flash attention rescales blockwise partial sums. For GPT-2 124M at
// B = 64, T = 1024 that is 12 x 64 x 12 x 1024 x 8 B = 72 MiB of stats for the 12 layers instead
// of 12 x 1.5 GiB of att in bf16. The backward's only extra memory is pd, 4 B per query. The
// simulator's cost model prices the kernels as ditto's fused kernels on the SIMT cores: no T^2
// traffic, the score recomputation counted, its matrix products at the FP32 rate x
// simt_efficiency in both modes and every dtype (KernelCost::matmul_flops, Note [Compute units]
// in backend_sim/cost_model.h). ditto's CUDA kernels (Note [CUDA attention] in
// backend_cuda/cuda_attention.cu) tile this arithmetic through shared memory over (batch, head,
// query tile) in bitwise mode, recomputing the scores in each pass (three in the forward, two plus
// the key pass in the backward), and run a one-pass flash attention (online softmax, the same
// stats) in fast mode; all in f32 on the SIMT cores, not on tensor cores.
//
// Note [Dropout masks]
// A dropout mask is a pure function of (seed, stream, element index), never of the device, the
// device count or the thread layout (../DESIGN.md, rule 5): element i of a tensor is kept when
// philox uniform01(seed, stream, index_base + i) >= p (philox.h, = random.h's uniform01).
//   stream = nn::dropout_stream(step, site): `step` is the training step (Module::step), `site`
//            the dropout's position in the model (nn::GPT numbers them and documents the
//            numbering: the embedding dropout, then per block its attn_dropout (on att
//            [B, nh, T, T]), resid_dropout and mlp dropout: 3 n_layer + 1 sites):
//              site < 256:          stream_id(kStreamDropout = 5, step << 8 | site), step < 2^40
//                                   (the original encoding: a GPT of at most 85 blocks draws
//                                   exactly the masks it drew when that was the cap);
//              256 <= site < 2^16:  stream_id(kStreamDropoutWide = 9, step << 16 | site),
//                                   step < 2^32 (deeper GPTs, up to 21845 blocks).
//            The kinds differ and each sub is one-to-one on its (step, site) range within the 48
//            bits of a stream's sub (Note [Random streams]), so no two sites or steps share a
//            stream. nn::dropout_stream refuses a site >= 2^16 or a step past its range;
//            GPTConfig refuses n_layer > 21845 with dropout > 0 (with dropout 0 no mask is drawn
//            and the sites are not limited) and the GPT recipe max_iters past
//            gpt_dropout_steps(n_layer). The CUDA kernels take the 64-bit stream as it is.
//   index  = the logical element index in the global batch: index_base = first_row *
//            elements_per_row (Module::first_row, the global row of the replica's first row), so
//            a replica holding rows [a, b) draws exactly the slice of the one-device mask, and
//            1, 2, 4 or 8 devices drop the same elements.
// The backward recomputes the mask from the same key instead of storing it. torch draws its
// masks from its own generator, so ditto's masks are not torch's (the distribution is: keep
// with probability 1 - p, scale 1 / (1 - p)).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/numerics/canonical_math.h"
#include "core/numerics/philox.h"
#include "core/numerics/portable_math.h"

namespace ditto::gpt {

using canonical::add;
using canonical::div;
using canonical::fma;
using canonical::mul;
using canonical::sub;

/// Elements per block of sum_squares in bitwise mode (Note [GPT kernels]).
inline constexpr std::int64_t kSquaresBlock = 4096;

// ---- embedding ----------------------------------------------------------------------------------

/// One output row of embedding_forward: out[c] = wte_row[c] + wpe_row[c] (wpe_row may be null).
DITTO_HD inline void embedding_row(const float* wte_row, const float* wpe_row, std::int64_t C,
                                   float* out) {
  if (wpe_row == nullptr) {
    for (std::int64_t c = 0; c < C; ++c) out[c] = wte_row[c];
  } else {
    for (std::int64_t c = 0; c < C; ++c) out[c] = add(wte_row[c], wpe_row[c]);
  }
}

// ---- LayerNorm ----------------------------------------------------------------------------------

/// torch.nn.functional.layer_norm of one row x[0..C): writes y[0..C), *mean and *rstd (b may be
/// null). Order: Note [GPT kernels].
DITTO_HD inline void layernorm_row(const float* x, const float* w, const float* b, std::int64_t C,
                                   float eps, float* y, float* mean_out, float* rstd_out) {
  const float n = static_cast<float>(C);
  float s = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) s = add(s, x[c]);
  const float mean = div(s, n);
  float v = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) {
    const float d = sub(x[c], mean);
    v = fma(d, d, v);
  }
  const float rstd = div(1.0f, canonical::sqrt(add(div(v, n), eps)));
  for (std::int64_t c = 0; c < C; ++c) {
    const float xhat = mul(sub(x[c], mean), rstd);
    y[c] = b != nullptr ? fma(xhat, w[c], b[c]) : mul(xhat, w[c]);
  }
  *mean_out = mean;
  *rstd_out = rstd;
}

/// Backward of layernorm_row without the parameter reductions: dx[0..C) and dy_xhat[0..C)
/// (= dy * xhat; its sum over rows is grad_w). Order: Note [GPT kernels].
DITTO_HD inline void layernorm_row_backward(const float* dy, const float* x, const float* w,
                                            float mean, float rstd, std::int64_t C, float* dx,
                                            float* dy_xhat) {
  const float n = static_cast<float>(C);
  float sg = 0.0f, sgx = 0.0f;
  for (std::int64_t c = 0; c < C; ++c) {
    const float g = mul(dy[c], w[c]);
    const float xhat = mul(sub(x[c], mean), rstd);
    sg = add(sg, g);
    sgx = fma(g, xhat, sgx);
  }
  const float mg = div(sg, n), mgx = div(sgx, n);
  for (std::int64_t c = 0; c < C; ++c) {
    const float g = mul(dy[c], w[c]);
    const float xhat = mul(sub(x[c], mean), rstd);
    dx[c] = mul(rstd, sub(sub(g, mg), mul(xhat, mgx)));
    dy_xhat[c] = mul(dy[c], xhat);
  }
}

// ---- GELU (tanh form) ---------------------------------------------------------------------------

inline constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;  // float(sqrt(2 / pi))
inline constexpr float kGeluCoeff = 0.044715f;
inline constexpr float kGeluCoeff3 = 0.134145f;  // float(3 * 0.044715)

/// pmath::tanh, or with kBranchless its branch-free form pmath::tanh_branchless (the same bits;
/// for loops that should vectorise).
template <bool kBranchless>
DITTO_HD inline float gelu_tanh(float v) {
  if constexpr (kBranchless)
    return pmath::tanh_branchless(v);
  else
    return pmath::tanh(v);
}

/// torch.nn.functional.gelu(x, approximate='tanh'): 0.5 x (1 + tanh(k0 (x + 0.044715 x^3))).
/// kBranchless: the same bits, vectorisable (gelu_tanh).
template <bool kBranchless = false>
DITTO_HD inline float gelu(float x) {
  const float x3 = mul(mul(x, x), x);
  const float t = gelu_tanh<kBranchless>(mul(kGeluSqrt2OverPi, fma(kGeluCoeff, x3, x)));
  return mul(mul(0.5f, x), add(1.0f, t));
}

/// gy * gelu'(x): 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 * 0.044715 x^2), t as in gelu.
template <bool kBranchless = false>
DITTO_HD inline float gelu_grad(float x, float gy) {
  const float x2 = mul(x, x);
  const float t = gelu_tanh<kBranchless>(mul(kGeluSqrt2OverPi, fma(kGeluCoeff, mul(x2, x), x)));
  const float dinner = mul(kGeluSqrt2OverPi, fma(kGeluCoeff3, x2, 1.0f));
  const float sech2 = fma(-t, t, 1.0f);
  const float left = mul(0.5f, add(1.0f, t));
  const float right = mul(mul(mul(0.5f, x), sech2), dinner);
  return mul(gy, add(left, right));
}

// ---- dropout (Note [Dropout masks]) -------------------------------------------------------------

/// True when element `index` of the mask of (seed, stream) is kept at drop probability p.
DITTO_HD inline bool dropout_keep(std::uint64_t seed, std::uint64_t stream, std::uint64_t index,
                                  float p) {
  return philox::uniform01(seed, stream, index) >= p;
}

/// The scale of kept elements, 1 / (1 - p) in float.
DITTO_HD inline float dropout_scale(float p) { return div(1.0f, sub(1.0f, p)); }

/// One element of inverted dropout (forward and backward alike): kept ? x * scale : 0.
DITTO_HD inline float dropout_apply(bool kept, float x, float scale) {
  return kept ? mul(x, scale) : 0.0f;
}

// ---- causal self-attention ----------------------------------------------------------------------

/// float(1 / sqrt(double(hd))): the score scale of a head of hd channels (Note [GPT kernels]).
DITTO_HD inline float attention_scale(std::int64_t hd) {
#if defined(__CUDA_ARCH__)
  return static_cast<float>(1.0 / __dsqrt_rn(static_cast<double>(hd)));
#else
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
#endif
}

/// Ascending dot-product chain acc = fma(a[i], b[i], acc) from 0.0f over i = 0..n-1.
DITTO_HD inline float dot_chain(const float* a, const float* b, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) acc = fma(a[i], b[i], acc);
  return acc;
}

/// Pointer to row (b, t) of a [B, T, width] tensor.
DITTO_HD inline const float* row_at(const float* base, std::int64_t T, std::int64_t width,
                                    std::int64_t b, std::int64_t t) {
  return base + (b * T + t) * width;
}

/// Lower end of exp_nonpositive's range: exp(x) = 2^k (1 + r + v) with k >= -124 there, so
/// pmath::exp scales by one exact power of two (no denormal path).
inline constexpr float kExpFastMin = -86.0f;

/// canonical::exp(x) for x in [kExpFastMin, 0] (the same operations, without the range and NaN
/// branches of pmath::exp, so that a loop of it vectorises); unspecified outside.
DITTO_HD inline float exp_nonpositive(float x) {
  const pmath::detail::ExpReduced e = pmath::detail::exp_reduce(x);
  return mul(pmath::detail::one_plus(e.r, e.v), pmath::detail::pow2(e.k));
}

/// row[u] = canonical::exp(sub(row[u], m)) for u <= t, in three loops that vectorise on the
/// host: x <= 0 here (or NaN), and where x >= kExpFastMin exp_nonpositive(x) is
/// canonical::exp(x); the others (very negative, NaN) are left negative or NaN by the second loop
/// and taken by the third.
DITTO_HD inline void exp_shifted_row(float* row, std::int64_t t, float m) {
  for (std::int64_t u = 0; u <= t; ++u) row[u] = sub(row[u], m);
  for (std::int64_t u = 0; u <= t; ++u) {
    const float x = row[u];
    const bool fast = x >= kExpFastMin && x <= 0.0f;
    const float e = exp_nonpositive(fast ? x : 0.0f);
    row[u] = fast ? e : x;  // e >= exp(kExpFastMin) > 0
  }
  for (std::int64_t u = 0; u <= t; ++u)
    if (!(row[u] > 0.0f)) row[u] = canonical::exp(row[u]);
}

/// The statistics of one query's causal softmax (Note [GPT kernels], attention_query): the row
/// max m of the scaled scores and sum = chain add exp(sub(s_u, m)). Kernels::attention_forward
/// stores them as stats[(b nh + h) T + t] = {m, sum} ([B, nh, T, 2] floats) in place of att.
struct SoftmaxStats {
  float m;
  float sum;
};

/// The softmax of one causal row in place: row[0..t] holds the scaled scores s_u on entry and
/// att[u] on return; row[t+1..T) is set to 0. Returns the row's statistics. Order: Note [GPT
/// kernels].
DITTO_HD inline SoftmaxStats causal_softmax_row(float* row, std::int64_t t, std::int64_t T) {
  float m = -pmath::detail::infinity();
  for (std::int64_t u = 0; u <= t; ++u) m = (m < row[u]) ? row[u] : m;  // std::max(m, s_u)
  exp_shifted_row(row, t, m);
  float sum = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) sum = add(sum, row[u]);
  for (std::int64_t u = 0; u <= t; ++u) row[u] = div(row[u], sum);
  for (std::int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
  return SoftmaxStats{m, sum};
}

/// att[u] recomputed in place from the forward's statistics: row[0..t] holds the scaled scores
/// on entry and div(exp(sub(s_u, st.m)), st.sum) on return (the bits causal_softmax_row gave the
/// forward); row[t+1..T) is set to 0.
DITTO_HD inline void causal_weights_row(float* row, std::int64_t t, std::int64_t T,
                                        SoftmaxStats st) {
  exp_shifted_row(row, t, st.m);
  for (std::int64_t u = 0; u <= t; ++u) row[u] = div(row[u], st.sum);
  for (std::int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
}

/// One attention weight recomputed from its scaled score and its row's statistics.
DITTO_HD inline float softmax_weight(float s, SoftmaxStats st) {
  return div(canonical::exp(sub(s, st.m)), st.sum);
}

/// out[i] = chain over u = 0..t ascending of fma(w[u], rows[u * stride + i], acc) from 0.0f, for
/// i < hd: y = att @ v (rows = the v slices) and dq = dpre @ k (rows = the k slices).
DITTO_HD inline void weighted_rows(const float* __restrict__ w, std::int64_t t,
                                   const float* __restrict__ rows, std::int64_t stride,
                                   std::int64_t hd, float* __restrict__ out) {
  for (std::int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    const float* r = rows + u * stride;
    const float a = w[u];
    for (std::int64_t i = 0; i < hd; ++i) out[i] = fma(a, r[i], out[i]);
  }
}

/// The key of an attention dropout mask (Kernels::attention_forward's p, seed, stream and
/// index_base): p == 0 means no dropout (Note [GPT kernels], attention with dropout).
struct AttentionDropout {
  float p = 0.0f;
  std::uint64_t seed = 0, stream = 0, index_base = 0;
  DITTO_HD bool active() const { return p > 0.0f; }
  /// a = keep ? mul(x, s) : 0 for the element of flat index `index` of att [B, nh, T, T].
  DITTO_HD bool kept(std::uint64_t index) const {
    return dropout_keep(seed, stream, index_base + index, p);
  }
  DITTO_HD float apply(std::uint64_t index, float x, float s) const {
    return dropout_apply(kept(index), x, s);
  }
};

/// The flat index of att[b, h, t, 0] in [B, nh, T, T] (dropout mask indices are it + u).
DITTO_HD inline std::uint64_t attention_row_index(std::int64_t nh, std::int64_t T, std::int64_t b,
                                                  std::int64_t h, std::int64_t t) {
  return static_cast<std::uint64_t>(((b * nh + h) * T + t) * T);
}

/// The softmax backward of one causal row in place: row[0..t] holds dp_u = dy_t . v_u on entry
/// and dpre[u] = att[u] * (dp_u - pd) on return, pd = chain_u fma(att[u], dp_u), which it
/// returns; row[t+1..T) is set to 0.
DITTO_HD inline float causal_softmax_row_backward(const float* att_row, float* row, std::int64_t t,
                                                  std::int64_t T) {
  float pd = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) pd = fma(att_row[u], row[u], pd);
  for (std::int64_t u = 0; u <= t; ++u) row[u] = mul(att_row[u], sub(row[u], pd));
  for (std::int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
  return pd;
}

/// weighted_rows with the dropped weights a[u] = drop.apply(row_index + u, w[u], s) (Note [GPT
/// kernels], attention with dropout): y = dropout(att) @ v of one query.
DITTO_HD inline void weighted_rows_dropped(const float* w, std::int64_t t, const float* rows,
                                           std::int64_t stride, std::int64_t hd,
                                           const AttentionDropout& drop, std::uint64_t row_index,
                                           float* out) {
  const float s = dropout_scale(drop.p);
  for (std::int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    const float* r = rows + u * stride;
    const float a = drop.apply(row_index + static_cast<std::uint64_t>(u), w[u], s);
    for (std::int64_t i = 0; i < hd; ++i) out[i] = fma(a, r[i], out[i]);
  }
}

// The reference functions below hold no row of att: they recompute each score (and weight) when
// they need it, so they need O(1) memory per query (as flash attention does) and serve as the
// CUDA kernels' per-thread bodies; the simulator's kernels hold one head's rows on the host and
// must give the same bits (tests/test_gpt_ops_bits.cpp).

/// The scaled score s_u = mul(q_t . k_u, scale) of query t and key u of head h in batch b.
DITTO_HD inline float attention_score(const float* qkv, std::int64_t T, std::int64_t C,
                                      std::int64_t nh, std::int64_t b, std::int64_t t,
                                      std::int64_t u, std::int64_t h) {
  const std::int64_t hd = C / nh;
  const float* q = row_at(qkv, T, 3 * C, b, t) + h * hd;
  const float* k = row_at(qkv, T, 3 * C, b, u) + C + h * hd;
  return mul(dot_chain(q, k, hd), attention_scale(hd));
}

/// One query (b, t) of head h (Note [GPT kernels]): y_out[0..hd) (the slice y[b, t, h*hd :
/// (h+1)*hd)) and the row's softmax statistics (returned), with dropout on the weights when
/// drop.active(). qkv [B, T, 3C]. Three passes over the keys (max, sum, att @ v), the score
/// recomputed in each.
DITTO_HD inline SoftmaxStats attention_query(const float* qkv, std::int64_t T, std::int64_t C,
                                             std::int64_t nh, std::int64_t b, std::int64_t t,
                                             std::int64_t h, float* y_out,
                                             const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  float m = -pmath::detail::infinity();
  for (std::int64_t u = 0; u <= t; ++u) {
    const float s = attention_score(qkv, T, C, nh, b, t, u, h);
    m = (m < s) ? s : m;
  }
  float sum = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u)
    sum = add(sum, canonical::exp(sub(attention_score(qkv, T, C, nh, b, t, u, h), m)));
  const SoftmaxStats st{m, sum};
  const float ds = drop.active() ? dropout_scale(drop.p) : 1.0f;
  const std::uint64_t row = attention_row_index(nh, T, b, h, t);
  for (std::int64_t i = 0; i < hd; ++i) y_out[i] = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    float a = softmax_weight(attention_score(qkv, T, C, nh, b, t, u, h), st);
    if (drop.active()) a = drop.apply(row + static_cast<std::uint64_t>(u), a, ds);
    const float* v = row_at(qkv, T, 3 * C, b, u) + 2 * C + h * hd;
    for (std::int64_t i = 0; i < hd; ++i) y_out[i] = fma(a, v[i], y_out[i]);
  }
  return st;
}

/// The pieces of the softmax backward at (query t, key u) of head h (Note [GPT kernels]): the
/// recomputed weight att, the undropped weight's dropped value a (= att without dropout) and
/// da = the (dropped) dp = dy_t . v_u.
struct AttentionPair {
  float att, a, da;
};

DITTO_HD inline AttentionPair attention_pair(const float* dy, const float* qkv, std::int64_t T,
                                             std::int64_t C, std::int64_t nh, std::int64_t b,
                                             std::int64_t t, std::int64_t u, std::int64_t h,
                                             SoftmaxStats st, const AttentionDropout& drop) {
  const std::int64_t hd = C / nh;
  const float att = softmax_weight(attention_score(qkv, T, C, nh, b, t, u, h), st);
  const float dp =
      dot_chain(row_at(dy, T, C, b, t) + h * hd, row_at(qkv, T, 3 * C, b, u) + 2 * C + h * hd, hd);
  if (!drop.active()) return AttentionPair{att, att, dp};
  const float ds = dropout_scale(drop.p);
  const std::uint64_t index = attention_row_index(nh, T, b, h, t) + static_cast<std::uint64_t>(u);
  const bool keep = drop.kept(index);
  return AttentionPair{att, dropout_apply(keep, att, ds), dropout_apply(keep, dp, ds)};
}

/// dpre at one pair given the row's pd (Note [GPT kernels]): mul(att, sub(da, pd)), times the
/// score scale with dropout (then the dq and dk chains are not scaled after).
DITTO_HD inline float attention_dpre(const AttentionPair& p, float pd, float scale, bool dropped) {
  const float d = mul(p.att, sub(p.da, pd));
  return dropped ? mul(d, scale) : d;
}

/// First backward pass, one query (b, t) of head h: dq_out[0..hd) (the slice of dqkv[b, t, :] at
/// h*hd); returns pd = chain_u fma(att[u], da_u), which the second pass needs per query
/// (Kernels::attention_backward's scratch holds it, [B, nh, T]). dy [B, T, C], st the forward's
/// statistics of the row. With drop.active() dp is dropped first and dpre carries the score
/// scale (Note [GPT kernels], attention with dropout).
DITTO_HD inline float attention_query_backward(const float* dy, const float* qkv, std::int64_t T,
                                               std::int64_t C, std::int64_t nh, std::int64_t b,
                                               std::int64_t t, std::int64_t h, SoftmaxStats st,
                                               float* dq_out, const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  const float scale = attention_scale(hd);
  float pd = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    const AttentionPair p = attention_pair(dy, qkv, T, C, nh, b, t, u, h, st, drop);
    pd = fma(p.att, p.da, pd);
  }
  for (std::int64_t i = 0; i < hd; ++i) dq_out[i] = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    const AttentionPair p = attention_pair(dy, qkv, T, C, nh, b, t, u, h, st, drop);
    const float d = attention_dpre(p, pd, scale, drop.active());
    const float* k = row_at(qkv, T, 3 * C, b, u) + C + h * hd;
    for (std::int64_t i = 0; i < hd; ++i) dq_out[i] = fma(d, k[i], dq_out[i]);
  }
  if (!drop.active())
    for (std::int64_t i = 0; i < hd; ++i) dq_out[i] = mul(dq_out[i], scale);
  return pd;
}

/// Second backward pass, one key u of head h in batch b (after every query's first pass):
/// dk_out[0..hd) and dv_out[0..hd) (the slices of dqkv[b, u, :] at C + h*hd and 2C + h*hd):
/// dk[i] = chain_t fma(dpre[t, u], q_t[i]) (scaled after without dropout), dv[i] = chain_t
/// fma(a[t, u], dy_t[i]) over the queries t = u..T-1 ascending. stats [B, nh, T] and pd
/// [B, nh, T] of the forward and the first pass; drop as the forward's.
DITTO_HD inline void attention_key_backward(const float* dy, const float* qkv,
                                            const SoftmaxStats* stats, const float* pd,
                                            std::int64_t T, std::int64_t C, std::int64_t nh,
                                            std::int64_t b, std::int64_t u, std::int64_t h,
                                            float* dk_out, float* dv_out,
                                            const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  const float scale = attention_scale(hd);
  const std::int64_t head = (b * nh + h) * T;
  for (std::int64_t i = 0; i < hd; ++i) dk_out[i] = 0.0f;
  for (std::int64_t i = 0; i < hd; ++i) dv_out[i] = 0.0f;
  for (std::int64_t t = u; t < T; ++t) {
    const AttentionPair p = attention_pair(dy, qkv, T, C, nh, b, t, u, h, stats[head + t], drop);
    const float d = attention_dpre(p, pd[head + t], scale, drop.active());
    const float* q = row_at(qkv, T, 3 * C, b, t) + h * hd;
    const float* g = row_at(dy, T, C, b, t) + h * hd;
    for (std::int64_t i = 0; i < hd; ++i) dk_out[i] = fma(d, q[i], dk_out[i]);
    for (std::int64_t i = 0; i < hd; ++i) dv_out[i] = fma(p.a, g[i], dv_out[i]);
  }
  if (!drop.active())
    for (std::int64_t i = 0; i < hd; ++i) dk_out[i] = mul(dk_out[i], scale);
}

// ---- sum of squares -----------------------------------------------------------------------------

/// Number of kSquaresBlock blocks of n elements (the leaves of sum_squares' tree); 0 for n == 0.
DITTO_HD inline std::int64_t squares_blocks(std::int64_t n) {
  return (n + kSquaresBlock - 1) / kSquaresBlock;
}

/// One block's leaf: the chain acc = fma(x[i], x[i], acc) from 0.0f over i = 0..len-1.
DITTO_HD inline float squares_chain(const float* x, std::int64_t len) {
  float acc = 0.0f;
  for (std::int64_t i = 0; i < len; ++i) acc = fma(x[i], x[i], acc);
  return acc;
}

}  // namespace ditto::gpt
