// The simulator's dtype-generic kernels (Kernels::cast, fill_bits, add_any, scale_any,
// reduce_inputs): the work each runs once its stream reaches it, and its KernelCost for the cost
// model. SimKernels (sim_kernels.cpp) enqueues them. Arithmetic: core/numerics/dtype_math.h and
// Note [Reductions over ranks] (core/numerics/reduce_math.h), shared with the CUDA kernels
// (backend_cuda/cuda_kernels_dtype.cu), so the two backends agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend_sim/cost_model.h"
#include "core/numerics/determinism.h"
#include "core/runtime/dtype.h"

namespace ditto::sim::dtype_kernels {

/// y[i] = convert<to>(x[i]), n elements.
void cast(const void* x, DType from, void* y, DType to, std::int64_t n);
KernelCost cast_cost(DType from, DType to, std::int64_t n);

/// n elements of elem_size bytes, each the low bytes of `bits`.
void fill_bits(void* x, std::size_t elem_size, std::uint64_t bits, std::int64_t n);
KernelCost fill_bits_cost(std::size_t elem_size, std::int64_t n);

/// out = a + b in dtype t (dtype_math::add); out may alias a or b.
void add_any(DType t, const void* a, const void* b, void* out, std::int64_t n);
/// x = x * alpha in dtype t (dtype_math::scale).
void scale_any(DType t, void* x, double alpha, std::int64_t n);
/// Elementwise kernels of n elements of t reading `reads` and writing one array.
KernelCost elementwise_cost(DType t, std::int64_t n, int reads);

/// out = op over inputs of numel elements of t (sim::reduce_over_ranks: the collectives'
/// reduction, so reduce_add equals an all_reduce over the same inputs bit for bit). op is a
/// ReduceOp value other than premul_sum.
void reduce_inputs(DType t, const std::vector<const void*>& inputs, void* out, std::int64_t numel,
                   int op, Determinism mode);
KernelCost reduce_inputs_cost(DType t, int n_inputs, std::int64_t numel);

}  // namespace ditto::sim::dtype_kernels
