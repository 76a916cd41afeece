// What the emulator's checks share (test_emu.cpp, test_emu_gpt.cpp, test_emu_dtype.cpp): inputs
// with zeros, signed zeros and a wide range of magnitudes, the bitwise comparison, and `both`,
// which runs one call on the simulator and on the CPU-emulated CUDA kernels with identical inputs
// and compares every buffer bit for bit, all NaNs of the buffer's dtype counted as one value
// (Note [NaN bits], core/runtime/nan_bits.h: which NaN an operation returns is the hardware's and
// the compiler's choice; f32 buffers, and byte buffers `both` is given the dtype of). A NaN that
// differs only in its bits is counted (nan_bit_diffs, in the summary line) but passes.
// DITTO_EMU_BITS=1 prints a line per comparison, "BITS <what> <ctx> bufN sim=<fnv> cuda=<fnv>
// canonical=<fnv>" (FNV-1a of the raw bytes, and of the simulator's bytes with canonical NaNs):
// two builds of the simulator (gcc / clang, -O levels, fuzz instrumentation) compared by diffing
// those lines, and "NANBITS ..." for each NaN-only difference between the backends.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/runtime/backend.h"
#include "core/runtime/nan_bits.h"
#include "emu.h"

using namespace ditto;
using V = std::vector<float>;
using i64 = std::int64_t;

inline int failures = 0, checks = 0;
/// Comparisons that passed only because all NaNs count as one value (Note [NaN bits]).
inline int nan_bit_diffs = 0;
/// DITTO_EMU_BITS set: print each comparison's hashes (the header above).
inline const bool emu_print_bits = std::getenv("DITTO_EMU_BITS") != nullptr;

/// FNV-1a 64 of n bytes at p, every NaN of dtype t canonical first when `canonical` (integer
/// dtypes, u8 for untyped bytes: as they are).
inline unsigned long long emu_fnv(const void* p, std::size_t n, DType t, bool canonical) {
  std::vector<unsigned char> b(static_cast<const unsigned char*>(p),
                               static_cast<const unsigned char*>(p) + n);
  if (canonical) canonicalize_nans(t, b.data(), static_cast<i64>(n / dtype_size(t)));
  unsigned long long h = 1469598103934665603ull;
  for (unsigned char c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

/// The DITTO_EMU_BITS line of one comparison (sim's bytes a, cuda's b, both n bytes of dtype t).
inline void emu_bits_line(const char* what, const std::string& ctx, const void* a, const void* b,
                          std::size_t n, DType t) {
  if (!emu_print_bits) return;
  std::printf("BITS %s %s sim=%016llx cuda=%016llx canonical=%016llx\n", what, ctx.c_str(),
              emu_fnv(a, n, t, false), emu_fnv(b, n, t, false), emu_fnv(a, n, t, true));
}

/// n values: +0 and -0 one in 16 each (unless !zeros), the rest m x 10^e, m uniform on [-1, 1) in
/// steps of 2^-23 and e uniform on -4..4. The mantissa from the generator's bits, not
/// std::uniform_real_distribution, whose generate_canonical calls logl for every value (7% of
/// cuda_emu_test's time under ASan).
inline V mixed(std::size_t n, unsigned seed, bool zeros = true) {
  static const float pow10[9] = {1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f, 1e1f, 1e2f, 1e3f, 1e4f};
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> e10(-4, 4), pick(0, 15);
  V v(n);
  for (float& x : v) {
    int p = zeros ? pick(gen) : 5;
    if (p == 0 || p == 1) {
      x = p == 0 ? 0.0f : -0.0f;
      continue;
    }
    const float m =
        static_cast<float>(static_cast<std::int32_t>(gen() >> 8) - (1 << 23)) * 0x1p-23f;
    x = m * pow10[e10(gen) + 4];
  }
  return v;
}

inline void check(const char* what, const V& a, const V& b, const std::string& ctx) {
  ++checks;
  if (a.size() != b.size()) {
    ++failures;
    std::printf("FAIL %s %s size\n", what, ctx.c_str());
    return;
  }
  emu_bits_line(what, ctx, a.data(), b.data(), a.size() * sizeof(float), DType::f32);
  bool nan_only = false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
      if (std::isnan(a[i]) && std::isnan(b[i])) {  // one value (Note [NaN bits])
        if (!nan_only && emu_print_bits)
          std::printf("NANBITS %s %s at %zu: sim %08x cuda %08x\n", what, ctx.c_str(), i,
                      std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]));
        nan_only = true;
        continue;
      }
      ++failures;
      std::printf("FAIL %s %s at %zu: sim %g (%08x) cuda %g (%08x)\n", what, ctx.c_str(), i, a[i],
                  std::bit_cast<std::uint32_t>(a[i]), b[i], std::bit_cast<std::uint32_t>(b[i]));
      return;
    }
  nan_bit_diffs += nan_only;
}

// Tensor sizes of a multi-tensor call and their offsets in one packed buffer, with a gap after
// each (a kernel writing past its tensor shows); at least one element.
struct Packed {
  std::vector<i64> n, at;
  i64 total = 0;
  explicit Packed(const std::vector<i64>& sizes) : n(sizes) {
    for (i64 k : sizes) {
      at.push_back(total);
      total += k + 1;
    }
    total = std::max<i64>(total, 1);
  }
};

inline Kernels* simk;
inline Stream* sims;
inline std::unique_ptr<Kernels> cudak;
inline cuda_emu::CudaStream cudas;

// Byte buffers (the dtype-generic kernels, test_emu_dtype.cpp): equal bytes, elements of dtype
// t; a float t's NaNs all one value (Note [NaN bits]); u8: every byte as it is (the casts', whose
// NaNs are ditto's conversions, exact on both backends: Note [CUDA NaN casts]).
inline void check(const char* what, const std::vector<std::uint8_t>& a,
                  const std::vector<std::uint8_t>& b, const std::string& ctx, DType t = DType::u8) {
  ++checks;
  const std::size_t es = dtype_size(t);
  if (a.size() == b.size()) emu_bits_line(what, ctx, a.data(), b.data(), a.size(), t);
  std::size_t i = 0;
  bool bad = a.size() != b.size(), nan_only = false;
  for (; !bad && i + es <= a.size(); i += es)
    if (std::memcmp(a.data() + i, b.data() + i, es) != 0) {
      if (!is_nan_bits(t, a.data() + i) || !is_nan_bits(t, b.data() + i)) {
        bad = true;
        break;
      }
      if (!nan_only && emu_print_bits)
        std::printf("NANBITS %s %s at byte %zu: sim %02x cuda %02x (last byte)\n", what,
                    ctx.c_str(), i, a[i + es - 1], b[i + es - 1]);
      nan_only = true;
    }
  if (!bad && i < a.size()) bad = std::memcmp(a.data() + i, b.data() + i, a.size() - i) != 0;
  if (bad) {
    ++failures;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    std::printf("FAIL %s %s: first differing byte %zu (sim %02x cuda %02x)\n", what, ctx.c_str(), i,
                i < a.size() ? a[i] : 0, i < b.size() ? b[i] : 0);
    return;
  }
  nan_bit_diffs += nan_only;
}
inline void check(const char* what, const V& a, const V& b, const std::string& ctx, DType) {
  check(what, a, b, ctx);
}

// Run f(kernels, stream, Buf& state...) on copies of the state for both backends, compare all
// (Buf: V of floats, or bytes; `t` the bytes' element dtype: Note [NaN bits]).
template <class Buf = V, class F>
void both(const char* what, const std::string& ctx, std::vector<Buf> state, F f,
          DType t = DType::u8) {
  std::vector<Buf> s1 = state, s2 = state;
  try {
    f(*simk, *sims, s1);
    sims->synchronize();
    f(*cudak, cudas, s2);
  } catch (const std::exception& e) {  // e.g. a kernel one backend lacks
    ++checks;
    ++failures;
    std::printf("FAIL %s %s: %s\n", what, ctx.c_str(), e.what());
    return;
  }
  for (std::size_t i = 0; i < s1.size(); ++i)
    check(what, s1[i], s2[i], ctx + " buf" + std::to_string(i), t);
}

// Runs f(), a part of a suite that checks as it goes; an exception it throws (an error of a
// kernel or of the part's own set-up) counts as one failed check, "FAIL <what>: <error>".
template <class F>
void guarded(const std::string& what, F f) {
  try {
    f();
  } catch (const std::exception& e) {
    ++checks;
    ++failures;
    std::printf("FAIL %s: %s\n", what.c_str(), e.what());
  }
}

/// A case's sizes for its messages: dims({2, 3, 7}) is "2x3x7".
inline std::string dims(std::initializer_list<i64> d) {
  std::string s;
  for (i64 x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

using Bounds = std::vector<i64>;
inline Bounds random_bounds(i64 rows, i64 S, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<i64> cut(0, rows);
  Bounds b(S + 1, 0);
  b.back() = rows;
  for (i64 i = 1; i < S; ++i) b[i] = cut(gen);
  std::sort(b.begin(), b.end());
  return b;
}

/// The transformer kernels' checks (test_emu_gpt.cpp); `seed` advances with every input drawn.
void check_gpt_kernels(unsigned& seed);
/// The attention's checks alone (bitwise and fast; part of check_gpt_kernels).
void check_attention_kernels(unsigned& seed);
/// The typed attention's checks (test_emu_attention.cpp): the mma helper, attention_forward_ex /
/// attention_backward_ex bitwise against the simulator's MixedOp path, fast against double.
void check_typed_attention(unsigned& seed);
/// Its error at GPT sizes (`cuda_emu_test attention-measure`, not in ctest: tens of seconds).
void measure_typed_attention(unsigned& seed);
/// The fused kernels' checks (cuda_fused.cu beyond test_emu_gpt.cpp's; test_emu_fused.cpp).
void check_fused_kernels(unsigned& seed);
/// The typed row kernels' checks (Kernels::*_ex on bf16 / f16 against the simulator's MixedOp
/// path; test_emu_rows.cpp; part of check_fused_kernels).
void check_typed_rows(unsigned& seed);
// The typed multi-tensor kernels (adam_step_multi_ex, sum_squares_multi_ex) against the
// simulator's casts and f32 kernels (test_emu_multi.cpp).
void check_typed_multi_tensor(unsigned& seed);
/// The reductions over rows (typed and f32), bitwise sum and sum_squares' tree
/// (test_emu_reduce.cpp, Note [CUDA row sums]).
void check_row_reductions(unsigned& seed);
/// The dtype-generic kernels' checks (test_emu_dtype.cpp).
void check_dtype_kernels(unsigned& seed);
/// The typed GEMM's checks (test_emu_gemm.cpp): gemm_ex against the simulator's MixedOp path.
void check_typed_gemm(unsigned& seed);
