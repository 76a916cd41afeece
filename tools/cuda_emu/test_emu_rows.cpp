// The typed row kernels (Kernels::*_ex on bf16 / f16: backend_cuda/cuda_fused.cu and
// cuda_kernels_gpt.cu through emu.h) against the simulator's path for those dtypes (Note [Mixed
// precision]): every storage-dtype input cast to f32 (Kernels::cast), the simulator's f32 kernel,
// each output cast once into the storage dtype (MixedOp in core/runtime/ops*.cpp), all on the
// simulator's kernels; the emulated CUDA kernels load the storage dtype and round on store. Bit
// for bit, for bf16 and f16: the embedding forward (16-byte vectors of 8 elements where C % 8 ==
// 0 and aligned; a pointer shifted by one element, C % 8 != 0), LayerNorm forward (with and
// without bias) and backward on rows across the 128-float staging chunk, GELU forward and
// backward (vector groups and a ragged tail, aligned and not, NaN and +-inf inputs), the softmax
// cross-entropy and its gradient (tied maxima, signed zeros, NaN and -inf logits, rows across
// the 256-float chunk), dropout forward and backward, the embedding gradient (into f32 or the
// storage dtype, over micro-shards); and has_rows_ex's answers. The LayerNorm backward with the
// residual gradient's add (layernorm_backward_add) on f32, bf16 and f16 against the simulator's
// two ops (the backward, then ops::add), and the LayerNorm forward with the residual add before
// it (layernorm_forward_add) against ops::add and then the forward.
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numerics/float_formats.h"
#include "core/numerics/micro_shards.h"
#include "emu_check.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

// v rounded to t (bf16 or f16), as stored bytes.
Bytes to_typed(DType t, const V& v) {
  Bytes b(v.size() * 2);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t u = t == DType::bf16 ? bfloat16::from(v[i]).bits : float16::from(v[i]).bits;
    std::memcpy(b.data() + 2 * i, &u, 2);
  }
  return b;
}

// Element `off` of a typed buffer.
void* at(Bytes& b, i64 off) { return b.data() + 2 * off; }

// The simulator's widening of n elements of a typed buffer (MixedOp::in).
V widen(DType t, Bytes& b, i64 off, i64 n) {
  V f(static_cast<std::size_t>(std::max<i64>(n, 1)));
  simk->cast(*sims, at(b, off), t, f.data(), DType::f32, n);
  sims->synchronize();
  return f;
}

// The simulator's rounding of an f32 result into a typed buffer (MixedOp::out / write_back).
void round_into(DType t, const V& f, Bytes& b, i64 off, i64 n) {
  simk->cast(*sims, f.data(), DType::f32, at(b, off), t, n);
  sims->synchronize();
}

// Runs the simulator's path and the CUDA kernel, compares every output buffer; an exception of
// either is a failure.
template <class Sim, class Cuda>
void compare(const char* what, const std::string& ctx, std::vector<Bytes> outs, const Sim& sim,
             const Cuda& cuda) {
  std::vector<Bytes> s = outs, e = outs;
  try {
    sim(s);
    cuda(e);
  } catch (const std::exception& ex) {
    ++checks;
    ++failures;
    std::printf("FAIL %s %s: %s\n", what, ctx.c_str(), ex.what());
    return;
  }
  for (std::size_t i = 0; i < s.size(); ++i)
    check(what, s[i], e[i], ctx + " out" + std::to_string(i));
}

// f32 values as bytes (the f32 outputs: mean, rstd, losses), and back.
Bytes bytes_of(const V& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
float* floats(Bytes& b) { return reinterpret_cast<float*>(b.data()); }

// mixed() with NaN, +inf and -inf at a few places (the elementwise kernels' special inputs).
V with_specials(std::size_t n, unsigned seed) {
  V v = mixed(n, seed);
  if (n > 7) {
    v[1] = std::nanf("");
    v[4] = INFINITY;
    v[7] = -INFINITY;
  }
  return v;
}

void check_embedding_ex(DType t, unsigned& seed) {
  for (auto d : std::vector<std::array<i64, 4>>{{2, 3, 7, 16}, {3, 5, 11, 64}, {1, 4, 5, 12}})
    for (int off : {0, 1}) {
      const i64 B = d[0], T = d[1], V_ = d[2], C = d[3], N = B * T;
      std::mt19937 gen(seed++);
      std::vector<i64> idx(N);
      for (auto& x : idx) x = std::uniform_int_distribution<i64>(0, V_ - 1)(gen);
      Bytes wte = to_typed(t, with_specials(V_ * C + off, seed++));
      Bytes wpe = to_typed(t, mixed(T * C + off, seed++));
      Bytes out = to_typed(t, mixed(N * C + off, seed++));
      for (bool pos : {true, false})
        compare(
            "embedding_forward_ex",
            std::string(dtype_name(t)) + " " + dims({B, T, V_, C}) + " off " + std::to_string(off) +
                (pos ? " wpe" : ""),
            {out},
            [&](std::vector<Bytes>& o) {
              V wf = widen(t, wte, off, V_ * C), pf = widen(t, wpe, off, T * C), of(N * C);
              simk->embedding_forward(*sims, idx.data(), wf.data(), pos ? pf.data() : nullptr, N, T,
                                      C, of.data());
              sims->synchronize();
              round_into(t, of, o[0], off, N * C);
            },
            [&](std::vector<Bytes>& o) {
              cudak->embedding_forward_ex(cudas, t, idx.data(), at(wte, off),
                                          pos ? at(wpe, off) : nullptr, N, T, C, at(o[0], off));
            });
    }
}

// Element `off` of a buffer of dtype g (f32, or the 2-byte t).
void* at_dtype(Bytes& b, DType g, i64 off) { return b.data() + dtype_size(g) * off; }

// embedding_backward_ex: dy in t, grad_wte f32 (bitwise mode's gradients) or t; float4-wide
// columns (C 8, 16), scalar (C 6, and C 8 shifted by one element: not 8-byte aligned); ids
// skewed (one bucket holds most rows, the last ids absent); shards 1, 8 (random bounds, empty
// ones among them), 64 (one launch) and 65 (the host tree above it: f32 inner nodes, the root
// rounded into grad_wte's dtype); accumulate on and off; NaN and +-inf in dy, signed zeros in
// both. Against MixedOp: dy and grad_wte widened, the simulator's f32 kernel, grad_wte rounded.
void check_embedding_backward_ex(DType t, unsigned& seed) {
  struct Case {
    i64 N, V, C;
    int off;
  };
  for (const Case& c :
       std::vector<Case>{{40, 13, 8, 0}, {40, 13, 6, 0}, {150, 7, 8, 1}, {64, 9, 16, 0}}) {
    std::mt19937 gen(seed++);
    std::vector<i64> idx(c.N);
    for (auto& x : idx) {
      const int u = std::uniform_int_distribution<int>(0, 9)(gen);
      x = u < 6 ? 1 : std::uniform_int_distribution<i64>(0, c.V - 3)(gen);
    }
    const Bytes dy = to_typed(t, with_specials(c.N * c.C + c.off, seed++));
    for (i64 S : {1, 8, 64, 65}) {
      const Bounds bounds = S == 8 ? random_bounds(c.N, S, seed++) : micro_shard_bounds(c.N, S);
      for (DType g : {DType::f32, t})
        for (bool acc : {false, true}) {
          const V init = mixed(c.V * c.C + c.off, seed++);
          const Bytes grad = g == DType::f32 ? bytes_of(init) : to_typed(t, init);
          compare(
              "embedding_backward_ex",
              std::string(dtype_name(t)) + " grad " + dtype_name(g) + " " + dims({c.N, c.V, c.C}) +
                  " off " + std::to_string(c.off) + " S " + std::to_string(S) + " acc " +
                  std::to_string(acc),
              {dy, grad},
              [&](std::vector<Bytes>& o) {
                V dyf = widen(t, o[0], c.off, c.N * c.C);
                V gf(static_cast<std::size_t>(c.V * c.C));
                if (g == DType::f32)
                  std::memcpy(gf.data(), at_dtype(o[1], g, c.off), gf.size() * 4);
                else
                  gf = widen(t, o[1], c.off, c.V * c.C);
                simk->embedding_backward(*sims, idx.data(), dyf.data(), c.N, c.C, c.V, bounds,
                                         gf.data(), acc);
                sims->synchronize();
                if (g == DType::f32)
                  std::memcpy(at_dtype(o[1], g, c.off), gf.data(), gf.size() * 4);
                else
                  round_into(t, gf, o[1], c.off, c.V * c.C);
              },
              [&](std::vector<Bytes>& o) {
                cudak->embedding_backward_ex(cudas, t, idx.data(), at(o[0], c.off), c.N, c.C, c.V,
                                             bounds, g, at_dtype(o[1], g, c.off), acc);
              });
        }
    }
  }
}

void check_layernorm_ex(DType t, unsigned& seed) {
  for (auto n_c : std::vector<std::pair<i64, i64>>{{9, 128}, {6, 129}, {3, 257}, {2, 31}}) {
    const i64 N = n_c.first, C = n_c.second;
    const bool bias = C != 129;
    std::mt19937 gen(seed++);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    V xv(N * C), wv(C), bv(C), dyv(N * C);
    for (float& v : xv) v = u(gen);
    for (float& v : wv) v = u(gen);
    for (float& v : bv) v = u(gen);
    for (float& v : dyv) v = u(gen);
    Bytes x = to_typed(t, xv), w = to_typed(t, wv), b = to_typed(t, bv), dy = to_typed(t, dyv);
    Bytes y = to_typed(t, mixed(N * C, seed++));
    const std::string ctx = std::string(dtype_name(t)) + " " + dims({N, C}) + (bias ? " bias" : "");
    compare(
        "layernorm_forward_ex", ctx, {y, bytes_of(mixed(N, seed++)), bytes_of(mixed(N, seed++))},
        [&](std::vector<Bytes>& o) {
          V xf = widen(t, x, 0, N * C), wf = widen(t, w, 0, C), bf = widen(t, b, 0, C), yf(N * C);
          simk->layernorm_forward(*sims, xf.data(), wf.data(), bias ? bf.data() : nullptr, N, C,
                                  1e-5f, yf.data(), floats(o[1]), floats(o[2]));
          sims->synchronize();
          round_into(t, yf, o[0], 0, N * C);
        },
        [&](std::vector<Bytes>& o) {
          cudak->layernorm_forward_ex(cudas, t, at(x, 0), at(w, 0), bias ? at(b, 0) : nullptr, N, C,
                                      1e-5f, at(o[0], 0), floats(o[1]), floats(o[2]));
        });
    // The backward on the simulator's forward statistics (f32, as the op keeps them).
    V mean(N), rstd(N);
    {
      V xf = widen(t, x, 0, N * C), wf = widen(t, w, 0, C), yf(N * C);
      simk->layernorm_forward(*sims, xf.data(), wf.data(), nullptr, N, C, 1e-5f, yf.data(),
                              mean.data(), rstd.data());
      sims->synchronize();
    }
    compare(
        "layernorm_backward_ex", ctx,
        {to_typed(t, mixed(N * C, seed++)), to_typed(t, mixed(N * C, seed++))},
        [&](std::vector<Bytes>& o) {
          V dyf = widen(t, dy, 0, N * C), xf = widen(t, x, 0, N * C), wf = widen(t, w, 0, C);
          V dxf(N * C), hf(N * C);
          simk->layernorm_backward(*sims, dyf.data(), xf.data(), wf.data(), mean.data(),
                                   rstd.data(), N, C, dxf.data(), hf.data());
          sims->synchronize();
          round_into(t, dxf, o[0], 0, N * C);
          round_into(t, hf, o[1], 0, N * C);
        },
        [&](std::vector<Bytes>& o) {
          cudak->layernorm_backward_ex(cudas, t, at(dy, 0), at(x, 0), at(w, 0), mean.data(),
                                       rstd.data(), N, C, at(o[0], 0), at(o[1], 0));
        });
  }
}

// A buffer of dtype t (f32, bf16, f16) holding v rounded into t, and the simulator's widening of
// its n elements back to f32 (f32: a copy).
Bytes stored(DType t, const V& v) { return t == DType::f32 ? bytes_of(v) : to_typed(t, v); }
V widened(DType t, Bytes& b, i64 n) {
  if (t != DType::f32) return widen(t, b, 0, n);
  V f(static_cast<std::size_t>(n));
  std::memcpy(f.data(), b.data(), f.size() * 4);
  return f;
}
void store(DType t, const V& f, Bytes& b, i64 n) {
  if (t == DType::f32)
    std::memcpy(b.data(), f.data(), static_cast<std::size_t>(n) * 4);
  else
    round_into(t, f, b, 0, n);
}

// layernorm_backward_add (f32, bf16, f16: the residual gradient's add in the backward's store)
// against the simulator's two ops: layernorm_backward (MixedOp's for bf16 / f16: inputs widened,
// dx and dy_xhat rounded into t), then ops::add (residual and the stored dx widened, the f32
// sum_inputs, rounded into t). Rows across the 128-float staging chunk; residuals of every
// magnitude 1e-4 .. 1e4 (the sum's rounding), signed zeros, NaN, +-inf, and +-(about) the
// largest finite value of t.
void check_layernorm_backward_add(DType t, unsigned& seed) {
  for (auto n_c : std::vector<std::pair<i64, i64>>{{9, 128}, {6, 129}, {3, 257}, {2, 31}}) {
    const i64 N = n_c.first, C = n_c.second, n = N * C;
    std::mt19937 gen(seed++);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    V xv(n), wv(C), dyv(n);
    for (float& v : xv) v = u(gen);
    for (float& v : wv) v = u(gen);
    for (float& v : dyv) v = u(gen);
    V rv = with_specials(n, seed++);
    rv[10] = t == DType::f16 ? 65504.0f : t == DType::bf16 ? 3.38e38f : 3.4028235e38f;
    rv[11] = -rv[10];
    Bytes x = stored(t, xv), w = stored(t, wv), dy = stored(t, dyv), r = stored(t, rv);
    V mean(N), rstd(N);
    {
      V xf = widened(t, x, n), wf = widened(t, w, C), yf(n);
      simk->layernorm_forward(*sims, xf.data(), wf.data(), nullptr, N, C, 1e-5f, yf.data(),
                              mean.data(), rstd.data());
      sims->synchronize();
    }
    compare(
        "layernorm_backward_add", std::string(dtype_name(t)) + " " + dims({N, C}),
        {stored(t, mixed(n, seed++)), stored(t, mixed(n, seed++))},
        [&](std::vector<Bytes>& o) {
          V dyf = widened(t, dy, n), xf = widened(t, x, n), wf = widened(t, w, C), dxf(n), hf(n);
          simk->layernorm_backward(*sims, dyf.data(), xf.data(), wf.data(), mean.data(),
                                   rstd.data(), N, C, dxf.data(), hf.data());
          sims->synchronize();
          Bytes dx = stored(t, V(n));
          store(t, dxf, dx, n);
          store(t, hf, o[1], n);
          V rf = widened(t, r, n), dxw = widened(t, dx, n), sum(n);
          const float* in[2] = {rf.data(), dxw.data()};
          simk->sum_inputs(*sims, in, 2, sum.data(), n, Determinism::bitwise);
          sims->synchronize();
          store(t, sum, o[0], n);
        },
        [&](std::vector<Bytes>& o) {
          cudak->layernorm_backward_add(cudas, t, dy.data(), x.data(), w.data(), mean.data(),
                                        rstd.data(), r.data(), N, C, o[0].data(), o[1].data());
        });
  }
}

// ---- layernorm_backward_params (fast mode; Note [CUDA LayerNorm parameter gradients]) ---------

// Tolerances of the fused LayerNorm backward against the double reference: each output within
// u_t |ref| + s_t (the rounding into its dtype: half an ulp, 2^-8 bf16, 2^-11 f16, 0 f32; and
// half the spacing of its subnormals, 2^-25 f16, 2^-134 bf16, where u_t |ref| is less) + 1e-5
// mag, mag the same sums over absolute values (f32 math over sums of up to a few thousand terms
// in chunks, groups and a butterfly: well under 1e-5 relative to them).
double rounding_of(DType t) {
  return t == DType::bf16 ? std::ldexp(1.0, -8) : t == DType::f16 ? std::ldexp(1.0, -11) : 0.0;
}
double subnormal_rounding_of(DType t) {
  return t == DType::bf16 ? std::ldexp(1.0, -134) : t == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
}

struct LnpCase {
  DType t, gt;
  i64 N, C;
  bool residual, bias, acc_w, acc_b;
};

std::string lnp_ctx(const LnpCase& k) {
  return std::string(dtype_name(k.t)) + "->" + dtype_name(k.gt) + " " + dims({k.N, k.C}) +
         (k.residual ? " residual" : "") + (k.bias ? " bias" : " no bias") +
         (k.acc_w ? " acc_w" : "") + (k.acc_b ? " acc_b" : "") + " (" +
         std::to_string(cuda::layernorm_params_split(k.N).chunks) + " chunks)";
}

// One case: the emulated kernel with its blocks forward, reversed and shuffled (twice) gives the
// same bytes each time, within tolerance of the double reference, the ticket counters back at
// zero; grad_b untouched without a bias.
void check_layernorm_backward_params_case(const LnpCase& k, unsigned& seed) {
  const DType t = k.t, gt = k.gt;
  const i64 N = k.N, C = k.C, n = N * C;
  std::mt19937 gen(seed++);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  V xv(static_cast<std::size_t>(n)), wv(static_cast<std::size_t>(C)),
      dyv(static_cast<std::size_t>(n)), rv(static_cast<std::size_t>(n));
  for (float& v : xv) v = u(gen);
  for (float& v : wv) v = u(gen);
  for (float& v : dyv) v = u(gen);
  for (float& v : rv) v = u(gen);
  Bytes x = stored(t, xv), w = stored(t, wv), dy = stored(t, dyv), r = stored(t, rv);
  V mean(static_cast<std::size_t>(std::max<i64>(N, 1))), rstd(mean.size());
  if (N > 0) {
    V xf = widened(t, x, n), wf = widened(t, w, C), yf(static_cast<std::size_t>(n));
    simk->layernorm_forward(*sims, xf.data(), wf.data(), nullptr, N, C, 1e-5f, yf.data(),
                            mean.data(), rstd.data());
    sims->synchronize();
  }
  const Bytes gw0 = stored(gt, mixed(static_cast<std::size_t>(C), seed++)),
              gb0 = stored(gt, mixed(static_cast<std::size_t>(C), seed++));
  const Bytes dx0 = stored(t, V(static_cast<std::size_t>(std::max<i64>(n, 1)), 7.0f));
  // The double reference (the stored inputs widened exactly; mean and rstd as given).
  auto rows_of = [&](Bytes& b) { return n > 0 ? widened(t, b, n) : V(1); };
  V xd = rows_of(x), wd = widened(t, w, C), dyd = rows_of(dy), rd = rows_of(r);
  Bytes gw0c = gw0, gb0c = gb0;
  const V gw0f = widened(gt, gw0c, C), gb0f = widened(gt, gb0c, C);
  std::vector<double> ref_dx(static_cast<std::size_t>(n)), mag_dx(ref_dx.size());
  std::vector<double> sw(static_cast<std::size_t>(C)), sb(sw.size()), mw(sw.size()), mb(sw.size());
  for (i64 row = 0; row < N; ++row) {
    const double mu = mean[row], rs = rstd[row];
    double sg = 0, sgx = 0, ag = 0, agx = 0;
    for (i64 c = 0; c < C; ++c) {
      const double d = dyd[row * C + c], xh = (xd[row * C + c] - mu) * rs, g = d * wd[c];
      sg += g, sgx += g * xh, ag += std::fabs(g), agx += std::fabs(g * xh);
    }
    const double mg = sg / C, mgx = sgx / C, amg = ag / C, amgx = agx / C;
    for (i64 c = 0; c < C; ++c) {
      const std::size_t i = static_cast<std::size_t>(row * C + c);
      const double d = dyd[i], xh = (xd[i] - mu) * rs, g = d * wd[c];
      ref_dx[i] = rs * (g - mg - xh * mgx) + (k.residual ? rd[i] : 0.0);
      mag_dx[i] = std::fabs(rs) * (std::fabs(g) + amg + std::fabs(xh) * amgx) +
                  (k.residual ? std::fabs(rd[i]) : 0.0);
      sw[c] += d * xh, sb[c] += d, mw[c] += std::fabs(d * xh), mb[c] += std::fabs(d);
    }
  }
  for (i64 c = 0; c < C; ++c) {
    if (k.acc_w) sw[c] += gw0f[c], mw[c] += std::fabs(gw0f[c]);
    if (k.acc_b) sb[c] += gb0f[c], mb[c] += std::fabs(gb0f[c]);
  }
  const std::string ctx = lnp_ctx(k);
  const std::pair<EmuBlockOrder, const char*> orders[] = {{EmuBlockOrder::forward, "forward"},
                                                          {EmuBlockOrder::reversed, "reversed"},
                                                          {EmuBlockOrder::shuffled, "shuffled"},
                                                          {EmuBlockOrder::shuffled, "shuffled"}};
  Bytes first_dx, first_gw, first_gb;
  for (const auto& [order, name] : orders) {
    Bytes dx = dx0, gw = gw0, gb = gb0;
    emu_block_order = order;
    try {
      cudak->layernorm_backward_params(cudas, t, dy.data(), x.data(), w.data(), mean.data(),
                                       rstd.data(), k.residual ? r.data() : nullptr, N, C,
                                       dx.data(), gt, gw.data(), k.acc_w,
                                       k.bias ? gb.data() : nullptr, k.acc_b);
    } catch (const std::exception& e) {
      emu_block_order = EmuBlockOrder::forward;
      ++checks;
      ++failures;
      std::printf("FAIL layernorm_backward_params %s blocks %s: %s\n", ctx.c_str(), name, e.what());
      return;
    }
    emu_block_order = EmuBlockOrder::forward;
    if (first_dx.empty()) {  // the first run against the reference
      first_dx = dx, first_gw = gw, first_gb = gb;
      auto within = [&](const char* what, DType dt, const Bytes& got,
                        const std::vector<double>& ref, const std::vector<double>& mag) {
        ++checks;
        Bytes g = got;
        const V f = widened(dt, g, static_cast<i64>(ref.size()));
        for (std::size_t i = 0; i < ref.size(); ++i) {
          const double tol = rounding_of(dt) * std::fabs(ref[i]) + subnormal_rounding_of(dt) +
                             1e-5 * mag[i] + 1e-30;
          if (!(std::fabs(f[i] - ref[i]) <= tol)) {
            ++failures;
            std::printf("FAIL layernorm_backward_params %s %s[%zu]: %.9g vs ref %.9g (tol %.3g)\n",
                        ctx.c_str(), what, i, f[i], ref[i], tol);
            return;
          }
        }
      };
      within("dx", t, dx, ref_dx, mag_dx);
      within("grad_w", gt, gw, sw, mw);
      if (k.bias) {
        within("grad_b", gt, gb, sb, mb);
      } else {
        check("layernorm_backward_params grad_b untouched", gb0, gb, ctx);
      }
    } else {
      check("layernorm_backward_params dx, run again", first_dx, dx, ctx + " blocks " + name);
      check("layernorm_backward_params grad_w, run again", first_gw, gw, ctx + " blocks " + name);
      check("layernorm_backward_params grad_b, run again", first_gb, gb, ctx + " blocks " + name);
    }
    ++checks;
    if (std::any_of(cudas.sem.begin(), cudas.sem.end(), [](unsigned v) { return v != 0; })) {
      ++failures;
      std::printf("FAIL layernorm_backward_params %s blocks %s: a ticket counter left non-zero\n",
                  ctx.c_str(), name);
      std::fill(cudas.sem.begin(), cudas.sem.end(), 0u);
    }
  }
}

// The shapes: 1 row, a ragged last 8-row group, one chunk (N <= 16), one group of chunks (200
// rows: 13 chunks of 16), several groups (3000 rows: 188 chunks in 12 groups; 4100: 257 of 16,
// 17 groups), C below, at and past the 32 lanes and not a multiple of a 16-byte vector (1, 31,
// 129), past one shared-memory tile of 2048 columns (2050: the rows run again per tile); a new
// gradient and an existing one accumulated, into f32 and into the storage dtype, with and
// without the residual and the bias.
void check_layernorm_backward_params(unsigned& seed) {
  std::vector<LnpCase> cases;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const DType other = t == DType::f32 ? DType::f32 : DType::f32;
    cases.push_back({t, t, 1, 31, true, true, false, false});
    cases.push_back({t, other, 13, 129, false, true, true, true});
    cases.push_back({t, t, 200, 40, true, true, true, false});
    cases.push_back({t, t, 3000, 24, true, true, false, true});
    cases.push_back({t, t, 37, 2050, false, false, true, false});
  }
  cases.push_back({DType::bf16, DType::bf16, 4100, 9, false, true, true, true});
  cases.push_back({DType::f32, DType::f32, 17, 1, true, true, false, false});
  cases.push_back({DType::f16, DType::f16, 0, 5, false, true, true, false});  // no rows
  for (const LnpCase& k : cases)
    guarded("layernorm_backward_params " + lnp_ctx(k),
            [&] { check_layernorm_backward_params_case(k, seed); });
}

// layernorm_forward_add (f32, bf16, f16: the residual add in the LayerNorm forward's kernel)
// against the simulator's two ops: ops::add (x and branch widened, the f32 sum_inputs, x first,
// rounded into t: the residual), then layernorm_forward of that stored residual (MixedOp's for
// bf16 / f16: widened, y rounded into t; mean and rstd f32). Rows across the 128-float staging
// chunk, with and without bias; branches of every magnitude 1e-4 .. 1e4 (the sum's rounding),
// signed zeros (-0 + -0 and +0 + -0), NaN and +-inf (row 0: a row of NaN), and in row 1 sums
// near t's largest finite value: max + max (overflows to inf), max + -max (0), max + -1 and
// max + 1 (rounds back to max or not).
void check_layernorm_forward_add(DType t, unsigned& seed) {
  const float big = t == DType::f16 ? 65504.0f : t == DType::bf16 ? 3.3895314e38f : 3.4028235e38f;
  for (auto n_c : std::vector<std::pair<i64, i64>>{{9, 128}, {6, 129}, {3, 257}, {2, 31}})
    for (bool bias : {true, false}) {
      const i64 N = n_c.first, C = n_c.second, n = N * C;
      std::mt19937 gen(seed++);
      std::uniform_real_distribution<float> u(-3.0f, 3.0f);
      V xv(n), wv(C), bv(C);
      for (float& v : xv) v = u(gen);
      for (float& v : wv) v = u(gen);
      for (float& v : bv) v = u(gen);
      V brv = with_specials(n, seed++);
      xv[2] = -0.0f;
      brv[2] = -0.0f;
      xv[3] = 0.0f;
      brv[3] = -0.0f;
      const float near[4][2] = {{big, big}, {big, -big}, {big, -1.0f}, {-big, 1.0f}};
      for (int k = 0; k < 4; ++k) {
        xv[C + 2 * k] = near[k][0];
        brv[C + 2 * k] = near[k][1];
      }
      Bytes x = stored(t, xv), br = stored(t, brv), w = stored(t, wv), b = stored(t, bv);
      compare(
          "layernorm_forward_add",
          std::string(dtype_name(t)) + " " + dims({N, C}) + (bias ? " bias" : ""),
          {stored(t, mixed(n, seed++)), stored(t, mixed(n, seed++)), bytes_of(mixed(N, seed++)),
           bytes_of(mixed(N, seed++))},
          [&](std::vector<Bytes>& o) {
            V xf = widened(t, x, n), bf = widened(t, br, n), sum(n);
            const float* in[2] = {xf.data(), bf.data()};
            simk->sum_inputs(*sims, in, 2, sum.data(), n, Determinism::bitwise);
            sims->synchronize();
            store(t, sum, o[0], n);
            V rf = widened(t, o[0], n), wf = widened(t, w, C), bsf = widened(t, b, C), yf(n);
            simk->layernorm_forward(*sims, rf.data(), wf.data(), bias ? bsf.data() : nullptr, N, C,
                                    1e-5f, yf.data(), floats(o[2]), floats(o[3]));
            sims->synchronize();
            store(t, yf, o[1], n);
          },
          [&](std::vector<Bytes>& o) {
            cudak->layernorm_forward_add(cudas, t, x.data(), br.data(), w.data(),
                                         bias ? b.data() : nullptr, N, C, 1e-5f, o[0].data(),
                                         o[1].data(), floats(o[2]), floats(o[3]));
          });
    }
}

void check_gelu_ex(DType t, unsigned& seed) {
  for (i64 n : {3, 16, 1003})
    for (int off : {0, 1}) {
      Bytes x = to_typed(t, with_specials(n + off, seed++));
      Bytes gy = to_typed(t, with_specials(n + off, seed++));
      const std::string ctx =
          std::string(dtype_name(t)) + " n " + std::to_string(n) + " off " + std::to_string(off);
      compare(
          "gelu_forward_ex", ctx, {to_typed(t, mixed(n + off, seed++))},
          [&](std::vector<Bytes>& o) {
            V xf = widen(t, x, off, n), yf(n);
            simk->gelu_forward(*sims, xf.data(), yf.data(), n);
            sims->synchronize();
            round_into(t, yf, o[0], off, n);
          },
          [&](std::vector<Bytes>& o) {
            cudak->gelu_forward_ex(cudas, t, at(x, off), at(o[0], off), n);
          });
      compare(
          "gelu_backward_ex", ctx, {to_typed(t, mixed(n + off, seed++))},
          [&](std::vector<Bytes>& o) {
            V xf = widen(t, x, off, n), gf = widen(t, gy, off, n), rf(n);
            simk->gelu_backward(*sims, xf.data(), gf.data(), rf.data(), n);
            sims->synchronize();
            round_into(t, rf, o[0], off, n);
          },
          [&](std::vector<Bytes>& o) {
            cudak->gelu_backward_ex(cudas, t, at(x, off), at(gy, off), at(o[0], off), n);
          });
    }
}

void check_cross_entropy_ex(DType t, unsigned& seed) {
  for (auto rc : std::vector<std::pair<i64, i64>>{{5, 1}, {9, 33}, {6, 300}, {5, 513}}) {
    const i64 rows = rc.first, classes = rc.second;
    V xv = mixed(rows * classes, seed++);
    std::mt19937 gen(seed++);
    std::vector<i64> tg(rows);
    for (auto& v : tg) v = std::uniform_int_distribution<i64>(0, classes - 1)(gen);
    if (classes >= 33) {  // the f32 test's rows (test_emu_fused.cpp), exact in bf16 and f16
      for (i64 c = 0; c < classes; ++c) xv[c] = c % 3 == 0 ? -1.0f : -2.0f;
      xv[5] = -0.0f;
      xv[classes - 1] = 0.0f;
      for (i64 c = 0; c < classes; ++c) xv[classes + c] = -3.0f;
      xv[classes + 7] = 0.0f;
      xv[classes + 20] = -0.0f;
      xv[2 * classes + 3] = std::nanf("");
      xv[2 * classes + 4] = -INFINITY;
      for (i64 c = 0; c < classes; ++c) xv[3 * classes + c] = -INFINITY;
      xv[4 * classes + 11] = 7.5f;
      xv[4 * classes + 30] = 7.5f;
    }
    Bytes x = to_typed(t, xv);
    V gl = {0.75f};
    const std::string ctx = std::string(dtype_name(t)) + " " + dims({rows, classes});
    compare(
        "cross_entropy_ex", ctx, {bytes_of(mixed(rows, seed++))},
        [&](std::vector<Bytes>& o) {
          V xf = widen(t, x, 0, rows * classes);
          simk->cross_entropy(*sims, xf.data(), tg.data(), rows, classes, floats(o[0]));
          sims->synchronize();
        },
        [&](std::vector<Bytes>& o) {
          cudak->cross_entropy_ex(cudas, t, at(x, 0), tg.data(), rows, classes, floats(o[0]));
        });
    compare(
        "cross_entropy_backward_ex", ctx, {to_typed(t, mixed(rows * classes, seed++))},
        [&](std::vector<Bytes>& o) {
          V xf = widen(t, x, 0, rows * classes), gf(rows * classes);
          simk->cross_entropy_backward(*sims, xf.data(), tg.data(), rows, classes, gl.data(),
                                       0.125f, gf.data());
          sims->synchronize();
          round_into(t, gf, o[0], 0, rows * classes);
        },
        [&](std::vector<Bytes>& o) {
          cudak->cross_entropy_backward_ex(cudas, t, at(x, 0), tg.data(), rows, classes, gl.data(),
                                           0.125f, at(o[0], 0));
        });
  }
}

void check_dropout_ex(DType t, unsigned& seed) {
  for (int off : {0, 1}) {
    const i64 n = 1003;
    Bytes x = to_typed(t, with_specials(n + off, seed++));
    const std::string ctx = std::string(dtype_name(t)) + " off " + std::to_string(off);
    for (bool forward : {true, false})
      compare(
          forward ? "dropout_forward_ex" : "dropout_backward_ex", ctx,
          {to_typed(t, mixed(n + off, seed++))},
          [&](std::vector<Bytes>& o) {
            V xf = widen(t, x, off, n), yf(n);
            if (forward)
              simk->dropout_forward(*sims, xf.data(), yf.data(), n, 0.3f, 42, 7, 1000);
            else
              simk->dropout_backward(*sims, xf.data(), yf.data(), n, 0.3f, 42, 7, 1000);
            sims->synchronize();
            round_into(t, yf, o[0], off, n);
          },
          [&](std::vector<Bytes>& o) {
            if (forward)
              cudak->dropout_forward_ex(cudas, t, at(x, off), at(o[0], off), n, 0.3f, 42, 7, 1000);
            else
              cudak->dropout_backward_ex(cudas, t, at(x, off), at(o[0], off), n, 0.3f, 42, 7, 1000);
          });
  }
}

}  // namespace

void check_typed_rows(unsigned& seed) {
  for (DType t : {DType::bf16, DType::f16}) {
    for (auto* part : {check_embedding_ex, check_embedding_backward_ex, check_layernorm_ex,
                       check_gelu_ex, check_cross_entropy_ex, check_dropout_ex})
      guarded(std::string("typed rows ") + dtype_name(t), [&] { part(t, seed); });
  }
  // layernorm_backward_add on f32, bf16, f16; has_layernorm_backward_add: those on CUDA, none
  // on the simulator's real run.
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    guarded(std::string("layernorm_backward_add ") + dtype_name(t),
            [&] { check_layernorm_backward_add(t, seed); });
  // layernorm_forward_add likewise.
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    guarded(std::string("layernorm_forward_add ") + dtype_name(t),
            [&] { check_layernorm_forward_add(t, seed); });
  ++checks;
  if (!cudak->has_layernorm_forward_add(DType::f32) ||
      !cudak->has_layernorm_forward_add(DType::bf16) ||
      !cudak->has_layernorm_forward_add(DType::f16) ||
      cudak->has_layernorm_forward_add(DType::f64) ||
      simk->has_layernorm_forward_add(DType::bf16) || simk->has_layernorm_forward_add(DType::f32)) {
    ++failures;
    std::printf(
        "FAIL has_layernorm_forward_add: cuda f32 / bf16 / f16 / f64 %d %d %d %d, sim "
        "bf16 / f32 %d %d\n",
        cudak->has_layernorm_forward_add(DType::f32), cudak->has_layernorm_forward_add(DType::bf16),
        cudak->has_layernorm_forward_add(DType::f16), cudak->has_layernorm_forward_add(DType::f64),
        simk->has_layernorm_forward_add(DType::bf16), simk->has_layernorm_forward_add(DType::f32));
  }
  ++checks;
  if (!cudak->has_layernorm_backward_add(DType::f32) ||
      !cudak->has_layernorm_backward_add(DType::bf16) ||
      !cudak->has_layernorm_backward_add(DType::f16) ||
      cudak->has_layernorm_backward_add(DType::f64) ||
      simk->has_layernorm_backward_add(DType::bf16) ||
      simk->has_layernorm_backward_add(DType::f32)) {
    ++failures;
    std::printf("FAIL has_layernorm_backward_add: cuda f32 / bf16 / f16 / f64 %d %d %d %d, sim "
                "bf16 / f32 %d %d\n",
                cudak->has_layernorm_backward_add(DType::f32),
                cudak->has_layernorm_backward_add(DType::bf16),
                cudak->has_layernorm_backward_add(DType::f16),
                cudak->has_layernorm_backward_add(DType::f64),
                simk->has_layernorm_backward_add(DType::bf16),
                simk->has_layernorm_backward_add(DType::f32));
  }
  // The fused LayerNorm backward with its parameter gradients (fast mode); has_: f32, bf16, f16
  // in fast mode on CUDA, never in bitwise mode, never on the simulator's real run.
  check_layernorm_backward_params(seed);
  ++checks;
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (!cudak->has_layernorm_backward_params(t, Determinism::fast) ||
        cudak->has_layernorm_backward_params(t, Determinism::bitwise) ||
        simk->has_layernorm_backward_params(t, Determinism::fast)) {
      ++failures;
      std::printf("FAIL has_layernorm_backward_params %s: cuda fast %d bitwise %d, sim fast %d\n",
                  dtype_name(t), cudak->has_layernorm_backward_params(t, Determinism::fast),
                  cudak->has_layernorm_backward_params(t, Determinism::bitwise),
                  simk->has_layernorm_backward_params(t, Determinism::fast));
      break;
    }
  if (cudak->has_layernorm_backward_params(DType::f64, Determinism::fast)) {
    ++failures;
    std::printf("FAIL has_layernorm_backward_params f64: cuda says true\n");
  }
  // has_rows_ex: bf16 and f16 in both modes; not f32 (its own kernels) nor another dtype.
  ++checks;
  for (Determinism m : {Determinism::fast, Determinism::bitwise})
    if (!cudak->has_rows_ex(DType::bf16, m) || !cudak->has_rows_ex(DType::f16, m) ||
        cudak->has_rows_ex(DType::f32, m) || cudak->has_rows_ex(DType::f64, m) ||
        simk->has_rows_ex(DType::bf16, m)) {
      ++failures;
      std::printf("FAIL has_rows_ex: cuda bf16 / f16 %d %d, f32 %d, f64 %d; sim bf16 %d\n",
                  cudak->has_rows_ex(DType::bf16, m), cudak->has_rows_ex(DType::f16, m),
                  cudak->has_rows_ex(DType::f32, m), cudak->has_rows_ex(DType::f64, m),
                  simk->has_rows_ex(DType::bf16, m));
      break;
    }
}
