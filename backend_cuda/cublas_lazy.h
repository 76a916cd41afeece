// cuBLAS, loaded when the CUDA backend first needs it (Note [Lazy cuBLAS]).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

namespace ditto::cuda {

// Note [Lazy cuBLAS]
// ditto's libraries do not link libcublas: every program built with the CUDA backend (each test
// binary, ditto-train, a user's program) would otherwise load libcublas and libcublasLt at start,
// and their initialisers cost ~65 ms of CPU and ~200 MB of resident memory per process, measured
// on an empty main() (2 ms without them), although a run on the simulator never calls them. The
// backend calls the nine cuBLAS functions it uses through this table instead, which dlopen()s the
// library on the first cuBLAS handle (CudaStream::cublas), and the twelve cuBLASLt functions of
// the typed GEMM through a second table (CublasLtApi), opened on the first cuBLASLt handle. It is
// found first by its soname (LD_LIBRARY_PATH, the program's RUNPATH, ld.so.cache), then at the path
// the build linked against; a program that also links cuBLAS itself gets the same copy (dlopen of a
// loaded soname returns it). The CUDA runtime and NCCL stay linked: together they cost under 1 ms
// at start. The same is done by PyTorch for the driver API and NVRTC (its lazy NVRTC stubs) and by
// NCCL for libcuda (cudawrap).

// The functions of both tables, one line each: BLAS(field, symbol) for cuBLAS (CublasApi),
// LT(field, symbol) for cuBLASLt (CublasLtApi). The tables' members and the loader's dlsym calls
// (cublas_lazy.cpp) are both written from this list.
#define DITTO_LAZY_CUBLAS_FUNCTIONS(BLAS, LT)                        \
  BLAS(create, cublasCreate_v2)                                      \
  BLAS(destroy, cublasDestroy_v2)                                    \
  BLAS(set_stream, cublasSetStream_v2)                               \
  BLAS(set_pointer_mode, cublasSetPointerMode_v2)                    \
  BLAS(set_math_mode, cublasSetMathMode)                             \
  BLAS(set_workspace, cublasSetWorkspace_v2)                         \
  BLAS(sgemm_64, cublasSgemm_v2_64)                                  \
  BLAS(get_status_string, cublasGetStatusString)                     \
  BLAS(get_status_name, cublasGetStatusName)                         \
  LT(create, cublasLtCreate)                                         \
  LT(destroy, cublasLtDestroy)                                       \
  LT(matmul_desc_create, cublasLtMatmulDescCreate)                   \
  LT(matmul_desc_destroy, cublasLtMatmulDescDestroy)                 \
  LT(matmul_desc_set_attribute, cublasLtMatmulDescSetAttribute)      \
  LT(matrix_layout_create, cublasLtMatrixLayoutCreate)               \
  LT(matrix_layout_destroy, cublasLtMatrixLayoutDestroy)             \
  LT(preference_create, cublasLtMatmulPreferenceCreate)              \
  LT(preference_destroy, cublasLtMatmulPreferenceDestroy)            \
  LT(preference_set_attribute, cublasLtMatmulPreferenceSetAttribute) \
  LT(algo_get_heuristic, cublasLtMatmulAlgoGetHeuristic)             \
  LT(matmul, cublasLtMatmul)
#define DITTO_LAZY_CUBLAS_FIELD(field, symbol) decltype(&::symbol) field = nullptr;
#define DITTO_LAZY_CUBLAS_SKIP(field, symbol)

/// The cuBLAS functions the backend calls (DITTO_LAZY_CUBLAS_FUNCTIONS' BLAS lines), e.g.
/// `create` is cublasCreate_v2.
struct CublasApi {
  DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_FIELD, DITTO_LAZY_CUBLAS_SKIP)
};

/// The cuBLAS functions, loading libcublas on the first call (thread-safe; later calls return
/// the same table). Throws ditto::BackendError naming the library tried and dlerror()'s reason
/// when it cannot be loaded or lacks one of the functions (a cuBLAS older than the headers).
const CublasApi& cublas_api();

/// Opens `soname` (then `fallback` when not empty) with dlopen and resolves the table: what
/// cublas_api() does once with the build's soname and path. Throws ditto::BackendError naming
/// every path tried and dlerror()'s reasons. For tests; the library stays open.
CublasApi load_cublas(const std::string& soname, const std::string& fallback);

/// The table when cublas_api() has loaded it, else nullptr (for error messages, which must not
/// try to load the library).
const CublasApi* cublas_api_if_loaded() noexcept;

/// The cuBLASLt functions of the typed GEMM (Kernels::gemm_ex, cuda_blaslt.cpp), loaded from
/// libcublasLt the same way (Note [Lazy cuBLAS]) on the first cuBLASLt handle
/// (CudaStream::cublaslt).
struct CublasLtApi {
  DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_SKIP, DITTO_LAZY_CUBLAS_FIELD)
};

/// The cuBLASLt functions, loading libcublasLt on the first call (thread-safe); throws
/// ditto::BackendError as cublas_api() does.
const CublasLtApi& cublaslt_api();

/// Opens `soname` (then `fallback`) and resolves the cuBLASLt table (for tests, as load_cublas).
CublasLtApi load_cublaslt(const std::string& soname, const std::string& fallback);

/// The table when cublaslt_api() has loaded it, else nullptr.
const CublasLtApi* cublaslt_api_if_loaded() noexcept;

}  // namespace ditto::cuda
