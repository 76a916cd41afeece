// The kernels of backend_cuda/cuda_fused.cu (Note [CUDA fused kernels]) beyond the cases of
// test_emu_gpt.cpp, against the simulator bit for bit: the float4 paths of the embedding and
// GELU (aligned, misaligned, tails), the softmax cross-entropy's warp rows (tied maxima, signed
// zeros, NaN and -inf logits), the embedding gradient's bucketing (a bucket larger than a
// sort tile, absent and single-row buckets, more shards than one launch takes), LayerNorm rows
// across the staging chunk, and the multi-tensor kernels (adam_step_multi with AdamW's decay,
// per-tensor bias corrections, amsgrad, more tensors than one launch's table; sum_squares_multi,
// scale_multi, and fill_multi, whose table holds 1024 tensors: 1100 tested; copy_multi's copies
// and casts, check_copy_multi) against the simulator's per-tensor kernels (Kernels' defaults).
// Fast-mode sum_squares_multi: within 1e-5 relative of a double-precision reference. The typed
// (bf16 / f16) versions of the row kernels: test_emu_rows.cpp, run with these.
#include <array>
#include <cmath>
#include <cstring>

#include "core/numerics/float_formats.h"
#include "core/numerics/gpt_math.h"
#include "core/numerics/micro_shards.h"
#include "emu_check.h"

namespace {

void check_embedding_paths(unsigned& seed) {
  // Forward: C % 4 == 0 (float4) aligned and shifted by one float (scalar path), and C odd.
  for (auto d : std::vector<std::array<i64, 4>>{{2, 3, 7, 8}, {3, 5, 11, 64}, {1, 4, 5, 12}})
    for (int off : {0, 1}) {
      const i64 B = d[0], T = d[1], V_ = d[2], C = d[3], N = B * T;
      std::mt19937 gen(seed++);
      std::vector<i64> idx(N);
      for (auto& t : idx) t = std::uniform_int_distribution<i64>(0, V_ - 1)(gen);
      V wte = mixed(V_ * C + off, seed++), wpe = mixed(T * C + off, seed++),
        out = mixed(N * C + off, seed++);
      for (bool pos : {true, false})
        both("embedding_forward (fused)",
             dims({B, T, V_, C}) + " off " + std::to_string(off) + (pos ? " wpe" : ""),
             {wte, wpe, out}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.embedding_forward(s, idx.data(), b[0].data() + off,
                                   pos ? b[1].data() + off : nullptr, N, T, C, b[2].data() + off);
             });
    }
  // Backward: float4 columns (C 8, 12) and scalar (C 6, and C 8 shifted); ids skewed so that one
  // bucket holds most rows (N 2100: more than a 1024-row sort tile), the last rows of the
  // vocabulary absent; shards 1, 8, 64 (one launch), 65 and 130 (the host tree above it).
  struct Case {
    i64 N, V, C;
    int off;
  };
  for (const Case& c : std::vector<Case>{
           {40, 13, 8, 0}, {40, 13, 6, 0}, {300, 7, 12, 0}, {300, 7, 8, 1}, {2100, 5, 4, 0}}) {
    std::mt19937 gen(seed++);
    std::vector<i64> idx(c.N);
    for (auto& t : idx) {
      const int u = std::uniform_int_distribution<int>(0, 9)(gen);
      t = u < 7 ? 1 : std::uniform_int_distribution<i64>(0, c.V - 3)(gen);
    }
    for (i64 S : {1, 8, 64, 65, 130}) {
      if (c.N == 2100 && S > 8) continue;  // keep the emulated thread count small
      const Bounds bounds = S == 8 ? random_bounds(c.N, S, seed++) : micro_shard_bounds(c.N, S);
      for (bool acc : {false, true}) {
        V dy = mixed(c.N * c.C + c.off, seed++), g = mixed(c.V * c.C + c.off, seed++);
        both("embedding_backward (fused)",
             dims({c.N, c.V, c.C}) + " off " + std::to_string(c.off) + " S " + std::to_string(S) +
                 " acc " + std::to_string(acc),
             {dy, g}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.embedding_backward(s, idx.data(), b[0].data() + c.off, c.N, c.C, c.V, bounds,
                                    b[1].data() + c.off, acc);
             });
      }
    }
  }
}

void check_layernorm_chunks(unsigned& seed) {
  // Rows around the 128-float staging chunk, a row count not a multiple of the 4 warps.
  for (auto n_c : std::vector<std::pair<i64, i64>>{{9, 128}, {6, 129}, {3, 257}, {2, 31}}) {
    const i64 N = n_c.first, C = n_c.second;
    std::mt19937 gen(seed++);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    V x(N * C), w(C), bias(C), dy(N * C);
    for (float& v : x) v = u(gen);
    for (float& v : w) v = u(gen);
    for (float& v : bias) v = u(gen);
    for (float& v : dy) v = u(gen);
    V y = mixed(N * C, seed++), mean = mixed(N, seed++), rstd = mixed(N, seed++);
    both("layernorm_forward (fused)", dims({N, C}), {x, w, bias, y, mean, rstd},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.layernorm_forward(s, b[0].data(), b[1].data(), b[2].data(), N, C, 1e-5f, b[3].data(),
                               b[4].data(), b[5].data());
         });
    simk->layernorm_forward(*sims, x.data(), w.data(), bias.data(), N, C, 1e-5f, y.data(),
                            mean.data(), rstd.data());
    sims->synchronize();
    V dx = mixed(N * C, seed++), dyx = mixed(N * C, seed++);
    both("layernorm_backward (fused)", dims({N, C}), {dy, x, w, mean, rstd, dx, dyx},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.layernorm_backward(s, b[0].data(), b[1].data(), b[2].data(), b[3].data(), b[4].data(),
                                N, C, b[5].data(), b[6].data());
         });
  }
}

void check_gelu_paths(unsigned& seed) {
  for (i64 n : {3, 1003})
    for (int off : {0, 1}) {
      V x = mixed(n + off, seed++), gy = mixed(n + off, seed++), y = mixed(n + off, seed++);
      const std::string ctx = "n " + std::to_string(n) + " off " + std::to_string(off);
      both("gelu_forward (fused)", ctx, {x, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.gelu_forward(s, b[0].data() + off, b[1].data() + off, n);
      });
      both("gelu_backward (fused)", ctx, {x, gy, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.gelu_backward(s, b[0].data() + off, b[1].data() + off, b[2].data() + off, n);
      });
    }
}

// Softmax cross-entropy, a warp per row: rows across the 256-float staging chunk; rows whose
// maximum is tied (+0 and -0 first in either order, a repeated value), with NaN and -inf
// entries, and all -inf.
void check_cross_entropy_rows(unsigned& seed) {
  for (auto rc : std::vector<std::pair<i64, i64>>{{5, 1}, {9, 33}, {6, 300}, {5, 513}}) {
    const i64 rows = rc.first, classes = rc.second;
    V x = mixed(rows * classes, seed++);
    std::mt19937 gen(seed++);
    std::vector<i64> t(rows);
    for (auto& v : t) v = std::uniform_int_distribution<i64>(0, classes - 1)(gen);
    if (rows >= 5 && classes >= 33) {
      for (i64 c = 0; c < classes; ++c) x[c] = c % 3 == 0 ? -1.0f : -2.0f;  // row 0: max <= 0
      x[5] = -0.0f;
      x[classes - 1] = 0.0f;                                     // the max is 0, -0 first
      for (i64 c = 0; c < classes; ++c) x[classes + c] = -3.0f;  // row 1
      x[classes + 7] = 0.0f;
      x[classes + 20] = -0.0f;  // +0 first
      x[2 * classes + 3] = std::nanf("");
      x[2 * classes + 4] = -INFINITY;
      for (i64 c = 0; c < classes; ++c) x[3 * classes + c] = -INFINITY;  // row 3
      x[4 * classes + 11] = 7.5f;
      x[4 * classes + 30] = 7.5f;  // a tie: the first index wins
    }
    V losses = mixed(rows, seed++), g = mixed(rows * classes, seed++), gl = {0.75f};
    both("cross_entropy (warp rows)", dims({rows, classes}), {x, losses},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.cross_entropy(s, b[0].data(), t.data(), rows, classes, b[1].data());
         });
    both("cross_entropy_backward (warp rows)", dims({rows, classes}), {x, gl, g},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.cross_entropy_backward(s, b[0].data(), t.data(), rows, classes, b[1].data(), 0.125f,
                                    b[2].data());
         });
  }
}

// cross_entropy_fused (Note [CUDA fused cross-entropy]; fast mode: not the simulator's bits)
// against a double-precision reference from the stored logits: every row's loss within
// 3e-5 max(1, |loss|) and every class's gradient within |factor| (3e-5 p + 1e-12) of
// factor (p - [c == t]), plus the rounding of the stored result (f32 2^-23, bf16 2^-8, f16 2^-11
// relative, f16 also 2^-24 absolute: p - 1 of the target rounds to -1 in f32 for p < 2^-25).
// Nothing ignored: every row and column. Rows with the target first and last, huge (1e4) and tiny
// (-1e4) logits, one dominant class, a constant row; V 1, 33, 513, 50257 (GPT-2's) and 50304 (its
// padding), f32 / bf16 / f16.
float xent_widen(DType t, std::uint16_t u) {
  bfloat16 b;
  float16 h;
  b.bits = h.bits = u;
  return t == DType::bf16 ? b.to_float() : h.to_float();
}

struct XentWorst {
  double loss = 0, grad = 0;  // the largest error / tolerance seen
};

void check_cross_entropy_fused_case(DType t, i64 rows, i64 classes, unsigned seed,
                                    XentWorst& worst) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  V x(static_cast<std::size_t>(rows * classes));
  std::vector<i64> tg(static_cast<std::size_t>(rows));
  for (i64 r = 0; r < rows; ++r) {
    float* row = x.data() + r * classes;
    const int kind = static_cast<int>(r % 5);
    for (i64 c = 0; c < classes; ++c) {
      const float v = nd(gen);
      row[c] = kind == 1 ? 1e4f + v : kind == 2 ? -1e4f + v : kind == 4 ? 0.5f : v;
    }
    tg[r] = r == 0   ? 0
            : r == 1 ? classes - 1
                     : std::uniform_int_distribution<i64>(0, classes - 1)(gen);
    if (kind == 3) row[tg[r]] = 40.0f;  // one dominant class: p_t ~ 1, the loss ~ 0
  }
  const std::string ctx = std::string(dtype_name(t)) + " " + dims({rows, classes});
  // The stored logits (rounded into t) and their f32 values, the reference's input.
  std::vector<std::uint8_t> buf;
  if (t == DType::f32) {
    buf.resize(x.size() * 4);
    std::memcpy(buf.data(), x.data(), buf.size());
  } else {
    buf.resize(x.size() * 2);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::uint16_t u =
          t == DType::bf16 ? bfloat16::from(x[i]).bits : float16::from(x[i]).bits;
      std::memcpy(buf.data() + 2 * i, &u, 2);
      x[i] = xent_widen(t, u);
    }
  }
  auto load = [&](std::size_t i) {
    if (t == DType::f32) {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
    std::uint16_t u;
    std::memcpy(&u, buf.data() + 2 * i, 2);
    return xent_widen(t, u);
  };
  V losses(static_cast<std::size_t>(rows), -7.0f);
  const float grad_loss = 0.75f, scale = 1.0f / 3.0f;
  const double factor = double(grad_loss * scale);
  ++checks;
  try {
    cudak->cross_entropy_fused(cudas, t, buf.data(), tg.data(), rows, classes, &grad_loss, scale,
                               losses.data());
    cudas.synchronize();
  } catch (const std::exception& e) {
    ++failures;
    std::printf("FAIL cross_entropy_fused %s: %s\n", ctx.c_str(), e.what());
    return;
  }
  const double rel = t == DType::f32 ? 0x1p-23 : t == DType::bf16 ? 0x1p-8 : 0x1p-11;
  const double floor = t == DType::f16 ? 0x1p-24 : 0.0;
  int bad = 0;
  for (i64 r = 0; r < rows; ++r) {
    const float* row = x.data() + r * classes;
    double m = -INFINITY;
    for (i64 c = 0; c < classes; ++c) m = std::max(m, double(row[c]));
    double s = 0;
    for (i64 c = 0; c < classes; ++c) s += std::exp(double(row[c]) - m);
    const double loss = std::log(s) - (double(row[tg[r]]) - m);
    const double ltol = 3e-5 * std::max(1.0, std::fabs(loss));
    const double lerr = std::fabs(double(losses[r]) - loss);
    worst.loss = std::max(worst.loss, lerr / ltol);
    if (!(lerr <= ltol) && bad++ < 3)
      std::printf("FAIL cross_entropy_fused %s row %lld: loss %.9g, reference %.12g\n", ctx.c_str(),
                  static_cast<long long>(r), double(losses[r]), loss);
    for (i64 c = 0; c < classes; ++c) {
      const double p = std::exp(double(row[c]) - m) / s;
      const double ref = factor * (p - (c == tg[r] ? 1.0 : 0.0));
      const double got = load(static_cast<std::size_t>(r * classes + c));
      const double tol = std::fabs(factor) * (3e-5 * p + 1e-12) + rel * std::fabs(ref) + floor;
      const double err = std::fabs(got - ref);
      worst.grad = std::max(worst.grad, err / tol);
      if (!(err <= tol) && bad++ < 3)
        std::printf("FAIL cross_entropy_fused %s row %lld class %lld: grad %.9g, reference %.12g\n",
                    ctx.c_str(), static_cast<long long>(r), static_cast<long long>(c), got, ref);
    }
  }
  if (bad > 0) ++failures;
}

void check_cross_entropy_fused(unsigned& seed) {
  XentWorst worst;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (auto rc : std::vector<std::pair<i64, i64>>{{5, 1}, {7, 33}, {10, 513}})
      check_cross_entropy_fused_case(t, rc.first, rc.second, seed++, worst);
    // GPT-2's vocabulary and its padding: rows of every kind (normal, huge, tiny, dominant,
    // constant), the target first in row 0 and last in row 1.
    check_cross_entropy_fused_case(t, 5, 50257, seed++, worst);
    check_cross_entropy_fused_case(t, 2, 50304, seed++, worst);
  }
  std::printf("cross_entropy_fused: worst error / tolerance: loss %.3g, gradient %.3g\n",
              worst.loss, worst.grad);
}

std::vector<i64> multi_sizes(unsigned seed, int count) {
  std::mt19937 gen(seed);
  std::vector<i64> s;
  for (int i = 0; i < count; ++i) s.push_back(std::uniform_int_distribution<i64>(0, 40)(gen));
  return s;
}

// fill_multi past its 1024-tensor table (two launches), tensors of 0-40 elements.
void check_fill_multi_tables(unsigned& seed) {
  const std::vector<i64> sizes = multi_sizes(seed++, 1100);
  const Packed pk(sizes);
  both("fill_multi", "tensors 1100", {mixed(pk.total, seed++)},
       [&](Kernels& k, Stream& s, std::vector<V>& b) {
         std::vector<float*> xs;
         for (i64 a : pk.at) xs.push_back(b[0].data() + a);
         k.fill_multi(s, xs, pk.n, -2.5f);
       });
}

// copy_multi (ZeRO-1's buffer packing and its masters' rounding, core/optim/zero.h) against the
// simulator's per-piece casts (Kernels' default; from == to: a copy of the bytes): 1, 7, 300
// and 1100 pieces (1100: two launches of kCopyCap 1000), lengths 0, 1, odd and across the
// 8192-element chunk; element sizes 1, 2, 4 and 8; f32 -> bf16 / f16 (round to nearest even:
// ties, overflow, subnormals and NaN payloads from random bit patterns) and bf16 / f16 -> f32.
// The dsts lie in another buffer in the reverse order of the srcs, a gap of one element after
// each, prefilled with other bytes: the gaps must keep them.
void check_copy_multi(unsigned& seed) {
  using Bytes = std::vector<std::uint8_t>;
  const std::vector<std::vector<i64>> lists = {
      {5}, {0, 1, 8193, 3, 0, 20000, 4097}, multi_sizes(seed++, 300), multi_sizes(seed++, 1100)};
  struct Pair {
    DType from, to;
  };
  const std::vector<Pair> pairs = {{DType::f32, DType::f32},  {DType::bf16, DType::bf16},
                                   {DType::u8, DType::u8},    {DType::i64, DType::i64},
                                   {DType::f32, DType::bf16}, {DType::f32, DType::f16},
                                   {DType::bf16, DType::f32}, {DType::f16, DType::f32}};
  for (const auto& sizes : lists) {
    const std::size_t count = sizes.size();
    std::vector<i64> src_at(count), dst_at(count);
    i64 src_total = 0, dst_total = 0;
    for (std::size_t i = 0; i < count; ++i) {
      src_at[i] = src_total;
      src_total += sizes[i] + 1;
    }
    for (std::size_t i = count; i-- > 0;) {  // the dsts in reverse order
      dst_at[i] = dst_total;
      dst_total += sizes[i] + 1;
    }
    for (const Pair& p : pairs) {
      const std::size_t fs = dtype_size(p.from), ts = dtype_size(p.to);
      std::mt19937 gen(seed++);
      Bytes src(static_cast<std::size_t>(src_total) * fs),
          dst(static_cast<std::size_t>(dst_total) * ts);
      for (auto& b : dst) b = static_cast<std::uint8_t>(gen());
      if (p.from == DType::f32) {  // half mixed values, half random bit patterns
        const V m = mixed(static_cast<std::size_t>(src_total), seed++);
        for (std::size_t i = 0; i < m.size(); ++i) {
          std::uint32_t w = i % 2 == 0 ? std::bit_cast<std::uint32_t>(m[i]) : gen();
          if (i % 7 == 3) w = 0x3F808000u;   // 1 + 2^-8: a bf16 tie (rounds to even)
          if (i % 11 == 5) w = 0x477FF000u;  // 65520: f16 overflow to inf
          std::memcpy(src.data() + 4 * i, &w, 4);
        }
      } else {
        for (auto& b : src) b = static_cast<std::uint8_t>(gen());
      }
      const std::string ctx =
          "pieces " + std::to_string(count) + " " + dtype_name(p.from) + " -> " + dtype_name(p.to);
      both<Bytes>("copy_multi", ctx, {src, dst}, [&](Kernels& k, Stream& s, std::vector<Bytes>& b) {
        std::vector<const void*> srcs;
        std::vector<void*> dsts;
        for (std::size_t i = 0; i < count; ++i) {
          srcs.push_back(b[0].data() + static_cast<std::size_t>(src_at[i]) * fs);
          dsts.push_back(b[1].data() + static_cast<std::size_t>(dst_at[i]) * ts);
        }
        k.copy_multi(s, p.from, p.to, srcs, dsts, sizes);
      });
    }
  }
}

void check_multi_tensor(unsigned& seed) {
  const std::vector<std::vector<i64>> lists = {
      {5}, {0, 1, 8193, 3, 0, 20000, 4096}, multi_sizes(seed++, 300)};  // 300 > one table
  for (const auto& sizes : lists) {
    const Packed pk(sizes);
    const std::string ctx =
        "tensors " + std::to_string(sizes.size()) + " elements " + std::to_string(pk.total);
    for (bool amsgrad : {false, true}) {
      V p = mixed(pk.total, seed++), g = mixed(pk.total, seed++), m = mixed(pk.total, seed++);
      V v = mixed(pk.total, seed++), vmax = mixed(pk.total, seed++);
      for (float& x : v) x = std::fabs(x);
      for (float& x : vmax) x = std::fabs(x);
      both("adam_step_multi", ctx + " amsgrad " + std::to_string(amsgrad), {p, g, m, v, vmax},
           [&](Kernels& k, Stream& s, std::vector<V>& b) {
             std::vector<Kernels::AdamTensor> ts;
             for (std::size_t i = 0; i < sizes.size(); ++i) {
               const i64 a = pk.at[i];
               Kernels::AdamTensor t;
               t.param = b[0].data() + a;
               t.grad = b[1].data() + a;
               t.exp_avg = b[2].data() + a;
               t.exp_avg_sq = b[3].data() + a;
               t.max_exp_avg_sq = amsgrad ? b[4].data() + a : nullptr;
               t.n = sizes[i];
               const int step = 1 + static_cast<int>(i % 3);  // per-tensor step counts
               t.bias_correction1 = 1.0 - std::pow(0.9, step);
               t.bias_correction2 = 1.0 - std::pow(0.95, step);
               t.decay = i % 2 == 0;
               t.decay_scale = static_cast<float>(1.0 - 6e-4 * 0.1);
               ts.push_back(t);
             }
             k.adam_step_multi(s, ts, 6e-4, 0.9, 0.95, 1e-8, amsgrad ? 0.01 : 0.0, amsgrad);
           });
    }
    V x = mixed(pk.total, seed++), out = mixed(sizes.size(), seed++);
    both("sum_squares_multi", ctx, {x, out}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      std::vector<const float*> xs;
      for (i64 a : pk.at) xs.push_back(b[0].data() + a);
      k.sum_squares_multi(s, xs, pk.n, b[1].data(), Determinism::bitwise);
    });
    both("scale_multi", ctx, {x}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      std::vector<float*> xs;
      for (i64 a : pk.at) xs.push_back(b[0].data() + a);
      k.scale_multi(s, xs, pk.n, 0.37f);
    });
    // The moments' zeroing (Adam::step_multi); the one-element gaps Packed leaves between
    // tensors keep their values.
    both("fill_multi", ctx, {x}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
      std::vector<float*> xs;
      for (i64 a : pk.at) xs.push_back(b[0].data() + a);
      k.fill_multi(s, xs, pk.n, 0.0f);
    });
    // Fast: within 1e-5 relative of the double sum (f32 partials of at most 8192 squares).
    std::vector<const float*> xs;
    for (i64 a : pk.at) xs.push_back(x.data() + a);
    V o(sizes.size(), 7.0f);
    cudak->sum_squares_multi(cudas, xs, pk.n, o.data(), Determinism::fast);
    ++checks;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      double ref = 0.0;
      for (i64 j = 0; j < sizes[i]; ++j) ref += double(xs[i][j]) * double(xs[i][j]);
      if (!(std::fabs(o[i] - ref) <= 1e-5 * ref + 1e-30)) {
        ++failures;
        std::printf("FAIL sum_squares_multi fast %s tensor %zu: %.9g vs %.9g\n", ctx.c_str(), i,
                    double(o[i]), ref);
        break;
      }
    }
  }
}

}  // namespace

void check_fused_kernels(unsigned& seed) {
  for (auto* part :
       {check_embedding_paths, check_layernorm_chunks, check_gelu_paths, check_cross_entropy_rows,
        check_cross_entropy_fused, check_multi_tensor, check_typed_multi_tensor, check_typed_rows,
        check_fill_multi_tables, check_copy_multi}) {
    try {
      part(seed);
    } catch (const std::exception& e) {
      ++checks;
      ++failures;
      std::printf("FAIL fused kernels: %s\n", e.what());
    }
  }
}
