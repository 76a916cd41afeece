// Note [Lazy cuBLAS] (cublas_lazy.h): libcublas opened with dlopen on first use.
#include "backend_cuda/cublas_lazy.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "core/base/error.h"

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

/// open_library, then resolve_all(lib, soname, table); the library is closed again if a symbol
/// is missing, else stays open for the life of the process.
template <class Api>
Api load_table(const char* what, const std::string& soname, const std::string& fallback,
               void (*resolve_all)(void*, const char*, Api&)) {
  void* lib = open_library(what, soname, fallback);
  Api api;
  try {
    resolve_all(lib, soname.c_str(), api);
  } catch (...) {
    dlclose(lib);
    throw;
  }
  return api;
}

/// The table `load` gives for the build's soname and path, loaded on the first call (thread-safe:
/// double-checked through `loaded`); a failed load throws before the static is initialised, so the
/// next call tries again.
template <class Api>
const Api& load_once(std::atomic<const Api*>& loaded,
                     Api (*load)(const std::string&, const std::string&), const char* soname,
                     const char* path) {
  static std::mutex mu;
  if (const Api* api = loaded.load(std::memory_order_acquire)) return *api;
  std::lock_guard lk(mu);
  if (const Api* api = loaded.load(std::memory_order_acquire)) return *api;
  static const Api api = load(soname, path);
  loaded.store(&api, std::memory_order_release);
  return api;
}

#define DITTO_LAZY_CUBLAS_RESOLVE(field, symbol) resolve(lib, name, #symbol, api.field);

}  // namespace

CublasApi load_cublas(const std::string& soname, const std::string& fallback) {
  return load_table<CublasApi>(
      "cuBLAS", soname, fallback, [](void* lib, const char* name, CublasApi& api) {
        DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_RESOLVE, DITTO_LAZY_CUBLAS_SKIP)
      });
}

const CublasApi& cublas_api() {
  return load_once(g_loaded, &load_cublas, DITTO_CUBLAS_SONAME, DITTO_CUBLAS_PATH);
}

const CublasApi* cublas_api_if_loaded() noexcept {
  return g_loaded.load(std::memory_order_acquire);
}

CublasLtApi load_cublaslt(const std::string& soname, const std::string& fallback) {
  return load_table<CublasLtApi>(
      "cuBLASLt", soname, fallback, [](void* lib, const char* name, CublasLtApi& api) {
        DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_SKIP, DITTO_LAZY_CUBLAS_RESOLVE)
      });
}

const CublasLtApi& cublaslt_api() {
  return load_once(g_lt_loaded, &load_cublaslt, DITTO_CUBLASLT_SONAME, DITTO_CUBLASLT_PATH);
}

const CublasLtApi* cublaslt_api_if_loaded() noexcept {
  return g_lt_loaded.load(std::memory_order_acquire);
}

}  // namespace ditto::cuda
