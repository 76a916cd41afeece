// Causal attention with dropout on the attention weights, computed on the host.
//
// Note [Attention dropout]
// nanoGPT's CausalSelfAttention applies attn_dropout to att [B, nh, T, T] between the softmax and
// att @ v. The attention kernels (Kernels::attention_forward / attention_backward) take no
// dropout, so when attn_dropout is active (training, p > 0) the layer runs the kernel for att
// (the softmax; its y is discarded) and computes the rest here, on the host, in one fixed order
// that no device count or backend changes (so bitwise mode holds):
//   a[t, u]  = keep(t, u) ? att[t, u] * s : 0,  s = 1 / (1 - p) in float, keep = gpt::dropout_keep
//              (seed, stream, index_base + flat index, p), s = gpt::dropout_scale(p)
//   y[t, i]  = sum over u = 0..t ascending of fma(a[t, u], v[u, i], acc) from 0
// backward, per (b, h), with hd = C / nh and scale = float(1 / sqrt(double(hd))):
//   da[t, u] = keep ? (sum_i dy[t, i] v[u, i]) * s : 0     (fma chain over i ascending)
//   dot[t]   = sum over u <= t of att[t, u] * da[t, u]    (fma chain)
//   dz[t, u] = att[t, u] * (da[t, u] - dot[t]) * scale    (d of q.k)
//   dq[t]    = sum over u <= t of dz[t, u] k[u];  dk[u] = sum over t >= u of dz[t, u] q[t];
//   dv[u]    = sum over t >= u of a[t, u] dy[t]            (fma chains, ascending)
// This costs a round trip of qkv, att and y to the host; with dropout 0 (nanoGPT's default for
// the Shakespeare model) or in eval mode it never runs. A kernel taking the dropout key would
// remove it (the report of issue 12 proposes one).
#include <cmath>
#include <vector>

#include "core/nn/attention.h"
#include "core/numerics/gpt_math.h"

namespace ditto::nn {

namespace {

namespace c = canonical;

struct AttnDims {
  std::int64_t B, T, C, nh, hd;
};

AttnDims dims_of(const char* who, const Tensor& qkv, const Tensor& att, std::int64_t nh) {
  DITTO_CHECK(qkv.defined() && qkv.dim() == 3 && qkv.size(2) % 3 == 0 &&
                  qkv.dtype() == DType::f32,
              who, ": qkv: expected [B, T, 3C] f32, got ", qkv.defined() ? qkv.str() : "undefined");
  const AttnDims d{qkv.size(0), qkv.size(1), qkv.size(2) / 3, nh, 0};
  DITTO_CHECK(nh >= 1 && d.C % nh == 0, who, ": n_head: expected a divisor of ", d.C, ", got ", nh);
  DITTO_CHECK(att.defined() && att.shape() == (Shape{d.B, nh, d.T, d.T}), who,
              ": att: expected ", shape_str({d.B, nh, d.T, d.T}), ", got ",
              att.defined() ? att.str() : "undefined");
  return {d.B, d.T, d.C, nh, d.C / nh};
}

// Row t of the dropped, scaled attention weights of one (sample, head): a[u] for u <= t, from
// att's row at flat index `row` (the mask index is index_base + row + u).
void dropped_row(const float* att_row, std::size_t row, std::int64_t t, float p, float s,
                 std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base, float* a) {
  for (std::int64_t u = 0; u <= t; ++u)
    a[u] = gpt::dropout_keep(seed, stream, index_base + row + static_cast<std::size_t>(u), p)
               ? c::mul(att_row[u], s)
               : 0.0f;
}

}  // namespace

Tensor attention_dropout_forward(const Tensor& qkv, const Tensor& att, std::int64_t n_head,
                                 float p, std::uint64_t seed, std::uint64_t stream,
                                 std::uint64_t index_base) {
  const AttnDims d = dims_of("nn::attention_dropout_forward", qkv, att, n_head);
  const std::vector<float> x = qkv.to_vector<float>(), at = att.to_vector<float>();
  const float s = gpt::dropout_scale(p);
  const std::int64_t C3 = 3 * d.C, T = d.T;
  std::vector<float> y(static_cast<std::size_t>(d.B * T * d.C), 0.0f);
  std::vector<float> a(static_cast<std::size_t>(T));
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const auto row = static_cast<std::size_t>(((b * d.nh + h) * T + t) * T);
        dropped_row(&at[row], row, t, p, s, seed, stream, index_base, a.data());
        // y[t, i]: the fma chain over u ascending from 0, one chain per i (the loop over i
        // inside only interleaves independent chains).
        float* yt = &y[static_cast<std::size_t>((b * T + t) * d.C + h * d.hd)];
        for (std::int64_t u = 0; u <= t; ++u) {
          const float* vu = &x[static_cast<std::size_t>((b * T + u) * C3 + 2 * d.C + h * d.hd)];
          for (std::int64_t i = 0; i < d.hd; ++i) yt[i] = c::fma(a[u], vu[i], yt[i]);
        }
      }
  return Tensor::from_vector(y, {d.B, T, d.C}, qkv.device());
}

Tensor attention_dropout_backward(const Tensor& dy, const Tensor& qkv, const Tensor& att,
                                  std::int64_t n_head, float p, std::uint64_t seed,
                                  std::uint64_t stream, std::uint64_t index_base) {
  const AttnDims d = dims_of("nn::attention_dropout_backward", qkv, att, n_head);
  DITTO_CHECK(dy.defined() && dy.shape() == (Shape{d.B, d.T, d.C}),
              "nn::attention_dropout_backward: dy: expected ", shape_str({d.B, d.T, d.C}),
              ", got ", dy.defined() ? dy.str() : "undefined");
  const std::vector<float> x = qkv.to_vector<float>(), g = dy.to_vector<float>();
  const std::vector<float> at = att.to_vector<float>();
  const float s = gpt::dropout_scale(p);
  const float scale = gpt::attention_scale(d.hd);
  const std::int64_t C3 = 3 * d.C, T = d.T, hd = d.hd;
  std::vector<float> dx(x.size(), 0.0f), a(static_cast<std::size_t>(T)),
      da(static_cast<std::size_t>(T)), dz(static_cast<std::size_t>(T));
  // Head h's q (part 0), k (1) or v (2) of position t of sample b, and of dx alike.
  auto qkv_at = [&](std::int64_t b, std::int64_t t, int part, std::int64_t h) {
    return static_cast<std::size_t>((b * T + t) * C3 + part * d.C + h * hd);
  };
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < T; ++t) {  // query t: its row of dz, then its terms
        const auto row = static_cast<std::size_t>(((b * d.nh + h) * T + t) * T);
        dropped_row(&at[row], row, t, p, s, seed, stream, index_base, a.data());
        const float* gt = &g[static_cast<std::size_t>((b * T + t) * d.C + h * hd)];
        float dot = 0.0f;
        for (std::int64_t u = 0; u <= t; ++u) {
          const float* vu = &x[qkv_at(b, u, 2, h)];
          float acc = 0.0f;
          for (std::int64_t i = 0; i < hd; ++i) acc = c::fma(gt[i], vu[i], acc);
          const bool kept = gpt::dropout_keep(seed, stream, index_base + row + static_cast<std::size_t>(u), p);
          da[u] = kept ? c::mul(acc, s) : 0.0f;
          dot = c::fma(at[row + static_cast<std::size_t>(u)], da[u], dot);
        }
        for (std::int64_t u = 0; u <= t; ++u)
          dz[u] = c::mul(c::mul(at[row + static_cast<std::size_t>(u)], c::sub(da[u], dot)), scale);
        // dq[t] over u ascending; dk[u] and dv[u] over t ascending (this loop's order).
        float* dqt = &dx[qkv_at(b, t, 0, h)];
        const float* qt = &x[qkv_at(b, t, 0, h)];
        for (std::int64_t u = 0; u <= t; ++u) {
          const float* ku = &x[qkv_at(b, u, 1, h)];
          float* dku = &dx[qkv_at(b, u, 1, h)];
          float* dvu = &dx[qkv_at(b, u, 2, h)];
          for (std::int64_t i = 0; i < hd; ++i) {
            dqt[i] = c::fma(dz[u], ku[i], dqt[i]);
            dku[i] = c::fma(dz[u], qt[i], dku[i]);
            dvu[i] = c::fma(a[u], gt[i], dvu[i]);
          }
        }
      }
  return Tensor::from_vector(dx, {d.B, T, 3 * d.C}, qkv.device());
}

}  // namespace ditto::nn
