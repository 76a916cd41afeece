// The CUDA backend's transformer kernels (CudaGptKernels, cuda_kernels_common.cuh): embedding,
// LayerNorm, GELU, dropout and the sum of squares of the GPT (core/nn/gpt.h); its causal
// self-attention is in cuda_attention.cu (Note [CUDA attention]). Each thread runs one of
// core/numerics/gpt_math.h's row-level functions (one token row, one element), so every chain
// has the simulator's operation order (Note [GPT kernels]) and the results equal backend_sim's
// bit for bit in both modes; only sum_squares has a fast path (any order). ctest CudaEmu.Kernels
// runs these on the CPU against the simulator (tools/cuda_emu/test_emu_gpt.cpp).
//
// Note [CUDA GPT kernels]
// Parallelism is over independent chains only: rows of LayerNorm and the embedding, vocabulary
// elements (v, c) of the embedding gradient. The attention is tiled through shared memory over
// (batch, head, query tile) and (batch, head, key tile), bitwise in the simulator's order or
// fast as a flash attention (Note [CUDA attention] in cuda_attention.cu).
// The embedding gradient walks each (v, c)'s shards in order into a canonical::TreeStack (Note
// [Streaming canonical tree]), at most kShardCap shards per launch, the host recursion of the
// canonical tree (shard_tree) above that; a shard where v is absent gives +0, as in the
// simulator. sum_squares (bitwise) writes one chain per kSquaresBlock block to scratch and one
// thread folds the blocks with the same tree. The per-thread loops are memory-bound and not
// tuned: the GPT's GEMMs (nn::Linear) carry its cost.
#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/gpt_math.h"

namespace ditto::cuda::kern {

namespace {

// ---- embedding ---------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(const i64* idx, const float* wte, const float* wpe, i64 N,
                                         i64 T, i64 C, float* out) {
  for (i64 r = global_thread(); r < N; r += grid_threads())
    gpt::embedding_row(wte + idx[r] * C, wpe != nullptr ? wpe + (r % T) * C : nullptr, C,
                       out + r * C);
}

// One thread per (v, c) of the [V, C] destination (row stride ld): shards ascending, each a
// chain over its rows r with idx[r] == v, into the tree; finished with `mode`.
__global__ void embedding_backward_kernel(const i64* idx, const float* dy, i64 C, i64 V,
                                          const __grid_constant__ ShardBounds bounds, int shards,
                                          float* d, i64 ld, Out mode) {
  for (i64 i = global_thread(); i < V * C; i += grid_threads()) {
    const i64 v = i / C, c = i % C;
    cm::TreeStack<1, kShardDepth> tree;
    float x[1];
    for (int s = 0; s < shards; ++s) {
      float acc = 0.0f;
      for (i64 r = bounds.b[s]; r < bounds.b[s + 1]; ++r)
        if (idx[r] == v) acc = cm::add(acc, dy[r * C + c]);
      x[0] = acc;
      tree.push(s, x);
    }
    tree.result(x);
    float* di = d + v * ld + c;
    *di = finish(mode, x[0], mode == Out::accumulate ? *di : 0.0f, 1.0f);
  }
}

// ---- LayerNorm, GELU ---------------------------------------------------------------------------

__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b, i64 N,
                                         i64 C, float eps, float* y, float* mean, float* rstd) {
  for (i64 r = global_thread(); r < N; r += grid_threads())
    gpt::layernorm_row(x + r * C, w, b, C, eps, y + r * C, mean + r, rstd + r);
}

__global__ void layernorm_backward_kernel(const float* dy, const float* x, const float* w,
                                          const float* mean, const float* rstd, i64 N, i64 C,
                                          float* dx, float* dy_xhat) {
  for (i64 r = global_thread(); r < N; r += grid_threads())
    gpt::layernorm_row_backward(dy + r * C, x + r * C, w, mean[r], rstd[r], C, dx + r * C,
                                dy_xhat + r * C);
}

__global__ void gelu_forward_kernel(const float* x, float* y, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = gpt::gelu(x[i]);
}

__global__ void gelu_backward_kernel(const float* x, const float* gy, float* gx, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) gx[i] = gpt::gelu_grad(x[i], gy[i]);
}

// ---- dropout (Note [Dropout masks]) ------------------------------------------------------------

__global__ void dropout_kernel(const float* x, float* y, i64 n, float p, float scale,
                               std::uint64_t seed, std::uint64_t stream, std::uint64_t base) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const bool kept = gpt::dropout_keep(seed, stream, base + static_cast<std::uint64_t>(i), p);
    y[i] = gpt::dropout_apply(kept, x[i], scale);
  }
}

// ---- sum of squares ----------------------------------------------------------------------------

constexpr int kSquaresDepth = 40;  // tree entries: enough for 2^40 blocks
constexpr int kSquaresThreads = 256;

// partial[j] = the chain over block j (bitwise leaves).
__global__ void squares_blocks_kernel(const float* x, i64 n, i64 blocks, float* partial) {
  for (i64 j = global_thread(); j < blocks; j += grid_threads()) {
    const i64 lo = j * gpt::kSquaresBlock;
    const i64 len = n - lo < gpt::kSquaresBlock ? n - lo : gpt::kSquaresBlock;
    partial[j] = gpt::squares_chain(x + lo, len);
  }
}

// *out = canonical tree over partial[0..blocks), blocks >= 1 (one thread).
__global__ void squares_tree_kernel(const float* partial, i64 blocks, float* out) {
  *out = tree_over<kSquaresDepth>(partial, blocks);
}

// Fast: one block, strided fma partials, a tree over the block (any order).
__global__ void __launch_bounds__(kSquaresThreads) squares_fast_kernel(const float* x, i64 n,
                                                                       float* out) {
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < n; i += blockDim.x) acc = cm::fma(x[i], x[i], acc);
  acc = block_sum_any_order(acc);
  if (threadIdx.x == 0) *out = acc;
}

// One launch of dropout_kernel (forward: x -> y; backward: gy -> gx, the same mask).
void launch_dropout(const Launch& l, const float* in, float* out, i64 n, float p,
                    std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base) {
  dropout_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(in, out, n, p, gpt::dropout_scale(p),
                                                          seed, stream, index_base);
  l.check();
}

}  // namespace

// ---- CudaGptKernels ----------------------------------------------------------------------------

void CudaGptKernels::embedding_forward(Stream& s, const i64* idx, const float* wte,
                                       const float* wpe, i64 N, i64 T, i64 C, float* out) {
  if (N <= 0 || C <= 0) return;
  Launch l(backend_, s, "embedding_forward");
  embedding_forward_kernel<<<blocks_for(N, 128), 128, 0, l.get()>>>(idx, wte, wpe, N, T, C, out);
  l.check();
}

void CudaGptKernels::embedding_backward(Stream& s, const i64* idx, const float* dy, i64 /*N*/,
                                        i64 C, i64 V, const std::vector<i64>& bounds,
                                        float* grad_wte, bool accumulate) {
  if (V <= 0 || C <= 0) return;
  Launch l(backend_, s, "embedding_backward");
  const auto shards = static_cast<i64>(bounds.size()) - 1;
  auto leaf = [&](i64 lo, i64 hi, float* d, i64 ld, Out mode, float /*scale*/) {
    embedding_backward_kernel<<<blocks_for(V * C), kThreads, 0, l.get()>>>(
        idx, dy, C, V, shard_bounds(bounds, lo, hi), static_cast<int>(hi - lo), d, ld, mode);
    l.check();
  };
  shard_tree(l, 0, shards, V, C, grad_wte, C, accumulate ? Out::accumulate : Out::store, 1.0f,
             leaf);
}

void CudaGptKernels::layernorm_forward(Stream& s, const float* x, const float* w, const float* b,
                                       i64 N, i64 C, float eps, float* y, float* mean,
                                       float* rstd) {
  if (N <= 0) return;
  Launch l(backend_, s, "layernorm_forward");
  layernorm_forward_kernel<<<blocks_for(N, 128), 128, 0, l.get()>>>(x, w, b, N, C, eps, y, mean,
                                                                     rstd);
  l.check();
}

void CudaGptKernels::layernorm_backward(Stream& s, const float* dy, const float* x,
                                        const float* w, const float* mean, const float* rstd,
                                        i64 N, i64 C, float* dx, float* dy_xhat) {
  if (N <= 0) return;
  Launch l(backend_, s, "layernorm_backward");
  layernorm_backward_kernel<<<blocks_for(N, 128), 128, 0, l.get()>>>(dy, x, w, mean, rstd, N, C,
                                                                      dx, dy_xhat);
  l.check();
}

void CudaGptKernels::gelu_forward(Stream& s, const float* x, float* y, i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "gelu_forward");
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, y, n);
  l.check();
}

void CudaGptKernels::gelu_backward(Stream& s, const float* x, const float* gy, float* gx, i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "gelu_backward");
  gelu_backward_kernel<<<blocks_for(n), kThreads, 0, l.get()>>>(x, gy, gx, n);
  l.check();
}

void CudaGptKernels::dropout_forward(Stream& s, const float* x, float* y, i64 n, float p,
                                     std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t index_base) {
  if (n <= 0) return;
  launch_dropout(Launch(backend_, s, "dropout_forward"), x, y, n, p, seed, stream, index_base);
}

void CudaGptKernels::dropout_backward(Stream& s, const float* gy, float* gx, i64 n, float p,
                                      std::uint64_t seed, std::uint64_t stream,
                                      std::uint64_t index_base) {
  if (n <= 0) return;
  launch_dropout(Launch(backend_, s, "dropout_backward"), gy, gx, n, p, seed, stream, index_base);
}

void CudaGptKernels::sum_squares(Stream& s, const float* x, i64 n, float* out, Determinism mode) {
  Launch l(backend_, s, "sum_squares");
  n = std::max<i64>(n, 0);
  if (mode == Determinism::fast) {
    squares_fast_kernel<<<1, kSquaresThreads, 0, l.get()>>>(x, n, out);
    l.check();
    return;
  }
  const i64 blocks = std::max<i64>(gpt::squares_blocks(n), 1);  // n == 0: one empty chain, +0
  DeviceTemp partial(l, blocks);
  squares_blocks_kernel<<<blocks_for(blocks, 128), 128, 0, l.get()>>>(x, n, blocks,
                                                                      partial.get());
  l.check();
  squares_tree_kernel<<<1, 1, 0, l.get()>>>(partial.get(), blocks, out);
  l.check();
}

// ZeRO's leaves (Note [ZeRO grad clip]): out[j] = the chain over block j, one launch (the base
// Kernels::sum_squares_blocks made a sum_squares per block).
void CudaGptKernels::sum_squares_blocks(Stream& s, const float* x, i64 n, float* out) {
  const i64 blocks = gpt::squares_blocks(std::max<i64>(n, 0));
  if (blocks == 0) return;
  Launch l(backend_, s, "sum_squares_blocks");
  squares_blocks_kernel<<<blocks_for(blocks, 128), 128, 0, l.get()>>>(x, n, blocks, out);
  l.check();
}

}  // namespace ditto::cuda::kern
