// The simulator's GEMM: a canonical (bitwise) kernel and Eigen's (fast).
//
// Bitwise kernel layout: blocks of kMc rows of op(A) are packed into panels of kMr rows
// ([K][kMr], zero-padded) and op(B) into panels of kNr columns ([K][kNr], zero-padded); a
// kMr x kNr block of accumulators runs the fma chain over k = 0..K-1 for every element at once,
// so the compiler emits vector fmas across j while each element still sees exactly the chain of
// Note [Canonical GEMM]. Padding lanes compute values that are never stored. Measured at 1.1-2x
// the time of Eigen's GEMM on AVX-512 for square sizes 64..512.
#include "backend_sim/sim_gemm.h"

#include "backend_sim/sim_eigen.h"  // first: its pragma must precede Eigen
#include <algorithm>
#include <vector>

#include "core/numerics/canonical_math.h"

namespace ditto::sim {

namespace {

constexpr std::int64_t kMr = 4;   // rows per micro-tile
constexpr std::int64_t kNr = 32;  // columns per micro-tile (a multiple of the vector width)
constexpr std::int64_t kMc = 128;  // rows of op(A) packed at a time (bounds the scratch memory)

// acc[r][j] = canonical chain over k of ap[k][r] * bp[k][j].
inline void micro_tile(const float* __restrict ap, const float* __restrict bp, std::int64_t K,
                       float (&acc)[kMr][kNr]) {
  for (auto& row : acc)
    for (float& v : row) v = 0.0f;
  for (std::int64_t k = 0; k < K; ++k) {
    const float* b = bp + k * kNr;
    for (std::int64_t r = 0; r < kMr; ++r) {
      const float a = ap[k * kMr + r];
      for (std::int64_t j = 0; j < kNr; ++j) acc[r][j] = canonical::dot_step(a, b[j], acc[r][j]);
    }
  }
}

}  // namespace

void gemm_bitwise(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc) {
  std::vector<float> apack(static_cast<std::size_t>(kMc * K));
  std::vector<float> bpack(static_cast<std::size_t>(kNr * K));
  alignas(64) float acc[kMr][kNr];
  for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
    const std::int64_t mc = std::min(kMc, M - i0);
    const std::int64_t panels = (mc + kMr - 1) / kMr;
    for (std::int64_t p = 0; p < panels; ++p) {  // op(A) rows [i0, i0 + mc) as [K][kMr] panels
      float* dst = apack.data() + p * kMr * K;
      for (std::int64_t r = 0; r < kMr; ++r) {
        const std::int64_t i = i0 + p * kMr + r;
        if (i >= M) {
          for (std::int64_t k = 0; k < K; ++k) dst[k * kMr + r] = 0.0f;
        } else if (trans_a) {  // A stored [K, M]
          for (std::int64_t k = 0; k < K; ++k) dst[k * kMr + r] = A[k * lda + i];
        } else {  // A stored [M, K]
          for (std::int64_t k = 0; k < K; ++k) dst[k * kMr + r] = A[i * lda + k];
        }
      }
    }
    for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
      const std::int64_t nr = std::min(kNr, N - j0);
      for (std::int64_t k = 0; k < K; ++k) {  // op(B) columns [j0, j0 + nr) as [K][kNr]
        float* dst = bpack.data() + k * kNr;
        if (trans_b) {  // B stored [N, K]
          for (std::int64_t j = 0; j < nr; ++j) dst[j] = B[(j0 + j) * ldb + k];
        } else {  // B stored [K, N]
          const float* src = B + k * ldb + j0;
          for (std::int64_t j = 0; j < nr; ++j) dst[j] = src[j];
        }
        for (std::int64_t j = nr; j < kNr; ++j) dst[j] = 0.0f;
      }
      for (std::int64_t p = 0; p < panels; ++p) {
        micro_tile(apack.data() + p * kMr * K, bpack.data(), K, acc);
        const std::int64_t mr = std::min(kMr, mc - p * kMr);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p * kMr + r) * ldc + j0;
          if (beta == 0.0f) {
            for (std::int64_t j = 0; j < nr; ++j)
              c[j] = canonical::gemm_epilogue(acc[r][j], alpha, 0.0f, 0.0f);
          } else {
            for (std::int64_t j = 0; j < nr; ++j)
              c[j] = canonical::gemm_epilogue(acc[r][j], alpha, beta, c[j]);
          }
        }
      }
    }
  }
}

namespace {

// out = canonical tree over shards [lo, hi) of the micro-tile chains over each shard's k range
// (bounds are offsets into the packed k dimension). The right subtree of a node at `level`
// lands in scratch[level]; the recursion is ceil(log2(S)) deep.
struct alignas(64) Tile {
  float v[kMr][kNr];
};

void sharded_micro_tile(const float* ap, const float* bp, const std::vector<std::int64_t>& bounds,
                        std::int64_t lo, std::int64_t hi, float (&out)[kMr][kNr], Tile* scratch,
                        int level) {
  if (hi - lo == 1) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(lo)];
    micro_tile(ap + k0 * kMr, bp + k0 * kNr, bounds[static_cast<std::size_t>(lo) + 1] - k0, out);
    return;
  }
  std::int64_t p = 1;  // tree_mid (core/numerics/determinism.h), spelled here to keep this file core-free
  while (p * 2 < hi - lo) p *= 2;
  sharded_micro_tile(ap, bp, bounds, lo, lo + p, out, scratch, level + 1);
  float(&right)[kMr][kNr] = scratch[level].v;
  sharded_micro_tile(ap, bp, bounds, lo + p, hi, right, scratch, level + 1);
  for (std::int64_t r = 0; r < kMr; ++r)
    for (std::int64_t j = 0; j < kNr; ++j) out[r][j] = canonical::add(out[r][j], right[r][j]);
}

}  // namespace

void gemm_tn_sharded_bitwise(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb,
                             const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                             bool accumulate) {
  const std::int64_t K = bounds.back();
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  int depth = 0;
  for (std::int64_t p = 1; p < shards; p *= 2) ++depth;
  std::vector<float> apack(static_cast<std::size_t>(kMc * K));
  std::vector<float> bpack(static_cast<std::size_t>(kNr * K));
  std::vector<Tile> scratch(static_cast<std::size_t>(depth) + 1);
  alignas(64) float acc[kMr][kNr];
  for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
    const std::int64_t mc = std::min(kMc, M - i0);
    const std::int64_t panels = (mc + kMr - 1) / kMr;
    for (std::int64_t p = 0; p < panels; ++p) {  // A^T rows [i0, i0 + mc) as [K][kMr] panels
      float* dst = apack.data() + p * kMr * K;
      for (std::int64_t r = 0; r < kMr; ++r) {
        const std::int64_t i = i0 + p * kMr + r;
        if (i >= M)
          for (std::int64_t k = 0; k < K; ++k) dst[k * kMr + r] = 0.0f;
        else
          for (std::int64_t k = 0; k < K; ++k) dst[k * kMr + r] = A[k * lda + i];
      }
    }
    for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
      const std::int64_t nr = std::min(kNr, N - j0);
      for (std::int64_t k = 0; k < K; ++k) {  // B columns [j0, j0 + nr) as [K][kNr]
        float* dst = bpack.data() + k * kNr;
        const float* src = B + k * ldb + j0;
        for (std::int64_t j = 0; j < nr; ++j) dst[j] = src[j];
        for (std::int64_t j = nr; j < kNr; ++j) dst[j] = 0.0f;
      }
      for (std::int64_t p = 0; p < panels; ++p) {
        sharded_micro_tile(apack.data() + p * kMr * K, bpack.data(), bounds, 0, shards, acc,
                           scratch.data(), 0);
        const std::int64_t mr = std::min(kMr, mc - p * kMr);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p * kMr + r) * ldc + j0;
          if (accumulate)
            for (std::int64_t j = 0; j < nr; ++j) c[j] = canonical::add(c[j], acc[r][j]);
          else
            for (std::int64_t j = 0; j < nr; ++j) c[j] = acc[r][j];
        }
      }
    }
  }
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

}  // namespace

void gemm_fast(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc) {
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

}  // namespace ditto::sim
