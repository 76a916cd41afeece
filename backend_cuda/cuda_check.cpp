// CUDA runtime and cuBLAS errors turned into ditto exceptions (cuda_check.h): the message names
// the device, the failing call, where in ditto it was made and CUDA's own description.
#include "backend_cuda/cuda_check.h"

#include "backend_cuda/cublas_lazy.h"

namespace ditto::cuda {

namespace {
/// "backend_cuda/cuda_backend.cpp" from an absolute __FILE__ (short, and stable across machines).
std::string short_file(const char* file) {
  std::string f = file ? file : "?";
  for (const char* dir : {"backend_cuda/", "core/", "tests/", "bench/", "examples/"}) {
    std::size_t at = f.rfind(dir);
    if (at != std::string::npos) return f.substr(at);
  }
  std::size_t slash = f.rfind('/');
  return slash == std::string::npos ? f : f.substr(slash + 1);
}
}  // namespace

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line,
                      const std::string& where) {
  // Reset the thread's last error so that the next unrelated call does not report this one
  // again (sticky errors such as an illegal address stay: the context is lost).
  (void)cudaGetLastError();
  std::string msg = detail::cat(where, ": ", call, " failed at ", short_file(file), ":", line, ": ",
                                cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  // (ditto allocates no pinned host memory: cudaMallocHost / cudaHostAlloc are never called.)
  if (err == cudaErrorMemoryAllocation) throw OutOfMemory(msg, OutOfMemory::Kind::device);
  throw BackendError(msg);
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line,
                        const std::string& where) {
  // The status's text comes from cuBLAS itself, which is loaded when a cuBLAS call could fail.
  const CublasApi* api = cublas_api_if_loaded();
  std::string msg =
      detail::cat(where, ": ", call, " failed at ", short_file(file), ":", line, ": ",
                  api ? api->get_status_string(st) : "cuBLAS error", " (",
                  api ? api->get_status_name(st) : "status", " ", static_cast<int>(st), ")");
  if (st == CUBLAS_STATUS_ALLOC_FAILED) throw OutOfMemory(msg, OutOfMemory::Kind::device);
  throw BackendError(msg);
}

}  // namespace ditto::cuda
