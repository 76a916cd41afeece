// The simulator's dtype-generic kernels (sim_kernels_dtype.h).
#include "backend_sim/sim_kernels_dtype.h"

#include <cstring>

#include "backend_sim/sim_comm_kernels.h"
#include "core/comm/communicator.h"
#include "core/numerics/dtype_math.h"
#include "core/runtime/tensor.h"

namespace ditto::sim::dtype_kernels {

void cast(const void* x, DType from, void* y, DType to, std::int64_t n) {
  if (from == to) {
    if (x != y) std::memmove(y, x, static_cast<std::size_t>(n) * dtype_size(from));
    return;
  }
  detail::cast_on_host(x, from, y, to, n);
}

KernelCost cast_cost(DType from, DType to, std::int64_t n) {
  return KernelCost{double(n), double(n) * double(dtype_size(from) + dtype_size(to))};
}

namespace {
template <typename U>
void fill_words(void* x, std::uint64_t bits, std::int64_t n) {
  const U v = static_cast<U>(bits);
  U* p = static_cast<U*>(x);
  for (std::int64_t i = 0; i < n; ++i) p[i] = v;
}
}  // namespace

void fill_bits(void* x, std::size_t elem_size, std::uint64_t bits, std::int64_t n) {
  switch (elem_size) {
    case 1: return fill_words<std::uint8_t>(x, bits, n);
    case 2: return fill_words<std::uint16_t>(x, bits, n);
    case 4: return fill_words<std::uint32_t>(x, bits, n);
    default: return fill_words<std::uint64_t>(x, bits, n);
  }
}

KernelCost fill_bits_cost(std::size_t elem_size, std::int64_t n) {
  return KernelCost{0.0, double(n) * double(elem_size)};
}

void add_any(DType t, const void* a, const void* b, void* out, std::int64_t n) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    for (std::int64_t i = 0; i < n; ++i) po[i] = dtype_math::add(pa[i], pb[i]);
  });
}

void scale_any(DType t, void* x, double alpha, std::int64_t n) {
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const rmath::Acc<T> a = rmath::scalar_as_acc<T>(alpha);
    T* p = static_cast<T*>(x);
    for (std::int64_t i = 0; i < n; ++i) p[i] = dtype_math::scale(p[i], a);
  });
}

KernelCost elementwise_cost(DType t, std::int64_t n, int reads) {
  return KernelCost{double(n), double(n) * double(dtype_size(t)) * (reads + 1)};
}

void reduce_inputs(DType t, const std::vector<const void*>& inputs, void* out, std::int64_t numel,
                   int op, Determinism mode) {
  reduce_over_ranks(inputs, out, numel, t, static_cast<ReduceOp>(op), mode);
}

KernelCost reduce_inputs_cost(DType t, int n_inputs, std::int64_t numel) {
  return KernelCost{double(n_inputs > 1 ? n_inputs - 1 : 0) * double(numel),
                    double(numel) * double(dtype_size(t)) * (n_inputs + 1)};
}

}  // namespace ditto::sim::dtype_kernels
