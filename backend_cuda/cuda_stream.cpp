// CudaStream, CudaEvent and DeviceGuard (cuda_stream.h): thin wrappers over cudaStream_t and
// cudaEvent_t whose failures become ditto::BackendError naming the logical and physical device.
#include "backend_cuda/cuda_stream.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "backend_cuda/cublas_lazy.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_host_logic.h"
#include "core/base/error.h"

namespace ditto::cuda {

namespace {
std::string gpu(int physical) { return "GPU " + std::to_string(physical); }
}  // namespace

std::string where(const Device& device, int physical_device) {
  return device.str() + " (" + gpu(physical_device) + ")";
}

DeviceGuard::DeviceGuard(int physical_device) {
  int current = -1;
  DITTO_CUDA_CHECK(cudaGetDevice(&current), gpu(physical_device));
  if (current != physical_device) {
    DITTO_CUDA_CHECK(cudaSetDevice(physical_device), gpu(physical_device));
    previous_ = current;
  }
}

DeviceGuard::DeviceGuard(int physical_device, std::nothrow_t) noexcept {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current == physical_device ||
      cudaSetDevice(physical_device) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

CudaStream::CudaStream(Device device, int physical_device)
    : device_(std::move(device)), physical_(physical_device) {
  DeviceGuard g(physical_);
  DITTO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   where(device_, physical_));
}

CudaStream::~CudaStream() {
  lt_cache_.reset();  // descriptors only (host objects): before the handle, whatever is queued
  if (!stream_) return;
  if (cublas_ || cublaslt_ || cublas_workspace_ || semaphores_) {
    // cublasDestroy waits for the handle's work; the stream sync for cuBLASLt's (it takes the
    // stream per call); then the workspace is free.
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != physical_ &&
                          cudaSetDevice(physical_) == cudaSuccess;
    if (const CublasApi* api = cublas_api_if_loaded(); api && cublas_) (void)api->destroy(cublas_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    if (const CublasLtApi* lt = cublaslt_api_if_loaded(); lt && cublaslt_)
      (void)lt->destroy(cublaslt_);
    if (cublas_workspace_ && cudaFree(cublas_workspace_) != cudaSuccess) (void)cudaGetLastError();
    if (semaphores_ && cudaFree(semaphores_) != cudaSuccess) (void)cudaGetLastError();
    if (switched && cudaSetDevice(previous) != cudaSuccess) (void)cudaGetLastError();
    (void)cudaGetLastError();
  }
  // cudaStreamDestroy returns at once; work still queued completes first (CUDA semantics).
  if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
}

void* CudaStream::workspace_locked() {
  if (cublas_workspace_) return cublas_workspace_;
  DeviceGuard g(physical_);
  void* workspace = nullptr;
  DITTO_CUDA_CHECK(cudaMalloc(&workspace, kCublasWorkspaceBytes), where(device_, physical_));
  cublas_workspace_ = workspace;
  return workspace;
}

unsigned* CudaStream::semaphores() {
  std::lock_guard lk(cublas_mu_);
  if (semaphores_) return semaphores_;
  DeviceGuard g(physical_);
  const std::size_t bytes = static_cast<std::size_t>(kStreamSemaphores) * sizeof(unsigned);
  void* p = nullptr;
  DITTO_CUDA_CHECK(cudaMalloc(&p, bytes), where(device_, physical_));
  if (cudaMemsetAsync(p, 0, bytes, stream_) != cudaSuccess) {  // before any kernel of the stream
    (void)cudaGetLastError();
    (void)cudaFree(p);
    throw BackendError(where(device_, physical_) + ": zeroing the stream's semaphores failed");
  }
  semaphores_ = static_cast<unsigned*>(p);
  return semaphores_;
}

void* CudaStream::workspace() {
  std::lock_guard lk(cublas_mu_);
  return workspace_locked();
}

cublasHandle_t CudaStream::cublas() {
  std::lock_guard lk(cublas_mu_);
  if (cublas_) return cublas_;
  const std::string w = where(device_, physical_);
  DeviceGuard g(physical_);
  const CublasApi& api = cublas_api();  // loads libcublas on first use (Note [Lazy cuBLAS])
  void* workspace = workspace_locked();
  cublasHandle_t h = nullptr;
  DITTO_CUBLAS_CHECK(api.create(&h), w);
  // Plain FP32 (no TF32 tensor cores) unless a kernel asks otherwise. cublasSetStream resets
  // the workspace to cuBLAS's default, so the workspace is set after it.
  if (api.set_math_mode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
      api.set_stream(h, stream_) != CUBLAS_STATUS_SUCCESS ||
      api.set_workspace(h, workspace, kCublasWorkspaceBytes) != CUBLAS_STATUS_SUCCESS) {
    (void)api.destroy(h);
    throw BackendError(w + ": cuBLAS handle setup failed");
  }
  cublas_ = h;
  return cublas_;
}

cublasLtHandle_t CudaStream::cublaslt() {
  std::lock_guard lk(cublas_mu_);
  if (cublaslt_) return cublaslt_;
  const std::string w = where(device_, physical_);
  DeviceGuard g(physical_);
  const CublasLtApi& api = cublaslt_api();  // loads libcublasLt on first use
  (void)workspace_locked();
  cublasLtHandle_t h = nullptr;
  DITTO_CUBLAS_CHECK(api.create(&h), w);
  cublaslt_ = h;
  return cublaslt_;
}

LtDescCache& CudaStream::lt_cache(std::shared_ptr<LtDescCache> (*make)()) {
  std::lock_guard lk(cublas_mu_);
  if (!lt_cache_) lt_cache_ = make();
  return *lt_cache_;
}

void CudaStream::synchronize() {
  DeviceGuard g(physical_);
  wait_for_gpu(
      physical_, [&] { return cudaStreamQuery(stream_); },
      [&] { return cudaStreamSynchronize(stream_); }, "cudaStreamSynchronize(stream_)",
      where(device_, physical_));
}

void CudaStream::record(Event& event) {
  auto* ev = dynamic_cast<CudaEvent*>(&event);
  DITTO_CHECK(ev, "Stream::record: expected an event of the cuda backend for stream of ",
              device_.str(), ", got another backend's event");
  DITTO_CHECK(ev->physical_device() == physical_, "Stream::record: event: expected an event of ",
              gpu(physical_), " (stream of ", device_.str(), "), got one of ",
              gpu(ev->physical_device()));
  DeviceGuard g(physical_);
  DITTO_CUDA_CHECK(cudaEventRecord(ev->get(), stream_), where(device_, physical_));
  ev->mark_recorded();
}

void CudaStream::wait(const Event& event) {
  auto* ev = dynamic_cast<const CudaEvent*>(&event);
  DITTO_CHECK(ev, "Stream::wait: expected an event of the cuda backend for stream of ",
              device_.str(), ", got another backend's event");
  if (!ev->recorded()) return;
  DeviceGuard g(physical_);
  DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev->get(), 0), where(device_, physical_));
}

CudaEvent::CudaEvent(int physical_device) : physical_(physical_device) {
  DeviceGuard g(physical_);
  DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), gpu(physical_));
}

CudaEvent::~CudaEvent() {
  if (event_ && cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
}

void CudaEvent::synchronize() {
  if (!recorded()) return;
  wait_for_gpu(
      physical_, [&] { return cudaEventQuery(event_); },
      [&] { return cudaEventSynchronize(event_); }, "cudaEventSynchronize(event_)", gpu(physical_));
}

bool CudaEvent::query() {
  if (!recorded()) return true;
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    // Not an error: cleared so that no launch check of this thread reads it as the last error
    // (PyTorch's CUDAEvent::query does the same; CudaFixes.WatchedWaitLeavesNoNotReadyError...).
    (void)cudaGetLastError();
    return false;
  }
  throw_cuda_error(err, "cudaEventQuery(event_)", __FILE__, __LINE__, gpu(physical_));
}

// ---- watched waits (Note [Waiting on NCCL work]) ------------------------------------------------

namespace {
struct Watches {
  std::mutex mu;
  std::map<int, std::vector<std::shared_ptr<StreamWatch>>> by_gpu;
};
Watches& watches() {
  static Watches* w = new Watches;  // never destroyed: waits may run during static destruction
  return *w;
}
}  // namespace

void add_stream_watch(int physical, std::shared_ptr<StreamWatch> watch) {
  Watches& w = watches();
  std::lock_guard lk(w.mu);
  w.by_gpu[physical].push_back(std::move(watch));
}

void remove_stream_watch(int physical, const StreamWatch* watch) {
  Watches& w = watches();
  std::lock_guard lk(w.mu);
  auto it = w.by_gpu.find(physical);
  if (it == w.by_gpu.end()) return;
  auto& v = it->second;
  v.erase(std::remove_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == watch; }),
          v.end());
  if (v.empty()) w.by_gpu.erase(it);
}

void wait_for_gpu(int physical, const std::function<cudaError_t()>& query,
                  const std::function<cudaError_t()>& block, const char* call,
                  const std::string& where) {
  auto watched = [&] {
    Watches& w = watches();
    std::lock_guard lk(w.mu);
    auto it = w.by_gpu.find(physical);
    return it == w.by_gpu.end() ? std::vector<std::shared_ptr<StreamWatch>>{} : it->second;
  };
  std::vector<std::shared_ptr<StreamWatch>> list = watched();
  if (list.empty()) {
    const cudaError_t err = block();
    if (err != cudaSuccess) throw_cuda_error(err, call, __FILE__, __LINE__, where);
    return;
  }
  for (int polls = 0;; ++polls) {
    const cudaError_t err = query();
    if (err != cudaSuccess && err != cudaErrorNotReady)
      throw_cuda_error(err, call, __FILE__, __LINE__, where);
    if (err == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: as in query()
    if (polls % 64 == 63) list = watched();                  // communicators come and go
    for (const auto& watch : list) {
      const StreamWatch::Report r = watch->poll();
      const WaitStep step = wait_step(err == cudaSuccess, r.error, r.pending_ms, r.timeout_ms);
      if (step == WaitStep::done) return;
      if (step == WaitStep::failed) {
        const std::string msg = detail::cat(where, ": ", call, " ended: ", r.what,
                                            "; the communicator was aborted (ncclCommAbort)");
        watch->abort(msg);
        throw BackendError(msg);
      }
      if (step == WaitStep::timed_out) {
        const std::string msg = detail::cat(
            where, ": ", call, ": ", r.what, ": a collective enqueued ", r.pending_ms,
            " ms ago has not finished (timeout ", r.timeout_ms,
            " ms; a peer rank may have failed); the communicator was aborted (ncclCommAbort)");
        watch->abort(msg);
        throw Timeout(msg);
      }
    }
    if (err == cudaSuccess) return;
    std::this_thread::sleep_for(std::chrono::microseconds(kWaitPollMicros));
  }
}

CudaStream& as_cuda(Stream& s, const char* call) {
  auto* p = dynamic_cast<CudaStream*>(&s);
  DITTO_CHECK(p, call, ": expected a stream of the cuda backend, got a stream of device ",
              s.device().str());
  return *p;
}

}  // namespace ditto::cuda
