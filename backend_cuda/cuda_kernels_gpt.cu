// The CUDA backend's transformer kernels (CudaGptKernels, cuda_kernels_common.cuh): dropout and
// the sum of squares of the GPT (core/nn/gpt.h); its causal self-attention is in
// cuda_attention.cu (Note [CUDA attention]), the embedding, LayerNorm, GELU and the multi-tensor
// kernels in cuda_fused.cu (Note [CUDA fused kernels]). Each thread runs one of
// core/numerics/gpt_math.h's element functions, so every chain has the simulator's operation order
// (Note [GPT kernels]) and the results equal backend_sim's bit for bit in both modes; only
// sum_squares has a fast path (any order). ctest CudaEmu.Kernels runs these on the CPU against the
// simulator (tools/cuda_emu/test_emu_gpt.cpp).
//
// Note [CUDA GPT kernels]
// Parallelism is over independent chains only. sum_squares (bitwise) writes one chain per
// kSquaresBlock block to scratch and one block folds them with the same tree (block_tree_over:
// aligned runs of leaves per thread, then paired in shared memory); its fast path reduces in any
// order.
#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/gpt_math.h"

namespace ditto::cuda::kern {

namespace {

// ---- dropout (Note [Dropout masks]) ------------------------------------------------------------

// E: the storage type of x and y (float; bfloat16 / float16 for dropout_*_ex), widened as
// loaded, rounded once on store.
template <class E>
__global__ void dropout_kernel(const E* x, E* y, i64 n, float p, float scale, std::uint64_t seed,
                               std::uint64_t stream, std::uint64_t base) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) {
    const bool kept = gpt::dropout_keep(seed, stream, base + static_cast<std::uint64_t>(i), p);
    st_elem(y, i, gpt::dropout_apply(kept, ld_elem(x, i), scale));
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

constexpr int kSquaresTreeThreads = 256;  // threads of the tree over the leaves (a power of two)

// *out = canonical tree over partial[0..blocks), blocks >= 1 (one block: block_tree_over).
__global__ void __launch_bounds__(kSquaresTreeThreads) squares_tree_kernel(const float* partial,
                                                                           i64 blocks, float* out) {
  __shared__ float scratch[kSquaresTreeThreads];
  const float v = block_tree_over<kSquaresDepth>(partial, blocks, scratch);
  if (threadIdx.x == 0) *out = v;
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
template <class E>
void launch_dropout(const Launch& l, const E* in, E* out, i64 n, float p, std::uint64_t seed,
                    std::uint64_t stream, std::uint64_t index_base) {
  dropout_kernel<E><<<blocks_for(n), kThreads, 0, l.get()>>>(in, out, n, p, gpt::dropout_scale(p), seed, stream, index_base);
  l.check();
}

// dropout_forward_ex / dropout_backward_ex (the same kernel) on dtype's storage type.
void launch_dropout_ex(const Launch& l, DType dtype, const void* in, void* out, i64 n, float p,
                       std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base) {
  with_storage(dtype, [&](auto e) {
    using E = decltype(e);
    launch_dropout(l, static_cast<const E*>(in), static_cast<E*>(out), n, p, seed, stream,
                   index_base);
  });
}

}  // namespace

// ---- CudaGptKernels ----------------------------------------------------------------------------

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

void CudaGptKernels::dropout_forward_ex(Stream& s, DType dtype, const void* x, void* y, i64 n,
                                        float p, std::uint64_t seed, std::uint64_t stream,
                                        std::uint64_t index_base) {
  if (n <= 0) return;
  launch_dropout_ex(Launch(backend_, s, "dropout_forward_ex"), dtype, x, y, n, p, seed, stream,
                    index_base);
}

void CudaGptKernels::dropout_backward_ex(Stream& s, DType dtype, const void* gy, void* gx, i64 n,
                                         float p, std::uint64_t seed, std::uint64_t stream,
                                         std::uint64_t index_base) {
  if (n <= 0) return;
  launch_dropout_ex(Launch(backend_, s, "dropout_backward_ex"), dtype, gy, gx, n, p, seed, stream,
                    index_base);
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
  squares_tree_kernel<<<1, kSquaresTreeThreads, 0, l.get()>>>(partial.get(), blocks, out);
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
