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
// KiB, backward 25.1 KiB; HD 64: 28.8 / 41.1 KiB; HD 128: 25.4 / 34.6 KiB; at most 149
// registers per thread (128 threads: 19k of an SM's 64k registers), no spills, 16-byte stack
// frames (each thread's accumulators in registers: for_owned_outputs is unrolled). hd > 128 takes the reference kernels (one thread per query / key, gpt_math.h's
// bodies). More query or key tiles than a grid's y dimension holds run as several launches.
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
// bitwise kernels' structure with expf in place of the portable exp; given the forward's output
// y (Kernels::attention_backward's y, passed by nn::CausalSelfAttention), the first kernel takes
// pd = D = rowsum(dy o y) (FlashAttention-2's; y's rows staged in the K tile's buffer, one chain
// per query) instead of its first pass over the keys: 7 T x T x hd products per (b, h), not 9
// (the reference kernels, hd > 128, still recompute pd). Tolerance against a double-precision
// reference (the emulator's test): |x - ref| <= 2e-5 (1 + |ref|) for y, stats and dqkv at the
// tested magnitudes (scores up to ~10); measured (cuda_emu_test attention) 2.7e-6 recomputing
// pd, 4.2e-6 given y. Both backward kernels take their shared memory (AttnBackwardSmem), query
// tile staging and per-pair dpre (pairs_to_dpre) from the same helpers; ptxas sm_90: the first
// kernel 121 registers (hd 64 and 128; 70 for hd 32), the second 128 (64), no spills.
//
// typed (Kernels::attention_forward_ex / attention_backward_ex, bf16 or f16 qkv, dy, y, dqkv;
// has_attention_ex: head_dim <= 128, both modes; past 128, and for f32, ops keep MixedOp's f32
// scratch and the kernels above). bitwise: the tiled kernels above with AttnArgs::io = the
// storage dtype: stage_rows widens each element as it is loaded (exact), store_io rounds y and
// each dqkv element once (to nearest even), stats and pd stay f32: the bits of the simulator's
// MixedOp path (qkv and dy widened in f32 scratch, the same f32 kernels, outputs cast), without
// the f32 copies. fast, hd 64 and 128: FlashAttention-2 (Dao 2023) on the tensor cores
// (attn_forward_mma, attn_query_backward_mma, attn_key_backward_mma; mma.sync m16n8k16 with f32
// accumulation, cuda_mma.cuh, Note [mma fragments]). A block of 4 warps owns 64 rows, 16 per
// warp; Q, K, V, dO tiles are staged in shared memory as their 16-bit elements (rows padded by
// 8 elements against bank conflicts, 16-byte loads where aligned) and fragments are read with
// plain shared-memory loads (no ldmatrix, cp.async or wgmma: tools/cuda_emu runs them). Forward:
// per key tile S = Q K^T (mma), scale and causal mask on the accumulator fragments, the online
// softmax in registers (row max and the final row sum over the 4 lanes of a fragment row with
// __shfl_xor_sync), P (dropped with the same philox mask at each element's (b, h, t, u))
// rounded to the storage dtype and fed as the A operand of O += P V (the C fragments of two
// adjacent n8 tiles are the A fragment of one k16 slice); y = O / l rounded once; stats {m, l}
// as above. Backward, deterministic (no atomics): the first kernel per query tile takes D =
// rowsum(dO o y) (FlashAttention-2's; the forward's output y, given by ops::attention_backward's
// caller, nn::CausalSelfAttention) into the caller's scratch, then makes one pass over the keys:
// S, dP and dQ += dS K with dS = P (drop(dP) - D); not given y, it first recomputes D =
// rowsum(P drop(dP)) in a pass of its own (one S and one dP product per key tile: 9 products in
// all, not 7). The second kernel per key tile gives dK += dS^T Q and dV += drop(P)^T dO over the
// query tiles from its first key. Blocks of the forward and dq kernels take their query tiles
// heaviest first (the last tile at blockIdx.y 0: heavy_first_tile), so the short causal tiles
// fill the tail of the grid; the dk / dv kernel's key tile 0 is already its heaviest.
// Tiles (static shared memory <= 48 KiB): hd 64: 64 x 64 in all three kernels; hd 128: key
// tiles of 32 (forward) and 16 (dq kernel), query tiles of 16 (dk / dv kernel). ptxas (sm_90),
// bf16 and f16 alike, no spills: forward 128 / 142 registers, 27.0 KiB (hd 64) / 34.0 KiB (hd
// 128); dq kernel 166 / 127 registers, 36.0 / 42.5 KiB; dk / dv kernel 218 / 242 registers, 36.8
// / 42.7 KiB. Not measured on a GPU yet (speed, occupancy); no double buffering of the K / V
// tiles, no ldmatrix: room left. Other head widths in fast mode: the SIMT fast kernels above
// with typed loads (D from y alike). Accuracy (the emulator's and the GPU test's bound): |x -
// ref| <= 4 u (1 + max |ref|) per tensor (y, dq, dk, dv), ref in double from the same rounded
// inputs, u = 2^-8 (bf16) or 2^-11 (f16): P and dS are rounded to
// the storage dtype as mma operands (relative error u each) and each output once more.
// cuDNN's SDPA (cudnn-frontend) was not used: its headers come from a PyPI wheel that is not
// installed here, its graphs cannot run in tools/cuda_emu, and there was no GPU to measure
// whether it beats this kernel.
#include <cstring>
#include <type_traits>

#include "backend_cuda/cuda_kernels_common.cuh"
#include "backend_cuda/cuda_mma.cuh"
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
         (BQ * HD) % kAttnThreads == 0 && (BK * HD) % kAttnThreads == 0 && BQ <= kAttnThreads &&
         BQ <= BK;
}
static_assert(attn_fits<32>() && attn_fits<64>() && attn_fits<128>(),
              "attention tiles: static shared memory <= 48 KiB per block, whole chains per thread, "
              "a query tile fits a key tile's buffer (the fast backward stages y there)");

// qkv, dy, y and dqkv hold elements of `io` (f32, or bf16 / f16: the typed entries); stats and
// pd are f32.
struct AttnArgs {
  const void* qkv;  // [B, T, 3C]
  const void* dy;   // [B, T, C] (backward)
  void* y;          // [B, T, C]: forward, written; backward, the forward's output or null (read
                    // by the tensor-core dq kernel for D = rowsum(dy * y))
  void* dqkv;       // [B, T, 3C] (backward)
  gpt::SoftmaxStats* stats;  // [B, nh, T]
  float* pd;         // [B, nh, T] (backward)
  i64 T, C, nh, hd;
  float scale;       // gpt::attention_scale(hd)
  gpt::AttentionDropout drop;
  DType io = DType::f32;
  i64 tile0 = 0;     // the tile of blockIdx.y == 0 (launches split past the grid's y limit)
};

// The query tile of this block (forward, dq kernels), heaviest first: under the causal mask a
// later query tile has more keys, and the grid's blocks start roughly in blockIdx order, so
// blockIdx.y 0 (of the first launch) takes the last tile. The dk / dv kernels keep the natural
// order: key tile 0 sees every query, the heaviest already first.
__device__ __forceinline__ i64 heavy_first_tile(const AttnArgs& a, int rows) {
  return (a.T + rows - 1) / rows - 1 - (a.tile0 + i64(blockIdx.y));
}

// float_formats.h's to_float of a bf16 / f16 code without its normalisation loop (which ptxas
// does not inline: a call in the tiled kernels cost them registers and spills): the same f32
// for every code, NaNs with the quiet bit set as there.
__device__ __forceinline__ float widen_bf16(std::uint16_t h) {
  std::uint32_t x = std::uint32_t(h) << 16;  // normals, zeros and subnormals: the same value
  if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu) != 0) x |= 0x400000u;  // quiet NaN
  return pmath::detail::from_bits(x);
}
__device__ __forceinline__ float widen_f16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu,
                      m = h & 0x3ffu;
  if (e == 0x1fu) return pmath::detail::from_bits(sign | (m ? 0x7fc00000u | (m << 13) : 0x7f800000u));
  if (e == 0) {  // zero or subnormal: m 2^-24, exact in f32
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return pmath::detail::from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// A bf16 / f16 code of E widened to f32 (exact).
template <class E>
__device__ __forceinline__ float widen_e(std::uint16_t h) {
  if constexpr (std::is_same_v<E, bfloat16>)
    return widen_bf16(h);
  else
    return widen_f16(h);
}

// Element i of an io array of E (float, bfloat16, float16), widened to f32 (exact).
template <class E>
__device__ __forceinline__ float load_io(const E* p, i64 i) {
  if constexpr (std::is_same_v<E, float>)
    return p[i];
  else
    return widen_e<E>(p[i].bits);
}

// p[i] = v rounded once (to nearest even) into t: MixedOp's cast of the f32 result.
__device__ __forceinline__ void store_io(void* p, DType t, i64 i, float v) { st_elem(p, t, i, v); }

// exp of the mode: the portable canonical::exp (bitwise) or expf (fast).
template <bool kFast>
__device__ __forceinline__ float attn_exp(float x) {
  if constexpr (kFast)
    return ::expf(x);
  else
    return cm::exp(x);
}

// dst[r][i] = rows r0 + r of the hd-wide column slice at element `off` of `src` (elements of t,
// widened; row stride `stride`), r < R, i < HD; 0 past T or past hd. Consecutive threads read
// consecutive channels of a row. The dtype is a run-time test per element (one kernel for the
// three: a template on it would triple the SIMT kernels' instantiations and compile time).
template <int R, int HD>
__device__ __forceinline__ void stage_rows(float (*dst)[HD + 1], const void* src, DType t, i64 off,
                                           i64 stride, i64 r0, i64 T, i64 hd) {
  for (int e = threadIdx.x; e < R * HD; e += blockDim.x) {
    const int r = e / HD, i = e % HD;
    const i64 k = off + (r0 + r) * stride + i;
    float v = 0.0f;
    if (r0 + r < T && i < hd) {
      if (t == DType::bf16) v = load_io(static_cast<const bfloat16*>(src), k);
      else if (t == DType::f16) v = load_io(static_cast<const float16*>(src), k);
      else v = load_io(static_cast<const float*>(src), k);
    }
    dst[r][i] = v;
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
__device__ __forceinline__ void score_key_tile(const AttnArgs& a, i64 base, i64 h,
                                               i64 q0, i64 k0, const float (*qs)[HD + 1],
                                               float (*ks)[HD + 1], float (*vs)[HD + 1],
                                               float (*sc)[BK + 1]) {
  const i64 W = 3 * a.C;
  __syncthreads();
  stage_rows<BK, HD>(ks, a.qkv, a.io, base + a.C + h * a.hd, W, k0, a.T, a.hd);
  if (vs) stage_rows<BK, HD>(vs, a.qkv, a.io, base + 2 * a.C + h * a.hd, W, k0, a.T, a.hd);
  __syncthreads();
  pair_dots<HD, BQ, BK, true>(qs, ks, sc, a.hd, a.scale, q0, k0, a.T);
}

// f(j, r, row, i) for each output this thread owns: o = threadIdx.x + kAttnThreads j (j < J),
// tile row r = o / HD, channel i = o % HD, row = r0 + r, for the rows before T and i < hd.
// Unrolled: j is a constant in each copy, so the callers' accumulators acc[J] (dk[J], dv[J])
// stay in registers; a loop indexing them put them in local memory (a 64-144 byte stack frame)
// and left the first backward kernel short of registers (8-12 bytes of spills, ptxas sm_90).
template <int HD, int J, class F>
__device__ __forceinline__ void for_owned_outputs(i64 r0, i64 T, i64 hd, F f) {
#pragma unroll
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
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = heavy_first_tile(a, BQ) * BQ;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd;
  const i64 base = b * T * W;  // element offset of batch b in qkv
  const int tid = threadIdx.x;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;  // queries [q0, q_end), keys [0, q_end)
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  stage_rows<BQ, HD>(qs, a.qkv, a.io, base + h * hd, W, q0, T, hd);
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
    store_io(a.y, a.io, (b * T + t) * a.C + h * hd + i, acc[j]);
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
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = heavy_first_tile(a, BQ) * BQ;
  const i64 T = a.T, W = 3 * a.C, hd = a.hd;
  const i64 base = b * T * W;  // element offset of batch b in qkv
  const int tid = threadIdx.x;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  const float ds = a.drop.active() ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_rows<BQ, HD>(qs, a.qkv, a.io, base + h * hd, W, q0, T, hd);
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
    store_io(a.y, a.io, (b * T + t) * a.C + h * hd + i, acc[j] / row_l[r]);
  });
}

// ---- backward: what both kernels share ---------------------------------------------------------
// A backward block's shared memory: the Q and dy rows of a query tile, the K and V rows of a key
// tile ([rows][HD + 1], Note [CUDA attention]), the pair tiles sc (scores, then dpre) and dp (dy .
// v, then the dropped weight a in the second kernel), and per query row its stats and pd.
template <int HD>
struct AttnBackwardSmem {
  static constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK;
  float qs[BQ][HD + 1], dys[BQ][HD + 1], ks[BK][HD + 1], vs[BK][HD + 1];
  float sc[BQ][BK + 1], dp[BQ][BK + 1];
  float row_m[BQ], row_sum[BQ], row_pd[BQ];
};

// A backward block's (b, h) (blockIdx.x = b nh + h), and head = (b nh + h) T, the stats and pd
// index of (b, h)'s query 0.
struct AttnHead {
  i64 b, h, head;
};
__device__ __forceinline__ AttnHead attn_head(const AttnArgs& a) {
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh;
  return AttnHead{b, h, (b * a.nh + h) * a.T};
}

// Stages query rows [q0, q0 + BQ): their q and dy rows, and for the rows before T their stats
// (and pd, with_pd: the second kernel reads the first's). The caller puts the barrier after.
template <int HD>
__device__ __forceinline__ void stage_query_tile(const AttnArgs& a, const AttnHead& k,
                                                 AttnBackwardSmem<HD>& s, i64 q0, bool with_pd) {
  constexpr int BQ = AttnTile<HD>::BQ;
  const i64 T = a.T, hd = a.hd;
  stage_rows<BQ, HD>(s.qs, a.qkv, a.io, k.b * T * 3 * a.C + k.h * hd, 3 * a.C, q0, T, hd);
  stage_rows<BQ, HD>(s.dys, a.dy, a.io, k.b * T * a.C + k.h * hd, a.C, q0, T, hd);
  const int tid = threadIdx.x;
  if (tid < BQ && q0 + tid < T) {
    s.row_m[tid] = a.stats[k.head + q0 + tid].m;
    s.row_sum[tid] = a.stats[k.head + q0 + tid].sum;
    if (with_pd) s.row_pd[tid] = a.pd[k.head + q0 + tid];
  }
}

// Per pair (t, u) = (q0 + r, k0 + c) of the tiles, u <= t < T: sc[r][c] <- dpre (attn_pair from
// its score sc and dp, then gpt::attention_dpre with row r's pd) and, with keep_a, dp[r][c] <- its
// dropped weight a (dv's factor); ds the dropout scale. The caller puts the barriers around.
template <int HD, bool kFast>
__device__ __forceinline__ void pairs_to_dpre(const AttnArgs& a, const AttnHead& k,
                                              AttnBackwardSmem<HD>& s, i64 q0, i64 k0, float ds,
                                              bool keep_a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK;
  for (int p = threadIdx.x; p < BQ * BK; p += kAttnThreads) {
    const int r = p / BK, c = p % BK;
    const i64 t = q0 + r, u = k0 + c;
    if (t >= a.T || u > t) continue;
    const gpt::AttentionPair pr = attn_pair<kFast>(
        s.sc[r][c], s.dp[r][c], gpt::SoftmaxStats{s.row_m[r], s.row_sum[r]}, a.drop,
        gpt::attention_row_index(a.nh, a.T, k.b, k.h, t) + std::uint64_t(u), ds);
    s.sc[r][c] = gpt::attention_dpre(pr, s.row_pd[r], a.scale, a.drop.active());
    if (keep_a) s.dp[r][c] = pr.a;
  }
}

// ---- backward, first kernel: pd and dq per query tile ------------------------------------------
// gpt::attention_query_backward for queries [q0, q0 + BQ): pass 1 pd = chain fma(att, da) (thread
// r < BQ), pass 2 dpre per pair and dq's chains (output (r, i) as the forward's y). Fast mode
// given y: pd = rowsum(dy * y) in place of pass 1.
template <int HD, bool kFast>
__global__ void __launch_bounds__(kAttnThreads) attn_query_backward(const AttnArgs a) {
  constexpr int BQ = AttnTile<HD>::BQ, BK = AttnTile<HD>::BK, J = BQ * HD / kAttnThreads;
  __shared__ AttnBackwardSmem<HD> s;
  const AttnHead k = attn_head(a);
  const i64 b = k.b, h = k.h, T = a.T, W = 3 * a.C, hd = a.hd, base = b * T * W;
  const i64 q0 = heavy_first_tile(a, BQ) * BQ;
  const int tid = threadIdx.x;
  const bool dropped = a.drop.active();
  const float ds = dropped ? gpt::dropout_scale(a.drop.p) : 1.0f;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 t_own = q0 + tid;
  const bool owner = tid < BQ && t_own < T;
  stage_query_tile<HD>(a, k, s, q0, false);
  // One key tile's scores and dp = dy_t . v_u into sc and dp.
  auto tile = [&](i64 k0) {
    score_key_tile<HD, BQ, BK>(a, base, h, q0, k0, s.qs, s.ks, s.vs, s.sc);
    pair_dots<HD, BQ, BK, false>(s.dys, s.vs, s.dp, hd, 1.0f, q0, k0, T);
    __syncthreads();
  };
  float pd = 0.0f;
  if (kFast && a.y) {
    // pd = D = rowsum(dy * y) (FlashAttention-2's; y = sum_u drop(att_u) v_u, so the same value
    // as pass 1's): y's rows staged in ks (the first tile overwrites it after a barrier), one
    // chain over the channels per query.
    stage_rows<BQ, HD>(s.ks, a.y, a.io, b * T * a.C + h * hd, a.C, q0, T, hd);
    __syncthreads();
    if (owner)
      for (int i = 0; i < hd; ++i) pd = fmaf(s.dys[tid][i], s.ks[tid][i], pd);
  } else {
    // Pass 1: pd = chain fma(att, da).
    for (i64 k0 = 0; k0 < q_end; k0 += BK) {
      tile(k0);
      if (owner) {
        const gpt::SoftmaxStats st{s.row_m[tid], s.row_sum[tid]};
        const std::uint64_t row = gpt::attention_row_index(a.nh, T, b, h, t_own);
        for (i64 c = 0; c < BK && k0 + c <= t_own; ++c) {
          const gpt::AttentionPair p = attn_pair<kFast>(s.sc[tid][c], s.dp[tid][c], st, a.drop,
                                                        row + std::uint64_t(k0 + c), ds);
          pd = cm::fma(p.att, p.da, pd);
        }
      }
    }
  }
  if (owner) {
    s.row_pd[tid] = pd;
    a.pd[k.head + t_own] = pd;
  }
  // Pass 2: dq[i] = chain fma(dpre_u, k_u[i]).
  float acc[J];
  for (int j = 0; j < J; ++j) acc[j] = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    tile(k0);
    pairs_to_dpre<HD, kFast>(a, k, s, q0, k0, ds, false);
    __syncthreads();
    for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int r, i64 t, int i) {
      for (i64 c = 0; c < BK && k0 + c <= t; ++c)
        acc[j] = cm::fma(s.sc[r][c], s.ks[c][i], acc[j]);
    });
  }
  for_owned_outputs<HD, J>(q0, T, hd, [&](int j, int, i64 t, int i) {
    store_io(a.dqkv, a.io, (b * T + t) * W + h * hd + i,
             dropped ? acc[j] : cm::mul(acc[j], a.scale));
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
  __shared__ AttnBackwardSmem<HD> s;
  const AttnHead k = attn_head(a);
  const i64 b = k.b, h = k.h, T = a.T, W = 3 * a.C, hd = a.hd, base = b * T * W;
  const i64 k0 = (a.tile0 + i64(blockIdx.y)) * BK;
  const bool dropped = a.drop.active();
  const float ds = dropped ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_rows<BK, HD>(s.ks, a.qkv, a.io, base + a.C + h * hd, W, k0, T, hd);
  stage_rows<BK, HD>(s.vs, a.qkv, a.io, base + 2 * a.C + h * hd, W, k0, T, hd);
  float dk[J], dv[J];
  for (int j = 0; j < J; ++j) dk[j] = dv[j] = 0.0f;
  for (i64 q0 = k0 / BQ * BQ; q0 < T; q0 += BQ) {
    __syncthreads();
    stage_query_tile<HD>(a, k, s, q0, true);
    __syncthreads();
    pair_dots<HD, BQ, BK, true>(s.qs, s.ks, s.sc, hd, a.scale, q0, k0, T);
    pair_dots<HD, BQ, BK, false>(s.dys, s.vs, s.dp, hd, 1.0f, q0, k0, T);
    __syncthreads();
    pairs_to_dpre<HD, kFast>(a, k, s, q0, k0, ds, true);  // sc <- dpre, dp <- a
    __syncthreads();
    for_owned_outputs<HD, J>(k0, T, hd, [&](int j, int c, i64 u, int i) {
      const i64 r0 = u > q0 ? u - q0 : 0, r1 = T - q0 < BQ ? T - q0 : BQ;  // t in [max(u, q0), ..)
      for (i64 r = r0; r < r1; ++r) {
        dk[j] = cm::fma(s.sc[r][c], s.qs[r][i], dk[j]);
        dv[j] = cm::fma(s.dp[r][c], s.dys[r][i], dv[j]);
      }
    });
  }
  for_owned_outputs<HD, J>(k0, T, hd, [&](int j, int, i64 u, int i) {
    const i64 row = (b * T + u) * W + h * hd + i;
    store_io(a.dqkv, a.io, row + a.C, dropped ? dk[j] : cm::mul(dk[j], a.scale));
    store_io(a.dqkv, a.io, row + 2 * a.C, dv[j]);
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

// ---- fast typed: FlashAttention-2 on the tensor cores (bf16 / f16, hd 64 and 128) ---------------
// Note [CUDA attention], fast typed. Blocks of kAttnThreads (4 warps); each warp owns 16 rows
// (queries in the forward and the dq kernel, keys in the dk / dv kernel) and computes its
// products with mma_m16n8k16 (cuda_mma.cuh, Note [mma fragments]). Tiles are staged in shared
// memory as their 16-bit elements, rows padded by kMmaPad elements (a row is 36 or 68 words:
// the fragment loads of a warp, 8 rows x 4 words, hit 32 distinct banks), 16 bytes per load.

constexpr int kMmaPad = 8;
constexpr int kMmaRows = 64;  // rows of a block: 4 warps x 16

// Key tile of the forward (BKF), of the dq kernel (BKQ) and query tile of the dk / dv kernel
// (BQK) by head width: static shared memory <= 48 KiB.
template <int HD>
struct MmaTile;
template <>
struct MmaTile<64> {
  static constexpr int BKF = 64, BKQ = 64, BQK = 64;
};
template <>
struct MmaTile<128> {
  static constexpr int BKF = 32, BKQ = 16, BQK = 16;
};
template <int HD>
constexpr int mma_smem_bytes(int rows) {
  return 2 * rows * (HD + kMmaPad);
}
static_assert(mma_smem_bytes<64>(3 * 64) <= 48 * 1024 &&
                  mma_smem_bytes<64>(2 * 64 + 2 * 64) + 3 * 4 * 64 <= 48 * 1024 &&
                  mma_smem_bytes<128>(64 + 2 * 32) <= 48 * 1024 &&
                  mma_smem_bytes<128>(2 * 64 + 2 * 16) + 3 * 4 * 64 <= 48 * 1024,
              "mma attention tiles: static shared memory <= 48 KiB per block");

template <int HD>
using MmaRow = std::uint16_t[HD + kMmaPad];

// 16-byte and 4-byte accesses of 16-bit elements (aligned): one vector load or store on the
// GPU; memcpy on the host (tools/cuda_emu), where the cast would break strict aliasing.
__device__ __forceinline__ uint4 load16(const std::uint16_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint4*>(p);
#else
  uint4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
#endif
}
__device__ __forceinline__ void store16(std::uint16_t* p, uint4 v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint4*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

// dst[r] = rows r0 + r < R of the HD-wide slice at element `off` of the 16-bit array `src` (row
// stride `stride` elements), zeros past T. `vec`: every row start is 16-byte aligned (one uint4
// per 8 elements), else element by element.
template <int R, int HD>
__device__ __forceinline__ void stage_mma(MmaRow<HD>* dst, const std::uint16_t* src, i64 off,
                                          i64 stride, i64 r0, i64 T, bool vec) {
  constexpr int CH = HD / 8;
  for (int e = threadIdx.x; e < R * CH; e += blockDim.x) {
    const int r = e / CH, c = (e % CH) * 8;
    uint4 v{0u, 0u, 0u, 0u};
    if (r0 + r < T) {
      const std::uint16_t* p = src + off + (r0 + r) * stride + c;
      if (vec) {
        v = load16(p);
      } else {
        v.x = pack_bits(p[0], p[1]);
        v.y = pack_bits(p[2], p[3]);
        v.z = pack_bits(p[4], p[5]);
        v.w = pack_bits(p[6], p[7]);
      }
    }
    store16(&dst[r][c], v);
  }
}

__device__ __forceinline__ unsigned smem_word(const std::uint16_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const unsigned*>(p);
#else
  unsigned w;
  std::memcpy(&w, p, sizeof w);
  return w;
#endif
}

// The A fragment of the 16 x 16 block at (row0, k0) of a row-major tile (Note [mma fragments]).
template <int HD>
__device__ __forceinline__ void frag_a(const MmaRow<HD>* s, int row0, int k0, int g, int t,
                                       unsigned (&a)[4]) {
  a[0] = smem_word(&s[row0 + g][k0 + 2 * t]);
  a[1] = smem_word(&s[row0 + g + 8][k0 + 2 * t]);
  a[2] = smem_word(&s[row0 + g][k0 + 2 * t + 8]);
  a[3] = smem_word(&s[row0 + g + 8][k0 + 2 * t + 8]);
}

// The B fragment of B[k][n] = s[n0 + n][k0 + k] (B is the tile transposed: S = Q K^T).
template <int HD>
__device__ __forceinline__ void frag_b_t(const MmaRow<HD>* s, int n0, int k0, int g, int t,
                                         unsigned (&b)[2]) {
  b[0] = smem_word(&s[n0 + g][k0 + 2 * t]);
  b[1] = smem_word(&s[n0 + g][k0 + 2 * t + 8]);
}

// The B fragment of B[k][n] = s[k0 + k][n0 + n] (B is the tile: O = P V).
template <int HD>
__device__ __forceinline__ void frag_b(const MmaRow<HD>* s, int k0, int n0, int g, int t,
                                       unsigned (&b)[2]) {
  b[0] = pack_bits(s[k0 + 2 * t][n0 + g], s[k0 + 2 * t + 1][n0 + g]);
  b[1] = pack_bits(s[k0 + 2 * t + 8][n0 + g], s[k0 + 2 * t + 9][n0 + g]);
}

// acc[n] (n < N8 tiles of 8 columns) = A B over KS k16 slices, A the 16 rows at `arow` of `as`,
// B[k][n] = bs[n][k] (rows n of bs): S = Q K^T, dP = dO V^T.
template <class E, int HD, int N8>
__device__ __forceinline__ void mma_rows_by_rows(const MmaRow<HD>* as, int arow,
                                                 const MmaRow<HD>* bs, int g, int t,
                                                 float (&acc)[N8][4]) {
#pragma unroll
  for (int n = 0; n < N8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int k = 0; k < HD; k += 16) {
    unsigned a[4];
    frag_a<HD>(as, arow, k, g, t, a);
#pragma unroll
    for (int n = 0; n < N8; ++n) {
      unsigned b[2];
      frag_b_t<HD>(bs, n * 8, k, g, t, b);
      mma_m16n8k16<E>(acc[n], a, b, acc[n]);
    }
  }
}

// acc[n] += P B over the K16 slices of P (P given as C fragments p[2 K16][4], rounded to E
// here), B[k][n] = bs[k][n] (rows k of bs): O += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q.
template <class E, int HD, int K16>
__device__ __forceinline__ void mma_frags_by_tile(const float (&p)[2 * K16][4],
                                                  const MmaRow<HD>* bs, int g, int t,
                                                  float (&acc)[HD / 8][4]) {
#pragma unroll
  for (int j = 0; j < K16; ++j) {
    unsigned a[4];
    to_a_fragment<E>(p[2 * j], p[2 * j + 1], a);
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      unsigned b[2];
      frag_b<HD>(bs, 16 * j, n * 8, g, t, b);
      mma_m16n8k16<E>(acc[n], a, b, acc[n]);
    }
  }
}

// The sum of x over the 4 lanes of a group (the lanes sharing a fragment row).
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float group_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Whether every row of io starts 16-byte aligned: base pointer and the row strides (3C, C) and
// the head offsets (multiples of hd) in whole 8-element units.
inline bool mma_vec_ok(const void* p, i64 C, i64 hd) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && C % 8 == 0 && hd % 8 == 0;
}

// ---- forward, fast typed -----------------------------------------------------------------------
// Block (b h, query tile of 64); warp w owns queries q0 + 16 w .. + 15, lane (g, t) the fragment
// rows g and g + 8 (ta, tb). Per key tile: S = Q K^T (mma), scaled and masked (u > t or u >= T:
// -inf); the online softmax on the fragments (row max over the group's 4 lanes, m, the partial l
// of the lane's columns, alpha = exp(m_old - m)); O = alpha O + drop(P) V with P rounded to E as
// the A operand. y = O / l rounded to E, stats {m, l} as attention_forward's.
template <class E, int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_forward_mma(const AttnArgs a, bool vec) {
  constexpr int BQ = kMmaRows, BK = MmaTile<HD>::BKF, N8 = BK / 8;
  __shared__ __align__(16) MmaRow<HD> qs[BQ], ks[BK], vs[BK];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = heavy_first_tile(a, BQ) * BQ;
  const i64 T = a.T, W = 3 * a.C, base = b * T * W;
  const auto* qkv = static_cast<const std::uint16_t*>(a.qkv);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane % 4;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 tr[2] = {q0 + 16 * w + g, q0 + 16 * w + g + 8};
  const i64 w_last = q0 + 16 * w + 15;  // the warp's last query: later keys are all masked
  const bool dropped = a.drop.active();
  const float ds = dropped ? gpt::dropout_scale(a.drop.p) : 1.0f;
  std::uint64_t row_index[2];
  for (int r = 0; r < 2; ++r) row_index[r] = gpt::attention_row_index(a.nh, T, b, h, tr[r]);
  stage_mma<BQ, HD>(qs, qkv, base + h * HD, W, q0, T, vec);
  float m[2] = {-pmath::detail::infinity(), -pmath::detail::infinity()}, l[2] = {0.0f, 0.0f};
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  for (i64 k0 = 0; k0 < q_end; k0 += BK) {
    __syncthreads();
    stage_mma<BK, HD>(ks, qkv, base + a.C + h * HD, W, k0, T, vec);
    stage_mma<BK, HD>(vs, qkv, base + 2 * a.C + h * HD, W, k0, T, vec);
    __syncthreads();
    if (k0 > w_last) continue;  // warp-uniform: every key of the tile is after the warp's rows
    float s[N8][4];
    mma_rows_by_rows<E, HD, N8>(qs, 16 * w, ks, g, t4, s);
    float mx[2] = {-pmath::detail::infinity(), -pmath::detail::infinity()};
#pragma unroll
    for (int n = 0; n < N8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const i64 u = k0 + n * 8 + 2 * t4 + (e & 1), t = tr[e >> 1];
        s[n][e] = (u <= t && u < T) ? s[n][e] * a.scale : -pmath::detail::infinity();
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float alpha[2], mb[2];
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(m[r], group_max(mx[r]));
      mb[r] = mn == -pmath::detail::infinity() ? 0.0f : mn;  // a row with no key yet (t >= T)
      alpha[r] = ::expf(m[r] - mb[r]);
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < N8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float pe = ::expf(s[n][e] - mb[r]);
        l[r] += pe;
        s[n][e] = pe;
        if (dropped) {
          const i64 u = k0 + n * 8 + 2 * t4 + (e & 1);
          s[n][e] = a.drop.kept(row_index[r] + std::uint64_t(u)) ? pe * ds : 0.0f;
        }
      }
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] *= alpha[e >> 1];
    mma_frags_by_tile<E, HD, BK / 16>(s, vs, g, t4, o);
  }
  for (int r = 0; r < 2; ++r) l[r] = group_sum(l[r]);
  auto* y = static_cast<E*>(a.y);
  for (int r = 0; r < 2; ++r) {
    const i64 t = tr[r];
    if (t >= T) continue;
    const float inv = 1.0f / l[r];
    E* yrow = y + (b * T + t) * a.C + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const unsigned v = pack2<E>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      yrow[n * 8 + 2 * t4].bits = static_cast<std::uint16_t>(v & 0xffffu);
      yrow[n * 8 + 2 * t4 + 1].bits = static_cast<std::uint16_t>(v >> 16);
    }
    if (t4 == 0) a.stats[(b * a.nh + h) * T + t] = gpt::SoftmaxStats{m[r], l[r]};
  }
}

// The backward's per-pair pieces from the fragments s (raw scores Q K^T) and dp (dO V^T) at
// (query t, key u): P = exp(s scale - m) / l (0 where masked), pa = drop(P) (dV's operand) and
// dS = P (drop(dp) - D) (the scale applied to dq and dk at the end).
struct MmaRowStats {
  float m, inv_l, D;
};
__device__ __forceinline__ void mma_pair(const AttnArgs& a, float ds, bool valid,
                                         std::uint64_t index, MmaRowStats st, float& s,
                                         float& dp) {
  if (!valid) {
    s = dp = 0.0f;
    return;
  }
  const float p = ::expf(s * a.scale - st.m) * st.inv_l;
  float pa = p, dpd = dp;
  if (a.drop.active()) {
    const bool keep = a.drop.kept(index);
    pa = keep ? p * ds : 0.0f;
    dpd = keep ? dp * ds : 0.0f;
  }
  s = pa;                // drop(P)
  dp = p * (dpd - st.D);  // dS
}

// ---- backward, fast typed, first kernel: D (pd) and dq per query tile --------------------------
// Block (b h, query tile of 64), warps as the forward's. D_t = rowsum(dO o y) (FlashAttention-2's)
// from the forward's output y where given (each lane the row's channels of its output fragments,
// summed over the group's 4 lanes), else a first pass D_t = sum_u P drop(dP) (the same value:
// y_t = sum_u drop(P) v_u) recomputing S and dP; written to pd. Then per key tile dS per pair and
// dQ += dS K (dS rounded to E as the A operand); dq = scale dQ rounded to E.
template <class E, int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_query_backward_mma(const AttnArgs a,
                                                                        bool vec) {
  constexpr int BQ = kMmaRows, BK = MmaTile<HD>::BKQ, N8 = BK / 8;
  __shared__ __align__(16) MmaRow<HD> qs[BQ], dos[BQ], ks[BK], vs[BK];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, q0 = heavy_first_tile(a, BQ) * BQ;
  const i64 T = a.T, W = 3 * a.C, base = b * T * W, head = (b * a.nh + h) * T;
  const auto* qkv = static_cast<const std::uint16_t*>(a.qkv);
  const auto* dy = static_cast<const std::uint16_t*>(a.dy);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane % 4;
  const i64 q_end = q0 + BQ < T ? q0 + BQ : T;
  const i64 tr[2] = {q0 + 16 * w + g, q0 + 16 * w + g + 8};
  const i64 w_last = q0 + 16 * w + 15;
  const float ds = a.drop.active() ? gpt::dropout_scale(a.drop.p) : 1.0f;
  std::uint64_t row_index[2];
  MmaRowStats st[2];
  for (int r = 0; r < 2; ++r) {
    row_index[r] = gpt::attention_row_index(a.nh, T, b, h, tr[r]);
    st[r] = tr[r] < T ? MmaRowStats{a.stats[head + tr[r]].m, 1.0f / a.stats[head + tr[r]].sum, 0.0f}
                      : MmaRowStats{0.0f, 0.0f, 0.0f};
  }
  const bool d_from_y = a.y != nullptr;
  if (d_from_y) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float d = 0.0f;
      if (tr[r] < T) {
        const i64 off = (b * T + tr[r]) * a.C + h * HD;
        const std::uint16_t *yr = static_cast<const std::uint16_t*>(a.y) + off, *dr = dy + off;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int i = n * 8 + 2 * t4 + e;
            d = fmaf(widen_e<E>(dr[i]), widen_e<E>(yr[i]), d);
          }
      }
      st[r].D = group_sum(d);
      if (t4 == 0 && tr[r] < T) a.pd[head + tr[r]] = st[r].D;
    }
  }
  stage_mma<BQ, HD>(qs, qkv, base + h * HD, W, q0, T, vec);
  stage_mma<BQ, HD>(dos, dy, b * T * a.C + h * HD, a.C, q0, T, vec);
  float dq[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  float Dp[2] = {0.0f, 0.0f};
  for (int pass = d_from_y ? 1 : 0; pass < 2; ++pass) {
    for (i64 k0 = 0; k0 < q_end; k0 += BK) {
      __syncthreads();
      stage_mma<BK, HD>(ks, qkv, base + a.C + h * HD, W, k0, T, vec);
      stage_mma<BK, HD>(vs, qkv, base + 2 * a.C + h * HD, W, k0, T, vec);
      __syncthreads();
      if (k0 > w_last) continue;
      float s[N8][4], dp[N8][4];
      mma_rows_by_rows<E, HD, N8>(qs, 16 * w, ks, g, t4, s);
      mma_rows_by_rows<E, HD, N8>(dos, 16 * w, vs, g, t4, dp);
#pragma unroll
      for (int n = 0; n < N8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const i64 u = k0 + n * 8 + 2 * t4 + (e & 1);
          mma_pair(a, ds, u <= tr[r] && tr[r] < T, row_index[r] + std::uint64_t(u), st[r],
                   s[n][e], dp[n][e]);
          // pass 0: dp holds P (drop(dP) - 0); D += P drop(dP) = that, as sum over u.
          if (pass == 0) Dp[r] += dp[n][e];
        }
      if (pass == 1) mma_frags_by_tile<E, HD, BK / 16>(dp, ks, g, t4, dq);
    }
    if (pass == 0)
      for (int r = 0; r < 2; ++r) {
        st[r].D = group_sum(Dp[r]);
        if (t4 == 0 && tr[r] < T) a.pd[head + tr[r]] = st[r].D;
      }
  }
  auto* out = static_cast<E*>(a.dqkv);
  for (int r = 0; r < 2; ++r) {
    if (tr[r] >= T) continue;
    E* row = out + (b * T + tr[r]) * W + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const unsigned v = pack2<E>(dq[n][2 * r] * a.scale, dq[n][2 * r + 1] * a.scale);
      row[n * 8 + 2 * t4].bits = static_cast<std::uint16_t>(v & 0xffffu);
      row[n * 8 + 2 * t4 + 1].bits = static_cast<std::uint16_t>(v >> 16);
    }
  }
}

// ---- backward, fast typed, second kernel: dk and dv per key tile -------------------------------
// Block (b h, key tile of 64); warp w owns keys k0 + 16 w .. + 15 (fragment rows), over the query
// tiles from k0 to T: S^T = K Q^T and dP^T = V dO^T (mma), per pair P, drop(P), dS from the
// stats and the first kernel's D, then dV += drop(P)^T dO and dK += dS^T Q (mma, the pair
// fragments rounded to E as A operands); dk = scale dK, dv rounded to E. No atomics: each block
// owns its keys' dk and dv, the first kernel its queries' dq (run to run deterministic).
template <class E, int HD>
__global__ void __launch_bounds__(kAttnThreads) attn_key_backward_mma(const AttnArgs a, bool vec) {
  constexpr int BK = kMmaRows, BQ = MmaTile<HD>::BQK, N8 = BQ / 8;
  __shared__ __align__(16) MmaRow<HD> ks[BK], vs[BK], qs[BQ], dos[BQ];
  __shared__ MmaRowStats qst[BQ];
  const i64 b = blockIdx.x / a.nh, h = blockIdx.x % a.nh, k0 = (a.tile0 + i64(blockIdx.y)) * BK;
  const i64 T = a.T, W = 3 * a.C, base = b * T * W, head = (b * a.nh + h) * T;
  const auto* qkv = static_cast<const std::uint16_t*>(a.qkv);
  const auto* dy = static_cast<const std::uint16_t*>(a.dy);
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane % 4;
  const i64 ur[2] = {k0 + 16 * w + g, k0 + 16 * w + g + 8};
  const i64 w_first = k0 + 16 * w;  // the warp's first key: earlier queries see none of its keys
  const float ds = a.drop.active() ? gpt::dropout_scale(a.drop.p) : 1.0f;
  stage_mma<BK, HD>(ks, qkv, base + a.C + h * HD, W, k0, T, vec);
  stage_mma<BK, HD>(vs, qkv, base + 2 * a.C + h * HD, W, k0, T, vec);
  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;
  for (i64 q0 = k0; q0 < T; q0 += BQ) {
    __syncthreads();
    stage_mma<BQ, HD>(qs, qkv, base + h * HD, W, q0, T, vec);
    stage_mma<BQ, HD>(dos, dy, b * T * a.C + h * HD, a.C, q0, T, vec);
    for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
      const i64 t = q0 + r;
      qst[r] = t < T ? MmaRowStats{a.stats[head + t].m, 1.0f / a.stats[head + t].sum,
                                   a.pd[head + t]}
                     : MmaRowStats{0.0f, 0.0f, 0.0f};
    }
    __syncthreads();
    if (q0 + BQ - 1 < w_first) continue;  // warp-uniform: every query of the tile is before its keys
    float s[N8][4], dp[N8][4];
    mma_rows_by_rows<E, HD, N8>(ks, 16 * w, qs, g, t4, s);   // S^T [key][query]
    mma_rows_by_rows<E, HD, N8>(vs, 16 * w, dos, g, t4, dp);  // dP^T
#pragma unroll
    for (int n = 0; n < N8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * t4 + (e & 1);
        const i64 t = q0 + c, u = ur[e >> 1];
        mma_pair(a, ds, u <= t && t < T,
                 gpt::attention_row_index(a.nh, T, b, h, t) + std::uint64_t(u), qst[c], s[n][e],
                 dp[n][e]);
      }
    mma_frags_by_tile<E, HD, BQ / 16>(s, dos, g, t4, dv);
    mma_frags_by_tile<E, HD, BQ / 16>(dp, qs, g, t4, dk);
  }
  auto* out = static_cast<E*>(a.dqkv);
  for (int r = 0; r < 2; ++r) {
    if (ur[r] >= T) continue;
    E* row = out + (b * T + ur[r]) * W + h * HD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const unsigned k = pack2<E>(dk[n][2 * r] * a.scale, dk[n][2 * r + 1] * a.scale);
      const unsigned v = pack2<E>(dv[n][2 * r], dv[n][2 * r + 1]);
      const int i = n * 8 + 2 * t4;
      row[a.C + i].bits = static_cast<std::uint16_t>(k & 0xffffu);
      row[a.C + i + 1].bits = static_cast<std::uint16_t>(k >> 16);
      row[2 * a.C + i].bits = static_cast<std::uint16_t>(v & 0xffffu);
      row[2 * a.C + i + 1].bits = static_cast<std::uint16_t>(v >> 16);
    }
  }
}

// ---- host side ---------------------------------------------------------------------------------

constexpr i64 kMaxGridY = 65535;

// The head-width class of the tiled kernels for hd (32, 64, 128), or 0: the reference kernels
// (hd > 128, or more (b, h) than a grid's x dimension holds). More tiles than the grid's y
// dimension holds run as several launches (AttnArgs::tile0).
int head_class(i64 B, i64 nh, i64 hd) {
  if (B * nh > i64(0x7fffffff)) return 0;
  if (hd <= 32) return 32;
  if (hd <= 64) return 64;
  if (hd <= 128) return 128;
  return 0;
}

// f(args, grid) for the launches covering `tiles` tiles of (b, h) rows: grid (B nh, up to
// kMaxGridY tiles), args.tile0 the first tile of each.
template <class F>
void for_tile_chunks(AttnArgs a, i64 B, i64 tiles, F f) {
  for (i64 t0 = 0; t0 < tiles; t0 += kMaxGridY) {
    a.tile0 = t0;
    f(a, dim3(static_cast<unsigned>(B * a.nh), static_cast<unsigned>(std::min(tiles - t0, kMaxGridY))));
  }
}

i64 tiles_of(i64 T, i64 rows) { return (T + rows - 1) / rows; }

template <int HD>
void launch_forward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  for_tile_chunks(a, B, tiles_of(a.T, AttnTile<HD>::BQ), [&](const AttnArgs& c, dim3 grid) {
    if (mode == Determinism::fast)
      attn_forward_fast<HD><<<grid, kAttnThreads, 0, l.get()>>>(c);
    else
      attn_forward_bitwise<HD><<<grid, kAttnThreads, 0, l.get()>>>(c);
    l.check();
  });
}

template <int HD, bool kFast>
void launch_backward(const Launch& l, const AttnArgs& a, i64 B) {
  for_tile_chunks(a, B, tiles_of(a.T, AttnTile<HD>::BQ), [&](const AttnArgs& c, dim3 grid) {
    attn_query_backward<HD, kFast><<<grid, kAttnThreads, 0, l.get()>>>(c);
    l.check();
  });
  for_tile_chunks(a, B, tiles_of(a.T, AttnTile<HD>::BK), [&](const AttnArgs& c, dim3 grid) {
    attn_key_backward<HD, kFast><<<grid, kAttnThreads, 0, l.get()>>>(c);
    l.check();
  });
}

template <int HD>
void launch_backward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  if (mode == Determinism::fast)
    launch_backward<HD, true>(l, a, B);
  else
    launch_backward<HD, false>(l, a, B);
}

// The tiled SIMT kernels of hd's class (both modes; any io dtype); false: none (hd > 128).
bool launch_tiled_forward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  switch (head_class(B, a.nh, a.hd)) {
    case 32: return launch_forward<32>(l, a, B, mode), true;
    case 64: return launch_forward<64>(l, a, B, mode), true;
    case 128: return launch_forward<128>(l, a, B, mode), true;
    default: return false;
  }
}
bool launch_tiled_backward(const Launch& l, const AttnArgs& a, i64 B, Determinism mode) {
  switch (head_class(B, a.nh, a.hd)) {
    case 32: return launch_backward<32>(l, a, B, mode), true;
    case 64: return launch_backward<64>(l, a, B, mode), true;
    case 128: return launch_backward<128>(l, a, B, mode), true;
    default: return false;
  }
}

// The tensor-core kernels (fast typed): hd 64 or 128, bf16 or f16.
bool mma_attention(DType t, i64 hd, Determinism mode) {
  return mode == Determinism::fast && (t == DType::bf16 || t == DType::f16) &&
         (hd == 64 || hd == 128);
}

template <class E, int HD>
void launch_forward_mma(const Launch& l, const AttnArgs& a, i64 B, bool vec) {
  for_tile_chunks(a, B, tiles_of(a.T, kMmaRows), [&](const AttnArgs& c, dim3 grid) {
    attn_forward_mma<E, HD><<<grid, kAttnThreads, 0, l.get()>>>(c, vec);
    l.check();
  });
}

template <class E, int HD>
void launch_backward_mma(const Launch& l, const AttnArgs& a, i64 B, bool vec) {
  for_tile_chunks(a, B, tiles_of(a.T, kMmaRows), [&](const AttnArgs& c, dim3 grid) {
    attn_query_backward_mma<E, HD><<<grid, kAttnThreads, 0, l.get()>>>(c, vec);
    l.check();
  });
  for_tile_chunks(a, B, tiles_of(a.T, kMmaRows), [&](const AttnArgs& c, dim3 grid) {
    attn_key_backward_mma<E, HD><<<grid, kAttnThreads, 0, l.get()>>>(c, vec);
    l.check();
  });
}

template <bool kForward, class E>
void launch_mma(const Launch& l, const AttnArgs& a, i64 B, bool vec) {
  if (a.hd == 64)
    kForward ? launch_forward_mma<E, 64>(l, a, B, vec) : launch_backward_mma<E, 64>(l, a, B, vec);
  else
    kForward ? launch_forward_mma<E, 128>(l, a, B, vec)
             : launch_backward_mma<E, 128>(l, a, B, vec);
}

template <bool kForward>
void launch_mma(const Launch& l, const AttnArgs& a, i64 B) {
  const bool vec = mma_vec_ok(a.qkv, a.C, a.hd) && (kForward || mma_vec_ok(a.dy, a.C, a.hd));
  if (a.io == DType::bf16)
    launch_mma<kForward, bfloat16>(l, a, B, vec);
  else
    launch_mma<kForward, float16>(l, a, B, vec);
}

void check_typed(const char* op, DType t, i64 hd, i64 B, i64 nh) {
  if ((t != DType::bf16 && t != DType::f16) || hd < 1 || hd > 128 || B * nh > i64(0x7fffffff))
    throw InvalidArgument(std::string("Kernels::") + op +
                          ": expected dtype bf16 or f16 and head_dim in [1, 128] "
                          "(has_attention_ex), got dtype " +
                          dtype_name(t) + ", head_dim " + std::to_string(hd));
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
  const AttnArgs a{qkv, nullptr, y, nullptr, st, nullptr, T, C, nh, hd, gpt::attention_scale(hd),
                   drop};
  if (launch_tiled_forward(l, a, B, mode)) return;
  attention_forward_reference<<<blocks_for(B * nh * T, 128), 128, 0, l.get()>>>(qkv, B, T, C, nh, y, st, drop);
  l.check();
}

void CudaGptKernels::attention_backward(Stream& s, const float* dy, const float* qkv,
                                        const float* y, const float* stats, i64 B, i64 T, i64 C,
                                        i64 nh, float* dqkv, float* scratch, float p,
                                        std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t index_base, Determinism mode) {
  if (B <= 0 || T <= 0 || nh <= 0) return;
  Launch l(backend_, s, "attention_backward");
  const gpt::AttentionDropout drop{p, seed, stream, index_base};
  auto* st = reinterpret_cast<gpt::SoftmaxStats*>(const_cast<float*>(stats));
  const i64 hd = C / nh;
  // y: read by the fast tiled dq kernel (pd = rowsum(dy * y)); bitwise and the reference
  // kernels (hd > 128) recompute pd.
  const AttnArgs a{qkv, dy, const_cast<float*>(y), dqkv, st, scratch, T, C, nh, hd,
                   gpt::attention_scale(hd), drop};
  if (launch_tiled_backward(l, a, B, mode)) return;
  const int blocks = blocks_for(B * nh * T, 128);
  attention_query_backward_reference<<<blocks, 128, 0, l.get()>>>(dy, qkv, st, B, T, C, nh, dqkv, scratch, drop);
  l.check();
  attention_key_backward_reference<<<blocks, 128, 0, l.get()>>>(dy, qkv, st, scratch, B, T, C, nh, dqkv, drop);
  l.check();
}

bool CudaGptKernels::has_attention_ex(DType qkv_type, i64 head_dim, Determinism mode) const {
  return (qkv_type == DType::bf16 || qkv_type == DType::f16) && head_dim >= 1 &&
         head_dim <= 128 && is_valid_determinism(mode);
}

void CudaGptKernels::attention_forward_ex(Stream& s, const void* qkv, DType dtype, i64 B, i64 T,
                                          i64 C, i64 nh, void* y, float* stats, float p,
                                          std::uint64_t seed, std::uint64_t stream,
                                          std::uint64_t index_base, Determinism mode) {
  if (B <= 0 || T <= 0 || nh <= 0) return;
  const i64 hd = C / nh;
  check_typed("attention_forward_ex", dtype, hd, B, nh);
  Launch l(backend_, s, "attention_forward_ex");
  AttnArgs a{qkv, nullptr, y, nullptr, reinterpret_cast<gpt::SoftmaxStats*>(stats), nullptr, T, C,
             nh, hd, gpt::attention_scale(hd), gpt::AttentionDropout{p, seed, stream, index_base}};
  a.io = dtype;
  if (mma_attention(dtype, hd, mode))
    launch_mma<true>(l, a, B);
  else
    launch_tiled_forward(l, a, B, mode);
}

void CudaGptKernels::attention_backward_ex(Stream& s, const void* dy, const void* qkv,
                                           const void* y, DType dtype, const float* stats, i64 B, i64 T, i64 C, i64 nh,
                                           void* dqkv, float* scratch, float p,
                                           std::uint64_t seed, std::uint64_t stream,
                                           std::uint64_t index_base, Determinism mode) {
  if (B <= 0 || T <= 0 || nh <= 0) return;
  const i64 hd = C / nh;
  check_typed("attention_backward_ex", dtype, hd, B, nh);
  Launch l(backend_, s, "attention_backward_ex");
  // y: read by the fast dq kernels (tensor-core and SIMT) for pd = rowsum(dy * y); bitwise mode
  // recomputes pd (the simulator's bits).
  AttnArgs a{qkv, dy, const_cast<void*>(y), dqkv,
             reinterpret_cast<gpt::SoftmaxStats*>(const_cast<float*>(stats)), scratch, T, C, nh,
             hd, gpt::attention_scale(hd), gpt::AttentionDropout{p, seed, stream, index_base}};
  a.io = dtype;
  if (mma_attention(dtype, hd, mode))
    launch_mma<false>(l, a, B);
  else
    launch_tiled_backward(l, a, B, mode);
}

}  // namespace ditto::cuda::kern
