// CudaBackend: ditto's Backend on the CUDA runtime (memory, streams, copies), cuBLAS and ditto's
// own kernels (cuda_kernels.cu), and NCCL communicators (cuda_communicator.cpp). Built only where
// CMake finds the CUDA toolkit and NCCL (DITTO_WITH_CUDA).
//
// Logical devices: BackendOptions::device_count logical devices (default: one per visible GPU);
// logical device i runs on physical GPU i % physical_count() (oversubscription: "--devices 8" on a
// 1-GPU machine). Each logical device has its own default stream, memory pool and memory
// accounting (live and peak bytes; capacity = the physical GPU's total memory); each stream has
// its own cuBLAS handle (CudaStream::cublas).
//
// No GPU, no driver or a driver too old: constructing the backend throws BackendError
// "no CUDA device: <reason>".
#pragma once

#include <cublas_v2.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_stream.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"

namespace ditto::cuda {

class CudaBackend;

std::unique_ptr<Kernels> make_cuda_kernels(CudaBackend& backend);
std::shared_ptr<CommunicatorImpl> make_cuda_communicator(CudaBackend& backend,
                                                         const std::vector<int>& devices,
                                                         const CommOptions& options);

class CudaBackend final : public Backend, public std::enable_shared_from_this<CudaBackend> {
 public:
  explicit CudaBackend(const BackendOptions& options);
  /// This backend as a shared_ptr when one owns it (make_cuda_backend: the registry's instance),
  /// else null (a CudaBackend on the stack). Communicators hold it, so that the backend they
  /// allocate from outlives them, as Buffers hold theirs, also across init_backend("cuda") (a
  /// user's program that re-creates or drops the backend before its communicators).
  std::shared_ptr<CudaBackend> keep_alive() { return weak_from_this().lock(); }
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(devices_.size()); }
  DeviceProperties properties(int index) const override;
  MemoryStats memory_stats(int index) const override;
  void reset_peak_memory(int index) override;

  void* allocate(int index, std::size_t bytes) override;
  void deallocate(int index, void* ptr, std::size_t bytes) noexcept override;
  /// allocate() / deallocate() ordered on `stream` (a stream of logical device `index`) instead
  /// of the device's default stream: scratch memory of work on another stream (the bitwise
  /// collectives' blocks), counted by memory_stats like any allocation.
  void* allocate_on(int index, std::size_t bytes, cudaStream_t stream);
  void deallocate_on(int index, void* ptr, std::size_t bytes, cudaStream_t stream) noexcept;

  Stream& default_stream(int index) override { return *devices_[index]->stream; }
  std::unique_ptr<Stream> create_stream(int index) override;
  std::unique_ptr<Event> create_event(int index) override;

  void copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) override;
  void copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) override;
  void copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t row_bytes, std::size_t rows) override;

  Kernels& kernels() override { return *kernels_; }
  std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>& devices,
                                                        const CommOptions& options) override;

  /// Physical GPU of logical device `index`.
  int physical_device(int index) const { return devices_[index]->physical; }
  int physical_count() const { return physical_count_; }
  /// The memory pool of logical device `index` (null where the GPU has no pool support).
  cudaMemPool_t memory_pool(int index) const { return devices_[index]->pool; }

  /// The CudaStream default_stream(index) returns.
  CudaStream& cuda_stream(int index) { return *devices_[index]->stream; }
  /// How errors name logical device `index`: "cuda:3 (GPU 0)".
  std::string where(int index) const;
  /// BackendOptions::allow_tf32: fast-mode f32 GEMMs may run on TF32 tensor cores (cuBLASLt's
  /// CUBLAS_COMPUTE_32F_FAST_TF32); false: strict f32.
  bool allow_tf32() const { return allow_tf32_; }

 private:
  struct LogicalDevice {
    int physical = 0;
    std::unique_ptr<CudaStream> stream;
    mutable std::mutex mem_mu;
    MemoryAccount mem;  ///< live and peak bytes, capacity (guarded by mem_mu)
    /// The device's own memory pool on its GPU (null: no pool support, cudaMalloc / cudaFree):
    /// logical devices sharing a GPU never reuse each other's freed blocks, and each keeps at
    /// most its share of pool_release_threshold.
    cudaMemPool_t pool = nullptr;
    LogicalDevice() = default;
    LogicalDevice(const LogicalDevice&) = delete;
    LogicalDevice& operator=(const LogicalDevice&) = delete;
    /// Destroys a pool ~CudaBackend did not (a constructor that failed half way).
    ~LogicalDevice() {
      if (pool && cudaMemPoolDestroy(pool) != cudaSuccess) (void)cudaGetLastError();
    }
  };
  struct PhysicalDevice {
    std::string name;  ///< cudaDeviceProp::name, e.g. "NVIDIA H200"
    std::size_t total_memory = 0;
    std::size_t max_pitch = 0;  ///< cudaDeviceProp::memPitch (cudaMemcpy2D's limit)
    bool memory_pools = false;  ///< cudaMallocAsync supported (else cudaMalloc / cudaFree)
  };
  void* device_malloc(LogicalDevice& d, std::size_t bytes, cudaStream_t stream, cudaError_t* err);
  /// After an allocation failed on GPU `physical`: waits for every stream of the GPU (their
  /// stream-ordered frees complete) and trims every logical device's pool on it to nothing.
  void reclaim_gpu_memory(int physical);
  int physical_count_ = 0;
  bool allow_tf32_ = false;
  std::vector<PhysicalDevice> physical_;
  std::vector<std::unique_ptr<LogicalDevice>> devices_;
  std::unique_ptr<Kernels> kernels_;
};

/// Whether GPU p's context may reach GPU q's memory, enabling it (cudaDeviceEnablePeerAccess(q)
/// on p) when this process has not yet: once per ordered pair per process, recorded only when the
/// call succeeded, so a failure is tried again at the next ask (PeerPairs, cuda_host_logic.h).
/// Thread-safe. The caller checked cudaDeviceCanAccessPeer.
bool ensure_peer_access(int p, int q);

/// The CudaBackend behind `b`; throws InvalidArgument naming `call` for another backend (the
/// twin of as_cuda for streams).
CudaBackend& as_cuda_backend(Backend& b, const char* call);

}  // namespace ditto::cuda
