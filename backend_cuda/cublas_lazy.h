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
// the typed GEMM through a second table (CublasLtApi), opened on the first cuBLASLt handle. It is found first by its soname
// (LD_LIBRARY_PATH, the program's RUNPATH, ld.so.cache), then at the path the build linked
// against; a program that also links cuBLAS itself gets the same copy (dlopen of a loaded soname
// returns it). The CUDA runtime and NCCL stay linked: together they cost under 1 ms at start.
// The same is done by PyTorch for the driver API and NVRTC (its lazy NVRTC stubs) and by NCCL for
// libcuda (cudawrap).
struct CublasApi {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetPointerMode_v2) set_pointer_mode = nullptr;
  decltype(&::cublasSetMathMode) set_math_mode = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&::cublasSgemm_v2_64) sgemm_64 = nullptr;
  decltype(&::cublasGetStatusString) get_status_string = nullptr;
  decltype(&::cublasGetStatusName) get_status_name = nullptr;
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
  decltype(&::cublasLtCreate) create = nullptr;
  decltype(&::cublasLtDestroy) destroy = nullptr;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create = nullptr;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy = nullptr;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute = nullptr;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create = nullptr;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute = nullptr;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic = nullptr;
  decltype(&::cublasLtMatmul) matmul = nullptr;
};

/// The cuBLASLt functions, loading libcublasLt on the first call (thread-safe); throws
/// ditto::BackendError as cublas_api() does.
const CublasLtApi& cublaslt_api();

/// Opens `soname` (then `fallback`) and resolves the cuBLASLt table (for tests, as load_cublas).
CublasLtApi load_cublaslt(const std::string& soname, const std::string& fallback);

/// The table when cublaslt_api() has loaded it, else nullptr.
const CublasLtApi* cublaslt_api_if_loaded() noexcept;

}  // namespace ditto::cuda
