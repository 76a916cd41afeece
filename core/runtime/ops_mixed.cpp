// internal::MixedOp (core/runtime/ops_mixed.h): the f32 scratch of the ops on bf16 / f16
// tensors, Note [Mixed precision] (core/runtime/mixed_precision.h).
#include "core/runtime/ops_mixed.h"

#include "core/runtime/backend.h"
#include "core/runtime/ops_check.h"
#include "core/runtime/stream.h"

namespace ditto::ops::internal {

DType MixedOp::storage_of(const char* op, std::initializer_list<const Tensor*> ts) {
  DType storage = DType::f32;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    const DType d = t->dtype();
    DITTO_CHECK(d == DType::f32 || is_half(d), op,
                ": expected every floating tensor in f32, bf16 or f16 (Note [Mixed precision]), "
                "got ",
                t->str());
    if (storage == DType::f32 && is_half(d)) storage = d;
  }
  return storage;
}

namespace {
Device first_device(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && !t->device().is_cpu()) return t->device();
  return Device::cpu();
}
}  // namespace

MixedOp::MixedOp(const char* op, std::initializer_list<const Tensor*> ts)
    : op_(op), storage_(storage_of(op, ts)), device_(first_device(ts)), scope_(storage_) {}

MixedOp::~MixedOp() {
  if (device_.is_cpu()) return;
  // The scratch is freed in default-stream order (Buffer); on another stream wait first.
  Stream& s = current_stream(device_);
  if (&s != &device_.backend().default_stream(device_.index)) {
    try {
      s.synchronize();
    } catch (...) {  // a failed device: its error reaches the caller at the next call
    }
  }
}

Tensor MixedOp::in(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::f32) return t;
  ConversionScope conversion;
  return t.to(DType::f32);
}

Tensor MixedOp::out(const Tensor& r, DType dtype) {
  Tensor o;
  {
    StorageDTypeScope charged(DType::f32);  // a native kernel's output: charged to the device
    o = Tensor::empty(r.shape(), dtype, r.device());
  }
  write_back(r, o);
  return o;
}

void MixedOp::write_back(const Tensor& r, Tensor& dst) {
  if (r.buffer() == dst.buffer() && r.offset_bytes() == dst.offset_bytes() &&
      r.dtype() == dst.dtype())
    return;
  DITTO_CHECK(r.numel() == dst.numel() && r.dtype() == DType::f32, op_,
              ": internal: write_back of ", r.str(), " into ", dst.str());
  if (dst.numel() == 0) return;
  ConversionScope conversion;
  kernels_of(dst).cast(stream_of(dst), r.data_ptr(), DType::f32, dst.data_ptr(), dst.dtype(),
                       dst.numel());
}

std::string MixedOp::note() const {
  return detail::cat(" (", op_, " on ", dtype_name(storage_),
                     " tensors: checked on their f32 copies, Note [Mixed precision])");
}

}  // namespace ditto::ops::internal
