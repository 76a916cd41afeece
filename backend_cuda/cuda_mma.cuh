// Internal: the warp-level tensor-core product of the CUDA backend's fast attention
// (cuda_attention.cu, Note [CUDA attention]): mma.sync.aligned.m16n8k16 with bf16 or f16
// operands and f32 accumulation, and the 16-bit element packing its fragments use. On the GPU
// inline PTX (sm_80 and later); in tools/cuda_emu (DITTO_CUDA_EMU, emu.h) an emulated definition
// that gathers the warp's fragments through the warp barrier and computes each lane's d with
// exact products (so the emulator pins the fragment layout below).
//
// Note [mma fragments]
// mma_m16n8k16<E>(d, a, b, c): D[16x8] = A[16x16] B[16x8] + C[16x8], E the operands' storage
// type (ditto::bfloat16 or ditto::float16), two 16-bit elements per 32-bit register (the lower
// half the first element). With g = lane >> 2 and t = lane % 4 (the PTX ISA's "Matrix Fragments
// for mma.m16n8k16 with floating point type"):
//   A (16x16, row): a[0] = (A[g][2t], A[g][2t+1]);     a[1] = (A[g+8][2t], A[g+8][2t+1]);
//                   a[2] = (A[g][2t+8], A[g][2t+9]);   a[3] = (A[g+8][2t+8], A[g+8][2t+9]).
//   B (16x8, col):  b[0] = (B[2t][g], B[2t+1][g]);     b[1] = (B[2t+8][g], B[2t+9][g]).
//   C, D (16x8 f32): c[0] = C[g][2t], c[1] = C[g][2t+1], c[2] = C[g+8][2t], c[3] = C[g+8][2t+1].
// So the C fragments of two adjacent n8 tiles (columns 16j .. 16j+15) of a product, packed pairwise,
// are the A fragment of k16 slice j of the next product (FlashAttention-2's P V without a trip
// through shared memory): a[0] = (c0[0], c0[1]), a[1] = (c0[2], c0[3]), a[2] = (c1[0], c1[1]),
// a[3] = (c1[2], c1[3]) (to_a_fragment). Every lane of the warp calls it (mma.sync).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/numerics/float_formats.h"

namespace ditto::cuda::kern {

#ifndef DITTO_CUDA_EMU
template <class E>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4],
                                             const unsigned (&b)[2], const float (&c)[4]);

template <>
__device__ __forceinline__ void mma_m16n8k16<bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                                       const unsigned (&b)[2],
                                                       const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#else
  __trap();  // no tensor cores before sm_80 (has_attention_ex's fast path needs them)
#endif
}

template <>
__device__ __forceinline__ void mma_m16n8k16<float16>(float (&d)[4], const unsigned (&a)[4],
                                                      const unsigned (&b)[2],
                                                      const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
        "f"(c[2]), "f"(c[3]));
#else
  __trap();
#endif
}
#endif  // DITTO_CUDA_EMU: emu.h defines mma_m16n8k16

// (lo, hi) rounded to E (to nearest even) in one register, lo in the lower half: cvt.rn.bf16x2.f32
// / cvt.rn.f16x2.f32 on the GPU, float_formats.h's rounding (the same values) elsewhere.
template <class E>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned r;
  if constexpr (std::is_same_v<E, bfloat16>)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return unsigned(E::from(lo).bits) | (unsigned(E::from(hi).bits) << 16);
#endif
}

// Two 16-bit elements (lo, hi) into one fragment register.
__device__ __forceinline__ unsigned pack_bits(std::uint16_t lo, std::uint16_t hi) {
  return unsigned(lo) | (unsigned(hi) << 16);
}

// The A fragment of k16 slice j from the C fragments of n8 tiles 2j (c0) and 2j + 1 (c1), each
// element rounded to E (Note [mma fragments]).
template <class E>
__device__ __forceinline__ void to_a_fragment(const float (&c0)[4], const float (&c1)[4],
                                              unsigned (&a)[4]) {
  a[0] = pack2<E>(c0[0], c0[1]);
  a[1] = pack2<E>(c0[2], c0[3]);
  a[2] = pack2<E>(c1[0], c1[1]);
  a[3] = pack2<E>(c1[2], c1[3]);
}

}  // namespace ditto::cuda::kern
