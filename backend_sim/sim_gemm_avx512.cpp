// The simulator's bitwise GEMM on AVX-512 (Note [Bitwise GEMM kernel], sim_gemm_driver.h): a
// 12 x 32 micro-tile of 24 zmm accumulators, 16 x 16 register transposes for the packing, masked
// loads and stores at the edges. The driver is sim_gemm_driver.h's; this file supplies the
// instruction set. Built to nothing unless the compiler targets AVX-512.
#if defined(__AVX512F__)
#include <immintrin.h>

#include "backend_sim/sim_gemm_driver.h"  // first: it includes Eigen
#include "backend_sim/sim_gemm_kernels.h"

namespace ditto::sim::gemm_detail {

namespace {

inline __mmask16 lane_mask(std::int64_t n) {  // the first min(n, 16) lanes (n >= 0)
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// The second half of a 16 x 16 transpose (transpose_in_blocks, sim_gemm_driver.h): the 4 x 4
// transpose of the 128-bit blocks of each 4 vectors v[c], v[c + 4], v[c + 8], v[c + 12], in two
// rounds of shuffle_f32x4.
inline void cross_blocks(__m512 (&v)[16]) {
  __m512 t[16];
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

// What AVX-512 brings to SimdIsa (sim_gemm_driver.h): 16-float vectors, lanes as a mask
// register, the prefetch of op(A)'s panel ahead.
struct Avx512Ops {
  using Vec = __m512;
  using Lanes = __mmask16;
  static constexpr bool kPrefetchA = true;
  static Lanes lanes(std::int64_t n) { return lane_mask(n > 0 ? n : 0); }
  static Vec load(const float* p, Lanes m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Vec v, Lanes m) { _mm512_mask_storeu_ps(p, m, v); }
  static constexpr auto cross_blocks = &gemm_detail::cross_blocks;
  static Vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
};

// 12 x 32 micro-tiles (24 accumulator vectors), op(A) 120 rows at a time (a multiple of 12), k
// blocks of 320: a 32-column B panel of 320 rows fits L1.
using Avx512 = SimdIsa<Avx512Ops, /*Mr=*/12, /*Mc=*/120, /*Kc=*/320>;

}  // namespace

const GemmKernels kAvx512Kernels{&blocked_gemm<Avx512>, &blocked_gemm_tn_sharded<Avx512>};

}  // namespace ditto::sim::gemm_detail
#endif  // __AVX512F__
