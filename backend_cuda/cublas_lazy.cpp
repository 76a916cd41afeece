// Note [Lazy cuBLAS] (cublas_lazy.h): libcublas opened with dlopen on first use.
#include "backend_cuda/cublas_lazy.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "core/runtime/error.h"

// Set by CMakeLists.txt from the toolkit found at configure time.
#ifndef DITTO_CUBLAS_SONAME
#error "DITTO_CUBLAS_SONAME (e.g. \"libcublas.so.13\") must be defined by the build"
#endif
#ifndef DITTO_CUBLAS_PATH
#define DITTO_CUBLAS_PATH ""
#endif
#ifndef DITTO_CUBLASLT_SONAME
#error "DITTO_CUBLASLT_SONAME (e.g. \"libcublasLt.so.13\") must be defined by the build"
#endif
#ifndef DITTO_CUBLASLT_PATH
#define DITTO_CUBLASLT_PATH ""
#endif

namespace ditto::cuda {

namespace {

std::atomic<const CublasApi*> g_loaded{nullptr};
std::atomic<const CublasLtApi*> g_lt_loaded{nullptr};

template <class F>
void resolve(void* lib, const char* lib_name, const char* symbol, F& out) {
  void* p = dlsym(lib, symbol);
  if (!p)
    throw BackendError(detail::cat("cuda: ", lib_name, " has no ", symbol,
                                   " (a cuBLAS older than the headers ditto was built with?)"));
  out = reinterpret_cast<F>(p);
}

/// dlopen of `soname`, then `fallback`; BackendError naming `what` and every path tried.
void* open_library(const char* what, const std::string& soname, const std::string& fallback) {
  std::string tried = soname;
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string reason = lib ? "" : dlerror();
  if (!lib && !fallback.empty()) {
    lib = dlopen(fallback.c_str(), RTLD_NOW | RTLD_LOCAL);
    tried += " or " + fallback;
    if (!lib) reason += std::string("; ") + dlerror();
  }
  if (!lib)
    throw BackendError(detail::cat("cuda: cannot load ", what, " (tried ", tried, "): ", reason,
                                   "; put the CUDA toolkit's lib64 on LD_LIBRARY_PATH"));
  return lib;
}

}  // namespace

CublasApi load_cublas(const std::string& soname, const std::string& fallback) {
  void* lib = open_library("cuBLAS", soname, fallback);
  const char* name = soname.c_str();
  CublasApi api;
  try {
    resolve(lib, name, "cublasCreate_v2", api.create);
    resolve(lib, name, "cublasDestroy_v2", api.destroy);
    resolve(lib, name, "cublasSetStream_v2", api.set_stream);
    resolve(lib, name, "cublasSetPointerMode_v2", api.set_pointer_mode);
    resolve(lib, name, "cublasSetMathMode", api.set_math_mode);
    resolve(lib, name, "cublasSetWorkspace_v2", api.set_workspace);
    resolve(lib, name, "cublasSgemm_v2_64", api.sgemm_64);
    resolve(lib, name, "cublasGetStatusString", api.get_status_string);
    resolve(lib, name, "cublasGetStatusName", api.get_status_name);
  } catch (...) {
    dlclose(lib);
    throw;
  }
  return api;  // the library stays open for the life of the process
}

const CublasApi& cublas_api() {
  static std::mutex mu;
  if (const CublasApi* api = g_loaded.load(std::memory_order_acquire)) return *api;
  std::lock_guard lk(mu);
  if (const CublasApi* api = g_loaded.load(std::memory_order_acquire)) return *api;
  // A failed load throws before the static is initialised, so the next call tries again.
  static const CublasApi api = load_cublas(DITTO_CUBLAS_SONAME, DITTO_CUBLAS_PATH);
  g_loaded.store(&api, std::memory_order_release);
  return api;
}

const CublasApi* cublas_api_if_loaded() noexcept {
  return g_loaded.load(std::memory_order_acquire);
}

CublasLtApi load_cublaslt(const std::string& soname, const std::string& fallback) {
  void* lib = open_library("cuBLASLt", soname, fallback);
  const char* name = soname.c_str();
  CublasLtApi api;
  try {
    resolve(lib, name, "cublasLtCreate", api.create);
    resolve(lib, name, "cublasLtDestroy", api.destroy);
    resolve(lib, name, "cublasLtMatmulDescCreate", api.matmul_desc_create);
    resolve(lib, name, "cublasLtMatmulDescDestroy", api.matmul_desc_destroy);
    resolve(lib, name, "cublasLtMatmulDescSetAttribute", api.matmul_desc_set_attribute);
    resolve(lib, name, "cublasLtMatrixLayoutCreate", api.matrix_layout_create);
    resolve(lib, name, "cublasLtMatrixLayoutDestroy", api.matrix_layout_destroy);
    resolve(lib, name, "cublasLtMatmulPreferenceCreate", api.preference_create);
    resolve(lib, name, "cublasLtMatmulPreferenceDestroy", api.preference_destroy);
    resolve(lib, name, "cublasLtMatmulPreferenceSetAttribute", api.preference_set_attribute);
    resolve(lib, name, "cublasLtMatmulAlgoGetHeuristic", api.algo_get_heuristic);
    resolve(lib, name, "cublasLtMatmul", api.matmul);
  } catch (...) {
    dlclose(lib);
    throw;
  }
  return api;  // the library stays open for the life of the process
}

const CublasLtApi& cublaslt_api() {
  static std::mutex mu;
  if (const CublasLtApi* api = g_lt_loaded.load(std::memory_order_acquire)) return *api;
  std::lock_guard lk(mu);
  if (const CublasLtApi* api = g_lt_loaded.load(std::memory_order_acquire)) return *api;
  static const CublasLtApi api = load_cublaslt(DITTO_CUBLASLT_SONAME, DITTO_CUBLASLT_PATH);
  g_lt_loaded.store(&api, std::memory_order_release);
  return api;
}

const CublasLtApi* cublaslt_api_if_loaded() noexcept {
  return g_lt_loaded.load(std::memory_order_acquire);
}

}  // namespace ditto::cuda
