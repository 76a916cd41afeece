// The dtype-generic kernels (backend_cuda/cuda_kernels_dtype.cu through emu.h) against the
// simulator's, bit for bit: cast for every (from, to) pair of the 12 dtypes over hard values (ties,
// subnormals, overflow, +-0, inf, NaN, integer extremes), fill_bits for every element size,
// add_any and scale_any on every dtype, and reduce_inputs for every dtype x op (sum, prod, min,
// max, avg) x 1..8 inputs in both modes (fast is left to right on both backends), plus 65 and
// 130 inputs in bitwise mode (the split of Note [CUDA reduce_inputs]) for f16, bf16, f32, i32.
// Results of arithmetic (add_any, scale_any, reduce_inputs) that are NaN compare as NaN (any NaN
// equals any NaN of the dtype: `both` is given the dtype, Note [NaN bits] in
// core/runtime/nan_bits.h): which NaN an IEEE operation returns is the hardware's choice (x86
// returns one operand's, sign and payload, or the negative default NaN for inf - inf, and the
// compiler may swap a + b; NVIDIA GPUs return the canonical 0x7fffffff), so the sign of an fp8
// e4m3 NaN after a sum is not part of the contract. Casts compare every bit (ditto's own
// conversions, exact on both backends: Note [CUDA NaN casts]).
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/runtime/dtype.h"
#include "emu_check.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

// Doubles that exercise every conversion: ties of f16 / bf16 / fp8, subnormals of each format,
// values past each format's range, signed zeros, inf, NaN, integer extremes and fractions.
std::vector<double> hard_values(std::size_t n, unsigned seed) {
  std::vector<double> v = {
      0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 65504.0, 65520.0, 65536.0, 448.0, 464.0, 480.0,
      57344.0, 61440.0, 3.0e38, 3.5e38, 1e-8, 6e-8, 5.96e-8, 2.98e-8, 1e-40, -1e-45, 1.0009765625,
      1.00048828125, 1.001953125, 1.00390625, 127.0, 128.0, 255.0, 256.0, -128.0, -129.0,
      2147483647.0, 2147483648.0, -2147483649.0, 4294967296.0, 9.3e18, 1.9e19, -9.3e18, 0.999999,
      -0.999999, 1e300, -1e300, std::numeric_limits<double>::infinity(),
      -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 0.0078125,
      0.001953125,
      // NaNs with sign and payload, quiet and signalling (Note [CUDA NaN
      // casts]): x86 keeps sign and top payload bits, the GPU's cvt does not
      std::bit_cast<double>(0xfff8000000000123ull), std::bit_cast<double>(0x7ff4000020000000ull),
      std::bit_cast<double>(0xfff0123456789abcull), std::bit_cast<double>(0x7ffabcdef0000000ull),
      std::bit_cast<double>(0xfff0000000000001ull)};
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-30, 40);
  while (v.size() < n) v.push_back(mant(gen) * std::ldexp(1.0, e(gen)));
  v.resize(n);
  return v;
}

// n elements of dtype t: convert<T> of hard values (so every dtype gets its own hard cases).
Bytes elements(DType t, std::size_t n, unsigned seed) {
  const std::vector<double> v = hard_values(n, seed);
  Bytes b(n * dtype_size(t));
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      const T x = convert<T>(v[i]);
      std::memcpy(b.data() + i * sizeof(T), &x, sizeof(T));
    }
  });
  return b;
}

const char* op_name(int op) {
  static const char* names[] = {"sum", "prod", "min", "max", "avg"};
  return names[op];
}

}  // namespace

void check_dtype_kernels(unsigned& seed) {
  const std::size_t n = 300;  // two blocks of 256 threads: the grid-stride tail is exercised
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      Bytes x = elements(from, n, seed++), y(n * dtype_size(to), 0xAB);
      both<Bytes>("cast", std::string(dtype_name(from)) + "->" + dtype_name(to), {x, y},
                  [&](Kernels& k, Stream& s, std::vector<Bytes>& b) {
                    k.cast(s, b[0].data(), from, b[1].data(), to, static_cast<i64>(n));
                  });
    }
  for (std::size_t size : {1u, 2u, 4u, 8u}) {
    Bytes x(n * size, 0x11);
    both<Bytes>("fill_bits", std::to_string(size) + " bytes", {x},
                [&](Kernels& k, Stream& s, std::vector<Bytes>& b) {
                  k.fill_bits(s, b[0].data(), size, 0x8877665544332211ull, static_cast<i64>(n));
                });
  }
  for (DType t : kAllDTypes) {
    Bytes a = elements(t, n, seed++), b = elements(t, n, seed++), out(n * dtype_size(t), 0);
    both<Bytes>(
        "add_any", dtype_name(t), {a, b, out},
        [&](Kernels& k, Stream& s, std::vector<Bytes>& v) {
          k.add_any(s, t, v[0].data(), v[1].data(), v[2].data(), static_cast<i64>(n));
          k.add_any(s, t, v[0].data(), v[1].data(), v[0].data(), static_cast<i64>(n));
        },
        t);
    for (double alpha : {0.1, -3.0, 0.5})
      both<Bytes>(
          "scale_any", std::string(dtype_name(t)) + " alpha " + std::to_string(alpha), {a},
          [&](Kernels& k, Stream& s, std::vector<Bytes>& v) {
            k.scale_any(s, t, v[0].data(), is_integral(t) ? std::trunc(alpha) : alpha,
                        static_cast<i64>(n));
          },
          t);
  }
  // reduce_inputs: `count` elements per input; the output aliases input 0 in one of the runs.
  const std::size_t count = 70;
  auto reduce_case = [&](DType t, int op, int inputs, Determinism mode, bool alias) {
    std::vector<Bytes> state;
    for (int q = 0; q < inputs; ++q) state.push_back(elements(t, count, seed++));
    state.push_back(Bytes(count * dtype_size(t), 0));
    const std::string ctx =
        std::string(dtype_name(t)) + " " + op_name(op) + " x" + std::to_string(inputs) +
        (mode == Determinism::bitwise ? " bitwise" : " fast") + (alias ? " in place" : "");
    both<Bytes>(
        "reduce_inputs", ctx, state,
        [&](Kernels& k, Stream& s, std::vector<Bytes>& v) {
          std::vector<const void*> ptrs;
          for (int q = 0; q < inputs; ++q) ptrs.push_back(v[q].data());
          Bytes& out = alias ? v[0] : v.back();
          k.reduce_inputs(s, t, ptrs.data(), inputs, out.data(), static_cast<i64>(count), op, mode);
        },
        t);
  };
  for (DType t : kAllDTypes)
    for (int op = 0; op <= 4; ++op)
      for (int inputs : {1, 2, 3, 5, 8})
        for (Determinism mode : {Determinism::fast, Determinism::bitwise})
          reduce_case(t, op, inputs, mode, inputs == 3);
  for (DType t : {DType::f16, DType::bf16, DType::f32, DType::i32})
    for (int inputs : {65, 130}) reduce_case(t, 0, inputs, Determinism::bitwise, false);
  reduce_case(DType::f16, 4, 130, Determinism::bitwise, true);
  reduce_case(DType::bf16, 3, 65, Determinism::bitwise, false);
}
