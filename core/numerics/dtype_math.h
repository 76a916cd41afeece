// The elementwise arithmetic of the dtype-generic kernels Kernels::add_any and scale_any, as
// DITTO_HD functions the simulator (backend_sim/sim_kernels_dtype.cpp) and the CUDA kernels
// (backend_cuda/cuda_kernels_dtype.cu) both call, so both backends give the same bits for every
// dtype. They are the per-element steps of Note [Reductions over ranks]
// (core/numerics/reduce_math.h): floats load into Acc (f32 for f32 / f16 / bf16 / fp8, f64 for
// f64), compute there with one IEEE rounding, and round once to the dtype; integers wrap modulo
// 2^bits.
#pragma once

#include "core/numerics/reduce_math.h"

namespace ditto::dtype_math {

/// a + b in T: sum in Acc<T>, one rounding to T (torch.add on any dtype; for f32 plain a + b).
template <typename T>
DITTO_HD inline T add(T a, T b) {
  return rmath::finish<T>(rmath::combine(rmath::load(a), rmath::load(b), rmath::Op::sum),
                          rmath::Op::sum, 2);
}

/// x * alpha in T with alpha already as rmath::scalar_as_acc<T>(alpha) (floats: alpha rounded
/// to Acc once, one multiply, one rounding to T; integers: alpha converted to T, wrapping
/// multiply), premul_sum's per-rank step.
template <typename T>
DITTO_HD inline T scale(T x, rmath::Acc<T> alpha) {
  return rmath::finish<T>(rmath::load_scaled(x, rmath::Op::premul_sum, alpha),
                          rmath::Op::premul_sum, 1);
}

}  // namespace ditto::dtype_math
