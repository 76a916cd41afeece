// The instruction-set kernels of the simulator's bitwise GEMM, each with gemm_bitwise's and
// gemm_tn_sharded_bitwise's contracts (sim_gemm.h): sim_gemm_portable.cpp (always built),
// sim_gemm_avx512.cpp (built when the compiler targets AVX-512) and sim_gemm_avx2.cpp (AVX2 and
// FMA but not AVX-512); the compiler's target is the build machine's CPU (DITTO_MARCH_NATIVE).
// sim_gemm.cpp runs the best one built. Internal to backend_sim, not installed.
#pragma once

#include <cstdint>
#include <vector>

namespace ditto::sim::gemm_detail {

struct GemmKernels {
  void (*gemm)(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc);
  void (*gemm_tn_sharded)(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                          const float* B, std::int64_t ldb, const std::vector<std::int64_t>& bounds,
                          float* C, std::int64_t ldc, bool accumulate);
};

extern const GemmKernels kPortableKernels;
#if defined(__AVX512F__)
extern const GemmKernels kAvx512Kernels;
#elif defined(__AVX2__) && defined(__FMA__)
extern const GemmKernels kAvx2Kernels;
#endif

}  // namespace ditto::sim::gemm_detail
