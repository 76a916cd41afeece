// Mixed precision: tensors stored in bf16 or f16, kernels computing in f32 (llm.c, torch.autocast).
//
// Note [Mixed precision]  (contract; the full rounding-point list is written with the kernels)
// A kernel over bf16 / f16 tensors loads each input element into f32 (exact), runs the f32
// kernel's arithmetic (the same operation order as the f32 kernel, Note [GPT kernels], in both
// determinism modes) and rounds each output element once to the storage dtype (round to nearest
// even, core/numerics/float_formats.h). Scalars a kernel reduces to (a loss, a sum of squares,
// LayerNorm's mean and rstd) stay f32. So a bf16 kernel gives the same bits on the simulator and
// on CUDA whenever its f32 kernel does, and bitwise mode stays bitwise across device counts.
//
// The ops of core/runtime/ops.h implement this by converting through f32 scratch tensors inside a
// StorageDTypeScope. The scope tells the backend what it would run natively:
//   - the simulator's cost model prices the kernels enqueued inside the scope as kernels over the
//     storage dtype (bytes at its size, matrix products at the tensor-core peak of the profile),
//     and the conversions themselves as free;
//   - the simulator does not charge the f32 scratch to the device's memory (a native bf16 kernel
//     would not hold it), so memory reports and OutOfMemory match a bf16 run on the real GPU.
// The CUDA backend really converts (its memory and time include the scratch).
#pragma once

#include "core/runtime/dtype.h"

namespace ditto {

/// RAII: while it lives, kernels this thread enqueues belong to an op over `storage` tensors
/// (f32, bf16 or f16), computed through f32 scratch (Note [Mixed precision]). Scopes nest; the
/// innermost wins. Not copyable.
class StorageDTypeScope {
 public:
  explicit StorageDTypeScope(DType storage) noexcept;
  ~StorageDTypeScope();
  StorageDTypeScope(const StorageDTypeScope&) = delete;
  StorageDTypeScope& operator=(const StorageDTypeScope&) = delete;

 private:
  DType previous_;
};

/// The innermost StorageDTypeScope's dtype on this thread; DType::f32 outside any scope.
DType current_storage_dtype() noexcept;

/// Whether a thread-local conversion marker is set: the cast kernels of the f32 scratch of a
/// StorageDTypeScope op run inside a ConversionScope (the simulator prices them as free and does
/// not charge their scratch allocations).
class ConversionScope {
 public:
  ConversionScope() noexcept;
  ~ConversionScope();
  ConversionScope(const ConversionScope&) = delete;
  ConversionScope& operator=(const ConversionScope&) = delete;

 private:
  bool previous_;
};
bool in_conversion_scope() noexcept;

}  // namespace ditto
