// CudaStream / CudaEvent: ditto's Stream and Event over cudaStream_t / cudaEvent_t. A logical
// device (cuda:i) runs on physical GPU physical_device(); several logical devices may share one GPU
// (oversubscription), each with its own streams.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "core/runtime/stream.h"

namespace ditto::cuda {

/// Sets the current CUDA device for the scope, restoring the previous one (c10::cuda::CUDAGuard).
/// Throws BackendError when the device cannot be made current; the destructor never throws.
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical_device);
  /// The same for noexcept paths (release, abort, destructors): where a CUDA call fails, the
  /// error is cleared and the guard leaves the device as it is.
  DeviceGuard(int physical_device, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  ///< device to restore; -1 when the guard did not switch
};

/// How errors name a logical device: "cuda:3 (GPU 0)".
std::string where(const Device& device, int physical_device);

class LtDescCache;  // the typed GEMM's cuBLASLt descriptor cache (cuda_blaslt.cpp)

class CudaStream final : public Stream {
 public:
  /// Creates a non-blocking stream on `physical_device` for logical `device`.
  CudaStream(Device device, int physical_device);
  ~CudaStream() override;

  Device device() const override { return device_; }
  /// cudaStreamSynchronize; a failure (e.g. a faulting kernel) throws BackendError naming the
  /// device and the CUDA error.
  void synchronize() override;
  void record(Event& event) override;
  void wait(const Event& event) override;

  cudaStream_t get() const { return stream_; }
  int physical_device() const { return physical_; }

  /// This stream's cuBLAS handle: created on first use (thread-safe; loads cuBLAS, Note [Lazy
  /// cuBLAS]), bound to this stream once (cublasSetStream) with a workspace of its own
  /// (cublasSetWorkspace, kCublasWorkspaceBytes), plain FP32 math, destroyed with the stream.
  /// One handle per stream, never re-bound: two host threads enqueueing GEMMs on two streams of
  /// one device never run one's GEMM on the other's stream, nor share a workspace between
  /// concurrent streams (cuBLAS's rule for handles used on several streams). Callers must not
  /// call cublasSetStream or cublasSetWorkspace on it.
  cublasHandle_t cublas();
  /// This stream's cuBLASLt handle (the typed GEMM, cuda_blaslt.cpp): created on first use
  /// (thread-safe; loads cuBLASLt, Note [Lazy cuBLAS]), destroyed with the stream. cuBLASLt takes
  /// the stream and the workspace per call: workspace() is the one of the cuBLAS handle (both
  /// only run on this stream, so they never use it at the same time).
  cublasLtHandle_t cublaslt();
  /// The stream's GEMM workspace of kCublasWorkspaceBytes (allocated on first use).
  void* workspace();
  /// This stream's cache of cuBLASLt descriptors (blaslt_gemm, cuda_blaslt.cpp): made by `make`
  /// on first use (thread-safe), destroyed with the stream, before its cuBLASLt handle.
  LtDescCache& lt_cache(std::shared_ptr<LtDescCache> (*make)());
  /// kStreamSemaphores (cuda_host_logic.h) unsigned counters in device memory, zero between the
  /// kernels of this stream (torch's reduction semaphores, without a memset per launch):
  /// allocated and zeroed on this stream on first use (thread-safe), freed with the stream. A
  /// kernel that counts on one hands it back at zero (the fast sum_rows' last block of a column
  /// range resets its ticket counter, Note [CUDA row sums]); the stream's order keeps two
  /// kernels from sharing them.
  unsigned* semaphores();
  /// Bytes of each handle's workspace: cuBLAS's recommendation for Hopper (32 MiB).
  static constexpr std::size_t kCublasWorkspaceBytes = std::size_t{32} << 20;

 private:
  Device device_;
  int physical_;
  cudaStream_t stream_ = nullptr;
  /// The workspace, allocated on first use (cublas_mu_ held).
  void* workspace_locked();
  std::mutex cublas_mu_;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
  void* cublas_workspace_ = nullptr;       ///< cudaMalloc'd, freed after the handles
  std::shared_ptr<LtDescCache> lt_cache_;  ///< made by lt_cache()
  unsigned* semaphores_ = nullptr;         ///< made by semaphores() (cublas_mu_ held)
};

class CudaEvent final : public Event {
 public:
  /// An event on `physical_device` (cudaEventDisableTiming: events only order work here).
  explicit CudaEvent(int physical_device);
  ~CudaEvent() override;
  void synchronize() override;
  bool query() override;

  cudaEvent_t get() const { return event_; }
  int physical_device() const { return physical_; }
  /// False until the first record (waiting on an unrecorded event is a no-op, as in CUDA).
  bool recorded() const { return recorded_.load(std::memory_order_acquire); }
  void mark_recorded() { recorded_.store(true, std::memory_order_release); }

 private:
  int physical_;
  cudaEvent_t event_ = nullptr;
  std::atomic<bool> recorded_{false};
};

/// The CudaStream behind `s`; throws InvalidArgument naming `call` for another backend's stream.
CudaStream& as_cuda(Stream& s, const char* call);

// Note [Waiting on NCCL work]
// A host wait on a stream (Stream::synchronize, Event::synchronize, the blocking host copies)
// that holds NCCL work of a communicator with one rank per process may never end on its own: a
// peer rank that failed after its partners enqueued their sends (out of memory, a crash, a
// timeout on that rank only) leaves their NCCL kernels waiting for ever, and
// cudaStreamSynchronize with them. So such a communicator registers a StreamWatch for its GPU
// (cuda_communicator_mpi.cpp), and while any watch is registered for a GPU, host waits on that
// GPU's streams poll instead of blocking: cudaStreamQuery / cudaEventQuery, then every watch
// (ncclCommGetAsyncError, and how long the communicator's latest collective has been
// unfinished), every kWaitPollMicros. A watch that reports an asynchronous NCCL error, or a
// collective past its communicator's timeout (CommOptions::timeout_ms, from its enqueue, as
// PyTorch's NCCL watchdog), is aborted (ncclCommAbort, which ends its kernels) and the wait
// throws BackendError / Timeout naming it (wait_step, cuda_host_logic.h). Without a watch the
// wait is the plain blocking call (in-process communicators never enqueue before every rank
// arrived, Note [CUDA collectives]).

/// What a host wait on a GPU's streams watches besides the stream (Note [Waiting on NCCL work]).
class StreamWatch {
 public:
  struct Report {
    bool error = false;            ///< an asynchronous error (ncclCommGetAsyncError)
    std::int64_t pending_ms = -1;  ///< how long the latest collective has been unfinished; -1: none
    std::int64_t timeout_ms = 0;   ///< its timeout (0: none)
    std::string what;              ///< names the communicator and the error, for the exception
  };
  virtual ~StreamWatch() = default;
  /// One poll (thread-safe).
  virtual Report poll() = 0;
  /// Aborts what is watched (ncclCommAbort) after poll() reported an error or a timeout.
  virtual void abort(const std::string& reason) noexcept = 0;
};

/// Registers / removes a watch for GPU `physical` (thread-safe).
void add_stream_watch(int physical, std::shared_ptr<StreamWatch> watch);
void remove_stream_watch(int physical, const StreamWatch* watch);

/// Microseconds between two polls of a watched wait.
inline constexpr int kWaitPollMicros = 200;

/// Waits until `query` (cudaStreamQuery or cudaEventQuery of work on GPU `physical`) returns
/// cudaSuccess: `block` (cudaStreamSynchronize / cudaEventSynchronize) when no watch is
/// registered for the GPU, else polling (Note [Waiting on NCCL work]). A CUDA error throws
/// BackendError naming `call` and `where`; a watch's error BackendError, its timeout Timeout.
void wait_for_gpu(int physical, const std::function<cudaError_t()>& query,
                  const std::function<cudaError_t()>& block, const char* call,
                  const std::string& where);

}  // namespace ditto::cuda
