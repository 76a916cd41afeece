// NCCL helpers: ditto's dtypes and ops in NCCL's names, and the error check for NCCL calls: a
// failing call becomes a ditto::BackendError naming the call,
// file:line, NCCL's error string and last error message, and the device and rank (the twin of
// DITTO_CUDA_CHECK in cuda_check.h).
#pragma once

#include <nccl.h>

#include <string>

#include "backend_cuda/cuda_check.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/runtime/dtype.h"

namespace ditto::cuda {

/// NCCL's data type for a ditto dtype: every DType has one (ncclFloat8e4m3 / ncclFloat8e5m2 since
/// NCCL 2.24: with older headers fp8 maps to ncclUint8, which only data movement is given, Note
/// [NCCL fp8], cuda_host_logic.h). Calls that only move data take nccl_type(nccl_move_dtype(t)).
inline ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::i64: return ncclInt64;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
    case DType::i32: return ncclInt32;
    case DType::u32: return ncclUint32;
    case DType::u64: return ncclUint64;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case DType::f8_e4m3: return ncclFloat8e4m3;
    case DType::f8_e5m2: return ncclFloat8e5m2;
#else  // check_nccl_reduction_dtype refuses their reductions: they only move, as bytes
    case DType::f8_e4m3:
    case DType::f8_e5m2: return ncclUint8;
#endif
  }
  return ncclFloat32;
}

/// NCCL's built-in reduction for a ditto ReduceOp (ncclAvg needs NCCL >= 2.10). premul_sum has no
/// built-in: it is made per communicator and call by NcclRedOp (cuda_nccl.h); here it maps to
/// ncclSum only so that the switch is total.
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::premul_sum: return ncclSum;
  }
  return ncclSum;
}

[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* call, const char* file,
                                   int line, const std::string& where);

}  // namespace ditto::cuda

/// DITTO_NCCL_CHECK(ncclAllReduce(...), where): throws BackendError
/// "cuda:1 (GPU 1), rank 1 of 4: ncclAllReduce(...) failed at file.cpp:12: unhandled cuda error
/// (<NCCL's last error message>)".
#define DITTO_NCCL_CHECK(call, where) \
  DITTO_STATUS_CHECK(ncclResult_t, ncclSuccess, ::ditto::cuda::throw_nccl_error, call, #call, where)
