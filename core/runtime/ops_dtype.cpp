// Tensor-level ops on any dtype (ops.h, "any dtype"): the argument checks, then one call into the
// backend's dtype-generic kernels (Kernels::cast, fill_bits, add_any, scale_any, reduce_inputs)
// on the current stream of the tensors' device.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/ops_check.h"

namespace ditto::ops {

using namespace internal;  // the argument checks (ops_check.h)

void fill_(Tensor& x, double value) {
  constexpr const char* op = "ops::fill_";
  DITTO_CHECK(x.defined(), op, ": x: expected a defined tensor, got an undefined tensor");
  if (x.dtype() == DType::f32) return fill_(x, static_cast<float>(value));
  check_tensor(op, "x", x, x.dtype());
  if (x.numel() == 0) return;
  kernels_of(x).fill_bits(stream_of(x), x.data_ptr(), dtype_size(x.dtype()),
                          detail::element_bits(value, x.dtype()), x.numel());
}

Tensor cast(const Tensor& x, DType dtype) {
  constexpr const char* op = "ops::cast";
  DITTO_CHECK(x.defined(), op, ": x: expected a defined tensor, got an undefined tensor");
  check_tensor(op, "x", x, x.dtype());
  DITTO_CHECK(is_valid_dtype(dtype), op,
              ": dtype: expected one of f32, i64, f64, f16, bf16, i8, "
              "u8, i32, u32, u64, f8_e4m3, f8_e5m2, got DType value ",
              static_cast<int>(dtype));
  return x.to(dtype);
}

Tensor add_any(const Tensor& a, const Tensor& b) {
  constexpr const char* op = "ops::add_any";
  DITTO_CHECK(a.defined(), op, ": a: expected a defined tensor, got an undefined tensor");
  check_tensor(op, "a", a, a.dtype());
  check_like_any(op, "b", b, "a", a);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  if (out.numel() > 0)
    kernels_of(a).add_any(stream_of(a), a.dtype(), a.data_ptr(), b.data_ptr(), out.data_ptr(),
                          out.numel());
  return out;
}

void scale_any_(Tensor& x, double alpha) {
  constexpr const char* op = "ops::scale_any_";
  DITTO_CHECK(x.defined(), op, ": x: expected a defined tensor, got an undefined tensor");
  check_tensor(op, "x", x, x.dtype());
  if (is_integral(x.dtype())) {
    // The dtype's range, as doubles (max() + 1 is a power of two, exact).
    const auto [lo, hi_excl] = visit_dtype(x.dtype(), [](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>)
        return std::pair<double, double>(double(std::numeric_limits<T>::min()),
                                         double(std::numeric_limits<T>::max() / 2 + 1) * 2.0);
      else
        return std::pair<double, double>(0.0, 0.0);
    });
    DITTO_CHECK(
        std::isfinite(alpha) && alpha == std::trunc(alpha) && alpha >= lo && alpha < hi_excl, op,
        ": alpha: expected an integer value representable in ", dtype_name(x.dtype()), " (x is ",
        x.str(), "), got ", alpha);
  }
  if (x.numel() > 0)
    kernels_of(x).scale_any(stream_of(x), x.dtype(), x.data_ptr(), alpha, x.numel());
}

void reduce_inputs(const std::vector<Tensor>& inputs, Tensor& out, int red_op, Determinism mode) {
  constexpr const char* op = "ops::reduce_inputs";
  DITTO_CHECK(out.defined(), op, ": out: expected a defined tensor, got an undefined tensor");
  check_tensor(op, "out", out, out.dtype());
  DITTO_CHECK(red_op >= 0 && red_op <= 4, op,
              ": op: expected sum, prod, min, max or avg (0..4), got ", red_op);
  DITTO_CHECK(inputs.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()), op,
              ": inputs: expected at most 2^31 - 1 tensors, got ", inputs.size());
  const std::vector<const void*> ptrs = check_reduce_inputs(op, inputs, out);
  if (out.numel() == 0) return;
  kernels_of(out).reduce_inputs(stream_of(out), out.dtype(), ptrs.data(),
                                static_cast<int>(ptrs.size()), out.data_ptr(), out.numel(), red_op,
                                mode);
}

}  // namespace ditto::ops
