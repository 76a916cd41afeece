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
//                       fma(att[u], v_u[i]) over u = 0..t
//   attention_query_backward  per (b, h, t): dp_u = chain_i fma(dy[i], v_u[i]); pd = chain_u
//                       fma(att[u], dp_u); dpre[u] = mul(att[u], sub(dp_u, pd)) for u <= t, 0
//                       above; dq[i] = mul(chain_u fma(dpre[u], k_u[i]) over u <= t, scale)
//   attention_key_backward  per (b, h, u): dk[i] = mul(chain_t fma(dpre[t, u], q_t[i]), scale)
//                       and dv[i] = chain_t fma(att[t, u], dy_t[i]), t = u..T-1 ascending
//   attention with dropout (p > 0, nanoGPT's attn_dropout between the softmax and att @ v):
//                       keep[t, u] = dropout_keep(seed, stream, index_base + ((b nh + h) T + t) T
//                       + u, p) (the flat index into att [B, nh, T, T]; Note [Dropout masks]),
//                       s = dropout_scale(p), a[t, u] = keep ? mul(att[t, u], s) : 0. att keeps
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
// and dpre [B, nh, T, T]; y and dy [B, T, C], dqkv as qkv.
//
// Note [Dropout masks]
// A dropout mask is a pure function of (seed, stream, element index), never of the device, the
// device count or the thread layout (../DESIGN.md, rule 5): element i of a tensor is kept when
// philox uniform01(seed, stream, index_base + i) >= p (philox.h, = random.h's uniform01).
//   stream = stream_id(kStreamDropout = 5, step << 8 | site): `step` is the training step
//            (Module::step), `site` the dropout's position in the model, < 256 (nn::GPT numbers
//            them and documents the numbering: the embedding dropout, then per block its
//            attn_dropout (on att [B, nh, T, T]), resid_dropout and mlp dropout).
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

/// torch.nn.functional.gelu(x, approximate='tanh'): 0.5 x (1 + tanh(k0 (x + 0.044715 x^3))).
DITTO_HD inline float gelu(float x) {
  const float x3 = mul(mul(x, x), x);
  const float t = pmath::tanh(mul(kGeluSqrt2OverPi, fma(kGeluCoeff, x3, x)));
  return mul(mul(0.5f, x), add(1.0f, t));
}

/// gy * gelu'(x): 0.5 (1 + t) + 0.5 x (1 - t^2) k0 (1 + 3 * 0.044715 x^2), t as in gelu.
DITTO_HD inline float gelu_grad(float x, float gy) {
  const float x2 = mul(x, x);
  const float t = pmath::tanh(mul(kGeluSqrt2OverPi, fma(kGeluCoeff, mul(x2, x), x)));
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

/// The softmax of one causal row in place: row[0..t] holds the scaled scores s_u on entry and
/// att[u] on return; row[t+1..T) is set to 0. Order: Note [GPT kernels].
DITTO_HD inline void causal_softmax_row(float* row, std::int64_t t, std::int64_t T) {
  float m = -pmath::detail::infinity();
  for (std::int64_t u = 0; u <= t; ++u) m = (m < row[u]) ? row[u] : m;  // std::max(m, s_u)
  // row[u] = canonical::exp(s_u - m), in three loops that vectorise on the host: x <= 0 here
  // (or NaN), and where x >= kExpFastMin exp_nonpositive(x) is canonical::exp(x); the others
  // (very negative, NaN) are left negative or NaN by the second loop and taken by the third.
  for (std::int64_t u = 0; u <= t; ++u) row[u] = sub(row[u], m);
  for (std::int64_t u = 0; u <= t; ++u) {
    const float x = row[u];
    const bool fast = x >= kExpFastMin && x <= 0.0f;
    const float e = exp_nonpositive(fast ? x : 0.0f);
    row[u] = fast ? e : x;  // e >= exp(kExpFastMin) > 0
  }
  for (std::int64_t u = 0; u <= t; ++u)
    if (!(row[u] > 0.0f)) row[u] = canonical::exp(row[u]);
  float sum = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) sum = add(sum, row[u]);
  for (std::int64_t u = 0; u <= t; ++u) row[u] = div(row[u], sum);
  for (std::int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
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
/// and dpre[u] = att[u] * (dp_u - sum_w att[w] dp_w) on return; row[t+1..T) is set to 0.
DITTO_HD inline void causal_softmax_row_backward(const float* att_row, float* row, std::int64_t t,
                                                 std::int64_t T) {
  float pd = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) pd = fma(att_row[u], row[u], pd);
  for (std::int64_t u = 0; u <= t; ++u) row[u] = mul(att_row[u], sub(row[u], pd));
  for (std::int64_t u = t + 1; u < T; ++u) row[u] = 0.0f;
}

/// weighted_rows with the dropped weights a[u] = drop.apply(row_index + u, w[u], s) (Note [GPT
/// kernels], attention with dropout): y = dropout(att) @ v of one query.
DITTO_HD inline void weighted_rows_dropped(const float* w, std::int64_t t, const float* rows,
                                           std::int64_t stride, std::int64_t hd,
                                           const AttentionDropout& drop,
                                           std::uint64_t row_index, float* out) {
  const float s = dropout_scale(drop.p);
  for (std::int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
  for (std::int64_t u = 0; u <= t; ++u) {
    const float* r = rows + u * stride;
    const float a = drop.apply(row_index + static_cast<std::uint64_t>(u), w[u], s);
    for (std::int64_t i = 0; i < hd; ++i) out[i] = fma(a, r[i], out[i]);
  }
}

/// One query (b, t) of head h (Note [GPT kernels]): att_row[0..T) (the row att[b, h, t, :],
/// 0 for u > t; never dropped) and y_out[0..hd) (the slice y[b, t, h*hd : (h+1)*hd)), with
/// dropout on the weights when drop.active(). qkv [B, T, 3C].
DITTO_HD inline void attention_query(const float* qkv, std::int64_t T, std::int64_t C,
                                     std::int64_t nh, std::int64_t b, std::int64_t t,
                                     std::int64_t h, float* y_out, float* att_row,
                                     const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  const float scale = attention_scale(hd);
  const float* q = row_at(qkv, T, 3 * C, b, t) + h * hd;
  const float* k0 = row_at(qkv, T, 3 * C, b, 0) + C + h * hd;
  for (std::int64_t u = 0; u <= t; ++u) att_row[u] = mul(dot_chain(q, k0 + u * 3 * C, hd), scale);
  causal_softmax_row(att_row, t, T);
  if (drop.active())
    weighted_rows_dropped(att_row, t, k0 + C, 3 * C, hd, drop, attention_row_index(nh, T, b, h, t),
                          y_out);
  else
    weighted_rows(att_row, t, k0 + C, 3 * C, hd, y_out);
}

/// First backward pass, one query (b, t) of head h: dpre_row[0..T) (the row dpre[b, h, t, :] of
/// the gradient before the softmax, 0 for u > t) and dq_out[0..hd) (the slice of dqkv[b, t, :]
/// at h*hd). dy [B, T, C], att_row = att[b, h, t, :]. With drop.active() dp is dropped first
/// and dpre carries the score scale (Note [GPT kernels], attention with dropout).
DITTO_HD inline void attention_query_backward(const float* dy, const float* qkv,
                                              const float* att_row, std::int64_t T,
                                              std::int64_t C, std::int64_t nh, std::int64_t b,
                                              std::int64_t t, std::int64_t h, float* dpre_row,
                                              float* dq_out, const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  const float scale = attention_scale(hd);
  const float* g = row_at(dy, T, C, b, t) + h * hd;
  const float* k0 = row_at(qkv, T, 3 * C, b, 0) + C + h * hd;
  for (std::int64_t u = 0; u <= t; ++u) dpre_row[u] = dot_chain(g, k0 + C + u * 3 * C, hd);
  if (drop.active()) {
    const float s = dropout_scale(drop.p);
    const std::uint64_t row = attention_row_index(nh, T, b, h, t);
    for (std::int64_t u = 0; u <= t; ++u)
      dpre_row[u] = drop.apply(row + static_cast<std::uint64_t>(u), dpre_row[u], s);
    causal_softmax_row_backward(att_row, dpre_row, t, T);
    for (std::int64_t u = 0; u <= t; ++u) dpre_row[u] = mul(dpre_row[u], scale);
    weighted_rows(dpre_row, t, k0, 3 * C, hd, dq_out);
    return;
  }
  causal_softmax_row_backward(att_row, dpre_row, t, T);
  weighted_rows(dpre_row, t, k0, 3 * C, hd, dq_out);
  for (std::int64_t i = 0; i < hd; ++i) dq_out[i] = mul(dq_out[i], scale);
}

/// The chains of the second backward pass, unscaled: dk_out[i] = chain_t fma(dpre[t, u],
/// q_t[i]) and dv_out[i] = chain_t fma(w[t, u], dy_t[i]) over t = u..T-1 ascending, where w is
/// att, dropped by `drop` when drop.active() (pass an inactive drop with w already dropped to
/// get the same bits). dpre and w [B, nh, T, T].
DITTO_HD inline void attention_key_chains(const float* __restrict__ dy,
                                          const float* __restrict__ qkv,
                                          const float* __restrict__ w,
                                          const float* __restrict__ dpre, std::int64_t T,
                                          std::int64_t C, std::int64_t nh, std::int64_t b,
                                          std::int64_t u, std::int64_t h,
                                          float* __restrict__ dk_out, float* __restrict__ dv_out,
                                          const AttentionDropout& drop = {}) {
  const std::int64_t hd = C / nh;
  const std::int64_t head = (b * nh + h) * T * T;
  const float s = drop.active() ? dropout_scale(drop.p) : 1.0f;
  for (std::int64_t i = 0; i < hd; ++i) dk_out[i] = 0.0f;
  for (std::int64_t i = 0; i < hd; ++i) dv_out[i] = 0.0f;
  for (std::int64_t t = u; t < T; ++t) {
    const float* q = row_at(qkv, T, 3 * C, b, t) + h * hd;
    const float* g = row_at(dy, T, C, b, t) + h * hd;
    const std::int64_t k = head + t * T + u;
    const float d = dpre[k];
    const float a = drop.active() ? drop.apply(static_cast<std::uint64_t>(k), w[k], s) : w[k];
    for (std::int64_t i = 0; i < hd; ++i) dk_out[i] = fma(d, q[i], dk_out[i]);
    for (std::int64_t i = 0; i < hd; ++i) dv_out[i] = fma(a, g[i], dv_out[i]);
  }
}

/// Second backward pass, one key u of head h in batch b (after every query's first pass):
/// dk_out[0..hd) and dv_out[0..hd) (the slices of dqkv[b, u, :] at C + h*hd and 2C + h*hd),
/// summed over the queries t = u..T-1 ascending. att and dpre [B, nh, T, T]; drop as the
/// forward's (dv sums the dropped weights; dpre already carries the scale then).
DITTO_HD inline void attention_key_backward(const float* dy, const float* qkv, const float* att,
                                            const float* dpre, std::int64_t T, std::int64_t C,
                                            std::int64_t nh, std::int64_t b, std::int64_t u,
                                            std::int64_t h, float* dk_out, float* dv_out,
                                            const AttentionDropout& drop = {}) {
  attention_key_chains(dy, qkv, att, dpre, T, C, nh, b, u, h, dk_out, dv_out, drop);
  if (drop.active()) return;
  const float scale = attention_scale(C / nh);
  for (std::int64_t i = 0; i < C / nh; ++i) dk_out[i] = mul(dk_out[i], scale);
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
