// The CUDA communicator's device kernel (cuda_comm_kernels.h): element i of N sources reduced in
// the canonical tree over the source index (Note [Canonical tree]) and written to every
// destination. The in-GPU transport runs it once per rank on the rank's slice of the ranks'
// buffers; the NCCL path of bitwise mode runs it on the slices NCCL delivered (Note [CUDA
// collectives] in cuda_communicator.cpp).
//
// The per-element arithmetic is the simulator's (sim_communicator.cpp: combine, tree_reduce, avg
// as a division by N) written with the rounded primitives of core/numerics/canonical_math.h, so the bits
// equal the simulator's in both determinism modes. For up to 8 sources the tree is unrolled at
// compile time; above, it is evaluated with a small stack (tree_runtime). 16-byte aligned buffers
// are processed four floats (two i64) per thread and load.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend_cuda/cuda_comm_kernels.h"
#include "core/numerics/canonical_math.h"
#include "core/numerics/determinism.h"

namespace ditto::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride beyond; several ranks' kernels share one GPU
// Entries of tree_runtime's stack: at most popcount(q + 1) + 1 <= 11 for q < kCommMaxPointers.
constexpr int kStackDepth = 12;

/// tree_mid (core/numerics/determinism.h) for compile-time trees; the static_asserts tie them together.
__host__ __device__ constexpr int ct_tree_mid(int lo, int hi) {
  int n = hi - lo, p = 1;
  while (p * 2 < n) p *= 2;
  return lo + p;
}
static_assert(ct_tree_mid(0, 2) == tree_mid(0, 2) && ct_tree_mid(0, 3) == tree_mid(0, 3) &&
              ct_tree_mid(0, 5) == tree_mid(0, 5) && ct_tree_mid(0, 8) == tree_mid(0, 8) &&
              ct_tree_mid(3, 10) == tree_mid(3, 10) && ct_tree_mid(4, 7) == tree_mid(4, 7));

/// The ranks' pointers, passed by value as a kernel parameter (Cap 1024: 16 KiB, within the
/// 32 KiB parameter limit of CUDA 12.1+ on sm_70 and later).
template <int Cap>
struct Table {
  const void* src[Cap];
  void* dst[Cap];
};

/// W consecutive elements of one buffer.
template <typename T, int W>
struct Pack {
  T v[W];
};

// ---- element combine: the simulator's (sim_communicator.cpp, combine) ------------------------

__device__ __forceinline__ float combine1(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return canonical::add(a, b);
    case ReduceOp::prod: return canonical::mul(a, b);
    case ReduceOp::min: return (b < a || b != b) ? b : a;  // NaN propagates
    case ReduceOp::max: return (b > a || b != b) ? b : a;
  }
  return a;
}

__device__ __forceinline__ long long combine1(long long a, long long b, ReduceOp op) {
  // Wraps like two's complement hardware (no signed overflow).
  const auto ua = static_cast<unsigned long long>(a), ub = static_cast<unsigned long long>(b);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return static_cast<long long>(ua + ub);
    case ReduceOp::prod: return static_cast<long long>(ua * ub);
    case ReduceOp::min: return b < a ? b : a;  // std::min
    case ReduceOp::max: return a < b ? b : a;  // std::max
  }
  return a;
}

template <typename T, int W>
__device__ __forceinline__ Pack<T, W> combine(const Pack<T, W>& a, const Pack<T, W>& b,
                                              ReduceOp op) {
  Pack<T, W> r;
#pragma unroll
  for (int k = 0; k < W; ++k) r.v[k] = combine1(a.v[k], b.v[k], op);
  return r;
}

// ---- loads and stores of unit u (elements [u * W, u * W + W)) -----------------------------------

template <typename T, int W>
__device__ __forceinline__ Pack<T, W> load(const void* base, std::int64_t u) {
  Pack<T, W> p;
  if constexpr (W == 1) {
    p.v[0] = static_cast<const T*>(base)[u];
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(W == 4);
    const float4 x = static_cast<const float4*>(base)[u];
    p.v[0] = x.x;
    p.v[1] = x.y;
    p.v[2] = x.z;
    p.v[3] = x.w;
  } else {
    static_assert(W == 2);
    const longlong2 x = static_cast<const longlong2*>(base)[u];
    p.v[0] = x.x;
    p.v[1] = x.y;
  }
  return p;
}

template <typename T, int W>
__device__ __forceinline__ void store(void* base, std::int64_t u, const Pack<T, W>& p) {
  if constexpr (W == 1) {
    static_cast<T*>(base)[u] = p.v[0];
  } else if constexpr (std::is_same_v<T, float>) {
    static_cast<float4*>(base)[u] = make_float4(p.v[0], p.v[1], p.v[2], p.v[3]);
  } else {
    static_cast<longlong2*>(base)[u] = make_longlong2(p.v[0], p.v[1]);
  }
}

// ---- the canonical tree over sources [Lo, Hi) (Note [Canonical tree]) ---------------------------

/// Compile-time tree: sum(lo, hi) = sum(lo, mid) + sum(mid, hi), a leaf is the source itself.
template <typename T, int W, int Cap, int Lo, int Hi>
__device__ __forceinline__ Pack<T, W> tree_static(const Table<Cap>& t, std::int64_t u,
                                                  ReduceOp op) {
  if constexpr (Hi - Lo == 1) {
    return load<T, W>(t.src[Lo], u);
  } else {
    constexpr int kMid = ct_tree_mid(Lo, Hi);
    const Pack<T, W> a = tree_static<T, W, Cap, Lo, kMid>(t, u, op);
    const Pack<T, W> b = tree_static<T, W, Cap, kMid, Hi>(t, u, op);
    return combine(a, b, op);
  }
}

/// The same tree for a run-time n, evaluated left to right with a stack (the binary counter of
/// Note [Streaming canonical tree], here for every op and for i64). After leaf q the stack
/// holds the complete power-of-two blocks of [0, q + 1) (binary counting: leaf q closes one block
/// per trailing one bit of q, each combined as left op right, i.e. the pairwise tree of that
/// block). At the end the blocks, largest first, are the canonical tree's left spines:
/// tree(lo, hi) = block(lo, lo + p) op tree(lo + p, hi), p the largest power of two below
/// hi - lo (or both halves of a power of two), so they are combined right to left.
template <typename T, int W, int Cap>
__device__ __forceinline__ Pack<T, W> tree_runtime(const Table<Cap>& t, int n, std::int64_t u,
                                                   ReduceOp op) {
  Pack<T, W> stack[kStackDepth];
  int top = 0;
  for (int q = 0; q < n; ++q) {
    Pack<T, W> v = load<T, W>(t.src[q], u);
    for (int merges = __ffs(~q) - 1; merges > 0; --merges) v = combine(stack[--top], v, op);
    stack[top++] = v;
  }
  Pack<T, W> acc = stack[top - 1];
  for (int k = top - 2; k >= 0; --k) acc = combine(stack[k], acc, op);
  return acc;
}

/// Reduction of unit u over the n sources, then the division of avg (f32).
template <typename T, int W, int Cap, int kN>
__device__ __forceinline__ Pack<T, W> reduce_unit(const Table<Cap>& t, int n, std::int64_t u,
                                                  ReduceOp op) {
  Pack<T, W> v;
  if constexpr (kN > 0)
    v = tree_static<T, W, Cap, 0, kN>(t, u, op);
  else
    v = tree_runtime<T, W, Cap>(t, n, u, op);
  if constexpr (std::is_same_v<T, float>) {
    if (op == ReduceOp::avg) {
      const float d = static_cast<float>(n);
#pragma unroll
      for (int k = 0; k < W; ++k) v.v[k] = canonical::div(v.v[k], d);
    }
  }
  return v;
}

/// dst[d][unit u] = v for d < n_dst. Small tables are indexed with constants only (a run-time
/// index into a small kernel-parameter array makes nvcc copy the table to local memory).
template <typename T, int W, int Cap>
__device__ __forceinline__ void store_all(const Table<Cap>& t, int n_dst, std::int64_t u,
                                          const Pack<T, W>& v) {
  if constexpr (Cap <= 8) {
#pragma unroll
    for (int d = 0; d < Cap; ++d)
      if (d < n_dst) store<T, W>(t.dst[d], u, v);
  } else {
    for (int d = 0; d < n_dst; ++d) store<T, W>(t.dst[d], u, v);
  }
}

/// kN: the number of sources when known at compile time (1..8), else 0 (n_src at run time).
template <typename T, int W, int Cap, int kN>
__global__ void __launch_bounds__(kThreads)
    comm_reduce_kernel(Table<Cap> t, int n_src, int n_dst, std::int64_t len, ReduceOp op) {
  const std::int64_t units = len / W;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t u = first; u < units; u += stride) {
    store_all<T, W, Cap>(t, n_dst, u, reduce_unit<T, W, Cap, kN>(t, n_src, u, op));
  }
  if constexpr (W > 1) {  // the last len % W elements, one per thread
    const std::int64_t i = units * W + first;
    if (i < len) {
      store_all<T, 1, Cap>(t, n_dst, i, reduce_unit<T, 1, Cap, kN>(t, n_src, i, op));
    }
  }
}

template <typename T, int W, int Cap, int kN>
cudaError_t launch(cudaStream_t stream, const std::vector<const void*>& srcs,
                   const std::vector<void*>& dsts, std::int64_t len, ReduceOp op) {
  Table<Cap> t{};
  std::copy(srcs.begin(), srcs.end(), t.src);
  std::copy(dsts.begin(), dsts.end(), t.dst);
  const std::int64_t units = std::max<std::int64_t>(len / W, 1);
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>((units + kThreads - 1) / kThreads, kMaxBlocks));
  comm_reduce_kernel<T, W, Cap, kN><<<blocks, kThreads, 0, stream>>>(
      t, static_cast<int>(srcs.size()), static_cast<int>(dsts.size()), len, op);
  return cudaGetLastError();
}

template <typename T, int W>
cudaError_t dispatch(cudaStream_t stream, const std::vector<const void*>& srcs,
                     const std::vector<void*>& dsts, std::int64_t len, ReduceOp op) {
  const std::size_t n = srcs.size(), most = std::max(srcs.size(), dsts.size());
  if (most <= 8) {
    switch (n) {
      case 1: return launch<T, W, 8, 1>(stream, srcs, dsts, len, op);
      case 2: return launch<T, W, 8, 2>(stream, srcs, dsts, len, op);
      case 3: return launch<T, W, 8, 3>(stream, srcs, dsts, len, op);
      case 4: return launch<T, W, 8, 4>(stream, srcs, dsts, len, op);
      case 5: return launch<T, W, 8, 5>(stream, srcs, dsts, len, op);
      case 6: return launch<T, W, 8, 6>(stream, srcs, dsts, len, op);
      case 7: return launch<T, W, 8, 7>(stream, srcs, dsts, len, op);
      default: return launch<T, W, 8, 8>(stream, srcs, dsts, len, op);
    }
  }
  if (most <= 32)
    return n == 1 ? launch<T, W, 32, 1>(stream, srcs, dsts, len, op)
                  : launch<T, W, 32, 0>(stream, srcs, dsts, len, op);
  return n == 1 ? launch<T, W, kCommMaxPointers, 1>(stream, srcs, dsts, len, op)
                : launch<T, W, kCommMaxPointers, 0>(stream, srcs, dsts, len, op);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_comm_reduce(cudaStream_t stream, const std::vector<const void*>& srcs,
                               const std::vector<void*>& dsts, std::int64_t len, DType dtype,
                               ReduceOp op) {
  if (len <= 0 || dsts.empty()) return cudaSuccess;
  if (srcs.empty() || srcs.size() > static_cast<std::size_t>(kCommMaxPointers) ||
      dsts.size() > static_cast<std::size_t>(kCommMaxPointers))
    return cudaErrorInvalidValue;
  const bool vec = std::all_of(srcs.begin(), srcs.end(), aligned16) &&
                   std::all_of(dsts.begin(), dsts.end(), [](void* p) { return aligned16(p); });
  if (dtype == DType::f32)
    return vec ? dispatch<float, 4>(stream, srcs, dsts, len, op)
               : dispatch<float, 1>(stream, srcs, dsts, len, op);
  return vec ? dispatch<long long, 2>(stream, srcs, dsts, len, op)
             : dispatch<long long, 1>(stream, srcs, dsts, len, op);
}

}  // namespace ditto::cuda
