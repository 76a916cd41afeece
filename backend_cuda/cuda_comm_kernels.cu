// The CUDA communicator's device kernel (cuda_comm_kernels.h): element i of N sources reduced in
// the canonical tree over the source index (Note [Canonical tree]) and written to every
// destination. The in-GPU transport runs it once per rank on the rank's slice of the ranks'
// buffers; the NCCL path of bitwise mode runs it on the slices NCCL delivered (Note [CUDA
// collectives] in cuda_communicator.cpp).
//
// The per-element arithmetic is core/numerics/reduce_math.h's (Note [Reductions over ranks]), the
// same DITTO_HD functions the simulator's collectives call: each source's element is loaded into
// the accumulator Acc<T> (times the source's scalar for premul_sum), the accumulators are combined
// in the canonical tree, and finish() divides for avg and rounds ONCE to T. So the bits equal the
// simulator's for every dtype and op (tools/cuda_emu/test_emu_comm.cpp checks it on the CPU).
// reduce_math.h writes plain a * s + b, so this file is compiled with --fmad=false
// (CMakeLists.txt, Note [CUDA floating-point flags]): nvcc may not fuse a premul_sum product and
// the following add into an fma that the host never does.
// On 16-byte aligned buffers (16 bytes per thread and load: 4 f32, 8 f16, 16 i8, ...) the tree of
// 1, 2, 4 or 8 sources is unrolled at compile time; other counts, and misaligned buffers (one
// element per load), evaluate the same tree with a small stack (tree_runtime).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend_cuda/cuda_comm_kernels.h"
#include "core/numerics/determinism.h"
#include "core/numerics/reduce_math.h"
#include "core/runtime/dtype.h"

namespace ditto::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride beyond; several ranks' kernels share one GPU
// Entries of tree_runtime's stack: at most popcount(q + 1) + 1 <= 11 for q < kCommMaxPointers.
constexpr int kStackDepth = 12;

static_assert(static_cast<int>(rmath::Op::premul_sum) == static_cast<int>(ReduceOp::premul_sum) &&
              static_cast<int>(rmath::Op::avg) == static_cast<int>(ReduceOp::avg) &&
              static_cast<int>(rmath::Op::min) == static_cast<int>(ReduceOp::min));

/// tree_mid (core/numerics/determinism.h) for compile-time trees; the static_asserts tie them
/// together.
__host__ __device__ constexpr int ct_tree_mid(int lo, int hi) {
  int n = hi - lo, p = 1;
  while (p * 2 < n) p *= 2;
  return lo + p;
}
static_assert(ct_tree_mid(0, 2) == tree_mid(0, 2) && ct_tree_mid(0, 3) == tree_mid(0, 3) &&
              ct_tree_mid(0, 5) == tree_mid(0, 5) && ct_tree_mid(0, 8) == tree_mid(0, 8) &&
              ct_tree_mid(3, 10) == tree_mid(3, 10) && ct_tree_mid(4, 7) == tree_mid(4, 7));

/// The ranks' pointers and premul_sum scalars (as the accumulator A), passed by value as a kernel
/// parameter (Cap 1024 with 8-byte scalars: 24 KiB, within the 32 KiB parameter limit of CUDA
/// 12.1+ on sm_70 and later).
template <int Cap, typename A>
struct Table {
  const void* src[Cap];
  void* dst[Cap];
  A scalar[Cap];
};

/// W consecutive elements of one buffer (or their accumulators).
template <typename T, int W>
struct Pack {
  T v[W];
};

template <typename A, int W>
__device__ __forceinline__ Pack<A, W> combine(const Pack<A, W>& a, const Pack<A, W>& b,
                                              rmath::Op op) {
  Pack<A, W> r;
#pragma unroll
  for (int k = 0; k < W; ++k) r.v[k] = rmath::combine(a.v[k], b.v[k], op);
  return r;
}

// ---- loads and stores of unit u (elements [u * W, u * W + W)) -----------------------------------
// W == 1: one element; else W elements of 16 bytes in one uint4 access.

/// Source q's unit u as accumulators (rmath::load_scaled: premul_sum multiplies by its scalar).
template <typename T, int W, int Cap>
__device__ __forceinline__ Pack<rmath::Acc<T>, W> load(const Table<Cap, rmath::Acc<T>>& t, int q,
                                                       std::int64_t u, rmath::Op op) {
  Pack<T, W> p;
  if constexpr (W == 1) {
    p.v[0] = static_cast<const T*>(t.src[q])[u];
  } else {
    static_assert(sizeof(T) * W == 16);
    const uint4 x = static_cast<const uint4*>(t.src[q])[u];
    std::memcpy(&p, &x, sizeof x);
  }
  Pack<rmath::Acc<T>, W> a;
#pragma unroll
  for (int k = 0; k < W; ++k) a.v[k] = rmath::load_scaled(p.v[k], op, t.scalar[q]);
  return a;
}

template <typename T, int W>
__device__ __forceinline__ void store(void* base, std::int64_t u, const Pack<T, W>& p) {
  if constexpr (W == 1) {
    static_cast<T*>(base)[u] = p.v[0];
  } else {
    uint4 x;
    std::memcpy(&x, &p, sizeof x);
    static_cast<uint4*>(base)[u] = x;
  }
}

// ---- the canonical tree over sources [Lo, Hi) (Note [Canonical tree]) ---------------------------

/// Compile-time tree: acc(lo, hi) = acc(lo, mid) op acc(mid, hi), a leaf is the loaded source.
template <typename T, int W, int Cap, int Lo, int Hi>
__device__ __forceinline__ Pack<rmath::Acc<T>, W> tree_static(const Table<Cap, rmath::Acc<T>>& t,
                                                              std::int64_t u, rmath::Op op) {
  if constexpr (Hi - Lo == 1) {
    return load<T, W, Cap>(t, Lo, u, op);
  } else {
    constexpr int kMid = ct_tree_mid(Lo, Hi);
    const auto a = tree_static<T, W, Cap, Lo, kMid>(t, u, op);
    const auto b = tree_static<T, W, Cap, kMid, Hi>(t, u, op);
    return combine(a, b, op);
  }
}

/// The same tree for a run-time n, evaluated left to right with a stack (the binary counter of
/// Note [Streaming canonical tree], here for every op and dtype). After leaf q the stack
/// holds the complete power-of-two blocks of [0, q + 1) (binary counting: leaf q closes one block
/// per trailing one bit of q, each combined as left op right, i.e. the pairwise tree of that
/// block). At the end the blocks, largest first, are the canonical tree's left spines:
/// tree(lo, hi) = block(lo, lo + p) op tree(lo + p, hi), p the largest power of two below
/// hi - lo (or both halves of a power of two), so they are combined right to left.
template <typename T, int W, int Cap>
__device__ __forceinline__ Pack<rmath::Acc<T>, W> tree_runtime(const Table<Cap, rmath::Acc<T>>& t,
                                                               int n, std::int64_t u,
                                                               rmath::Op op) {
  Pack<rmath::Acc<T>, W> stack[kStackDepth];
  int top = 0;
  for (int q = 0; q < n; ++q) {
    auto v = load<T, W, Cap>(t, q, u, op);
    for (int merges = __ffs(~q) - 1; merges > 0; --merges) v = combine(stack[--top], v, op);
    stack[top++] = v;
  }
  auto acc = stack[top - 1];
  for (int k = top - 2; k >= 0; --k) acc = combine(stack[k], acc, op);
  return acc;
}

/// Unit u reduced over the n sources and finished (avg's division, the one rounding to T).
template <typename T, int W, int Cap, int kN>
__device__ __forceinline__ Pack<T, W> reduce_unit(const Table<Cap, rmath::Acc<T>>& t, int n,
                                                  std::int64_t u, rmath::Op op) {
  Pack<rmath::Acc<T>, W> v;
  if constexpr (kN > 0)
    v = tree_static<T, W, Cap, 0, kN>(t, u, op);
  else
    v = tree_runtime<T, W, Cap>(t, n, u, op);
  Pack<T, W> r;
#pragma unroll
  for (int k = 0; k < W; ++k) r.v[k] = rmath::finish<T>(v.v[k], op, n);
  return r;
}

/// Unit u of source 0 as it is (a copy: no conversion, so every bit pattern, NaN payloads
/// included, moves unchanged).
template <typename T, int W, int Cap>
__device__ __forceinline__ Pack<T, W> copy_unit(const Table<Cap, rmath::Acc<T>>& t,
                                                std::int64_t u) {
  Pack<T, W> p;
  if constexpr (W == 1) {
    p.v[0] = static_cast<const T*>(t.src[0])[u];
  } else {
    const uint4 x = static_cast<const uint4*>(t.src[0])[u];
    std::memcpy(&p, &x, sizeof x);
  }
  return p;
}

/// dst[d][unit u] = v for d < n_dst. Small tables are indexed with constants only (a run-time
/// index into a small kernel-parameter array makes nvcc copy the table to local memory).
template <typename T, int W, int Cap, typename A>
__device__ __forceinline__ void store_all(const Table<Cap, A>& t, int n_dst, std::int64_t u,
                                          const Pack<T, W>& v) {
  if constexpr (Cap <= 8) {
#pragma unroll
    for (int d = 0; d < Cap; ++d)
      if (d < n_dst) store<T, W>(t.dst[d], u, v);
  } else {
    for (int d = 0; d < n_dst; ++d) store<T, W>(t.dst[d], u, v);
  }
}

/// Unit u (W elements) of the result, or element u when W is 1.
template <typename T, int W, int Cap, int kN>
__device__ __forceinline__ void do_unit(const Table<Cap, rmath::Acc<T>>& t, int n_src, int n_dst,
                                        std::int64_t u, rmath::Op op, bool copy) {
  if (copy)
    store_all<T, W, Cap>(t, n_dst, u, copy_unit<T, W, Cap>(t, u));
  else
    store_all<T, W, Cap>(t, n_dst, u, reduce_unit<T, W, Cap, kN>(t, n_src, u, op));
}

/// kN: the number of sources when known at compile time (1, 2, 4, 8), else 0 (n_src at run
/// time). copy: one source and no arithmetic (a copy of the bits).
template <typename T, int W, int Cap, int kN>
__global__ void __launch_bounds__(kThreads)
    comm_reduce_kernel(Table<Cap, rmath::Acc<T>> t, int n_src, int n_dst, std::int64_t len,
                       rmath::Op op, bool copy) {
  const std::int64_t units = len / W;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t u = first; u < units; u += stride)
    do_unit<T, W, Cap, kN>(t, n_src, n_dst, u, op, copy);
  if constexpr (W > 1) {  // the last len % W elements, one per thread
    const std::int64_t i = units * W + first;
    if (i < len) do_unit<T, 1, Cap, kN>(t, n_src, n_dst, i, op, copy);
  }
}

template <typename T, int W, int Cap, int kN>
cudaError_t launch(cudaStream_t stream, const std::vector<const void*>& srcs,
                   const std::vector<void*>& dsts, std::int64_t len, ReduceOp op,
                   const double* scalars) {
  Table<Cap, rmath::Acc<T>> t{};
  std::copy(srcs.begin(), srcs.end(), t.src);
  std::copy(dsts.begin(), dsts.end(), t.dst);
  for (std::size_t q = 0; q < srcs.size(); ++q)
    t.scalar[q] = rmath::scalar_as_acc<T>(scalars ? scalars[q] : 1.0);
  const bool copy = srcs.size() == 1 && op != ReduceOp::avg && op != ReduceOp::premul_sum;
  const std::int64_t units = std::max<std::int64_t>(len / W, 1);
  const auto blocks =
      static_cast<unsigned>(std::min<std::int64_t>((units + kThreads - 1) / kThreads, kMaxBlocks));
  comm_reduce_kernel<T, W, Cap, kN><<<blocks, kThreads, 0, stream>>>(
      t, static_cast<int>(srcs.size()), static_cast<int>(dsts.size()), len,
      static_cast<rmath::Op>(op), copy);
  return cudaGetLastError();
}

/// The launch for n sources. The 16-byte vector path unrolls the tree at compile time for 1, 2, 4
/// and 8 sources; other counts, more than 8 pointers and the misaligned path (W == 1, rare) use
/// the run-time tree (same order). Kept this small because every variant is compiled for all 12
/// dtypes (nvcc time).
template <typename T, int W>
cudaError_t dispatch(cudaStream_t stream, const std::vector<const void*>& srcs,
                     const std::vector<void*>& dsts, std::int64_t len, ReduceOp op,
                     const double* scalars) {
  const std::size_t n = srcs.size(), most = std::max(srcs.size(), dsts.size());
  if (most > 8) return launch<T, W, kCommMaxPointers, 0>(stream, srcs, dsts, len, op, scalars);
  if constexpr (W > 1) {
    switch (n) {
      case 1: return launch<T, W, 8, 1>(stream, srcs, dsts, len, op, scalars);
      case 2: return launch<T, W, 8, 2>(stream, srcs, dsts, len, op, scalars);
      case 4: return launch<T, W, 8, 4>(stream, srcs, dsts, len, op, scalars);
      case 8: return launch<T, W, 8, 8>(stream, srcs, dsts, len, op, scalars);
      default: break;
    }
  }
  return launch<T, W, 8, 0>(stream, srcs, dsts, len, op, scalars);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_comm_reduce(cudaStream_t stream, const std::vector<const void*>& srcs,
                               const std::vector<void*>& dsts, std::int64_t len, DType dtype,
                               ReduceOp op, const double* scalars) {
  if (len <= 0 || dsts.empty()) return cudaSuccess;
  if (srcs.empty() || srcs.size() > static_cast<std::size_t>(kCommMaxPointers) ||
      dsts.size() > static_cast<std::size_t>(kCommMaxPointers))
    return cudaErrorInvalidValue;
  const bool vec = std::all_of(srcs.begin(), srcs.end(), aligned16) &&
                   std::all_of(dsts.begin(), dsts.end(), [](void* p) { return aligned16(p); });
  return visit_dtype(dtype, [&](auto x) -> cudaError_t {
    using T = decltype(x);
    constexpr int kW = static_cast<int>(16 / sizeof(T));
    return vec ? dispatch<T, kW>(stream, srcs, dsts, len, op, scalars)
               : dispatch<T, 1>(stream, srcs, dsts, len, op, scalars);
  });
}

}  // namespace ditto::cuda
