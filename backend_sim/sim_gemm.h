// Host GEMM routines of the simulator's kernels, run synchronously on the calling thread (the
// virtual device's worker; the kernels split large ones over the pool, Note [Sim executor]). Split out of sim_kernels.cpp so they can be benchmarked and tested
// on their own.
#pragma once

#include <cstdint>
#include <vector>

namespace ditto::sim {

/// C[M,N] = alpha * op(A) @ op(B) + beta * C (row-major; lda/ldb/ldc row strides in elements of
/// the matrices as stored). Bitwise: Note [Canonical GEMM] (core/numerics/canonical_math.h), vectorised
/// across output elements, the k chain never split. M, N > 0; K may be 0.
void gemm_bitwise(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc);

/// C[M,N] = (accumulate ? C + T : T) with T = canonical tree (Note [Canonical tree]) over the
/// shards s of bounds (S + 1 row offsets from 0 to rows) of P_s = A[rows_s, :]^T @ B[rows_s, :],
/// each element of P_s one fma chain over the shard's rows ascending from 0.0f. A is [rows, M]
/// (stride lda), B is [rows, N] (stride ldb). Packs like gemm_bitwise and evaluates the tree
/// per register tile, so it costs about what one canonical GEMM over all rows does. M, N > 0.
void gemm_tn_sharded_bitwise(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb,
                             const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                             bool accumulate);

/// Same contract in any summation order: the fastest of what the build has (Note [Fast GEMM
/// choice], sim_gemm.cpp): gemm_bitwise's AVX-512 kernel when OpenBLAS has no AVX-512 kernels
/// for this CPU, else OpenBLAS (single-threaded) when the build found it and it runs on kernels
/// for this CPU, else Eigen's blocked GEMM.
void gemm_fast(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc);

/// gemm_bitwise (bitwise) or gemm_fast over blocks of whole rows or columns of C, split over the
/// idle threads of the simulator's pool when the product is large (Note [Intra-op parallelism],
/// sim_executor.h); otherwise one call on the calling thread. Every element is computed exactly as
/// by the single call, so bitwise results do not depend on the split. DITTO_SIM_INTRA_OP=0
/// disables the split.
void gemm_split(bool bitwise, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                std::int64_t ldb, float beta, float* C, std::int64_t ldc);

/// gemm_tn_sharded_bitwise split the same way (over C's rows or columns, never over the shards).
void gemm_tn_sharded_split(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                           const float* B, std::int64_t ldb,
                           const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                           bool accumulate);

/// What gemm_fast runs on: "OpenBLAS", "Eigen" or the AVX-512 kernel's description.
const char* gemm_fast_library();

}  // namespace ditto::sim
