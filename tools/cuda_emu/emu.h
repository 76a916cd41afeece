// CPU emulation of the few CUDA features backend_cuda/cuda_kernels.cu and cuda_comm_kernels.cu use
// (ctest CudaEmu.Kernels, CudaEmu.CommKernels):
// each CUDA thread of a block runs on a pooled host thread, blocks one after another; __shared__
// becomes a function static, __syncthreads a std::barrier, warp shuffles a per-warp barrier.
// The CUDA runtime and cuBLAS calls and the backend classes are stubs (host memory is device memory).
#pragma once
#include <atomic>
#include <barrier>
#include <bit>
#include <type_traits>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend_cuda/cuda_host_logic.h"
#include "core/numerics/float_formats.h"
#include "core/runtime/backend.h"
#include "core/runtime/error.h"
#include "core/runtime/stream.h"

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_uint3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local emu_uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
inline thread_local std::barrier<>* emu_bar = nullptr;
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
// Warp shuffles: lanes meet at their warp's barrier around a slot array.
struct EmuWarp {
  explicit EmuWarp(unsigned lanes) : bar(lanes) {}
  std::barrier<> bar;
  float slot[32] = {};
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

// __syncwarp: the warp's lanes meet at its barrier (kernels call it warp-uniformly).
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp->bar.arrive_and_wait(); }
// Integer atomics (the embedding gradient's bucketing): real atomics across the block's threads.
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
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
// backend_cuda/cuda_dtype.cu).
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

struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
inline int __ffs(int x) { return __builtin_ffs(x); }

using cudaError_t = int;
constexpr int cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotSupported = 801;
using cudaStream_t = void*;
inline int emu_allocs = 0;
inline cudaError_t cudaGetLastError() { return 0; }
inline cudaError_t cudaMallocAsync(void** p, std::size_t n, cudaStream_t) { *p = std::malloc(n); ++emu_allocs; return 0; }
inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { std::free(p); --emu_allocs; return 0; }
inline cudaError_t cudaMalloc(void** p, std::size_t n) { *p = std::malloc(n); return 0; }
inline cudaError_t cudaFree(void* p) { std::free(p); return 0; }
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

#define DITTO_CUDA_CHECK(call, where) \
  do { if ((call) != 0) throw std::runtime_error(std::string("cuda: ") + (where)); } while (0)
#define DITTO_CUBLAS_CHECK(call, where) \
  do { if ((call) != 0) throw std::runtime_error(std::string("cublas: ") + (where)); } while (0)

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
};
inline CudaStream& as_cuda(Stream& s, const char*) { return static_cast<CudaStream&>(s); }
// The typed GEMM's decisions are the real backend's (pure host functions); cuBLASLt is not
// emulated: blaslt_gemm declines every call, so a fast-mode gemm_ex runs the canonical kernel.
using ditto::cuda::lt_use_tf32;
using ditto::cuda::typed_gemm_supported;
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
std::unique_ptr<Kernels> make_cuda_kernels(CudaBackend& backend);
}  // namespace ditto::cuda_emu

inline long emu_threads_launched = 0;

// Persistent workers, one per CUDA thread of the largest block seen; worker i runs thread i.
class EmuPool {
 public:
  ~EmuPool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : ws_) t.join();
  }
  void run(unsigned n, const std::function<void(unsigned)>& f) {
    while (ws_.size() < n) {
      const unsigned i = static_cast<unsigned>(ws_.size());
      ws_.emplace_back([this, i, g = gen_] { work(i, g); });
    }
    std::unique_lock<std::mutex> l(mu_);
    job_ = &f;
    active_ = n;
    remaining_ = n;
    ++gen_;
    cv_.notify_all();
    done_.wait(l, [&] { return remaining_ == 0; });
  }

 private:
  void work(unsigned i, unsigned seen) {  // seen: the generation before the worker existed
    for (;;) {
      const std::function<void(unsigned)>* job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return gen_ != seen; });
        seen = gen_;
        if (stop_) return;
        if (i >= active_) continue;
        job = job_;
      }
      (*job)(i);
      std::lock_guard<std::mutex> g(mu_);
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  std::vector<std::thread> ws_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(unsigned)>* job_ = nullptr;
  unsigned active_ = 0, remaining_ = 0, gen_ = 0;
  bool stop_ = false;
};
inline EmuPool emu_pool;

template <class... P, class... A>
void emu_launch(void (*k)(P...), dim3 grid, dim3 block, A&&... args) {
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      const unsigned n = block.x * block.y;
      std::barrier<> bar(n);
      std::vector<std::unique_ptr<EmuWarp>> warps;
      for (unsigned w = 0; w < n; w += 32) warps.push_back(std::make_unique<EmuWarp>(std::min(32u, n - w)));
      const std::function<void(unsigned)> f = [&](unsigned i) {
        emu_warp = warps[i / 32].get();
        emu_lane = i % 32;
        threadIdx = {i % block.x, i / block.x, 0};
        blockIdx = {bx, by, 0};
        blockDim = block;
        gridDim = grid;
        emu_bar = &bar;
        k(args...);
      };
      emu_pool.run(n, f);
      emu_threads_launched += n;
    }
}
