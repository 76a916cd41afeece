// The simulator's GEMM: a canonical (bitwise) kernel and a fast one (a BLAS library when the
// build found one, else Eigen).
//
// Note [Bitwise GEMM kernel]
// The canonical kernel (Note [Canonical GEMM]) is blocked like a BLAS GEMM but never splits the
// k chain. With AVX-512: k is cut into blocks of at most kKc; for each block op(B)'s rows are
// packed once into panels of 16 or 32 columns ([kc][w], zero-padded) and op(A)'s rows, kMc at a
// time, into panels of kMr = 12 rows ([kc][12], zero-padded); a 12 x 32 micro-tile keeps its 24
// vectors of accumulators in registers for the whole block, one vector fma per (row, 16 columns,
// k), k ascending. Between two k blocks the accumulators go through memory (C itself when beta
// == 0, else a scratch copy) and are reloaded unchanged, so every element sees exactly the chain
// acc = fma(a_k, b_k, acc) from 0.0f over k = 0..K-1 and then gemm_epilogue: the same bits as
// the plain loop. Transposed operands are packed with 16 x 16 register transposes. Padding lanes
// compute values that are never stored.
//
// With AVX2 and FMA but no AVX-512 (most laptops; AMD Zen 2 and 3) the same structure on 16 ymm
// registers: a 6 x 16 micro-tile (BLIS's Haswell shape: 12 accumulator vectors, 2 vectors of op(B)
// and 1 broadcast of op(A) per k, 12 fmas), op(B) packed per k block into panels of 16 columns (the
// last 8 or 16 wide), op(A) 144 rows at a time into 6-row panels, k blocks of at most 256 (a 16 KiB
// B panel stays in L1, the 144 KiB A block in L2), 8 x 8 register transposes, masked loads at the
// edges (never past an operand's last element) and stores of the tile's own lanes only; the sharded
// TN kernel likewise. Measured on an AMD EPYC Zen 3 (2 cores, 2026-12-03, with a CI build running
// beside it, load 3-5), one thread, best of 10-25 (a harness, not in the repository, calling
// gemm_bitwise and gemm_fast, OpenBLAS's Zen kernels, directly): bitwise / fast 1.1-1.5 at 64,
// 0.97-1.07 at 256, 0.87-1.16 at 512, 0.84-0.95 at 1024, 0.82-1.04 for the MLP's NT shapes (6 x 16
// reaches 75-88 GF/s); the portable loop 0.39-0.58. bench_bitwise --gemm-only (the pool on; median
// of 3, two series, 15:33 and 16:02, each under a CI build): 1.13 / 0.76 at 64, 1.13 / 1.00 at 256,
// 1.04 / 0.95 at 512, 1.12 / 0.89 at 1024, 0.95-1.02 / 0.91-0.96 on the NT rows (the portable loop:
// 0.39-0.67 / 0.51-0.66); single runs ranged 0.41-1.91, the noise of the load. The sharded TN
// kernel (dW = dY^T X) 0.86-1.03 of OpenBLAS's TN product (the portable one 0.44-0.76). A 4 x 24
// tile (3 B vectors, 4 broadcasts) measured 0.7-0.78; k blocks of 384 and 72-row A blocks were
// within the noise of 256 and 144. Without either, a portable 4 x 32 loop does the same.
#include "backend_sim/sim_gemm.h"

#include "backend_sim/sim_eigen.h"  // first: its pragma must precede Eigen
#include <algorithm>
#include <string>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(DITTO_HAVE_OPENBLAS)
#include <cblas.h>
#endif

// The micro-tile keeps its accumulators in registers only if its loops over rows and vectors are
// unrolled completely (-O2 does not): hence the #pragma GCC unroll in the AVX-512 kernel.

#include "backend_sim/sim_executor.h"
#include "core/numerics/canonical_math.h"

namespace ditto::sim {

namespace {

// ---- portable kernel (no AVX-512) ----------------------------------------------------------

constexpr std::int64_t kPMr = 4;    // rows per micro-tile
constexpr std::int64_t kPNr = 32;   // columns per micro-tile
constexpr std::int64_t kPMc = 128;  // rows of op(A) packed at a time

// acc[r][j] = canonical chain over k of ap[k][r] * bp[k][j].
[[maybe_unused]] inline void portable_micro_tile(const float* __restrict ap,
                                                 const float* __restrict bp, std::int64_t K,
                                                 float (&acc)[kPMr][kPNr]) {
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

[[maybe_unused]] void portable_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                                    std::int64_t K, float alpha, const float* A, std::int64_t lda,
                                    const float* B, std::int64_t ldb, float beta, float* C,
                                    std::int64_t ldc) {
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

[[maybe_unused]] void portable_sharded_micro_tile(const float* ap, const float* bp,
                                                  const std::vector<std::int64_t>& bounds,
                                                  std::int64_t lo, std::int64_t hi,
                                                  float (&out)[kPMr][kPNr], PTile* scratch,
                                                  int level) {
  if (hi - lo == 1) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(lo)];
    portable_micro_tile(ap + k0 * kPMr, bp + k0 * kPNr, bounds[static_cast<std::size_t>(lo) + 1] - k0,
                        out);
    return;
  }
  std::int64_t p = 1;  // tree_mid (core/numerics/determinism.h), spelled here to keep this file core-free
  while (p * 2 < hi - lo) p *= 2;
  portable_sharded_micro_tile(ap, bp, bounds, lo, lo + p, out, scratch, level + 1);
  float(&right)[kPMr][kPNr] = scratch[level].v;
  portable_sharded_micro_tile(ap, bp, bounds, lo + p, hi, right, scratch, level + 1);
  for (std::int64_t r = 0; r < kPMr; ++r)
    for (std::int64_t j = 0; j < kPNr; ++j) out[r][j] = canonical::add(out[r][j], right[r][j]);
}

[[maybe_unused]] void portable_gemm_tn_sharded(std::int64_t M, std::int64_t N, const float* A,
                                               std::int64_t lda, const float* B, std::int64_t ldb,
                                               const std::vector<std::int64_t>& bounds, float* C,
                                               std::int64_t ldc, bool accumulate) {
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

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// ---- shared by the AVX-512 and AVX2 kernels --------------------------------------------------

enum class Out { raw, alpha, beta };  // what the last k block stores: acc, alpha*acc, epilogue

// Scratch buffers of one thread, grown as needed and kept (a device's worker calls GEMMs of the
// same shapes step after step).
struct Scratch {
  std::vector<float, Eigen::aligned_allocator<float>> a, b, acc;
  static float* grow(std::vector<float, Eigen::aligned_allocator<float>>& v, std::int64_t n) {
    if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
    return v.data();
  }
};
thread_local Scratch t_scratch;

#endif

#if defined(__AVX512F__)
// ---- AVX-512 kernel (Note [Bitwise GEMM kernel]) -------------------------------------------

constexpr int kMr = 12;              // rows per micro-tile (24 accumulator vectors)
constexpr std::int64_t kMc = 120;    // rows of op(A) packed at a time (a multiple of kMr)
constexpr std::int64_t kKc = 320;    // k block: a 32-column B panel of kKc rows fits L1

inline __mmask16 lane_mask(std::int64_t n) {  // the first min(n, 16) lanes (n >= 0)
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// 16 x 16 transpose: in[r] holds row r; afterwards in[c] holds column c.
inline void transpose16(__m512 (&v)[16]) {
  __m512 t[16];
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 16; i += 8) {
    #pragma GCC unroll 16
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(v[i + j], v[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(v[i + j], v[i + j + 4], 0xDD);
    }
  }
  #pragma GCC unroll 16
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}

// dst[k * w + j] = src[j * ld + k] for k < kc, j < rows (rows <= w <= 32; lanes [rows, w) get 0):
// a rows x kc block whose rows are contiguous in k, transposed 16 x 16 at a time.
void pack_transposed(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t kc,
                     float* dst, std::int64_t w) {
  for (std::int64_t j0 = 0; j0 < w; j0 += 16) {
    const std::int64_t nj = std::min<std::int64_t>(16, w - j0);
    const __mmask16 store = lane_mask(nj);
    std::int64_t k0 = 0;
    for (; k0 + 16 <= kc; k0 += 16) {
      __m512 v[16];
      #pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        v[j] = j0 + j < rows ? _mm512_loadu_ps(src + (j0 + j) * ld + k0) : _mm512_setzero_ps();
      transpose16(v);
      #pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) _mm512_mask_storeu_ps(dst + (k0 + k) * w + j0, store, v[k]);
    }
    if (k0 < kc) {
      const __mmask16 load = lane_mask(kc - k0);
      __m512 v[16];
      #pragma GCC unroll 16
      for (int j = 0; j < 16; ++j)
        v[j] = j0 + j < rows ? _mm512_maskz_loadu_ps(load, src + (j0 + j) * ld + k0)
                             : _mm512_setzero_ps();
      transpose16(v);
      for (std::int64_t k = 0; k < kc - k0; ++k)
        _mm512_mask_storeu_ps(dst + (k0 + k) * w + j0, store, v[k]);
    }
  }
}

// dst[k * w + j] = src[k * ld + j] for k < kc, j < cols (cols <= w <= 32), other lanes 0.
void pack_direct(const float* src, std::int64_t ld, std::int64_t cols, std::int64_t kc, float* dst,
                 std::int64_t w) {
  const __mmask16 m0 = lane_mask(cols), m1 = lane_mask(cols - 16 > 0 ? cols - 16 : 0);
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    float* d = dst + k * w;
    if (w <= 16) {
      _mm512_mask_storeu_ps(d, static_cast<__mmask16>(lane_mask(w)),
                            _mm512_maskz_loadu_ps(m0, s));
    } else {
      _mm512_storeu_ps(d, _mm512_maskz_loadu_ps(m0, s));
      _mm512_mask_storeu_ps(d + 16, lane_mask(w - 16), _mm512_maskz_loadu_ps(m1, s + 16));
    }
  }
}

// acc[r][v] = fma(ap[k][r], bp[k][16 v ..], acc[r][v]) for k = 0..kc-1 in order: the k chain of
// a 12 x (16 * NV) tile (ap: [kc][kMr], bp: [kc][16 * NV], 64-byte aligned rows).
template <int NV>
[[gnu::always_inline]] inline void chain(const float* __restrict ap, const float* __restrict bp,
                                         std::int64_t kc, __m512 (&acc)[kMr][NV]) {
  constexpr int w = 16 * NV;
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* b = bp + k * w;
    const float* a = ap + k * kMr;
    __m512 bv[NV];
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
    _mm_prefetch(reinterpret_cast<const char*>(a + 8 * kMr), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const __m512 av = _mm512_set1_ps(a[r]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
}

// The micro-tile: rows [0, mr) and columns [0, nr) of a 12 x (16 * NV) tile. acc starts at 0.0f
// (first) or at acc_io (a tile stored by the previous k block, row stride ld_acc), runs the chain
// over the kc packed k steps, and is stored raw to acc_io, or (last block) as the epilogue to out
// (row stride ld_out; read as C when Out::beta).
template <int NV>
inline void micro_tile(const float* __restrict ap, const float* __restrict bp, std::int64_t kc,
                       int mr, std::int64_t nr, bool first, float* acc_io, std::int64_t ld_acc,
                       Out mode, float alpha, float beta, float* out, std::int64_t ld_out) {
  __m512 acc[kMr][NV];
  const __mmask16 m[2] = {lane_mask(nr), lane_mask(nr > 16 ? nr - 16 : 0)};
  if (first) {
    #pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  } else {
    #pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      #pragma GCC unroll 16
      for (int v = 0; v < NV; ++v)
        acc[r][v] = r < mr ? _mm512_maskz_loadu_ps(m[v], acc_io + r * ld_acc + 16 * v)
                           : _mm512_setzero_ps();
  }
  chain<NV>(ap, bp, kc, acc);
  if (mode == Out::raw) {
    #pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(acc_io + r * ld_acc + 16 * v, m[v], acc[r][v]);
  } else if (mode == Out::alpha) {
    const __m512 al = _mm512_set1_ps(alpha);
    #pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 16
        for (int v = 0; v < NV; ++v)
          _mm512_mask_storeu_ps(out + r * ld_out + 16 * v, m[v], _mm512_mul_ps(al, acc[r][v]));
  } else {
    const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
    #pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
          float* o = out + r * ld_out + 16 * v;
          const __m512 c = _mm512_maskz_loadu_ps(m[v], o);
          _mm512_mask_storeu_ps(o, m[v], _mm512_fmadd_ps(be, c, _mm512_mul_ps(al, acc[r][v])));
        }
  }
}

inline std::int64_t panel_width(std::int64_t cols_left) { return cols_left <= 16 ? 16 : 32; }

// op(B) rows [k0, k0 + kc), all N columns, as panels of 32 (the last may be 16) columns.
void pack_b(bool trans_b, const float* B, std::int64_t ldb, std::int64_t N, std::int64_t k0,
            std::int64_t kc, float* dst) {
  for (std::int64_t j0 = 0; j0 < N; j0 += 32) {
    const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
    if (trans_b)  // B stored [N, K]
      pack_transposed(B + j0 * ldb + k0, ldb, nr, kc, dst, w);
    else  // B stored [K, N]
      pack_direct(B + k0 * ldb + j0, ldb, nr, kc, dst, w);
    dst += w * kc;
  }
}

// op(A) rows [i0, i0 + mc), k [k0, k0 + kc), as panels of kMr rows ([kc][kMr]).
void pack_a(bool trans_a, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc,
            std::int64_t k0, std::int64_t kc, float* dst) {
  for (std::int64_t p = 0; p < mc; p += kMr) {
    const std::int64_t rows = std::min<std::int64_t>(kMr, mc - p);
    if (trans_a)  // A stored [K, M]
      pack_direct(A + k0 * lda + i0 + p, lda, rows, kc, dst, kMr);
    else  // A stored [M, K]
      pack_transposed(A + (i0 + p) * lda + k0, lda, rows, kc, dst, kMr);
    dst += kMr * kc;
  }
}

void avx512_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                 float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                 float beta, float* C, std::int64_t ldc) {
  const Out last = beta != 0.0f ? Out::beta : alpha != 1.0f ? Out::alpha : Out::raw;
  if (K == 0) {  // acc = 0.0f for every element
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = canonical::gemm_epilogue(0.0f, alpha, beta, C[i * ldc + j]);
    return;
  }
  const std::int64_t kblocks = (K + kKc - 1) / kKc;
  const std::int64_t kc_max = (K + kblocks - 1) / kblocks;
  const std::int64_t npad = (N + 31) / 32 * 32;
  Scratch& s = t_scratch;
  float* bpack = Scratch::grow(s.b, npad * kc_max);
  float* apack = Scratch::grow(s.a, kMc * kc_max);
  // The accumulators between k blocks: C itself unless C's old value is still needed.
  float* acc = C;
  std::int64_t ld_acc = ldc;
  if (kblocks > 1 && last == Out::beta) {
    acc = Scratch::grow(s.acc, M * N);
    ld_acc = N;
  }
  for (std::int64_t kb = 0; kb < kblocks; ++kb) {
    const std::int64_t k0 = kb * kc_max, kc = std::min(kc_max, K - k0);
    const bool first = kb == 0;
    const Out mode = kb + 1 == kblocks ? last : Out::raw;
    pack_b(trans_b, B, ldb, N, k0, kc, bpack);
    for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
      const std::int64_t mc = std::min(kMc, M - i0);
      pack_a(trans_a, A, lda, i0, mc, k0, kc, apack);
      const float* bp = bpack;
      for (std::int64_t j0 = 0; j0 < N; j0 += 32) {
        const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
        for (std::int64_t p = 0; p < mc; p += kMr) {
          const int mr = static_cast<int>(std::min<std::int64_t>(kMr, mc - p));
          const float* ap = apack + p * kc;
          float* acc_io = acc + (i0 + p) * ld_acc + j0;
          float* out = C + (i0 + p) * ldc + j0;
          if (w == 32)
            micro_tile<2>(ap, bp, kc, mr, nr, first, acc_io, ld_acc, mode, alpha, beta, out, ldc);
          else
            micro_tile<1>(ap, bp, kc, mr, nr, first, acc_io, ld_acc, mode, alpha, beta, out, ldc);
        }
        bp += w * kc;
      }
    }
  }
}

// The canonical tree over the shards of one tile, evaluated left to right with a stack of
// perfect subtrees (a binary counter): a leaf merges with the top of the stack while both cover
// the same number of shards, and the stack is folded from the right at the end. For S shards
// this is exactly the tree of Note [Canonical tree] (left subtree: the largest power of two
// below S), each node computed as left + right. The leaf and the merges stay in registers; only
// the stack is in memory. Writes the tile (row stride 16 * NV) to out.
template <int NV>
void sharded_tile(const float* ap, const float* bp, const std::vector<std::int64_t>& bounds,
                  float* stack, std::int64_t* sizes, float* out) {
  constexpr int w = 16 * NV;
  constexpr int tile = kMr * w;
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  __m512 acc[kMr][NV];
  int depth = 0;
  for (std::int64_t s = 0; s < shards; ++s) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(s)];
    const std::int64_t kc = bounds[static_cast<std::size_t>(s) + 1] - k0;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
    chain<NV>(ap + k0 * kMr, bp + k0 * w, kc, acc);
    std::int64_t size = 1;
    while (depth > 0 && sizes[depth - 1] == size) {  // acc = top + acc
      const float* top = stack + (depth - 1) * tile;
#pragma GCC unroll 16
      for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v)
          acc[r][v] = _mm512_add_ps(_mm512_load_ps(top + r * w + 16 * v), acc[r][v]);
      size *= 2;
      --depth;
    }
    if (s + 1 == shards) break;  // the last leaf stays in registers for the fold
    float* push = stack + depth * tile;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) _mm512_store_ps(push + r * w + 16 * v, acc[r][v]);
    sizes[depth++] = size;
  }
  // Fold from the right: result = s0 + (s1 + (... + s_last)).
  for (int d = depth - 1; d >= 0; --d) {
    const float* left = stack + d * tile;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm512_add_ps(_mm512_load_ps(left + r * w + 16 * v), acc[r][v]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) _mm512_store_ps(out + r * w + 16 * v, acc[r][v]);
}

void avx512_gemm_tn_sharded(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                            const float* B, std::int64_t ldb,
                            const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                            bool accumulate) {
  const std::int64_t K = bounds.back();
  const std::int64_t npad = (N + 31) / 32 * 32;
  Scratch& s = t_scratch;
  float* bpack = Scratch::grow(s.b, npad * std::max<std::int64_t>(K, 1));
  float* apack = Scratch::grow(s.a, kMc * std::max<std::int64_t>(K, 1));
  const std::size_t levels = 66;  // a stack of perfect subtrees: at most log2(S) + 1 <= 64 deep
  float* stack = Scratch::grow(s.acc, static_cast<std::int64_t>(levels + 1) * kMr * 32);
  float* leaf = stack + levels * kMr * 32;
  std::int64_t sizes[levels];
  pack_b(false, B, ldb, N, 0, K, bpack);
  for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
    const std::int64_t mc = std::min(kMc, M - i0);
    pack_a(true, A, lda, i0, mc, 0, K, apack);
    const float* bp = bpack;
    for (std::int64_t j0 = 0; j0 < N; j0 += 32) {
      const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
      for (std::int64_t p = 0; p < mc; p += kMr) {
        const float* ap = apack + p * K;
        if (w == 32)
          sharded_tile<2>(ap, bp, bounds, stack, sizes, leaf);
        else
          sharded_tile<1>(ap, bp, bounds, stack, sizes, leaf);
        const std::int64_t mr = std::min<std::int64_t>(kMr, mc - p);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p + r) * ldc + j0;
          const float* t = leaf + r * w;
          if (accumulate)
            for (std::int64_t j = 0; j < nr; ++j) c[j] = canonical::add(c[j], t[j]);
          else
            for (std::int64_t j = 0; j < nr; ++j) c[j] = t[j];
        }
      }
      bp += w * K;
    }
  }
}
#elif defined(__AVX2__) && defined(__FMA__)
// ---- AVX2 + FMA kernel (Note [Bitwise GEMM kernel]) ----------------------------------------
// The AVX-512 kernel's structure on 16 ymm registers: a kMr x (8 * kNv) micro-tile (BLIS's
// Haswell shape, 6 x 16: 12 accumulators, 2 vectors of op(B), 1 broadcast of op(A)).

constexpr int kMr = 6;             // rows per micro-tile
constexpr int kNv = 2;             // 8-float vectors per micro-tile row (kMr * kNv accumulators)
constexpr int kNr = 8 * kNv;       // columns per micro-tile: op(B)'s panel width (the last panel
                                   // of a row of panels may be 8, ..., kNr - 8 wide)
constexpr std::int64_t kMc = 144;  // rows of op(A) packed at a time (a multiple of kMr)
constexpr std::int64_t kKc = 256;  // k block: a kNr-column B panel of kKc rows (16 KiB) fits L1
static_assert(kMr <= 8 && kMc % kMr == 0 && kNv >= 1);

inline __m256i lane_mask(std::int64_t n) {  // lanes [0, n) (n clamped to [0, 8])
  const int c = static_cast<int>(std::clamp<std::int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// src[0, min(n, 8)), the other lanes 0; never reads src[n] or beyond (n >= 1).
inline __m256 load_lanes(const float* src, std::int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, lane_mask(n));
}

// dst[0, min(n, 8)) = the first lanes of v; writes nothing else (n >= 1).
inline void store_lanes(float* dst, __m256 v, std::int64_t n) {
  if (n >= 8) {
    _mm256_storeu_ps(dst, v);
  } else if (n == 4) {  // the packing of 4- and 6-row op(A) panels: no (slow) masked store
    _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
  } else if (n == 6) {
    _mm_storeu_ps(dst, _mm256_castps256_ps128(v));
    _mm_storel_pi(reinterpret_cast<__m64*>(dst + 4), _mm256_extractf128_ps(v, 1));
  } else {
    _mm256_maskstore_ps(dst, lane_mask(n), v);
  }
}

// 8 x 8 transpose: v[r] holds row r; afterwards v[c] holds column c.
inline void transpose8(__m256 (&v)[8]) {
  __m256 t[8], s[8];
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  #pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    v[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// dst[k * w + j] = src[j * ld + k] for k < kc, j < rows (rows <= w; w <= 8 or a multiple of 8;
// lanes [rows, w) get 0): a rows x kc block whose rows are contiguous in k, transposed 8 x 8 at
// a time.
void pack_transposed(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t kc,
                     float* dst, std::int64_t w) {
  for (std::int64_t j0 = 0; j0 < w; j0 += 8) {
    const std::int64_t nj = std::min<std::int64_t>(8, w - j0);
    std::int64_t k0 = 0;
    for (; k0 + 8 <= kc; k0 += 8) {
      __m256 v[8];
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        v[j] = j0 + j < rows ? _mm256_loadu_ps(src + (j0 + j) * ld + k0) : _mm256_setzero_ps();
      transpose8(v);
      #pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) store_lanes(dst + (k0 + k) * w + j0, v[k], nj);
    }
    if (k0 < kc) {
      __m256 v[8];
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j)
        v[j] = j0 + j < rows ? load_lanes(src + (j0 + j) * ld + k0, kc - k0) : _mm256_setzero_ps();
      transpose8(v);
      for (std::int64_t k = 0; k < kc - k0; ++k) store_lanes(dst + (k0 + k) * w + j0, v[k], nj);
    }
  }
}

// dst[k * w + j] = src[k * ld + j] for k < kc, j < cols (cols <= w), other lanes 0.
void pack_direct(const float* src, std::int64_t ld, std::int64_t cols, std::int64_t kc, float* dst,
                 std::int64_t w) {
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* s = src + k * ld;
    float* d = dst + k * w;
    for (std::int64_t j0 = 0; j0 < w; j0 += 8)
      store_lanes(d + j0, j0 < cols ? load_lanes(s + j0, cols - j0) : _mm256_setzero_ps(),
                  w - j0);
  }
}

// acc[r][v] = fma(ap[k][r], bp[k][8 v ..], acc[r][v]) for k = 0..kc-1 in order: the k chain of
// a kMr x (8 * NV) tile (ap: [kc][kMr], bp: [kc][8 * NV]).
template <int NV>
[[gnu::always_inline]] inline void chain(const float* __restrict ap, const float* __restrict bp,
                                         std::int64_t kc, __m256 (&acc)[kMr][NV]) {
  constexpr int w = 8 * NV;
  for (std::int64_t k = 0; k < kc; ++k) {
    const float* b = bp + k * w;
    const float* a = ap + k * kMr;
    __m256 bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
    }
  }
}

// The micro-tile: rows [0, mr) and columns [0, nr) of a kMr x (8 * NV) tile (nr > 8 (NV - 1)),
// as the AVX-512 kernel's: acc from 0.0f (first) or from acc_io, the chain over kc k steps,
// stored raw to acc_io or (the last k block) as the epilogue to out.
template <int NV>
inline void micro_tile(const float* __restrict ap, const float* __restrict bp, std::int64_t kc,
                       int mr, std::int64_t nr, bool first, float* acc_io, std::int64_t ld_acc,
                       Out mode, float alpha, float beta, float* out, std::int64_t ld_out) {
  __m256 acc[kMr][NV];
  if (first) {
    #pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
  } else {
    #pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = r < mr ? load_lanes(acc_io + r * ld_acc + 8 * v, nr - 8 * v)
                           : _mm256_setzero_ps();
  }
  chain<NV>(ap, bp, kc, acc);
  if (mode == Out::raw) {
    #pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          store_lanes(acc_io + r * ld_acc + 8 * v, acc[r][v], nr - 8 * v);
  } else if (mode == Out::alpha) {
    const __m256 al = _mm256_set1_ps(alpha);
    #pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          store_lanes(out + r * ld_out + 8 * v, _mm256_mul_ps(al, acc[r][v]), nr - 8 * v);
  } else {
    const __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    #pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
          float* o = out + r * ld_out + 8 * v;
          const __m256 c = load_lanes(o, nr - 8 * v);
          store_lanes(o, _mm256_fmadd_ps(be, c, _mm256_mul_ps(al, acc[r][v])), nr - 8 * v);
        }
  }
}

// The width of the panel of op(B) that starts cols_left columns before the end: kNr, or the
// last columns rounded up to a multiple of 8.
inline std::int64_t panel_width(std::int64_t cols_left) {
  return std::min<std::int64_t>(kNr, (cols_left + 7) / 8 * 8);
}

// op(B) rows [k0, k0 + kc), all N columns, as panels of panel_width columns ([kc][w]).
void pack_b(bool trans_b, const float* B, std::int64_t ldb, std::int64_t N, std::int64_t k0,
            std::int64_t kc, float* dst) {
  for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
    const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
    if (trans_b)  // B stored [N, K]
      pack_transposed(B + j0 * ldb + k0, ldb, nr, kc, dst, w);
    else  // B stored [K, N]
      pack_direct(B + k0 * ldb + j0, ldb, nr, kc, dst, w);
    dst += w * kc;
  }
}

// op(A) rows [i0, i0 + mc), k [k0, k0 + kc), as panels of kMr rows ([kc][kMr]).
void pack_a(bool trans_a, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc,
            std::int64_t k0, std::int64_t kc, float* dst) {
  for (std::int64_t p = 0; p < mc; p += kMr) {
    const std::int64_t rows = std::min<std::int64_t>(kMr, mc - p);
    if (trans_a)  // A stored [K, M]
      pack_direct(A + k0 * lda + i0 + p, lda, rows, kc, dst, kMr);
    else  // A stored [M, K]
      pack_transposed(A + (i0 + p) * lda + k0, lda, rows, kc, dst, kMr);
    dst += kMr * kc;
  }
}

// fn.template operator()<NV>() for the NV in [1, kNv] with 8 * NV == w.
template <int NV = kNv, typename Fn>
[[gnu::always_inline]] inline void with_width(std::int64_t w, const Fn& fn) {
  if constexpr (NV > 1) {
    if (w != 8 * NV) return with_width<NV - 1>(w, fn);
  }
  fn.template operator()<NV>();
}

void avx2_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc) {
  const Out last = beta != 0.0f ? Out::beta : alpha != 1.0f ? Out::alpha : Out::raw;
  if (K == 0) {  // acc = 0.0f for every element
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = canonical::gemm_epilogue(0.0f, alpha, beta, C[i * ldc + j]);
    return;
  }
  const std::int64_t kblocks = (K + kKc - 1) / kKc;
  const std::int64_t kc_max = (K + kblocks - 1) / kblocks;
  const std::int64_t npad = (N + 7) / 8 * 8;  // the panels' widths add up to this
  Scratch& s = t_scratch;
  float* bpack = Scratch::grow(s.b, npad * kc_max);
  float* apack = Scratch::grow(s.a, kMc * kc_max);
  // The accumulators between k blocks: C itself unless C's old value is still needed.
  float* acc = C;
  std::int64_t ld_acc = ldc;
  if (kblocks > 1 && last == Out::beta) {
    acc = Scratch::grow(s.acc, M * N);
    ld_acc = N;
  }
  for (std::int64_t kb = 0; kb < kblocks; ++kb) {
    const std::int64_t k0 = kb * kc_max, kc = std::min(kc_max, K - k0);
    const bool first = kb == 0;
    const Out mode = kb + 1 == kblocks ? last : Out::raw;
    pack_b(trans_b, B, ldb, N, k0, kc, bpack);
    for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
      const std::int64_t mc = std::min(kMc, M - i0);
      pack_a(trans_a, A, lda, i0, mc, k0, kc, apack);
      const float* bp = bpack;
      for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
        const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
        with_width(w, [&]<int NV>() {
          for (std::int64_t p = 0; p < mc; p += kMr) {
            const int mr = static_cast<int>(std::min<std::int64_t>(kMr, mc - p));
            micro_tile<NV>(apack + p * kc, bp, kc, mr, nr, first, acc + (i0 + p) * ld_acc + j0,
                           ld_acc, mode, alpha, beta, C + (i0 + p) * ldc + j0, ldc);
          }
        });
        bp += w * kc;
      }
    }
  }
}

// As the AVX-512 kernel's sharded_tile: the canonical tree over the shards' chains of one tile,
// with a stack of perfect subtrees; writes the tile (row stride 8 * NV) to out.
template <int NV>
void sharded_tile(const float* ap, const float* bp, const std::vector<std::int64_t>& bounds,
                  float* stack, std::int64_t* sizes, float* out) {
  constexpr int w = 8 * NV;
  constexpr int tile = kMr * w;
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  __m256 acc[kMr][NV];
  int depth = 0;
  for (std::int64_t s = 0; s < shards; ++s) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(s)];
    const std::int64_t kc = bounds[static_cast<std::size_t>(s) + 1] - k0;
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm256_setzero_ps();
    chain<NV>(ap + k0 * kMr, bp + k0 * w, kc, acc);
    std::int64_t size = 1;
    while (depth > 0 && sizes[depth - 1] == size) {  // acc = top + acc
      const float* top = stack + (depth - 1) * tile;
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          acc[r][v] = _mm256_add_ps(_mm256_loadu_ps(top + r * w + 8 * v), acc[r][v]);
      size *= 2;
      --depth;
    }
    if (s + 1 == shards) break;  // the last leaf stays in registers for the fold
    float* push = stack + depth * tile;
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(push + r * w + 8 * v, acc[r][v]);
    sizes[depth++] = size;
  }
  // Fold from the right: result = s0 + (s1 + (... + s_last)).
  for (int d = depth - 1; d >= 0; --d) {
    const float* left = stack + d * tile;
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[r][v] = _mm256_add_ps(_mm256_loadu_ps(left + r * w + 8 * v), acc[r][v]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(out + r * w + 8 * v, acc[r][v]);
}

void avx2_gemm_tn_sharded(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                          const float* B, std::int64_t ldb, const std::vector<std::int64_t>& bounds,
                          float* C, std::int64_t ldc, bool accumulate) {
  const std::int64_t K = bounds.back();
  const std::int64_t npad = (N + 7) / 8 * 8;
  Scratch& s = t_scratch;
  float* bpack = Scratch::grow(s.b, npad * std::max<std::int64_t>(K, 1));
  float* apack = Scratch::grow(s.a, kMc * std::max<std::int64_t>(K, 1));
  const std::size_t levels = 66;  // a stack of perfect subtrees: at most log2(S) + 1 <= 64 deep
  float* stack = Scratch::grow(s.acc, static_cast<std::int64_t>(levels + 1) * kMr * kNr);
  float* leaf = stack + levels * kMr * kNr;
  std::int64_t sizes[levels];
  pack_b(false, B, ldb, N, 0, K, bpack);
  for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
    const std::int64_t mc = std::min(kMc, M - i0);
    pack_a(true, A, lda, i0, mc, 0, K, apack);
    const float* bp = bpack;
    for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
      const std::int64_t w = panel_width(N - j0), nr = std::min<std::int64_t>(w, N - j0);
      for (std::int64_t p = 0; p < mc; p += kMr) {
        with_width(w, [&]<int NV>() {
          sharded_tile<NV>(apack + p * K, bp, bounds, stack, sizes, leaf);
        });
        const std::int64_t mr = std::min<std::int64_t>(kMr, mc - p);
        for (std::int64_t r = 0; r < mr; ++r) {
          float* c = C + (i0 + p + r) * ldc + j0;
          const float* t = leaf + r * w;
          if (accumulate)
            for (std::int64_t j = 0; j < nr; ++j) c[j] = canonical::add(c[j], t[j]);
          else
            for (std::int64_t j = 0; j < nr; ++j) c[j] = t[j];
        }
      }
      bp += w * K;
    }
  }
}
#endif  // __AVX512F__, __AVX2__ && __FMA__

}  // namespace

void gemm_bitwise(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc) {
#if defined(__AVX512F__)
  avx512_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#elif defined(__AVX2__) && defined(__FMA__)
  avx2_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  portable_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

void gemm_tn_sharded_bitwise(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb,
                             const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                             bool accumulate) {
#if defined(__AVX512F__)
  avx512_gemm_tn_sharded(M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
#elif defined(__AVX2__) && defined(__FMA__)
  avx2_gemm_tn_sharded(M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
#else
  portable_gemm_tn_sharded(M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
#endif
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
// (avx512_gemm) reached 133-313: 1.3-1.9x. So when this build has the AVX-512 kernel and
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
