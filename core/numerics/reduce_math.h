// The elementwise arithmetic of every reduction over ranks (all_reduce, reduce, reduce_scatter,
// torch.cuda.comm.reduce_add), for every dtype and op, written once as DITTO_HD functions that the
// simulator's collectives, the CUDA kernels and the host references of the tests all call.
//
// Note [Reductions over ranks]
// Each element is reduced in an accumulator type Acc<T>:
//   f32, f16, bf16, f8_e4m3, f8_e5m2  -> float      f64 -> double      integers -> the type itself
// Per element: load(x) converts each rank's value to Acc (exact: every small float is an f32);
// premul_sum first multiplies it by that rank's scalar (converted to Acc once); the values are
// combined with combine(op) in the order of the mode (bitwise: the canonical tree over rank index,
// Note [Canonical tree]; fast: any); finish() applies avg's division and rounds ONCE to T.
// So for f16 / bf16 / fp8 the tree accumulates in f32 and rounds once at the end, never at a tree
// node: the result is the same bits for any power-of-two rank count split (the tree over N ranks
// is a subtree of the tree over the same leaves at any other split) and on both backends (the same
// functions run on both). A left-to-right sum that rounds to f16 at every step (what a naive
// kernel, or a ring that rounds per hop, does) gives other bits; tests show one.
//   sum, avg   a + b (floats: IEEE, one rounding per add in Acc; integers: wrap modulo 2^bits)
//   prod       a * b (integers wrap)
//   min, max   the smaller / larger; a NaN in either operand propagates (as torch.minimum /
//              torch.maximum do: NaN wins). NCCL's own ncclMin / ncclMax do not: they reduce with
//              fminf / fmaxf (fmin / fmax, __hmin / __hmax; src/device/reduce_kernel.h), which
//              return the other operand, so the CUDA backend's fast mode on several GPUs, which
//              hands min / max to NCCL, drops a NaN that every other path keeps (Note [CUDA
//              collectives], cuda_communicator.cpp)
//   avg        floats: the sum divided by float(N) (double for f64), then rounded;
//              integers: NCCL's ncclAvg on integer types (its FuncSumPostDiv): the wrapped sum,
//              divided by N with truncation toward zero (signed types: the magnitude of a negative
//              sum is divided, so -7 / 2 = -3, as C's integer division)
//   premul_sum (ncclRedOpCreatePreMulSum): sum over ranks of scalar_r * x_r; floats multiply in
//              Acc (one rounding), integers in T (wrapping; the scalar converted to T).
// Integers are exact in any order (wrapping addition and multiplication are associative and
// commutative), so fast and bitwise give the same bits for integer reductions.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/numerics/float_formats.h"

namespace ditto::rmath {

/// Reduction ops: the same values as ditto::ReduceOp (core/comm/communicator.h), which this header
/// does not include (it is shared with the CUDA kernels).
enum class Op : std::uint8_t { sum, prod, min, max, avg, premul_sum };

template <typename T>
struct AccOf {
  using type = T;
};
template <>
struct AccOf<float16> {
  using type = float;
};
template <>
struct AccOf<bfloat16> {
  using type = float;
};
template <>
struct AccOf<float8_e4m3> {
  using type = float;
};
template <>
struct AccOf<float8_e5m2> {
  using type = float;
};
/// The accumulator type of T (Note [Reductions over ranks]).
template <typename T>
using Acc = typename AccOf<T>::type;

/// x as an accumulator (exact).
template <typename T>
DITTO_HD inline Acc<T> load(T x) {
  if constexpr (is_small_float_v<T>)
    return x.to_float();
  else
    return x;
}

/// The premul_sum scalar of one rank as the accumulator multiplies by it.
template <typename T>
DITTO_HD inline Acc<T> scalar_as_acc(double scalar) {
  if constexpr (std::is_floating_point_v<Acc<T>>)
    return static_cast<Acc<T>>(scalar);
  else
    return cast_float_to_int<T>(scalar);
}

/// load(x), times the rank's scalar for premul_sum.
template <typename T>
DITTO_HD inline Acc<T> load_scaled(T x, Op op, Acc<T> scalar) {
  Acc<T> a = load(x);
  if (op == Op::premul_sum) {
    if constexpr (std::is_integral_v<Acc<T>>) {
      using U = std::make_unsigned_t<Acc<T>>;
      a = static_cast<Acc<T>>(static_cast<U>(static_cast<U>(a) * static_cast<U>(scalar)));
    } else {
      a = a * scalar;
    }
  }
  return a;
}

/// a op b in the accumulator (Note [Reductions over ranks]); sum, avg and premul_sum add.
template <typename A>
DITTO_HD inline A combine(A a, A b, Op op) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case Op::prod: return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case Op::min: return b < a ? b : a;
      case Op::max: return b > a ? b : a;
      default: return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  } else {
    switch (op) {
      case Op::prod: return a * b;
      case Op::min: return (b < a || b != b) ? b : a;  // NaN propagates
      case Op::max: return (b > a || b != b) ? b : a;
      default: return a + b;
    }
  }
}

/// The accumulated value of n ranks as T: avg divides (Note [Reductions over ranks]), then the one
/// rounding to T.
template <typename T>
DITTO_HD inline T finish(Acc<T> a, Op op, int n) {
  if (op == Op::avg) {
    if constexpr (std::is_integral_v<Acc<T>>) {
      using U = std::make_unsigned_t<Acc<T>>;
      if constexpr (std::is_signed_v<Acc<T>>) {
        if (a < 0) {
          const U mag = static_cast<U>(U(0) - static_cast<U>(a));
          a = static_cast<Acc<T>>(U(0) - static_cast<U>(mag / static_cast<U>(n)));
        } else {
          a = static_cast<Acc<T>>(static_cast<U>(a) / static_cast<U>(n));
        }
      } else {
        a = static_cast<Acc<T>>(a / static_cast<U>(n));
      }
    } else {
      a = a / static_cast<Acc<T>>(n);
    }
  }
  if constexpr (is_small_float_v<T>)
    return T::from(a);
  else
    return a;
}

}  // namespace ditto::rmath
