// The CUDA backend's causal self-attention (CudaGptKernels::attention_forward and
// attention_backward, cuda_kernels_common.cuh): tiled kernels over (batch, head, query tile) and
// (batch, head, key tile) with the tiles staged in shared memory, in two arithmetic modes.
// ctest CudaEmu.Kernels runs them on the CPU (tools/cuda_emu/test_emu_gpt.cpp): bitwise against
// the simulator bit for bit, fast against a double-precision reference.
//
// Note [CUDA attention]
// Shapes and mask: Note [GPT kernels] in core/numerics/gpt_math.h. A block of kAttnThreads
// threads owns one (b, h) and one tile: BQ queries (forward, first backward pass) or BK keys
// (second backward pass); AttnTile gives BQ and BK by head-width class HD (hd <= 32, 64, 128:
// 32 x 32, 32 x 32, 16 x 16). Q, K, V and dy tiles are staged in shared memory as [rows][HD + 1]
// floats, loaded row-contiguously (consecutive threads read consecutive channels: coalesced);
// the padding keeps the score loop (lanes over keys, the same channel) free of bank conflicts.
// Scores of a tile go to a [BQ][BK + 1] tile; one thread owns each output element's chain across
// all tiles in registers. att [B, nh, T, T] is never stored (Note [Attention memory]). Static
// shared memory per block (bounded by attn_smem_bytes, static_assert <= 48 KiB, the static
// limit; the H200 allows 227 KiB per block), as ptxas reports for sm_90: HD 32: forward 16.8
// KiB, backward 25.1 KiB; HD 64: 28.8 / 41.1 KiB; HD 128: 25.4 / 34.6 KiB; at most 167
// registers per thread, no spills (128 threads: 21k of an SM's 64k registers). hd > 128 takes
// the reference kernels (one thread per query / key, gpt_math.h's bodies).
//
// bitwise (attn_forward_bitwise, attn_query_backward, attn_key_backward with kFast false):
// every chain is gpt_math.h's, in its order, so y, stats, pd and dqkv equal the simulator's bit
// for bit, dropout included (the mask element of flat index ((b nh + h) T + t) T + u, as
// gpt::AttentionDropout). The forward makes three passes over the keys as attention_query does
// (max fold, sum of exp, weights @ v), recomputing the scores: the max fold and the sum are
// per-query ascending chains that must end before the next starts. The backward's first kernel
// makes two passes (pd = chain fma(att, da), then dq = chain fma(dpre, k)); the second kernel,
// after it on the same stream, gives dk and dv per key over the queries t >= u ascending.
//
// fast (attn_forward_fast, and the backward kernels with kFast true): the forward is
// FlashAttention-2's (Dao 2023) one pass: per key tile the row max m, the rescaled sum l = l
// exp(m_old - m) + sum exp(s - m) and the output o = o exp(m_old - m) + P v (P dropped with the
// same mask), y = o / l at the end; stats = {m, l} in bitwise's format, so either mode's
// backward reads either forward's stats. exp is the hardware-backed expf. The backward keeps the
// bitwise kernels' structure (FA2 computes D = rowsum(dO o O) from the forward's output, which
// Kernels::attention_backward is not given: pd is a first pass here) with expf in place of the
// portable exp. Tolerance against a double-precision reference (the emulator's test): |x - ref|
// <= 2e-5 (1 + |ref|) for y, stats and dqkv at the tested magnitudes (scores up to ~10).
// cuDNN's SDPA (cudnn-frontend) was not used: its headers come from a PyPI wheel that is not
// installed here, its graphs cannot run in tools/cuda_emu, and there was no GPU to measure
// whether it beats this kernel.
#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/gpt_math.h"

namespace ditto::cuda::kern {

namespace {

constexpr int kAttnThreads = 128;

// Tile sizes by head-width class HD (the largest hd a kernel instance serves).
template <int HD>
struct AttnTile;
template <>
struct AttnTile<32> {
  static constexpr int BQ = 32, BK = 32;
};
template <>
struct AttnTile<64> {
  static constexpr int BQ = 32, BK = 32;
};
template <>
struct AttnTile<128> {
  static constexpr int BQ = 16, BK = 16;
};

// Static shared memory of a kernel: `tiles` [rows][HD + 1] tiles of BQ or BK rows (forward: Q, K,
// V; backward: Q, dy, K, V), `scores` [BQ][BK + 1] tiles and 4 floats per query row.
template <int HD>
constexpr int attn_smem_bytes(bool backward) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK;
  const int tiles = backward ? 2 * (BQ + BK) * (HD + 1) : (BQ + 2 * BK) * (HD + 1);
  const int scores = (backward ? 2 : 1) * BQ * (BK + 1);
  return 4 * (tiles + scores + 4 * BQ);
}
template <int HD>
constexpr bool attn_fits() {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK;
  return attn_smem_bytes<HD>(true) <= 48 * 1024 && attn_smem_bytes<HD>(false) <= 48 * 1024 &&
         (BQ * HD) % kAttnThreads == 0 && (BK * HD) % kAttnThreads == 0 && BQ <= kAttnThreads;
}
static_assert(attn_fits<32>() && attn_fits<64>() && attn_fits<128>(),
              "attention tiles: static shared memory <= 48 KiB per block, whole chains per thread");

struct AttnArgs {
  const float* qkv;  // [B, T, 3C]
  const float* dy;   // [B, T, C] (backward)
  float* y;          // [B, T, C] (forward)
  float* dqkv;       // [B, T, 3C] (backward)
  gpt::SoftmaxStats* stats;  // [B, nh, T]
  float* pd;         // [B, nh, T] (backward)
  i64 T, C, nh, hd;
  float scale;       // gpt::attention_scale(hd)
  gpt::AttentionDropout drop;
};

// exp of the mode: the portable canonical::exp (bitwise) or expf (fast).
template <bool kFast>
__device__ __forceinline__ float attn_exp(float x) {
  if constexpr (kFast)
    return ::expf(x);
  else
    return cm::exp(x);
}

// dst[r][i] = rows r0 + r of the hd-wide column slice at `src` (row stride `stride`), r < R,
// i < HD; 0 past T or past hd. Consecutive threads read consecutive channels of a row.
template <int R, int HD>
__device__ __forceinline__ void stage_rows(float (*dst)[HD + 1], const float* src, i64 stride,
                                           i64 r0, i64 T, i64 hd) {
  for (int e = threadIdx.x; e < R * HD; e += blockDim.x) {
    const int r = e / HD, i = e % HD;
    dst[r][i] = (r0 + r < T && i < hd) ? src[(r0 + r) * stride + i] : 0.0f;
  }
}

// out[r][c] = chain_i fma(a[r][i], b[c][i]) from 0.0f over i < hd (gpt::dot_chain), times
// `scale` when kScaled (mul after the chain: gpt::attention_score), for the pairs with query
// t = q0 + r < T and key u = k0 + c <= t; other entries are left as they were.
template <int HD, int BQ, int BK, bool kScaled>
__device__ __forceinline__ void pair_dots(const float (*a)[HD + 1], const float (*b)[HD + 1],
                                          float (*out)[BK + 1], i64 hd, float scale, i64 q0,
                                          i64 k0, i64 T) {
  for (int p = threadIdx.x; p < BQ * BK; p += blockDim.x) {
    const int r = p / BK, c = p % BK;
    const i64 t = q0 + r, u = k0 + c;
    if (t >= T || u > t) continue;
    float acc = 0.0f;
    for (int i = 0; i < hd; ++i) acc = cm::fma(a[r][i], b[c][i], acc);
    out[r][c] = kScaled ? cm::mul(acc, scale) : acc;
  }
}

// One key tile [k0, k0 + BK) of head h: its keys (and values, when vs is not null) staged into
// shared memory between barriers (the previous tile's readers are done before it is overwritten),
// then sc = the scaled scores of the block's queries qs against it (pair_dots). The caller puts
// the barrier after its own pair_dots, before any thread reads sc.
template <int HD, int BQ, int BK>
__device__ __forceinline__ void score_key_tile(const AttnArgs& a, const float* base, i64 h,
                                               i64 q0, i64 k0, const float (*qs)[HD + 1],
                                               float (*ks)[HD + 1], float (*vs)[HD + 1],
                                               float (*sc)[BK + 1]) {
  const i64 W = 3 * a.C;
  __syncthreads();
  stage_rows<BK, HD>(ks, base + a.C + h * a.hd, W, k0, a.T, a.hd);
  if (vs) stage_rows<BK, HD>(vs, base + 2 * a.C + h * a.hd, W, k0, a.T, a.hd);
  __syncthreads();
  pair_dots<HD, BQ, BK, true>(qs, ks, sc, a.hd, a.scale, q0, k0, a.T);
}

// f(j, r, row, i) for each output this thread owns: o = threadIdx.x + kAttnThreads j (j < J),
// tile row r = o / HD, channel i = o % HD, row = r0 + r, for the rows before T and i < hd.
template <int HD, int J, class F>
__device__ __forceinline__ void for_owned_outputs(i64 r0, i64 T, i64 hd, F f) {
  for (int j = 0; j < J; ++j) {
    const int o = static_cast<int>(threadIdx.x) + kAttnThreads * j, r = o / HD, i = o % HD;
    const i64 row = r0 + r;
    if (row < T && i < hd) f(j, r, row, i);
  }
}

// The softmax-backward pieces of pair (t, u) (gpt::attention_pair) from its scaled score s and
// dp = dy_t . v_u: the weight att = exp(s - m) / sum, its dropped value a and the dropped dp.
template <bool kFast>
__device__ __forceinline__ gpt::AttentionPair attn_pair(float s, float dp, gpt::SoftmaxStats st,
                                                        const gpt::AttentionDropout& drop,
                                                        std::uint64_t index, float ds) {
  const float att = cm::div(attn_exp<kFast>(cm::sub(s, st.m)), st.sum);
  if (!drop.active()) return gpt::AttentionPair{att, att, dp};
  const bool keep = drop.kept(index);
  return gpt::AttentionPair{att, gpt::dropout_apply(keep, att, ds),
                            gpt::dropout_apply(keep, dp, ds)};
}

// ---- forward, bitwise --------------------------------------------------------------------------
// Block (b h, query tile): gpt::attention_query for queries [q0, q0 + BQ), three passes over the
// key tiles [0, last query]. Thread r < BQ owns query r's max fold and sum chain; output (r, i)
// (o = threadIdx.x + kAttnThreads j, r = o / HD, i = o % HD) owns y's chain.
template <int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_forward_bitwise(const AttnArgs a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK, J = BQ * HD / kAttnThreads;
  __shared__ float qs[BQ][HD + 1], ks[BK][HD + 1], vs[BK][HD + 1], sc[BQ][BK + 1];
  __shared__ float row_m[BQ], row_sum[BQ];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = i64(blockIdx.y) * BQ;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd;
  const float* base = a.qkv + b * T * W;
  const int tid = threadIdx.x;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;  // queries [q0, q_end), keys [0, q_end)
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  stage_rows<BQ, HD>(qs, base + h * hd, W, q0, T, hd);
  // Pass 1: m = max fold from -inf over u <= t.
  float m = -pmath::detail::infinity(), sum = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, qs, ks, nullptr, sc);
    __syncthreads();
    if (owner)
      for (i64 c = 0; c < BK && k0 + c <= t_own; ++c) m = (m < sc[tid][c]) ? sc[tid][c] : m;
  }
  // Pass 2: sum = chain add exp(sub(s_u, m)).
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, qs, ks, nullptr, sc);
    __syncthreads();
    if (owner)
      for (i64 c = 0; c < BK && k0 + c <= t_own; ++c)
        sum = cm::add(sum, cm::exp(cm::sub(sc[tid][c], m)));
  }
  if (owner) {
    row_m[tid] = m;
    row_sum[tid] = sum;
    a.stats[(b * a.nh + h) * T + t_own] = gpt::SoftmaxStats{m, sum};
  }
  // Pass 3: y[i] = chain fma(a_u, v_u[i]) over u <= t, a_u the (dropped) weight.
  const float ds = a.drop.active() ? gpt::dropout_scale(a.drop.p) : 1.0f;
  float acc[J];
  for (int j = 0; j < J; ++j) acc[j] = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, qs, ks, vs, sc);
    __syncthreads();
    for (int p = tid; p < BQ * BK; p += kAttnThreads) {
      const int r = p / BK, c = p % BK;
      const i64 t = q0 + r, u = k0 + c;
      if (t >= T || u > t) continue;
      float w = gpt::softmax_weight(sc[r][c], gpt::SoftmaxStats{row_m[r], row_sum[r]});
      if (a.drop.active())
        w = a.drop.apply(gpt::attention_row_index(a.nh, T, b, h, t) + std::uint64_t(u), w, ds);
      sc[r][c] = w;
    }
    __syncthreads();
    for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int r, i64 t, int i) {
      for (i64 c = 0; c < BK && k0 + c <= t; ++c) acc[j] = cm::fma(sc[r][c], vs[c][i], acc[j]);
    });
  }
  for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int, i64 t, int i) {
    a.y[(b * T + t) * a.C + h * hd + i] = acc[j];
  });
}

// ---- forward, fast (flash) ---------------------------------------------------------------------
// Block (b h, query tile), one pass over the key tiles with the online softmax (Note [CUDA
// attention]); thread r < BQ owns query r's m and l, output (r, i) as in the bitwise kernel.
template <int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_forward_fast(const AttnArgs a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK, J = BQ * HD / kAttnThreads;
  __shared__ float qs[BQ][HD + 1], ks[BK][HD + 1], vs[BK][HD + 1], sc[BQ][BK + 1];
  __shared__ float row_alpha[BQ], row_l[BQ];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = i64(blockIdx.y) * BQ;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd;
  const float* base = a.qkv + b * T * W;
  const int tid = threadIdx.x;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  const float ds = a.drop.active() ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_rows<BQ, HD>(qs, base + h * hd, W, q0, T, hd);
  float m = -pmath::detail::infinity(), l = 0.0f;
  float acc[J];
  for (int j = 0; j < J; ++j) acc[j] = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, qs, ks, vs, sc);
    __syncthreads();
    if (owner) {
      const i64 n = t_own - k0 + 1 < BK ? t_own - k0 + 1 : BK;  // keys k0 .. min(t, k0 + BK - 1)
      float mt = m;
      for (i64 c = 0; c < n; ++c) mt = fmaxf(mt, sc[tid][c]);
      const float alpha = mt == m ? 1.0f : ::expf(m - mt);  // m == -inf (first tile): 0
      float add = 0.0f;
      const std::uint64_t row = gpt::attention_row_index(a.nh, T, b, h, t_own);
      for (i64 c = 0; c < n; ++c) {
        const float e = ::expf(sc[tid][c] - mt);
        add += e;
        sc[tid][c] = a.drop.active() ? a.drop.apply(row + std::uint64_t(k0 + c), e, ds) : e;
      }
      l = l * alpha + add;
      m = mt;
      row_alpha[tid] = alpha;
    }
    __syncthreads();
    for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int r, i64 t, int i) {
      float x = acc[j] * row_alpha[r];
      for (i64 c = 0; c < BK && k0 + c <= t; ++c) x = fmaf(sc[r][c], vs[c][i], x);
      acc[j] = x;
    });
  }
  if (owner) {
    row_l[tid] = l;
    a.stats[(b * a.nh + h) * T + t_own] = gpt::SoftmaxStats{m, l};
  }
  __syncthreads();
  for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int r, i64 t, int i) {
    a.y[(b * T + t) * a.C + h * hd + i] = acc[j] / row_l[r];
  });
}

// ---- backward, first kernel: pd and dq per query tile ------------------------------------------
// gpt::attention_query_backward for queries [q0, q0 + BQ): pass 1 pd = chain fma(att, da) (thread
// r < BQ), pass 2 dpre per pair and dq's chains (output (r, i) as the forward's y).
template <int HD, bool kFast>
__global__ void __launch_bounds__(kAttnThreads) attn_query_backward(const AttnArgs a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK, J = BQ * HD / kAttnThreads;
  __shared__ float qs[BQ][HD + 1], dys[BQ][HD + 1], ks[BK][HD + 1], vs[BK][HD + 1];
  __shared__ float sc[BQ][BK + 1], dp[BQ][BK + 1];
  __shared__ float row_m[BQ], row_sum[BQ], row_pd[BQ];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = i64(blockIdx.y) * BQ;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd, head = (b * a.nh + h) * T;
  const float* base = a.qkv + b * T * W;
  const int tid = threadIdx.x;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  const bool dropped = a.drop.active();
  const float ds = dropped ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_rows<BQ, HD>(qs, base + h * hd, W, q0, T, hd);
  stage_rows<BQ, HD>(dys, a.dy + b * T * a.C + h * hd, a.C, q0, T, hd);
  if (owner) {
    row_m[tid] = a.stats[head + t_own].m;
    row_sum[tid] = a.stats[head + t_own].sum;
  }
  // One key tile's scores and dp = dy_t . v_u into sc and dp.
  auto tile = [&](i64 k0) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, qs, ks, vs, sc);
    pair_dots<HD, BQ, BK, false>(dys, vs, dp, hd, 1.0f, q0, k0, T);
    __syncthreads();
  };
  // Pass 1: pd.
  float pd = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    tile(k0);
    if (owner) {
      const gpt::SoftmaxStats st{row_m[tid], row_sum[tid]};
      const std::uint64_t row = gpt::attention_row_index(a.nh, T, b, h, t_own);
      for (i64 c = 0; c < BK && k0 + c <= t_own; ++c) {
        const gpt::AttentionPair p =
            attn_pair<kFast>(sc[tid][c], dp[tid][c], st, a.drop, row + std::uint64_t(k0 + c), ds);
        pd = cm::fma(p.att, p.da, pd);
      }
    }
  }
  if (owner) {
    row_pd[tid] = pd;
    a.pd[head + t_own] = pd;
  }
  // Pass 2: dq[i] = chain fma(dpre_u, k_u[i]).
  float acc[J];
  for (int j = 0; j < J; ++j) acc[j] = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    tile(k0);
    for (int p = tid; p < BQ * BK; p += kAttnThreads) {
      const int r = p / BK, c = p % BK;
      const i64 t = q0 + r, u = k0 + c;
      if (t >= T || u > t) continue;
      const gpt::AttentionPair pr = attn_pair<kFast>(
          sc[r][c], dp[r][c], gpt::SoftmaxStats{row_m[r], row_sum[r]}, a.drop,
          gpt::attention_row_index(a.nh, T, b, h, t) + std::uint64_t(u), ds);
      sc[r][c] = gpt::attention_dpre(pr, row_pd[r], a.scale, dropped);
    }
    __syncthreads();
    for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int r, i64 t, int i) {
      for (i64 c = 0; c < BK && k0 + c <= t; ++c) acc[j] = cm::fma(sc[r][c], ks[c][i], acc[j]);
    });
  }
  for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int, i64 t, int i) {
    a.dqkv[(b * T + t) * W + h * hd + i] = dropped ? acc[j] : cm::mul(acc[j], a.scale);
  });
}

// ---- backward, second kernel: dk and dv per key tile -------------------------------------------
// gpt::attention_key_backward for keys [k0, k0 + BK): over the query tiles from the one holding
// k0 to T, per pair att, a and dpre (from the stats and the first kernel's pd), then output
// (c, i) (o = threadIdx.x + kAttnThreads j, c = o / HD, i = o % HD) owns dk's and dv's chains
// over t >= u ascending.
template <int HD, bool kFast>
__global__ void __launch_bounds__(kAttnThreads) attn_key_backward(const AttnArgs a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK, J = BK * HD / kAttnThreads;
  __shared__ float qs[BQ][HD + 1], dys[BQ][HD + 1], ks[BK][HD + 1], vs[BK][HD + 1];
  __shared__ float sc[BQ][BK + 1], dp[BQ][BK + 1];
  __shared__ float row_m[BQ], row_sum[BQ], row_pd[BQ];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, k0 = i64(blockIdx.y) * BK;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd, head = (b * a.nh + h) * T;
  const float* base = a.qkv + b * T * W;
  const int tid = threadIdx.x;
  const bool dropped = a.drop.active();
  const float ds = dropped ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_rows<BK, HD>(ks, base + a.C + h * hd, W, k0, T, hd);
  stage_rows<BK, HD>(vs, base + 2 * a.C + h * hd, W, k0, T, hd);
  float dk[J], dv[J];
  for (int j = 0; j < J; ++j) dk[j] = dv[j] = 0.0f;
  for (i64 q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) {
    __syncthreads();
    stage_rows<BQ, HD>(qs, base + h * hd, W, q0, T, hd);
    stage_rows<BQ, HD>(dys, a.dy + b * T * a.C + h * hd, a.C, q0, T, hd);
    if (tid < BQ && q0 + tid < T) {
      row_m[tid] = a.stats[head + q0 + tid].m;
      row_sum[tid] = a.stats[head + q0 + tid].sum;
      row_pd[tid] = a.pd[head + q0 + tid];
    }
    __syncthreads();
    pair_dots<HD, BQ, BK, true>(qs, ks, sc, hd, a.scale, q0, k0, T);
    pair_dots<HD, BQ, BK, false>(dys, vs, dp, hd, 1.0f, q0, k0, T);
    __syncthreads();
    for (int p = tid; p < BQ * BK; p += kAttnThreads) {  // sc <- dpre, dp <- a
      const int r = p / BK, c = p % BK;
      const i64 t = q0 + r, u = k0 + c;
      if (t >= T || u > t) continue;
      const gpt::AttentionPair pr = attn_pair<kFast>(
          sc[r][c], dp[r][c], gpt::SoftmaxStats{row_m[r], row_sum[r]}, a.drop,
          gpt::attention_row_index(a.nh, T, b, h, t) + std::uint64_t(u), ds);
      sc[r][c] = gpt::attention_dpre(pr, row_pd[r], a.scale, dropped);
      dp[r][c] = pr.a;
    }
    __syncthreads();
    for_owned_outputs<HD, J>(k0, T, hd, [&](int j, int c, i64 u, int i) {
      const i64 r0 = u > q0 ? u - q0 : 0, r1 = T - q0 < BQ ? T - q0 : BQ;  // t in [max(u, q0), ..)
      for (i64 r = r0; r < r1; ++r) {
        dk[j] = cm::fma(sc[r][c], qs[r][i], dk[j]);
        dv[j] = cm::fma(dp[r][c], dys[r][i], dv[j]);
      }
    });
  }
  for_owned_outputs<HD, J>(k0, T, hd, [&](int j, int, i64 u, int i) {
    float* row = a.dqkv + (b * T + u) * W + h * hd + i;
    row[a.C] = dropped ? dk[j] : cm::mul(dk[j], a.scale);
    row[2 * a.C] = dv[j];
  });
}

// ---- reference kernels (hd > 128) --------------------------------------------------------------
// One thread per query (b, h, t) or key (b, h, u), i = (b nh + h) T + t: gpt_math.h's per-query
// and per-key bodies, the scores recomputed in every pass (both modes).

__global__ void attention_forward_reference(const float* qkv, i64 B, i64 T, i64 C, i64 nh,
                                            float* y, gpt::SoftmaxStats* stats,
                                            gpt::AttentionDropout drop) {
  const i64 hd = C / nh;
  for (i64 i = global_thread(); i < B * nh * T; i += grid_threads()) {
    const i64 b = i / (nh * T), h = (i / T) % nh, t = i % T;
    stats[i] = gpt::attention_query(qkv, T, C, nh, b, t, h, y + (b * T + t) * C + h * hd, drop);
  }
}

__global__ void attention_query_backward_reference(const float* dy, const float* qkv,
                                                   const gpt::SoftmaxStats* stats, i64 B, i64 T,
                                                   i64 C, i64 nh, float* dqkv, float* pd,
                                                   gpt::AttentionDropout drop) {
  const i64 hd = C / nh;
  for (i64 i = global_thread(); i < B * nh * T; i += grid_threads()) {
    const i64 b = i / (nh * T), h = (i / T) % nh, t = i % T;
    pd[i] = gpt::attention_query_backward(dy, qkv, T, C, nh, b, t, h, stats[i],
                                          dqkv + (b * T + t) * 3 * C + h * hd, drop);
  }
}

__global__ void attention_key_backward_reference(const float* dy, const float* qkv,
                                                 const gpt::SoftmaxStats* stats, const float* pd,
                                                 i64 B, i64 T, i64 C, i64 nh, float* dqkv,
                                                 gpt::AttentionDropout drop) {
  const i64 hd = C / nh;
  for (i64 i = global_thread(); i < B * nh * T; i += grid_threads()) {
    const i64 b = i / (nh * T), h = (i / T) % nh, u = i % T;
    float* row = dqkv + (b * T + u) * 3 * C + h * hd;
    gpt::attention_key_backward(dy, qkv, stats, pd, T, C, nh, b, u, h, row + C, row + 2 * C,
                                drop);
  }
}

// ---- host side ---------------------------------------------------------------------------------

constexpr i64 kMaxGridY = 65535;

// The head-width class of the tiled kernels for hd (32, 64, 128), or 0: the reference kernels
// (hd > 128, or more query / key tiles than a grid's y dimension holds, or more (b, h) than x).
template <int HD>
bool tiles_fit(i64 B, i64 T, i64 nh) {
  constexpr i64 R = AttnTile<HD>::BQ < AttnTile<HD>::BK ? AttnTile<HD>::BQ : AttnTile<HD>::BK;
  return (T + R - 1) / R <= kMaxGridY && B * nh <= i64(0x7fffffff);
}

int head_class(i64 B, i64 T, i64 nh, i64 hd) {
  if (hd <= 32 && tiles_fit<32>(B, T, nh)) return 32;
  if (hd <= 64 && tiles_fit<64>(B, T, nh)) return 64;
  if (hd <= 128 && tiles_fit<128>(B, T, nh)) return 128;
  return 0;
}

template <int HD>
void launch_forward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  const dim3 grid(static_cast<unsigned>(B * a.nh),
                  static_cast<unsigned>((a.T + AttnTile<HD>::BQ - 1) / AttnTile<HD>::BQ));
  if (mode == Determinism::fast)
    attn_forward_fast<HD><<<grid, kAttnThreads, 0, l.get()>>>(a);
  else
    attn_forward_bitwise<HD><<<grid, kAttnThreads, 0, l.get()>>>(a);
  l.check();
}

template <int HD, bool kFast>
void launch_backward(const Launch& l, const AttnArgs& a, i64 B) {
  const unsigned bh = static_cast<unsigned>(B * a.nh);
  const dim3 gq(bh, static_cast<unsigned>((a.T + AttnTile<HD>::BQ - 1) / AttnTile<HD>::BQ));
  attn_query_backward<HD, kFast><<<gq, kAttnThreads, 0, l.get()>>>(a);
  l.check();
  const dim3 gk(bh, static_cast<unsigned>((a.T + AttnTile<HD>::BK - 1) / AttnTile<HD>::BK));
  attn_key_backward<HD, kFast><<<gk, kAttnThreads, 0, l.get()>>>(a);
  l.check();
}

template <int HD>
void launch_backward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  if (mode == Determinism::fast)
    launch_backward<HD, true>(l, a, B);
  else
    launch_backward<HD, false>(l, a, B);
}

}  // namespace

void CudaGptKernels::attention_forward(Stream& s, const float* qkv, i64 B, i64 T, i64 C, i64 nh,
                                       float* y, float* stats, float p, std::uint64_t seed,
                                       std::uint64_t stream, std::uint64_t index_base,
                                       Determinism mode) {
  if (B <= 0 || T <= 0 || nh <= 0) return;
  Launch l(backend_, s, "attention_forward");
  const gpt::AttentionDropout drop{p, seed, stream, index_base};
  auto* st = reinterpret_cast<gpt::SoftmaxStats*>(stats);
  const i64 hd = C / nh;
  AttnArgs a{qkv, nullptr, y, nullptr, st, nullptr, T, C, nh, hd, gpt::attention_scale(hd), drop};
  switch (head_class(B, T, nh, hd)) {
    case 32: return launch_forward<32>(l, a, B, mode);
    case 64: return launch_forward<64>(l, a, B, mode);
    case 128: return launch_forward<128>(l, a, B, mode);
    default: break;
  }
  attention_forward_reference<<<blocks_for(B * nh * T, 128), 128, 0, l.get()>>>(qkv, B, T, C, nh,
                                                                                 y, st, drop);
  l.check();
}

void CudaGptKernels::attention_backward(Stream& s, const float* dy, const float* qkv,
                                        const float* stats, i64 B, i64 T, i64 C, i64 nh,
                                        float* dqkv, float* scratch, float p, std::uint64_t seed,
                                        std::uint64_t stream, std::uint64_t index_base,
                                        Determinism mode) {
  if (B <= 0 || T <= 0 || nh <= 0) return;
  Launch l(backend_, s, "attention_backward");
  const gpt::AttentionDropout drop{p, seed, stream, index_base};
  auto* st = reinterpret_cast<gpt::SoftmaxStats*>(const_cast<float*>(stats));
  const i64 hd = C / nh;
  AttnArgs a{qkv, dy, nullptr, dqkv, st, scratch, T, C, nh, hd, gpt::attention_scale(hd), drop};
  switch (head_class(B, T, nh, hd)) {
    case 32: return launch_backward<32>(l, a, B, mode);
    case 64: return launch_backward<64>(l, a, B, mode);
    case 128: return launch_backward<128>(l, a, B, mode);
    default: break;
  }
  const int blocks = blocks_for(B * nh * T, 128);
  attention_query_backward_reference<<<blocks, 128, 0, l.get()>>>(dy, qkv, st, B, T, C, nh, dqkv,
                                                                  scratch, drop);
  l.check();
  attention_key_backward_reference<<<blocks, 128, 0, l.get()>>>(dy, qkv, st, scratch, B, T, C,
                                                                nh, dqkv, drop);
  l.check();
}

}  // namespace ditto::cuda::kern
