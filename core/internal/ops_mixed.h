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

#include "core/runtime/error.h"
#include "core/runtime/mixed_precision.h"
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

}  // namespace ditto::ops::internal
