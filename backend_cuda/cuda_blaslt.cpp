// blaslt_gemm (cuda_blaslt.h): ditto's row-major typed GEMM as one column-major cublasLtMatmul.
#include "backend_cuda/cuda_blaslt.h"

#include <cublasLt.h>

#include <cstdint>

#include "backend_cuda/cublas_lazy.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_stream.h"

namespace ditto::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  if (t == DType::bf16) return CUDA_R_16BF;
  if (t == DType::f16) return CUDA_R_16F;
  return CUDA_R_32F;
}

// Owners of the cuBLASLt descriptors of one call (destroyed on every path).
struct Descs {
  const CublasLtApi& api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  explicit Descs(const CublasLtApi& a) : api(a) {}
  ~Descs() {
    if (pref) (void)api.preference_destroy(pref);
    if (out) (void)api.matrix_layout_destroy(out);
    if (second) (void)api.matrix_layout_destroy(second);
    if (first) (void)api.matrix_layout_destroy(first);
    if (op) (void)api.matmul_desc_destroy(op);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

}  // namespace

bool blaslt_gemm(CudaStream& s, const GemmExArgs& g, bool tf32, const std::string& where) {
  const LtGemmPlan p = lt_gemm_plan(g.trans_a, g.trans_b, g.M, g.N, g.K, g.lda, g.ldb, g.ldc);
  if (!lt_plan_valid(p) || !typed_gemm_supported(g.a_type, g.b_type, g.c_type)) return false;
  const bool bias = g.epilogue == GemmEpilogue::bias;
  cublasLtHandle_t h = s.cublaslt();  // loads cuBLASLt (Note [Lazy cuBLAS])
  const CublasLtApi& api = cublaslt_api();
  Descs d(api);
  const cublasComputeType_t compute =
      tf32 && g.a_type == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  DITTO_CUBLAS_CHECK(api.matmul_desc_create(&d.op, compute, CUDA_R_32F), where);
  const cublasOperation_t op_first = p.first.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.second.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                   sizeof(op_first)),
                     where);
  DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                   sizeof(op_second)),
                     where);
  const cudaDataType_t ab = cuda_type(g.a_type), c = cuda_type(g.c_type);
  if (bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DITTO_CUBLAS_CHECK(
        api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        where);
    DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)),
                       where);
    DITTO_CUBLAS_CHECK(api.matmul_desc_set_attribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &c, sizeof(c)),
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

  DITTO_CUBLAS_CHECK(api.preference_create(&d.pref), where);
  const std::size_t ws = CudaStream::kCublasWorkspaceBytes;
  DITTO_CUBLAS_CHECK(api.preference_set_attribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws)),
                     where);
  auto align = [&](cublasLtMatmulPreferenceAttributes_t attr, const void* ptr) {
    const std::uint32_t a = lt_alignment(reinterpret_cast<std::uintptr_t>(ptr));
    DITTO_CUBLAS_CHECK(api.preference_set_attribute(d.pref, attr, &a, sizeof(a)), where);
  };
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.B);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.A);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.C);
  align(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.C);

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st = api.algo_get_heuristic(h, d.op, d.first, d.second, d.out, d.out,
                                                   d.pref, 1, &heuristic, &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED ||
      (st == CUBLAS_STATUS_SUCCESS && (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS)))
    return false;  // no algorithm for these types and layouts: the caller's kernel runs
  DITTO_CUBLAS_CHECK(st, where);
  DITTO_CUBLAS_CHECK(api.matmul(h, d.op, &g.alpha, g.B, d.first, g.A, d.second, &g.beta, g.C,
                                d.out, g.C, d.out, &heuristic.algo, s.workspace(), ws, s.get()),
                     where);
  return true;
}

}  // namespace ditto::cuda
