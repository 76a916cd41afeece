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

// The second half of an 8 x 8 transpose (transpose_in_blocks, sim_gemm_driver.h): v[c] gets the
// low 128 bits of v[c] and v[c + 4], v[c + 4] their high 128 bits.
inline void cross_blocks(__m256 (&v)[8]) {
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    const __m256 lo = v[i], hi = v[i + 4];
    v[i] = _mm256_permute2f128_ps(lo, hi, 0x20);
    v[i + 4] = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
}

// What AVX2 and FMA bring to SimdIsa (sim_gemm_driver.h): 8-float vectors, lanes counted (the
// masked loads and stores of load_lanes / store_lanes), a broadcast load of op(A).
struct Avx2Ops {
  using Vec = __m256;
  using Lanes = std::int64_t;  // a count: load_lanes / store_lanes mask per call
  static constexpr bool kPrefetchA = false;
  static Lanes lanes(std::int64_t n) { return n; }
  static constexpr auto load = &load_lanes;
  static constexpr auto store = &store_lanes;
  static constexpr auto cross_blocks = &gemm_detail::cross_blocks;
  static Vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
};

// 6 x 16 micro-tiles (BLIS's Haswell shape), op(A) 144 rows at a time (a multiple of 6), k blocks
// of 256: a 16-column B panel of 256 rows (16 KiB) fits L1, the 144 KiB A block L2.
using Avx2 = SimdIsa<Avx2Ops, /*Mr=*/6, /*Mc=*/144, /*Kc=*/256>;

}  // namespace

const GemmKernels kAvx2Kernels{&blocked_gemm<Avx2>, &blocked_gemm_tn_sharded<Avx2>};

}  // namespace ditto::sim::gemm_detail
#endif  // __AVX2__ && __FMA__ && !__AVX512F__
