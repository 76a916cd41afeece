// The double-precision reference of causal attention that the emulator's attention tests
// (test_emu_gpt.cpp's f32 kernels, test_emu_attention.cpp's typed ones) check the fast kernels
// against (issue 29 item 6).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numerics/gpt_math.h"
#include "emu_check.h"

// Causal attention of one (B, T, C, nh) in double from the same qkv, dy and dropout mask (the
// float score scale and dropout scale the kernels use): y, stats {m, sum}, pd and dqkv.
struct AttnReference {
  std::vector<double> y, m, sum, pd, dqkv;
};

inline AttnReference attention_reference(const V& qkv, const V& dy, i64 B, i64 T, i64 C, i64 nh,
                                         const gpt::AttentionDropout& drop) {
  const i64 hd = C / nh, W = 3 * C;
  const double scale = gpt::attention_scale(hd);
  const double ds = drop.active() ? gpt::dropout_scale(drop.p) : 1.0;
  AttnReference r;
  r.y.assign(B * T * C, 0.0);
  r.m.assign(B * nh * T, 0.0);
  r.sum.assign(B * nh * T, 0.0);
  r.pd.assign(B * nh * T, 0.0);
  r.dqkv.assign(B * T * W, 0.0);
  std::vector<double> s(T), att(T), a(T), dp(T), da(T);
  for (i64 b = 0; b < B; ++b)
    for (i64 h = 0; h < nh; ++h)
      for (i64 t = 0; t < T; ++t) {
        const float* q = qkv.data() + (b * T + t) * W + h * hd;
        const float* g = dy.data() + (b * T + t) * C + h * hd;
        double m = -INFINITY, sum = 0.0, pd = 0.0;
        for (i64 u = 0; u <= t; ++u) {
          const float* k = qkv.data() + (b * T + u) * W + C + h * hd;
          const float* v = k + C;
          double d = 0.0, e = 0.0;
          for (i64 i = 0; i < hd; ++i) {
            d += double(q[i]) * k[i];
            e += double(g[i]) * v[i];
          }
          s[u] = d * scale;
          dp[u] = e;
          m = std::max(m, s[u]);
        }
        for (i64 u = 0; u <= t; ++u) sum += std::exp(s[u] - m);
        const std::uint64_t row = gpt::attention_row_index(nh, T, b, h, t);
        for (i64 u = 0; u <= t; ++u) {
          att[u] = std::exp(s[u] - m) / sum;
          const bool keep = !drop.active() || drop.kept(row + std::uint64_t(u));
          a[u] = keep ? att[u] * ds : 0.0;
          da[u] = keep ? dp[u] * ds : 0.0;
          pd += att[u] * da[u];
        }
        const i64 q_row = (b * nh + h) * T + t;
        r.m[q_row] = m;
        r.sum[q_row] = sum;
        r.pd[q_row] = pd;
        for (i64 u = 0; u <= t; ++u) {
          const float* k = qkv.data() + (b * T + u) * W + C + h * hd;
          const float* v = k + C;
          const double dpre = att[u] * (da[u] - pd) * scale;
          double* dq = r.dqkv.data() + (b * T + t) * W + h * hd;
          double* dk = r.dqkv.data() + (b * T + u) * W + C + h * hd;
          double* dv = dk + C;
          for (i64 i = 0; i < hd; ++i) {
            r.y[(b * T + t) * C + h * hd + i] += a[u] * v[i];
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
            dv[i] += a[u] * g[i];
          }
        }
      }
  return r;
}
