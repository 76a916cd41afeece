// The blocked driver of the simulator's bitwise GEMM, written once over an instruction set (Isa):
// the k blocking, the packing loops, the micro-tile's loads and stores, and the sharded TN tree.
// sim_gemm_avx512.cpp and sim_gemm_avx2.cpp each supply an Isa (vector type, lane masks, register
// transposes for the packing, and the micro-kernel `chain`) and instantiate the driver. Internal to
// backend_sim, not installed.
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
// within the noise of 256 and 144. Without either, a portable 4 x 32 loop (sim_gemm_portable.cpp)
// does the same.
//
// The micro-tile keeps its accumulators in registers only if its loops over rows and vectors are
// unrolled completely (-O2 does not): hence the #pragma GCC unroll.
//
// What an Isa supplies (all static):
//   Vec, kW (floats per vector), kMr (rows per micro-tile), kNv (vectors per micro-tile row),
//   kNr = kW * kNv (columns per micro-tile), kMc (rows of op(A) packed at a time, a multiple of
//   kMr), kKc (the k block);
//   Lanes, lanes(n) (the first n lanes of a vector, n <= 0 for none), load(p, lanes),
//   store(p, v, lanes) (never touching the other lanes), zero(), set1(x), add, mul,
//   fmadd(a, b, c) (a * b + c), load_tile(p) / store_tile(p, v) (a whole vector);
//   pack_transposed(src, ld, rows, kc, dst, w): dst[k * w + j] = src[j * ld + k] (k < kc,
//   j < rows, lanes [rows, w) zero);
//   pack_direct(src, ld, cols, kc, dst, w): dst[k * w + j] = src[k * ld + j];
//   chain<NV>(ap, bp, kc, acc): acc[r][v] = fma(ap[k][r], bp[k][kW v ..], acc[r][v]) for k =
//   0..kc-1 in order (ap: [kc][kMr], bp: [kc][kW * NV]), the micro-kernel.
// SimdIsa (below) makes one from what differs between instruction sets (Ops: the vector type,
// its lane masks, broadcast, fmadd, the register transpose) and the micro-tile's shape; the rest
// (the packing, the micro-kernel, the arithmetic, written with GCC's vector operators, which are
// what the intrinsics _mm256_add_ps, _mm512_mul_ps, ... are) is written once there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "backend_sim/sim_eigen.h"  // first: its pragma must precede Eigen
#include "core/numerics/canonical_math.h"

namespace ditto::sim::gemm_detail {

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
inline thread_local Scratch t_scratch;

// The width of the panel of op(B) that starts cols_left columns before the end: Isa::kNr, or the
// last columns rounded up to a multiple of Isa::kW.
template <class Isa>
inline std::int64_t panel_width(std::int64_t cols_left) {
  return std::min<std::int64_t>(Isa::kNr, (cols_left + Isa::kW - 1) / Isa::kW * Isa::kW);
}

// fn.template operator()<NV>() for the NV in [1, Isa::kNv] with Isa::kW * NV == w.
template <class Isa, int NV = Isa::kNv, typename Fn>
[[gnu::always_inline]] inline void with_width(std::int64_t w, const Fn& fn) {
  if constexpr (NV > 1) {
    if (w != Isa::kW * NV) return with_width<Isa, NV - 1>(w, fn);
  }
  fn.template operator()<NV>();
}

// op(B) rows [k0, k0 + kc), all N columns, as panels of panel_width columns ([kc][w]).
template <class Isa>
void pack_b(bool trans_b, const float* B, std::int64_t ldb, std::int64_t N, std::int64_t k0,
            std::int64_t kc, float* dst) {
  for (std::int64_t j0 = 0; j0 < N; j0 += Isa::kNr) {
    const std::int64_t w = panel_width<Isa>(N - j0), nr = std::min<std::int64_t>(w, N - j0);
    if (trans_b)  // B stored [N, K]
      Isa::pack_transposed(B + j0 * ldb + k0, ldb, nr, kc, dst, w);
    else  // B stored [K, N]
      Isa::pack_direct(B + k0 * ldb + j0, ldb, nr, kc, dst, w);
    dst += w * kc;
  }
}

// op(A) rows [i0, i0 + mc), k [k0, k0 + kc), as panels of kMr rows ([kc][kMr]).
template <class Isa>
void pack_a(bool trans_a, const float* A, std::int64_t lda, std::int64_t i0, std::int64_t mc,
            std::int64_t k0, std::int64_t kc, float* dst) {
  for (std::int64_t p = 0; p < mc; p += Isa::kMr) {
    const std::int64_t rows = std::min<std::int64_t>(Isa::kMr, mc - p);
    if (trans_a)  // A stored [K, M]
      Isa::pack_direct(A + k0 * lda + i0 + p, lda, rows, kc, dst, Isa::kMr);
    else  // A stored [M, K]
      Isa::pack_transposed(A + (i0 + p) * lda + k0, lda, rows, kc, dst, Isa::kMr);
    dst += Isa::kMr * kc;
  }
}

// The micro-tile: rows [0, mr) and columns [0, nr) of a kMr x (kW * NV) tile (nr > kW (NV - 1)).
// acc starts at 0.0f (first) or at acc_io (a tile stored by the previous k block, row stride
// ld_acc), runs the chain over the kc packed k steps, and is stored raw to acc_io, or (last block)
// as the epilogue to out (row stride ld_out; read as C when Out::beta). Not inlined: inlined into
// blocked_gemm's loops the AVX-512 kernel lost about 10% at 384 x 384 x 384.
template <class Isa, int NV>
[[gnu::noinline]] void micro_tile(const float* __restrict ap, const float* __restrict bp,
                                  std::int64_t kc, int mr, std::int64_t nr, bool first,
                                  float* acc_io, std::int64_t ld_acc, Out mode, float alpha,
                                  float beta, float* out, std::int64_t ld_out) {
  constexpr int kMr = Isa::kMr, kW = Isa::kW;
  typename Isa::Vec acc[kMr][NV];
  typename Isa::Lanes m[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) m[v] = Isa::lanes(nr - kW * v);
  if (first) {
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v)
        acc[r][v] = r < mr ? Isa::load(acc_io + r * ld_acc + kW * v, m[v]) : Isa::zero();
  }
  Isa::template chain<NV>(ap, bp, kc, acc);
  if (mode == Out::raw) {
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) Isa::store(acc_io + r * ld_acc + kW * v, acc[r][v], m[v]);
  } else if (mode == Out::alpha) {
    const auto al = Isa::set1(alpha);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v)
          Isa::store(out + r * ld_out + kW * v, Isa::mul(al, acc[r][v]), m[v]);
  } else {
    const auto al = Isa::set1(alpha), be = Isa::set1(beta);
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
      if (r < mr)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
          float* o = out + r * ld_out + kW * v;
          const auto c = Isa::load(o, m[v]);
          Isa::store(o, Isa::fmadd(be, c, Isa::mul(al, acc[r][v])), m[v]);
        }
  }
}

// gemm_bitwise (sim_gemm.h) on the Isa.
template <class Isa>
void blocked_gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                  float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                  float beta, float* C, std::int64_t ldc) {
  constexpr int kMr = Isa::kMr;
  constexpr std::int64_t kMc = Isa::kMc, kKc = Isa::kKc, kNr = Isa::kNr;
  const Out last = beta != 0.0f ? Out::beta : alpha != 1.0f ? Out::alpha : Out::raw;
  if (K == 0) {  // acc = 0.0f for every element
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = canonical::gemm_epilogue(0.0f, alpha, beta, C[i * ldc + j]);
    return;
  }
  const std::int64_t kblocks = (K + kKc - 1) / kKc;
  const std::int64_t kc_max = (K + kblocks - 1) / kblocks;
  const std::int64_t npad = (N + kNr - 1) / kNr * kNr;  // the panels' widths add up to at most this
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
    pack_b<Isa>(trans_b, B, ldb, N, k0, kc, bpack);
    for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
      const std::int64_t mc = std::min(kMc, M - i0);
      pack_a<Isa>(trans_a, A, lda, i0, mc, k0, kc, apack);
      const float* bp = bpack;
      for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
        const std::int64_t w = panel_width<Isa>(N - j0), nr = std::min<std::int64_t>(w, N - j0);
        with_width<Isa>(w, [&]<int NV>() {
          for (std::int64_t p = 0; p < mc; p += kMr) {
            const int mr = static_cast<int>(std::min<std::int64_t>(kMr, mc - p));
            micro_tile<Isa, NV>(apack + p * kc, bp, kc, mr, nr, first, acc + (i0 + p) * ld_acc + j0,
                                ld_acc, mode, alpha, beta, C + (i0 + p) * ldc + j0, ldc);
          }
        });
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
// the stack is in memory. Writes the tile (row stride kW * NV) to out.
template <class Isa, int NV>
void sharded_tile(const float* ap, const float* bp, const std::vector<std::int64_t>& bounds,
                  float* stack, std::int64_t* sizes, float* out) {
  constexpr int kMr = Isa::kMr, kW = Isa::kW;
  constexpr int w = kW * NV;
  constexpr int tile = kMr * w;
  const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
  typename Isa::Vec acc[kMr][NV];
  int depth = 0;
  for (std::int64_t s = 0; s < shards; ++s) {
    const std::int64_t k0 = bounds[static_cast<std::size_t>(s)];
    const std::int64_t kc = bounds[static_cast<std::size_t>(s) + 1] - k0;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::zero();
    Isa::template chain<NV>(ap + k0 * kMr, bp + k0 * w, kc, acc);
    std::int64_t size = 1;
    while (depth > 0 && sizes[depth - 1] == size) {  // acc = top + acc
      const float* top = stack + (depth - 1) * tile;
#pragma GCC unroll 16
      for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v)
          acc[r][v] = Isa::add(Isa::load_tile(top + r * w + kW * v), acc[r][v]);
      size *= 2;
      --depth;
    }
    if (s + 1 == shards) break;  // the last leaf stays in registers for the fold
    float* push = stack + depth * tile;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) Isa::store_tile(push + r * w + kW * v, acc[r][v]);
    sizes[depth++] = size;
  }
  // Fold from the right: result = s0 + (s1 + (... + s_last)).
  for (int d = depth - 1; d >= 0; --d) {
    const float* left = stack + d * tile;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v)
        acc[r][v] = Isa::add(Isa::load_tile(left + r * w + kW * v), acc[r][v]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) Isa::store_tile(out + r * w + kW * v, acc[r][v]);
}

// gemm_tn_sharded_bitwise (sim_gemm.h) on the Isa.
template <class Isa>
void blocked_gemm_tn_sharded(std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                             const float* B, std::int64_t ldb,
                             const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                             bool accumulate) {
  constexpr int kMr = Isa::kMr;
  constexpr std::int64_t kMc = Isa::kMc, kNr = Isa::kNr;
  const std::int64_t K = bounds.back();
  const std::int64_t npad = (N + kNr - 1) / kNr * kNr;
  Scratch& s = t_scratch;
  float* bpack = Scratch::grow(s.b, npad * std::max<std::int64_t>(K, 1));
  float* apack = Scratch::grow(s.a, kMc * std::max<std::int64_t>(K, 1));
  const std::size_t levels = 66;  // a stack of perfect subtrees: at most log2(S) + 1 <= 64 deep
  float* stack = Scratch::grow(s.acc, static_cast<std::int64_t>(levels + 1) * kMr * kNr);
  float* leaf = stack + levels * kMr * kNr;
  std::int64_t sizes[levels];
  pack_b<Isa>(false, B, ldb, N, 0, K, bpack);
  for (std::int64_t i0 = 0; i0 < M; i0 += kMc) {
    const std::int64_t mc = std::min(kMc, M - i0);
    pack_a<Isa>(true, A, lda, i0, mc, 0, K, apack);
    const float* bp = bpack;
    for (std::int64_t j0 = 0; j0 < N; j0 += kNr) {
      const std::int64_t w = panel_width<Isa>(N - j0), nr = std::min<std::int64_t>(w, N - j0);
      for (std::int64_t p = 0; p < mc; p += kMr) {
        with_width<Isa>(w, [&]<int NV>() {
          sharded_tile<Isa, NV>(apack + p * K, bp, bounds, stack, sizes, leaf);
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

// out[i] = (a ++ b)[F(i)] for the kW lanes i of a vector: a constant permutation of two vectors
// (GCC's __builtin_shufflevector; it compiles to the one unpack or shuffle instruction it names).
template <auto F, typename Vec, std::size_t... I>
[[gnu::always_inline]] inline Vec permute(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, F(static_cast<int>(I))...);
}

// The first half of a kW x kW register transpose, the same for every width: within each
// 128-bit block of 4 lanes, 4 x 4 transposes of rows 4q..4q+3 (unpacklo / unpackhi, then
// shuffles 0x44 / 0xEE, as _mm256_unpacklo_ps, _mm512_shuffle_ps, ...). Afterwards block b of
// v[4q + c] holds rows 4q..4q+3 of column 4b + c; the instruction set's cross_blocks moves block
// b of v[4q + c] to block q of v[4b + c].
template <int W, typename Vec>
[[gnu::always_inline]] inline void transpose_in_blocks(Vec (&v)[W]) {
  constexpr auto idx = std::make_index_sequence<W>{};
  constexpr auto unpack_lo = [](int i) { return (i & 1) * W + (i & ~3) + (i & 3) / 2; };
  constexpr auto unpack_hi = [](int i) { return (i & 1) * W + (i & ~3) + 2 + (i & 3) / 2; };
  constexpr auto shuffle_44 = [](int i) { return (i & 3) < 2 ? i : W + i - 2; };
  constexpr auto shuffle_ee = [](int i) { return (i & 3) < 2 ? i + 2 : W + i; };
  Vec t[W];
#pragma GCC unroll 16
  for (int i = 0; i < W; i += 2) {
    t[i] = permute<unpack_lo>(v[i], v[i + 1], idx);
    t[i + 1] = permute<unpack_hi>(v[i], v[i + 1], idx);
  }
#pragma GCC unroll 16
  for (int i = 0; i < W; i += 4) {
    v[i] = permute<shuffle_44>(t[i], t[i + 2], idx);
    v[i + 1] = permute<shuffle_ee>(t[i], t[i + 2], idx);
    v[i + 2] = permute<shuffle_44>(t[i + 1], t[i + 3], idx);
    v[i + 3] = permute<shuffle_ee>(t[i + 1], t[i + 3], idx);
  }
}

// An Isa from an instruction set's Ops and the micro-tile's shape (Mr rows, kNv = 2 vectors per
// row; Mc rows of op(A) per packing, k blocks of Kc). Ops supplies (all static): Vec (a GCC
// vector of floats: __m256, __m512), Lanes, lanes(n), load(p, lanes), store(p, v, lanes),
// broadcast(p) (every lane *p), fmadd(a, b, c), cross_blocks(Vec (&)[kW]) (the second half of
// the register transpose, after transpose_in_blocks), and kPrefetchA (whether the micro-kernel
// prefetches op(A)'s panel 8 k steps ahead).
template <class Ops, int Mr, std::int64_t Mc, std::int64_t Kc>
struct SimdIsa : Ops {
  using Vec = typename Ops::Vec;
  using Lanes = typename Ops::Lanes;
  static constexpr int kW = static_cast<int>(sizeof(Vec) / sizeof(float));  // floats per vector
  static constexpr int kMr = Mr;        // rows per micro-tile (kMr * kNv accumulator vectors)
  static constexpr int kNv = 2;         // vectors per micro-tile row
  static constexpr int kNr = kW * kNv;  // columns per micro-tile: op(B)'s panel width (the last
                                        // panel of a row may be kW, ..., kNr - kW wide)
  static constexpr std::int64_t kMc = Mc, kKc = Kc;
  static_assert(kMr <= kW && kMc % kMr == 0);  // an op(A) panel is one transpose wide

  static Vec load_tile(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store_tile(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
  static Vec zero() { return Vec{}; }
  static Vec set1(float x) { return Ops::broadcast(&x); }
  static Vec add(Vec a, Vec b) { return a + b; }
  static Vec mul(Vec a, Vec b) { return a * b; }
  // v[r] holds row r of a kW x kW block; afterwards v[c] holds column c.
  [[gnu::always_inline]] static void transpose(Vec (&v)[kW]) {
    transpose_in_blocks<kW>(v);
    Ops::cross_blocks(v);
  }

  // dst[k * w + j] = src[j * ld + k] for k < kc, j < rows (rows <= w; w <= kW or a multiple of
  // kW; lanes [rows, w) get 0): a rows x kc block whose rows are contiguous in k, transposed
  // kW x kW at a time; loads never pass a row's last element.
  static void pack_transposed(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t kc,
                              float* dst, std::int64_t w) {
    for (std::int64_t j0 = 0; j0 < w; j0 += kW) {
      const Lanes store = Ops::lanes(std::min<std::int64_t>(kW, w - j0));
      std::int64_t k0 = 0;
      for (; k0 + kW <= kc; k0 += kW) {
        Vec v[kW];
#pragma GCC unroll 16
        for (int j = 0; j < kW; ++j)
          v[j] = j0 + j < rows ? load_tile(src + (j0 + j) * ld + k0) : zero();
        transpose(v);
#pragma GCC unroll 16
        for (int k = 0; k < kW; ++k) Ops::store(dst + (k0 + k) * w + j0, v[k], store);
      }
      if (k0 < kc) {
        const Lanes load = Ops::lanes(kc - k0);
        Vec v[kW];
#pragma GCC unroll 16
        for (int j = 0; j < kW; ++j)
          v[j] = j0 + j < rows ? Ops::load(src + (j0 + j) * ld + k0, load) : zero();
        transpose(v);
        for (std::int64_t k = 0; k < kc - k0; ++k) Ops::store(dst + (k0 + k) * w + j0, v[k], store);
      }
    }
  }

  // dst[k * w + j] = src[k * ld + j] for k < kc, j < cols (cols <= w), other lanes 0.
  static void pack_direct(const float* src, std::int64_t ld, std::int64_t cols, std::int64_t kc,
                          float* dst, std::int64_t w) {
    for (std::int64_t k = 0; k < kc; ++k) {
      const float* s = src + k * ld;
      float* d = dst + k * w;
      for (std::int64_t j0 = 0; j0 < w; j0 += kW)
        Ops::store(d + j0, j0 < cols ? Ops::load(s + j0, Ops::lanes(cols - j0)) : zero(),
                   Ops::lanes(w - j0));
    }
  }

  // The micro-kernel: acc[r][v] = fma(ap[k][r], bp[k][kW v ..], acc[r][v]) for k = 0..kc-1 in
  // order, the k chain of a kMr x (kW * NV) tile (ap: [kc][kMr], bp: [kc][kW * NV]).
  template <int NV>
  [[gnu::always_inline]] static void chain(const float* __restrict ap, const float* __restrict bp,
                                           std::int64_t kc, Vec (&acc)[kMr][NV]) {
    constexpr int w = kW * NV;
    for (std::int64_t k = 0; k < kc; ++k) {
      const float* b = bp + k * w;
      const float* a = ap + k * kMr;
      Vec bv[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) bv[v] = load_tile(b + kW * v);
      if constexpr (Ops::kPrefetchA) __builtin_prefetch(a + 8 * kMr, 0, 3);
#pragma GCC unroll 16
      for (int r = 0; r < kMr; ++r) {
        const Vec av = Ops::broadcast(a + r);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[r][v] = Ops::fmadd(av, bv[v], acc[r][v]);
      }
    }
  }
};

}  // namespace ditto::sim::gemm_detail
