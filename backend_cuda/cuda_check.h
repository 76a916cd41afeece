// Error checks for the CUDA runtime, cuBLAS and NCCL: every failing call becomes a
// ditto::BackendError naming the call, file:line, the error string and the device (and rank).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/runtime/error.h"

namespace ditto::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line,
                                   const std::string& where);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line, const std::string& where);

}  // namespace ditto::cuda

/// DITTO_CUDA_CHECK(cudaMemcpyAsync(...), device.str()): throws BackendError
/// "cuda:1: cudaMemcpyAsync(...) failed at file.cu:12: an illegal memory access was encountered".
#define DITTO_CUDA_CHECK(call, where)                                                   \
  do {                                                                                  \
    cudaError_t ditto_err_ = (call);                                                    \
    if (ditto_err_ != cudaSuccess)                                                      \
      ::ditto::cuda::throw_cuda_error(ditto_err_, #call, __FILE__, __LINE__, (where));  \
  } while (0)

#define DITTO_CUBLAS_CHECK(call, where)                                                  \
  do {                                                                                   \
    cublasStatus_t ditto_st_ = (call);                                                   \
    if (ditto_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::ditto::cuda::throw_cublas_error(ditto_st_, #call, __FILE__, __LINE__, (where));  \
  } while (0)
