// The simulator's GEMM: which kernel runs. The canonical (bitwise) GEMM runs the best kernel this
// build has (Note [Bitwise GEMM kernel], sim_gemm_driver.h: AVX-512 in sim_gemm_avx512.cpp, AVX2
// and FMA in sim_gemm_avx2.cpp, else the portable loop of sim_gemm_portable.cpp); the fast one a
// BLAS library when the build found one, else Eigen (Note [Fast GEMM choice]); both split large
// products over the simulator's pool (Note [Intra-op parallelism]).
#include "backend_sim/sim_gemm.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_eigen.h"  // first: its pragma must precede Eigen

#if defined(DITTO_HAVE_OPENBLAS)
#include <cblas.h>
#endif

#include "backend_sim/sim_executor.h"
#include "backend_sim/sim_gemm_kernels.h"

namespace ditto::sim {

namespace {

// The bitwise kernel of this build: the compiler's target (-march=native) picks it.
const gemm_detail::GemmKernels& bitwise_kernels() {
#if defined(__AVX512F__)
  return gemm_detail::kAvx512Kernels;
#elif defined(__AVX2__) && defined(__FMA__)
  return gemm_detail::kAvx2Kernels;
#else
  return gemm_detail::kPortableKernels;
#endif
}

}  // namespace

void gemm_bitwise(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc) {
  bitwise_kernels().gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_tn_sharded_bitwise(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb,
                             const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                             bool accumulate) {
  bitwise_kernels().gemm_tn_sharded(M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
}

namespace {

using ColMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Stride = Eigen::OuterStride<>;
using CMap = Eigen::Map<RowMat, 0, Stride>;

template <typename MapA, typename MapB>
void eigen_gemm(const MapA& a, const MapB& b, float alpha, float beta, CMap& c) {
  if (beta == 0.0f) {
    c.noalias() = alpha * (a * b);
  } else {
    if (beta != 1.0f) c *= beta;
    c.noalias() += alpha * (a * b);
  }
}

#if defined(DITTO_HAVE_OPENBLAS)
// OpenBLAS runs single-threaded here (the simulator splits work over its own pool, Note [Sim
// executor]), and only when it picked kernels for this CPU: on some virtual CPUs it falls back
// to its SSE3 "Prescott" kernels, 4x slower than Eigen, and then Eigen serves.
bool openblas_usable() {
  static const bool usable = [] {
    openblas_set_num_threads(1);
    const char* core = openblas_get_corename();
    return core != nullptr && std::strcmp(core, "Prescott") != 0 &&
           std::strcmp(core, "prescott") != 0;
  }();
  return usable;
}
#endif

// Note [Fast GEMM choice]
// Fast mode may sum in any order, so its GEMM is whichever is fastest here. Measured with
// bench_bitwise on an AMD EPYC with AVX-512 (2026-12-03): Debian 12's OpenBLAS 0.3.21 runs its
// AVX2 "Haswell" kernels there (it has AVX-512 sgemm kernels only for Intel's SkylakeX,
// Cooperlake and SapphireRapids), and reached 83-194 GFLOP/s where the bitwise kernel
// (sim_gemm_avx512.cpp) reached 133-313: 1.3-1.9x. So when this build has the AVX-512 kernel and
// OpenBLAS's core has no AVX-512 kernels, fast mode runs the bitwise kernel (its bits are then
// bitwise mode's for the GEMMs; the reductions stay fast mode's). Otherwise OpenBLAS, else Eigen.
// DITTO_SIM_FAST_GEMM=blas keeps the library (for measurements).
bool fast_uses_own_kernel() {
#if defined(__AVX512F__) && defined(DITTO_HAVE_OPENBLAS)
  static const bool own = [] {
    const char* env = std::getenv("DITTO_SIM_FAST_GEMM");
    if (env != nullptr && std::strcmp(env, "blas") == 0) return false;
    if (!openblas_usable()) return false;  // Eigen serves; not compared with it
    std::string core = openblas_get_corename();
    for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return core != "skylakex" && core != "cooperlake" && core != "sapphirerapids";
  }();
  return own;
#else
  return false;
#endif
}

}  // namespace

void gemm_fast(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc) {
  if (fast_uses_own_kernel()) {
    gemm_bitwise(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#if defined(DITTO_HAVE_OPENBLAS)
  if (openblas_usable()) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
                static_cast<blasint>(N), static_cast<blasint>(K), alpha, A,
                static_cast<blasint>(lda), B, static_cast<blasint>(ldb), beta, C,
                static_cast<blasint>(ldc));
    return;
  }
#endif
  // A row-major [K, M] with row stride lda is a column-major [M, K] with column stride lda.
  using RowC = Eigen::Map<const RowMat, 0, Stride>;
  using ColC = Eigen::Map<const ColMat, 0, Stride>;
  CMap c(C, M, N, Stride(ldc));
  if (!trans_a && !trans_b)
    eigen_gemm(RowC(A, M, K, Stride(lda)), RowC(B, K, N, Stride(ldb)), alpha, beta, c);
  else if (!trans_a && trans_b)
    eigen_gemm(RowC(A, M, K, Stride(lda)), ColC(B, K, N, Stride(ldb)), alpha, beta, c);
  else if (trans_a && !trans_b)
    eigen_gemm(ColC(A, M, K, Stride(lda)), RowC(B, K, N, Stride(ldb)), alpha, beta, c);
  else
    eigen_gemm(ColC(A, M, K, Stride(lda)), ColC(B, K, N, Stride(ldb)), alpha, beta, c);
}

const char* gemm_fast_library() {
  if (fast_uses_own_kernel()) return "ditto AVX-512 (OpenBLAS has no AVX-512 kernels for this CPU)";
#if defined(DITTO_HAVE_OPENBLAS)
  if (openblas_usable()) return "OpenBLAS";
#endif
  return "Eigen";
}

// ---- intra-op parallelism (Note [Intra-op parallelism] in sim_executor.h) -------------------

namespace {

// Below this many flops (about 0.15 ms on one core) waking a helper costs more than it saves.
constexpr double kSplitMinFlops = 2e7;

// DITTO_SIM_INTRA_OP=0 keeps every GEMM on its device's thread (for measurements).
bool intra_op_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("DITTO_SIM_INTRA_OP");
    return !(env != nullptr && std::strcmp(env, "0") == 0);
  }();
  return on;
}

// fn(r0, r1, c0, c1) over blocks of C[M, N]: whole rows when M > N, else whole columns, about
// four blocks per hardware thread (whole 32-column panels, 48-row blocks), run through
// Executor::parallel_for; one call on the caller when the product is small or no pool thread is
// idle (every device busy: the cores are used already).
template <typename Fn>
void run_split(std::int64_t M, std::int64_t N, std::int64_t K, const Fn& fn) {
  const int hw = Executor::hardware_threads();
  if (!intra_op_enabled() || hw == 1 || 2.0 * M * N * K < kSplitMinFlops ||
      !Executor::instance().has_idle_thread()) {
    fn(0, M, 0, N);
    return;
  }
  const bool by_rows = M > N;
  const std::int64_t dim = by_rows ? M : N, granule = by_rows ? 48 : 32;
  std::int64_t chunk = (dim + 4 * hw - 1) / (4 * hw);  // small blocks: a helper the OS delays
                                                       // holds up the caller less
  chunk = (chunk + granule - 1) / granule * granule;
  const std::int64_t chunks = (dim + chunk - 1) / chunk;
  if (chunks <= 1) {
    fn(0, M, 0, N);
    return;
  }
  Executor::instance().parallel_for(chunks, [&](std::int64_t c) {
    const std::int64_t lo = c * chunk, hi = std::min(dim, lo + chunk);
    if (by_rows)
      fn(lo, hi, std::int64_t{0}, N);
    else
      fn(std::int64_t{0}, M, lo, hi);
  });
}

}  // namespace

void gemm_split(bool bitwise, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  run_split(M, N, K, [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    const float* a = trans_a ? A + r0 : A + r0 * lda;
    const float* b = trans_b ? B + c0 * ldb : B + c0;
    float* c = C + r0 * ldc + c0;
    if (bitwise)
      gemm_bitwise(trans_a, trans_b, r1 - r0, c1 - c0, K, alpha, a, lda, b, ldb, beta, c, ldc);
    else
      gemm_fast(trans_a, trans_b, r1 - r0, c1 - c0, K, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

void gemm_tn_sharded_split(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                           const float* B, std::int64_t ldb,
                           const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                           bool accumulate) {
  run_split(M, N, bounds.back(),
            [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
              gemm_tn_sharded_bitwise(r1 - r0, c1 - c0, A + r0, lda, B + c0, ldb, bounds,
                                      C + r0 * ldc + c0, ldc, accumulate);
            });
}

}  // namespace ditto::sim
