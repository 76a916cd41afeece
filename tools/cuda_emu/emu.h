// CPU emulation of the few CUDA features backend_cuda/cuda_kernels.cu and cuda_comm_kernels.cu use
// (ctest CudaEmu.Kernels, CudaEmu.CommKernels):
// each CUDA thread of a block runs as a fiber (its own stack) on the launching host thread, blocks
// one after another (Note [Emulated threads]); __shared__ becomes a function static,
// __syncthreads a barrier of the block's fibers, warp shuffles a per-warp barrier.
// The CUDA runtime and cuBLAS calls and the backend classes are stubs (host memory is device
// memory).
#pragma once
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_host_logic.h"
#include "core/base/error.h"
#include "core/numerics/float_formats.h"
#include "core/runtime/backend.h"
#include "core/runtime/stream.h"

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_uint3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local emu_uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;

// Note [Emulated threads]
// A block's CUDA threads are fibers of the host thread that launches the kernel: each has its
// own stack (its locals and registers); one runs at a time, until it waits at a barrier or
// returns, then the scheduler runs the next. A barrier releases its waiters when the last of its
// threads arrives. The sweeps over the fibers alternate in direction (thread 0 first, then the
// last thread first; odd blocks start backwards), so a thread reading what another writes with
// no barrier between them reads it before the write in one sweep or the other: a missing
// __syncthreads fails the bitwise comparison every run instead of by luck of the OS scheduler
// (with the k-loop's __syncthreads of cuda_gemm.cu removed, 72 of the 241 `gemm` checks fail).
// A block whose threads all wait, but at different barriers (a __syncthreads that not every
// thread reaches), throws instead of hanging. A switch is a few registers and a stack pointer
// (emu_fiber.cpp) where a host thread per CUDA thread cost a futex wake and an OS context switch
// per thread per barrier: CudaEmu.Kernels went from 215 s of two cores to about 37 s of one
// under ASan (CI). Not modelled: threads running at the same time (a race that needs true
// parallelism, e.g. a torn read), warp-synchronous execution (kernels use __syncwarp or the
// shuffles), memory ordering between blocks (__threadfence is a no-op: a block sees all the
// writes of the blocks run before it). Blocks run in emu_block_order (forward unless a check
// asks for reversed or shuffled).
class EmuBarrier {
 public:
  explicit EmuBarrier(unsigned count) : count_(count) {}
  /// Waits (lets the other fibers run) until `count` fibers have arrived.
  void arrive_and_wait();

 private:
  friend class EmuFibers;
  unsigned count_, arrived_ = 0, phase_ = 0;
};

/// The fibers of one block at a time (Note [Emulated threads]); one per host thread.
class EmuFibers {
 public:
  EmuFibers() = default;
  EmuFibers(const EmuFibers&) = delete;
  EmuFibers& operator=(const EmuFibers&) = delete;
  ~EmuFibers();
  /// Runs body(i) as fiber i for i < n until every one has returned; before fiber i runs (and
  /// each time it resumes) enter(i) sets its thread's variables. `backward_first`: the first
  /// sweep starts at the last fiber. Rethrows what a fiber threw; throws std::runtime_error if
  /// the fibers wait at different barriers.
  void run(unsigned n, void (*enter)(unsigned, void*), void (*body)(unsigned, void*), void* ctx,
           bool backward_first);
  /// From a fiber: wait until b's phase has passed.
  void wait(EmuBarrier& b);

 private:
  struct Fiber;
  static void entry();
  void resume(unsigned i);
  void to_scheduler(bool dying);
  std::vector<Fiber*> fibers_;
  void* main_sp_ = nullptr;
  const void* main_bottom_ = nullptr;
  std::size_t main_size_ = 0;
  unsigned cur_ = 0;
  void (*body_)(unsigned, void*) = nullptr;
  void* ctx_ = nullptr;
  std::exception_ptr error_;
};
inline thread_local EmuFibers emu_fibers;
inline void EmuBarrier::arrive_and_wait() {
  if (++arrived_ == count_) {  // the last to arrive releases the others and goes on
    arrived_ = 0;
    ++phase_;
    return;
  }
  emu_fibers.wait(*this);
}

inline thread_local EmuBarrier* emu_bar = nullptr;
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
// Warp shuffles: lanes meet at their warp's barrier around a slot array (and the mma's
// fragments around theirs).
struct EmuWarp {
  explicit EmuWarp(unsigned lanes) : bar(lanes) {}
  EmuBarrier bar;
  float slot[32] = {};
  unsigned mma_a[32][4] = {}, mma_b[32][2] = {};
  float mma_c[32][4] = {};
};
inline thread_local EmuWarp* emu_warp = nullptr;
inline thread_local unsigned emu_lane = 0;
inline float __shfl_down_sync(unsigned, float v, int off) {
  emu_warp->slot[emu_lane] = v;
  emu_warp->bar.arrive_and_wait();
  const float r = emu_lane + off < 32 ? emu_warp->slot[emu_lane + off] : v;
  emu_warp->bar.arrive_and_wait();
  return r;
}

inline float __shfl_xor_sync(unsigned, float v, int mask) {
  emu_warp->slot[emu_lane] = v;
  emu_warp->bar.arrive_and_wait();
  const unsigned src = emu_lane ^ static_cast<unsigned>(mask);
  const float r = src < 32 ? emu_warp->slot[src] : v;
  emu_warp->bar.arrive_and_wait();
  return r;
}

// backend_cuda/cuda_mma.cuh's tensor-core product (Note [mma fragments] there):
// mma_m16n8k16<E>(d, a, b, c), E bfloat16 or float16, called by all 32 lanes of a warp. The
// lanes publish their a, b, c registers through the warp barrier; each gathers A [16x16], B
// [16x8] and C [16x8] from all 32 by the PTX fragment layout and computes its own four d
// elements: the products exact (of two 16-bit floats: 16 or 22 significant bits), summed with C
// in double, rounded once to f32. (The GPU's tensor cores sum in an unspecified order at least
// f32 precision; the fast attention's tolerance covers the difference.) Defining
// DITTO_EMU_MMA_SWAP_A12 swaps a[1] and a[2] in the gather: a wrong layout, which the
// attention checks must catch (Note [CUDA attention]).
#define DITTO_CUDA_EMU 1
template <class E>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                         const float (&c)[4]) {
  EmuWarp& w = *emu_warp;
  for (int i = 0; i < 4; ++i) w.mma_a[emu_lane][i] = a[i], w.mma_c[emu_lane][i] = c[i];
  w.mma_b[emu_lane][0] = b[0];
  w.mma_b[emu_lane][1] = b[1];
  w.bar.arrive_and_wait();
  const auto lo = [](unsigned r) {
    E e;
    e.bits = static_cast<std::uint16_t>(r & 0xffffu);
    return double(e.to_float());
  };
  const auto hi = [&](unsigned r) { return lo(r >> 16); };
  double A[16][16], B[16][8], C[16][8];
  for (unsigned L = 0; L < 32; ++L) {
    const unsigned g = L >> 2, t = L % 4;
#ifdef DITTO_EMU_MMA_SWAP_A12
    const unsigned a1 = w.mma_a[L][2], a2 = w.mma_a[L][1];
#else
    const unsigned a1 = w.mma_a[L][1], a2 = w.mma_a[L][2];
#endif
    A[g][2 * t] = lo(w.mma_a[L][0]), A[g][2 * t + 1] = hi(w.mma_a[L][0]);
    A[g + 8][2 * t] = lo(a1), A[g + 8][2 * t + 1] = hi(a1);
    A[g][2 * t + 8] = lo(a2), A[g][2 * t + 9] = hi(a2);
    A[g + 8][2 * t + 8] = lo(w.mma_a[L][3]), A[g + 8][2 * t + 9] = hi(w.mma_a[L][3]);
    B[2 * t][g] = lo(w.mma_b[L][0]), B[2 * t + 1][g] = hi(w.mma_b[L][0]);
    B[2 * t + 8][g] = lo(w.mma_b[L][1]), B[2 * t + 9][g] = hi(w.mma_b[L][1]);
    C[g][2 * t] = w.mma_c[L][0], C[g][2 * t + 1] = w.mma_c[L][1];
    C[g + 8][2 * t] = w.mma_c[L][2], C[g + 8][2 * t + 1] = w.mma_c[L][3];
  }
  const unsigned g = emu_lane >> 2, t = emu_lane % 4;
  const unsigned rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  float out[4];
  for (int e = 0; e < 4; ++e) {
    double acc = C[rows[e]][cols[e]];
    for (int k = 0; k < 16; ++k) acc += A[rows[e]][k] * B[k][cols[e]];
    out[e] = static_cast<float>(acc);
  }
  w.bar.arrive_and_wait();  // every lane has gathered before any publishes its next fragments
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// __syncwarp: the warp's lanes meet at its barrier (kernels call it warp-uniformly).
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp->bar.arrive_and_wait(); }
// Integer atomics (the embedding gradient's bucketing, the fast sum_rows' tickets): real atomics
// across the block's threads.
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
// Memory fences and L2 loads: blocks run one after another (emu_launch), so a block sees every
// write of the blocks before it; what matters is the order they run in (emu_block_order).
inline void __threadfence() {}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__
#define __launch_bounds__(...)

// convert<To> of core/numerics/float_formats.h as the GPU computes it (extract.py calls this for
// convert< in the kernel files): the same function, except that nvcc compiles its static_cast
// between f64 and f32 to PTX cvt.rn.f32.f64 / cvt.f64.f32, which return the canonical NaN
// (0x7fffffff, 0x7fffffffffffffff) for every NaN input, where x86 keeps sign and payload. A NaN
// crossing f64 <-> f32 (f64 <-> f16 / bf16 / fp8 goes through f32) comes out canonical, as on
// the GPU; kernels that must keep NaN bits handle NaN before converting (Note [CUDA NaN casts],
// backend_cuda/cuda_kernels_dtype.cu).
namespace ditto::cuda_emu {
template <class To, class From>
To emu_gpu_convert(From x) {
  constexpr bool to_f32 = std::is_same_v<To, float> || ditto::is_small_float_v<To>;
  constexpr bool from_f32 = std::is_same_v<From, float> || ditto::is_small_float_v<From>;
  if constexpr (std::is_same_v<From, double> && to_f32) {
    if (x != x) {
      const float canonical = std::bit_cast<float>(0x7fffffffu);
      if constexpr (std::is_same_v<To, float>)
        return canonical;
      else
        return To::from(canonical);
    }
  } else if constexpr (std::is_same_v<To, double> && from_f32) {
    float f;
    if constexpr (std::is_same_v<From, float>)
      f = x;
    else
      f = x.to_float();
    if (f != f) return std::bit_cast<double>(0x7fffffffffffffffull);
  }
  return ditto::convert<To>(x);
}
}  // namespace ditto::cuda_emu

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline int __ffs(int x) { return __builtin_ffs(x); }

using cudaError_t = int;
constexpr int cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotSupported = 801;
using cudaStream_t = void*;
inline int emu_allocs = 0;
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaMallocAsync(void** p, std::size_t n, cudaStream_t) {
  *p = std::malloc(n);
  ++emu_allocs;
  return 0;
}
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) {
  std::free(p);
  --emu_allocs;
  return 0;
}
inline cudaError_t cudaMalloc(void** p, std::size_t n) {
  *p = std::malloc(n);
  return 0;
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return 0;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return 0; }

using cublasHandle_t = void*;
using cublasStatus_t = int;
constexpr int CUBLAS_STATUS_SUCCESS = 0;
enum cublasOperation_t { CUBLAS_OP_N, CUBLAS_OP_T };
enum { CUBLAS_POINTER_MODE_HOST, CUBLAS_DEFAULT_MATH };
inline int cublasSetStream(cublasHandle_t, cudaStream_t) { return 0; }
inline int cublasSetPointerMode(cublasHandle_t, int) { return 0; }
inline int cublasSetMathMode(cublasHandle_t, int) { return 0; }
inline int cublasSgemm_64(cublasHandle_t, cublasOperation_t, cublasOperation_t, std::int64_t,
                          std::int64_t, std::int64_t, const float*, const float*, std::int64_t,
                          const float*, std::int64_t, const float*, float*, std::int64_t) {
  return 99;  // not emulated
}

#define DITTO_CUDA_CHECK(call, where)                                           \
  do {                                                                          \
    if ((call) != 0) throw std::runtime_error(std::string("cuda: ") + (where)); \
  } while (0)
#define DITTO_CUBLAS_CHECK(call, where)                                           \
  do {                                                                            \
    if ((call) != 0) throw std::runtime_error(std::string("cublas: ") + (where)); \
  } while (0)

namespace ditto::cuda_emu {  // not ditto::cuda: see extract.py
// backend_cuda/cublas_lazy.h's table (Note [Lazy cuBLAS]) over the stubs above.
struct CublasApi {
  decltype(&cublasSetStream) set_stream = cublasSetStream;
  decltype(&cublasSetPointerMode) set_pointer_mode = cublasSetPointerMode;
  decltype(&cublasSetMathMode) set_math_mode = cublasSetMathMode;
  decltype(&cublasSgemm_64) sgemm_64 = cublasSgemm_64;
};
inline const CublasApi& cublas_api() {
  static const CublasApi api;
  return api;
}
class DeviceGuard {
 public:
  explicit DeviceGuard(int) {}
};
class CudaStream final : public Stream {
 public:
  Device device() const override { return Device("cuda", 0); }
  void synchronize() override {}
  void record(Event&) override {}
  void wait(const Event&) override {}
  cudaStream_t get() const { return nullptr; }
  int physical_device() const { return 0; }
  cublasHandle_t cublas() { return nullptr; }
  // backend_cuda/cuda_stream.h's: kStreamSemaphores counters, zero between kernels.
  unsigned* semaphores() {
    if (sem.empty()) sem.assign(static_cast<std::size_t>(ditto::cuda::kStreamSemaphores), 0u);
    return sem.data();
  }
  std::vector<unsigned> sem;  // public: the checks read that kernels hand them back at zero
};
inline CudaStream& as_cuda(Stream& s, const char*) { return static_cast<CudaStream&>(s); }
// The typed GEMM's decisions and the fast row sums' split are the real backend's (pure host
// functions); cuBLASLt is not emulated: blaslt_gemm declines every call, so a fast-mode gemm_ex
// runs the canonical kernel, and its GELU epilogues the canonical kernel and the unfused GELU
// kernel (launch_gelu_epilogue; the probe of cuBLASLt's GELU says tanh, so fast mode asks for
// them).
using ditto::cuda::fast_row_chunks;
using ditto::cuda::gemm_gelu_epilogue_supported;
using ditto::cuda::kLnParamsGroup;
using ditto::cuda::kStreamSemaphores;
using ditto::cuda::layernorm_params_split;
using ditto::cuda::LnParamsSplit;
using ditto::cuda::lt_use_tf32;
using ditto::cuda::RowChunks;
using ditto::cuda::typed_gemm_supported;
using ditto::cuda::typed_sharded_gemm_supported;
using ditto::cuda::typed_sum_rows_supported;
inline bool blaslt_gemm(CudaStream&, const GemmExArgs&, bool, const std::string&) { return false; }
class CudaBackend {
 public:
  bool allow_tf32() const { return false; }
  void* allocate_on(int, std::size_t bytes, cudaStream_t s) {
    void* p = nullptr;
    cudaMallocAsync(&p, bytes, s);
    return p;
  }
  void deallocate_on(int, void* p, std::size_t, cudaStream_t s) noexcept { cudaFreeAsync(p, s); }
};
inline bool blaslt_gelu_epilogue_is_tanh(CudaBackend&) { return true; }
std::unique_ptr<Kernels> make_cuda_kernels(CudaBackend& backend);
}  // namespace ditto::cuda_emu

inline long emu_threads_launched = 0;

// The order emu_launch runs a grid's blocks in: forward (blockIdx.y, then x, ascending), reversed,
// or shuffled (a permutation drawn from emu_block_seed, which each launch advances). A GPU runs
// them in any order and at once: a kernel whose result may depend on which block finishes last
// (the fast sum_rows' ticket, Note [CUDA row sums]) is checked under several orders.
enum class EmuBlockOrder { forward, reversed, shuffled };
inline EmuBlockOrder emu_block_order = EmuBlockOrder::forward;
inline unsigned emu_block_seed = 1;

template <class... P, class... A>
void emu_launch(void (*k)(P...), dim3 grid, dim3 block, A&&... args) {
  std::vector<std::pair<unsigned, unsigned>> order;
  order.reserve(std::size_t{grid.x} * grid.y);
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) order.emplace_back(bx, by);
  if (emu_block_order == EmuBlockOrder::reversed) std::reverse(order.begin(), order.end());
  if (emu_block_order == EmuBlockOrder::shuffled)
    for (std::size_t i = order.size(); i > 1; --i) {  // Fisher-Yates over a 32-bit LCG
      emu_block_seed = emu_block_seed * 1664525u + 1013904223u;
      std::swap(order[i - 1], order[(emu_block_seed >> 8) % i]);
    }
  for (const auto& [bx, by] : order) {
    const unsigned n = block.x * block.y;
    EmuBarrier bar(n);
    std::vector<std::unique_ptr<EmuWarp>> warps;
    for (unsigned w = 0; w < n; w += 32)
      warps.push_back(std::make_unique<EmuWarp>(std::min(32u, n - w)));
    blockIdx = {bx, by, 0};
    blockDim = block;
    gridDim = grid;
    emu_bar = &bar;
    struct Ctx {
      std::vector<std::unique_ptr<EmuWarp>>& lanes;
      void (*k)(P...);
      std::tuple<A&...> args;
    } ctx{warps, k, std::forward_as_tuple(args...)};
    const auto enter = [](unsigned i, void* c) {
      emu_warp = static_cast<Ctx*>(c)->lanes[i / 32].get();
      emu_lane = i % 32;
      threadIdx = {i % blockDim.x, i / blockDim.x, 0};
    };
    const auto body = [](unsigned, void* c) {
      Ctx& x = *static_cast<Ctx*>(c);
      std::apply([&](auto&... a) { x.k(a...); }, x.args);
    };
    emu_fibers.run(n, enter, body, &ctx, (bx + by) % 2 == 1);
    emu_threads_launched += n;
  }
}
