// Mixed precision: tensors stored in bf16 or f16, kernels computing in f32 (llm.c, torch.autocast).
//
// Note [Mixed precision]
// A kernel over bf16 / f16 tensors loads each input element into f32 (exact), runs the f32
// kernel's arithmetic (the same operation order as the f32 kernel, Note [GPT kernels], in both
// determinism modes) and rounds each output element once to its output dtype (round to nearest
// even, core/numerics/float_formats.h). So a bf16 kernel gives the same bits on the simulator and
// on CUDA whenever its f32 kernel does, and bitwise mode stays bitwise across device counts.
//
// Which dtype an output has (the rounding points):
//   - an op writing into a tensor the caller passes (gemm's c, add_bias_'s y, axpy_'s y,
//     scale_'s x, sum_rows(_sharded)'s out, gemm_tn_sharded's c, embedding_backward's grad_wte)
//     rounds into that tensor's dtype: an f32 c (a weight gradient in bitwise mode) is written by
//     the f32 kernel directly and is not rounded at all; a bf16 c with beta != 0 (or accumulate)
//     is c + the product in f32, rounded once;
//   - a new tensor has the storage dtype (the first bf16 / f16 among the op's tensors): matmul,
//     relu(_backward), gelu(_backward), add, dropout(_backward), embedding, layernorm's y,
//     layernorm_backward's dx and dy_xhat, attention's y, attention_backward's dqkv; dlogits of
//     cross_entropy_backward and grad_input of mse_backward in the logits' / input's dtype;
//   - stays f32: per-sample losses (cross_entropy, mse), every scalar (sum, sum_sharded,
//     sum_squares: a loss, a gradient norm's square), LayerNorm's mean and rstd, attention's
//     softmax stats (att itself is never stored: the backward recomputes it in f32 from the
//     stats, unrounded, as flash attention keeps P in registers; Note [Attention memory]);
//   - parameter gradients: nn::grad_dtype (core/nn/module.h): bitwise mode f32, so the
//     micro-shard tree, the rank tree and the accumulation tree round nowhere (Note [Reductions
//     over ranks]) and the bits do not depend on the device count; fast mode the parameter's
//     dtype (llm.c: bf16 gradients, bf16 all_reduce).
// A chain of ops therefore rounds at every op boundary (a Linear: the matmul's output, then the
// bias add's), as torch does for bf16 tensors outside autocast; a fused native kernel (cuBLASLt
// with a bias epilogue) would round once. Mixing is allowed: a bf16 weight with an f32 input
// computes in f32 and outputs bf16.
//
// The ops of core/runtime/ops.h implement this with one helper (core/runtime/ops_mixed.h,
// internal::MixedOp): inside a StorageDTypeScope of the storage dtype, each bf16 / f16 input is
// converted to an f32 scratch tensor (ops::cast inside a ConversionScope), the op's f32 path runs
// on the scratch, and each result is cast into its output (inside a ConversionScope). An
// f32-only call takes exactly the op's f32 path (no extra kernel, the same bits and virtual
// time). The scope tells the backend what it would run natively:
//   - the simulator's cost model (of a real run; a dry run prices the CUDA backend's scratch
//     instead, and charges it: Note [Predicted launches] in backend_sim/cost_model.h) prices
//     the kernels enqueued inside the scope as kernels over the storage dtype (bytes x
//     dtype_size / 4, sim::native_cost; fast-mode matrix products on the tensor cores at the
//     profile's bf16_flops / f16_flops, Note [Compute units] in backend_sim/cost_model.h), and
//     the conversions as free (no time, no trace event);
//   - the simulator does not charge the f32 scratch (every allocation made inside the scope or a
//     ConversionScope; marked at allocation, so its free is not subtracted either) to the
//     device's memory (capacity, in_use, peak, the trace's counter): a native bf16 kernel would
//     not hold it, so memory reports and OutOfMemory match a bf16 run on the real GPU. The
//     outputs are allocated under an inner StorageDTypeScope(f32) and so are charged.
// The CUDA backend really converts (its memory and time include the scratch), with the same
// Kernels::cast and f32 kernels as the simulator, hence the same bits, except where it runs the
// op natively on the storage dtype:
//   - matrix products: where a backend runs the typed GEMM natively (Kernels::has_gemm_ex; cuda,
//     not the simulator), ops::gemm, ops::matmul and ops::linear call Kernels::gemm_ex on the
//     stored operands instead (no f32 copy of a whole tensor): in bitwise mode with the same bits
//     (the operands widened as loaded, each result rounded once into c, Note [CUDA canonical
//     GEMM]); in fast mode through cuBLASLt (bf16 / f16 tensor cores with f32 accumulation;
//     ops::linear's bias fused into the epilogue, rounding once); likewise the micro-sharded
//     weight gradient: where Kernels::has_gemm_tn_sharded_ex (cuda), ops::gemm_tn_sharded calls
//     gemm_tn_sharded_ex on the stored dY and X, with the bits of the f32 path (each dW element
//     rounded once);
//   - the row ops of the GPT step: where Kernels::has_rows_ex (cuda, not the simulator),
//     ops::embedding, layernorm(_backward), gelu(_backward), cross_entropy(_backward),
//     dropout(_backward) and add on tensors of one storage dtype (LayerNorm's mean / rstd and
//     grad_loss f32) call the typed row kernels (Kernels::*_ex; add: add_any), which load the
//     storage dtype, run the f32 kernel's arithmetic and round each output once: the bits of the
//     path above in both modes (Note [CUDA fused kernels]). Mixed dtypes keep the path above;
//   - the optimizer step: where Kernels::has_multi_tensor_ex (cuda, not the simulator),
//     optim::MasterWeights' clip and AdamW read the model's gradients as stored and write its
//     bf16 / f16 weights in AdamW's launch, with the bits of the f32 masters' path (Note [Typed
//     optimizer step], core/optim/master_weights.h).
// StorageDTypeScope is for the ops' implementation: code around ops does not open one (an
// allocation inside it would go uncharged).
#pragma once

#include "core/runtime/dtype.h"

namespace ditto {

namespace detail {
/// RAII: sets a thread-local `slot` to `value` while it lives and restores its value from before
/// (so scopes nest, the innermost winning). Not copyable. The two scopes below are this.
template <typename T>
class ThreadLocalScope {
 public:
  ThreadLocalScope(T& slot, T value) noexcept : slot_(slot), previous_(slot) { slot = value; }
  ~ThreadLocalScope() { slot_ = previous_; }
  ThreadLocalScope(const ThreadLocalScope&) = delete;
  ThreadLocalScope& operator=(const ThreadLocalScope&) = delete;

 private:
  T& slot_;
  T previous_;
};
}  // namespace detail

/// RAII: while it lives, kernels this thread enqueues belong to an op over `storage` tensors
/// (f32, bf16 or f16), computed through f32 scratch (Note [Mixed precision]). Scopes nest; the
/// innermost wins. Not copyable.
class StorageDTypeScope : detail::ThreadLocalScope<DType> {
 public:
  explicit StorageDTypeScope(DType storage) noexcept;
};

/// The innermost StorageDTypeScope's dtype on this thread; DType::f32 outside any scope.
DType current_storage_dtype() noexcept;

/// Whether a thread-local conversion marker is set: the cast kernels of the f32 scratch of a
/// StorageDTypeScope op run inside a ConversionScope (the simulator prices them as free and does
/// not charge their scratch allocations).
class ConversionScope : detail::ThreadLocalScope<bool> {
 public:
  ConversionScope() noexcept;
};
bool in_conversion_scope() noexcept;

}  // namespace ditto
