// blaslt_gemm (cuda_blaslt.h): ditto's row-major typed GEMM as one column-major cublasLtMatmul,
// its descriptors and algorithm cached per stream (LtDescCache).
#include "backend_cuda/cuda_blaslt.h"

#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend_cuda/cublas_lazy.h"
#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_stream.h"
#include "core/base/error.h"

namespace ditto::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  if (t == DType::bf16) return CUDA_R_16BF;
  if (t == DType::f16) return CUDA_R_16F;
  return CUDA_R_32F;
}

// One cache entry: the cuBLASLt descriptors of a typed GEMM (LtGemmKey) and the heuristic's
// algorithm for them (or that it found none: has_algo false, so the caller's kernel runs without
// asking again). Owns the descriptors: destroyed with the entry (evicted, or the stream's cache
// dies).
struct LtEntry {
  const CublasLtApi* api = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  bool has_algo = false;
  cublasLtMatmulAlgo_t algo{};

  explicit LtEntry(const CublasLtApi& a) : api(&a) {}
  LtEntry(LtEntry&& o) noexcept { swap(o); }
  LtEntry& operator=(LtEntry&& o) noexcept {
    swap(o);
    return *this;
  }
  ~LtEntry() {
    if (!api) return;
    if (out) (void)api->matrix_layout_destroy(out);
    if (second) (void)api->matrix_layout_destroy(second);
    if (first) (void)api->matrix_layout_destroy(first);
    if (op) (void)api->matmul_desc_destroy(op);
  }
  void swap(LtEntry& o) noexcept {
    std::swap(api, o.api);
    std::swap(op, o.op);
    std::swap(first, o.first);
    std::swap(second, o.second);
    std::swap(out, o.out);
    std::swap(has_algo, o.has_algo);
    std::swap(algo, o.algo);
  }
};

// A preference, destroyed on every path (only needed while the heuristic runs).
struct LtPreference {
  const CublasLtApi& api;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit LtPreference(const CublasLtApi& a) : api(a) {}
  ~LtPreference() {
    if (pref) (void)api.preference_destroy(pref);
  }
  LtPreference(const LtPreference&) = delete;
  LtPreference& operator=(const LtPreference&) = delete;
};

// The descriptors of g and the heuristic's algorithm (a cache miss).
// `other`: an epilogue GemmEpilogue does not name (blaslt_gelu_epilogue's probe), set when g's
// is GemmEpilogue::none.
LtEntry make_entry(const CublasLtApi& api, cublasLtHandle_t h, const GemmExArgs& g,
                   const LtGemmPlan& p, bool tf32, const std::string& where,
                   cublasLtEpilogue_t other = CUBLASLT_EPILOGUE_DEFAULT) {
  LtEntry d(api);
  const cublasComputeType_t compute =
      tf32 && g.a_type == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DITTO_CUBLAS_CHECK(api.matmul_desc_create(&d.op, compute, CUDA_R_32F), where);
  const cublasOperation_t op_first = p.first.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.second.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  DITTO_CUBLAS_CHECK(
      api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
      where);
  DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                   sizeof(op_second)),
                     where);
  const cudaDataType_t ab = cuda_type(g.a_type), c = cuda_type(g.c_type);
  if (g.epilogue != GemmEpilogue::none) {
    const bool bias = g.epilogue == GemmEpilogue::bias ||
                      (g.epilogue == GemmEpilogue::gelu_aux_bias && g.bias != nullptr);
    const cublasLtEpilogue_t epi =
        g.epilogue == GemmEpilogue::bias ? CUBLASLT_EPILOGUE_BIAS
        : g.epilogue == GemmEpilogue::dgelu
            ? CUBLASLT_EPILOGUE_DGELU
            : (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX);
    DITTO_CUBLAS_CHECK(
        api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        where);
    if (bias) {
      DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &g.bias, sizeof(g.bias)),
                         where);
      DITTO_CUBLAS_CHECK(
          api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c, sizeof(c)),
          where);
    }
    if (g.epilogue != GemmEpilogue::bias) {  // the GELU input matrix, of C's type (the default
      // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, left unset: setting it is for fp8 outputs)
      DITTO_CUBLAS_CHECK(
          api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux,
                                        sizeof(g.aux)),
          where);
      DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                       &g.ld_aux, sizeof(g.ld_aux)),
                         where);
    }
  } else if (other != CUBLASLT_EPILOGUE_DEFAULT) {
    DITTO_CUBLAS_CHECK(
        api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &other, sizeof(other)),
        where);
  }
  auto layout = [&](cublasLtMatrixLayout_t* l, cudaDataType_t t, const LtMatrix& x) {
    DITTO_CUBLAS_CHECK(api.matrix_layout_create(l, t, static_cast<std::uint64_t>(x.rows),
                                                static_cast<std::uint64_t>(x.cols), x.ld),
                       where);
  };
  layout(&d.first, ab, p.first);    // ditto's B
  layout(&d.second, ab, p.second);  // ditto's A
  layout(&d.out, c, p.out);         // ditto's C, as C and D (in place)

  LtPreference pref(api);
  DITTO_CUBLAS_CHECK(api.preference_create(&pref.pref), where);
  const std::size_t ws = CudaStream::kCublasWorkspaceBytes;
  DITTO_CUBLAS_CHECK(api.preference_set_attribute(
                         pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                     where);
  auto align = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* ptr) {
    const std::uint32_t a = lt_alignment(reinterpret_cast<std::uintptr_t>(ptr));
    DITTO_CUBLAS_CHECK(api.preference_set_attribute(pref.pref, attr, &a, sizeof(a)), where);
  };
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.B);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.A);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.C);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.C);

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = api.algo_get_heuristic(h, d.op, d.first, d.second, d.out, d.out,
                                                   pref.pref, 1, &heuristic, &found);
  const LtAnswer answer =
      lt_heuristic_answer(static_cast<int>(st), found, static_cast<int>(heuristic.state));
  if (answer == LtAnswer::declined)
    return d;  // no algorithm for these types, layouts and epilogue: has_algo stays false
  if (answer == LtAnswer::failed) DITTO_CUBLAS_CHECK(st, where);
  d.has_algo = true;
  d.algo = heuristic.algo;
  return d;
}

// cublasLtMatmul's and cublasLtMatmulAlgoGetHeuristic's statuses, as the host logic reads them
// (Note [cuBLASLt declines], cuda_host_logic.h).
static_assert(CUBLAS_STATUS_SUCCESS == 0 && CUBLAS_STATUS_NOT_INITIALIZED == 1 &&
              CUBLAS_STATUS_ALLOC_FAILED == 3 && CUBLAS_STATUS_INVALID_VALUE == 7 &&
              CUBLAS_STATUS_ARCH_MISMATCH == 8 && CUBLAS_STATUS_MAPPING_ERROR == 11 &&
              CUBLAS_STATUS_EXECUTION_FAILED == 13 && CUBLAS_STATUS_INTERNAL_ERROR == 14 &&
              CUBLAS_STATUS_NOT_SUPPORTED == 15 && CUBLAS_STATUS_LICENSE_ERROR == 16);

}  // namespace

// Each stream's entries (CudaStream::lt_cache), locked for the whole call: the descriptor's bias
// pointer is set per call.
class LtDescCache {
 public:
  std::mutex mu;
  LruCache<LtGemmKey, LtEntry, LtGemmKeyHash> lru{kLtCacheEntries};
};

namespace {
std::shared_ptr<LtDescCache> make_lt_desc_cache() { return std::make_shared<LtDescCache>(); }
}  // namespace

LtCacheStats blaslt_cache_stats(CudaStream& s) {
  LtDescCache& cache = s.lt_cache(make_lt_desc_cache);
  std::lock_guard lk(cache.mu);
  return {cache.lru.hits(), cache.lru.misses(), cache.lru.evictions(),
          static_cast<std::int64_t>(cache.lru.size())};
}

bool blaslt_gemm(CudaStream& s, const GemmExArgs& g, bool tf32, const std::string& where) {
  const LtGemmPlan p = lt_gemm_plan(g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
  if (!lt_plan_valid(p) || !typed_gemm_supported(g.a_type, g.b_type, g.c_type) ||
      !lt_epilogue_valid(g))
    return false;
  cublasLtHandle_t h = s.cublaslt();  // loads cuBLASLt (Note [Lazy cuBLAS])
  const CublasLtApi& api = cublaslt_api();
  LtDescCache& cache = s.lt_cache(make_lt_desc_cache);
  std::lock_guard lk(cache.mu);
  const LtGemmKey key = lt_gemm_key(g, tf32);
  LtEntry* e = cache.lru.find(key);
  if (!e) e = &cache.lru.insert(key, make_entry(api, h, g, p, tf32, where));
  if (!e->has_algo) return false;  // the caller's kernel runs
  // This call's bias and aux (a cached descriptor keeps the last call's).
  if (g.epilogue == GemmEpilogue::bias ||
      (g.epilogue == GemmEpilogue::gelu_aux_bias && g.bias != nullptr))
    DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)),
                       where);
  if (g.epilogue == GemmEpilogue::gelu_aux_bias || g.epilogue == GemmEpilogue::dgelu)
    DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(
                           e->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof(g.aux)),
                       where);
  const cublasStatus_t st =
      api.matmul(h, e->op, &g.alpha, g.B, e->first, g.A, e->second, &g.beta, g.C, e->out, g.C,
                 e->out, &e->algo, s.workspace(), CudaStream::kCublasWorkspaceBytes, s.get());
  if (lt_matmul_answer(static_cast<int>(st)) == LtAnswer::declined) {
    e->has_algo = false;  // nothing was enqueued: the caller's kernel runs, now and for this key
    return false;
  }
  DITTO_CUBLAS_CHECK(st, where);
  return true;
}

void blaslt_gelu_epilogue(CudaStream& s, const float* x, const float* eye, float* d,
                          std::int64_t rows, const std::string& where) {
  GemmExArgs g;
  g.M = rows, g.N = kGeluProbeCols, g.K = kGeluProbeCols;
  g.A = x, g.lda = kGeluProbeCols;
  g.B = eye, g.ldb = kGeluProbeCols;
  g.C = d, g.ldc = kGeluProbeCols;
  const LtGemmPlan p = lt_gemm_plan(g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
  if (rows < 1 || !lt_plan_valid(p))
    throw InvalidArgument(where + ": rows: expected >= 1, got " + std::to_string(rows));
  cublasLtHandle_t h = s.cublaslt();
  const CublasLtApi& api = cublaslt_api();
  // Not cached: a probe, run once.
  const LtEntry e = make_entry(api, h, g, p, false, where, CUBLASLT_EPILOGUE_GELU);
  if (!e.has_algo)
    throw GeluEpilogueUnsupported(where +
                                  ": cublasLtMatmulAlgoGetHeuristic found no algorithm for an "
                                  "f32 GEMM with CUBLASLT_EPILOGUE_GELU");
  const cublasStatus_t st =
      api.matmul(h, e.op, &g.alpha, g.B, e.first, g.A, e.second, &g.beta, g.C, e.out, g.C, e.out,
                 &e.algo, s.workspace(), CudaStream::kCublasWorkspaceBytes, s.get());
  if (lt_matmul_answer(static_cast<int>(st)) == LtAnswer::declined)
    throw GeluEpilogueUnsupported(detail::cat(where,
                                              ": cublasLtMatmul declined "
                                              "CUBLASLT_EPILOGUE_GELU (cuBLAS status ",
                                              static_cast<int>(st), ")"));
  DITTO_CUBLAS_CHECK(st, where);
}

GeluForm blaslt_gelu_epilogue_form(CudaBackend& be, int index) {
  const std::int64_t rows = kGeluProbeRows, cols = kGeluProbeCols;
  const std::vector<float> x = gelu_probe_inputs(rows * cols);
  std::vector<float> eye(static_cast<std::size_t>(cols * cols), 0.0f), d(x.size());
  for (std::int64_t i = 0; i < cols; ++i) eye[static_cast<std::size_t>(i * cols + i)] = 1.0f;
  struct Buffer {  // freed on every path
    CudaBackend& be;
    int index;
    std::size_t bytes;
    void* p = be.allocate(index, bytes);
    ~Buffer() { be.deallocate(index, p, bytes); }
  };
  Buffer dx{be, index, x.size() * 4}, de{be, index, eye.size() * 4}, dd{be, index, d.size() * 4};
  CudaStream& s = be.cuda_stream(index);
  be.copy_from_host(s, dx.p, x.data(), dx.bytes);
  be.copy_from_host(s, de.p, eye.data(), de.bytes);
  {
    const DeviceGuard guard(be.physical_device(index));
    blaslt_gelu_epilogue(s, static_cast<const float*>(dx.p), static_cast<const float*>(de.p),
                         static_cast<float*>(dd.p), rows, be.where(index) + " GELU epilogue probe");
  }
  be.copy_to_host(s, d.data(), dd.p, dd.bytes);
  s.synchronize();
  return gelu_epilogue_form(x, d);
}

bool blaslt_gelu_epilogue_is_tanh(CudaBackend& be) {
  std::vector<int> probed;  // physical GPUs
  for (int i = 0; i < be.device_count(); ++i) {
    const int gpu = be.physical_device(i);
    if (std::find(probed.begin(), probed.end(), gpu) != probed.end()) continue;
    probed.push_back(gpu);
    try {
      if (blaslt_gelu_epilogue_form(be, i) != GeluForm::tanh) return false;
    } catch (const GeluEpilogueUnsupported&) {  // the unfused path; any other error propagates
      return false;
    }
  }
  return !probed.empty();
}

}  // namespace ditto::cuda
