// Error checks for the CUDA runtime, cuBLAS and NCCL: every failing call becomes a
// ditto::BackendError naming the call, file:line, the error string and the device (and rank).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "core/base/error.h"

namespace ditto::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line,
                                   const std::string& where);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file,
                                     int line, const std::string& where);

}  // namespace ditto::cuda

/// The shape of the checks (DITTO_CUDA_CHECK, DITTO_CUBLAS_CHECK, DITTO_NCCL_CHECK in
/// nccl_check.h): evaluates `call` once and, when its result of type `type` is not `ok`, calls
/// thrower(result, text, __FILE__, __LINE__, where), text being the call as written.
#define DITTO_STATUS_CHECK(type, ok, thrower, call, text, where)                          \
  do {                                                                                    \
    type ditto_status_ = (call);                                                          \
    if (ditto_status_ != (ok)) thrower(ditto_status_, text, __FILE__, __LINE__, (where)); \
  } while (0)

/// DITTO_CUDA_CHECK(cudaMemcpyAsync(...), device.str()): throws BackendError
/// "cuda:1: cudaMemcpyAsync(...) failed at file.cu:12: an illegal memory access was encountered".
#define DITTO_CUDA_CHECK(call, where) \
  DITTO_STATUS_CHECK(cudaError_t, cudaSuccess, ::ditto::cuda::throw_cuda_error, call, #call, where)

/// DITTO_CUBLAS_CHECK(api.sgemm_64(...), device.str()): throws BackendError naming the cuBLAS
/// status, as DITTO_CUDA_CHECK.
#define DITTO_CUBLAS_CHECK(call, where)                                                        \
  DITTO_STATUS_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, ::ditto::cuda::throw_cublas_error, \
                     call, #call, where)
