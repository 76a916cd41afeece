// The CUDA backend's row and element kernels of the GPT step besides GEMMs and attention
// (CudaGptKernels, cuda_kernels_common.cuh): the embedding forward and backward, LayerNorm
// forward and backward, GELU and the softmax cross-entropy, on f32 and (the typed row kernels,
// Kernels::*_ex) on bf16 / f16 storage; the optimizer's multi-tensor kernels
// (AdamW, the gradient norm's sums of squares, the clip's scaling) are in cuda_multi_tensor.cu,
// whose cutting of the work this Note describes too (`*_multi`). Every chain keeps the operation
// order of core/numerics/gpt_math.h and canonical_math.h, so the results equal backend_sim's bit
// for bit; ctest CudaEmu.Kernels runs them on the CPU against the simulator
// (tools/cuda_emu/test_emu_gpt.cpp, test_emu_fused.cpp, test_emu_rows.cpp).
//
// Note [CUDA fused kernels]
// Parallelism is over independent chains and over the columns of a row, with coalesced loads:
//   embedding_forward   one thread per 16 bytes of a token row (4 f32 or 8 bf16 / f16 columns,
//                       one vector access, when C is a multiple of that and the rows are 16-byte
//                       aligned), else per element.
//   embedding_backward  the token ids are bucketed once per call, on the device: a histogram
//                       (integer atomics, exact), an exclusive scan over the vocabulary, a
//                       scatter into buckets (atomics: any order within a bucket), then each
//                       bucket sorted by row (a block per bucket, each row's rank counted
//                       through shared-memory tiles; rows are distinct, so the result is the
//                       one ascending order, whatever the scatter did). Then a block per
//                       vocabulary row v, threads over its columns (4 per thread, float4, when
//                       aligned): each walks v's rows ascending, one chain per shard, shards
//                       pushed in order into a canonical::TreeStack (+0 for a shard without v:
//                       exact, Note [GPT kernels]); a v absent from the batch gives +0 without a
//                       walk. Work O(N C + V C) per step where the scan per (v, c) was
//                       O(V C N); at most kShardCap shards per launch (shard_tree above that).
//                       Typed (embedding_backward_ex): dy bf16 / f16 widened as loaded (4
//                       columns in one 8-byte access), grad_wte f32 (bitwise mode's gradients)
//                       or the storage dtype, each element rounded once (after the add with
//                       accumulate; past kShardCap shards only the root rounds): MixedOp's bits
//                       without its f32 copies of dy and grad_wte.
//   layernorm_*         a warp per row: the lanes stage a chunk of the row (coalesced) in
//                       shared memory and lane 0 runs the chain over it (the sums of Note [GPT
//                       kernels] are sequential chains: they are not split); the elementwise
//                       parts run on all lanes. Both modes (LayerNorm has one fixed order).
//                       layernorm_backward_add (f32, bf16, f16) is the backward kernel given the
//                       residual gradient (nn::Block): each dx element rounded into E, widened,
//                       added to the residual's element and rounded once as it is stored, the
//                       bits of the kernel and then ops::add, without dx's [N, C] tensor (its
//                       write and re-read) or the add's launch. No extra instantiation (a
//                       run-time null pointer without it). Fast mode's
//                       layernorm_backward_params (f32, bf16, f16) is a block per chunk of
//                       rows instead, with the weight and bias gradients in the same launch
//                       (Note [CUDA LayerNorm parameter gradients]). layernorm_forward_add (f32,
//                       bf16, f16) is the forward kernel given the residual branch (the GPT forward's
//                       x + branch before ln_2, the next block's ln_1 or ln_f; llm.c's
//                       fused_residual_forward): the mean's pass adds each element in f32,
//                       rounds it once into E and stores it (the residual stream, ops::add's
//                       bits), and the other passes read the row back from that store: the bits
//                       of ops::add and then the forward kernel, one launch, no extra
//                       instantiation.
//   cross_entropy_fused a block per row, fast mode only (Note [CUDA fused cross-entropy]): the
//                       loss and the logits' gradient written over them in one pass (f32, bf16,
//                       f16; 3 instantiations).
//   gelu_*              16 bytes per thread (4 f32, 8 bf16 / f16) where aligned, a scalar tail.
//                       gelu_epilogue (gemm_ex's GELU epilogues where cuBLASLt does not take
//                       them: launch_gelu_epilogue) a thread per element of a strided [M, N],
//                       the same element functions; f32, bf16, f16 (6 instantiations).
//   typed (*_ex)        embedding_forward(_backward), layernorm_*, gelu_*,
//                       cross_entropy(_backward) and dropout_* (cuda_kernels_gpt.cu) on bf16 /
//                       f16 (Note [Mixed precision]):
//                       the same kernels, templated over the element type E (float for the f32
//                       entries), each element widened to f32 as it is loaded (ld_elem, ld_vec:
//                       exact), the same f32 chains (LayerNorm and the cross-entropy stage f32 in
//                       shared memory as before), each output rounded once as it is stored
//                       (st_elem, st_vec: round to nearest even). Widening is exact and MixedOp
//                       rounds each output once too, so the results are the simulator's MixedOp
//                       bits in both modes, without its f32 scratch, its casts or their launches,
//                       at half the bytes of an f32 kernel. E in {float, bfloat16, float16}: 26
//                       kernel instantiations more than f32 alone (small ones; ptxas time; the
//                       embedding gradient's 4 of them).
//   *_multi             (cuda_multi_tensor.cu) the tensors of one call in a __grid_constant__
//                       table of up to kMultiCap entries (fill_multi: kFillCap, 1024; more: one
//                       launch per table), elements cut into
//                       chunks of kMultiChunk, a block per chunk (binary search of the chunk's
//                       tensor in the table's prefix). sum_squares_multi: bitwise, a thread per
//                       kSquaresBlock leaf of every tensor, then a thread per tensor folds its
//                       leaves with the canonical tree (2 launches for all tensors); fast, a
//                       block per chunk (any order), then each tensor's chunk partials in order.
//                       Typed (adam_step_multi_ex, sum_squares_multi_ex; Note [Typed optimizer
//                       step], core/optim/master_weights.h): each tensor's gradient dtype in its
//                       table entry, widened as loaded (ld_elem, a run-time dtype: no extra
//                       instantiations); AdamW writes the model's weight (st_elem) in its pass;
//                       the f32 calls are these with f32 gradients.
#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/gpt_math.h"

namespace ditto::cuda::kern {

namespace {

using u64 = unsigned long long;

// True when p is 16-byte aligned (float4 loads and stores).
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }
// True when p is a multiple of `bytes` (a power of two).
inline bool aligned_to(const void* p, std::size_t bytes) {
  return (reinterpret_cast<std::uintptr_t>(p) & (bytes - 1)) == 0;
}

// v rounded once into E and widened back (exact): the value a stored E element reloads as.
template <class E>
__device__ __forceinline__ float rounded(float v) {
  if constexpr (std::is_same_v<E, float>)
    return v;
  else
    return E::from(v).to_float();
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

// ---- embedding forward -------------------------------------------------------------------------

// E: the storage type of wte, wpe and out (float, bfloat16, float16), widened as loaded, each
// output rounded once. Vec: element group i is columns [W (i % (C/W)), +W) of token row i / (C/W),
// W = kVec<E> (one 16-byte access: C % W == 0, all rows 16-byte aligned); else one element.
template <class E, bool Vec>
__global__ void embedding_forward_kernel(const i64* idx, const E* wte, const E* wpe, i64 N, i64 T,
                                         i64 C, E* out) {
  constexpr int W = Vec ? kVec<E> : 1;
  const i64 groups = C / W, n = N * groups;
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const i64 r = i / groups, c = (i % groups) * W;
    const E* e = wte + idx[r] * C + c;
    E* o = out + r * C + c;
    float a[W];
    if constexpr (Vec)
      ld_vec(e, a);
    else
      a[0] = ld_elem(e, 0);
    if (wpe != nullptr) {
      const E* q = wpe + (r % T) * C + c;
      float p[W];
      if constexpr (Vec)
        ld_vec(q, p);
      else
        p[0] = ld_elem(q, 0);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = cm::add(a[k], p[k]);
    }
    if constexpr (Vec)
      st_vec(o, a);
    else
      st_elem(o, 0, a[0]);
  }
}

// ---- embedding backward: bucketing the token ids -----------------------------------------------

constexpr int kScanThreads = 1024;  // one block scans the vocabulary
constexpr int kSortThreads = 128;   // a block per bucket
constexpr int kSortTile = 1024;     // rows of a bucket per shared-memory tile

__global__ void zero_u64_kernel(u64* x, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) x[i] = 0;
}

__global__ void id_histogram_kernel(const i64* idx, i64 N, u64* count) {
  for (i64 r = global_thread(); r < N; r += grid_threads())
    atomicAdd(count + idx[r], static_cast<u64>(1));
}

// start[v] = sum of count[u] over u < v for v <= V (start[V] = N), cursor[v] = start[v] (v < V).
// One block of kScanThreads threads, each a contiguous run of the vocabulary.
__global__ void __launch_bounds__(kScanThreads) id_scan_kernel(const u64* count, i64 V, i64* start,
                                                               u64* cursor) {
  __shared__ i64 part[kScanThreads];
  const i64 seg = (V + kScanThreads - 1) / kScanThreads;
  const i64 lo = threadIdx.x * seg < V ? threadIdx.x * seg : V;
  const i64 hi = lo + seg < V ? lo + seg : V;
  i64 sum = 0;
  for (i64 v = lo; v < hi; ++v) sum += static_cast<i64>(count[v]);
  part[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    i64 run = 0;
    for (int t = 0; t < kScanThreads; ++t) {
      const i64 p = part[t];
      part[t] = run;
      run += p;
    }
    start[V] = run;
  }
  __syncthreads();
  i64 run = part[threadIdx.x];
  for (i64 v = lo; v < hi; ++v) {
    start[v] = run;
    cursor[v] = static_cast<u64>(run);
    run += static_cast<i64>(count[v]);
  }
}

// bucket[start[idx[r]] ..] receives r, in any order within a bucket.
__global__ void id_scatter_kernel(const i64* idx, i64 N, u64* cursor, i64* bucket) {
  for (i64 r = global_thread(); r < N; r += grid_threads())
    bucket[atomicAdd(cursor + idx[r], static_cast<u64>(1))] = r;
}

// rows[start[v] + rank] = bucket[start[v] + i], rank = the number of the bucket's rows below it:
// each bucket ascending. A block per bucket (block-uniform loops around every barrier).
__global__ void __launch_bounds__(kSortThreads) id_bucket_sort_kernel(const i64* start, i64 V,
                                                                      const i64* bucket,
                                                                      i64* rows) {
  __shared__ i64 tile[kSortTile];
  for (i64 v = blockIdx.x; v < V; v += gridDim.x) {
    const i64 s0 = start[v], k = start[v + 1] - s0;
    if (k <= 1) {
      if (k == 1 && threadIdx.x == 0) rows[s0] = bucket[s0];
      continue;
    }
    for (i64 base = 0; base < k; base += blockDim.x) {
      const i64 i = base + threadIdx.x;
      const i64 x = i < k ? bucket[s0 + i] : 0;
      i64 rank = 0;
      for (i64 t0 = 0; t0 < k; t0 += kSortTile) {
        const i64 m = k - t0 < kSortTile ? k - t0 : kSortTile;
        __syncthreads();  // the previous tile's readers are done
        for (i64 j = threadIdx.x; j < m; j += blockDim.x) tile[j] = bucket[s0 + t0 + j];
        __syncthreads();
        if (i < k)
          for (i64 j = 0; j < m; ++j) rank += tile[j] < x ? 1 : 0;
      }
      if (i < k) rows[s0 + rank] = x;
    }
    __syncthreads();  // tile reused by the next bucket
  }
}

// First position in the ascending rows[first, last) with rows[p] >= key.
__device__ __forceinline__ i64 lower_bound_rows(const i64* rows, i64 first, i64 last, i64 key) {
  while (first < last) {
    const i64 mid = first + (last - first) / 2;
    if (rows[mid] < key)
      first = mid + 1;
    else
      last = mid;
  }
  return first;
}

// r = the W consecutive elements at p, stored as E, widened (W = 4: one aligned access, 16
// bytes of f32 or 8 of bf16 / f16; W = 1: one element).
template <int W, class E>
__device__ __forceinline__ void load_cols(const E* p, float (&r)[W]) {
  if constexpr (W == 4 && std::is_same_v<E, float>) {
    const float4 q = load4(p);
    r[0] = q.x, r[1] = q.y, r[2] = q.z, r[3] = q.w;
  } else if constexpr (W == 4) {
    const uint2 q = *reinterpret_cast<const uint2*>(p);
    r[0] = E{static_cast<std::uint16_t>(q.x & 0xffffu)}.to_float();
    r[1] = E{static_cast<std::uint16_t>(q.x >> 16)}.to_float();
    r[2] = E{static_cast<std::uint16_t>(q.y & 0xffffu)}.to_float();
    r[3] = E{static_cast<std::uint16_t>(q.y >> 16)}.to_float();
  } else {
    r[0] = ld_elem(p, 0);
  }
}

// The W elements at p = r, each rounded once into E (the same accesses as load_cols).
template <int W, class E>
__device__ __forceinline__ void store_cols(E* p, const float (&r)[W]) {
  if constexpr (W == 4 && std::is_same_v<E, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
  } else if constexpr (W == 4) {
    uint2 q;
    q.x = static_cast<unsigned>(E::from(r[0]).bits) | (static_cast<unsigned>(E::from(r[1]).bits) << 16);
    q.y = static_cast<unsigned>(E::from(r[2]).bits) | (static_cast<unsigned>(E::from(r[3]).bits) << 16);
    *reinterpret_cast<uint2*>(p) = q;
  } else {
    st_elem(p, 0, r[0]);
  }
}

// load_cols / store_cols at element `at` of a buffer whose dtype t (f32, bf16, f16) is known at
// run time (the gradient: f32, or the storage dtype of embedding_backward_ex's grad_wte).
template <int W>
__device__ __forceinline__ void load_cols(const void* p, DType t, i64 at, float (&r)[W]) {
  if (t == DType::bf16)
    load_cols<W>(static_cast<const bfloat16*>(p) + at, r);
  else if (t == DType::f16)
    load_cols<W>(static_cast<const float16*>(p) + at, r);
  else
    load_cols<W>(static_cast<const float*>(p) + at, r);
}
template <int W>
__device__ __forceinline__ void store_cols(void* p, DType t, i64 at, const float (&r)[W]) {
  if (t == DType::bf16)
    store_cols<W>(static_cast<bfloat16*>(p) + at, r);
  else if (t == DType::f16)
    store_cols<W>(static_cast<float16*>(p) + at, r);
  else
    store_cols<W>(static_cast<float*>(p) + at, r);
}

// d[v, c] = out(d, G[v, c]) for all V rows and the shards of `bounds`, d of dtype dt (f32; or
// bf16 / f16, each element rounded once): a block per vocabulary row v, each thread W
// consecutive columns (W = 4: one vector access, C % 4 == 0, dy, d and ld aligned). dy is
// stored as E (float, bfloat16, float16), widened as loaded. G = canonical tree over the shards
// of each shard's chain add over v's rows in it, ascending (in f32).
template <int W, class E>
__global__ void embedding_grad_kernel(const i64* start, const i64* rows, const E* dy, i64 C,
                                      i64 V, const __grid_constant__ ShardBounds bounds,
                                      int shards, void* d, DType dt, i64 ld, Out mode) {
  const i64 groups = C / W;
  for (i64 v = blockIdx.x; v < V; v += gridDim.x) {
    const i64 first = lower_bound_rows(rows, start[v], start[v + 1], bounds.b[0]);
    const i64 last = lower_bound_rows(rows, first, start[v + 1], bounds.b[shards]);
    for (i64 g = threadIdx.x; g < groups; g += blockDim.x) {
      const i64 c = g * W;
      float x[W];
      for (int e = 0; e < W; ++e) x[e] = 0.0f;
      if (first < last) {  // else G = +0: the tree over +0 leaves
        cm::TreeStack<W, kShardDepth> tree;
        i64 p = first;
        for (int s = 0; s < shards; ++s) {
          float acc[W];
          for (int e = 0; e < W; ++e) acc[e] = 0.0f;
          for (const i64 end = bounds.b[s + 1]; p < last && rows[p] < end; ++p) {
            float q[W];
            load_cols<W>(dy + rows[p] * C + c, q);
            for (int e = 0; e < W; ++e) acc[e] = cm::add(acc[e], q[e]);
          }
          tree.push(s, acc);
        }
        tree.result(x);
      }
      const i64 at = v * ld + c;
      float prev[W];
      if (mode == Out::accumulate)
        load_cols<W>(d, dt, at, prev);
      else
        for (int e = 0; e < W; ++e) prev[e] = 0.0f;
      for (int e = 0; e < W; ++e) x[e] = finish(mode, x[e], prev[e], 1.0f);
      store_cols<W>(d, dt, at, x);
    }
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------------
// E: the storage type of x, w, b, y (forward) and dy, x, w, dx, dy_xhat (backward), widened as
// loaded (the staging buffers hold f32), each output rounded once; mean and rstd f32.

constexpr int kLnWarps = 4;     // rows per block, a warp each
constexpr int kLnChunk = 128;   // floats of a row staged per warp at a time

// br (may be null): the residual branch (layernorm_forward_add): each element of the row is
// x + br in f32, rounded once into E (ops::add's bits), stored into res as the mean's pass stages
// it, and the later passes read the row back from res (each lane the elements it wrote: the
// same thread's stores, in program order), so the LayerNorm is the forward kernel's of that
// stored residual. A run-time pointer, not a template flag: no more instantiations.
template <class E>
__global__ void __launch_bounds__(kLnWarps * 32) layernorm_forward_kernel(
    const E* x, const E* br, const E* w, const E* b, i64 N, i64 C, float eps, E* res, E* y,
    float* mean, float* rstd) {
  __shared__ float stage[kLnWarps][kLnChunk];
  __shared__ float bcast[kLnWarps];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  float* buf = stage[warp];
  const float n = static_cast<float>(C);
  const i64 warps = static_cast<i64>(gridDim.x) * kLnWarps;
  for (i64 r = static_cast<i64>(blockIdx.x) * kLnWarps + warp; r < N; r += warps) {
    const E* xr = x + r * C;
    const E* brr = br != nullptr ? br + r * C : nullptr;
    E* resr = br != nullptr ? res + r * C : nullptr;
    // mean: lane 0's chain add over x ascending.
    float s = 0.0f;
    for (i64 c0 = 0; c0 < C; c0 += kLnChunk) {
      const i64 m = C - c0 < kLnChunk ? C - c0 : kLnChunk;
      if (brr != nullptr) {
        for (i64 j = lane; j < m; j += 32) {
          const float v = rounded<E>(cm::add(ld_elem(xr, c0 + j), ld_elem(brr, c0 + j)));
          st_elem(resr, c0 + j, v);
          buf[j] = v;
        }
      } else {
        for (i64 j = lane; j < m; j += 32) buf[j] = ld_elem(xr, c0 + j);
      }
      __syncwarp();
      if (lane == 0)
        for (i64 j = 0; j < m; ++j) s = cm::add(s, buf[j]);
      __syncwarp();
    }
    if (lane == 0) bcast[warp] = cm::div(s, n);
    __syncwarp();
    const float mu = bcast[warp];
    __syncwarp();
    if (resr != nullptr) xr = resr;  // the stored residual is the LayerNorm's x from here on
    // var: the lanes form d = x - mean, lane 0 chains fma(d, d, acc).
    float var = 0.0f;
    for (i64 c0 = 0; c0 < C; c0 += kLnChunk) {
      const i64 m = C - c0 < kLnChunk ? C - c0 : kLnChunk;
      for (i64 j = lane; j < m; j += 32) buf[j] = cm::sub(ld_elem(xr, c0 + j), mu);
      __syncwarp();
      if (lane == 0)
        for (i64 j = 0; j < m; ++j) var = cm::fma(buf[j], buf[j], var);
      __syncwarp();
    }
    if (lane == 0) {
      bcast[warp] = cm::div(1.0f, cm::sqrt(cm::add(cm::div(var, n), eps)));
      mean[r] = mu;
    }
    __syncwarp();
    const float rs = bcast[warp];
    __syncwarp();
    if (lane == 0) rstd[r] = rs;
    E* yr = y + r * C;
    for (i64 c = lane; c < C; c += 32) {
      const float xhat = cm::mul(cm::sub(ld_elem(xr, c), mu), rs);
      st_elem(yr, c,
              b != nullptr ? cm::fma(xhat, ld_elem(w, c), ld_elem(b, c))
                           : cm::mul(xhat, ld_elem(w, c)));
    }
  }
}

// res (may be null): the residual gradient, added in the store (layernorm_backward_add): dx is
// rounded into E first, widened, added to res's element in f32 and rounded once (ops::add's bits
// after the separate kernel). A run-time pointer, not a template flag: no more instantiations.
template <class E>
__global__ void __launch_bounds__(kLnWarps * 32) layernorm_backward_kernel(
    const E* dy, const E* x, const E* w, const float* mean, const float* rstd, const E* res,
    i64 N, i64 C, E* dx, E* dy_xhat) {
  __shared__ float stage_g[kLnWarps][kLnChunk];
  __shared__ float stage_x[kLnWarps][kLnChunk];
  __shared__ float bcast[kLnWarps][2];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  float* bg = stage_g[warp];
  float* bx = stage_x[warp];
  const float n = static_cast<float>(C);
  const i64 warps = static_cast<i64>(gridDim.x) * kLnWarps;
  for (i64 r = static_cast<i64>(blockIdx.x) * kLnWarps + warp; r < N; r += warps) {
    const E* dyr = dy + r * C;
    const E* xr = x + r * C;
    const float mu = mean[r], rs = rstd[r];
    // g = dy * w and xhat on the lanes; lane 0 chains sg = add(sg, g), sgx = fma(g, xhat, sgx).
    float sg = 0.0f, sgx = 0.0f;
    for (i64 c0 = 0; c0 < C; c0 += kLnChunk) {
      const i64 m = C - c0 < kLnChunk ? C - c0 : kLnChunk;
      for (i64 j = lane; j < m; j += 32) {
        bg[j] = cm::mul(ld_elem(dyr, c0 + j), ld_elem(w, c0 + j));
        bx[j] = cm::mul(cm::sub(ld_elem(xr, c0 + j), mu), rs);
      }
      __syncwarp();
      if (lane == 0)
        for (i64 j = 0; j < m; ++j) {
          sg = cm::add(sg, bg[j]);
          sgx = cm::fma(bg[j], bx[j], sgx);
        }
      __syncwarp();
    }
    if (lane == 0) {
      bcast[warp][0] = cm::div(sg, n);
      bcast[warp][1] = cm::div(sgx, n);
    }
    __syncwarp();
    const float mg = bcast[warp][0], mgx = bcast[warp][1];
    __syncwarp();
    E* dxr = dx + r * C;
    E* dyx = dy_xhat + r * C;
    const E* rr = res != nullptr ? res + r * C : nullptr;
    for (i64 c = lane; c < C; c += 32) {
      const float d = ld_elem(dyr, c);
      const float g = cm::mul(d, ld_elem(w, c));
      const float xhat = cm::mul(cm::sub(ld_elem(xr, c), mu), rs);
      const float v = cm::mul(rs, cm::sub(cm::sub(g, mg), cm::mul(xhat, mgx)));
      st_elem(dxr, c, rr != nullptr ? cm::add(ld_elem(rr, c), rounded<E>(v)) : v);
      st_elem(dyx, c, cm::mul(d, xhat));
    }
  }
}

// ---- the LayerNorm backward with its parameter gradients (fast mode) ---------------------------

// Note [CUDA LayerNorm parameter gradients]
// layernorm_backward_params (fast mode; f32, bf16, f16 storage, f32 math) is llm.c's
// layernorm_backward: dx (plus the residual gradient where given), grad_w and grad_b in one
// launch, dy_xhat never stored and dy never read a second time by a row sum (the two row sums
// of nn::LayerNorm's backward were 50 launches and about 1 GB a GPT-2 124M step). The rows are
// cut into chunks (cuda_host_logic.h's layernorm_params_split: about kLnParamsTargetBlocks
// blocks, a function of N alone), a block of kLnpWarps warps each. The block takes its chunk's
// rows kLnpWarps at a time: each warp forms its row's two sums (sum g, sum g xhat, g = dy w) on
// its lanes and folds them with a butterfly of shuffles (fast mode: not the canonical chain of
// Note [GPT kernels]; the same order every run); then all the block's threads walk the columns,
// thread t owning columns t, t + 256, ...: for each of the kLnpWarps rows in ascending order
// dx[r, c] is stored (the residual's element added in f32, rounded once) and dy xhat and dy are
// added to the thread's per-column sums in shared memory (kLnpTile columns at a time: past that
// the block runs its rows again per tile). The chunk's sums go to f32 scratch part[chunk][2 C]
// (grad_w's columns, then grad_b's); the block that takes the last ticket of its group of
// kLnParamsGroup chunks (the stream's semaphores, CudaStream::semaphores: CUDA's
// threadFenceReduction sample, as the fast row sums of Note [CUDA row sums]) adds the group's
// partials in ascending chunk order into the group's row, and the block that takes the last of
// the group tickets adds the groups' rows in ascending order and finishes grad_w and grad_b
// (added to the existing gradient where accumulating, rounded once into the gradient's dtype).
// Two levels so that no block adds all the chunks' partials alone (512 chunks x 2 C). The
// tickets only elect who adds, never the order: the bits are the same whichever block is last,
// run to run (tools/cuda_emu runs the blocks forward, reversed and shuffled); each counter is
// reset to zero by its finishing block. One chunk (N <= kLnParamsMinChunk): no partials, no
// tickets. Bitwise mode keeps layernorm_backward(_add) and the micro-shards' row sums.
constexpr int kLnpWarps = 8;                  // rows a block takes at a time, a warp each
constexpr int kLnpThreads = kLnpWarps * 32;
constexpr int kLnpTile = 2048;                // columns whose sums a block holds in shared memory

// Where grad_w and grad_b go (grad_b null: no bias), their dtype, and whether each adds to the
// existing gradient.
struct LnParamsOut {
  void* w;
  void* b;
  DType t;
  bool acc_w, acc_b;
};

// Column c2 of the [2 C] sums (grad_w's c2 < C, then grad_b's) finished into its gradient.
__device__ __forceinline__ void finish_ln_param(const LnParamsOut& o, i64 C, i64 c2, float v) {
  void* p = c2 < C ? o.w : o.b;
  if (p == nullptr) return;
  const bool acc = c2 < C ? o.acc_w : o.acc_b;
  const i64 c = c2 < C ? c2 : c2 - C;
  st_elem(p, o.t, c, acc ? ld_elem(p, o.t, c) + v : v);
}

// Block blockIdx.x: rows [blockIdx.x chunk_rows, +chunk_rows) within N (Note [CUDA LayerNorm
// parameter gradients]). part == nullptr (one block): finished into `out`. Else part holds
// gridDim.x chunk rows then the groups' rows, 2 C floats each; tickets[0 .. groups] zero before
// the launch and after it. res may be null.
template <class E>
__global__ void __launch_bounds__(kLnpThreads) layernorm_backward_params_kernel(
    const E* dy, const E* x, const E* w, const float* mean, const float* rstd, const E* res,
    i64 N, i64 C, i64 chunk_rows, i64 group, E* dx, float* part, unsigned* tickets,
    const LnParamsOut out) {
  __shared__ float acc_w[kLnpTile];
  __shared__ float acc_b[kLnpTile];
  __shared__ float stats[kLnpWarps][4];  // mean, rstd, mean of g, mean of g xhat
  __shared__ bool last;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const i64 r0 = static_cast<i64>(blockIdx.x) * chunk_rows;
  const i64 r1 = N - r0 < chunk_rows ? N : r0 + chunk_rows;
  const i64 C2 = 2 * C;
  const float n = static_cast<float>(C);
  for (i64 t0 = 0; t0 < C; t0 += kLnpTile) {
    const i64 t1 = C - t0 < kLnpTile ? C : t0 + kLnpTile;
    for (i64 c = t0 + tid; c < t1; c += kLnpThreads) acc_w[c - t0] = acc_b[c - t0] = 0.0f;
    for (i64 g0 = r0; g0 < r1; g0 += kLnpWarps) {
      const i64 r = g0 + warp;
      if (r < r1) {  // the whole warp: its row's two sums, lanes strided, then a butterfly
        const E* dyr = dy + r * C;
        const E* xr = x + r * C;
        const float mu = mean[r], rs = rstd[r];
        float sg = 0.0f, sgx = 0.0f;
        for (i64 c = lane; c < C; c += 32) {
          const float g = ld_elem(dyr, c) * ld_elem(w, c);
          sg += g;
          sgx += g * ((ld_elem(xr, c) - mu) * rs);
        }
        for (int o = 16; o > 0; o /= 2) {
          sg += __shfl_xor_sync(0xffffffffu, sg, o);
          sgx += __shfl_xor_sync(0xffffffffu, sgx, o);
        }
        if (lane == 0) {
          stats[warp][0] = mu;
          stats[warp][1] = rs;
          stats[warp][2] = sg / n;
          stats[warp][3] = sgx / n;
        }
      }
      __syncthreads();
      const int rows = r1 - g0 < kLnpWarps ? static_cast<int>(r1 - g0) : kLnpWarps;
      for (i64 c = t0 + tid; c < t1; c += kLnpThreads) {
        const float wc = ld_elem(w, c);
        float aw = 0.0f, ab = 0.0f;
        for (int k = 0; k < rows; ++k) {
          const i64 i = (g0 + k) * C + c;
          const float d = ld_elem(dy, i);
          const float xhat = (ld_elem(x, i) - stats[k][0]) * stats[k][1];
          const float v = stats[k][1] * ((d * wc - stats[k][2]) - xhat * stats[k][3]);
          st_elem(dx, i, res != nullptr ? ld_elem(res, i) + v : v);
          aw += d * xhat;
          ab += d;
        }
        acc_w[c - t0] += aw;
        acc_b[c - t0] += ab;
      }
      __syncthreads();  // the stats are rewritten by the next rows
    }
    for (i64 c = t0 + tid; c < t1; c += kLnpThreads) {  // the thread's own columns
      if (part == nullptr) {
        finish_ln_param(out, C, c, acc_w[c - t0]);
        finish_ln_param(out, C, C + c, acc_b[c - t0]);
      } else {
        part[static_cast<i64>(blockIdx.x) * C2 + c] = acc_w[c - t0];
        part[static_cast<i64>(blockIdx.x) * C2 + C + c] = acc_b[c - t0];
      }
    }
  }
  if (part == nullptr) return;
  // The group's last block adds its chunks' partials; the last group's finisher adds the groups'.
  const i64 chunks = gridDim.x, groups = (chunks + group - 1) / group;
  const i64 grp = static_cast<i64>(blockIdx.x) / group;
  const i64 k0 = grp * group, k1 = chunks - k0 < group ? chunks : k0 + group;
  __threadfence();  // this block's partials visible to every block before its ticket
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(tickets + grp, 1u) == static_cast<unsigned>(k1 - k0 - 1);
    if (last) __threadfence();  // the group's other partials, fenced before their tickets
  }
  __syncthreads();
  if (!last) return;
  float* gsum = part + (chunks + grp) * C2;
  for (i64 c = tid; c < C2; c += kLnpThreads) {
    float v = __ldcg(part + k0 * C2 + c);  // L2 (written by other SMs)
    for (i64 k = k0 + 1; k < k1; ++k) v += __ldcg(part + k * C2 + c);
    if (groups == 1)
      finish_ln_param(out, C, c, v);
    else
      gsum[c] = v;
  }
  if (tid == 0) tickets[grp] = 0;  // for the stream's next kernel
  if (groups == 1) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(tickets + groups, 1u) == static_cast<unsigned>(groups - 1);
    if (last) __threadfence();
  }
  __syncthreads();
  if (!last) return;
  for (i64 c = tid; c < C2; c += kLnpThreads) {
    float v = __ldcg(part + chunks * C2 + c);
    for (i64 g = 1; g < groups; ++g) v += __ldcg(part + (chunks + g) * C2 + c);
    finish_ln_param(out, C, c, v);
  }
  if (tid == 0) tickets[groups] = 0;
}

// ---- GELU --------------------------------------------------------------------------------------
// gpt::gelu<true> / gelu_grad<true>: the branch-free tanh (the same bits as the scalar one; no
// divergence within a warp). E: the storage type (widened as loaded, rounded once on store).
// Vec: kVec<E> elements per 16-byte access over the first n / kVec<E> groups (all pointers
// aligned), the tail scalar.

template <class E, bool Vec>
__global__ void gelu_forward_kernel(const E* x, E* y, i64 n) {
  i64 first = 0;
  if constexpr (Vec) {
    constexpr int W = kVec<E>;
    const i64 nv = n / W;
    for (i64 i = global_thread(); i < nv; i += grid_threads()) {
      float a[W];
      ld_vec(x + W * i, a);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = gpt::gelu<true>(a[k]);
      st_vec(y + W * i, a);
    }
    first = nv * W;
  }
  for (i64 i = first + global_thread(); i < n; i += grid_threads())
    st_elem(y, i, gpt::gelu<true>(ld_elem(x, i)));
}

template <class E, bool Vec>
__global__ void gelu_backward_kernel(const E* x, const E* gy, E* gx, i64 n) {
  i64 first = 0;
  if constexpr (Vec) {
    constexpr int W = kVec<E>;
    const i64 nv = n / W;
    for (i64 i = global_thread(); i < nv; i += grid_threads()) {
      float a[W], g[W];
      ld_vec(x + W * i, a);
      ld_vec(gy + W * i, g);
#pragma unroll
      for (int k = 0; k < W; ++k) a[k] = gpt::gelu_grad<true>(a[k], g[k]);
      st_vec(gx + W * i, a);
    }
    first = nv * W;
  }
  for (i64 i = first + global_thread(); i < n; i += grid_threads())
    st_elem(gx, i, gpt::gelu_grad<true>(ld_elem(x, i), ld_elem(gy, i)));
}

// Kernels::gemm_ex's GELU epilogues where cuBLASLt does not run them (launch_gelu_epilogue): over
// a row-major [M, N] c (row stride ldc) and aux (ld_aux), c = gelu(aux), or with Backward c =
// gelu_grad(aux, c): the element functions of gelu_forward_kernel and gelu_backward_kernel.
template <class E, bool Backward>
__global__ void gelu_epilogue_kernel(const E* aux, i64 ld_aux, E* c, i64 ldc, i64 M, i64 N) {
  for (i64 i = global_thread(); i < M * N; i += grid_threads()) {
    const i64 m = i / N, n = i % N;
    const float a = ld_elem(aux, m * ld_aux + n);
    if constexpr (Backward)
      st_elem(c, m * ldc + n, gpt::gelu_grad<true>(a, ld_elem(c, m * ldc + n)));
    else
      st_elem(c, m * ldc + n, gpt::gelu<true>(a));
  }
}

// ---- softmax cross-entropy ---------------------------------------------------------------------
// A warp per row (Note [CUDA fused kernels]): the row max as canonical::softmax_stats folds it
// (the first element, lowest index, attaining the maximum; NaN skipped) from per-lane folds
// combined by (value, index); the exps on all lanes, staged by chunk in shared memory, and lane
// 0's ascending chain of their sum. Then the loss (lane 0) or every logit's gradient (all lanes).
// E: the logits' (and their gradient's) storage type, widened as loaded, rounded once on store.

constexpr int kCeWarps = 4;
constexpr int kCeChunk = 256;

struct RowStats {
  float m, s;
};

template <class E>
__device__ __forceinline__ RowStats warp_softmax_stats(const E* x, i64 n, int lane, float* buf,
                                                      float* cand_m, i64* cand_i) {
  float m = -pmath::detail::infinity();
  i64 mi = -1;
  for (i64 c = lane; c < n; c += 32) {
    const float v = ld_elem(x, c);
    if (m < v) {
      m = v;
      mi = c;
    }
  }
  cand_m[lane] = m;
  cand_i[lane] = mi;
  __syncwarp();
  if (lane == 0) {
    float best = -pmath::detail::infinity();
    i64 bi = -1;
    for (int k = 0; k < 32; ++k) {
      if (cand_i[k] < 0) continue;
      if (bi < 0 || best < cand_m[k] || (cand_m[k] == best && cand_i[k] < bi)) {
        best = cand_m[k];
        bi = cand_i[k];
      }
    }
    cand_m[0] = bi < 0 ? -pmath::detail::infinity() : ld_elem(x, bi);
  }
  __syncwarp();
  const float mx = cand_m[0];
  __syncwarp();
  float s = 0.0f;
  for (i64 c0 = 0; c0 < n; c0 += kCeChunk) {
    const i64 len = n - c0 < kCeChunk ? n - c0 : kCeChunk;
    for (i64 j = lane; j < len; j += 32) buf[j] = cm::exp(cm::sub(ld_elem(x, c0 + j), mx));
    __syncwarp();
    if (lane == 0)
      for (i64 j = 0; j < len; ++j) s = cm::sum_step(s, buf[j]);
    __syncwarp();
  }
  if (lane == 0) cand_m[1] = s;
  __syncwarp();
  const RowStats st{mx, cand_m[1]};
  __syncwarp();
  return st;
}

template <class E>
__global__ void __launch_bounds__(kCeWarps * 32) cross_entropy_rows_kernel(
    const E* logits, const i64* targets, i64 rows, i64 classes, float* losses) {
  __shared__ float buf[kCeWarps][kCeChunk];
  __shared__ float cand_m[kCeWarps][32];
  __shared__ i64 cand_i[kCeWarps][32];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const i64 warps = static_cast<i64>(gridDim.x) * kCeWarps;
  for (i64 r = static_cast<i64>(blockIdx.x) * kCeWarps + warp; r < rows; r += warps) {
    const E* x = logits + r * classes;
    const RowStats st = warp_softmax_stats(x, classes, lane, buf[warp], cand_m[warp], cand_i[warp]);
    if (lane == 0) losses[r] = cm::cross_entropy_loss(st.m, st.s, ld_elem(x, targets[r]));
  }
}

template <class E>
__global__ void __launch_bounds__(kCeWarps * 32) cross_entropy_backward_rows_kernel(
    const E* logits, const i64* targets, i64 rows, i64 classes, const float* grad_loss,
    float scale, E* grad_logits) {
  __shared__ float buf[kCeWarps][kCeChunk];
  __shared__ float cand_m[kCeWarps][32];
  __shared__ i64 cand_i[kCeWarps][32];
  const float factor = cm::mul(*grad_loss, scale);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const i64 warps = static_cast<i64>(gridDim.x) * kCeWarps;
  for (i64 r = static_cast<i64>(blockIdx.x) * kCeWarps + warp; r < rows; r += warps) {
    const E* x = logits + r * classes;
    E* g = grad_logits + r * classes;
    const RowStats st = warp_softmax_stats(x, classes, lane, buf[warp], cand_m[warp], cand_i[warp]);
    const i64 t = targets[r];
    for (i64 c = lane; c < classes; c += 32)
      st_elem(g, c, cm::cross_entropy_grad(factor, ld_elem(x, c), st.m, st.s, c == t));
  }
}

// ---- the softmax cross-entropy's forward and backward in one pass (fast mode) ------------------
// Note [CUDA fused cross-entropy]
// cross_entropy_fused (llm.c's fused_classifier): a block of kCfThreads per row (a grid-stride
// loop over the rows). Each thread folds its columns (c = tid, tid + blockDim, ...) into an
// online (max, sum of exp(x - max)) pair, f32, from the stored logits widened as loaded; the
// pairs merge across the warp (shuffles) and then across the warps in shared memory, in an order
// fixed by blockDim (the same bits run to run, not the simulator's ascending chain: fast mode
// only). Thread 0 loads the target's logit and *grad_loss before the barrier that publishes the
// pair, so no thread's store can precede a read of it; then each thread rewrites its own columns
// in place: x[c] = round(factor * (exp(x[c] - m) / s - [c == t])), factor = *grad_loss * scale,
// and thread 0 writes the loss log(s) - (x[t] - m). The row is read twice (the second time from
// L2 at GPT-2 sizes: a 100 KB bf16 row per block) and written once; no [rows, classes] gradient.

constexpr int kCfThreads = 512;

// (m, s) merged with (m2, s2): the pair of the union of the two sets of columns. -inf maxima
// (nothing folded yet, or all -inf) contribute nothing.
__device__ __forceinline__ void ce_merge(float& m, float& s, float m2, float s2) {
  if (m2 > m) {
    s = cm::add(cm::mul(s, cm::exp(cm::sub(m, m2))), s2);
    m = m2;
  } else if (m2 > -pmath::detail::infinity()) {
    s = cm::add(s, cm::mul(s2, cm::exp(cm::sub(m2, m))));
  }
}

template <class E>
__global__ void __launch_bounds__(kCfThreads) cross_entropy_fused_kernel(
    E* logits, const i64* targets, i64 rows, i64 classes, const float* grad_loss, float scale,
    float* losses) {
  __shared__ float warp_m[kCfThreads / 32], warp_s[kCfThreads / 32];
  __shared__ float row_m, row_s, row_xt, row_factor;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int warps = static_cast<int>(blockDim.x / 32);
  for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
    E* x = logits + r * classes;
    float m = -pmath::detail::infinity(), s = 0.0f;
    for (i64 c = tid; c < classes; c += blockDim.x) ce_merge(m, s, ld_elem(x, c), 1.0f);
    for (int off = 16; off > 0; off /= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
      ce_merge(m, s, m2, s2);
    }
    if (lane == 0) {
      warp_m[warp] = m;
      warp_s[warp] = s;
    }
    __syncthreads();
    if (tid == 0) {
      float bm = warp_m[0], bs = warp_s[0];
      for (int w = 1; w < warps; ++w) ce_merge(bm, bs, warp_m[w], warp_s[w]);
      row_m = bm;
      row_s = bs;
      row_xt = ld_elem(x, targets[r]);
      row_factor = cm::mul(*grad_loss, scale);
    }
    __syncthreads();
    const float mx = row_m, sum = row_s, factor = row_factor;
    const i64 t = targets[r];
    if (tid == 0) losses[r] = cm::cross_entropy_loss(mx, sum, row_xt);
    for (i64 c = tid; c < classes; c += blockDim.x)
      st_elem(x, c, cm::cross_entropy_grad(factor, ld_elem(x, c), mx, sum, c == t));
    __syncthreads();  // the shared pair is rewritten by the next row
  }
}

}  // namespace

// ---- softmax cross-entropy (CudaKernels::cross_entropy and its backward, cuda_kernels.cu) -----

void launch_cross_entropy(const Launch& l, const float* logits, const i64* targets, i64 rows,
                          i64 classes, float* losses) {
  cross_entropy_rows_kernel<float><<<blocks_for(rows, kCeWarps), kCeWarps * 32, 0, l.get()>>>(logits, targets, rows, classes, losses);
  l.check();
}

void launch_cross_entropy_backward(const Launch& l, const float* logits, const i64* targets,
                                   i64 rows, i64 classes, const float* grad_loss, float scale,
                                   float* grad_logits) {
  cross_entropy_backward_rows_kernel<float><<<blocks_for(rows, kCeWarps), kCeWarps * 32, 0, l.get()>>>(logits, targets, rows, classes, grad_loss, scale, grad_logits);
  l.check();
}

// ---- the GELU epilogues of gemm_ex, unfused (CudaKernels::gemm_ex, cuda_kernels.cu) -------------

void launch_gelu_epilogue(const Launch& l, DType t, bool backward, i64 M, i64 N, const void* aux,
                          i64 ld_aux, void* c, i64 ldc) {
  if (M <= 0 || N <= 0) return;
  auto run = [&](auto e) {
    using E = decltype(e);
    const auto* a = static_cast<const E*>(aux);
    auto* d = static_cast<E*>(c);
    if (backward)
      gelu_epilogue_kernel<E, true><<<blocks_for(M * N), kThreads, 0, l.get()>>>(a, ld_aux, d, ldc, M, N);
    else
      gelu_epilogue_kernel<E, false><<<blocks_for(M * N), kThreads, 0, l.get()>>>(a, ld_aux, d, ldc, M, N);
  };
  if (t == DType::f32)
    run(float{});
  else
    with_storage(t, run);
  l.check();
}

namespace {

// The launches of the embedding forward, LayerNorm, GELU and cross-entropy kernels on E (the f32
// entries with float, the *_ex entries with bfloat16 / float16).

template <class E>
void run_embedding_forward(const Launch& l, const i64* idx, const E* wte, const E* wpe, i64 N,
                           i64 T, i64 C, E* out) {
  constexpr int W = kVec<E>;
  const bool vec = C % W == 0 && aligned16(wte) && aligned16(out) &&
                   (wpe == nullptr || aligned16(wpe));
  if (vec)
    embedding_forward_kernel<E, true><<<blocks_for(N * C / W), kThreads, 0, l.get()>>>(idx, wte, wpe, N, T, C, out);
  else
    embedding_forward_kernel<E, false><<<blocks_for(N * C), kThreads, 0, l.get()>>>(idx, wte, wpe, N, T, C, out);
  l.check();
}

// The ids bucketed (Note [CUDA fused kernels]), then the canonical tree over the shards of
// `bounds` into grad (dtype gt: f32, or E's storage dtype); past kShardCap shards the tree's
// inner nodes are f32 scratch and only the root is rounded into gt (launch_combine_typed).
template <class E>
void run_embedding_backward(const Launch& l, const i64* idx, const E* dy, i64 N, i64 C, i64 V,
                            const std::vector<i64>& bounds, void* grad, DType gt,
                            bool accumulate) {
  N = std::max<i64>(N, 0);
  // Scratch: count and cursor [V] (u64), start [V + 1], bucket and rows [N] (i64).
  const std::size_t words = static_cast<std::size_t>(2 * V + (V + 1) + 2 * N);
  DeviceTemp scratch(l, static_cast<i64>(words * sizeof(i64) / sizeof(float)));
  auto* count = reinterpret_cast<u64*>(scratch.get());
  u64* cursor = count + V;
  auto* start = reinterpret_cast<i64*>(cursor + V);
  i64* bucket = start + V + 1;
  i64* rows = bucket + N;
  zero_u64_kernel<<<blocks_for(V), kThreads, 0, l.get()>>>(count, V);
  l.check();
  if (N > 0) {
    id_histogram_kernel<<<blocks_for(N), kThreads, 0, l.get()>>>(idx, N, count);
    l.check();
  }
  id_scan_kernel<<<1, kScanThreads, 0, l.get()>>>(count, V, start, cursor);
  l.check();
  if (N > 0) {
    id_scatter_kernel<<<blocks_for(N), kThreads, 0, l.get()>>>(idx, N, cursor, bucket);
    l.check();
    id_bucket_sort_kernel<<<static_cast<int>(std::min<i64>(V, kMaxBlocks)), kSortThreads, 0, l.get()>>>(start, V, bucket, rows);
    l.check();
  }
  // Vector accesses: 4 columns of dy (16 bytes f32, 8 bf16 / f16) and of grad (its dtype).
  const bool vec = C % 4 == 0 && aligned_to(dy, 4 * sizeof(E)) &&
                   aligned_to(grad, 4 * dtype_size(gt));
  const int grid = static_cast<int>(std::min<i64>(V, kMaxBlocks));
  const int threads = static_cast<int>(std::clamp<i64>(((vec ? C / 4 : C) + 31) & ~i64(31), 32, 256));
  const auto shards = static_cast<i64>(bounds.size()) - 1;
  // One launch over shards [lo, hi) into d (dtype t, row stride ld).
  auto grad_launch = [&](i64 lo, i64 hi, void* d, DType t, i64 ld, Out mode) {
    const ShardBounds sb = shard_bounds(bounds, lo, hi);
    const int n = static_cast<int>(hi - lo);
    if (vec && ld % 4 == 0)
      embedding_grad_kernel<4, E><<<grid, threads, 0, l.get()>>>(start, rows, dy, C, V, sb, n, d, t, ld, mode);
    else
      embedding_grad_kernel<1, E><<<grid, threads, 0, l.get()>>>(start, rows, dy, C, V, sb, n, d, t, ld, mode);
    l.check();
  };
  const Out out = accumulate ? Out::accumulate : Out::store;
  if (shards <= kShardCap) {
    grad_launch(0, shards, grad, gt, C, out);
    return;
  }
  auto leaf = [&](i64 lo, i64 hi, float* d, i64 ld, Out mode, float /*scale*/) {
    grad_launch(lo, hi, d, DType::f32, ld, mode);
  };
  if (gt == DType::f32) {
    shard_tree(l, 0, shards, V, C, static_cast<float*>(grad), C, out, 1.0f, leaf);
    return;
  }
  const i64 mid = tree_mid(0, shards);
  DeviceTemp left(l, V * C), right(l, V * C);
  shard_tree(l, 0, mid, V, C, left.get(), C, Out::store, 1.0f, leaf);
  shard_tree(l, mid, shards, V, C, right.get(), C, Out::store, 1.0f, leaf);
  launch_combine_typed(l, V, C, left.get(), right.get(), grad, gt, C, out);
}

template <class E>
void run_layernorm_forward(const Launch& l, const E* x, const E* br, const E* w, const E* b,
                           i64 N, i64 C, float eps, E* res, E* y, float* mean, float* rstd) {
  layernorm_forward_kernel<E><<<blocks_for(N, kLnWarps), kLnWarps * 32, 0, l.get()>>>(x, br, w, b, N, C, eps, res, y, mean, rstd);
  l.check();
}

template <class E>
void run_layernorm_backward(const Launch& l, const E* dy, const E* x, const E* w,
                            const float* mean, const float* rstd, const E* res, i64 N, i64 C,
                            E* dx, E* dy_xhat) {
  layernorm_backward_kernel<E><<<blocks_for(N, kLnWarps), kLnWarps * 32, 0, l.get()>>>(dy, x, w, mean, rstd, res, N, C, dx, dy_xhat);
  l.check();
}

template <class E>
void run_layernorm_backward_params(const Launch& l, const E* dy, const E* x, const E* w,
                                   const float* mean, const float* rstd, const E* res, i64 N,
                                   i64 C, E* dx, const LnParamsOut& out) {
  const LnParamsSplit split = layernorm_params_split(N);
  if (split.chunks == 1) {
    layernorm_backward_params_kernel<E><<<1, kLnpThreads, 0, l.get()>>>(dy, x, w, mean, rstd, res, N, C, N, 1, dx, nullptr, nullptr, out);
    l.check();
    return;
  }
  // One ticket counter per group and one for the groups (fewer than kStreamSemaphores).
  DITTO_CHECK(split.groups + 1 <= kStreamSemaphores, "layernorm_backward_params: ", split.groups,
              " groups of row chunks, expected at most ", kStreamSemaphores - 1);
  DeviceTemp part(l, (split.chunks + split.groups) * 2 * C);
  layernorm_backward_params_kernel<E><<<static_cast<unsigned>(split.chunks), kLnpThreads, 0, l.get()>>>(dy, x, w, mean, rstd, res, N, C, split.chunk_rows, kLnParamsGroup, dx, part.get(), l.semaphores(), out);
  l.check();
}

template <class E>
void run_gelu_forward(const Launch& l, const E* x, E* y, i64 n) {
  constexpr int W = kVec<E>;
  if (aligned16(x) && aligned16(y))
    gelu_forward_kernel<E, true><<<blocks_for((n + W - 1) / W), kThreads, 0, l.get()>>>(x, y, n);
  else
    gelu_forward_kernel<E, false><<<blocks_for(n), kThreads, 0, l.get()>>>(x, y, n);
  l.check();
}

template <class E>
void run_gelu_backward(const Launch& l, const E* x, const E* gy, E* gx, i64 n) {
  constexpr int W = kVec<E>;
  if (aligned16(x) && aligned16(gy) && aligned16(gx))
    gelu_backward_kernel<E, true><<<blocks_for((n + W - 1) / W), kThreads, 0, l.get()>>>(x, gy, gx, n);
  else
    gelu_backward_kernel<E, false><<<blocks_for(n), kThreads, 0, l.get()>>>(x, gy, gx, n);
  l.check();
}

}  // namespace

// ---- CudaGptKernels: embedding, LayerNorm, GELU ------------------------------------------------

void CudaGptKernels::embedding_forward(Stream& s, const i64* idx, const float* wte,
                                       const float* wpe, i64 N, i64 T, i64 C, float* out) {
  if (N <= 0 || C <= 0) return;
  run_embedding_forward(Launch(backend_, s, "embedding_forward"), idx, wte, wpe, N, T, C, out);
}

void CudaGptKernels::embedding_backward(Stream& s, const i64* idx, const float* dy, i64 N, i64 C,
                                        i64 V, const std::vector<i64>& bounds, float* grad_wte,
                                        bool accumulate) {
  if (V <= 0 || C <= 0) return;
  run_embedding_backward(Launch(backend_, s, "embedding_backward"), idx, dy, N, C, V, bounds,
                         grad_wte, DType::f32, accumulate);
}

void CudaGptKernels::layernorm_forward(Stream& s, const float* x, const float* w, const float* b,
                                       i64 N, i64 C, float eps, float* y, float* mean,
                                       float* rstd) {
  if (N <= 0) return;
  run_layernorm_forward(Launch(backend_, s, "layernorm_forward"), x,
                        static_cast<const float*>(nullptr), w, b, N, C, eps,
                        static_cast<float*>(nullptr), y, mean, rstd);
}

void CudaGptKernels::layernorm_backward(Stream& s, const float* dy, const float* x,
                                        const float* w, const float* mean, const float* rstd,
                                        i64 N, i64 C, float* dx, float* dy_xhat) {
  if (N <= 0) return;
  run_layernorm_backward(Launch(backend_, s, "layernorm_backward"), dy, x, w, mean, rstd,
                         static_cast<const float*>(nullptr), N, C, dx, dy_xhat);
}

void CudaGptKernels::gelu_forward(Stream& s, const float* x, float* y, i64 n) {
  if (n <= 0) return;
  run_gelu_forward(Launch(backend_, s, "gelu_forward"), x, y, n);
}

void CudaGptKernels::gelu_backward(Stream& s, const float* x, const float* gy, float* gx, i64 n) {
  if (n <= 0) return;
  run_gelu_backward(Launch(backend_, s, "gelu_backward"), x, gy, gx, n);
}

// ---- the typed row kernels (Kernels::*_ex): the kernels above on bfloat16 / float16 ------------

void CudaGptKernels::embedding_forward_ex(Stream& s, DType dtype, const i64* idx, const void* wte,
                                          const void* wpe, i64 N, i64 T, i64 C, void* out) {
  if (N <= 0 || C <= 0) return;
  const Launch l(backend_, s, "embedding_forward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_embedding_forward(l, idx, static_cast<const E*>(wte), static_cast<const E*>(wpe), N, T, C,
                          static_cast<E*>(out));
  });
}

void CudaGptKernels::embedding_backward_ex(Stream& s, DType dtype, const i64* idx,
                                           const void* dy, i64 N, i64 C, i64 V,
                                           const std::vector<i64>& bounds, DType grad_type,
                                           void* grad_wte, bool accumulate) {
  if (V <= 0 || C <= 0) return;
  const Launch l(backend_, s, "embedding_backward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_embedding_backward(l, idx, static_cast<const E*>(dy), N, C, V, bounds, grad_wte,
                           grad_type, accumulate);
  });
}

void CudaGptKernels::layernorm_forward_ex(Stream& s, DType dtype, const void* x, const void* w,
                                          const void* b, i64 N, i64 C, float eps, void* y,
                                          float* mean, float* rstd) {
  if (N <= 0) return;
  const Launch l(backend_, s, "layernorm_forward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_layernorm_forward(l, static_cast<const E*>(x), static_cast<const E*>(nullptr),
                          static_cast<const E*>(w), static_cast<const E*>(b), N, C, eps,
                          static_cast<E*>(nullptr), static_cast<E*>(y), mean, rstd);
  });
}

void CudaGptKernels::layernorm_forward_add(Stream& s, DType dtype, const void* x,
                                           const void* branch, const void* w, const void* b,
                                           i64 N, i64 C, float eps, void* residual, void* y,
                                           float* mean, float* rstd) {
  if (N <= 0) return;
  const Launch l(backend_, s, "layernorm_forward_add");
  auto run = [&](auto e) {
    using E = decltype(e);
    run_layernorm_forward(l, static_cast<const E*>(x), static_cast<const E*>(branch),
                          static_cast<const E*>(w), static_cast<const E*>(b), N, C, eps,
                          static_cast<E*>(residual), static_cast<E*>(y), mean, rstd);
  };
  if (dtype == DType::f32)
    run(float{});
  else
    with_storage(dtype, run);
}

void CudaGptKernels::layernorm_backward_ex(Stream& s, DType dtype, const void* dy, const void* x,
                                           const void* w, const float* mean, const float* rstd,
                                           i64 N, i64 C, void* dx, void* dy_xhat) {
  if (N <= 0) return;
  const Launch l(backend_, s, "layernorm_backward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_layernorm_backward(l, static_cast<const E*>(dy), static_cast<const E*>(x),
                           static_cast<const E*>(w), mean, rstd, static_cast<const E*>(nullptr), N,
                           C, static_cast<E*>(dx), static_cast<E*>(dy_xhat));
  });
}

void CudaGptKernels::layernorm_backward_add(Stream& s, DType dtype, const void* dy, const void* x,
                                            const void* w, const float* mean, const float* rstd,
                                            const void* residual, i64 N, i64 C, void* out,
                                            void* dy_xhat) {
  if (N <= 0) return;
  const Launch l(backend_, s, "layernorm_backward_add");
  auto run = [&](auto e) {
    using E = decltype(e);
    run_layernorm_backward(l, static_cast<const E*>(dy), static_cast<const E*>(x),
                           static_cast<const E*>(w), mean, rstd, static_cast<const E*>(residual),
                           N, C, static_cast<E*>(out), static_cast<E*>(dy_xhat));
  };
  if (dtype == DType::f32)
    run(float{});
  else
    with_storage(dtype, run);
}

void CudaGptKernels::layernorm_backward_params(Stream& s, DType dtype, const void* dy,
                                               const void* x, const void* w, const float* mean,
                                               const float* rstd, const void* residual, i64 N,
                                               i64 C, void* dx, DType grad_type, void* grad_w,
                                               bool accumulate_w, void* grad_b,
                                               bool accumulate_b) {
  if (C <= 0) return;
  const Launch l(backend_, s, "layernorm_backward_params");
  const LnParamsOut out{grad_w, grad_b, grad_type, accumulate_w, accumulate_b};
  auto run = [&](auto e) {
    using E = decltype(e);
    run_layernorm_backward_params(l, static_cast<const E*>(dy), static_cast<const E*>(x),
                                  static_cast<const E*>(w), mean, rstd,
                                  static_cast<const E*>(residual), N, C, static_cast<E*>(dx),
                                  out);
  };
  if (dtype == DType::f32)
    run(float{});
  else
    with_storage(dtype, run);
}

void CudaGptKernels::gelu_forward_ex(Stream& s, DType dtype, const void* x, void* y, i64 n) {
  if (n <= 0) return;
  const Launch l(backend_, s, "gelu_forward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_gelu_forward(l, static_cast<const E*>(x), static_cast<E*>(y), n);
  });
}

void CudaGptKernels::gelu_backward_ex(Stream& s, DType dtype, const void* x, const void* gy,
                                      void* gx, i64 n) {
  if (n <= 0) return;
  const Launch l(backend_, s, "gelu_backward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    run_gelu_backward(l, static_cast<const E*>(x), static_cast<const E*>(gy), static_cast<E*>(gx),
                      n);
  });
}

void CudaGptKernels::cross_entropy_ex(Stream& s, DType dtype, const void* logits,
                                      const i64* targets, i64 rows, i64 classes, float* losses) {
  if (rows <= 0) return;
  const Launch l(backend_, s, "cross_entropy_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    cross_entropy_rows_kernel<E><<<blocks_for(rows, kCeWarps), kCeWarps * 32, 0, l.get()>>>(static_cast<const E*>(logits), targets, rows, classes, losses);
  });
  l.check();
}

void CudaGptKernels::cross_entropy_backward_ex(Stream& s, DType dtype, const void* logits,
                                               const i64* targets, i64 rows, i64 classes,
                                               const float* grad_loss, float scale,
                                               void* grad_logits) {
  if (rows <= 0 || classes <= 0) return;
  const Launch l(backend_, s, "cross_entropy_backward_ex");
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    cross_entropy_backward_rows_kernel<E><<<blocks_for(rows, kCeWarps), kCeWarps * 32, 0, l.get()>>>(static_cast<const E*>(logits), targets, rows, classes, grad_loss, scale, static_cast<E*>(grad_logits));
  });
  l.check();
}

void CudaGptKernels::cross_entropy_fused(Stream& s, DType dtype, void* logits, const i64* targets,
                                         i64 rows, i64 classes, const float* grad_loss,
                                         float scale, float* losses) {
  if (rows <= 0 || classes <= 0) return;
  const Launch l(backend_, s, "cross_entropy_fused");
  const unsigned grid = static_cast<unsigned>(rows < (i64{1} << 20) ? rows : (i64{1} << 20));
  auto run = [&](auto e) {
    using E = decltype(e);
    cross_entropy_fused_kernel<E><<<grid, kCfThreads, 0, l.get()>>>(static_cast<E*>(logits), targets, rows, classes, grad_loss, scale, losses);
  };
  if (dtype == DType::f32)
    run(float{});
  else
    with_storage(dtype, run);
  l.check();
}

}  // namespace ditto::cuda::kern
