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

// The dropout mask of att (1: kept), as Kernels::dropout_forward draws it.
std::vector<unsigned char> keep_mask(std::size_t n, float p, std::uint64_t seed,
                                     std::uint64_t stream, std::uint64_t index_base) {
  std::vector<unsigned char> keep(n);
  for (std::size_t i = 0; i < n; ++i) keep[i] = gpt::dropout_keep(seed, stream, index_base + i, p);
  return keep;
}

// The dropped, scaled attention weights a (zeros where dropped, and where att is: u > t).
std::vector<float> dropped(const std::vector<float>& att, const std::vector<unsigned char>& keep,
                           float s) {
  std::vector<float> a(att.size());
  for (std::size_t i = 0; i < att.size(); ++i) a[i] = keep[i] ? c::mul(att[i], s) : 0.0f;
  return a;
}

}  // namespace

Tensor attention_dropout_forward(const Tensor& qkv, const Tensor& att, std::int64_t n_head,
                                 float p, std::uint64_t seed, std::uint64_t stream,
                                 std::uint64_t index_base) {
  const AttnDims d = dims_of("nn::attention_dropout_forward", qkv, att, n_head);
  const std::vector<float> x = qkv.to_vector<float>(), at = att.to_vector<float>();
  const float s = gpt::dropout_scale(p);
  const std::vector<float> a = dropped(at, keep_mask(at.size(), p, seed, stream, index_base), s);
  std::vector<float> y(static_cast<std::size_t>(d.B * d.T * d.C));
  const std::int64_t C3 = 3 * d.C;
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h)
      for (std::int64_t t = 0; t < d.T; ++t) {
        const float* ar = &a[static_cast<std::size_t>(((b * d.nh + h) * d.T + t) * d.T)];
        for (std::int64_t i = 0; i < d.hd; ++i) {
          float acc = 0.0f;
          for (std::int64_t u = 0; u <= t; ++u)
            acc = c::fma(ar[u], x[static_cast<std::size_t>((b * d.T + u) * C3 + 2 * d.C + h * d.hd + i)], acc);
          y[static_cast<std::size_t>((b * d.T + t) * d.C + h * d.hd + i)] = acc;
        }
      }
  return Tensor::from_vector(y, {d.B, d.T, d.C}, qkv.device());
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
  const std::vector<unsigned char> keep = keep_mask(at.size(), p, seed, stream, index_base);
  const std::vector<float> a = dropped(at, keep, s);
  const float scale = gpt::attention_scale(d.hd);
  const std::int64_t C3 = 3 * d.C, T = d.T;
  std::vector<float> dx(x.size(), 0.0f), dz(static_cast<std::size_t>(T * T), 0.0f);
  // Element i of head h's q (part 0), k (1) or v (2) at position t of sample b.
  auto at_qkv = [&](std::int64_t b, std::int64_t t, int part, std::int64_t h, std::int64_t i) {
    return static_cast<std::size_t>((b * T + t) * C3 + part * d.C + h * d.hd + i);
  };
  auto at_dy = [&](std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t i) {
    return static_cast<std::size_t>((b * T + t) * d.C + h * d.hd + i);
  };
  for (std::int64_t b = 0; b < d.B; ++b)
    for (std::int64_t h = 0; h < d.nh; ++h) {
      const std::size_t base = static_cast<std::size_t>((b * d.nh + h) * T * T);
      for (std::int64_t t = 0; t < T; ++t) {  // dz row t
        float dot = 0.0f;
        std::vector<float> da(static_cast<std::size_t>(t + 1));
        for (std::int64_t u = 0; u <= t; ++u) {
          float acc = 0.0f;
          for (std::int64_t i = 0; i < d.hd; ++i)
            acc = c::fma(g[at_dy(b, t, h, i)], x[at_qkv(b, u, 2, h, i)], acc);
          const std::size_t k = base + static_cast<std::size_t>(t * T + u);
          da[static_cast<std::size_t>(u)] = keep[k] ? c::mul(acc, s) : 0.0f;
          dot = c::fma(at[k], da[static_cast<std::size_t>(u)], dot);
        }
        for (std::int64_t u = 0; u <= t; ++u) {
          const std::size_t k = base + static_cast<std::size_t>(t * T + u);
          dz[static_cast<std::size_t>(t * T + u)] =
              c::mul(c::mul(at[k], c::sub(da[static_cast<std::size_t>(u)], dot)), scale);
        }
      }
      for (std::int64_t i = 0; i < d.hd; ++i) {
        for (std::int64_t t = 0; t < T; ++t) {  // dq
          float acc = 0.0f;
          for (std::int64_t u = 0; u <= t; ++u)
            acc = c::fma(dz[static_cast<std::size_t>(t * T + u)], x[at_qkv(b, u, 1, h, i)], acc);
          dx[at_qkv(b, t, 0, h, i)] = acc;
        }
        for (std::int64_t u = 0; u < T; ++u) {  // dk, dv
          float acck = 0.0f, accv = 0.0f;
          for (std::int64_t t = u; t < T; ++t) {
            acck = c::fma(dz[static_cast<std::size_t>(t * T + u)], x[at_qkv(b, t, 0, h, i)], acck);
            accv = c::fma(a[base + static_cast<std::size_t>(t * T + u)], g[at_dy(b, t, h, i)], accv);
          }
          dx[at_qkv(b, u, 1, h, i)] = acck;
          dx[at_qkv(b, u, 2, h, i)] = accv;
        }
      }
    }
  return Tensor::from_vector(dx, {d.B, T, 3 * d.C}, qkv.device());
}

}  // namespace ditto::nn
