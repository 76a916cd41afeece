// Note [Lazy cuBLAS] (backend_cuda/cublas_lazy.h): a program built with the CUDA backend does not
// load libcublas until the backend creates its first cuBLAS handle. Runs in builds with the CUDA
// backend (the toolkit's libcublas is on the build machine); needs no GPU.
#if defined(DITTO_TEST_CUDA_BUILT)
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "backend_cuda/cublas_lazy.h"
#include "core/base/error.h"
#include "test_util.h"

namespace ditto {
namespace {

using test::expect_error;

bool cublas_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}

TEST(CublasLazy, NotLoadedUntilFirstUseThenEveryFunctionResolved) {
  if (cuda::cublas_api_if_loaded() == nullptr) {
    // Before the fix every test process mapped libcublas and libcublasLt at start.
    EXPECT_FALSE(cublas_mapped()) << "libcublas was loaded at process start";
  }
  const cuda::CublasApi& api = cuda::cublas_api();
  EXPECT_TRUE(cublas_mapped());
  EXPECT_EQ(cuda::cublas_api_if_loaded(), &api);
  EXPECT_EQ(&cuda::cublas_api(), &api);  // loaded once
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_pointer_mode, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.sgemm_64, nullptr);
  // The status strings need no GPU: they come from the library just loaded.
  EXPECT_STREQ(api.get_status_name(CUBLAS_STATUS_ALLOC_FAILED), "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_NE(std::string(api.get_status_string(CUBLAS_STATUS_ALLOC_FAILED)), "");
}

// cuBLASLt (the typed GEMM's fast path, backend_cuda/cuda_blaslt.cpp) comes through the same
// loader: every function of its table resolves from the toolkit's libcublasLt (no GPU needed),
// and a missing library names what was tried.
TEST(CublasLazy, CublasLtTableResolvesEveryFunction) {
  const cuda::CublasLtApi& api = cuda::cublaslt_api();
  EXPECT_EQ(cuda::cublaslt_api_if_loaded(), &api);
  EXPECT_EQ(&cuda::cublaslt_api(), &api);  // loaded once
  for (const void* f :
       {reinterpret_cast<const void*>(api.create), reinterpret_cast<const void*>(api.destroy),
        reinterpret_cast<const void*>(api.matmul_desc_create),
        reinterpret_cast<const void*>(api.matmul_desc_destroy),
        reinterpret_cast<const void*>(api.matmul_desc_set_attribute),
        reinterpret_cast<const void*>(api.matrix_layout_create),
        reinterpret_cast<const void*>(api.matrix_layout_destroy),
        reinterpret_cast<const void*>(api.preference_create),
        reinterpret_cast<const void*>(api.preference_destroy),
        reinterpret_cast<const void*>(api.preference_set_attribute),
        reinterpret_cast<const void*>(api.algo_get_heuristic),
        reinterpret_cast<const void*>(api.matmul)})
    EXPECT_NE(f, nullptr);
  expect_error<BackendError>([] { (void)cuda::load_cublaslt("libcublasLt-missing.so.99", ""); },
                             "cannot load cuBLASLt (tried libcublasLt-missing.so.99)");
}

TEST(CublasLazy, MissingLibraryIsABackendErrorNamingWhatWasTried) {
  const std::string what = expect_error<BackendError>(
      [] { (void)cuda::load_cublas("libcublas-missing.so.99", "/nonexistent/libcublas.so"); },
      "cannot load cuBLAS (tried libcublas-missing.so.99 or /nonexistent/libcublas.so)");
  EXPECT_NE(what.find("LD_LIBRARY_PATH"), std::string::npos) << what;
}

TEST(CublasLazy, LibraryWithoutTheFunctionsIsRefused) {
  // libz is loaded and has none of cuBLAS's symbols: the table is not half filled.
  expect_error<BackendError>([] { (void)cuda::load_cublas("libz.so.1", ""); },
                             "libz.so.1 has no cublasCreate_v2");
}

}  // namespace
}  // namespace ditto
#endif  // DITTO_TEST_CUDA_BUILT
