// Internal: the one helper by which every op of core/runtime/ops.h runs on bf16 / f16 tensors
// (Note [Mixed precision], core/runtime/mixed_precision.h): convert the inputs to f32 scratch,
// run the op's f32 path, round the results once into the output dtype. Never installed.
//
// Use, in an op whose tensors may be bf16 / f16 (f32-only calls never get here: they take the
// op's f32 path unchanged, no extra kernel):
//   if (internal::any_half({&x, &y})) {
//     internal::MixedOp m("ops::axpy_", {&x, &y});
//     Tensor yf = m.in(y);                  // y itself when y is f32
//     m.run([&] { axpy_(alpha, m.in(x), yf); });
//     m.write_back(yf, y);                  // nothing when yf is y
//     return;
//   }
// New results of the f32 path go through m.out(result, dtype): a new tensor of `dtype` (the
// storage dtype, or f32 for the results that stay f32) charged to the device as the native kernel
// would allocate it, holding the result rounded once.
#pragma once

#include <initializer_list>
#include <string>

#include "core/base/error.h"
#include "core/runtime/mixed_precision.h"
#include "core/runtime/ops_check.h"
#include "core/runtime/tensor.h"

namespace ditto::ops::internal {

/// bf16 or f16: the storage dtypes an op computes through f32 scratch.
inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }
inline bool is_half(const Tensor& t) { return t.defined() && is_half(t.dtype()); }
/// Whether any defined tensor among `ts` is bf16 or f16.
inline bool any_half(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (is_half(*t)) return true;
  return false;
}

/// The storage dtype in which an op over `ts` runs the typed row kernels (Kernels::*_ex, e.g.
/// layernorm_forward_ex): every defined tensor of `ts` has one dtype, bf16 or f16, all are on
/// one device (not the host), and its backend has_rows_ex(that dtype, mode). Otherwise f32: the
/// op takes MixedOp's f32 scratch (some tensor half) or its f32 path. Ops without a mode pass
/// the default (those kernels have one order in both modes).
inline DType native_rows(std::initializer_list<const Tensor*> ts,
                         Determinism mode = Determinism::bitwise) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    if (!is_half(t->dtype()) || t->device().is_cpu()) return DType::f32;
    if (first == nullptr) {
      first = t;
    } else if (t->dtype() != first->dtype() || t->device() != first->device()) {
      return DType::f32;
    }
  }
  if (first == nullptr) return DType::f32;
  return kernels_of(*first).has_rows_ex(first->dtype(), mode) ? first->dtype() : DType::f32;
}

/// One op over bf16 / f16 tensors (Note [Mixed precision]). Construction checks that every
/// defined tensor of `ts` is f32, bf16 or f16 (InvalidArgument naming the op and the tensor
/// otherwise) and opens a StorageDTypeScope of the storage dtype (the first bf16 / f16 among
/// `ts`): the simulator prices the kernels enqueued while it lives as native kernels over that
/// dtype and charges no allocation made inside it to the device (the f32 scratch). The
/// destructor frees the scratch; when the current stream is not the device's default stream it
/// first waits for the stream (Buffer frees in default-stream order).
class MixedOp {
 public:
  MixedOp(const char* op, std::initializer_list<const Tensor*> ts);
  ~MixedOp();
  MixedOp(const MixedOp&) = delete;
  MixedOp& operator=(const MixedOp&) = delete;

  /// The storage dtype (bf16 or f16).
  DType storage() const { return storage_; }
  /// t converted to f32 (exact) in new scratch, inside a ConversionScope; t itself when it is
  /// f32 or undefined.
  Tensor in(const Tensor& t);
  /// A new tensor of `dtype` holding the f32 result r rounded once (round to nearest even),
  /// allocated as a native kernel's output (charged), converted inside a ConversionScope.
  Tensor out(const Tensor& r, DType dtype);
  /// r in the storage dtype: out(r, storage()).
  Tensor out(const Tensor& r) { return out(r, storage_); }
  /// dst = r rounded once to dst's dtype, in place (for ops that write into a caller's tensor);
  /// nothing when r is dst itself (an f32 dst the f32 path wrote directly).
  void write_back(const Tensor& r, Tensor& dst);
  /// Runs f (the op's f32 path on the scratch); an InvalidArgument it throws gets a note that
  /// its checks ran on the f32 copies of the op's bf16 / f16 tensors.
  template <typename F>
  decltype(auto) run(F&& f) {
    try {
      return f();
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(e.what()) + note());
    }
  }

 private:
  std::string note() const;

  /// Checks `ts` (see the constructor) and returns the storage dtype.
  static DType storage_of(const char* op, std::initializer_list<const Tensor*> ts);

  const char* op_;
  DType storage_;
  Device device_;  // of the first defined device tensor of `ts` (cpu: none)
  StorageDTypeScope scope_;
};

/// An elementwise op y = f(x) (ops::relu, ops::gelu): bf16 / f16 through MixedOp, running `self`
/// (the op itself) on the f32 copy; f32: x checked, then one launch of the Kernels member `kernel`
/// (none for 0 elements).
inline Tensor unary_op(const char* op, const Tensor& x, Tensor (*self)(const Tensor&),
                       void (Kernels::*kernel)(Stream&, const float*, float*, std::int64_t)) {
  if (any_half({&x})) {
    MixedOp m(op, {&x});
    return m.out(m.run([&] { return self(m.in(x)); }));
  }
  check_tensor(op, "x", x);
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  if (x.numel() > 0)
    (kernels_of(x).*kernel)(stream_of(x), x.data<float>(), y.data<float>(), x.numel());
  return y;
}

/// Its backward, grad_x = f'(a) * grad_y elementwise, `a` the forward's input or output (named
/// `a_name` in messages): as unary_op, grad_y checked like a.
inline Tensor unary_backward_op(const char* op, const char* a_name, const Tensor& a,
                                const Tensor& grad_y, Tensor (*self)(const Tensor&, const Tensor&),
                                void (Kernels::*kernel)(Stream&, const float*, const float*, float*,
                                                        std::int64_t)) {
  if (any_half({&a, &grad_y})) {
    MixedOp m(op, {&a, &grad_y});
    return m.out(m.run([&] { return self(m.in(a), m.in(grad_y)); }));
  }
  check_tensor(op, a_name, a);
  check_like(op, "grad_y", grad_y, a_name, a);
  Tensor gx = Tensor::empty(a.shape(), DType::f32, a.device());
  if (a.numel() > 0)
    (kernels_of(a).*kernel)(stream_of(a), a.data<float>(), grad_y.data<float>(), gx.data<float>(),
                            a.numel());
  return gx;
}

}  // namespace ditto::ops::internal
