// The simulator's portable bitwise GEMM kernel: a 4 x 32 micro-tile loop in plain C++, the
// canonical chain of Note [Canonical GEMM] for every element (what runs on a CPU without AVX2 and
// FMA; the vector kernels, Note [Bitwise GEMM kernel] in sim_gemm_driver.h, give the same bits).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend_sim/sim_gemm_kernels.h"
#include "core/numerics/canonical_math.h"

namespace ditto::sim::gemm_detail {

namespace {

constexpr std::int64_t kPMr = 4;    // rows per micro-tile
constexpr std::int64_t kPNr = 32;   // columns per micro-tile
constexpr std::int64_t kPMc = 128;  // rows of op(A) packed at a time

// acc[r][j] = canonical chain over k of ap[k][r] * bp[k][j].
inline void portable_micro_tile(const float* __restrict ap, const float* __restrict bp,
                                std::int64_t K, float (&acc)[kPMr][kPNr]) {
  for (auto& row : acc)
    for (float& v : row) v = 0.0f;
  for (std::int64_t k = 0; k < K; ++k) {
    const float* b = bp + k * kPNr;
    for (std::int64_t r = 0; r < kPMr; ++r) {
      const float a = ap[k * kPMr + r];
      for (std::int64_t j = 0; j < kPNr; ++j) acc[r][j] = canonical::dot_step(a, b[j], acc[r][j]);
    }
  }
}

void portable_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                   float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                   float beta, float* C, std::int64_t ldc) {
  std::vector<float> apack(static_cast<std::size_t>(kPMc * K));
  std::vector<float> bpack(static_cast<std::size_t>(kPNr * K));
  alignas(64) float acc[kPMr][kPNr];
  for (std::int64_t i0 = 0; i0 < M; i0 += kPMc) {
    const std::int64_t mc = std::min(kPMc, M - i0);
    const std::int64_t panels = (mc + kPMr - 1) / kPMr;
    for (std::int64_t p = 0; p < panels; ++p) {  // op(A) rows [i0, i0 + mc) as [K][kPMr] panels
      float* dst = apack.data() + p * kPMr * K;
      for (std::int64_t r = 0; r < kPMr; ++r) {
        const std::int64_t i = i0 + p * kPMr + r;
        if (i >= M) {
          for (std::int64_t k = 0; k < K; ++k) dst[k * kPMr + r] = 0.0f;
        } else if (trans_a) {  // A stored [K, M]
          for (std::int64_t k = 0; k < K; ++k) dst[k * kPMr + r] = A[k * lda + i];
        } else {  // A stored [M, K]
          for (std::int64_t k = 0; k < K; ++k) dst[k * kPMr + r] = A[i * lda + k];
        }
      }
    }
    for (std::int64_t j0 = 0; j0 < N; j0 += kPNr) {
      const std::int64_t nr = std::min(kPNr, N - j0);
      for (std::int64_t k = 0; k < K; ++k) {  // op(B) columns [j0, j0 + nr) as [K][kPNr]
        float* dst = bpack.data() + k * kPNr;
        if (trans_b) {  // B stored [N, K]
          for (std::int64_t j = 0; j < nr; ++j) dst[j] = B[(j0 + j) * ldb + k];
        } else {  // B stored [K, N]
          const float* src = B + k * ldb + j0;
          for (std::int64_t j = 0; j < nr; ++j) dst[j] = src[j];
        }
        for (std::int64_t j = nr; j < kPNr; ++j) dst[j] = 0.0f;
      }
      for (std::int64_t p = 0; p < panels; ++p) {
        portable_micro_tile(apack.data() + p * kPMr * K, bpack.data(), K, acc);
        const std::int64_t mr = std::min(kPMr, mc - p * kPMr);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p * kPMr + r) * ldc + j0;
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

// out = canonical tree over shards [lo, hi) of the micro-tile chains over each shard's k range
// (bounds are offsets into the packed k dimension). The right subtree of a node at `level`
// lands in scratch[level]; the recursion is ceil(log2(S)) deep.
struct alignas(64) PTile {
  float v[kPMr][kPNr];
};

void portable_sharded_micro_tile(const float* ap, const float* bp,
                                 const std::vector<std::int64_t>& bounds, std::int64_t lo,
                                 std::int64_t hi, float (&out)[kPMr][kPNr], PTile* scratch,
                                 int level) {
  if (hi - lo == 1) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(lo)];
    portable_micro_tile(ap + k0 * kPMr, bp + k0 * kPNr,
                        bounds[static_cast<std::size_t>(lo) + 1] - k0, out);
    return;
  }
  std::int64_t p =
      1;  // tree_mid (core/numerics/determinism.h), spelled here to keep this file core-free
  while (p * 2 < hi - lo) p *= 2;
  portable_sharded_micro_tile(ap, bp, bounds, lo, lo + p, out, scratch, level + 1);
  float(&right)[kPMr][kPNr] = scratch[level].v;
  portable_sharded_micro_tile(ap, bp, bounds, lo + p, hi, right, scratch, level + 1);
  for (std::int64_t r = 0; r < kPMr; ++r)
    for (std::int64_t j = 0; j < kPNr; ++j) out[r][j] = canonical::add(out[r][j], right[r][j]);
}

void portable_gemm_tn_sharded(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                              const float* B, std::int64_t ldb,
                              const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                              bool accumulate) {
  const std::int64_t K = bounds.back();
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  int depth = 0;
  for (std::int64_t p = 1; p < shards; p *= 2) ++depth;
  std::vector<float> apack(static_cast<std::size_t>(kPMc * K));
  std::vector<float> bpack(static_cast<std::size_t>(kPNr * K));
  std::vector<PTile> scratch(static_cast<std::size_t>(depth) + 1);
  alignas(64) float acc[kPMr][kPNr];
  for (std::int64_t i0 = 0; i0 < M; i0 += kPMc) {
    const std::int64_t mc = std::min(kPMc, M - i0);
    const std::int64_t panels = (mc + kPMr - 1) / kPMr;
    for (std::int64_t p = 0; p < panels; ++p) {  // A^T rows [i0, i0 + mc) as [K][kPMr] panels
      float* dst = apack.data() + p * kPMr * K;
      for (std::int64_t r = 0; r < kPMr; ++r) {
        const std::int64_t i = i0 + p * kPMr + r;
        if (i >= M)
          for (std::int64_t k = 0; k < K; ++k) dst[k * kPMr + r] = 0.0f;
        else
          for (std::int64_t k = 0; k < K; ++k) dst[k * kPMr + r] = A[k * lda + i];
      }
    }
    for (std::int64_t j0 = 0; j0 < N; j0 += kPNr) {
      const std::int64_t nr = std::min(kPNr, N - j0);
      for (std::int64_t k = 0; k < K; ++k) {  // B columns [j0, j0 + nr) as [K][kPNr]
        float* dst = bpack.data() + k * kPNr;
        const float* src = B + k * ldb + j0;
        for (std::int64_t j = 0; j < nr; ++j) dst[j] = src[j];
        for (std::int64_t j = nr; j < kPNr; ++j) dst[j] = 0.0f;
      }
      for (std::int64_t p = 0; p < panels; ++p) {
        portable_sharded_micro_tile(apack.data() + p * kPMr * K, bpack.data(), bounds, 0, shards,
                                    acc, scratch.data(), 0);
        const std::int64_t mr = std::min(kPMr, mc - p * kPMr);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p * kPMr + r) * ldc + j0;
          if (accumulate)
            for (std::int64_t j = 0; j < nr; ++j) c[j] = canonical::add(c[j], acc[r][j]);
          else
            for (std::int64_t j = 0; j < nr; ++j) c[j] = acc[r][j];
        }
      }
    }
  }
}

}  // namespace

const GemmKernels kPortableKernels{&portable_gemm, &portable_gemm_tn_sharded};

}  // namespace ditto::sim::gemm_detail
