// Which NaN an arithmetic result is: not part of the bitwise contract (Note [NaN bits]).
//
// Note [NaN bits]
// Bitwise mode promises the same bits on the simulator and on GPUs for any power-of-two device
// count (docs/determinism.md), with all NaNs of one dtype counted as one value: the sign and
// payload of a NaN that arithmetic makes are the hardware's and the compiler's choice, not
// ditto's. IEEE 754 (2019, 6.2.3 and 6.3) leaves them open; x86 SSE / AVX return the first
// operand's NaN (quieted) when an operand is NaN, and the negative "default NaN" 0xffc00000 for
// an invalid operation (inf - inf, 0 * inf, 0 / 0), and which operand is first is the compiler's
// choice (a + b may be compiled as b + a: gcc and clang, -O levels and libFuzzer's
// instrumentation differ); NVIDIA GPUs return the canonical NaN 0x7fffffff for f32 arithmetic
// (add, sub, mul, fma, div, sqrt), 0x7fff for f16 / bf16 arithmetic, and their cvt instructions
// give the canonical NaN of the target format. So a NaN's bits can differ between the backends,
// and between two builds of the simulator, while every other value is equal bit for bit.
// Making every kernel's NaN canonical instead would put a test and a select after every
// arithmetic result of every hot kernel on both backends, for a difference no computation can
// see: a NaN's sign and payload change no comparison, no arithmetic result (NaN in, NaN out) and
// no conversion to an integer (NaN -> 0, Note [Small float conversions]). PyTorch's own
// comparisons agree: torch.testing.assert_close(equal_nan=True) counts any NaN equal to any NaN.
// What copies and casts do stays exact: a copy moves bits, and ditto's conversions keep a NaN's
// sign and top payload bits on both backends (Note [Small float conversions], Note [CUDA NaN
// casts]); only NaNs made by arithmetic are free.
// Everything that compares or hashes bits across builds or backends therefore canonicalises NaNs
// first, with canonicalize_nans below: params_checksum (core/train/replica.cpp, what ditto-train
// prints and gpu-check compares sim against cuda with), tools/params_checksum.py, the test
// helpers bits_equal and nan_canonical_bytes (tests/test_util.h), and the CPU emulation's
// comparisons of the CUDA kernels against the simulator (tools/cuda_emu/emu_check.h). A tensor
// without NaNs hashes and compares as before, bit for bit.
#pragma once

#include <cstdint>

#include "core/runtime/dtype.h"

namespace ditto {

/// The canonical quiet NaN of float dtype `t` as its bits, zero-extended to 64: the NaN an NVIDIA
/// GPU's arithmetic returns, every bit but the sign set (f32 0x7fffffff, f64 0x7fffffffffffffff,
/// f16 and bf16 0x7fff, f8_e4m3 and f8_e5m2 0x7f). Throws InvalidArgument for an integer dtype
/// (which has no NaN).
std::uint64_t canonical_nan_bits(DType t);

/// True when the `dtype_size(t)` bytes at `p` are a NaN of dtype `t` (any sign, any payload,
/// quiet or signalling); always false for integer dtypes.
bool is_nan_bits(DType t, const void* p);

/// Rewrites each NaN among the n elements of dtype `t` at host memory `p` to
/// canonical_nan_bits(t) and returns how many there were; every other element, and every element
/// of an integer dtype, is left as it is (Note [NaN bits]). n >= 0.
std::int64_t canonicalize_nans(DType t, void* p, std::int64_t n);

}  // namespace ditto
