// NCCL helpers: ditto's dtypes and ops in NCCL's names, and the error check for NCCL calls: a failing call becomes a ditto::BackendError naming the call,
// file:line, NCCL's error string and last error message, and the device and rank (the twin of
// DITTO_CUDA_CHECK in cuda_check.h).
#pragma once

#include <nccl.h>

#include <string>

#include "core/comm/communicator.h"
#include "core/runtime/dtype.h"
#include "core/runtime/error.h"

namespace ditto::cuda {

/// NCCL's data type for a ditto dtype (f32 or i64, the dtypes collectives accept).
inline ncclDataType_t nccl_type(DType t) { return t == DType::f32 ? ncclFloat32 : ncclInt64; }

/// NCCL's reduction for a ditto ReduceOp (ncclAvg needs NCCL >= 2.10).
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line, const std::string& where);

}  // namespace ditto::cuda

/// DITTO_NCCL_CHECK(ncclAllReduce(...), where): throws BackendError
/// "cuda:1 (GPU 1), rank 1 of 4: ncclAllReduce(...) failed at file.cpp:12: unhandled cuda error
/// (<NCCL's last error message>)".
#define DITTO_NCCL_CHECK(call, where)                                                    \
  do {                                                                                   \
    ncclResult_t ditto_nccl_ = (call);                                                   \
    if (ditto_nccl_ != ncclSuccess)                                                      \
      ::ditto::cuda::throw_nccl_error(ditto_nccl_, #call, __FILE__, __LINE__, (where));  \
  } while (0)
