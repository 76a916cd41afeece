// Note [Lazy cuBLAS] (cublas_lazy.h): libcublas opened with dlopen on first use.
#include "backend_cuda/cublas_lazy.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>
#include <type_traits>

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

#define DITTO_LAZY_CUBLAS_RESOLVE(field, symbol) resolve(lib, name, #symbol, api.field);

/// Every symbol of `Api` (CublasApi or CublasLtApi) from `lib`, the library called `name`.
template <class Api>
void resolve_all(void* lib, const char* name, Api& api) {
  if constexpr (std::is_same_v<Api, CublasApi>) {
    DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_RESOLVE, DITTO_LAZY_CUBLAS_SKIP)
  } else {
    DITTO_LAZY_CUBLAS_FUNCTIONS(DITTO_LAZY_CUBLAS_SKIP, DITTO_LAZY_CUBLAS_RESOLVE)
  }
}

/// One lazily opened library and its table `Api`: `what` for messages, the build's soname and
/// path.
template <class Api>
struct LazyLibrary {
  const char* what;
  const char* soname;
  const char* path;
  std::atomic<const Api*> loaded{nullptr};

  /// open_library, then resolve_all; the library is closed again if a symbol is missing, else
  /// stays open for the life of the process.
  Api load(const std::string& so, const std::string& fallback) const {
    void* lib = open_library(what, so, fallback);
    Api api;
    try {
      resolve_all(lib, so.c_str(), api);
    } catch (...) {
      dlclose(lib);
      throw;
    }
    return api;
  }

  /// The table for the build's soname and path, loaded on the first call (thread-safe:
  /// double-checked through `loaded`); a failed load throws before the static is initialised, so
  /// the next call tries again.
  const Api& get() {
    static std::mutex mu;
    if (const Api* api = loaded.load(std::memory_order_acquire)) return *api;
    std::lock_guard lk(mu);
    if (const Api* api = loaded.load(std::memory_order_acquire)) return *api;
    static const Api api = load(soname, path);
    loaded.store(&api, std::memory_order_release);
    return api;
  }

  const Api* if_loaded() const noexcept { return loaded.load(std::memory_order_acquire); }
};

LazyLibrary<CublasApi> g_cublas{"cuBLAS", DITTO_CUBLAS_SONAME, DITTO_CUBLAS_PATH};
LazyLibrary<CublasLtApi> g_cublaslt{"cuBLASLt", DITTO_CUBLASLT_SONAME, DITTO_CUBLASLT_PATH};

}  // namespace

CublasApi load_cublas(const std::string& soname, const std::string& fallback) {
  return g_cublas.load(soname, fallback);
}
const CublasApi& cublas_api() { return g_cublas.get(); }
const CublasApi* cublas_api_if_loaded() noexcept { return g_cublas.if_loaded(); }

CublasLtApi load_cublaslt(const std::string& soname, const std::string& fallback) {
  return g_cublaslt.load(soname, fallback);
}
const CublasLtApi& cublaslt_api() { return g_cublaslt.get(); }
const CublasLtApi* cublaslt_api_if_loaded() noexcept { return g_cublaslt.if_loaded(); }

}  // namespace ditto::cuda
