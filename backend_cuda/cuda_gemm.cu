// The CUDA backend's canonical GEMM kernels (Note [CUDA canonical GEMM]): plain C = op(A) op(B)
// in bitwise mode (and where cuBLAS cannot take the strides), and the micro-sharded
// dW = dY^T X. The rest of ditto::Kernels is in cuda_kernels.cu.
//
// Note [CUDA canonical GEMM]
// Note [Canonical GEMM] on a GPU: a 128 x 128 tile of C per block of 256 threads, 8 x 8
// accumulators per thread, k-tiles of 8 rows staged in double-buffered shared memory and
// consumed in ascending k, so each accumulator is one fma chain over k = 0..K-1 from 0.0f and k
// is never split across threads. Tiles past the end of k are padded with A = -0.0f and
// B = +0.0f: fma(-0, +0, acc) is acc + (-0) = acc for every acc (+0, -0, NaN and inf included),
// so a padded step changes no bit. Each thread stages runs of four consecutive elements along
// each operand's contiguous dimension, one 16-byte (f32) or 8-byte (bf16, f16) load where the run
// is whole and aligned (run_coord, load_run). The typed GEMM (Kernels::gemm_ex, bitwise) is the
// same kernel over A and B stored as bf16 or f16, widened to f32 (exactly) as they are loaded,
// with its results rounded once into C's dtype: the bits of the simulator's path, which casts
// the operands to f32, runs the f32 GEMM and rounds (Note [Mixed precision]); with a bias, the
// rounded result plus bias[n] is rounded again, the bits of gemm then add_bias. The micro-sharded dW = dY^T X (gemm_tn_sharded) is the same
// kernel walking its shards' tiles in row order (canonical::ShardTiles), folding each shard's
// accumulators into a canonical::TreeStack (Note [Streaming canonical tree]) when its last tile
// is done; a launch takes at most kShardCap shards and the host recursion of the canonical tree
// (shard_tree) combines larger counts. Its typed form (gemm_tn_sharded_ex: a bf16 run's dY and
// X) loads them in their storage dtype the same way and rounds each result once into C's dtype
// (C + T in f32 with accumulate), the bits of the simulator's MixedOp path; past kShardCap shards
// the tree's inner nodes stay f32 scratch and only the root (combine_typed_kernel) rounds.
#include <type_traits>

#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/float_formats.h"

namespace ditto::cuda::kern {
namespace {

// Element i of an operand stored as E (float, bfloat16, float16), widened to f32 (exact).
template <class E>
__device__ __forceinline__ float widen(const void* p, i64 i) {
  return ld_elem(static_cast<const E*>(p), i);
}

// Element i of C (or bias) of dtype t (f32, bf16, f16), widened to f32; C[i] = v rounded once (to
// nearest even) into t (cuda_kernels_common.cuh's run-time dtype ld_elem / st_elem).
__device__ __forceinline__ float load_c(const void* p, DType t, i64 i) { return ld_elem(p, t, i); }
__device__ __forceinline__ void store_c(void* p, DType t, i64 i, float v) { st_elem(p, t, i, v); }

// v rounded to dtype t and widened back: what load_c would read after store_c.
__device__ __forceinline__ float round_to(DType t, float v) {
  if (t == DType::bf16) return bfloat16::from(v).to_float();
  if (t == DType::f16) return float16::from(v).to_float();
  return v;
}

// Each thread stages a run of four consecutive elements of each operand's tile per k-tile, along
// the operand's contiguous dimension: along k for A stored [M, K] and B stored [N, K]
// (KContiguous) at (row = tid / 2, k = (tid % 2) * 4), else along the tile's rows (A stored
// [K, M], B stored [K, N]) at (k = tid / 32, row = (tid % 32) * 4). A warp then reads contiguous
// memory for either layout, one vector load per run where the run is whole and aligned.
static_assert(kBK == 8 && kBM == 128 && kBN == 128 && kGemmThreads == 256 && kLoads == 4,
              "run_coord covers a 128 x 8 tile with 256 runs of 4");
template <bool KContiguous>
__device__ __forceinline__ void run_coord(int tid, int& row, int& k) {
  if constexpr (KContiguous) {
    row = tid / 2;
    k = (tid % 2) * 4;
  } else {
    k = tid / 32;
    row = (tid % 32) * 4;
  }
}

__device__ __forceinline__ int clamp4(i64 x) { return static_cast<int>(x < 0 ? 0 : x > 4 ? 4 : x); }

// r[i] = element at + i of an operand stored as E, widened, for i < valid; `pad` for the rest.
// A whole run whose first element is aligned to the run's size is one 16-byte (f32) or 8-byte
// (bf16, f16) load; the values are the same either way.
template <class E>
__device__ __forceinline__ void load_run(const void* p, i64 at, int valid, float pad,
                                         float (&r)[4]) {
  if (valid == 4) {
    const E* q = static_cast<const E*>(p) + at;
    if ((reinterpret_cast<std::uintptr_t>(q) % (4 * sizeof(E))) == 0) {
      if constexpr (std::is_same_v<E, float>) {
        const float4 v = *reinterpret_cast<const float4*>(q);
        r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
      } else {  // little endian: element 0 in the low half of v.x
        const uint2 v = *reinterpret_cast<const uint2*>(q);
        r[0] = E{static_cast<std::uint16_t>(v.x & 0xffffu)}.to_float();
        r[1] = E{static_cast<std::uint16_t>(v.x >> 16)}.to_float();
        r[2] = E{static_cast<std::uint16_t>(v.y & 0xffffu)}.to_float();
        r[3] = E{static_cast<std::uint16_t>(v.y >> 16)}.to_float();
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) r[i] = i < valid ? widen<E>(p, at + i) : pad;
}

// Stage rows [k0, k1) of the block's A and B tiles into registers; outside the matrices or past
// k1, A reads -0.0f and B +0.0f (Note [CUDA canonical GEMM]). A and B hold E elements, widened
// to f32 as they are loaded.
template <bool TA, bool TB, class E>
__device__ __forceinline__ void load_tile(const GemmArgs& g, i64 m0, i64 n0, i64 k0, i64 k1,
                                          int tid, float (&ra)[kLoads], float (&rb)[kLoads]) {
  int m, ka, n, kb;
  run_coord<!TA>(tid, m, ka);
  run_coord<TB>(tid, n, kb);
  const i64 gm = m0 + m, gka = k0 + ka, gn = n0 + n, gkb = k0 + kb;
  if constexpr (!TA)  // A [M, K]: k contiguous
    load_run<E>(g.A, gm * g.lda + gka, gm < g.M ? clamp4(k1 - gka) : 0, -0.0f, ra);
  else  // A [K, M]: m contiguous
    load_run<E>(g.A, gka * g.lda + gm, gka < k1 ? clamp4(g.M - gm) : 0, -0.0f, ra);
  if constexpr (TB)  // B [N, K]: k contiguous
    load_run<E>(g.B, gn * g.ldb + gkb, gn < g.N ? clamp4(k1 - gkb) : 0, 0.0f, rb);
  else  // B [K, N]: n contiguous
    load_run<E>(g.B, gkb * g.ldb + gn, gkb < k1 ? clamp4(g.N - gn) : 0, 0.0f, rb);
}

template <bool TA, bool TB>
__device__ __forceinline__ void store_tile(float (*as)[kBM + kPad], float (*bs)[kBN + kPad],
                                           int tid, const float (&ra)[kLoads],
                                           const float (&rb)[kLoads]) {
  int m, ka, n, kb;
  run_coord<!TA>(tid, m, ka);
  run_coord<TB>(tid, n, kb);
  if constexpr (!TA) {
#pragma unroll
    for (int i = 0; i < 4; ++i) as[ka + i][m] = ra[i];
  } else {  // four consecutive m: one 16-byte store (rows of kBM + kPad floats stay aligned)
    *reinterpret_cast<float4*>(&as[ka][m]) = make_float4(ra[0], ra[1], ra[2], ra[3]);
  }
  if constexpr (TB) {
#pragma unroll
    for (int i = 0; i < 4; ++i) bs[kb + i][n] = rb[i];
  } else {
    *reinterpret_cast<float4*>(&bs[kb][n]) = make_float4(rb[0], rb[1], rb[2], rb[3]);
  }
}

// Thread (tx, ty) owns rows ty*4 + {0..3} and 64 + ty*4 + {0..3} of the block tile, and the
// same pattern of columns with tx: accumulator i*8 + j is (tile_row(i, ty), tile_row(j, tx)).
__device__ __forceinline__ int tile_row(int i, int t) { return (i < 4 ? 0 : 60) + t * 4 + i; }

// The kBK fma steps of one staged tile, k ascending.
__device__ __forceinline__ void compute_tile(const float (*as)[kBM + kPad],
                                             const float (*bs)[kBN + kPad], int tx, int ty,
                                             float (&acc)[64]) {
#pragma unroll
  for (int k = 0; k < kBK; ++k) {
    const float4 a0 = *reinterpret_cast<const float4*>(&as[k][ty * 4]);
    const float4 a1 = *reinterpret_cast<const float4*>(&as[k][64 + ty * 4]);
    const float4 b0 = *reinterpret_cast<const float4*>(&bs[k][tx * 4]);
    const float4 b1 = *reinterpret_cast<const float4*>(&bs[k][64 + tx * 4]);
    const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i * 8 + j] = cm::dot_step(a[i], b[j], acc[i * 8 + j]);
  }
}

__device__ __forceinline__ void zero(float (&acc)[64]) {
#pragma unroll
  for (int e = 0; e < 64; ++e) acc[e] = 0.0f;
}

// Plain (Sharded = false; bounds {0, K}, one shard): C = round_c(gemm_epilogue(chain, alpha,
// beta, C)), then with a bias C = round_c(C + bias[n]); A and B of type E.
// Sharded: C = round_c(out(C, canonical tree over the shards of their chains)), op(A) = A^T,
// op(B) = B, A and B of type E (gemm_tn_sharded: f32; gemm_tn_sharded_ex: f32, bf16 or f16).
template <bool TA, bool TB, bool Sharded, class E = float>
__global__ void __launch_bounds__(kGemmThreads, 2)
    gemm_kernel(const GemmArgs g, const __grid_constant__ ShardBounds bounds, const int shards,
                const int tiles_n) {
  __shared__ __align__(16) float as[2][kBK][kBM + kPad];
  __shared__ __align__(16) float bs[2][kBK][kBN + kPad];
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const i64 m0 = static_cast<i64>(blockIdx.x / tiles_n) * kBM;
  const i64 n0 = static_cast<i64>(blockIdx.x % tiles_n) * kBN;

  float acc[64];
  zero(acc);
  // Only the sharded kernel has a tree; a one-entry stack keeps the plain kernel's frame small.
  cm::TreeStack<64, Sharded ? kShardDepth : 1> tree;
  cm::ShardTiles<BoundsRef> cur(BoundsRef{bounds.b}, shards, kBK);
  if constexpr (Sharded) {
    for (int s = 0; s < cur.shard; ++s) {  // leading empty shards: +0.0f leaves
      tree.push(s, acc);
      zero(acc);
    }
  }
  if (!cur.done()) {
    float ra[kLoads], rb[kLoads];
    load_tile<TA, TB, E>(g, m0, n0, cur.k0, cur.k1, tid, ra, rb);
    store_tile<TA, TB>(as[0], bs[0], tid, ra, rb);
    __syncthreads();
    int buf = 0;
    for (;;) {
      const bool ends_shard = cur.last_of_shard();
      const int shard = cur.shard;
      cur.advance();  // now the next tile: prefetch it while computing this one
      if (!cur.done()) load_tile<TA, TB, E>(g, m0, n0, cur.k0, cur.k1, tid, ra, rb);
      compute_tile(as[buf], bs[buf], tx, ty, acc);
      if constexpr (Sharded) {
        if (ends_shard) {
          tree.push(shard, acc);
          zero(acc);
          for (int s = shard + 1; s < cur.shard; ++s) {  // empty shards up to the next tile
            tree.push(s, acc);
            zero(acc);
          }
        }
      }
      if (cur.done()) break;
      // The other buffer was last read before the previous barrier.
      store_tile<TA, TB>(as[buf ^ 1], bs[buf ^ 1], tid, ra, rb);
      __syncthreads();
      buf ^= 1;
    }
  }
  if constexpr (Sharded) tree.result(acc);

  const bool read_c = Sharded ? g.out == Out::accumulate : g.beta != 0.0f;
  if (g.c_type != DType::f32 || (!Sharded && g.bias)) {  // typed C or a bias: element by element
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const i64 gm = m0 + tile_row(i, ty);
      if (gm >= g.M) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const i64 gn = n0 + tile_row(j, tx);
        if (gn >= g.N) continue;
        const i64 at = gm * g.ldc + gn;
        const float cj = read_c ? load_c(g.C, g.c_type, at) : 0.0f;
        if constexpr (Sharded) {  // MixedOp's write_back: C + T in f32, rounded once
          store_c(g.C, g.c_type, at, finish(g.out, acc[i * 8 + j], cj, 1.0f));
        } else {
          float r = round_to(g.c_type, cm::gemm_epilogue(acc[i * 8 + j], g.alpha, g.beta, cj));
          if (g.bias) r = cm::add(r, load_c(g.bias, g.c_type, gn));  // add_bias_'s add
          store_c(g.C, g.c_type, at, r);
        }
      }
    }
    return;
  }
  float* const C = static_cast<float*>(g.C);
  const bool vec = ((reinterpret_cast<std::uintptr_t>(C) & 15u) == 0) && (g.ldc % 4 == 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const i64 gm = m0 + tile_row(i, ty);
    if (gm >= g.M) continue;
    float* crow = C + gm * g.ldc;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 gn = n0 + tile_row(h * 4, tx);
      const float* v = &acc[i * 8 + h * 4];
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (vec && gn + 3 < g.N) {
        if (read_c) {
          const float4 c4 = *reinterpret_cast<const float4*>(crow + gn);
          c[0] = c4.x, c[1] = c4.y, c[2] = c4.z, c[3] = c4.w;
        }
        float r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j)
          r[j] = Sharded ? finish(g.out, v[j], c[j], 1.0f)
                         : cm::gemm_epilogue(v[j], g.alpha, g.beta, c[j]);
        *reinterpret_cast<float4*>(crow + gn) = make_float4(r[0], r[1], r[2], r[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (gn + j >= g.N) break;
          const float cj = read_c ? crow[gn + j] : 0.0f;
          crow[gn + j] = Sharded ? finish(g.out, v[j], cj, 1.0f)
                                 : cm::gemm_epilogue(v[j], g.alpha, g.beta, cj);
        }
      }
    }
  }
}

// Sharded: only op(A) = A^T, op(B) = B is instantiated (trans_a, trans_b are ignored).
template <bool Sharded, class E = float>
void launch_gemm_kernel(const Launch& l, bool trans_a, bool trans_b, const GemmArgs& g,
                        const ShardBounds& sb, int shards) {
  const i64 tiles_m = (g.M + kBM - 1) / kBM;
  const i64 tiles_n = (g.N + kBN - 1) / kBN;
  DITTO_CHECK(tiles_m * tiles_n <= 0x7fffffff, l.where(), ": C of ", g.M, " x ", g.N,
              " needs more than 2^31 - 1 blocks of ", kBM, " x ", kBN);
  const auto blocks = static_cast<unsigned>(tiles_m * tiles_n);
  const int tn = static_cast<int>(tiles_n);
  cudaStream_t st = l.get();
  if constexpr (Sharded) {
    gemm_kernel<true, false, true, E><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_a && trans_b) {
    gemm_kernel<true, true, false, E><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_a) {
    gemm_kernel<true, false, false, E><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_b) {
    gemm_kernel<false, true, false, E><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else {
    gemm_kernel<false, false, false, E><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  }
  l.check();
}

}  // namespace

void launch_gemm(const Launch& l, bool trans_a, bool trans_b, const GemmArgs& g, i64 K,
                 DType ab_type) {
  ShardBounds sb{};
  sb.b[0] = 0;
  sb.b[1] = K;
  if (ab_type == DType::bf16)
    launch_gemm_kernel<false, bfloat16>(l, trans_a, trans_b, g, sb, 1);
  else if (ab_type == DType::f16)
    launch_gemm_kernel<false, float16>(l, trans_a, trans_b, g, sb, 1);
  else
    launch_gemm_kernel<false, float>(l, trans_a, trans_b, g, sb, 1);
}

void launch_gemm_sharded(const Launch& l, const GemmArgs& g, const ShardBounds& sb, int shards,
                         DType ab_type) {
  if (ab_type == DType::bf16)
    launch_gemm_kernel<true, bfloat16>(l, true, false, g, sb, shards);
  else if (ab_type == DType::f16)
    launch_gemm_kernel<true, float16>(l, true, false, g, sb, shards);
  else
    launch_gemm_kernel<true, float>(l, true, false, g, sb, shards);
}

namespace {

// d[r, c] = round_t(out(float(d), left + right)) for [rows, cols] d of dtype t (row stride ld)
// and contiguous f32 left / right: the root of gemm_tn_sharded_ex's tree past kShardCap shards.
__global__ void combine_typed_kernel(i64 rows, i64 cols, const float* left, const float* right,
                                     void* d, DType t, i64 ld, Out mode) {
  const i64 n = rows * cols;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 at = (i / cols) * ld + i % cols;
    const float sum = cm::add(left[i], right[i]);
    store_c(d, t, at, finish(mode, sum, mode == Out::accumulate ? load_c(d, t, at) : 0.0f, 1.0f));
  }
}

}  // namespace

void launch_combine_typed(const Launch& l, i64 rows, i64 cols, const float* left,
                          const float* right, void* d, DType t, i64 ld, Out mode) {
  combine_typed_kernel<<<blocks_for(rows * cols), kThreads, 0, l.get()>>>(rows, cols, left, right, d, t, ld, mode);
  l.check();
}

}  // namespace ditto::cuda::kern
