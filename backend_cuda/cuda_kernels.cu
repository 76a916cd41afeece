// The CUDA backend's kernels (ditto::Kernels): cuBLAS and simple kernels in fast mode, ditto's
// own kernels in bitwise mode and for the kernels with one fixed order (micro-sharded
// reductions, sum_inputs, losses, optimizers). Every call runs on the stream it is given (on the
// stream's GPU) and returns at once; launch errors throw BackendError naming the device.
//
// Bitwise kernels perform exactly the simulator's operations (backend_sim/sim_kernels.cpp,
// sim_gemm.cpp): their per-element arithmetic comes from the same DITTO_HD functions
// (core/numerics/canonical_math.h) and the order of their reductions from core/numerics/canonical_tree.h, which
// the host tests check against the simulator (tests/test_canonical_tree.cpp).
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
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_stream.h"
#include "core/numerics/canonical_math.h"
#include "core/numerics/canonical_tree.h"
#include "core/numerics/determinism.h"

namespace ditto::cuda {

namespace {

namespace cm = canonical;
using i64 = std::int64_t;

// ---- launch configuration ----------------------------------------------------------------------

constexpr int kThreads = 256;        // block size of the simple kernels
constexpr i64 kMaxBlocks = 16384;    // grid-stride kernels never launch more blocks than this

int blocks_for(i64 n, int threads = kThreads) {
  return static_cast<int>(std::clamp<i64>((n + threads - 1) / threads, 1, kMaxBlocks));
}

__device__ __forceinline__ i64 global_thread() {
  return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ i64 grid_threads() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// How a reduction's result T lands in its destination d.
enum class Out : int {
  store,       // d = T
  accumulate,  // d = d + T (one add)
  scale,       // d = scale * T
};

__device__ __forceinline__ float finish(Out out, float t, float d, float scale) {
  if (out == Out::accumulate) return cm::add(d, t);
  if (out == Out::scale) return cm::mul(scale, t);
  return t;
}

// ---- GEMM (Note [CUDA canonical GEMM]) -----------------------------------------------------------

constexpr int kBM = 128;            // rows of C per block
constexpr int kBN = 128;            // columns of C per block
constexpr int kBK = 8;              // rows of k per shared-memory tile
constexpr int kPad = 4;             // shared-memory row padding (no bank conflicts on stores)
constexpr int kGemmThreads = 256;   // 16 x 16 threads, 8 x 8 accumulators each
constexpr int kLoads = kBM * kBK / kGemmThreads;  // elements of A (and of B) each thread stages
constexpr int kShardCap = 64;       // shards per launch of the sharded kernels
constexpr int kShardDepth = cm::tree_stack_depth(kShardCap);
static_assert(kBM == kBN && kLoads == 4, "the tile loaders assume a square 128 x 128 x 8 tile");

// Row offsets of up to kShardCap shards (absolute rows of the operands), a kernel parameter.
struct ShardBounds {
  i64 b[kShardCap + 1];
};

// canonical::ShardTiles' view of ShardBounds in the parameter space (__grid_constant__).
struct BoundsRef {
  const i64* b;
  DITTO_HD i64 operator[](int i) const { return b[i]; }
};

struct GemmArgs {
  i64 M, N;
  const float* A;
  i64 lda;
  const float* B;
  i64 ldb;
  float* C;
  i64 ldc;
  float alpha, beta;  // plain GEMM: canonical::gemm_epilogue
  Out out;            // sharded GEMM: store or accumulate
};

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

// Stage rows [k0, k1) of the block's A and B tiles into registers; outside the matrices or past
// k1, A reads -0.0f and B +0.0f (Note [CUDA canonical GEMM]).
template <bool TA, bool TB>
__device__ __forceinline__ void load_tile(const GemmArgs& g, i64 m0, i64 n0, i64 k0, i64 k1,
                                          int tid, float (&ra)[kLoads], float (&rb)[kLoads]) {
#pragma unroll
  for (int l = 0; l < kLoads; ++l) {
    const int e = tid + l * kGemmThreads;
    int m, k, n, kb;
    a_coord<TA>(e, m, k);
    b_coord<TB>(e, kb, n);
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
    const int e = tid + l * kGemmThreads;
    int m, k, n, kb;
    a_coord<TA>(e, m, k);
    b_coord<TB>(e, kb, n);
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

// ---- elementwise kernels -------------------------------------------------------------------------

__global__ void fill_kernel(float* x, float value, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) x[i] = value;
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = cm::axpy(alpha, x[i], y[i]);
}

__global__ void scale_kernel(float alpha, float* x, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) x[i] = cm::mul(alpha, x[i]);
}

__global__ void relu_kernel(const float* x, float* y, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = cm::relu(x[i]);
}

__global__ void relu_backward_kernel(const float* y, const float* gy, float* gx, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) gx[i] = cm::relu_grad(y[i], gy[i]);
}

// Grid (x over columns, y over rows), both strided.
__global__ void add_bias_kernel(float* y, const float* bias, i64 rows, i64 cols) {
  for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
    float* yr = y + r * cols;
    for (i64 c = global_thread(); c < cols; c += grid_threads()) yr[c] = cm::add(yr[c], bias[c]);
  }
}

// ---- losses (one thread per sample, classes/columns ascending as in the simulator) -------------

__global__ void cross_entropy_kernel(const float* logits, const i64* targets, i64 rows,
                                     i64 classes, float* losses) {
  for (i64 r = global_thread(); r < rows; r += grid_threads()) {
    const float* x = logits + r * classes;
    const cm::SoftmaxStats st = cm::softmax_stats(x, classes);
    losses[r] = cm::cross_entropy_loss(st.max, st.sum, x[targets[r]]);
  }
}

__global__ void cross_entropy_backward_kernel(const float* logits, const i64* targets, i64 rows,
                                              i64 classes, const float* grad_loss, float scale,
                                              float* grad_logits) {
  const float factor = cm::mul(*grad_loss, scale);
  for (i64 r = global_thread(); r < rows; r += grid_threads()) {
    const float* x = logits + r * classes;
    float* g = grad_logits + r * classes;
    const cm::SoftmaxStats st = cm::softmax_stats(x, classes);
    const i64 t = targets[r];
    for (i64 c = 0; c < classes; ++c)
      g[c] = cm::cross_entropy_grad(factor, x[c], st.max, st.sum, c == t);
  }
}

__global__ void mse_kernel(const float* x, const float* t, i64 rows, i64 cols, float* losses) {
  for (i64 r = global_thread(); r < rows; r += grid_threads())
    losses[r] = cm::squared_error_sum(x + r * cols, t + r * cols, cols);
}

__global__ void mse_backward_kernel(const float* x, const float* t, i64 n, const float* grad_loss,
                                    float scale, float* gx) {
  const float factor = cm::mse_grad_factor(*grad_loss, scale);
  for (i64 i = global_thread(); i < n; i += grid_threads()) gx[i] = cm::mse_grad(factor, x[i], t[i]);
}

// ---- reductions ------------------------------------------------------------------------------

// Bitwise sum: one ascending chain from 0.0f (a single thread, as the simulator's loop).
__global__ void sum_bitwise_kernel(const float* x, i64 n, float scale, float* out) {
  float acc = 0.0f;
  for (i64 i = 0; i < n; ++i) acc = cm::sum_step(acc, x[i]);
  *out = cm::mul(scale, acc);
}

constexpr int kSumThreads = 1024;

// Fast sum: one block, strided partial sums, then a tree over the block (any order).
__global__ void __launch_bounds__(kSumThreads) sum_fast_kernel(const float* x, i64 n, float scale,
                                                               float* out) {
  __shared__ float warp_sums[kSumThreads / 32];
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (threadIdx.x == 0) *out = scale * acc;
  }
}

// Bitwise sum_rows: one thread per column, rows ascending from 0.0f.
__global__ void sum_rows_bitwise_kernel(const float* x, i64 rows, i64 cols, float beta,
                                        float* out) {
  for (i64 c = global_thread(); c < cols; c += grid_threads()) {
    float acc = 0.0f;
    for (i64 r = 0; r < rows; ++r) acc = cm::sum_step(acc, x[r * cols + c]);
    out[c] = beta == 0.0f ? acc : cm::gemm_epilogue(acc, 1.0f, beta, out[c]);
  }
}

constexpr int kRowGroups = 8;  // fast sum_rows: rows split over 8 threads per column

// Fast sum_rows: block (32, kRowGroups) over 32 columns; each thread sums every kRowGroups-th
// row, then the partials are added in shared memory.
__global__ void sum_rows_fast_kernel(const float* x, i64 rows, i64 cols, float beta, float* out) {
  __shared__ float part[kRowGroups][33];
  const i64 c = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (i64 r = threadIdx.y; r < rows; r += kRowGroups) acc += x[r * cols + c];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int g = 1; g < kRowGroups; ++g) acc += part[g][threadIdx.x];
    out[c] = beta == 0.0f ? acc : beta * out[c] + acc;
  }
}

// ---- canonical tree over inputs (sum_inputs) ---------------------------------------------------

constexpr int kInputCap = 8;  // inputs per launch; more go through the host recursion

template <int N>
struct Inputs {
  const float* p[N];
};

__host__ __device__ constexpr int fixed_tree_mid(int lo, int hi) {
  int p = 1;
  while (p * 2 < hi - lo) p *= 2;
  return lo + p;
}

__device__ __forceinline__ float add_v(float a, float b) { return cm::add(a, b); }
__device__ __forceinline__ float4 add_v(float4 a, float4 b) {
  return make_float4(cm::add(a.x, b.x), cm::add(a.y, b.y), cm::add(a.z, b.z), cm::add(a.w, b.w));
}

// Canonical tree over inputs [Lo, Hi) at element (or float4) i, unrolled at compile time.
template <int Lo, int Hi, class T, int N>
__device__ __forceinline__ T tree_at(const Inputs<N>& in, i64 i) {
  if constexpr (Hi - Lo == 1) {
    return reinterpret_cast<const T*>(in.p[Lo])[i];
  } else {
    constexpr int kMid = fixed_tree_mid(Lo, Hi);
    return add_v(tree_at<Lo, kMid, T>(in, i), tree_at<kMid, Hi, T>(in, i));
  }
}

// out[i] = canonical tree over the N inputs at i. out may alias in.p[0]: each thread reads all
// inputs of its elements before writing them. Vec: all pointers 16-byte aligned.
template <int N, bool Vec>
__global__ void sum_inputs_kernel(const Inputs<N> in, float* out, i64 numel) {
  i64 first_scalar = 0;
  if constexpr (Vec) {
    const i64 n4 = numel / 4;
    for (i64 i = global_thread(); i < n4; i += grid_threads())
      reinterpret_cast<float4*>(out)[i] = tree_at<0, N, float4>(in, i);
    first_scalar = n4 * 4;
  }
  for (i64 i = first_scalar + global_thread(); i < numel; i += grid_threads())
    out[i] = tree_at<0, N, float>(in, i);
}

// ---- micro-sharded reductions (bitwise; at most kShardCap shards per launch) -------------------

// One thread per column: ascending in-shard sums from 0.0f, canonical tree over the shards.
__global__ void sum_rows_sharded_kernel(const float* x, i64 cols,
                                        const __grid_constant__ ShardBounds bounds, int shards,
                                        float* out, Out mode, float scale) {
  for (i64 c = global_thread(); c < cols; c += grid_threads()) {
    cm::TreeStack<1, kShardDepth> tree;
    float v[1];
    for (int s = 0; s < shards; ++s) {
      float acc = 0.0f;
      for (i64 r = bounds.b[s]; r < bounds.b[s + 1]; ++r) acc = cm::sum_step(acc, x[r * cols + c]);
      v[0] = acc;
      tree.push(s, v);
    }
    tree.result(v);
    out[c] = finish(mode, v[0], mode == Out::accumulate ? out[c] : 0.0f, scale);
  }
}

// One block of kShardCap threads: thread s sums shard s ascending; thread 0 runs the tree.
__global__ void sum_sharded_kernel(const float* x, const __grid_constant__ ShardBounds bounds,
                                   int shards, float* out, Out mode, float scale) {
  __shared__ float leaf[kShardCap];
  const int s = static_cast<int>(threadIdx.x);
  if (s < shards) {
    float acc = 0.0f;
    for (i64 i = bounds.b[s]; i < bounds.b[s + 1]; ++i) acc = cm::sum_step(acc, x[i]);
    leaf[s] = acc;
  }
  __syncthreads();
  if (s == 0) {
    cm::TreeStack<1, kShardDepth> tree;
    float v[1];
    for (int l = 0; l < shards; ++l) {
      v[0] = leaf[l];
      tree.push(l, v);
    }
    tree.result(v);
    *out = finish(mode, v[0], mode == Out::accumulate ? *out : 0.0f, scale);
  }
}

// d[r, c] = out(d, left + right) for [rows, cols] d (row stride ld) and contiguous left/right:
// one node of the host-side canonical tree (shard_tree, sum_inputs_tree).
__global__ void combine_kernel(i64 rows, i64 cols, const float* left, const float* right,
                               float* d, i64 ld, Out mode, float scale) {
  const i64 n = rows * cols;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / cols, c = i % cols;
    float* di = d + r * ld + c;
    const float t = cm::add(left[i], right[i]);
    *di = finish(mode, t, mode == Out::accumulate ? *di : 0.0f, scale);
  }
}

// ---- optimizers ------------------------------------------------------------------------------

__global__ void sgd_kernel(float* param, const float* grad, float* momentum_buf, i64 n, float lr,
                           float momentum, float dampening, float weight_decay, bool nesterov,
                           bool first_step) {
  for (i64 i = global_thread(); i < n; i += grid_threads())
    cm::sgd_update(param[i], grad[i], momentum_buf ? momentum_buf + i : nullptr, lr, momentum,
                   dampening, weight_decay, nesterov, first_step);
}

__global__ void adam_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            float* max_exp_avg_sq, i64 n, const cm::AdamScalars k) {
  for (i64 i = global_thread(); i < n; i += grid_threads())
    cm::adam_update(param[i], grad[i], exp_avg[i], exp_avg_sq[i],
                    k.amsgrad ? max_exp_avg_sq + i : nullptr, k);
}

// ---- host side -------------------------------------------------------------------------------

// The stream a call runs on, with its GPU made current for the scope.
class Launch {
 public:
  Launch(Stream& s, const char* name)
      : stream_(as_cuda(s, name)), guard_(stream_.physical_device()), name_(name) {}

  cudaStream_t get() const { return stream_.get(); }
  /// "cuda:3 (GPU 0) gemm": how errors name the call.
  std::string where() const {
    return stream_.device().str() + " (GPU " + std::to_string(stream_.physical_device()) + ") " +
           name_;
  }
  /// Throws BackendError when the last launch failed.
  void check() const { DITTO_CUDA_CHECK(cudaGetLastError(), where()); }

 private:
  CudaStream& stream_;
  DeviceGuard guard_;
  const char* name_;
};

// Stream-ordered scratch memory (cudaMallocAsync / cudaFreeAsync on the launch's stream), for
// the intermediate nodes of the host-side trees. Devices without memory pools fall back to
// cudaMalloc and a synchronised cudaFree.
class DeviceTemp {
 public:
  DeviceTemp(const Launch& l, i64 floats) : stream_(l.get()) {
    const std::size_t bytes = static_cast<std::size_t>(std::max<i64>(floats, 1)) * sizeof(float);
    cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&ptr_), bytes, stream_);
    if (err == cudaErrorNotSupported) {
      (void)cudaGetLastError();
      pooled_ = false;
      err = cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes);
    }
    DITTO_CUDA_CHECK(err, l.where() + " scratch");
  }
  ~DeviceTemp() {
    if (pooled_) {
      (void)cudaFreeAsync(ptr_, stream_);
    } else {
      (void)cudaStreamSynchronize(stream_);
      (void)cudaFree(ptr_);
    }
  }
  DeviceTemp(const DeviceTemp&) = delete;
  DeviceTemp& operator=(const DeviceTemp&) = delete;
  float* get() const { return ptr_; }

 private:
  cudaStream_t stream_;
  float* ptr_ = nullptr;
  bool pooled_ = true;
};

ShardBounds shard_bounds(const std::vector<i64>& bounds, i64 lo, i64 hi) {
  ShardBounds sb{};
  for (i64 i = lo; i <= hi; ++i) sb.b[i - lo] = bounds[static_cast<std::size_t>(i)];
  return sb;
}

// The canonical tree over shards [lo, hi) of `bounds` into the [rows, cols] destination d (row
// stride ld), finished with `mode`: one launch (leaf(lo, hi, d, ld, mode, scale)) for at most
// kShardCap shards, else the split of Note [Canonical tree] with both halves in scratch memory
// and one combine_kernel.
template <class Leaf>
void shard_tree(const Launch& l, i64 lo, i64 hi, i64 rows, i64 cols, float* d, i64 ld, Out mode,
                float scale, const Leaf& leaf) {
  if (hi - lo <= kShardCap) {
    leaf(lo, hi, d, ld, mode, scale);
    return;
  }
  const i64 mid = tree_mid(lo, hi);
  DeviceTemp left(l, rows * cols), right(l, rows * cols);
  shard_tree(l, lo, mid, rows, cols, left.get(), cols, Out::store, 1.0f, leaf);
  shard_tree(l, mid, hi, rows, cols, right.get(), cols, Out::store, 1.0f, leaf);
  combine_kernel<<<blocks_for(rows * cols), kThreads, 0, l.get()>>>(
      rows, cols, left.get(), right.get(), d, ld, mode, scale);
  l.check();
}

template <int N>
void launch_sum_inputs(const Launch& l, const float* const* inputs, float* out, i64 numel) {
  Inputs<N> in{};
  bool aligned = (reinterpret_cast<std::uintptr_t>(out) & 15u) == 0;
  for (int k = 0; k < N; ++k) {
    in.p[k] = inputs[k];
    aligned = aligned && (reinterpret_cast<std::uintptr_t>(inputs[k]) & 15u) == 0;
  }
  if (aligned && numel >= 4)
    sum_inputs_kernel<N, true><<<blocks_for(numel / 4), kThreads, 0, l.get()>>>(in, out, numel);
  else
    sum_inputs_kernel<N, false><<<blocks_for(numel), kThreads, 0, l.get()>>>(in, out, numel);
  l.check();
}

// out = canonical tree over inputs [0, n), n >= 1, by launches over at most kInputCap inputs.
// The left subtree goes straight to out: only the leftmost launch reads inputs[0], which out may
// alias, and it reads each element before writing it.
void sum_inputs_tree(const Launch& l, const float* const* inputs, int n, float* out, i64 numel) {
  switch (n) {
    case 1: return launch_sum_inputs<1>(l, inputs, out, numel);
    case 2: return launch_sum_inputs<2>(l, inputs, out, numel);
    case 3: return launch_sum_inputs<3>(l, inputs, out, numel);
    case 4: return launch_sum_inputs<4>(l, inputs, out, numel);
    case 5: return launch_sum_inputs<5>(l, inputs, out, numel);
    case 6: return launch_sum_inputs<6>(l, inputs, out, numel);
    case 7: return launch_sum_inputs<7>(l, inputs, out, numel);
    case 8: return launch_sum_inputs<8>(l, inputs, out, numel);
    default: break;
  }
  static_assert(kInputCap == 8, "sum_inputs_tree dispatches 1..8 inputs per launch");
  const int mid = static_cast<int>(tree_mid(0, n));
  sum_inputs_tree(l, inputs, mid, out, numel);
  DeviceTemp right(l, numel);
  sum_inputs_tree(l, inputs + mid, n - mid, right.get(), numel);
  const float* pair[2] = {out, right.get()};
  launch_sum_inputs<2>(l, pair, out, numel);
}

class CudaKernels final : public Kernels {
 public:
  explicit CudaKernels(CudaBackend& backend) : backend_(backend) {}

  void gemm(Stream& s, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha,
            const float* A, i64 lda, const float* B, i64 ldb, float beta, float* C, i64 ldc,
            Determinism mode) override {
    if (M <= 0 || N <= 0) return;
    Launch l(s, "gemm");
    // cuBLAS (column-major) computes C^T = op(B)^T op(A)^T: a row-major [r, c] matrix with row
    // stride ld is the column-major [c, r] with leading dimension ld.
    const bool cublas_ok = mode == Determinism::fast && K > 0 &&
                           lda >= std::max<i64>(1, trans_a ? M : K) &&
                           ldb >= std::max<i64>(1, trans_b ? K : N) && ldc >= std::max<i64>(1, N);
    if (cublas_ok) {
      cublasHandle_t h = backend_.cublas(s.device().index);
      DITTO_CUBLAS_CHECK(cublasSetStream(h, l.get()), l.where());
      DITTO_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST), l.where());
      DITTO_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), l.where());  // no TF32
      DITTO_CUBLAS_CHECK(
          cublasSgemm_64(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
          l.where());
      return;
    }
    GemmArgs g{M, N, A, lda, B, ldb, C, ldc, alpha, beta, Out::store};
    ShardBounds sb{};
    sb.b[0] = 0;
    sb.b[1] = K;
    launch_gemm<false>(l, trans_a, trans_b, g, sb, 1);
  }

  void add_bias(Stream& s, float* y, const float* bias, i64 rows, i64 cols) override {
    if (rows <= 0 || cols <= 0) return;
    Launch l(s, "add_bias");
    const int bx = std::min(blocks_for(cols), 64);
    const auto by = static_cast<unsigned>(std::min<i64>(rows, std::max<i64>(1, kMaxBlocks / bx)));
    add_bias_kernel<<<dim3(static_cast<unsigned>(bx), by), kThreads, 0, l.get()>>>(y, bias, rows,
                                                                                   cols);
    l.check();
  }

  void sum_rows(Stream& s, const float* x, i64 rows, i64 cols, float beta, float* out,
                Determinism mode) override {
    if (cols <= 0) return;
    Launch l(s, "sum_rows");
    if (mode == Determinism::bitwise) {
      sum_rows_bitwise_kernel<<<blocks_for(cols), kThreads, 0, l.get()>>>(x, rows, cols, beta, out);
    } else {
      const auto blocks = static_cast<unsigned>((cols + 31) / 32);
      sum_rows_fast_kernel<<<blocks, dim3(32, kRowGroups), 0, l.get()>>>(x, rows, cols, beta, out);
    }
    l.check();
  }

  void relu(Stream& s, const float* x, float* y, i64 n) override {
    if (n <= 0) return;
    Launch l(s, "relu");
    relu_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, y, n);
    l.check();
  }

  void relu_backward(Stream& s, const float* y, const float* gy, float* gx, i64 n) override {
    if (n <= 0) return;
    Launch l(s, "relu_backward");
    relu_backward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(y, gy, gx, n);
    l.check();
  }

  void cross_entropy(Stream& s, const float* logits, const i64* targets, i64 rows, i64 classes,
                     float* losses) override {
    if (rows <= 0) return;
    Launch l(s, "cross_entropy");
    cross_entropy_kernel<<<blocks_for(rows, 128), 128, 0, l.get()>>>(logits, targets, rows,
                                                                      classes, losses);
    l.check();
  }

  void cross_entropy_backward(Stream& s, const float* logits, const i64* targets, i64 rows,
                              i64 classes, const float* grad_loss, float scale,
                              float* grad_logits) override {
    if (rows <= 0 || classes <= 0) return;
    Launch l(s, "cross_entropy_backward");
    cross_entropy_backward_kernel<<<blocks_for(rows, 128), 128, 0, l.get()>>>(
        logits, targets, rows, classes, grad_loss, scale, grad_logits);
    l.check();
  }

  void mse(Stream& s, const float* x, const float* t, i64 rows, i64 cols, float* losses) override {
    if (rows <= 0) return;
    Launch l(s, "mse");
    mse_kernel<<<blocks_for(rows, 128), 128, 0, l.get()>>>(x, t, rows, cols, losses);
    l.check();
  }

  void mse_backward(Stream& s, const float* x, const float* t, i64 n, const float* grad_loss,
                    float scale, float* gx) override {
    if (n <= 0) return;
    Launch l(s, "mse_backward");
    mse_backward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, t, n, grad_loss, scale, gx);
    l.check();
  }

  void sum(Stream& s, const float* x, i64 n, float scale, float* out, Determinism mode) override {
    Launch l(s, "sum");
    if (mode == Determinism::bitwise)
      sum_bitwise_kernel<<<1, 1, 0, l.get()>>>(x, std::max<i64>(n, 0), scale, out);
    else
      sum_fast_kernel<<<1, kSumThreads, 0, l.get()>>>(x, std::max<i64>(n, 0), scale, out);
    l.check();
  }

  void fill_f32(Stream& s, float* x, float value, i64 n) override {
    if (n <= 0) return;
    Launch l(s, "fill_f32");
    fill_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, value, n);
    l.check();
  }

  void axpy(Stream& s, float alpha, const float* x, float* y, i64 n) override {
    if (n <= 0) return;
    Launch l(s, "axpy");
    axpy_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(alpha, x, y, n);
    l.check();
  }

  void scale(Stream& s, float alpha, float* x, i64 n) override {
    if (n <= 0) return;
    Launch l(s, "scale");
    scale_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(alpha, x, n);
    l.check();
  }

  // Both modes use the canonical tree: it is memory-bound, so the fixed order costs nothing.
  void sum_inputs(Stream& s, const float* const* inputs, int n_inputs, float* out, i64 numel,
                  Determinism /*mode*/) override {
    if (numel <= 0) return;
    Launch l(s, "sum_inputs");
    if (n_inputs <= 0) {
      fill_kernel<<<blocks_for(numel), kThreads, 0, l.get()>>>(out, 0.0f, numel);
      l.check();
      return;
    }
    sum_inputs_tree(l, inputs, n_inputs, out, numel);
  }

  void sgd_step(Stream& s, float* param, const float* grad, float* momentum_buf, i64 n, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    if (n <= 0) return;
    Launch l(s, "sgd_step");
    sgd_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(param, grad, momentum_buf, n, lr, momentum,
                                                        dampening, weight_decay, nesterov,
                                                        first_step);
    l.check();
  }

  void gemm_tn_sharded(Stream& s, i64 M, i64 N, const float* A, i64 lda, const float* B, i64 ldb,
                       const std::vector<i64>& bounds, float* C, i64 ldc,
                       bool accumulate) override {
    if (M <= 0 || N <= 0) return;
    Launch l(s, "gemm_tn_sharded");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 ld, Out mode, float /*scale*/) {
      const GemmArgs g{M, N, A, lda, B, ldb, d, ld, 1.0f, 0.0f, mode};
      launch_gemm<true>(l, true, false, g, shard_bounds(bounds, lo, hi),
                        static_cast<int>(hi - lo));
    };
    shard_tree(l, 0, shards, M, N, C, ldc, accumulate ? Out::accumulate : Out::store, 1.0f, leaf);
  }

  void sum_rows_sharded(Stream& s, const float* x, i64 /*rows*/, i64 cols,
                        const std::vector<i64>& bounds, float* out, bool accumulate) override {
    if (cols <= 0) return;
    Launch l(s, "sum_rows_sharded");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 /*ld*/, Out mode, float scale) {
      sum_rows_sharded_kernel<<<blocks_for(cols), kThreads, 0, l.get()>>>(
          x, cols, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo), d, mode, scale);
      l.check();
    };
    shard_tree(l, 0, shards, 1, cols, out, cols, accumulate ? Out::accumulate : Out::store, 1.0f,
               leaf);
  }

  void sum_sharded(Stream& s, const float* x, const std::vector<i64>& bounds, float scale,
                   float* out) override {
    Launch l(s, "sum_sharded");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 /*ld*/, Out mode, float sc) {
      sum_sharded_kernel<<<1, kShardCap, 0, l.get()>>>(x, shard_bounds(bounds, lo, hi),
                                                       static_cast<int>(hi - lo), d, mode, sc);
      l.check();
    };
    shard_tree(l, 0, shards, 1, 1, out, 1, Out::scale, scale, leaf);
  }

  void adam_step(Stream& s, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, i64 n, double lr, double beta1, double beta2, double eps,
                 double weight_decay, double bias_correction1, double bias_correction2,
                 bool amsgrad) override {
    if (n <= 0) return;
    Launch l(s, "adam_step");
    const cm::AdamScalars k = cm::adam_scalars(lr, beta1, beta2, eps, weight_decay,
                                               bias_correction1, bias_correction2, amsgrad);
    adam_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(param, grad, exp_avg, exp_avg_sq,
                                                         max_exp_avg_sq, n, k);
    l.check();
  }

 private:
  // Sharded: only op(A) = A^T, op(B) = B is instantiated (trans_a, trans_b are ignored).
  template <bool Sharded>
  static void launch_gemm(const Launch& l, bool trans_a, bool trans_b, const GemmArgs& g,
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

  CudaBackend& backend_;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(CudaBackend& backend) {
  return std::make_unique<CudaKernels>(backend);
}

}  // namespace ditto::cuda
