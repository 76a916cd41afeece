// CudaStream, CudaEvent and DeviceGuard (cuda_stream.h): thin wrappers over cudaStream_t and
// cudaEvent_t whose failures become ditto::BackendError naming the logical and physical device.
#include "backend_cuda/cuda_stream.h"

#include "backend_cuda/cuda_check.h"
#include "core/runtime/error.h"

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
  if (!stream_) return;
  // cudaStreamDestroy returns at once; work still queued completes first (CUDA semantics).
  if (cudaStreamDestroy(stream_) != cudaSuccess) (void)cudaGetLastError();
}

void CudaStream::synchronize() {
  DeviceGuard g(physical_);
  DITTO_CUDA_CHECK(cudaStreamSynchronize(stream_), where(device_, physical_));
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
  DITTO_CUDA_CHECK(cudaEventSynchronize(event_), gpu(physical_));
}

bool CudaEvent::query() {
  if (!recorded()) return true;
  cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  throw_cuda_error(err, "cudaEventQuery(event_)", __FILE__, __LINE__, gpu(physical_));
}

CudaStream& as_cuda(Stream& s, const char* call) {
  auto* p = dynamic_cast<CudaStream*>(&s);
  DITTO_CHECK(p, call, ": expected a stream of the cuda backend, got a stream of device ",
              s.device().str());
  return *p;
}

}  // namespace ditto::cuda
