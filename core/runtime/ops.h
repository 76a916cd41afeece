// Tensor-level ops: validate once (device, dtype, shape), then dispatch to the backend's kernels on
// the current stream of the tensors' device. All ops are asynchronous unless they return a host
// value. Every tensor argument must be defined, on the same non-cpu device, and f32 unless said.
// Errors: InvalidArgument naming the op, the argument, what was expected and what came.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/tensor.h"

namespace ditto::ops {

/// c = alpha * op(a) @ op(b) + beta * c. a: [M,K] (or [K,M] if trans_a), b: [K,N] (or [N,K] if
/// trans_b), c: [M,N]. Mirrors cublasSgemm / torch.addmm.
void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha,
          float beta, Determinism mode);

/// New [M,N] tensor op(a) @ op(b).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Determinism mode);

/// New [rows, out] = x @ w^T + bias (torch.nn.functional.linear): x [rows, in], w [out, in],
/// bias [out] or undefined (no bias); f32, bf16 or f16 (the result in the storage dtype, Note
/// [Mixed precision]). matmul(x, w, false, true, mode) then add_bias_(y, bias), except where the
/// backend runs the typed GEMM natively (Kernels::has_gemm_ex) and bias has the result's dtype:
/// then one Kernels::gemm_ex with GemmEpilogue::bias (bitwise: the same bits as the two ops;
/// fast: cuBLASLt's CUBLASLT_EPILOGUE_BIAS, which rounds once). The simulator runs the two ops.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Determinism mode);

/// Whether linear_gelu(x, w, bias, ...) runs as one GEMM with the GELU in its epilogue: fast
/// mode, x, w and bias (or no bias: undefined) of one dtype, on one device, the backend's typed
/// GEMM (Kernels::has_gemm_ex) and its GELU epilogues (Kernels::has_gemm_gelu_epilogue) for it.
/// matmul_dgelu(gy, w, pre, mode) fuses under the same rule for gy, w and pre.
bool linear_gelu_fused(const Tensor& x, const Tensor& w, const Tensor& bias, Determinism mode);

/// New y = gelu(pre), pre = linear(x, w, bias) (set, new [rows, out]), GELU's tanh form: one
/// Kernels::gemm_ex with GemmEpilogue::gelu_aux_bias where linear_gelu_fused (cuBLASLt's
/// CUBLASLT_EPILOGUE_GELU_AUX_BIAS, llm.c's c_fc), else linear and then gelu (their bits).
Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre,
                   Determinism mode);

/// New gx = gelu_backward(pre, gy @ w): gy [rows, out], w [out, in], pre [rows, in] (the
/// forward's pre-GELU, linear_gelu's `pre`). One Kernels::gemm_ex with GemmEpilogue::dgelu where
/// linear_gelu_fused(gy, w, pre, mode) (cuBLASLt's CUBLASLT_EPILOGUE_DGELU), else matmul and
/// then gelu_backward (their bits).
Tensor matmul_dgelu(const Tensor& gy, const Tensor& w, const Tensor& pre, Determinism mode);

/// y[r, c] += bias[c]; y: [rows, cols], bias: [cols].
void add_bias_(Tensor& y, const Tensor& bias);

/// out[c] = beta * out[c] + sum_r x[r, c]; x: [rows, cols], out: [cols]. beta == 0: out is not
/// read (it may hold anything, NaN included).
void sum_rows(const Tensor& x, Tensor& out, float beta, Determinism mode);

/// ReLU (new tensor) and its gradient given the ReLU output y.
Tensor relu(const Tensor& x);
Tensor relu_backward(const Tensor& y, const Tensor& grad_y);

/// Per-sample softmax cross-entropy: logits [N, C] f32, targets [N] i64 in [0, C) (checked on
/// the host: InvalidArgument names the sample and the value). Returns losses [N].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
/// grad_logits = grad_loss * scale * (softmax(logits) - onehot(targets)); grad_loss 0-dim f32.
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                              float scale);

/// Whether cross_entropy_fused runs on these tensors (Kernels::cross_entropy_fused, fast mode):
/// logits [N, C] on a device (not the CPU), targets on that device, mode fast, and the backend
/// has_cross_entropy_fused(logits' dtype, mode) (f32, bf16 or f16 on CUDA). False
/// for anything cross_entropy_fused refuses (the simulator's real runs: false).
bool cross_entropy_fused_available(const Tensor& logits, const Tensor& targets, Determinism mode);
/// The forward and the backward in one pass (llm.c's fused_classifier): returns the per-sample
/// losses f32 [N] (as cross_entropy) and overwrites logits with their gradient grad_loss * scale
/// * (softmax(logits) - onehot(targets)) in the logits' dtype (as cross_entropy_backward, within
/// f32 rounding: the row's max and sum in another order), no [N, C] tensor allocated. logits
/// [N, C] contiguous; targets [N] i64 in [0, C), checked on the host before any write; grad_loss
/// one f32 element on the logits' device, read on the device (no sync). Only where
/// cross_entropy_fused_available(logits, targets, fast); InvalidArgument naming
/// ops::cross_entropy_fused and the argument otherwise, nothing written.
Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                           float scale);

/// Per-sample squared error summed over features: input/target [N, F] -> [N]. A 1-dim input [N]
/// is treated as [N, 1].
Tensor mse(const Tensor& input, const Tensor& target);
/// grad_input = grad_loss * scale * 2 * (input - target).
Tensor mse_backward(const Tensor& input, const Tensor& target, const Tensor& grad_loss,
                    float scale);

/// 0-dim tensor scale * sum(x).
Tensor sum(const Tensor& x, float scale, Determinism mode);

/// x = value (f32).
void fill_(Tensor& x, float value);
/// y += alpha * x (same shape).
void axpy_(float alpha, const Tensor& x, Tensor& y);
/// x *= alpha.
void scale_(Tensor& x, float alpha);

/// out = sum of inputs (all on out's device, same shape as out). bitwise: canonical tree over the
/// input index; fast: any order.
void sum_inputs(const std::vector<Tensor>& inputs, Tensor& out, Determinism mode);

/// One torch.optim.SGD update of `param` in place (Kernels::sgd_step): grad and momentum_buf have
/// param's shape and device; momentum_buf may be undefined when momentum == 0; with first_step
/// the buffer is initialised to the (weight-decayed) gradient, as PyTorch does. Options are
/// validated by optim::SGD.
void sgd_step_(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float dampening, float weight_decay, bool nesterov, bool first_step);

// ---- micro-sharded batch reductions (Note [Micro-shards], core/numerics/micro_shards.h)
// ----------------- `bounds` are S + 1 row offsets (micro_shard_bounds or local_bounds): at least 2
// entries, bounds[0] == 0, non-decreasing, last == the number of rows; InvalidArgument otherwise.
// Shards are reduced in ascending row order from 0.0f, their partials combined with the canonical
// tree over the shard index, in both determinism modes (Kernels::gemm_tn_sharded and siblings).

/// c = (accumulate ? c + T : T), T = a^T @ b reduced over micro-shards of the rows: a [rows, M],
/// b [rows, N], c [M, N], all f32 on one device; c must not overlap a or b. The weight gradient
/// dW = dY^T X of a Linear layer in bitwise mode (torch: torch.addmm(c, a.t(), b)).
void gemm_tn_sharded(const Tensor& a, const Tensor& b, Tensor& c,
                     const std::vector<std::int64_t>& bounds, bool accumulate);

/// out = (accumulate ? out + T : T), T[c] = sum over rows of x[r, c] reduced over micro-shards;
/// x [rows, cols], out [cols] (the bias gradient; torch: x.sum(0)). out must not overlap x.
void sum_rows_sharded(const Tensor& x, Tensor& out, const std::vector<std::int64_t>& bounds,
                      bool accumulate);

/// New 0-dim tensor scale * sum(x) reduced over micro-shards; x is 1-dim [n] (a mean loss with
/// scale = 1 / batch size).
Tensor sum_sharded(const Tensor& x, const std::vector<std::int64_t>& bounds, float scale);

// ---- Adam ---------------------------------------------------------------------------------------

/// One torch.optim.Adam update of `param` in place (Kernels::adam_step, Note [Adam step] in
/// core/numerics/canonical_math.h): grad, exp_avg, exp_avg_sq (and max_exp_avg_sq when amsgrad; it
/// may be undefined otherwise) have param's shape and device, f32. bias_correction1/2 = 1 -
/// beta^step in double. Options are validated by optim::Adam; tensors here (InvalidArgument).
void adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, double bias_correction1, double bias_correction2,
                bool amsgrad);

// ---- transformer ops (core/nn/gpt.h; Kernels::embedding_forward and siblings) -------------------
// Shapes: a batch of B sequences of T tokens, width C, vocabulary V, nh heads. Leading dims of
// activations may be [B, T] or flattened [B * T]; `bounds` are micro-shard bounds over those
// N = B * T token rows (a layer scales its sample bounds by T). InvalidArgument names the op, the
// argument, what was expected and what came.

/// New [B, T, C] = wte[idx] + wpe[0..T) (torch: wte(idx) + wpe(arange(T))); idx [B, T] i64 with
/// every id in [0, V) (checked on the host: the first bad one is named), wte [V, C], wpe [P, C]
/// with P >= T, or undefined (no position term).
Tensor embedding(const Tensor& idx, const Tensor& wte, const Tensor& wpe);
/// grad_wte (+)= the scatter-add of dy [B, T, C] (or [N, C]) rows by idx, reduced over `bounds`
/// (Kernels::embedding_backward). grad_wte [V, C] on dy's device; accumulate: add to it.
void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& grad_wte,
                        const std::vector<std::int64_t>& bounds, bool accumulate);

/// LayerNorm over the last dim (torch.nn.functional.layer_norm(x, [C], w, b, eps)): x [..., C],
/// w [C], b [C] or undefined. Returns y (x's shape); mean and rstd ([rows]) are set for backward.
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& mean,
                 Tensor& rstd);
/// The residual add and the LayerNorm after it (the GPT forward: ln_2(x + attn(..)), the next
/// block's ln_1 or ln_f of x + mlp(..); llm.c's fused_residual_forward): sets residual =
/// add(x, branch) and returns layernorm(residual, w, b, eps, mean, rstd), with those two ops'
/// bits. One kernel (Kernels::layernorm_forward_add) where layernorm_add_fused says so; else
/// those two ops (the caller's branch stays alive through the LayerNorm: nn::LayerNorm::
/// forward_add runs them itself to free it first). branch: x's dtype, device and shape; w, b
/// [C]; eps finite >= 0 (InvalidArgument naming ops::layernorm_add and the argument otherwise).
Tensor layernorm_add(const Tensor& x, const Tensor& branch, const Tensor& w, const Tensor& b,
                     float eps, Tensor& residual, Tensor& mean, Tensor& rstd);
/// Whether layernorm_add on these tensors is one kernel: x, branch, w (and b, if defined) of one
/// dtype (f32, or a storage dtype the backend has_rows_ex for) on one device, branch of x's
/// shape, and the backend has_layernorm_forward_add for it. False for arguments layernorm_add
/// refuses.
bool layernorm_add_fused(const Tensor& x, const Tensor& branch, const Tensor& w, const Tensor& b);
/// Returns dx (x's shape) and sets dy_xhat (x's shape; its row sum is grad_w).
Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd, Tensor& dy_xhat);
/// layernorm_backward with a residual gradient added (nn::Block: the gradient reaching x = x +
/// f(ln(x)) is residual + dx): returns residual + dx with the bits of add(residual,
/// layernorm_backward(...)) and sets dy_xhat. One kernel (Kernels::layernorm_backward_add) where
/// layernorm_backward_add_fused says so; else those two ops. residual: dy's dtype, device and
/// shape (InvalidArgument naming ops::layernorm_backward_add and the argument otherwise).
Tensor layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                              Tensor& dy_xhat);
/// Whether layernorm_backward_add on these tensors is one kernel: dy, x, w and residual of one
/// dtype (f32, or a storage dtype the backend has_rows_ex for), mean and rstd f32, and the
/// backend has_layernorm_backward_add for it. False for arguments layernorm_backward_add refuses.
bool layernorm_backward_add_fused(const Tensor& dy, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& residual);

/// Whether layernorm_backward_params on these tensors is one kernel
/// (Kernels::layernorm_backward_params, fast mode): dy, x, w (and residual, where defined) of one
/// dtype and shape (f32, or a storage dtype the backend has_rows_ex for) on one device, mean and
/// rstd f32, grad_type f32 or dy's dtype, and the backend has_layernorm_backward_params(dtype,
/// fast). False for arguments layernorm_backward_params refuses.
bool layernorm_backward_params_fused(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                                     DType grad_type);
/// The LayerNorm backward with its parameter gradients, fast mode (torch's
/// native_layer_norm_backward with output_mask all true; llm.c's layernorm_backward): returns dx
/// (x's shape; residual + dx where residual is defined), and grad_w (+)= the column sums of
/// dy * xhat, grad_b (+)= those of dy (grad_b undefined: no bias); accumulate_*: add to the
/// gradient's value, else overwrite it (not read). One kernel where
/// layernorm_backward_params_fused(..., grad_w.dtype()) says so (dy * xhat is never stored); else
/// layernorm_backward (or layernorm_backward_add) and two ops::sum_rows in fast mode, the add
/// last. grad_w, grad_b: contiguous [C], f32 or dy's dtype (both the same), on dy's device, no
/// memory shared with dy, x, the residual or each other; residual: dy's dtype, device and shape.
/// InvalidArgument naming ops::layernorm_backward_params and the argument otherwise.
Tensor layernorm_backward_params(const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                                 Tensor& grad_w, bool accumulate_w, Tensor& grad_b,
                                 bool accumulate_b);

namespace internal {
/// nn::LayerNorm's backward without the fused parameter kernel: dx = layernorm_backward(dy, ...)
/// (residual defined: residual + dx as layernorm_backward_add computes it), and
/// row_sums(dy_xhat) for the caller's parameter gradients while dy_xhat exists. The fused add's
/// decision (layernorm_backward_add_fused) is taken once: one kernel before row_sums, or the
/// add after row_sums with dy_xhat freed first (the simulator's launches and peak memory as
/// nn::Block ran them). Errors name `op_name`, by default ops::layernorm_backward (no residual)
/// or ops::layernorm_backward_add.
Tensor layernorm_backward_with(const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                               const std::function<void(const Tensor& dy_xhat)>& row_sums,
                               const char* op_name = nullptr);
}  // namespace internal

/// GELU, tanh form (torch.nn.functional.gelu(x, approximate='tanh')), new tensor; and its
/// gradient given the forward's input x.
Tensor gelu(const Tensor& x);
Tensor gelu_backward(const Tensor& x, const Tensor& grad_y);

/// Causal self-attention (Kernels::attention_forward; torch's
/// scaled_dot_product_attention(q, k, v, is_causal=True) per head): qkv [B, T, 3C] -> y [B, T, C];
/// stats [B, nh, T, 2] f32 (each query's softmax max and normaliser; att [B, nh, T, T] is never
/// stored, the backward recomputes it: Note [Attention memory] in core/numerics/gpt_math.h) is set
/// for backward. C % nh == 0. With p > 0 the weights are dropped before att @ v (nanoGPT's
/// attn_dropout) with the mask of (seed, stream, index_base + flat index into att) (Note
/// [Dropout masks]: index_base = first_row * nh*T*T); p in [0, 1), else InvalidArgument. y has
/// qkv's dtype (f32, bf16 or f16); stats are f32 always. `mode`: Kernels::attention_forward's
/// (bitwise: the canonical order; fast: the backend's fastest, e.g. CUDA's flash attention).
Tensor attention(const Tensor& qkv, std::int64_t n_head, Tensor& stats, float p = 0.0f,
                 std::uint64_t seed = 0, std::uint64_t stream = 0, std::uint64_t index_base = 0,
                 Determinism mode = Determinism::bitwise);
/// dqkv [B, T, 3C] from dy [B, T, C], the forward's qkv and stats (f32 [B, nh, T, 2], else
/// InvalidArgument), its dropout key and `mode` (as attention's). y: the forward's output
/// (optional; [B, T, C] in qkv's dtype, else InvalidArgument), as torch's flash-attention
/// backward takes `out`: a fast typed backward reads each query's D = rowsum(dy * y) from it
/// instead of recomputing the products (Kernels::attention_backward_ex); dqkv is the same
/// within fast mode's rounding, and bitwise mode's bits do not depend on it.
Tensor attention_backward(const Tensor& dy, const Tensor& qkv, const Tensor& stats,
                          std::int64_t n_head, float p = 0.0f, std::uint64_t seed = 0,
                          std::uint64_t stream = 0, std::uint64_t index_base = 0,
                          Determinism mode = Determinism::bitwise, const Tensor& y = Tensor());

/// Inverted dropout with the mask of (seed, stream, index_base + i) (Kernels::dropout_forward);
/// p in [0, 1). New tensor; p == 0 returns x itself.
Tensor dropout(const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream,
               std::uint64_t index_base);
Tensor dropout_backward(const Tensor& grad_y, float p, std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t index_base);

/// New tensor a + b (same shape, f32; residual connections).
Tensor add(const Tensor& a, const Tensor& b);

/// New 0-dim tensor: sum of x's squared elements (Kernels::sum_squares).
Tensor sum_squares(const Tensor& x, Determinism mode);
/// New 1-dim f32 tensor [squares_blocks(n)] (n = x.numel(), gpt_math.h): element j is the
/// bitwise chain of x's block j of kSquaresBlock elements, the leaves of sum_squares' bitwise
/// tree (Kernels::sum_squares_blocks). x: f32 on a device (InvalidArgument otherwise).
Tensor sum_squares_blocks(const Tensor& x);

// ---- any dtype (ops_dtype.cpp; Kernels::cast, fill_bits, add_any, scale_any, reduce_inputs) ----
// These take tensors of any DType (all of one dtype where several are given, unless said);
// arithmetic per Note [Reductions over ranks] (core/numerics/reduce_math.h): floats compute in
// Acc (f32 for f16/bf16/fp8, f64 for f64) and round once, integers wrap.

/// x = value converted once on the host with convert<T> (torch's Tensor.fill_); any dtype. For
/// f32 this is fill_(x, float(value)).
void fill_(Tensor& x, double value);
/// New tensor: x converted elementwise to `dtype` (torch's x.to(dtype); Note [Small float
/// conversions]); x itself when the dtype is already `dtype`.
Tensor cast(const Tensor& x, DType dtype);
/// New tensor a + b (same shape, dtype and device, any dtype; torch.add). For f32 the bits of
/// add(a, b) above.
Tensor add_any(const Tensor& a, const Tensor& b);
/// x *= alpha in x's dtype (torch's Tensor.mul_(alpha)). Integer dtypes: alpha must be an
/// integer value (InvalidArgument otherwise), applied as a wrapping multiply in the dtype.
void scale_any_(Tensor& x, double alpha);
/// out = op over inputs elementwise (torch.cuda.comm.reduce_add for sum; Kernels::reduce_inputs):
/// inputs all on out's device with out's shape and dtype; out may be inputs[0] itself, no other
/// overlap. `op` is a ReduceOp value other than premul_sum (as int: 0 sum, 1 prod, 2 min, 3 max,
/// 4 avg); avg divides by inputs.size(). bitwise: the canonical tree over the input index.
void reduce_inputs(const std::vector<Tensor>& inputs, Tensor& out, int op, Determinism mode);

// ---- multi-tensor (foreach) ops (ops_multi.cpp; Kernels::adam_step_multi and siblings) -------
// A list of f32 tensors on one device, each op equal bit for bit to its per-tensor op applied to
// the tensors in list order. Backends without multi-tensor kernels run exactly that loop;
// has_multi_tensor_kernels says whether the device saves launches with them (core/optim uses
// them only then).

/// Whether `device`'s backend runs the multi-tensor kernels in fewer launches than the
/// per-tensor loop (Kernels::has_multi_tensor_kernels: cuda, and the sim in a dry run, which
/// prices cuda's launches); false for the host and a real sim run.
bool has_multi_tensor_kernels(const Device& device);
/// Whether `device`'s backend runs the typed multi-tensor kernels on tensors of dtype t
/// (Kernels::has_multi_tensor_ex: cuda for f32, bf16, f16; the sim only in a dry run; false for
/// the host): adam_step_multi_ and sum_squares_multi then take such gradients as stored, and
/// adam_step_multi_ writes model weights of dtype t (Note [Typed optimizer step],
/// core/optim/master_weights.h).
bool has_multi_tensor_ex(const Device& device, DType t);

/// One parameter of adam_step_multi_: the tensors of adam_step_ (max_exp_avg_sq may be null
/// unless amsgrad), its bias corrections, and AdamW's decoupled decay factor, applied first as
/// scale_(param, *decay_scale) when set. Typed (Note [Typed optimizer step]): grad may be bf16 /
/// f16, and `model` (null: none) a bf16 / f16 tensor of param's shape that receives the updated
/// param rounded once (cast_ into it).
struct AdamStepTensors {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  Tensor* max_exp_avg_sq = nullptr;
  double bias_correction1 = 1.0, bias_correction2 = 1.0;
  std::optional<float> decay_scale;
  Tensor* model = nullptr;
};

/// For each entry in order: the decay, then adam_step_ (torch.optim.AdamW(foreach=True)). Every
/// tensor f32 on the first param's device, each entry's tensors of its param's shape
/// (InvalidArgument naming the entry and argument otherwise). Typed, one
/// Kernels::adam_step_multi_ex launch where the device has_multi_tensor_ex for every dtype
/// involved (InvalidArgument otherwise): a grad of bf16 / f16 is read as stored, as if cast to
/// f32 first; with grad_scale every grad is first multiplied by it (scale_multi_ of those f32
/// copies: the clip's coefficient); each entry's model receives its param rounded once. Bits:
/// those of that cast, scale_multi_, adam_step_multi_ and cast.
void adam_step_multi_(const std::vector<AdamStepTensors>& tensors, double lr, double beta1,
                      double beta2, double eps, double weight_decay, bool amsgrad,
                      std::optional<float> grad_scale = std::nullopt);

/// New 1-dim f32 tensor [xs.size()] on the tensors' device: element i is sum_squares(*xs[i],
/// mode) (torch._foreach_norm's squares). xs nonempty, one device; f32, or bf16 / f16 where the
/// device has_multi_tensor_ex for them (Kernels::sum_squares_multi_ex, reading them as stored:
/// the bits of their f32 casts); InvalidArgument otherwise.
Tensor sum_squares_multi(const std::vector<const Tensor*>& xs, Determinism mode);

/// scale_(*xs[i], alpha) for each i (torch._foreach_mul_). f32, one device; empty: nothing.
void scale_multi_(const std::vector<Tensor*>& xs, float alpha);

/// fill_(*xs[i], value) for each i (torch._foreach_zero_ with value 0). f32, one device; empty:
/// nothing.
void fill_multi_(const std::vector<Tensor*>& xs, float value);

/// dsts[i].copy_(srcs[i]) for each i, converting as torch's copy_ does (torch._foreach_copy_):
/// every src of one dtype, every dst of one dtype (the same: an exact copy of the elements, any
/// dtype; f32 -> bf16 / f16: ops::cast's rounding to nearest even; bf16 / f16 -> f32: exact),
/// all contiguous on one device, dsts[i].numel() == srcs[i].numel(), no dst overlapping another
/// dst or any src. One Kernels::copy_multi call (one launch per table on cuda; the per-piece
/// casts elsewhere). Throws InvalidArgument naming the argument and entry (sizes of the lists,
/// dtype, device, contiguity, numel, overlap). Empty lists: nothing.
void copy_multi_(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs);

}  // namespace ditto::ops
