// The transformer kernels (backend_cuda/cuda_kernels_gpt.cu, cuda_attention.cu and cuda_fused.cu
// through emu.h) against the simulator's, bit for bit (sum_squares' fast mode within a tolerance):
// embedding forward/backward over micro-shard bounds (1 to 200 shards, empty ones, vocabulary rows
// absent from the batch), LayerNorm with and without bias, GELU, causal attention forward and
// backward over several (B, T, C, n_head) without and with attn_dropout (bitwise: the tiled
// kernels of every head-width class and the reference kernels past it; fast: the flash attention
// within a tolerance of a double-precision reference), dropout at several p and index bases (also
// in place), the sum
// of squares and its per-block leaves (ZeRO's sum_squares_blocks) around kSquaresBlock.
// Sizes are small: every CUDA thread is a fiber here (Note [Emulated threads], emu.h).
#include <array>
#include <cstring>
#include <initializer_list>

#include "core/numerics/gpt_math.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/random.h"
#include "emu_attention_ref.h"
#include "emu_check.h"

namespace {

// Uniform in [-r, r) (attention scores and LayerNorm inputs of a trained model's magnitude).
V uniform_v(std::size_t n, unsigned seed, float r = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-r, r);
  V v(n);
  for (float& x : v) x = u(gen);
  return v;
}

void check_embedding(unsigned& seed) {
  for (auto dims_ : std::vector<std::array<i64, 4>>{{1, 1, 1, 1}, {3, 5, 11, 7}, {4, 16, 65, 33}}) {
    // No structured binding: Clang 14's lambdas cannot capture one.
    const i64 B = dims_[0], T = dims_[1], V_ = dims_[2], C = dims_[3];
    const i64 N = B * T, P = T + 2;
    std::mt19937 gen(seed++);
    std::vector<i64> idx(N);
    for (auto& t : idx) t = std::uniform_int_distribution<i64>(0, V_ - 1)(gen);
    V wte = mixed(V_ * C, seed++), wpe = mixed(P * C, seed++), out = mixed(N * C, seed++);
    for (bool pos : {true, false})
      both("embedding_forward", dims({B, T, V_, C}) + (pos ? " wpe" : " no wpe"), {wte, wpe, out},
           [&](Kernels& k, Stream& s, std::vector<V>& b) {
             k.embedding_forward(s, idx.data(), b[0].data(), pos ? b[1].data() : nullptr, N, T, C,
                                 b[2].data());
           });
  }
  // Backward: ids from [0, V - 2) so the last two vocabulary rows are absent; dy with signed zeros.
  for (i64 N : {1, 37, 130}) {
    const i64 V_ = 9, C = 5;
    std::mt19937 gen(seed++);
    std::vector<i64> idx(N);
    for (auto& t : idx) t = std::uniform_int_distribution<i64>(0, V_ - 3)(gen);
    std::vector<Bounds> bs;
    for (i64 S : {1, 2, 3, 8, 64, 65, 100, 200}) {
      bs.push_back(micro_shard_bounds(N, S));
      if (S > 1) bs.push_back(random_bounds(N, S, seed++));
    }
    for (const Bounds& bounds : bs)
      for (bool acc : {false, true}) {
        V dy = mixed(N * C, seed++), g = mixed(V_ * C, seed++);
        both("embedding_backward",
             "N " + std::to_string(N) + " S " + std::to_string(bounds.size() - 1) + " acc " +
                 std::to_string(acc),
             {dy, g}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.embedding_backward(s, idx.data(), b[0].data(), N, C, V_, bounds, b[1].data(), acc);
             });
      }
  }
}

void check_layernorm(unsigned& seed) {
  for (auto n_c : std::vector<std::pair<i64, i64>>{{1, 1}, {5, 7}, {130, 64}, {3, 300}}) {
    const i64 N = n_c.first, C = n_c.second;
    V x = uniform_v(N * C, seed++, 3.0f), w = uniform_v(C, seed++), bias = uniform_v(C, seed++);
    if (N * C > 7) {
      x[3] = 0.0f;
      x[5] = -0.0f;
    }
    V y = mixed(N * C, seed++), mean = mixed(N, seed++), rstd = mixed(N, seed++);
    for (bool has_b : {true, false})
      both("layernorm_forward", dims({N, C}) + (has_b ? " bias" : " no bias"),
           {x, w, bias, y, mean, rstd}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
             k.layernorm_forward(s, b[0].data(), b[1].data(), has_b ? b[2].data() : nullptr, N, C,
                                 1e-5f, b[3].data(), b[4].data(), b[5].data());
           });
    // Backward from the simulator's forward statistics.
    simk->layernorm_forward(*sims, x.data(), w.data(), bias.data(), N, C, 1e-5f, y.data(),
                            mean.data(), rstd.data());
    sims->synchronize();
    V dy = uniform_v(N * C, seed++), dx = mixed(N * C, seed++), dyx = mixed(N * C, seed++);
    both("layernorm_backward", dims({N, C}), {dy, x, w, mean, rstd, dx, dyx},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.layernorm_backward(s, b[0].data(), b[1].data(), b[2].data(), b[3].data(), b[4].data(),
                                N, C, b[5].data(), b[6].data());
         });
  }
}

void check_gelu(unsigned& seed) {
  for (i64 n : {1, 1000, 5000}) {
    V x = mixed(n, seed++), gy = mixed(n, seed++), y = mixed(n, seed++);
    V xs = uniform_v(n, seed++, 6.0f);  // where tanh is not saturated
    for (const V* in : {&x, &xs}) {
      const std::string ctx = "n " + std::to_string(n) + (in == &x ? " mixed" : " [-6, 6)");
      both("gelu_forward", ctx, {*in, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.gelu_forward(s, b[0].data(), b[1].data(), n);
      });
      both("gelu_backward", ctx, {*in, gy, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
        k.gelu_backward(s, b[0].data(), b[1].data(), b[2].data(), n);
      });
    }
  }
}

// Causal attention without dropout and with attn_dropout at p 0.1 and 0.5 (index bases 0 and
// one past 2^32, the mask of a replica's slice), and at p 0.2 at a site >= 256.
void check_attention(unsigned& seed) {
  const std::uint64_t narrow = stream_id(kStreamDropout, (std::uint64_t(2) << 8) | 1);
  for (auto dims_ : std::vector<std::array<i64, 4>>{
           {1, 1, 4, 1},
           {2, 5, 8, 2},
           {3, 17, 12, 3},
           {2, 33, 16, 4},
           {1, 8, 6, 6},
           {1, 40, 64, 2},
           {2, 9, 128, 2},   // head widths 32 and 64: the simulator's fast paths
           {2, 37, 128, 2},  // two query / key tiles of 32, the last partial
           {1, 20, 256, 2},  // head width 128: 16 x 16 tiles
           {1, 5, 136, 1}})  // head width 136: the reference kernels
    for (auto p_base : std::vector<std::pair<float, std::uint64_t>>{
             {0.0f, 0}, {0.1f, 0}, {0.5f, (std::uint64_t(1) << 32) + 3}, {0.2f, 1}}) {
      // No structured bindings: Clang 14's lambdas cannot capture them.
      const i64 B = dims_[0], T = dims_[1], C = dims_[2], nh = dims_[3];
      const float p = p_base.first;
      const std::uint64_t base = p_base.second;
      // p 0.2: attn_dropout of block 85 (site 256, kStreamDropoutWide: Note [Dropout masks]).
      const std::uint64_t stream =
          p == 0.2f ? stream_id(kStreamDropoutWide, (std::uint64_t(2) << 16) | 256) : narrow;
      const std::string ctx =
          dims({B, T, C, nh}) + " p " + std::to_string(p) + " base " + std::to_string(base);
      V qkv = uniform_v(B * T * 3 * C, seed++), y = mixed(B * T * C, seed++),
        stats = mixed(B * nh * T * 2, seed++);
      both("attention_forward", ctx, {qkv, y, stats},
           [&](Kernels& k, Stream& s, std::vector<V>& b) {
             k.attention_forward(s, b[0].data(), B, T, C, nh, b[1].data(), b[2].data(), p, 1337,
                                 stream, base, Determinism::bitwise);
           });
      simk->attention_forward(*sims, qkv.data(), B, T, C, nh, y.data(), stats.data(), p, 1337,
                              stream, base, Determinism::bitwise);
      sims->synchronize();
      V dy = uniform_v(B * T * C, seed++), dqkv = mixed(B * T * 3 * C, seed++),
        scratch = mixed(B * nh * T, seed++);
      // Given the forward's y (bitwise ignores it: the simulator's bits) and not.
      for (bool with_y : {true, false})
        both(with_y ? "attention_backward given y" : "attention_backward", ctx,
             {dy, qkv, stats, dqkv, scratch, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
               k.attention_backward(s, b[0].data(), b[1].data(), with_y ? b[5].data() : nullptr,
                                    b[2].data(), B, T, C, nh, b[3].data(), b[4].data(), p, 1337,
                                    stream, base, Determinism::bitwise);
             });
    }
}

// ---- fast mode: the flash attention against a double-precision reference -----------------------

// The largest |got - want| / (1 + |want|) over n elements (stride 1), and whether it is <= tol.
double rel_error(const float* got, const double* want, std::size_t n, std::size_t stride = 1) {
  double e = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(got[i * stride]) - want[i]) / (1.0 + std::fabs(want[i]));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

// Note [CUDA attention]'s fast-mode tolerance.
constexpr double kFastAttentionTol = 2e-5;

void expect_close(const char* what, const std::string& ctx, double err) {
  ++checks;
  if (err <= kFastAttentionTol) return;
  ++failures;
  std::printf("FAIL %s %s: max |fast - double| / (1 + |double|) = %.3g > %.3g\n", what, ctx.c_str(),
              err, kFastAttentionTol);
}

// Fast mode (flash forward, expf backward) on tiles of every head-width class, T not a multiple
// of the tile, B > 1, several heads, with and without dropout: y, stats, pd and dqkv within
// kFastAttentionTol of the double reference, the backward given the forward's y (pd = rowsum(dy
// * y): 7 products) and not (pd recomputed in a first pass: 9); the bitwise kernels on the same
// inputs for scale (printed), and the fast backward from the bitwise forward's stats (and y)
// also within the tolerance.
void check_attention_fast(unsigned& seed) {
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(4) << 8) | 1);
  double worst = 0.0, worst_bitwise = 0.0, worst_y = 0.0, worst_no_y = 0.0;
  for (auto dims_ : std::vector<std::array<i64, 4>>{
           {2, 17, 12, 3}, {1, 40, 64, 2}, {2, 37, 128, 2}, {1, 20, 256, 2}})
    for (float p : {0.0f, 0.1f}) {
      const i64 B = dims_[0], T = dims_[1], C = dims_[2], nh = dims_[3];
      const std::string ctx = dims({B, T, C, nh}) + " p " + std::to_string(p);
      const gpt::AttentionDropout drop{p, 99, stream, 7};
      const V qkv = uniform_v(B * T * 3 * C, seed++), dy = uniform_v(B * T * C, seed++);
      const AttnReference ref = attention_reference(qkv, dy, B, T, C, nh, drop);
      for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
        V y = mixed(B * T * C, seed++), stats = mixed(B * nh * T * 2, seed++),
          dqkv = mixed(B * T * 3 * C, seed++), pd = mixed(B * nh * T, seed++),
          dqkv_y = mixed(B * T * 3 * C, seed++), pd_y = mixed(B * nh * T, seed++);
        try {
          cudak->attention_forward(cudas, qkv.data(), B, T, C, nh, y.data(), stats.data(), p,
                                   drop.seed, stream, drop.index_base, mode);
          cudak->attention_backward(cudas, dy.data(), qkv.data(), nullptr, stats.data(), B, T, C,
                                    nh, dqkv.data(), pd.data(), p, drop.seed, stream,
                                    drop.index_base, mode);
          cudak->attention_backward(cudas, dy.data(), qkv.data(), y.data(), stats.data(), B, T, C,
                                    nh, dqkv_y.data(), pd_y.data(), p, drop.seed, stream,
                                    drop.index_base, mode);
        } catch (const std::exception& e) {
          ++checks;
          ++failures;
          std::printf("FAIL attention %s %s: %s\n", determinism_name(mode), ctx.c_str(), e.what());
          continue;
        }
        const std::size_t rows = std::size_t(B * nh * T);
        const double errs[] = {rel_error(y.data(), ref.y.data(), y.size()),
                               rel_error(stats.data(), ref.m.data(), rows, 2),
                               rel_error(stats.data() + 1, ref.sum.data(), rows, 2),
                               rel_error(pd.data(), ref.pd.data(), rows),
                               rel_error(dqkv.data(), ref.dqkv.data(), dqkv.size())};
        const char* names[] = {"y", "stats m", "stats sum", "pd", "dqkv"};
        for (int i = 0; i < 5; ++i) {
          const std::string what = std::string("attention fast ") + names[i];
          if (mode == Determinism::fast) {
            expect_close(what.c_str(), ctx, errs[i]);
            worst = std::max(worst, errs[i]);
            if (i >= 3) worst_no_y = std::max(worst_no_y, errs[i]);
          } else {
            worst_bitwise = std::max(worst_bitwise, errs[i]);
          }
        }
        // Given y: fast within the tolerance; bitwise ignores y (the same bits).
        const double errs_y[] = {rel_error(pd_y.data(), ref.pd.data(), rows),
                                 rel_error(dqkv_y.data(), ref.dqkv.data(), dqkv_y.size())};
        if (mode == Determinism::fast) {
          expect_close("attention fast pd given y", ctx, errs_y[0]);
          expect_close("attention fast dqkv given y", ctx, errs_y[1]);
          worst_y = std::max({worst_y, errs_y[0], errs_y[1]});
        } else {
          ++checks;
          if (std::memcmp(dqkv.data(), dqkv_y.data(), dqkv.size() * sizeof(float)) != 0 ||
              std::memcmp(pd.data(), pd_y.data(), pd.size() * sizeof(float)) != 0) {
            ++failures;
            std::printf("FAIL attention bitwise given y %s: other bits than without y\n",
                        ctx.c_str());
          }
        }
        if (mode == Determinism::bitwise)  // the fast backward from the bitwise stats (and y)
          for (const float* yy : std::array<const float*, 2>{nullptr, y.data()}) {
            V dq2 = mixed(B * T * 3 * C, seed++), pd2 = mixed(B * nh * T, seed++);
            cudak->attention_backward(cudas, dy.data(), qkv.data(), yy, stats.data(), B, T, C, nh,
                                      dq2.data(), pd2.data(), p, drop.seed, stream, drop.index_base,
                                      Determinism::fast);
            expect_close(yy ? "attention fast backward from bitwise stats and y"
                            : "attention fast backward from bitwise stats",
                         ctx, rel_error(dq2.data(), ref.dqkv.data(), dq2.size()));
          }
      }
    }
  std::printf("attention fast vs double: max relative error %.3g (tolerance %.3g; bitwise %.3g); "
              "backward (pd, dqkv) given y %.3g, pd recomputed %.3g\n",
              worst, kFastAttentionTol, worst_bitwise, worst_y, worst_no_y);
}

void check_dropout(unsigned& seed) {
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(3) << 8) | 2);
  for (i64 n : {1, 1001, 5000})
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f})
      for (std::uint64_t base :
           {std::uint64_t(0), std::uint64_t(12345), (std::uint64_t(1) << 33) + 7}) {
        const std::string ctx =
            "n " + std::to_string(n) + " p " + std::to_string(p) + " base " + std::to_string(base);
        V x = mixed(n, seed++), y = mixed(n, seed++);
        both("dropout_forward", ctx, {x, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
          k.dropout_forward(s, b[0].data(), b[1].data(), n, p, 1337, stream, base);
        });
        both("dropout_forward in place", ctx, {x}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
          k.dropout_forward(s, b[0].data(), b[0].data(), n, p, 1337, stream, base);
        });
        both("dropout_backward", ctx, {x, y}, [&](Kernels& k, Stream& s, std::vector<V>& b) {
          k.dropout_backward(s, b[0].data(), b[1].data(), n, p, 42, stream + 1, base);
        });
      }
  // The mask itself: element i kept iff philox uniform01 >= p (a wrong index base or stream
  // would agree between two wrong backends only by accident, so check one against random.h),
  // at site 2 and at site 258 of a GPT deeper than 85 blocks (kStreamDropoutWide's stream, Note
  // [Dropout masks]: the kernels take the 64-bit stream whole), whose masks differ.
  const i64 n = 4096;
  const std::uint64_t wide = stream_id(kStreamDropoutWide, (std::uint64_t(3) << 16) | 258);
  V ones(n, 1.0f), y(n, 0.0f), y_wide(n, 0.0f);
  for (std::uint64_t st : {stream, wide}) {
    V& out = st == stream ? y : y_wide;
    cudak->dropout_forward(cudas, ones.data(), out.data(), n, 0.25f, 7, st, 100);
    int wrong = 0;
    for (i64 i = 0; i < n; ++i)
      wrong += (out[i] != 0.0f) != (uniform01(7, st, 100 + std::uint64_t(i)) >= 0.25f);
    ++checks;
    if (wrong != 0) {
      ++failures;
      std::printf("FAIL dropout mask vs uniform01 (stream %llx): %d of %ld elements differ\n",
                  static_cast<unsigned long long>(st), wrong, long(n));
    }
  }
  ++checks;
  if (std::memcmp(y.data(), y_wide.data(), sizeof(float) * std::size_t(n)) == 0) {
    ++failures;
    std::printf("FAIL dropout masks of sites 2 and 258 are the same\n");
  }
}

void check_sum_squares(unsigned& seed) {
  const i64 blk = gpt::kSquaresBlock;
  for (i64 n : {i64(0), i64(1), blk - 1, blk, blk + 1, 3 * blk + 5, 65 * blk + 3}) {
    V x = mixed(std::max<i64>(n, 1), seed++), out = {7.0f};
    both("sum_squares", "n " + std::to_string(n), {x, out},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.sum_squares(s, b[0].data(), n, b[1].data(), Determinism::bitwise);
         });
    V xf = uniform_v(std::max<i64>(n, 1), seed++), o1 = {7.0f}, o2 = {7.0f};
    simk->sum_squares(*sims, xf.data(), n, o1.data(), Determinism::fast);
    sims->synchronize();
    cudak->sum_squares(cudas, xf.data(), n, o2.data(), Determinism::fast);
    ++checks;
    if (!(std::fabs(o1[0] - o2[0]) <= 1e-4f * (1 + std::fabs(o1[0])))) {
      ++failures;
      std::printf("FAIL sum_squares fast n %ld: %g vs %g\n", long(n), o1[0], o2[0]);
    }
  }
}

// ZeRO's per-block leaves (Note [ZeRO grad clip]): one chain per kSquaresBlock block, out of
// place, the elements past the last block untouched.
void check_sum_squares_blocks(unsigned& seed) {
  const i64 blk = gpt::kSquaresBlock;
  for (i64 n : {i64(1), blk - 1, blk, blk + 1, 3 * blk + 5, 65 * blk}) {
    const i64 blocks = gpt::squares_blocks(n);
    V x = mixed(n, seed++), out = mixed(blocks + 1, seed++);
    both("sum_squares_blocks", "n " + std::to_string(n), {x, out},
         [&](Kernels& k, Stream& s, std::vector<V>& b) {
           k.sum_squares_blocks(s, b[0].data(), n, b[1].data());
         });
  }
}

}  // namespace

void check_attention_kernels(unsigned& seed) {
  check_attention(seed);
  check_attention_fast(seed);
  check_typed_attention(seed);
}

void check_gpt_kernels(unsigned& seed) {
  for (auto* part :
       {check_embedding, check_layernorm, check_gelu, check_attention, check_attention_fast,
        check_typed_attention, check_dropout, check_sum_squares, check_sum_squares_blocks}) {
    try {
      part(seed);
    } catch (const std::exception& e) {  // a call outside `both` (the simulator's forward) threw
      ++checks;
      ++failures;
      std::printf("FAIL gpt kernels: %s\n", e.what());
    }
  }
}
