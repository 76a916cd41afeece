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
// The canonical GEMM is in cuda_gemm.cu (Note [CUDA canonical GEMM]), the transformer's kernels
// in cuda_kernels_gpt.cu and cuda_fused.cu (CudaGptKernels, the base of CudaKernels; the softmax
// cross-entropy's warp-per-row kernels are in cuda_fused.cu too); the launch helpers they share in
// cuda_kernels_common.cuh.
#include <mutex>

#include "backend_cuda/cublas_lazy.h"
#include "backend_cuda/cuda_blaslt.h"
#include "backend_cuda/cuda_kernels_common.cuh"

namespace ditto::cuda {

namespace {

using namespace kern;

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

// ---- losses (one thread per sample, columns ascending as in the simulator; the softmax
// cross-entropy is in cuda_fused.cu: a warp per row) -----------------------------------------

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

// Bitwise sum: one ascending chain from 0.0f (the simulator's loop) in thread 0, over tiles of
// x that the block stages in shared memory (two buffers: the next tile loads, coalesced, while
// thread 0 runs the chain over this one). The chain is serial: its order is the result.
constexpr int kChainTile = 2048;  // floats per staged tile

__global__ void __launch_bounds__(kThreads) sum_bitwise_kernel(const float* x, i64 n, float scale,
                                                               float* out) {
  __shared__ float tile[2][kChainTile];
  const int t = static_cast<int>(threadIdx.x);
  float acc = 0.0f;
  for (i64 i = t; i < n && i < kChainTile; i += blockDim.x) tile[0][i] = x[i];
  __syncthreads();
  for (i64 base = 0, k = 0; base < n; base += kChainTile, ++k) {
    const i64 next = base + kChainTile;
    float* stage = tile[(k + 1) & 1];
    for (i64 i = t; i < kChainTile && next + i < n; i += blockDim.x) stage[i] = x[next + i];
    if (t == 0) {
      const float* cur = tile[k & 1];
      const i64 len = n - base < kChainTile ? n - base : kChainTile;
      for (i64 i = 0; i < len; ++i) acc = cm::sum_step(acc, cur[i]);
    }
    __syncthreads();
  }
  if (t == 0) *out = cm::mul(scale, acc);
}

constexpr int kSumThreads = 1024;

// Fast sum: one block, strided partial sums, then a tree over the block (any order).
__global__ void __launch_bounds__(kSumThreads) sum_fast_kernel(const float* x, i64 n, float scale,
                                                               float* out) {
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc += x[i];
  acc = block_sum_any_order(acc);
  if (threadIdx.x == 0) *out = scale * acc;
}

// ---- reductions over rows (bias and LayerNorm parameter gradients; Note [CUDA row sums]) -------

// Note [CUDA row sums]
// sum_rows (bitwise), sum_rows_sharded and their typed versions (sum_rows_ex,
// sum_rows_sharded_ex: x bf16 / f16 loaded and widened, out f32 or x's dtype, rounded once) are
// one kernel, sum_rows_tree_kernel: a block of kSumCols columns x up to kSumLanes warps; warp w
// runs the ascending chains from 0.0f of shards w, w + kSumLanes, ... for its 32 columns (each
// row a coalesced segment), the leaves go to shared memory, and warp 0 folds them with the
// canonical tree over the shards (a TreeStack, leaves in shard order) and finishes: the
// simulator's bits, with columns x shards chains in parallel where the old kernel ran one thread
// per column over every shard. bitwise sum_rows is the case of one shard [0, rows). The chains
// stay serial (their order is the result); more than kShardCap shards go through shard_tree's
// host recursion (f32 nodes, the root rounded once: launch_combine_typed). Fast sum_rows (any
// order, the same bits run to run) splits each column's rows over kRowGroups threads of a block
// (sum_rows_fast_kernel) and, past kRowSumOnePassRows rows, the rows into chunks of their own
// blocks (cuda_host_logic.h's fast_row_chunks, about kRowSumTargetBlocks blocks in all): a
// [8192, 768] bias gradient was 24 blocks on a 132-SM GPU, now 24 x 43. The chunks' f32 partials
// go to scratch, and the same launch finishes them (CUDA's threadFenceReduction sample): each
// block writes its 32 partials, __threadfence(), then one thread takes a ticket (atomicAdd on
// its column block's counter among the stream's semaphores, CudaStream::semaphores); the block
// that draws the last ticket of its 32 columns adds their partials part[k * cols + c] in
// ascending k from part[0 * cols + c], read back from memory (its own too), and resets the
// counter to zero for the stream's next kernel. The atomic only elects who finishes, never the
// order of the additions: the result's bits are those of the chunk-order sum whichever block is
// last, run to run (tools/cuda_emu checks it with the blocks run forward, reversed and shuffled,
// against the two-launch order). The dry run prices one launch and the partials' bytes
// (backend_sim/cost_model.h's fast_sum_rows_cost).
constexpr int kSumCols = 32;   // columns per block of sum_rows_tree_kernel
constexpr int kSumLanes = 8;   // warps per block: the shards' chains of its columns

// Where a reduction over rows lands: out[c] of dtype t (f32, bf16, f16) = round_t(T finished
// with `mode`; with beta != 0 (sum_rows): cm::gemm_epilogue(T, 1, beta, out[c])).
struct RowsOut {
  void* p;
  DType t;
  Out mode;
  float scale;
  float beta;
};

__device__ __forceinline__ void finish_rows(const RowsOut& o, i64 c, float v) {
  const bool reads = o.mode == Out::accumulate || o.beta != 0.0f;
  const float d = reads ? ld_elem(o.p, o.t, c) : 0.0f;
  st_elem(o.p, o.t, c,
          o.beta != 0.0f ? cm::gemm_epilogue(v, 1.0f, o.beta, d) : finish(o.mode, v, d, o.scale));
}

// X: x's element type (float, bfloat16, float16). Grid-stride over blocks of kSumCols columns;
// blockDim (kSumCols, lanes <= kSumLanes).
template <class X>
__global__ void __launch_bounds__(kSumCols * kSumLanes)
    sum_rows_tree_kernel(const X* x, i64 cols, const __grid_constant__ ShardBounds bounds,
                         int shards, const RowsOut out) {
  __shared__ float leaf[kShardCap][kSumCols];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (i64 c0 = static_cast<i64>(blockIdx.x) * kSumCols; c0 < cols;
       c0 += static_cast<i64>(gridDim.x) * kSumCols) {
    const i64 c = c0 + tx;
    if (c < cols)
      for (int s = ty; s < shards; s += static_cast<int>(blockDim.y)) {
        float acc = 0.0f;
        const X* xc = x + c;
#pragma unroll 4
        for (i64 r = bounds.b[s]; r < bounds.b[s + 1]; ++r)
          acc = cm::sum_step(acc, ld_elem(xc, r * cols));
        leaf[s][tx] = acc;
      }
    __syncthreads();
    if (ty == 0 && c < cols) {
      cm::TreeStack<1, kShardDepth> tree;
      float v[1];
      for (int s = 0; s < shards; ++s) {
        v[0] = leaf[s][tx];
        tree.push(s, v);
      }
      tree.result(v);
      finish_rows(out, c, v[0]);
    }
    __syncthreads();
  }
}

constexpr int kRowGroups = 8;  // fast sum_rows: a column's rows split over 8 threads of a block
static_assert(kRowGroups == 8, "fast_row_chunks (cuda_host_logic.h) rounds chunks to 8 rows");

// out[c] = (beta != 0 ? beta * out[c] : 0) + v, rounded into out's dtype (fast: fma allowed).
__device__ __forceinline__ void finish_rows_fast(const RowsOut& o, i64 c, float v) {
  st_elem(o.p, o.t, c, o.beta == 0.0f ? v : o.beta * ld_elem(o.p, o.t, c) + v);
}

// Fast sum_rows: block (32, kRowGroups) over 32 columns and the rows of chunk blockIdx.y
// ([y chunk_rows, (y + 1) chunk_rows) within rows); each thread sums every kRowGroups-th row of
// the chunk, then the block's partials are added in shared memory (any order). part == nullptr
// (one chunk): finished into out. Else part[y * cols + c] (f32), and the block that takes the
// last ticket of tickets[blockIdx.x] (zero before the launch, zero again after it) adds the
// column's partials in ascending chunk order into out (Note [CUDA row sums]). X as
// sum_rows_tree_kernel's.
template <class X>
__global__ void __launch_bounds__(32 * kRowGroups)
    sum_rows_fast_kernel(const X* x, i64 rows, i64 cols, i64 chunk_rows, float* part,
                         unsigned* tickets, const RowsOut out) {
  __shared__ float group[kRowGroups][33];
  __shared__ bool last;
  const i64 c = static_cast<i64>(blockIdx.x) * 32 + threadIdx.x;
  const i64 r0 = static_cast<i64>(blockIdx.y) * chunk_rows;
  const i64 r1 = rows - r0 < chunk_rows ? rows : r0 + chunk_rows;
  float acc = 0.0f;
  if (c < cols)
#pragma unroll 4
    for (i64 r = r0 + threadIdx.y; r < r1; r += kRowGroups) acc += ld_elem(x, r * cols + c);
  group[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  const bool lead = threadIdx.x == 0 && threadIdx.y == 0;
  if (threadIdx.y == 0 && c < cols) {
    for (int g = 1; g < kRowGroups; ++g) acc += group[g][threadIdx.x];
    if (part == nullptr) {
      finish_rows_fast(out, c, acc);
    } else {
      part[static_cast<i64>(blockIdx.y) * cols + c] = acc;
      __threadfence();  // the partial visible to every block before this block's ticket
    }
  }
  if (part == nullptr) return;
  __syncthreads();
  if (lead) {
    last = atomicAdd(tickets + blockIdx.x, 1u) == gridDim.y - 1;
    if (last) __threadfence();  // the other blocks' partials, fenced before their tickets
  }
  __syncthreads();
  if (!last) return;
  if (threadIdx.y == 0 && c < cols) {
    float sum = __ldcg(part + c);  // L2 (the partials were written by other SMs)
    for (i64 k = 1; k < gridDim.y; ++k) sum += __ldcg(part + k * cols + c);
    finish_rows_fast(out, c, sum);
  }
  if (lead) tickets[blockIdx.x] = 0;  // for the stream's next kernel
}

// One launch of sum_rows_tree_kernel over shards sb[0..shards] (<= kShardCap) into `out`.
template <class X>
void launch_sum_rows_tree(const Launch& l, const X* x, i64 cols, const ShardBounds& sb, int shards,
                          const RowsOut& out) {
  const unsigned lanes = static_cast<unsigned>(std::clamp(shards, 1, kSumLanes));
  sum_rows_tree_kernel<X><<<blocks_for(cols, kSumCols), dim3(kSumCols, lanes), 0, l.get()>>>(x, cols, sb, shards, out);
  l.check();
}

// sum_rows (bitwise: the tree kernel over one shard; fast: any order) of X elements into `out`.
template <class X>
void launch_sum_rows(const Launch& l, const X* x, i64 rows, i64 cols, const RowsOut& out,
                     Determinism mode) {
  if (mode == Determinism::bitwise) {
    ShardBounds sb{};
    sb.b[0] = 0, sb.b[1] = rows;
    launch_sum_rows_tree(l, x, cols, sb, 1, out);
    return;
  }
  // Fast: the rows in chunks (fast_row_chunks), so a narrow matrix still fills the GPU.
  const RowChunks split = fast_row_chunks(rows, cols);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>(split.chunks));
  if (split.chunks == 1) {
    sum_rows_fast_kernel<X><<<grid, dim3(32, kRowGroups), 0, l.get()>>>(x, rows, cols, rows, nullptr, nullptr, out);
    l.check();
    return;
  }
  // One ticket counter per block of 32 columns (a split has fewer than kStreamSemaphores).
  DITTO_CHECK(grid.x <= kStreamSemaphores, "sum_rows (fast): ", grid.x,
              " column blocks split over row chunks, expected at most ", kStreamSemaphores);
  DeviceTemp part(l, split.chunks * cols);
  sum_rows_fast_kernel<X><<<grid, dim3(32, kRowGroups), 0, l.get()>>>(x, rows, cols, split.chunk_rows, part.get(), l.semaphores(), out);
  l.check();
}

// sum_rows_sharded of X elements into out[cols] of dtype t: one launch up to kShardCap shards;
// past it the host tree of shard_tree, its nodes f32 scratch and the root rounded once into t.
template <class X>
void launch_sum_rows_sharded(const Launch& l, const X* x, i64 cols, const std::vector<i64>& bounds,
                             void* out, DType t, bool accumulate) {
  const auto shards = static_cast<i64>(bounds.size()) - 1;
  const Out mode = accumulate ? Out::accumulate : Out::store;
  auto leaf = [&](i64 lo, i64 hi, float* d, i64 /*ld*/, Out m, float scale) {
    launch_sum_rows_tree(l, x, cols, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo),
                         RowsOut{d, DType::f32, m, scale, 0.0f});
  };
  if (shards <= kShardCap) {
    launch_sum_rows_tree(l, x, cols, shard_bounds(bounds, 0, shards), static_cast<int>(shards),
                         RowsOut{out, t, mode, 1.0f, 0.0f});
    return;
  }
  if (t == DType::f32) {
    shard_tree(l, 0, shards, 1, cols, static_cast<float*>(out), cols, mode, 1.0f, leaf);
    return;
  }
  const i64 mid = tree_mid(0, shards);
  DeviceTemp left(l, cols), right(l, cols);
  shard_tree(l, 0, mid, 1, cols, left.get(), cols, Out::store, 1.0f, leaf);
  shard_tree(l, mid, shards, 1, cols, right.get(), cols, Out::store, 1.0f, leaf);
  launch_combine_typed(l, 1, cols, left.get(), right.get(), out, t, cols, mode);
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

// Note [CUDA sharded sum]
// sum_sharded (the bitwise loss: the mean over B T tokens cut into micro-shards; its only caller
// is nn::Loss in bitwise mode, fast mode calls sum) is by definition one ascending chain from 0.0f
// per shard, then the canonical tree over the shards (backend.h; the simulator's sum_sharded):
// each chain stays serial, its order is the result. What runs in parallel: the shards' chains
// (thread r of the block runs the chain of the r-th shard with elements) and the loads, which
// the block's other threads stage through shared memory, coalesced, while the chains run over
// the previous stage (two buffers of kShardStage floats). A stage holds `width` elements of each
// shard with elements, width = kShardStage / (their count rounded up to a power of two), so few
// long shards (GPT-2 at B 8: 8 of the 64 shards hold 1024 tokens each) take few stages. Thread
// 0 then runs the tree over all the shards' leaves (empty shards +0.0f) in shard order. Where a
// thread per shard loaded its own elements, each chain waited on its loads, uncoalesced.
constexpr int kShardStageLog2 = 12;
constexpr int kShardStage = 1 << kShardStageLog2;  // floats of all shards staged per step
constexpr int kShardSumThreads = 512;  // kShardCap chain threads, the rest load
static_assert(kShardStage % (32 * kShardCap) == 0 && kShardSumThreads > kShardCap,
              "a stage is at least 32 floats of each of kShardCap shards");

__global__ void __launch_bounds__(kShardSumThreads)
    sum_sharded_kernel(const float* x, const __grid_constant__ ShardBounds bounds, int shards,
                       float* out, Out mode, float scale) {
  __shared__ float tile[2][kShardStage + kShardCap];  // row r at r (width + 1): no bank conflicts
  __shared__ float leaf[kShardCap];
  __shared__ int active[kShardCap];  // the shards with elements, ascending
  __shared__ int n_active_s;
  __shared__ i64 longest_s;
  const int t = static_cast<int>(threadIdx.x);
  if (t == 0) {
    int n = 0;
    i64 longest = 0;
    for (int s = 0; s < shards; ++s) {
      const i64 len = bounds.b[s + 1] - bounds.b[s];
      if (len > 0) active[n++] = s;
      longest = len > longest ? len : longest;
    }
    n_active_s = n;
    longest_s = longest;
  }
  if (t < shards) leaf[t] = 0.0f;  // an empty shard's chain: 0.0f
  __syncthreads();
  const int n_active = n_active_s;
  int log_width = kShardStageLog2;  // width: kShardStage / (n_active rounded up to a power of 2)
  while ((n_active << log_width) > kShardStage) --log_width;
  const int width = 1 << log_width;
  const i64 stages = (longest_s + width - 1) / width;
  // Loader threads (t >= kShardCap) stage elements [k width, (k + 1) width) of every shard with
  // elements into buf, row r for the shard active[r].
  auto stage_in = [&](i64 k, float* buf) {
    const int loaders = static_cast<int>(blockDim.x) - kShardCap;
    for (int i = t - kShardCap; i < n_active * width; i += loaders) {
      const int r = i >> log_width, j = i & (width - 1);
      const int s = active[r];
      const i64 at = bounds.b[s] + k * width + j;
      if (at < bounds.b[s + 1]) buf[r * (width + 1) + j] = x[at];
    }
  };
  float acc = 0.0f;
  if (t >= kShardCap && stages > 0) stage_in(0, tile[0]);
  __syncthreads();
  for (i64 k = 0; k < stages; ++k) {
    if (t >= kShardCap) {
      if (k + 1 < stages) stage_in(k + 1, tile[(k + 1) & 1]);
    } else if (t < n_active) {
      const int s = active[t];
      const i64 at = bounds.b[s] + k * width, end = bounds.b[s + 1];
      const int len = at >= end ? 0 : end - at < width ? static_cast<int>(end - at) : width;
      const float* row = tile[k & 1] + t * (width + 1);
#pragma unroll 4
      for (int j = 0; j < len; ++j) acc = cm::sum_step(acc, row[j]);
    }
    __syncthreads();
  }
  if (t < n_active) leaf[active[t]] = acc;
  __syncthreads();
  if (t == 0)
    *out = finish(mode, tree_over<kShardDepth>(leaf, shards), mode == Out::accumulate ? *out : 0.0f,
                  scale);
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

// The GPT's entries come from CudaGptKernels (cuda_kernels_gpt.cu, cuda_fused.cu), which holds backend_.
class CudaKernels final : public CudaGptKernels {
 public:
  explicit CudaKernels(CudaBackend& backend) : CudaGptKernels(backend) {}

  void gemm(Stream& s, bool trans_a, bool trans_b, i64 M, i64 N, i64 K, float alpha,
            const float* A, i64 lda, const float* B, i64 ldb, float beta, float* C, i64 ldc,
            Determinism mode) override {
    if (M <= 0 || N <= 0) return;
    Launch l(backend_, s, "gemm");
    if (mode == Determinism::fast && backend_.allow_tf32()) {  // TF32 tensor cores: cuBLASLt
      GemmExArgs g;
      g.trans_a = trans_a;
      g.trans_b = trans_b;
      g.M = M, g.N = N, g.K = K, g.alpha = alpha, g.beta = beta;
      g.A = A, g.lda = lda, g.B = B, g.ldb = ldb, g.C = C, g.ldc = ldc;
      g.mode = mode;
      if (blaslt_gemm(as_cuda(s, "gemm"), g, /*tf32=*/true, l.where())) return;
    }
    // cuBLAS (column-major) computes C^T = op(B)^T op(A)^T: a row-major [r, c] matrix with row
    // stride ld is the column-major [c, r] with leading dimension ld.
    const bool cublas_ok = mode == Determinism::fast && K > 0 &&
                           lda >= std::max<i64>(1, trans_a ? M : K) &&
                           ldb >= std::max<i64>(1, trans_b ? K : N) && ldc >= std::max<i64>(1, N);
    if (cublas_ok) {
      // The stream's own handle, bound to it with its own workspace (CudaStream::cublas): no
      // cublasSetStream here, which another thread could interleave with on a shared handle.
      cublasHandle_t h = as_cuda(s, "gemm").cublas();
      const CublasApi& api = cublas_api();  // loaded by cublas() (Note [Lazy cuBLAS])
      DITTO_CUBLAS_CHECK(api.set_pointer_mode(h, CUBLAS_POINTER_MODE_HOST), l.where());
      DITTO_CUBLAS_CHECK(api.set_math_mode(h, CUBLAS_DEFAULT_MATH), l.where());  // no TF32
      DITTO_CUBLAS_CHECK(
          api.sgemm_64(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc),
          l.where());
      return;
    }
    launch_gemm(l, trans_a, trans_b, {M, N, A, lda, B, ldb, C, ldc, alpha, beta, Out::store}, K);
  }

  bool has_gemm_ex(DType a_type, DType b_type, DType c_type, Determinism) const override {
    return typed_gemm_supported(a_type, b_type, c_type);
  }

  // Fast mode, f32 / bf16 / f16, once cuBLASLt's GELU epilogue proved the tanh form on every GPU
  // (blaslt_gelu_epilogue_is_tanh, probed at the first query and cached).
  bool has_gemm_gelu_epilogue(DType dtype, Determinism mode) const override {
    if (!gemm_gelu_epilogue_supported(dtype, mode)) return false;
    std::call_once(gelu_probed_, [&] { gelu_tanh_ = blaslt_gelu_epilogue_is_tanh(backend_); });
    return gelu_tanh_;
  }

  // fast: cuBLASLt (blaslt_gemm); bitwise, or where cuBLASLt cannot take the call: the canonical
  // GEMM loading A and B in their storage dtype (Note [CUDA canonical GEMM]). The GELU epilogues
  // where cuBLASLt does not run them (bitwise, the probe said no, blaslt_gemm declined): the GEMM
  // with the bias into aux (gelu_aux_bias) or plainly into C (dgelu), then launch_gelu_epilogue.
  void gemm_ex(Stream& s, const GemmExArgs& g) override {
    if (g.M <= 0 || g.N <= 0) return;
    Launch l(backend_, s, "gemm_ex");
    if (g.epilogue != GemmEpilogue::gelu_aux_bias && g.epilogue != GemmEpilogue::dgelu)
      return plain_gemm_ex(s, l, g);
    if (has_gemm_gelu_epilogue(g.c_type, g.mode) && lt_gemm_ex(s, l, g)) return;
    GemmExArgs u = g;
    u.epilogue = GemmEpilogue::none;
    if (g.epilogue == GemmEpilogue::gelu_aux_bias) {
      if (g.bias != nullptr) u.epilogue = GemmEpilogue::bias;
      u.C = g.aux;
      u.ldc = g.ld_aux;
    }
    plain_gemm_ex(s, l, u);
    launch_gelu_epilogue(l, g.c_type, g.epilogue == GemmEpilogue::dgelu, g.M, g.N, g.aux, g.ld_aux,
                         g.C, g.ldc);
  }

  void add_bias(Stream& s, float* y, const float* bias, i64 rows, i64 cols) override {
    if (rows <= 0 || cols <= 0) return;
    Launch l(backend_, s, "add_bias");
    const int bx = std::min(blocks_for(cols), 64);
    const auto by = static_cast<unsigned>(std::min<i64>(rows, std::max<i64>(1, kMaxBlocks / bx)));
    add_bias_kernel<<<dim3(static_cast<unsigned>(bx), by), kThreads, 0, l.get()>>>(y, bias, rows,
                                                                                   cols);
    l.check();
  }

  void sum_rows(Stream& s, const float* x, i64 rows, i64 cols, float beta, float* out,
                Determinism mode) override {
    if (cols <= 0) return;
    Launch l(backend_, s, "sum_rows");
    launch_sum_rows(l, x, rows, cols, RowsOut{out, DType::f32, Out::store, 1.0f, beta}, mode);
  }

  bool has_sum_rows_ex(DType x_type, DType out_type, Determinism) const override {
    return typed_sum_rows_supported(x_type, out_type);
  }

  // sum_rows on the stored x, out rounded once into out_type (Note [CUDA row sums]).
  void sum_rows_ex(Stream& s, const void* x, DType x_type, i64 rows, i64 cols, float beta,
                   void* out, DType out_type, Determinism mode) override {
    if (cols <= 0) return;
    Launch l(backend_, s, "sum_rows_ex");
    with_storage(x_type, [&](auto e) {
      using X = decltype(e);
      launch_sum_rows(l, static_cast<const X*>(x), rows, cols,
                      RowsOut{out, out_type, Out::store, 1.0f, beta}, mode);
    });
  }

  void relu(Stream& s, const float* x, float* y, i64 n) override {
    if (n <= 0) return;
    Launch l(backend_, s, "relu");
    relu_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, y, n);
    l.check();
  }

  void relu_backward(Stream& s, const float* y, const float* gy, float* gx, i64 n) override {
    if (n <= 0) return;
    Launch l(backend_, s, "relu_backward");
    relu_backward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(y, gy, gx, n);
    l.check();
  }

  void cross_entropy(Stream& s, const float* logits, const i64* targets, i64 rows, i64 classes,
                     float* losses) override {
    if (rows <= 0) return;
    Launch l(backend_, s, "cross_entropy");
    launch_cross_entropy(l, logits, targets, rows, classes, losses);
  }

  void cross_entropy_backward(Stream& s, const float* logits, const i64* targets, i64 rows,
                              i64 classes, const float* grad_loss, float scale,
                              float* grad_logits) override {
    if (rows <= 0 || classes <= 0) return;
    Launch l(backend_, s, "cross_entropy_backward");
    launch_cross_entropy_backward(l, logits, targets, rows, classes, grad_loss, scale,
                                  grad_logits);
  }

  void mse(Stream& s, const float* x, const float* t, i64 rows, i64 cols, float* losses) override {
    if (rows <= 0) return;
    Launch l(backend_, s, "mse");
    mse_kernel<<<blocks_for(rows, 128), 128, 0, l.get()>>>(x, t, rows, cols, losses);
    l.check();
  }

  void mse_backward(Stream& s, const float* x, const float* t, i64 n, const float* grad_loss,
                    float scale, float* gx) override {
    if (n <= 0) return;
    Launch l(backend_, s, "mse_backward");
    mse_backward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, t, n, grad_loss, scale, gx);
    l.check();
  }

  void sum(Stream& s, const float* x, i64 n, float scale, float* out, Determinism mode) override {
    Launch l(backend_, s, "sum");
    if (mode == Determinism::bitwise)
      sum_bitwise_kernel<<<1, kThreads, 0, l.get()>>>(x, std::max<i64>(n, 0), scale, out);
    else
      sum_fast_kernel<<<1, kSumThreads, 0, l.get()>>>(x, std::max<i64>(n, 0), scale, out);
    l.check();
  }

  void fill_f32(Stream& s, float* x, float value, i64 n) override {
    if (n <= 0) return;
    Launch l(backend_, s, "fill_f32");
    fill_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, value, n);
    l.check();
  }

  void axpy(Stream& s, float alpha, const float* x, float* y, i64 n) override {
    if (n <= 0) return;
    Launch l(backend_, s, "axpy");
    axpy_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(alpha, x, y, n);
    l.check();
  }

  void scale(Stream& s, float alpha, float* x, i64 n) override {
    if (n <= 0) return;
    Launch l(backend_, s, "scale");
    scale_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(alpha, x, n);
    l.check();
  }

  // Both modes use the canonical tree: it is memory-bound, so the fixed order costs nothing.
  void sum_inputs(Stream& s, const float* const* inputs, int n_inputs, float* out, i64 numel,
                  Determinism /*mode*/) override {
    if (numel <= 0) return;
    Launch l(backend_, s, "sum_inputs");
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
    Launch l(backend_, s, "sgd_step");
    sgd_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(param, grad, momentum_buf, n, lr, momentum,
                                                        dampening, weight_decay, nesterov,
                                                        first_step);
    l.check();
  }

  void gemm_tn_sharded(Stream& s, i64 M, i64 N, const float* A, i64 lda, const float* B, i64 ldb,
                       const std::vector<i64>& bounds, float* C, i64 ldc,
                       bool accumulate) override {
    if (M <= 0 || N <= 0) return;
    Launch l(backend_, s, "gemm_tn_sharded");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 ld, Out mode, float /*scale*/) {
      const GemmArgs g{M, N, A, lda, B, ldb, d, ld, 1.0f, 0.0f, mode};
      launch_gemm_sharded(l, g, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo));
    };
    shard_tree(l, 0, shards, M, N, C, ldc, accumulate ? Out::accumulate : Out::store, 1.0f, leaf);
  }

  bool has_gemm_tn_sharded_ex(DType a_type, DType b_type, DType c_type) const override {
    return typed_sharded_gemm_supported(a_type, b_type, c_type);
  }

  // The canonical sharded kernel loading A and B in their storage dtype (Note [CUDA canonical
  // GEMM]); the tree's inner nodes past kShardCap shards stay f32 scratch (as MixedOp's f32
  // path), only the root is rounded into C's dtype.
  void gemm_tn_sharded_ex(Stream& s, i64 M, i64 N, const void* A, DType a_type, i64 lda,
                          const void* B, DType /*b_type: a_type*/, i64 ldb,
                          const std::vector<i64>& bounds, void* C, DType c_type, i64 ldc,
                          bool accumulate) override {
    if (M <= 0 || N <= 0) return;
    Launch l(backend_, s, "gemm_tn_sharded_ex");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    const Out out = accumulate ? Out::accumulate : Out::store;
    if (shards <= kShardCap) {
      GemmArgs g{M, N, A, lda, B, ldb, C, ldc, 1.0f, 0.0f, out};
      g.c_type = c_type;
      launch_gemm_sharded(l, g, shard_bounds(bounds, 0, shards), static_cast<int>(shards), a_type);
      return;
    }
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 ld, Out mode, float /*scale*/) {
      const GemmArgs g{M, N, A, lda, B, ldb, d, ld, 1.0f, 0.0f, mode};
      launch_gemm_sharded(l, g, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo), a_type);
    };
    const i64 mid = tree_mid(0, shards);
    DeviceTemp left(l, M * N), right(l, M * N);
    shard_tree(l, 0, mid, M, N, left.get(), N, Out::store, 1.0f, leaf);
    shard_tree(l, mid, shards, M, N, right.get(), N, Out::store, 1.0f, leaf);
    launch_combine_typed(l, M, N, left.get(), right.get(), C, c_type, ldc, out);
  }

  void sum_rows_sharded(Stream& s, const float* x, i64 /*rows*/, i64 cols,
                        const std::vector<i64>& bounds, float* out, bool accumulate) override {
    if (cols <= 0) return;
    Launch l(backend_, s, "sum_rows_sharded");
    launch_sum_rows_sharded(l, x, cols, bounds, out, DType::f32, accumulate);
  }

  // sum_rows_sharded on the stored x, out rounded once into out_type (Note [CUDA row sums]).
  void sum_rows_sharded_ex(Stream& s, const void* x, DType x_type, i64 /*rows*/, i64 cols,
                           const std::vector<i64>& bounds, void* out, DType out_type,
                           bool accumulate) override {
    if (cols <= 0) return;
    Launch l(backend_, s, "sum_rows_sharded_ex");
    with_storage(x_type, [&](auto e) {
      using X = decltype(e);
      launch_sum_rows_sharded(l, static_cast<const X*>(x), cols, bounds, out, out_type,
                              accumulate);
    });
  }

  void sum_sharded(Stream& s, const float* x, const std::vector<i64>& bounds, float scale,
                   float* out) override {
    Launch l(backend_, s, "sum_sharded");
    const auto shards = static_cast<i64>(bounds.size()) - 1;
    auto leaf = [&](i64 lo, i64 hi, float* d, i64 /*ld*/, Out mode, float sc) {
      sum_sharded_kernel<<<1, kShardSumThreads, 0, l.get()>>>(x, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo), d, mode, sc);
      l.check();
    };
    shard_tree(l, 0, shards, 1, 1, out, 1, Out::scale, scale, leaf);
  }

  void adam_step(Stream& s, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, i64 n, double lr, double beta1, double beta2, double eps,
                 double weight_decay, double bias_correction1, double bias_correction2,
                 bool amsgrad) override {
    if (n <= 0) return;
    Launch l(backend_, s, "adam_step");
    const cm::AdamScalars k = cm::adam_scalars(lr, beta1, beta2, eps, weight_decay,
                                               bias_correction1, bias_correction2, amsgrad);
    adam_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(param, grad, exp_avg, exp_avg_sq,
                                                         max_exp_avg_sq, n, k);
    l.check();
  }

 private:
  // g on cuBLASLt: true where fast mode and blaslt_gemm takes it; else false, nothing enqueued.
  bool lt_gemm_ex(Stream& s, const Launch& l, const GemmExArgs& g) {
    return g.mode == Determinism::fast &&
           blaslt_gemm(as_cuda(s, "gemm_ex"), g, lt_use_tf32(g.a_type, backend_.allow_tf32()),
                       l.where());
  }
  // g with no epilogue or the bias: on cuBLASLt where it takes it, else the canonical GEMM.
  void plain_gemm_ex(Stream& s, const Launch& l, const GemmExArgs& g) {
    if (lt_gemm_ex(s, l, g)) return;
    GemmArgs k{g.M, g.N, g.A, g.lda, g.B, g.ldb, g.C, g.ldc, g.alpha, g.beta, Out::store};
    k.c_type = g.c_type;
    k.bias = g.epilogue == GemmEpilogue::bias ? g.bias : nullptr;
    launch_gemm(l, g.trans_a, g.trans_b, k, g.K, g.a_type);
  }

  mutable std::once_flag gelu_probed_;  // has_gemm_gelu_epilogue's probe, once per backend
  mutable bool gelu_tanh_ = false;      // and its answer
};

}  // namespace

namespace kern {

// d[r, c] = out(d, left + right) for [rows, cols] d (row stride ld) and contiguous left/right:
// one node of the host-side canonical tree (shard_tree, sum_inputs_tree).
namespace {

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

}  // namespace

void launch_combine(const Launch& l, i64 rows, i64 cols, const float* left, const float* right,
                    float* d, i64 ld, Out mode, float scale) {
  combine_kernel<<<blocks_for(rows * cols), kThreads, 0, l.get()>>>(rows, cols, left, right, d,
                                                                     ld, mode, scale);
  l.check();
}

}  // namespace kern

std::unique_ptr<Kernels> make_cuda_kernels(CudaBackend& backend) {
  return std::make_unique<CudaKernels>(backend);
}

}  // namespace ditto::cuda
