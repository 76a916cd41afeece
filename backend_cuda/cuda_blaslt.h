// The typed GEMM's fast path on cuBLASLt (Kernels::gemm_ex in fast mode, cuda_kernels.cu): one
// cublasLtMatmul per call with the operands in their storage dtypes (f32, bf16, f16), f32
// accumulation (CUBLAS_COMPUTE_32F; CUBLAS_COMPUTE_32F_FAST_TF32 for f32 under
// BackendOptions::allow_tf32) and the bias epilogue (CUBLASLT_EPILOGUE_BIAS). The row-major ->
// column-major mapping is cuda_host_logic.h's lt_gemm_plan, checked on the CPU
// (tests/test_cuda_host_logic.cpp); the call itself on a GPU (tests/test_cuda_fixes.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "backend_cuda/cuda_host_logic.h"
#include "core/runtime/backend.h"

namespace ditto::cuda {

class CudaStream;

/// Enqueues g (checked by core; typed_gemm_supported dtypes) on `s` as one cublasLtMatmul and
/// returns true, or returns false having enqueued nothing when cuBLASLt cannot take it
/// (lt_plan_valid fails: K == 0 or strides it refuses; lt_epilogue_valid fails: a GELU
/// epilogue's aux stride or alignment cuBLASLt refuses, a bias not 16-byte aligned; no algorithm
/// from cublasLtMatmulAlgoGetHeuristic for these types, layouts and alignments): the caller then
/// runs its own kernel. `tf32`: f32 operands on TF32 tensor cores (lt_use_tf32). A failing cuBLASLt
/// call throws BackendError naming `where` and the call.
/// The matmul descriptor, the three layouts and the heuristic's algorithm of each call are
/// cached per stream (CudaStream::lt_cache) under lt_gemm_key(g, tf32) (cuda_host_logic.h), an
/// LRU of kLtCacheEntries entries: a repeated call (every training step's GEMMs after the first)
/// only sets the bias (and aux) pointer and calls cublasLtMatmul. GemmEpilogue::gelu_aux_bias
/// and dgelu run as CUBLASLT_EPILOGUE_GELU_AUX_BIAS (GELU_AUX without a bias) and
/// CUBLASLT_EPILOGUE_DGELU with the aux
/// matrix as CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER / _AUX_LD (its type C's). A key without an
/// algorithm is cached too.
bool blaslt_gemm(CudaStream& s, const GemmExArgs& g, bool tf32, const std::string& where);

/// Counters of a stream's descriptor cache (for tests): lookups that found their key, lookups
/// that made new descriptors, entries evicted, entries held.
struct LtCacheStats {
  std::int64_t hits = 0, misses = 0, evictions = 0, size = 0;
};
LtCacheStats blaslt_cache_stats(CudaStream& s);

/// blaslt_gelu_epilogue's BackendError when cuBLASLt does not support the GELU epilogue (no
/// algorithm, or a status Note [cuBLASLt declines] (cuda_host_logic.h) reads as "not offered
/// here"): the one failure that blaslt_gelu_epilogue_is_tanh answers with "the unfused path".
class GeluEpilogueUnsupported : public BackendError {
 public:
  using BackendError::BackendError;
};

/// Columns of blaslt_gelu_epilogue's matrices.
inline constexpr std::int64_t kGeluProbeCols = 16;

/// A probe of what cuBLASLt's CUBLASLT_EPILOGUE_GELU computes, the tanh form of GELU (the GPT's,
/// torch.nn.GELU(approximate='tanh'); llm.c fuses it into its c_fc GEMM) or the erf form
/// (torch.nn.GELU()): the answer decides whether ditto's fast mode may fuse its GELU into the
/// GEMM, and no document states it (issue 29). Enqueues on `s` one cublasLtMatmul, f32 with
/// CUBLAS_COMPUTE_32F (no TF32): d = GELU(x @ eye), all device pointers to row-major f32
/// [rows, kGeluProbeCols] matrices (eye: the [kGeluProbeCols, kGeluProbeCols] identity, so the
/// product is x exactly and d is the epilogue's GELU of x). Not cached. Throws InvalidArgument for
/// rows < 1, GeluEpilogueUnsupported naming `where` when cuBLASLt has no algorithm for it or
/// cublasLtMatmul declines it (lt_heuristic_answer / lt_matmul_answer: declined), BackendError
/// when a call fails.
void blaslt_gelu_epilogue(CudaStream& s, const float* x, const float* eye, float* d,
                          std::int64_t rows, const std::string& where);

class CudaBackend;

/// blaslt_gelu_epilogue on logical device `index` of `be` (on its stream, waited for) over
/// kGeluProbeRows x kGeluProbeCols inputs gelu_probe_inputs(...), and which form its outputs are
/// (gelu_epilogue_form, cuda_host_logic.h). Throws BackendError / OutOfMemory as the calls it
/// makes.
GeluForm blaslt_gelu_epilogue_form(CudaBackend& be, int index);

/// Whether cuBLASLt's GELU epilogue is the tanh form on every GPU of `be`: the probe
/// (blaslt_gelu_epilogue_form) once on each physical GPU, on the first logical device on it;
/// false at the first GPU whose answer is erf or other, or where cuBLASLt does not support the
/// epilogue (GeluEpilogueUnsupported: then the unfused path runs), and for a backend without
/// devices. Any other error of the probe (a sticky CUDA error from an earlier fault, out of
/// memory) is rethrown, so it is reported where it was met rather than at a later call. Kernels::
/// has_gemm_gelu_epilogue caches the answer (one probe per GPU per backend).
bool blaslt_gelu_epilogue_is_tanh(CudaBackend& be);

}  // namespace ditto::cuda
