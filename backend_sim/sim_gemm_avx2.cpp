// The simulator's bitwise GEMM on AVX2 and FMA without AVX-512 (Note [Bitwise GEMM kernel],
// sim_gemm_driver.h): the AVX-512 kernel's structure on 16 ymm registers, a 6 x 16 micro-tile
// (BLIS's Haswell shape: 12 accumulators, 2 vectors of op(B), 1 broadcast of op(A)), 8 x 8
// register transposes, loads that never pass an operand's last element and stores of the tile's
// own lanes only. The driver is sim_gemm_driver.h's; this file supplies the instruction set. Built
// to nothing unless the compiler targets AVX2 and FMA but not AVX-512.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>

#include "backend_sim/sim_gemm_driver.h"  // first: it includes Eigen
#include "backend_sim/sim_gemm_kernels.h"

namespace ditto::sim::gemm_detail {

namespace {

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
      store_lanes(d + j0, j0 < cols ? load_lanes(s + j0, cols - j0) : _mm256_setzero_ps(), w - j0);
  }
}

// The instruction set for the driver (sim_gemm_driver.h lists what an Isa supplies).
struct Avx2 {
  using Vec = __m256;
  using Lanes = std::int64_t;               // a count: load_lanes / store_lanes mask per call
  static constexpr int kW = 8;              // floats per vector
  static constexpr int kMr = 6;             // rows per micro-tile
  static constexpr int kNv = 2;             // vectors per micro-tile row (kMr * kNv accumulators)
  static constexpr int kNr = kW * kNv;      // columns per micro-tile: op(B)'s panel width (the
                                            // last panel of a row may be 8, ..., kNr - 8 wide)
  static constexpr std::int64_t kMc = 144;  // rows of op(A) packed at a time (a multiple of kMr)
  static constexpr std::int64_t kKc = 256;  // k block: a kNr-column B panel of kKc rows (16 KiB)
                                            // fits L1
  static_assert(kMr <= 8 && kMc % kMr == 0 && kNv >= 1);

  static Lanes lanes(std::int64_t n) { return n; }
  static Vec load(const float* p, Lanes n) { return load_lanes(p, n); }
  static void store(float* p, Vec v, Lanes n) { store_lanes(p, v, n); }
  static Vec load_tile(const float* p) { return _mm256_loadu_ps(p); }
  static void store_tile(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec set1(float x) { return _mm256_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static constexpr auto pack_transposed = &gemm_detail::pack_transposed;
  static constexpr auto pack_direct = &gemm_detail::pack_direct;

  // The micro-kernel: acc[r][v] = fma(ap[k][r], bp[k][8 v ..], acc[r][v]) for k = 0..kc-1 in
  // order, the k chain of a kMr x (8 * NV) tile (ap: [kc][kMr], bp: [kc][8 * NV]).
  template <int NV>
  [[gnu::always_inline]] static void chain(const float* __restrict ap, const float* __restrict bp,
                                           std::int64_t kc, Vec (&acc)[kMr][NV]) {
    constexpr int w = kW * NV;
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
};

}  // namespace

const GemmKernels kAvx2Kernels{&blocked_gemm<Avx2>, &blocked_gemm_tn_sharded<Avx2>};

}  // namespace ditto::sim::gemm_detail
#endif  // __AVX2__ && __FMA__ && !__AVX512F__
