// Internal: what the CUDA backend's kernel files (cuda_kernels.cu, cuda_gemm.cu, cuda_kernels_gpt.cu,
// cuda_attention.cu, cuda_fused.cu, cuda_kernels_dtype.cu) share: launch configuration, how a reduction's
// result lands (Out), the GEMM's tile constants and arguments, the Launch scope of a call,
// stream-ordered scratch memory from
// the backend (DeviceTemp), the host recursion of the canonical tree over shards (shard_tree) and
// the classes of the dtype-generic kernels (CudaDtypeKernels) and the transformer kernels
// (CudaGptKernels). Included only by .cu files (and, rewritten, by the CPU emulator,
// tools/cuda_emu).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_stream.h"
#include "core/numerics/canonical_math.h"
#include "core/numerics/canonical_tree.h"
#include "core/numerics/determinism.h"
#include "core/numerics/float_formats.h"

namespace ditto::cuda::kern {

namespace cm = canonical;
using i64 = std::int64_t;

// ---- launch configuration ----------------------------------------------------------------------

constexpr int kThreads = 256;        // block size of the simple kernels
constexpr i64 kMaxBlocks = 16384;    // grid-stride kernels never launch more blocks than this

inline int blocks_for(i64 n, int threads = kThreads) {
  return static_cast<int>(std::clamp<i64>((n + threads - 1) / threads, 1, kMaxBlocks));
}

__device__ __forceinline__ i64 global_thread() {
  return static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ i64 grid_threads() { return static_cast<i64>(gridDim.x) * blockDim.x; }

// Fast-mode block reduction (any order): the sum of every thread's `acc` over a block of
// blockDim.x threads (a multiple of 32, at most 1024) of one dimension, valid in thread 0. Every
// thread of the block calls it.
__device__ __forceinline__ float block_sum_any_order(float acc) {
  __shared__ float warp_sums[32];
  for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    acc = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
  }
  return acc;
}

// The canonical tree (Note [Canonical tree]) over leaves[0..n), n >= 1, in one thread, streamed
// through a canonical::TreeStack of Depth >= tree_stack_depth(n) entries.
template <int Depth>
__device__ __forceinline__ float tree_over(const float* leaves, i64 n) {
  cm::TreeStack<1, Depth> tree;
  float v[1];
  for (i64 l = 0; l < n; ++l) {
    v[0] = leaves[l];
    tree.push(l, v);
  }
  tree.result(v);
  return v[0];
}

// The canonical tree over leaves[0..n), n >= 1, by the blockDim.x threads of a block (a power of
// two; every thread calls it; `scratch` is blockDim.x floats of shared memory), valid in thread 0.
// Thread t folds the aligned run of leaves [t L, (t + 1) L) cut at n, L the least power of two
// with L x blockDim.x >= n, with tree_over; the runs are then paired bottom-up (stride h = 1, 2,
// 4, ...: run t = add(run t, run t + h) where run t + h has leaves). An aligned power-of-two run
// cut at n is a node of the canonical tree, so each add is one of its nodes, left + right: the bits
// of tree_over over all n leaves in one thread (Note [Streaming canonical tree]), with ~n /
// blockDim.x + log2(blockDim.x) dependent adds instead of n.
template <int Depth>
__device__ __forceinline__ float block_tree_over(const float* leaves, i64 n, float* scratch) {
  const i64 threads = blockDim.x;
  i64 run = 1;
  while (run * threads < n) run *= 2;
  const i64 runs = (n + run - 1) / run;  // runs with leaves, <= blockDim.x
  const i64 t = threadIdx.x;
  float v = 0.0f;
  if (t < runs) v = tree_over<Depth>(leaves + t * run, n - t * run < run ? n - t * run : run);
  scratch[t] = v;
  __syncthreads();
  for (i64 h = 1; h < runs; h *= 2) {
    if (t % (2 * h) == 0 && t + h < runs) scratch[t] = cm::add(scratch[t], scratch[t + h]);
    __syncthreads();
  }
  return scratch[0];
}

// ---- storage-dtype elements (the typed row kernels, Kernels::*_ex; cuda_fused.cu) ---------------
// E is float, bfloat16 or float16 (ditto's bit containers, core/numerics/float_formats.h):
// ld_elem widens element i to f32 (exact: the simulator's cast), st_elem rounds v once into E
// (round to nearest even, the simulator's cast); for float both are plain accesses.
template <class E>
__device__ __forceinline__ float ld_elem(const E* p, i64 i) {
  if constexpr (std::is_same_v<E, float>)
    return p[i];
  else
    return p[i].to_float();
}
template <class E>
__device__ __forceinline__ void st_elem(E* p, i64 i, float v) {
  if constexpr (std::is_same_v<E, float>)
    p[i] = v;
  else
    p[i] = E::from(v);
}

// The same for an element whose dtype t (f32, bf16, f16) is known at run time (the typed GEMM's
// C and bias, the typed attention's outputs).
__device__ __forceinline__ float ld_elem(const void* p, DType t, i64 i) {
  if (t == DType::bf16) return ld_elem(static_cast<const bfloat16*>(p), i);
  if (t == DType::f16) return ld_elem(static_cast<const float16*>(p), i);
  return ld_elem(static_cast<const float*>(p), i);
}
__device__ __forceinline__ void st_elem(void* p, DType t, i64 i, float v) {
  if (t == DType::bf16)
    st_elem(static_cast<bfloat16*>(p), i, v);
  else if (t == DType::f16)
    st_elem(static_cast<float16*>(p), i, v);
  else
    st_elem(static_cast<float*>(p), i, v);
}

// Elements of E in one 16-byte access (4 floats, 8 bf16 / f16).
template <class E>
inline constexpr int kVec = static_cast<int>(16 / sizeof(E));

// r = the kVec<E> elements at p (16-byte aligned), widened; little endian: element 2j in the low
// half of word j.
template <class E>
__device__ __forceinline__ void ld_vec(const E* p, float (&r)[kVec<E>]) {
  if constexpr (std::is_same_v<E, float>) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      r[2 * j] = E{static_cast<std::uint16_t>(w[j] & 0xffffu)}.to_float();
      r[2 * j + 1] = E{static_cast<std::uint16_t>(w[j] >> 16)}.to_float();
    }
  }
}
// The kVec<E> elements at p (16-byte aligned) = r, each rounded once into E.
template <class E>
__device__ __forceinline__ void st_vec(E* p, const float (&r)[kVec<E>]) {
  if constexpr (std::is_same_v<E, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
  } else {
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      w[j] = static_cast<unsigned>(E::from(r[2 * j]).bits) |
             (static_cast<unsigned>(E::from(r[2 * j + 1]).bits) << 16);
    uint4 v;
    v.x = w[0], v.y = w[1], v.z = w[2], v.w = w[3];
    *reinterpret_cast<uint4*>(p) = v;
  }
}

// Runs f(E{}) with E the storage type of dtype t: bfloat16 for bf16, float16 for f16 (the
// typed row kernels' dtypes; core checked has_rows_ex).
template <class F>
void with_storage(DType t, const F& f) {
  if (t == DType::bf16)
    f(bfloat16{});
  else
    f(float16{});
}

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

// ---- GEMM tiles (Note [CUDA canonical GEMM], cuda_gemm.cu) ------------------------------------

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

// A and B hold elements of the kernel's storage type (f32, bf16 or f16: its template argument;
// the sharded kernel: f32), C elements of c_type (f32, bf16, f16).
struct GemmArgs {
  i64 M, N;
  const void* A;
  i64 lda;
  const void* B;
  i64 ldb;
  void* C;
  i64 ldc;
  float alpha, beta;  // plain GEMM: canonical::gemm_epilogue
  Out out;            // sharded GEMM: store or accumulate
  DType c_type = DType::f32;    // plain GEMM: each result rounded once into it
  const void* bias = nullptr;   // plain GEMM: c_type[N]; then C = round(C + bias[n]) (gemm_ex)
};

// ---- host side -------------------------------------------------------------------------------

// The stream a call runs on, with its GPU made current for the scope.
class Launch {
 public:
  Launch(CudaBackend& backend, Stream& s, const char* name)
      : backend_(backend), stream_(as_cuda(s, name)), guard_(stream_.physical_device()),
        name_(name) {}

  cudaStream_t get() const { return stream_.get(); }
  CudaBackend& backend() const { return backend_; }
  /// The logical device (the backend's index) of the stream.
  int device() const { return stream_.device().index; }
  /// "cuda:3 (GPU 0) gemm": how errors name the call.
  std::string where() const {
    return stream_.device().str() + " (GPU " + std::to_string(stream_.physical_device()) + ") " +
           name_;
  }
  /// Throws BackendError when the last launch failed.
  void check() const { DITTO_CUDA_CHECK(cudaGetLastError(), where()); }
  /// The stream's kStreamSemaphores counters, zero between its kernels (CudaStream::semaphores).
  unsigned* semaphores() const { return stream_.semaphores(); }

 private:
  CudaBackend& backend_;
  CudaStream& stream_;
  DeviceGuard guard_;
  const char* name_;
};

// Scratch memory for the intermediate nodes of the host-side trees, from the backend's allocator
// ordered on the launch's stream (CudaBackend::allocate_on: memory_stats counts it, a request
// past the capacity is OutOfMemory), freed on that stream after the nodes' last use.
class DeviceTemp {
 public:
  DeviceTemp(const Launch& l, i64 floats)
      : backend_(l.backend()),
        device_(l.device()),
        stream_(l.get()),
        bytes_(static_cast<std::size_t>(std::max<i64>(floats, 1)) * sizeof(float)),
        ptr_(static_cast<float*>(backend_.allocate_on(device_, bytes_, stream_))) {}
  ~DeviceTemp() { backend_.deallocate_on(device_, ptr_, bytes_, stream_); }
  DeviceTemp(const DeviceTemp&) = delete;
  DeviceTemp& operator=(const DeviceTemp&) = delete;
  float* get() const { return ptr_; }

 private:
  CudaBackend& backend_;
  const int device_;
  const cudaStream_t stream_;
  const std::size_t bytes_;
  float* const ptr_;
};

inline ShardBounds shard_bounds(const std::vector<i64>& bounds, i64 lo, i64 hi) {
  ShardBounds sb{};
  for (i64 i = lo; i <= hi; ++i) sb.b[i - lo] = bounds[static_cast<std::size_t>(i)];
  return sb;
}

/// d[r, c] = out(d, left + right) for a [rows, cols] d (row stride ld) and contiguous left/right:
/// one node of the host-side canonical tree (shard_tree), on the launch's stream.
void launch_combine(const Launch& l, i64 rows, i64 cols, const float* left, const float* right,
                    float* d, i64 ld, Out mode, float scale);

/// The canonical tree over shards [lo, hi) of a reduction into the [rows, cols] destination d
/// (row stride ld), finished with `mode`: one launch (leaf(lo, hi, d, ld, mode, scale)) for at
/// most kShardCap shards, else the split of Note [Canonical tree] with both halves in scratch
/// memory and one launch_combine.
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
  launch_combine(l, rows, cols, left.get(), right.get(), d, ld, mode, scale);
}

/// C = gemm_epilogue(chain over k = 0..K-1, alpha, beta, C) with op(A), op(B) by trans_a,
/// trans_b: ditto's canonical GEMM (cuda_gemm.cu), on the launch's stream. A and B hold
/// `ab_type` elements (f32, bf16 or f16), widened to f32 as loaded; each result is rounded once
/// into g.c_type, then with g.bias: C = round(C + bias[n]) (Kernels::gemm_ex's bitwise bits).
void launch_gemm(const Launch& l, bool trans_a, bool trans_b, const GemmArgs& g, i64 K,
                 DType ab_type = DType::f32);
/// The sharded dW = dY^T X of `shards` (<= kShardCap) shards of rows `sb` into g.C with g.out,
/// A and B of `ab_type` (f32, bf16 or f16, widened as loaded), each result rounded once into
/// g.c_type (gemm_tn_sharded_ex; f32: gemm_tn_sharded's bits).
void launch_gemm_sharded(const Launch& l, const GemmArgs& g, const ShardBounds& sb, int shards,
                         DType ab_type = DType::f32);
/// d = round_t(out(d, left + right)) for a [rows, cols] d of dtype t (f32, bf16, f16; row stride
/// ld) and contiguous f32 left / right: launch_combine for a typed root (cuda_gemm.cu).
void launch_combine_typed(const Launch& l, i64 rows, i64 cols, const float* left,
                          const float* right, void* d, DType t, i64 ld, Out mode);

/// Kernels::gemm_ex's GELU epilogues where cuBLASLt does not take them (cuda_fused.cu), after the
/// unfused GEMM: over row-major [M, N] matrices of dtype t (f32, bf16, f16), c = gelu(aux)
/// (gelu_aux_bias: aux holds the GEMM with its bias), or with `backward` c = gelu_grad(aux, c)
/// (dgelu: c holds the GEMM's product): gelu_forward(_ex)'s and gelu_backward(_ex)'s element
/// functions (gpt::gelu, gelu_grad), each result rounded once into t, so the bits of the GEMM
/// followed by those kernels.
void launch_gelu_epilogue(const Launch& l, DType t, bool backward, i64 M, i64 N, const void* aux,
                          i64 ld_aux, void* c, i64 ldc);

/// Kernels::cross_entropy and cross_entropy_backward (cuda_fused.cu): a warp per row, the
/// operation order of canonical::softmax_stats, cross_entropy_loss and cross_entropy_grad.
void launch_cross_entropy(const Launch& l, const float* logits, const i64* targets, i64 rows,
                          i64 classes, float* losses);
void launch_cross_entropy_backward(const Launch& l, const float* logits, const i64* targets,
                                   i64 rows, i64 classes, const float* grad_loss, float scale,
                                   float* grad_logits);


// ---- the dtype-generic kernels (cuda_kernels_dtype.cu) ------------------------------------------------

/// The Kernels entries on any DType (cast, fill_bits, add_any, scale_any, reduce_inputs), defined
/// in cuda_kernels_dtype.cu with the per-element functions the simulator uses (dtype_math.h,
/// reduce_math.h); it holds backend_ for the classes derived from it (CudaGptKernels,
/// CudaKernels).
class CudaDtypeKernels : public Kernels {
 public:
  explicit CudaDtypeKernels(CudaBackend& backend) : backend_(backend) {}

  void cast(Stream& s, const void* x, DType from, void* y, DType to, i64 n) override;
  void fill_bits(Stream& s, void* x, std::size_t elem_size, std::uint64_t bits,
                 i64 n) override;
  void add_any(Stream& s, DType t, const void* a, const void* b, void* out, i64 n) override;
  void scale_any(Stream& s, DType t, void* x, double alpha, i64 n) override;
  void reduce_inputs(Stream& s, DType t, const void* const* inputs, int n_inputs, void* out,
                     i64 numel, int op, Determinism mode) override;

 protected:
  CudaBackend& backend_;
};

// ---- the transformer kernels (cuda_kernels_gpt.cu, cuda_fused.cu) ---------------------------------------------------

/// The Kernels entries of the GPT (embedding, LayerNorm, GELU, attention, dropout, sum of
/// squares) and the multi-tensor kernels, defined in cuda_kernels_gpt.cu, cuda_attention.cu and
/// cuda_fused.cu with the operation order of core/numerics/gpt_math.h; the CudaKernels of
/// cuda_kernels.cu derives from it and adds the rest.
class CudaGptKernels : public CudaDtypeKernels {
 public:
  explicit CudaGptKernels(CudaBackend& backend) : CudaDtypeKernels(backend) {}

  void embedding_forward(Stream& s, const i64* idx, const float* wte, const float* wpe, i64 N,
                         i64 T, i64 C, float* out) override;
  void embedding_backward(Stream& s, const i64* idx, const float* dy, i64 N, i64 C, i64 V,
                          const std::vector<i64>& bounds, float* grad_wte,
                          bool accumulate) override;
  void layernorm_forward(Stream& s, const float* x, const float* w, const float* b, i64 N, i64 C,
                         float eps, float* y, float* mean, float* rstd) override;
  void layernorm_backward(Stream& s, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, i64 N, i64 C, float* dx,
                          float* dy_xhat) override;
  void gelu_forward(Stream& s, const float* x, float* y, i64 n) override;
  void gelu_backward(Stream& s, const float* x, const float* gy, float* gx, i64 n) override;
  // The attention pair is defined in cuda_attention.cu (Note [CUDA attention]).
  void attention_forward(Stream& s, const float* qkv, i64 B, i64 T, i64 C, i64 nh, float* y,
                         float* stats, float p, std::uint64_t seed, std::uint64_t stream,
                         std::uint64_t index_base, Determinism mode) override;
  void attention_backward(Stream& s, const float* dy, const float* qkv, const float* y,
                          const float* stats, i64 B, i64 T, i64 C, i64 nh, float* dqkv,
                          float* scratch, float p, std::uint64_t seed, std::uint64_t stream,
                          std::uint64_t index_base, Determinism mode) override;
  // The typed attention (bf16 / f16 in storage; fast: the tensor cores), also cuda_attention.cu.
  bool has_attention_ex(DType qkv_type, i64 head_dim, Determinism mode) const override;
  void attention_forward_ex(Stream& s, const void* qkv, DType dtype, i64 B, i64 T, i64 C, i64 nh,
                            void* y, float* stats, float p, std::uint64_t seed,
                            std::uint64_t stream, std::uint64_t index_base,
                            Determinism mode) override;
  void attention_backward_ex(Stream& s, const void* dy, const void* qkv, const void* y,
                             DType dtype, const float* stats, i64 B, i64 T, i64 C, i64 nh, void* dqkv,
                             float* scratch, float p, std::uint64_t seed, std::uint64_t stream,
                             std::uint64_t index_base, Determinism mode) override;
  void dropout_forward(Stream& s, const float* x, float* y, i64 n, float p, std::uint64_t seed,
                       std::uint64_t stream, std::uint64_t index_base) override;
  void dropout_backward(Stream& s, const float* gy, float* gx, i64 n, float p, std::uint64_t seed,
                        std::uint64_t stream, std::uint64_t index_base) override;
  void sum_squares(Stream& s, const float* x, i64 n, float* out, Determinism mode) override;
  void sum_squares_blocks(Stream& s, const float* x, i64 n, float* out) override;

  // The typed row kernels (cuda_fused.cu; dropout: cuda_kernels_gpt.cu): bf16 and f16, both
  // modes (Note [CUDA fused kernels]).
  bool has_rows_ex(DType storage, Determinism) const override {
    return storage == DType::bf16 || storage == DType::f16;
  }
  void embedding_forward_ex(Stream& s, DType dtype, const i64* idx, const void* wte,
                            const void* wpe, i64 N, i64 T, i64 C, void* out) override;
  void embedding_backward_ex(Stream& s, DType dtype, const i64* idx, const void* dy, i64 N, i64 C,
                             i64 V, const std::vector<i64>& bounds, DType grad_type,
                             void* grad_wte, bool accumulate) override;
  void layernorm_forward_ex(Stream& s, DType dtype, const void* x, const void* w, const void* b,
                            i64 N, i64 C, float eps, void* y, float* mean, float* rstd) override;
  void layernorm_backward_ex(Stream& s, DType dtype, const void* dy, const void* x, const void* w,
                             const float* mean, const float* rstd, i64 N, i64 C, void* dx,
                             void* dy_xhat) override;
  // The residual add before the LayerNorm forward, in its kernel (cuda_fused.cu): f32, bf16, f16.
  bool has_layernorm_forward_add(DType dtype) const override {
    return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
  }
  void layernorm_forward_add(Stream& s, DType dtype, const void* x, const void* branch,
                             const void* w, const void* b, i64 N, i64 C, float eps, void* residual,
                             void* y, float* mean, float* rstd) override;
  // The residual gradient's add in the LayerNorm backward's store (cuda_fused.cu): f32, bf16, f16.
  bool has_layernorm_backward_add(DType dtype) const override {
    return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
  }
  void layernorm_backward_add(Stream& s, DType dtype, const void* dy, const void* x, const void* w,
                              const float* mean, const float* rstd, const void* residual, i64 N,
                              i64 C, void* out, void* dy_xhat) override;
  // The LayerNorm backward with its parameter gradients in the same launch (cuda_fused.cu, Note
  // [CUDA LayerNorm parameter gradients]): f32, bf16, f16, fast mode only.
  bool has_layernorm_backward_params(DType dtype, Determinism mode) const override {
    return mode == Determinism::fast &&
           (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }
  void layernorm_backward_params(Stream& s, DType dtype, const void* dy, const void* x,
                                 const void* w, const float* mean, const float* rstd,
                                 const void* residual, i64 N, i64 C, void* dx, DType grad_type,
                                 void* grad_w, bool accumulate_w, void* grad_b,
                                 bool accumulate_b) override;
  // The softmax cross-entropy's forward and backward in one pass, the gradient over the logits
  // (cuda_fused.cu, llm.c's fused_classifier): f32, bf16, f16, fast mode only.
  bool has_cross_entropy_fused(DType dtype, Determinism mode) const override {
    return mode == Determinism::fast &&
           (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }
  void cross_entropy_fused(Stream& s, DType dtype, void* logits, const i64* targets, i64 rows,
                           i64 classes, const float* grad_loss, float scale,
                           float* losses) override;
  void gelu_forward_ex(Stream& s, DType dtype, const void* x, void* y, i64 n) override;
  void gelu_backward_ex(Stream& s, DType dtype, const void* x, const void* gy, void* gx,
                        i64 n) override;
  void cross_entropy_ex(Stream& s, DType dtype, const void* logits, const i64* targets, i64 rows,
                        i64 classes, float* losses) override;
  void cross_entropy_backward_ex(Stream& s, DType dtype, const void* logits, const i64* targets,
                                 i64 rows, i64 classes, const float* grad_loss, float scale,
                                 void* grad_logits) override;
  void dropout_forward_ex(Stream& s, DType dtype, const void* x, void* y, i64 n, float p,
                          std::uint64_t seed, std::uint64_t stream,
                          std::uint64_t index_base) override;
  void dropout_backward_ex(Stream& s, DType dtype, const void* gy, void* gx, i64 n, float p,
                           std::uint64_t seed, std::uint64_t stream,
                           std::uint64_t index_base) override;

  // The multi-tensor kernels (cuda_multi_tensor.cu, Note [CUDA fused kernels]).
  bool has_multi_tensor_kernels() const override { return true; }
  void adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr, double beta1,
                       double beta2, double eps, double weight_decay, bool amsgrad) override;
  void sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                         const std::vector<i64>& ns, float* out, Determinism mode) override;
  void scale_multi(Stream& s, const std::vector<float*>& xs, const std::vector<i64>& ns,
                   float alpha) override;
  void fill_multi(Stream& s, const std::vector<float*>& xs, const std::vector<i64>& ns,
                  float value) override;
  void copy_multi(Stream& s, DType from, DType to, const std::vector<const void*>& srcs,
                  const std::vector<void*>& dsts, const std::vector<i64>& ns) override;
  // Typed (Note [Typed optimizer step], core/optim/master_weights.h): gradients of any float
  // dtype widened as loaded, the model's weights written in AdamW's launch; adam_step_multi and
  // sum_squares_multi are these with f32 gradients (one kernel each).
  bool has_multi_tensor_ex(DType t) const override {
    return t == DType::f32 || t == DType::bf16 || t == DType::f16;
  }
  void adam_step_multi_ex(Stream& s, const std::vector<AdamTensorEx>& tensors, double lr,
                          double beta1, double beta2, double eps, double weight_decay, bool amsgrad,
                          bool scale_grads, float grad_scale) override;
  void sum_squares_multi_ex(Stream& s, const std::vector<const void*>& xs,
                            const std::vector<DType>& types, const std::vector<i64>& ns, float* out,
                            Determinism mode) override;
};

}  // namespace ditto::cuda::kern
