// Internal: the argument checks shared by the ops:: translation units (core/runtime/ops.cpp,
// ops_gpt.cpp); never installed. Each throws InvalidArgument naming the op, the argument, what
// was expected and what came (NCCL's argcheck pattern).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

namespace ditto::ops::internal {

inline Kernels& kernels_of(const Tensor& t) { return t.device().backend().kernels(); }
inline Stream& stream_of(const Tensor& t) { return current_stream(t.device()); }

/// A device tensor `t`'s memory belongs to the live instance of its backend, not to one that
/// init_backend has since replaced (Note [Tensors of a replaced backend], tensor.cpp): an op runs
/// on the live instance, unordered with the old one's pending work on `t`.
inline void check_live(const char* op, const char* arg, const Tensor& t) {
  if (t.buffer() == nullptr) return;
  const Backend& owner = t.buffer()->backend();
  if (&owner == &get_backend(t.device().type)) return;  // get_backend's per-thread cache
  throw InvalidArgument(detail::cat(
      op, ": ", arg, ": ", t.str(), " was made on an instance of backend ", t.device().type,
      " that init_backend has since re-initialised; only its copies run (to_vector, to, copy_): "
      "t.clone() copies it to the live instance"));
}

/// `t` is defined, lives on a device (not the host) of its backend's live instance and has dtype
/// `dt`.
inline void check_tensor(const char* op, const char* arg, const Tensor& t, DType dt = DType::f32) {
  DITTO_CHECK(t.defined(), op, ": ", arg, ": expected a defined tensor, got an undefined tensor");
  DITTO_CHECK(!t.device().is_cpu(), op, ": ", arg,
              ": expected a tensor on a device (sim or cuda), got ", t.str(),
              " (move it with .to(device) first)");
  check_live(op, arg, t);
  DITTO_CHECK(t.dtype() == dt, op, ": ", arg, ": expected dtype ", dtype_name(dt), ", got ",
              t.str());
}

/// `t` is on `device`, the device of the op's first tensor argument `ref`, of the live instance.
inline void check_device(const char* op, const char* arg, const Tensor& t, const Device& device,
                         const char* ref) {
  DITTO_CHECK(t.device() == device, op, ": ", arg, ": expected a tensor on ", device.str(),
              " (the device of ", ref, "), got ", t.str());
  check_live(op, arg, t);
}

inline void check_dims(const char* op, const char* arg, const Tensor& t, std::int64_t dims,
                       const char* what) {
  DITTO_CHECK(t.dim() == dims, op, ": ", arg, ": expected a ", dims, "-dim tensor ", what, ", got ",
              t.str());
}

/// True when the byte ranges of two views of one buffer overlap.
inline bool overlaps(const Tensor& x, const Tensor& y) {
  if (x.buffer() != y.buffer() || x.nbytes() == 0 || y.nbytes() == 0) return false;
  std::size_t x0 = x.offset_bytes(), x1 = x0 + x.nbytes();
  std::size_t y0 = y.offset_bytes(), y1 = y0 + y.nbytes();
  return x0 < y1 && y0 < x1;
}

inline void check_no_overlap(const char* op, const char* out_arg, const Tensor& out,
                             const char* in_arg, const Tensor& in) {
  DITTO_CHECK(!overlaps(out, in), op, ": ", out_arg, ": must not share memory with ", in_arg,
              " (got ", out.str(), " overlapping ", in.str(), ")");
}

/// `t` is an f32 tensor on the device of `ref` (argument `ref_arg`) with ref's shape.
inline void check_like(const char* op, const char* arg, const Tensor& t, const char* ref_arg,
                       const Tensor& ref) {
  check_tensor(op, arg, t);
  check_device(op, arg, t, ref.device(), ref_arg);
  DITTO_CHECK(t.shape() == ref.shape(), op, ": ", arg, ": expected ", shape_str(ref.shape()),
              " (the shape of ", ref_arg, "), got ", t.str());
}

/// `t` has ref's dtype (any dtype), device and shape.
inline void check_like_any(const char* op, const char* arg, const Tensor& t, const char* ref_arg,
                           const Tensor& ref) {
  check_tensor(op, arg, t, ref.dtype());
  check_device(op, arg, t, ref.device(), ref_arg);
  DITTO_CHECK(t.shape() == ref.shape(), op, ": ", arg, ": expected ", shape_str(ref.shape()),
              " (the shape of ", ref_arg, "), got ", t.str());
}

/// The inputs of a reduction into `out` (already checked): at least one, each like out (dtype,
/// device, shape), none sharing memory with out except inputs[0] being out itself. Returns their
/// data pointers.
inline std::vector<const void*> check_reduce_inputs(const char* op,
                                                    const std::vector<Tensor>& inputs,
                                                    const Tensor& out) {
  DITTO_CHECK(!inputs.empty(), op, ": inputs: expected at least one tensor, got none");
  std::vector<const void*> ptrs;
  ptrs.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const std::string arg = detail::cat("inputs[", i, "]");
    check_like_any(op, arg.c_str(), t, "out", out);
    // out may be inputs[0] itself; no other overlap is allowed.
    const bool same_view =
        i == 0 && t.buffer() == out.buffer() && t.offset_bytes() == out.offset_bytes();
    if (!same_view) check_no_overlap(op, "out", out, arg.c_str(), t);
    ptrs.push_back(t.data_ptr());
  }
  return ptrs;
}

}  // namespace ditto::ops::internal
