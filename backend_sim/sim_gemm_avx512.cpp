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
      _mm512_mask_storeu_ps(d, static_cast<__mmask16>(lane_mask(w)), _mm512_maskz_loadu_ps(m0, s));
    } else {
      _mm512_storeu_ps(d, _mm512_maskz_loadu_ps(m0, s));
      _mm512_mask_storeu_ps(d + 16, lane_mask(w - 16), _mm512_maskz_loadu_ps(m1, s + 16));
    }
  }
}

// The instruction set for the driver (sim_gemm_driver.h lists what an Isa supplies).
struct Avx512 {
  using Vec = __m512;
  using Lanes = __mmask16;
  static constexpr int kW = 16;             // floats per vector
  static constexpr int kMr = 12;            // rows per micro-tile (24 accumulator vectors)
  static constexpr int kNv = 2;             // vectors per micro-tile row
  static constexpr int kNr = kW * kNv;      // columns per micro-tile (the last panel: 16 or 32)
  static constexpr std::int64_t kMc = 120;  // rows of op(A) packed at a time (a multiple of kMr)
  static constexpr std::int64_t kKc = 320;  // k block: a 32-column B panel of kKc rows fits L1

  static Lanes lanes(std::int64_t n) { return lane_mask(n > 0 ? n : 0); }
  static Vec load(const float* p, Lanes m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Vec v, Lanes m) { _mm512_mask_storeu_ps(p, m, v); }
  static Vec load_tile(const float* p) { return _mm512_load_ps(p); }
  static void store_tile(float* p, Vec v) { _mm512_store_ps(p, v); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float x) { return _mm512_set1_ps(x); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static constexpr auto pack_transposed = &gemm_detail::pack_transposed;
  static constexpr auto pack_direct = &gemm_detail::pack_direct;

  // The micro-kernel: acc[r][v] = fma(ap[k][r], bp[k][16 v ..], acc[r][v]) for k = 0..kc-1 in
  // order, the k chain of a 12 x (16 * NV) tile (ap: [kc][kMr], bp: [kc][16 * NV], 64-byte
  // aligned rows).
  template <int NV>
  [[gnu::always_inline]] static void chain(const float* __restrict ap, const float* __restrict bp,
                                           std::int64_t kc, Vec (&acc)[kMr][NV]) {
    constexpr int w = kW * NV;
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
};

}  // namespace

const GemmKernels kAvx512Kernels{&blocked_gemm<Avx512>, &blocked_gemm_tn_sharded<Avx512>};

}  // namespace ditto::sim::gemm_detail
#endif  // __AVX512F__
