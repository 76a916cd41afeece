// The CUDA backend's dtype-generic kernels (CudaDtypeKernels, cuda_kernels_common.cuh):
// Kernels::cast, fill_bits, add_any, scale_any and reduce_inputs on every DType. Elements are
// stored as ditto's host types (float16, bfloat16, float8_e4m3, float8_e5m2 are bit containers
// of the same size and layout as __half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2), and every
// element's arithmetic calls the DITTO_HD functions the simulator calls (convert<To> of
// core/numerics/float_formats.h, core/numerics/dtype_math.h, core/numerics/reduce_math.h), so the
// two backends give the same bits. ctest CudaEmu.Kernels runs these on the CPU against the
// simulator (tools/cuda_emu/test_emu_dtype.cpp).
//
// Note [CUDA reduce_inputs]
// One thread per element walks the inputs in index order: bitwise mode through a streaming
// canonical tree on Acc values (the binary counter of Note [Streaming canonical tree], with
// rmath::combine for the op), fast mode left to right on Acc (the simulator's fast order, so the
// two modes' bits equal the simulator's in both). At most kReduceCap inputs go into one launch
// (their pointers are a kernel parameter); more are split at tree_mid (Note [Canonical tree])
// into two halves reduced into Acc scratch memory, then combined by a launch over the two: the
// canonical tree over all inputs, rounded to the dtype once at the root. (Fast mode takes the
// same tree past kReduceCap inputs: any order is allowed there.)
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend_cuda/cuda_kernels_common.cuh"
#include "core/numerics/dtype_math.h"
#include "core/numerics/reduce_math.h"

namespace ditto::cuda::kern {

namespace {

// ---- elementwise -------------------------------------------------------------------------------

// Note [CUDA NaN casts]
// The GPU's conversions between f64 and f32 (PTX cvt.rn.f32.f64, cvt.f64.f32) return the
// canonical NaN (0x7fffffff, 0x7fffffffffffffff) for every NaN input, where x86 (cvtsd2ss,
// cvtss2sd), and so the simulator and the host, keep the sign and the top payload bits and set
// the quiet bit. convert<To> of core/numerics/float_formats.h casts f64 <-> f32 with static_cast,
// also on the way between f64 and f16 / bf16 / fp8 (through f32), so on the GPU a NaN's sign
// and payload were lost. cast_value handles NaN by bits first, as x86 does, and leaves every
// other value to convert<To> (ctest CudaEmu.Kernels models the GPU's cvt, tools/cuda_emu/emu.h).

/// f64 NaN -> f32 NaN as x86's cvtsd2ss: sign, the top 22 payload bits, quiet bit set.
__device__ __forceinline__ float nan_f64_to_f32(double x) {
  std::uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  const auto r = static_cast<std::uint32_t>((b >> 32) & 0x80000000u) | 0x7fc00000u |
                 static_cast<std::uint32_t>((b >> 29) & 0x7fffffu);
  float f;
  std::memcpy(&f, &r, sizeof f);
  return f;
}

/// f32 NaN -> f64 NaN as x86's cvtss2sd: sign, the payload shifted up, quiet bit set.
__device__ __forceinline__ double nan_f32_to_f64(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  const std::uint64_t r = (static_cast<std::uint64_t>(b & 0x80000000u) << 32) |
                          0x7ff8000000000000ull | (static_cast<std::uint64_t>(b & 0x7fffffu) << 29);
  double d;
  std::memcpy(&d, &r, sizeof d);
  return d;
}

template <class T>
inline constexpr bool is_f32_or_small = std::is_same_v<T, float> || is_small_float_v<T>;

/// convert<To>(x) with NaN between f64 and f32 (and the small formats, through f32) by bits
/// (Note [CUDA NaN casts]).
template <class To, class From>
__device__ __forceinline__ To cast_value(From x) {
  if constexpr (std::is_same_v<From, double> && is_f32_or_small<To>) {
    if (x != x) {
      const float f = nan_f64_to_f32(x);
      if constexpr (std::is_same_v<To, float>)
        return f;
      else
        return To::from(f);  // by bits already (Note [Small float conversions])
    }
  } else if constexpr (std::is_same_v<To, double> && is_f32_or_small<From>) {
    float f;
    if constexpr (std::is_same_v<From, float>)
      f = x;
    else
      f = x.to_float();  // by bits: a NaN keeps sign and payload
    if (f != f) return nan_f32_to_f64(f);
  }
  return convert<To>(x);
}

template <class From, class To>
__global__ void cast_kernel(const From* x, To* y, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) y[i] = cast_value<To>(x[i]);
}

template <class U>
__global__ void fill_bits_kernel(U* x, U v, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) x[i] = v;
}

template <class T>
__global__ void add_any_kernel(const T* a, const T* b, T* out, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) out[i] = dtype_math::add(a[i], b[i]);
}

template <class T>
__global__ void scale_any_kernel(T* x, rmath::Acc<T> alpha, i64 n) {
  for (i64 i = global_thread(); i < n; i += grid_threads()) x[i] = dtype_math::scale(x[i], alpha);
}

// ---- reduce_inputs (Note [CUDA reduce_inputs]) -------------------------------------------------

constexpr int kReduceCap = 64;  // inputs per launch
constexpr int kReduceDepth = cm::tree_stack_depth(kReduceCap);

struct ReducePtrs {
  const void* p[kReduceCap];
};

// The canonical tree over leaves pushed in ascending order, combined with `op` on Acc values
// (canonical::TreeStack's binary counter, for any accumulator type).
template <class A, int Depth>
struct AccTree {
  A entry[Depth];
  int top = 0;
  __device__ void push(i64 leaf, A x, rmath::Op op) {
    for (std::uint64_t c = static_cast<std::uint64_t>(leaf) + 1; (c & 1u) == 0; c >>= 1) {
      --top;
      x = rmath::combine(entry[top], x, op);
    }
    entry[top++] = x;
  }
  __device__ A result(rmath::Op op) const {
    A x = entry[top - 1];
    for (int t = top - 2; t >= 0; --t) x = rmath::combine(entry[t], x, op);
    return x;
  }
};

// Leaf k at element i: a T input loaded into Acc, or an Acc partial of a split.
template <class T, bool LeafAcc>
__device__ __forceinline__ rmath::Acc<T> leaf_at(const ReducePtrs& in, int k, i64 i) {
  if constexpr (LeafAcc)
    return static_cast<const rmath::Acc<T>*>(in.p[k])[i];
  else
    return rmath::load(static_cast<const T*>(in.p[k])[i]);
}

// out[i] = op over the n leaves at i, as Acc (OutAcc: a partial of a split) or finished to T
// (avg divides by n_total, the inputs of the whole reduction). out may alias in.p[0]: each
// thread reads its element of every input before writing it.
template <class T, bool LeafAcc, bool OutAcc>
__global__ void reduce_inputs_kernel(const ReducePtrs in, int n, void* out, i64 numel,
                                     rmath::Op op, int n_total, bool tree) {
  using A = rmath::Acc<T>;
  for (i64 i = global_thread(); i < numel; i += grid_threads()) {
    A acc;
    if (tree) {
      AccTree<A, kReduceDepth> t;
      for (int k = 0; k < n; ++k) t.push(k, leaf_at<T, LeafAcc>(in, k, i), op);
      acc = t.result(op);
    } else {
      acc = leaf_at<T, LeafAcc>(in, 0, i);
      for (int k = 1; k < n; ++k) acc = rmath::combine(acc, leaf_at<T, LeafAcc>(in, k, i), op);
    }
    if constexpr (OutAcc)
      static_cast<A*>(out)[i] = acc;
    else
      static_cast<T*>(out)[i] = rmath::finish<T>(acc, op, n_total);
  }
}

template <class T, bool LeafAcc, bool OutAcc>
void launch_reduce(const Launch& l, const void* const* leaves, int n, void* out, i64 numel,
                   rmath::Op op, int n_total, bool tree) {
  ReducePtrs in{};
  for (int k = 0; k < n; ++k) in.p[k] = leaves[k];
  reduce_inputs_kernel<T, LeafAcc, OutAcc><<<blocks_for(numel), kThreads, 0, l.get()>>>(
      in, n, out, numel, op, n_total, tree);
  l.check();
}

// Scratch memory for numel Acc<T> values.
template <class T>
i64 acc_floats(i64 numel) {
  return (numel * static_cast<i64>(sizeof(rmath::Acc<T>)) + 3) / 4;
}

// out = the canonical tree over the n leaves (T inputs, or Acc partials when LeafAcc), as Acc
// (OutAcc) or finished to T; more than kReduceCap leaves split at tree_mid.
template <class T, bool LeafAcc, bool OutAcc>
void reduce_tree(const Launch& l, const void* const* leaves, int n, void* out, i64 numel,
                 rmath::Op op, int n_total, bool tree) {
  if (n <= kReduceCap) return launch_reduce<T, LeafAcc, OutAcc>(l, leaves, n, out, numel, op,
                                                                n_total, tree);
  const int mid = static_cast<int>(tree_mid(0, n));
  DeviceTemp left(l, acc_floats<T>(numel)), right(l, acc_floats<T>(numel));
  reduce_tree<T, LeafAcc, true>(l, leaves, mid, left.get(), numel, op, n_total, true);
  reduce_tree<T, LeafAcc, true>(l, leaves + mid, n - mid, right.get(), numel, op, n_total, true);
  const void* pair[2] = {left.get(), right.get()};
  launch_reduce<T, true, OutAcc>(l, pair, 2, out, numel, op, n_total, true);
}

}  // namespace

void CudaDtypeKernels::cast(Stream& s, const void* x, DType from, void* y, DType to, i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "cast");
  visit_dtype(from, [&](auto from_tag) {
    using From = decltype(from_tag);
    visit_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      cast_kernel<From, To><<<blocks_for(n), kThreads, 0, l.get()>>>(
          static_cast<const From*>(x), static_cast<To*>(y), n);
    });
  });
  l.check();
}

void CudaDtypeKernels::fill_bits(Stream& s, void* x, std::size_t elem_size, std::uint64_t bits,
                                 i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "fill_bits");
  const int blocks = blocks_for(n);
  switch (elem_size) {
    case 1:
      fill_bits_kernel<std::uint8_t><<<blocks, kThreads, 0, l.get()>>>(
          static_cast<std::uint8_t*>(x), static_cast<std::uint8_t>(bits), n);
      break;
    case 2:
      fill_bits_kernel<std::uint16_t><<<blocks, kThreads, 0, l.get()>>>(
          static_cast<std::uint16_t*>(x), static_cast<std::uint16_t>(bits), n);
      break;
    case 4:
      fill_bits_kernel<std::uint32_t><<<blocks, kThreads, 0, l.get()>>>(
          static_cast<std::uint32_t*>(x), static_cast<std::uint32_t>(bits), n);
      break;
    default:
      fill_bits_kernel<std::uint64_t><<<blocks, kThreads, 0, l.get()>>>(
          static_cast<std::uint64_t*>(x), bits, n);
      break;
  }
  l.check();
}

void CudaDtypeKernels::add_any(Stream& s, DType t, const void* a, const void* b, void* out,
                               i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "add_any");
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    add_any_kernel<T><<<blocks_for(n), kThreads, 0, l.get()>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
  });
  l.check();
}

void CudaDtypeKernels::scale_any(Stream& s, DType t, void* x, double alpha, i64 n) {
  if (n <= 0) return;
  Launch l(backend_, s, "scale_any");
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    scale_any_kernel<T><<<blocks_for(n), kThreads, 0, l.get()>>>(
        static_cast<T*>(x), rmath::scalar_as_acc<T>(alpha), n);
  });
  l.check();
}

void CudaDtypeKernels::reduce_inputs(Stream& s, DType t, const void* const* inputs, int n_inputs,
                                     void* out, i64 numel, int op, Determinism mode) {
  if (numel <= 0 || n_inputs <= 0) return;
  Launch l(backend_, s, "reduce_inputs");
  const auto rop = static_cast<rmath::Op>(op);
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    reduce_tree<T, false, false>(l, inputs, n_inputs, out, numel, rop, n_inputs,
                                 mode == Determinism::bitwise);
  });
}

}  // namespace ditto::cuda::kern
