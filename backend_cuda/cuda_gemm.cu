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
// so a padded step changes no bit. The micro-sharded dW = dY^T X (gemm_tn_sharded) is the same
// kernel walking its shards' tiles in row order (canonical::ShardTiles), folding each shard's
// accumulators into a canonical::TreeStack (Note [Streaming canonical tree]) when its last tile
// is done; a launch takes at most kShardCap shards and the host recursion of the canonical tree
// (shard_tree) combines larger counts.
#include "backend_cuda/cuda_kernels_common.cuh"

namespace ditto::cuda::kern {
namespace {

// Element e of a thread's share of the A tile sits at (m, k) of op(A): chosen so that a warp's
// loads are contiguous in memory for either layout.
template <bool TA>
__device__ __forceinline__ void a_coord(int e, int& m, int& k) {
  if constexpr (TA) {  // A stored [K, M]: rows of m contiguous
    k = e / kBM;
    m = e % kBM;
  } else {  // A stored [M, K]: runs of k contiguous
    m = e / kBK;
    k = e % kBK;
  }
}

template <bool TB>
__device__ __forceinline__ void b_coord(int e, int& k, int& n) {
  if constexpr (TB) {  // B stored [N, K]
    n = e / kBK;
    k = e % kBK;
  } else {  // B stored [K, N]
    k = e / kBN;
    n = e % kBN;
  }
}

// Element e of a thread's loads: (m, k) in the A tile and (kb, n) in the B tile.
template <bool TA, bool TB>
__device__ __forceinline__ void tile_coords(int e, int& m, int& k, int& kb, int& n) {
  a_coord<TA>(e, m, k);
  b_coord<TB>(e, kb, n);
}

// Stage rows [k0, k1) of the block's A and B tiles into registers; outside the matrices or past
// k1, A reads -0.0f and B +0.0f (Note [CUDA canonical GEMM]).
template <bool TA, bool TB>
__device__ __forceinline__ void load_tile(const GemmArgs& g, i64 m0, i64 n0, i64 k0, i64 k1,
                                          int tid, float (&ra)[kLoads], float (&rb)[kLoads]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    int m, k, n, kb;
    tile_coords<TA, TB>(tid + l * kGemmThreads, m, k, kb, n);
    const i64 gm = m0 + m, gka = k0 + k, gn = n0 + n, gkb = k0 + kb;
    float a = -0.0f, b = 0.0f;
    if (gm < g.M && gka < k1) a = TA ? g.A[gka * g.lda + gm] : g.A[gm * g.lda + gka];
    if (gn < g.N && gkb < k1) b = TB ? g.B[gn * g.ldb + gkb] : g.B[gkb * g.ldb + gn];
    ra[l] = a;
    rb[l] = b;
  }
}

template <bool TA, bool TB>
__device__ __forceinline__ void store_tile(float (*as)[kBM + kPad], float (*bs)[kBN + kPad],
                                           int tid, const float (&ra)[kLoads],
                                           const float (&rb)[kLoads]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    int m, k, n, kb;
    tile_coords<TA, TB>(tid + l * kGemmThreads, m, k, kb, n);
    as[k][m] = ra[l];
    bs[kb][n] = rb[l];
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

// Plain (Sharded = false; bounds {0, K}, one shard): C = gemm_epilogue(chain, alpha, beta, C).
// Sharded: C = out(C, canonical tree over the shards of their chains), op(A) = A^T, op(B) = B.
template <bool TA, bool TB, bool Sharded>
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
    load_tile<TA, TB>(g, m0, n0, cur.k0, cur.k1, tid, ra, rb);
    store_tile<TA, TB>(as[0], bs[0], tid, ra, rb);
    __syncthreads();
    int buf = 0;
    for (;;) {
      const bool ends_shard = cur.last_of_shard();
      const int shard = cur.shard;
      cur.advance();  // now the next tile: prefetch it while computing this one
      if (!cur.done()) load_tile<TA, TB>(g, m0, n0, cur.k0, cur.k1, tid, ra, rb);
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
  const bool vec = ((reinterpret_cast<std::uintptr_t>(g.C) & 15u) == 0) && (g.ldc % 4 == 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const i64 gm = m0 + tile_row(i, ty);
    if (gm >= g.M) continue;
    float* crow = g.C + gm * g.ldc;
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
template <bool Sharded>
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
    gemm_kernel<true, false, true><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_a && trans_b) {
    gemm_kernel<true, true, false><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_a) {
    gemm_kernel<true, false, false><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else if (trans_b) {
    gemm_kernel<false, true, false><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  } else {
    gemm_kernel<false, false, false><<<blocks, kGemmThreads, 0, st>>>(g, sb, shards, tn);
  }
  l.check();
}

}  // namespace

void launch_gemm(const Launch& l, bool trans_a, bool trans_b, const GemmArgs& g, i64 K) {
  ShardBounds sb{};
  sb.b[0] = 0;
  sb.b[1] = K;
  launch_gemm_kernel<false>(l, trans_a, trans_b, g, sb, 1);
}

void launch_gemm_sharded(const Launch& l, const GemmArgs& g, const ShardBounds& sb, int shards) {
  launch_gemm_kernel<true>(l, true, false, g, sb, shards);
}

}  // namespace ditto::cuda::kern
