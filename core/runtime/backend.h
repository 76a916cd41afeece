// Backend: owns a set of devices of one kind, their memory, streams, kernels and communicators.
// Backends are chosen by name at run time through a small registry ("cpu", "sim", "cuda", and
// "auto" = cuda where a GPU is present, else sim), so no caller needs #ifdef CUDA.
//
// Object model (after ggml-backend): registry -> backend -> device -> stream / buffer.
// Core validates every argument before it reaches a backend: backends trust their inputs. All
// pointers handed to kernels are device pointers of `stream.device()` unless a comment says
// otherwise; all kernels are asynchronous with respect to the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/non_copyable.h"
#include "core/numerics/determinism.h"
#include "core/runtime/device.h"
#include "core/runtime/dtype.h"
#include "core/runtime/stream.h"

namespace ditto {

class CommunicatorImpl;
struct CommOptions;

struct DeviceProperties {
  std::string name;              ///< e.g. "simulated GPU", "NVIDIA H200"
  std::size_t total_memory = 0;  ///< bytes
};

struct MemoryStats {
  std::size_t in_use = 0;    ///< bytes currently allocated
  std::size_t peak = 0;      ///< high-water mark of in_use since start or reset_peak
  std::size_t capacity = 0;  ///< bytes the device may hold
};

/// Options for creating a backend instance. Fields a backend does not use are ignored.
struct BackendOptions {
  /// Number of devices. Unset: the backend's default (sim: 8 virtual devices; cuda: one per
  /// visible GPU). cuda: more than the physical GPUs oversubscribes them (logical device i runs
  /// on GPU i % physical).
  std::optional<int> device_count;
  std::size_t memory_capacity = std::size_t(80) << 30;  ///< sim: bytes per device (80 GiB)
  /// sim: a dry run (Note [Dry run], backend_sim/sim_backend.h): allocations are counted against
  /// the capacity but hold no host memory, kernels, copies and collectives are priced by the cost
  /// model but not run, device -> host copies give zeros. Other backends refuse it
  /// (InvalidArgument from init_backend).
  bool dry_run = false;
  /// Fast-mode f32 matrix products may run on TF32 tensor cores (10-bit mantissa inputs, f32
  /// accumulation), as torch.backends.cuda.matmul.allow_tf32 = True. Off by default (PyTorch's
  /// default since 1.12): f32 stays strict f32. Ignored in bitwise mode (bits never depend on it).
  /// cuda: cuBLASLt's CUBLAS_COMPUTE_32F_FAST_TF32; sim: the cost model prices such products at
  /// the profile's TF32 tensor-core rate (the simulator's arithmetic stays f32).
  bool allow_tf32 = false;
  /// This process is one rank of a job of processes (mpirun) and uses one device. With
  /// device_count unset, a backend of virtual devices then makes only that one (sim: 1, not 8);
  /// one of physical devices still sees every device of its node (cuda: every GPU), of which the
  /// rank takes its local rank's (Trainer::fit).
  bool one_rank_per_process = false;
};

/// What a typed GEMM does after the product (cuBLASLt's cublasLtEpilogue_t).
enum class GemmEpilogue : std::uint8_t {
  none,  ///< C = alpha * op(A) @ op(B) + beta * C (CUBLASLT_EPILOGUE_DEFAULT)
  bias,  ///< then C[m, n] += bias[n], bias of N elements (CUBLASLT_EPILOGUE_BIAS; nn.Linear)
  /// aux[m, n] = alpha * op(A) @ op(B) + bias[n] (the pre-GELU value; no bias where bias is
  /// null), then C[m, n] = gelu(aux[m, n]), GELU's tanh form (CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
  /// or CUBLASLT_EPILOGUE_GELU_AUX without a bias; llm.c's c_fc forward).
  gelu_aux_bias,
  /// C[m, n] = gelu'(aux[m, n]) * (alpha * op(A) @ op(B)), aux the pre-GELU value of the forward
  /// (CUBLASLT_EPILOGUE_DGELU; llm.c's c_proj input gradient).
  dgelu,
};

/// Arguments of Kernels::gemm_ex, the typed GEMM (cublasLtMatmul): row-major C[M,N] = alpha *
/// op(A) @ op(B) + beta * C (+ bias[n]); op(A) is [M,K] (A stored [K,M] when trans_a), op(B) is
/// [K,N] (B stored [N,K] when trans_b). lda/ldb/ldc are the row strides, in elements, of A, B, C
/// as stored (lda >= max(1, cols of A as stored), likewise ldb, ldc >= max(1, N)). Each of A, B,
/// C (and bias) has its own storage dtype, f32, bf16 or f16; arithmetic is f32. beta == 0 ignores
/// C's contents. C does not overlap A, B or bias. M, N > 0; K >= 0 (K == 0: the product is 0).
struct GemmExArgs {
  bool trans_a = false, trans_b = false;
  std::int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;
  DType a_type = DType::f32;
  std::int64_t lda = 1;
  const void* B = nullptr;
  DType b_type = DType::f32;
  std::int64_t ldb = 1;
  float beta = 0.0f;
  void* C = nullptr;
  DType c_type = DType::f32;
  std::int64_t ldc = 1;
  GemmEpilogue epilogue = GemmEpilogue::none;
  /// N elements of c_type with GemmEpilogue::bias; with gelu_aux_bias, those or null (none)
  const void* bias = nullptr;
  /// gelu_aux_bias (written) and dgelu (read): the [M, N] pre-GELU matrix, c_type, row stride
  /// ld_aux >= N; shares no memory with A, B, C or bias. Else unused.
  void* aux = nullptr;
  std::int64_t ld_aux = 1;
  Determinism mode = Determinism::fast;
};

/// Pointwise/loss/optimizer kernels. Shapes are row-major; sizes are element counts.
class Kernels {
 public:
  virtual ~Kernels() = default;

  /// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major; op(A) is [M,K], op(B) is [K,N].
  /// lda/ldb/ldc are row strides in elements of A, B, C as stored. beta == 0 ignores C's contents.
  /// In bitwise mode each element is one fma chain over k = 0..K-1 in ascending order from zero,
  /// then alpha and beta are applied (Note [Canonical GEMM] in the backend).
  virtual void gemm(Stream& s, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N,
                    std::int64_t K, float alpha, const float* A, std::int64_t lda, const float* B,
                    std::int64_t ldb, float beta, float* C, std::int64_t ldc, Determinism mode) = 0;

  /// Whether gemm_ex runs natively here for these storage dtypes in `mode` (no f32 copy of a
  /// whole operand). Default: false, and the ops of core/runtime/ops.h run a bf16 / f16 product
  /// through f32 scratch and Kernels::gemm instead (Note [Mixed precision]); the simulator keeps
  /// that path (its bits, virtual time and memory accounting). cuda: true for a_type == b_type
  /// in {f32, bf16, f16} and c_type in {a_type, f32}, in both modes.
  virtual bool has_gemm_ex(DType a_type, DType b_type, DType c_type, Determinism mode) const;

  /// The typed GEMM (cublasLtMatmul; torch.addmm on bf16 / f16 tensors): C[M,N] = alpha *
  /// op(A) @ op(B) + beta * C, then + bias[n] with GemmEpilogue::bias, row-major as gemm, with
  /// each operand in its storage dtype (GemmExArgs) and f32 accumulation. Elements are loaded
  /// into f32 (exact) and each output rounded into c_type (round to nearest even). Only called
  /// where has_gemm_ex(a_type, b_type, c_type, mode) is true (core checked the arguments; the
  /// default throws InvalidArgument "this backend has no kernel gemm_ex").
  /// bitwise: the bits of the simulator's path (Note [Mixed precision]): each element is
  /// round_c(gemm_epilogue(chain, alpha, beta, float(C))), the chain of gemm over the widened
  /// operands; with the bias epilogue that result is then rounded again after + float(bias[n])
  /// (cm::add), the bits of gemm followed by add_bias. fast: any order, one rounding where the
  /// library fuses (cuda: cuBLASLt with CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 for
  /// f32 operands under BackendOptions::allow_tf32; CUBLASLT_EPILOGUE_BIAS).
  /// GemmEpilogue::gelu_aux_bias and dgelu: only where has_gemm_gelu_epilogue(c_type, mode).
  virtual void gemm_ex(Stream& s, const GemmExArgs& g);

  /// Whether gemm_ex takes GemmEpilogue::gelu_aux_bias and dgelu here for A, B, C, bias and aux
  /// all of `dtype` in `mode` (has_gemm_ex(dtype, dtype, dtype, mode) holds too): the GELU of
  /// nn::GPTMLP in its c_fc GEMM's epilogue and its gradient in c_proj's input-gradient GEMM
  /// (ops::linear_gelu, ops::matmul_dgelu; llm.c's fusion). With those epilogues gemm_ex takes
  /// beta == 0 only. Default: false, and the ops run the GEMM and ditto's GELU kernels apart
  /// (the simulator keeps that path, its bits and launches). cuda: fast mode only (bitwise keeps
  /// its separate kernels and bits), f32, bf16, f16, once a probe of cuBLASLt's GELU epilogue on
  /// each GPU said it computes the tanh form (cuda_host_logic.h's gelu_epilogue_form); the
  /// result rounded once into c_type where cuBLASLt fuses it, else the unfused GEMM and a GELU
  /// kernel (the bits of the separate ops' fast path). A dry run answers true in fast mode for
  /// f32, bf16, f16 (the CUDA backend it predicts).
  virtual bool has_gemm_gelu_epilogue(DType dtype, Determinism mode) const;

  /// y[r, c] += bias[c] for a [rows, cols] y.
  virtual void add_bias(Stream& s, float* y, const float* bias, std::int64_t rows,
                        std::int64_t cols) = 0;

  /// out[c] = beta * out[c] + sum_r x[r, c] for a [rows, cols] x (bias gradient). In bitwise mode
  /// the rows are summed in ascending order. beta == 0: out is written, not read (BLAS's rule:
  /// it may hold anything, NaN included; nn's new bias gradients are not zeroed first).
  virtual void sum_rows(Stream& s, const float* x, std::int64_t rows, std::int64_t cols, float beta,
                        float* out, Determinism mode) = 0;

  /// y = max(x, 0), n elements (y may alias x).
  virtual void relu(Stream& s, const float* x, float* y, std::int64_t n) = 0;
  /// gx = gy where y > 0 else 0 (y is the ReLU output), n elements.
  virtual void relu_backward(Stream& s, const float* y, const float* gy, float* gx,
                             std::int64_t n) = 0;

  /// Softmax cross-entropy over `rows` samples of `classes` logits with i64 targets (already
  /// validated to lie in [0, classes)). Writes per-sample losses to `losses` [rows].
  virtual void cross_entropy(Stream& s, const float* logits, const std::int64_t* targets,
                             std::int64_t rows, std::int64_t classes, float* losses) = 0;
  /// grad_logits[r, c] = (*grad_loss) * scale * (softmax(logits[r])[c] - [c == targets[r]]).
  /// `grad_loss` is a device pointer to one float.
  virtual void cross_entropy_backward(Stream& s, const float* logits, const std::int64_t* targets,
                                      std::int64_t rows, std::int64_t classes,
                                      const float* grad_loss, float scale, float* grad_logits) = 0;

  /// Per-sample squared error summed over `cols`: losses[r] = sum_c (x[r,c]-t[r,c])^2.
  virtual void mse(Stream& s, const float* x, const float* t, std::int64_t rows, std::int64_t cols,
                   float* losses) = 0;
  /// gx = (*grad_loss) * scale * 2 * (x - t), n elements; `grad_loss` a device pointer.
  virtual void mse_backward(Stream& s, const float* x, const float* t, std::int64_t n,
                            const float* grad_loss, float scale, float* gx) = 0;

  /// *out = scale * sum_i x[i] over n elements. In bitwise mode x is summed in ascending order.
  virtual void sum(Stream& s, const float* x, std::int64_t n, float scale, float* out,
                   Determinism mode) = 0;

  /// x[i] = value for n elements of `elem_size` bytes (4 or 8; value converted to the type).
  virtual void fill_f32(Stream& s, float* x, float value, std::int64_t n) = 0;
  /// y = alpha * x + y (n elements).
  virtual void axpy(Stream& s, float alpha, const float* x, float* y, std::int64_t n) = 0;
  /// x = alpha * x (n elements).
  virtual void scale(Stream& s, float alpha, float* x, std::int64_t n) = 0;

  /// out = reduce(inputs[0..n_inputs)) elementwise over `numel` floats; all pointers on the
  /// stream's device; out may alias inputs[0]. bitwise: canonical tree over input index
  /// (Note [Canonical tree]); fast: any order.
  virtual void sum_inputs(Stream& s, const float* const* inputs, int n_inputs, float* out,
                          std::int64_t numel, Determinism mode) = 0;

  /// torch.optim.SGD step for one parameter of n elements. momentum_buf may be null when
  /// momentum == 0; `first_step` initialises the buffer to the gradient as PyTorch does.
  virtual void sgd_step(Stream& s, float* param, const float* grad, float* momentum_buf,
                        std::int64_t n, float lr, float momentum, float dampening,
                        float weight_decay, bool nesterov, bool first_step) = 0;

  // ---- micro-sharded batch reductions of bitwise mode (Note [Micro-shards],
  // core/numerics/micro_shards.h) `bounds` holds S + 1 non-decreasing row offsets, bounds[0] == 0
  // and bounds[S] == rows (validated by core); shard s is rows [bounds[s], bounds[s+1]) and may be
  // empty. Each shard's partial result is one ascending chain from 0.0f (an empty shard gives
  // +0.0f); the S partials are combined with the canonical tree over s (Note [Canonical tree]).
  // These kernels have one fixed order, used in both determinism modes. Implementations copy
  // `bounds` (the caller's vector may die before the work runs).

  /// C[M,N] = (accumulate ? C + T : T), one plain add, with T = canonical tree over shards s of
  /// P_s[i,j] = fma chain over rows r of shard s ascending of A[r,i] * B[r,j]. A is [rows, M]
  /// (row stride lda), B is [rows, N] (row stride ldb), C is [M, N] (row stride ldc); C does not
  /// alias A or B. The weight gradient dW = dY^T X of a Linear layer. M, N > 0.
  virtual void gemm_tn_sharded(Stream& s, std::int64_t M, std::int64_t N, const float* A,
                               std::int64_t lda, const float* B, std::int64_t ldb,
                               const std::vector<std::int64_t>& bounds, float* C, std::int64_t ldc,
                               bool accumulate) = 0;

  /// Whether gemm_tn_sharded_ex runs natively here for A, B, C of these storage dtypes (no f32
  /// copy of dY and X). Default: false, and ops::gemm_tn_sharded runs a bf16 / f16 call through
  /// f32 scratch and gemm_tn_sharded (Note [Mixed precision]); the simulator keeps that path (its
  /// bits, virtual time and memory accounting). cuda: true for a_type == b_type in {f32, bf16,
  /// f16} and c_type in {f32, bf16, f16}.
  virtual bool has_gemm_tn_sharded_ex(DType a_type, DType b_type, DType c_type) const;

  /// gemm_tn_sharded with each operand in its storage dtype (A [rows, M] of a_type, B [rows, N]
  /// of b_type, C [M, N] of c_type; strides in elements): the bits of the simulator's path,
  /// C = round_c(accumulate ? float(C) + T : T) with T the canonical tree over the shards' chains
  /// of gemm_tn_sharded over the widened A and B (widening is exact; C rounded once, to nearest
  /// even; an f32 C is not rounded). Only called where has_gemm_tn_sharded_ex(a_type, b_type,
  /// c_type) is true (core checked the arguments; the default throws InvalidArgument "this
  /// backend has no kernel gemm_tn_sharded_ex"). M, N > 0.
  virtual void gemm_tn_sharded_ex(Stream& s, std::int64_t M, std::int64_t N, const void* A,
                                  DType a_type, std::int64_t lda, const void* B, DType b_type,
                                  std::int64_t ldb, const std::vector<std::int64_t>& bounds,
                                  void* C, DType c_type, std::int64_t ldc, bool accumulate);

  /// out[c] = (accumulate ? out[c] + T[c] : T[c]) for a contiguous [rows, cols] x, T = canonical
  /// tree over shards of the ascending in-shard sums acc = acc + x[r, c] from 0.0f (the bias
  /// gradient). cols > 0; out does not alias x.
  virtual void sum_rows_sharded(Stream& s, const float* x, std::int64_t rows, std::int64_t cols,
                                const std::vector<std::int64_t>& bounds, float* out,
                                bool accumulate) = 0;

  /// *out = scale * T, T = canonical tree over shards of ascending in-shard sums of x[i] from
  /// 0.0f (the mean loss over a batch: scale = 1 / B). `out` is a device pointer to one float.
  virtual void sum_sharded(Stream& s, const float* x, const std::vector<std::int64_t>& bounds,
                           float scale, float* out) = 0;

  // ---- typed reductions over rows (issue 29 item 3: bias and LayerNorm parameter gradients of
  // a bf16 / f16 model; Note [Mixed precision]) -------------------------------------------------
  /// Whether sum_rows_ex and sum_rows_sharded_ex run natively here for a [rows, cols] x of
  /// x_type and an out of out_type in `mode` (no f32 copy of x). Default: false, and
  /// ops::sum_rows / sum_rows_sharded run a bf16 / f16 call through f32 scratch and the f32
  /// kernels (Note [Mixed precision]); the simulator keeps that path (its bits, virtual time and
  /// memory accounting). cuda: true for x_type in {bf16, f16} and out_type in {x_type, f32}, in
  /// both modes.
  virtual bool has_sum_rows_ex(DType x_type, DType out_type, Determinism mode) const;
  /// sum_rows on a contiguous [rows, cols] x of x_type into out [cols] of out_type: x loaded
  /// into f32 (exact), f32 accumulation, out[c] = round_out(beta == 0 ? T[c] : beta * float(out[c])
  /// + T[c]) rounded once (to nearest even; an f32 out is not rounded). bitwise: the bits of the
  /// simulator's path (sum_rows on the widened x, then the cast), T[c] one ascending chain over
  /// the rows and the epilogue cm::gemm_epilogue(T, 1, beta, out); fast: any order. Only called
  /// where has_sum_rows_ex is true (core checked the arguments; the default throws
  /// InvalidArgument "this backend has no kernel sum_rows_ex"). cols > 0.
  virtual void sum_rows_ex(Stream& s, const void* x, DType x_type, std::int64_t rows,
                           std::int64_t cols, float beta, void* out, DType out_type,
                           Determinism mode);
  /// sum_rows_sharded on x of x_type into out of out_type: out[c] = round_out(accumulate ?
  /// float(out[c]) + T[c] : T[c]), T the canonical tree over the shards' ascending chains of the
  /// widened x, rounded once: the bits of the simulator's path in both modes (one fixed order).
  /// Called and defaulted as sum_rows_ex ("sum_rows_sharded_ex"). cols > 0.
  virtual void sum_rows_sharded_ex(Stream& s, const void* x, DType x_type, std::int64_t rows,
                                   std::int64_t cols, const std::vector<std::int64_t>& bounds,
                                   void* out, DType out_type, bool accumulate);

  /// torch.optim.Adam step (not AdamW; maximize = false) for one parameter of n elements, in
  /// the operation order of PyTorch's single-tensor path (Note [Adam step] in
  /// core/numerics/canonical_math.h). exp_avg, exp_avg_sq (and max_exp_avg_sq when amsgrad; null
  /// otherwise) are updated in place. Hyper-parameters come as doubles, as Python floats do in
  /// PyTorch; bias_correction1/2 = 1 - beta^step are computed by the caller in double.
  virtual void adam_step(Stream& s, float* param, const float* grad, float* exp_avg,
                         float* exp_avg_sq, float* max_exp_avg_sq, std::int64_t n, double lr,
                         double beta1, double beta2, double eps, double weight_decay,
                         double bias_correction1, double bias_correction2, bool amsgrad) = 0;

  // ---- transformer kernels (the GPT of core/nn/gpt.h; Note [GPT kernels] in
  // core/numerics/gpt_math.h gives every kernel's exact operation order, shared by the simulator
  // and CUDA). All f32 and contiguous, token ids i64 (validated by core: in range). Kernels with
  // a `mode` use Eigen/cuBLAS-style any-order arithmetic in fast mode and the canonical order in
  // bitwise mode; the others have one fixed order in both modes. Defaults throw InvalidArgument
  // ("this backend has no kernel <name>").

  /// out[r, c] = wte[idx[r], c] + wpe[r % T, c] for the N = B * T token rows of a [B, T] batch
  /// (wpe may be null: no position term). wte [V, C], wpe [>= T, C], out [N, C].
  virtual void embedding_forward(Stream& s, const std::int64_t* idx, const float* wte,
                                 const float* wpe, std::int64_t N, std::int64_t T, std::int64_t C,
                                 float* out);
  /// grad_wte[v, :] = (accumulate ? grad_wte[v, :] + G[v, :] : G[v, :]) for all V rows, G = the
  /// canonical tree over micro-shards (bounds over the N token rows, Note [Micro-shards]) of each
  /// shard's ascending sum from 0.0f of dy[r, :] over its rows r with idx[r] == v. dy [N, C],
  /// grad_wte [V, C]. (Fast mode passes bounds {0, N}: one ordered scatter-add.)
  virtual void embedding_backward(Stream& s, const std::int64_t* idx, const float* dy,
                                  std::int64_t N, std::int64_t C, std::int64_t V,
                                  const std::vector<std::int64_t>& bounds, float* grad_wte,
                                  bool accumulate);
  /// torch.nn.functional.layer_norm over the last dim of a [N, C] x: per row mean = sum(x) / C,
  /// var = sum((x - mean)^2) / C (biased), rstd = 1 / sqrt(var + eps), y = (x - mean) * rstd * w
  /// (+ b; b may be null). Writes y [N, C], mean [N], rstd [N] (kept for backward).
  virtual void layernorm_forward(Stream& s, const float* x, const float* w, const float* b,
                                 std::int64_t N, std::int64_t C, float eps, float* y, float* mean,
                                 float* rstd);
  /// LayerNorm backward without the parameter reductions: with xhat = (x - mean) * rstd and
  /// g = dy * w, dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)) and dy_xhat = dy * xhat
  /// (whose row sum is grad_w; grad_b is the row sum of dy). All [N, C] except mean, rstd [N].
  virtual void layernorm_backward(Stream& s, const float* dy, const float* x, const float* w,
                                  const float* mean, const float* rstd, std::int64_t N,
                                  std::int64_t C, float* dx, float* dy_xhat);
  /// GELU, tanh form (torch.nn.functional.gelu(x, approximate='tanh')):
  /// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh the portable one. n elements.
  virtual void gelu_forward(Stream& s, const float* x, float* y, std::int64_t n);
  /// gx = gy * d gelu(x) / dx (x the forward's input), n elements.
  virtual void gelu_backward(Stream& s, const float* x, const float* gy, float* gx, std::int64_t n);
  /// Causal self-attention after nanoGPT's c_attn: qkv [B, T, 3C] holds q, k, v (each [B, T, nh,
  /// hd], hd = C / nh, in that order along the last dim); per batch b, head h and query t:
  /// att[b, h, t, u] = softmax over u <= t of (q_t . k_u) * scale (0 for u > t), scale =
  /// float(1 / sqrt(double(hd))), softmax with the portable exp after subtracting the row max;
  /// y[b, t, h*hd + i] = sum_{u <= t} a[b, h, t, u] v_u[i]. y [B, T, C]. att is not written:
  /// stats [B, nh, T, 2] receives each query's softmax statistics {m, sum} (row max, sum of
  /// exp(s - m)), from which the backward recomputes att (Note [Attention memory] in
  /// core/numerics/gpt_math.h; flash attention's memory). Dropout on the weights (nanoGPT's
  /// attn_dropout, 0 <= p < 1): a = att if p == 0 (no mask drawn: the p == 0 bits and speed),
  /// else a = att * scale where element (b, h, t, u) is kept, philox uniform01(seed, stream,
  /// index_base + ((b*nh + h)*T + t)*T + u) >= p, and 0 where not (scale = 1 / (1 - p) in float,
  /// as dropout_forward). stats are of the un-dropped softmax. bitwise: the operation order of
  /// Note [GPT kernels] in core/numerics/gpt_math.h; fast: any order (cuda: a flash attention,
  /// online softmax, Note [CUDA attention]), the same mask, stats within rounding of bitwise's
  /// (either mode's backward takes either mode's stats). A backend with one order (sim) runs it
  /// in both modes.
  virtual void attention_forward(Stream& s, const float* qkv, std::int64_t B, std::int64_t T,
                                 std::int64_t C, std::int64_t nh, float* y, float* stats, float p,
                                 std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base,
                                 Determinism mode);
  /// Backward of attention_forward given dy [B, T, C], the forward's qkv and stats and the same
  /// dropout key (the mask is recomputed): writes dqkv [B, T, 3C] (not accumulated). scratch:
  /// B * nh * T floats of the caller's (each query's pd = sum_u att[u] dp[u] = rowsum(dy * y),
  /// written). y: the forward's output [B, T, C], or null; fast mode may compute pd from it
  /// (FlashAttention-2's D = rowsum(dO o O); cuda: the tiled kernels, 7 T x T x hd products
  /// where recomputing pd makes 9), bitwise mode ignores it. `mode` as attention_forward's.
  virtual void attention_backward(Stream& s, const float* dy, const float* qkv, const float* y,
                                  const float* stats, std::int64_t B, std::int64_t T,
                                  std::int64_t C, std::int64_t nh, float* dqkv, float* scratch,
                                  float p, std::uint64_t seed, std::uint64_t stream,
                                  std::uint64_t index_base, Determinism mode);

  /// Whether attention_forward_ex / attention_backward_ex run natively here for qkv (and dy, y,
  /// dqkv) stored as `qkv_type` with heads of `head_dim` channels in `mode` (no f32 copy of qkv).
  /// Default: false, and ops::attention / attention_backward run a bf16 / f16 call through
  /// MixedOp's f32 scratch and attention_forward / attention_backward instead (Note [Mixed
  /// precision]); the simulator keeps that path (its bits, virtual time and memory accounting).
  /// cuda: true for qkv_type bf16 or f16 and head_dim <= 128, in both modes (Note [CUDA
  /// attention]).
  virtual bool has_attention_ex(DType qkv_type, std::int64_t head_dim, Determinism mode) const;
  /// The typed attention (torch's scaled_dot_product_attention(is_causal=True) on bf16 / f16
  /// tensors): attention_forward with qkv [B, T, 3C] and y [B, T, C] in `dtype` (bf16 or f16);
  /// stats [B, nh, T, 2] f32 as attention_forward's. Only called where has_attention_ex(dtype,
  /// C / nh, mode) is true (core checked the arguments; the default throws InvalidArgument "this
  /// backend has no kernel attention_forward_ex"). bitwise: the bits of the simulator's path
  /// (qkv widened exactly, attention_forward's bitwise order in f32, y rounded once to nearest
  /// even; stats unrounded). fast: any order, the same mask (cuda: FlashAttention-2 on the tensor
  /// cores, P rounded to `dtype` before P V, f32 accumulation), stats within rounding of
  /// bitwise's.
  virtual void attention_forward_ex(Stream& s, const void* qkv, DType dtype, std::int64_t B,
                                    std::int64_t T, std::int64_t C, std::int64_t nh, void* y,
                                    float* stats, float p, std::uint64_t seed, std::uint64_t stream,
                                    std::uint64_t index_base, Determinism mode);
  /// Backward of attention_forward_ex: dy [B, T, C] and qkv in `dtype`, the forward's f32 stats,
  /// dqkv [B, T, 3C] written in `dtype` (each element rounded once), scratch B * nh * T floats
  /// (each query's pd = rowsum(dy * y), written). y: the forward's output [B, T, C] in `dtype`,
  /// or null; fast mode may compute pd from it (FlashAttention-2's D = rowsum(dO o O), cuda:
  /// the tensor-core and SIMT kernels, 7 T x T x hd products where recomputing D makes 9);
  /// bitwise mode ignores it. Called and defaulted as attention_forward_ex; bitwise: the bits of
  /// the simulator's path (attention_backward on the widened dy and qkv, dqkv rounded once); fast:
  /// any order (cuda: tensor cores, dS and P rounded to `dtype` as operands).
  virtual void attention_backward_ex(Stream& s, const void* dy, const void* qkv, const void* y,
                                     DType dtype, const float* stats, std::int64_t B,
                                     std::int64_t T, std::int64_t C, std::int64_t nh, void* dqkv,
                                     float* scratch, float p, std::uint64_t seed,
                                     std::uint64_t stream, std::uint64_t index_base,
                                     Determinism mode);
  /// Inverted dropout (torch.nn.functional.dropout, training): element i is kept when
  /// philox uniform01(seed, stream, index_base + i) >= p (Note [Dropout masks]); y[i] = x[i] *
  /// scale if kept else 0, scale = 1 / (1 - p) in float. 0 <= p < 1. y may alias x.
  virtual void dropout_forward(Stream& s, const float* x, float* y, std::int64_t n, float p,
                               std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base);
  /// gx[i] = gy[i] * scale if element i was kept else 0 (the same mask, recomputed).
  virtual void dropout_backward(Stream& s, const float* gy, float* gx, std::int64_t n, float p,
                                std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base);

  // ---- typed row kernels (issue 29; Note [Mixed precision], core/runtime/mixed_precision.h) --
  // The row and element kernels of the GPT step above (and the softmax cross-entropy) on the
  // storage dtype: `dtype` (bf16 or f16) is the dtype of every `void*` tensor; f32 stays f32
  // (LayerNorm's mean and rstd, per-sample losses, grad_loss; embedding_backward_ex's grad_wte
  // may be f32: bitwise mode's gradients). Each loads its elements into f32
  // (exact), runs the arithmetic of its f32 kernel (the same operation order, Note [GPT
  // kernels]) and rounds each output element once into `dtype` (round to nearest even): the
  // bits of the simulator's MixedOp path (widen to f32 scratch, f32 kernel, cast), in both
  // modes, without its scratch, conversions and launches. Only called where has_rows_ex(dtype,
  // mode) is true (core checked the arguments); the defaults throw InvalidArgument ("this
  // backend has no kernel <name>_ex").

  /// Whether the *_ex row kernels below run natively here for storage dtype `storage` in `mode`.
  /// Default: false, and the ops of core/runtime/ops.h (ops::embedding(_backward),
  /// layernorm(_backward), gelu(_backward), cross_entropy(_backward), add, dropout(_backward))
  /// run bf16 / f16 tensors through f32 scratch and the f32 kernels instead (Note [Mixed
  /// precision]); the simulator keeps that path (its bits, virtual time and memory accounting).
  /// cuda: true for bf16 and f16 in both modes. Ops without a mode ask for Determinism::bitwise
  /// (these kernels have one order in both modes).
  virtual bool has_rows_ex(DType storage, Determinism mode) const;
  /// embedding_forward on storage-dtype wte, wpe (may be null) and out: out[r, c] =
  /// round(float(wte[idx[r], c]) + float(wpe[r % T, c])) (without wpe: wte's element).
  virtual void embedding_forward_ex(Stream& s, DType dtype, const std::int64_t* idx,
                                    const void* wte, const void* wpe, std::int64_t N,
                                    std::int64_t T, std::int64_t C, void* out);
  /// embedding_backward on `dtype` dy [N, C] into grad_wte [V, C] of `grad_type` (f32, or
  /// `dtype`): G as embedding_backward sums it (the same chains and tree, in f32), then
  /// grad_wte[v, c] = round(accumulate ? float(grad_wte[v, c]) + G[v, c] : G[v, c]) into
  /// grad_type, rounded once (f32: no rounding). The bits of MixedOp's path (dy and grad_wte
  /// widened to f32 scratch, embedding_backward, grad_wte cast back) without its scratch.
  virtual void embedding_backward_ex(Stream& s, DType dtype, const std::int64_t* idx,
                                     const void* dy, std::int64_t N, std::int64_t C, std::int64_t V,
                                     const std::vector<std::int64_t>& bounds, DType grad_type,
                                     void* grad_wte, bool accumulate);
  /// layernorm_forward with x, w, b (may be null) and y in `dtype`; mean and rstd f32 [N].
  virtual void layernorm_forward_ex(Stream& s, DType dtype, const void* x, const void* w,
                                    const void* b, std::int64_t N, std::int64_t C, float eps,
                                    void* y, float* mean, float* rstd);
  /// Whether layernorm_forward_add runs here for `dtype` (f32, bf16 or f16). Default: false,
  /// and ops::layernorm_add (nn::Block's residual adds followed by a LayerNorm) runs ops::add
  /// and then layernorm_forward(_ex); the simulator keeps that path (its bits, launches and
  /// memory accounting). cuda: true for f32, bf16 and f16. No mode: one order in both.
  virtual bool has_layernorm_forward_add(DType dtype) const;
  /// The residual add and the LayerNorm after it in one kernel (llm.c's fused_residual_forward):
  /// residual[i] = round(float(x[i]) + float(branch[i])) into `dtype` (f32: no rounding), then
  /// layernorm_forward (dtype f32) or layernorm_forward_ex (bf16, f16) of that stored residual:
  /// y, mean and rstd as that kernel writes them given the residual as its x. The bits of
  /// ops::add(x, branch) (add_any or sum_inputs: one f32 add, rounded once) followed by that
  /// kernel, without the add's launch or the residual's re-read by a second kernel. x, branch,
  /// residual, y [N, C] and w, b (b may be null) [C] in `dtype`; mean, rstd f32 [N]; residual
  /// and y share no memory with an input or each other. Only called where
  /// has_layernorm_forward_add(dtype) is true; the default throws InvalidArgument.
  virtual void layernorm_forward_add(Stream& s, DType dtype, const void* x, const void* branch,
                                     const void* w, const void* b, std::int64_t N, std::int64_t C,
                                     float eps, void* residual, void* y, float* mean, float* rstd);
  /// layernorm_backward with dy, x, w, dx and dy_xhat in `dtype`; mean and rstd f32 [N].
  virtual void layernorm_backward_ex(Stream& s, DType dtype, const void* dy, const void* x,
                                     const void* w, const float* mean, const float* rstd,
                                     std::int64_t N, std::int64_t C, void* dx, void* dy_xhat);
  /// Whether layernorm_backward_add runs here for `dtype` (f32, bf16 or f16). Default: false,
  /// and ops::layernorm_backward_add (nn::Block's residual gradient) runs layernorm_backward(_ex)
  /// and then ops::add; the simulator keeps that path (its bits, launches and memory accounting).
  /// cuda: true for f32, bf16 and f16. No mode: one order in both.
  virtual bool has_layernorm_backward_add(DType dtype) const;
  /// layernorm_backward (dtype f32) or layernorm_backward_ex (bf16, f16) with the residual
  /// gradient's add in its store (llm.c's dinp +=): out[i] = round(float(residual[i]) +
  /// float(round(dx[i]))), dx as that kernel computes it, each round into `dtype` (f32: none):
  /// the bits of that kernel followed by ops::add(residual, dx) (add_any or sum_inputs: one f32
  /// add, rounded once), without dx's tensor or the add's launch. dy_xhat as that kernel writes
  /// it. dy, x, residual, out, dy_xhat [N, C] and w [C] in `dtype`; mean, rstd f32 [N]; out
  /// shares no memory with an input. Only called where has_layernorm_backward_add(dtype) is
  /// true; the default throws InvalidArgument.
  virtual void layernorm_backward_add(Stream& s, DType dtype, const void* dy, const void* x,
                                      const void* w, const float* mean, const float* rstd,
                                      const void* residual, std::int64_t N, std::int64_t C,
                                      void* out, void* dy_xhat);
  /// Whether layernorm_backward_params runs here for `dtype` (f32, bf16 or f16) in `mode`.
  /// Default: false, and nn::LayerNorm's backward runs layernorm_backward(_ex) (or
  /// layernorm_backward_add) and then the two row sums of its parameter gradients (sum_rows(_ex),
  /// sum_rows_sharded(_ex)); the simulator keeps that path (its bits, launches and memory
  /// accounting). cuda: true for f32, bf16 and f16 in fast mode, false in bitwise mode (its row
  /// sums follow the micro-shards' chains, Note [Micro-shards]).
  virtual bool has_layernorm_backward_params(DType dtype, Determinism mode) const;
  /// The LayerNorm backward with its parameter gradients in the same launch (fast mode; llm.c's
  /// layernorm_backward: dinp, dweight and dbias in one kernel, dy_xhat never stored):
  ///   dx[r, c]   = round(float(residual[r, c]) + v[r, c]) (residual null: round(v[r, c])), v the
  ///                layernorm_backward formula in f32 (any order of its row sums);
  ///   grad_w[c]  = round(accumulate_w ? float(grad_w[c]) + S_w[c] : S_w[c]),
  ///                S_w[c] = sum over rows of dy[r, c] * xhat[r, c] (f32, any order);
  ///   grad_b[c]  likewise with S_b[c] = sum over rows of dy[r, c] (grad_b null: no bias).
  /// Each round into its dtype (f32: none); the same bits run to run (the order is a function of
  /// N and C). dy, x, residual, dx [N, C] and w [C] in `dtype`; mean, rstd f32 [N]; grad_w and
  /// grad_b [C] in `grad_type` (f32 or `dtype`); dx shares no memory with an input. torch's
  /// native_layer_norm_backward with output_mask all true. Only called where
  /// has_layernorm_backward_params(dtype, fast) is true; the default throws InvalidArgument.
  virtual void layernorm_backward_params(Stream& s, DType dtype, const void* dy, const void* x,
                                         const void* w, const float* mean, const float* rstd,
                                         const void* residual, std::int64_t N, std::int64_t C,
                                         void* dx, DType grad_type, void* grad_w, bool accumulate_w,
                                         void* grad_b, bool accumulate_b);
  /// Whether cross_entropy_fused runs here for `dtype` (f32, bf16 or f16) in `mode`. Default:
  /// false, and nn::CrossEntropyLoss runs cross_entropy(_ex) in its forward and
  /// cross_entropy_backward(_ex) in its backward; the simulator keeps that path (its bits,
  /// launches and memory accounting; a dry run prices CUDA's one launch). cuda: true for f32,
  /// bf16 and f16 in fast mode, false in bitwise mode (the two kernels' bits are the contract).
  virtual bool has_cross_entropy_fused(DType dtype, Determinism mode) const;
  /// The softmax cross-entropy's forward and backward in one pass over the logits (fast mode;
  /// llm.c's fused_classifier): losses[r] = log(s) - (x[r, t] - m) as cross_entropy, and the
  /// logits' gradient (*grad_loss) * scale * (softmax(x[r])[c] - [c == targets[r]]) written
  /// over the logits, each element rounded once into `dtype` (f32: none): no second [rows,
  /// classes] buffer. Math in f32 from the stored logits; the row's max and sum in any order (a
  /// function of `classes`: the same bits run to run), within f32 rounding of cross_entropy(_ex)
  /// and cross_entropy_backward(_ex). logits [rows, classes] in `dtype` (read, then
  /// overwritten); targets i64 [rows], already validated to lie in [0, classes); grad_loss a
  /// device pointer to one f32 (read before any write); losses f32 [rows]. Only called where
  /// has_cross_entropy_fused(dtype, fast) is true; the default throws InvalidArgument.
  virtual void cross_entropy_fused(Stream& s, DType dtype, void* logits,
                                   const std::int64_t* targets, std::int64_t rows,
                                   std::int64_t classes, const float* grad_loss, float scale,
                                   float* losses);
  /// gelu_forward on `dtype` elements (y may alias x).
  virtual void gelu_forward_ex(Stream& s, DType dtype, const void* x, void* y, std::int64_t n);
  /// gelu_backward on `dtype` elements.
  virtual void gelu_backward_ex(Stream& s, DType dtype, const void* x, const void* gy, void* gx,
                                std::int64_t n);
  /// cross_entropy on `dtype` logits [rows, classes]; losses f32 [rows].
  virtual void cross_entropy_ex(Stream& s, DType dtype, const void* logits,
                                const std::int64_t* targets, std::int64_t rows,
                                std::int64_t classes, float* losses);
  /// cross_entropy_backward on `dtype` logits into `dtype` grad_logits; grad_loss a device
  /// pointer to one f32.
  virtual void cross_entropy_backward_ex(Stream& s, DType dtype, const void* logits,
                                         const std::int64_t* targets, std::int64_t rows,
                                         std::int64_t classes, const float* grad_loss, float scale,
                                         void* grad_logits);
  /// dropout_forward on `dtype` elements (the same mask; y may alias x).
  virtual void dropout_forward_ex(Stream& s, DType dtype, const void* x, void* y, std::int64_t n,
                                  float p, std::uint64_t seed, std::uint64_t stream,
                                  std::uint64_t index_base);
  /// dropout_backward on `dtype` elements.
  virtual void dropout_backward_ex(Stream& s, DType dtype, const void* gy, void* gx, std::int64_t n,
                                   float p, std::uint64_t seed, std::uint64_t stream,
                                   std::uint64_t index_base);
  // The residual add has no entry of its own: where has_rows_ex is true, ops::add on two
  // tensors of one storage dtype calls add_any (below): one f32 add, rounded once, the same bits.
  /// *out = sum_i x[i]^2 over n elements (a gradient norm's square). bitwise: x in blocks of
  /// kSquaresBlock (gpt_math.h) elements, each an ascending chain acc = fma(x, x, acc) from
  /// 0.0f, the blocks combined by the canonical tree over the block index; fast: any order.
  /// `out` is a device pointer to one float.
  virtual void sum_squares(Stream& s, const float* x, std::int64_t n, float* out, Determinism mode);
  /// out[j] = the bitwise chain of block j of x (the leaves of sum_squares' tree): acc =
  /// fma(x[i], x[i], acc) from 0.0f over i in [j * kSquaresBlock, min(n, (j + 1) *
  /// kSquaresBlock)), for j < squares_blocks(n) (gpt_math.h). ZeRO's sharded gradient clip
  /// (core/optim/zero.h) combines the leaves of every rank with the canonical tree. `out` is a
  /// device pointer to squares_blocks(n) floats. Default: one bitwise sum_squares per block (a
  /// tree over one leaf is the leaf), so every backend has it; the simulator runs one kernel.
  virtual void sum_squares_blocks(Stream& s, const float* x, std::int64_t n, float* out);

  // ---- dtype-generic kernels (any DType; Note [Small float conversions] in
  // core/numerics/float_formats.h and Note [Reductions over ranks] in core/numerics/reduce_math.h
  // give the arithmetic, shared by every backend). Defaults throw BackendError (not supported).

  /// y[i] = convert<to>(x[i]) for n elements (x and y do not overlap unless from == to).
  virtual void cast(Stream& s, const void* x, DType from, void* y, DType to, std::int64_t n);
  /// x[i] = the element whose bytes are the low elem_size bytes of `bits` (little endian),
  /// n elements of elem_size (1, 2, 4 or 8) bytes: fill with any dtype's value, converted on the
  /// host (ops::fill_).
  virtual void fill_bits(Stream& s, void* x, std::size_t elem_size, std::uint64_t bits,
                         std::int64_t n);
  /// out[i] = a[i] + b[i] in dtype t (floats: in Acc, rounded once; integers wrap). out may
  /// alias a or b.
  virtual void add_any(Stream& s, DType t, const void* a, const void* b, void* out, std::int64_t n);
  /// x[i] = x[i] * alpha in dtype t (floats: in Acc with alpha converted to Acc, rounded once;
  /// integers: alpha is integral (core checked), converted to t, wrapping multiply).
  virtual void scale_any(Stream& s, DType t, void* x, double alpha, std::int64_t n);
  /// out = reduce of inputs[0..n_inputs) elementwise over numel elements of dtype t with `op`
  /// (any ReduceOp value but premul_sum, as rmath::Op; avg divides by n_inputs), all on the
  /// stream's device; out may alias inputs[0]. bitwise: the canonical tree over input index;
  /// fast: any order (Note [Reductions over ranks]). torch.cuda.comm.reduce_add on any dtype.
  virtual void reduce_inputs(Stream& s, DType t, const void* const* inputs, int n_inputs, void* out,
                             std::int64_t numel, int op, Determinism mode);

  // ---- multi-tensor kernels (the optimizer's per-parameter loops in one launch per device) --
  // Each equals, bit for bit, the per-tensor kernels above called once per tensor in list order
  // (which is what the defaults do). A backend whose versions save launches says so with
  // has_multi_tensor_kernels(); core/optim calls them only then and otherwise keeps its
  // per-tensor calls, so a backend without them (the simulator, except in a dry run, which prices
  // the CUDA backend's launches: Note [Predicted launches], backend_sim/cost_model.h) keeps its
  // launches, virtual time and trace. All pointers on the stream's device; tensors do not overlap
  // one another.

  /// One parameter of adam_step_multi and adam_step_multi_ex, all but its gradient: adam_step's
  /// buffers and n, its own bias corrections (1 - beta^step, in double, as the caller computes
  /// them per parameter) and AdamW's decoupled decay: when `decay`, param = decay_scale * param
  /// first (one mul per element, exactly scale(decay_scale, param)).
  struct AdamParamState {
    float* param = nullptr;  ///< the f32 parameter (adam_step_multi_ex: the master), in place
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    float* max_exp_avg_sq = nullptr;  ///< null unless amsgrad
    std::int64_t n = 0;
    double bias_correction1 = 1.0, bias_correction2 = 1.0;
    bool decay = false;
    float decay_scale = 1.0f;
  };
  /// One parameter of adam_step_multi: its state and its f32 gradient.
  struct AdamTensor : AdamParamState {
    const float* grad = nullptr;  ///< n floats
  };

  /// True when this backend's multi-tensor kernels run fewer launches than the per-tensor loop
  /// (cuda; the simulator in a dry run, priced as cuda's). Default false.
  virtual bool has_multi_tensor_kernels() const { return false; }
  /// For each tensor in order: the decay (if any), then adam_step with the shared
  /// hyper-parameters and the tensor's bias corrections (torch.optim.AdamW's fused/foreach step).
  virtual void adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr,
                               double beta1, double beta2, double eps, double weight_decay,
                               bool amsgrad);
  /// out[i] = sum_squares(xs[i], ns[i], mode) for each i (the bits of one sum_squares call per
  /// tensor in both modes). `out` is a device pointer to xs.size() floats. torch's
  /// clip_grad_norm_ with foreach=True.
  virtual void sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                                 const std::vector<std::int64_t>& ns, float* out, Determinism mode);
  /// xs[i][j] = alpha * xs[i][j] for each tensor (scale() on each).
  virtual void scale_multi(Stream& s, const std::vector<float*>& xs,
                           const std::vector<std::int64_t>& ns, float alpha);
  /// xs[i][j] = value for each tensor (fill_f32 on each): the optimizer's new moments zeroed
  /// in one launch per device (torch._foreach_zero_).
  virtual void fill_multi(Stream& s, const std::vector<float*>& xs,
                          const std::vector<std::int64_t>& ns, float value);
  /// dsts[i][j] = convert<to>(srcs[i][j]) for j < ns[i], for each piece: the bits of cast()
  /// on each piece (what the default does). from == to (any dtype): an exact copy of the bytes
  /// (cudaMemcpyAsync per piece, torch._foreach_copy_); otherwise cast()'s conversion (f32 ->
  /// bf16 / f16 rounded to nearest even, bf16 / f16 -> f32 exact). Pieces are contiguous; no dst
  /// overlaps another dst or any src. ZeRO-1 packs its collectives' buffers and rounds its
  /// masters into the parameters with it (Note [ZeRO copies], core/optim/zero.h): one
  /// launch per list, not one copy per piece. cuda: one launch per table of up to 1000 pieces
  /// (kernel names copy_multi for from == to, cast_multi otherwise).
  virtual void copy_multi(Stream& s, DType from, DType to, const std::vector<const void*>& srcs,
                          const std::vector<void*>& dsts, const std::vector<std::int64_t>& ns);

  // ---- typed multi-tensor kernels (issue 29: the optimizer step on bf16 / f16 gradients) ----
  // Note [Typed optimizer step] (core/optim/master_weights.h): optim::MasterWeights runs its f32
  // masters' AdamW and the clip on the model's gradients as stored (bf16 / f16 in fast mode, f32
  // in bitwise mode), without f32 copies, and the step writes the model's weights (each master
  // rounded once) in the same launch, where has_multi_tensor_ex says so for every dtype involved.
  // Each gives the bits of the f32 path it replaces (casts, sum_squares_multi, scale_multi,
  // adam_step_multi, casts back). The defaults: false, and the entries throw (the simulator's
  // real run keeps that f32 path: its bits, launches and memory accounting).

  /// Whether adam_step_multi_ex and sum_squares_multi_ex take gradients, and adam_step_multi_ex
  /// writes model weights, of dtype `t` here. cuda: f32, bf16, f16; the simulator: the same in
  /// a dry run (priced as cuda's launches, Note [Predicted launches]), none in a real run.
  virtual bool has_multi_tensor_ex(DType t) const;

  /// One parameter of adam_step_multi_ex: its state, its gradient in its storage dtype, and the
  /// model's weight to write.
  struct AdamTensorEx : AdamParamState {
    const void* grad = nullptr;      ///< n elements of grad_type
    DType grad_type = DType::f32;    ///< f32, bf16 or f16
    void* model = nullptr;           ///< null, or n elements of model_type (not overlapping param)
    DType model_type = DType::bf16;  ///< bf16 or f16

    AdamTensorEx() = default;
    /// adam_step_multi's tensor: its f32 gradient, no model weight.
    explicit AdamTensorEx(const AdamTensor& t) : AdamParamState(t), grad(t.grad) {}
  };
  /// adam_step_multi with, per element, the gradient widened as loaded (exact), times
  /// grad_scale when scale_grads (one mul: the clip's scale_multi of the f32 copy), and the
  /// updated param rounded once into model where set: the bits of cast(grad, f32), scale_multi,
  /// adam_step_multi, cast(param, model_type). Only called where has_multi_tensor_ex is true for
  /// every grad_type and model_type of the call.
  virtual void adam_step_multi_ex(Stream& s, const std::vector<AdamTensorEx>& tensors, double lr,
                                  double beta1, double beta2, double eps, double weight_decay,
                                  bool amsgrad, bool scale_grads, float grad_scale);
  /// sum_squares_multi over xs[i] of dtype types[i] (f32, bf16, f16), each element widened as
  /// loaded: the bits of sum_squares_multi on their f32 casts, in both modes. Only called where
  /// has_multi_tensor_ex is true for every types[i].
  virtual void sum_squares_multi_ex(Stream& s, const std::vector<const void*>& xs,
                                    const std::vector<DType>& types,
                                    const std::vector<std::int64_t>& ns, float* out,
                                    Determinism mode);
};

class Backend : public NonCopyable {
 public:
  /// Registry name: "cpu", "sim", "cuda".
  virtual std::string name() const = 0;
  virtual int device_count() const = 0;
  virtual DeviceProperties properties(int index) const = 0;
  virtual MemoryStats memory_stats(int index) const = 0;
  virtual void reset_peak_memory(int index) = 0;
  /// Whether this backend runs dry (BackendOptions::dry_run): device memory holds no data and
  /// reads back as zeros. Code that would draw host values only to copy them to a device (weight
  /// initialisation) skips it when true. Default: false.
  virtual bool dry_run() const { return false; }

  /// Allocate `bytes` on device `index` (stream-ordered on its default stream). Zero bytes gives
  /// a unique non-null pointer. Throws OutOfMemory naming device, request, in use and capacity.
  virtual void* allocate(int index, std::size_t bytes) = 0;
  /// Free memory from allocate(), ordered after all work enqueued so far on the device's default
  /// stream. Never throws.
  virtual void deallocate(int index, void* ptr, std::size_t bytes) noexcept = 0;

  /// The device's default stream; lives as long as the backend.
  virtual Stream& default_stream(int index) = 0;
  /// A new stream on the device (for communication or overlap).
  virtual std::unique_ptr<Stream> create_stream(int index) = 0;
  virtual std::unique_ptr<Event> create_event(int index) = 0;

  /// Copy host -> device on `s`; blocks until done (the host buffer may be reused on return).
  virtual void copy_from_host(Stream& s, void* dst, const void* src, std::size_t bytes) = 0;
  /// Copy device -> host on `s`; blocks until done.
  virtual void copy_to_host(Stream& s, void* dst, const void* src, std::size_t bytes) = 0;
  /// Copy between devices of this backend (or within one), enqueued on `s`, which belongs to the
  /// destination device; the caller has already ordered `s` after the source's pending work.
  /// Strided form: `rows` rows of `row_bytes`, strides in bytes (cudaMemcpy2DAsync).
  virtual void copy_2d(Stream& s, void* dst, std::size_t dst_pitch, const void* src,
                       std::size_t src_pitch, std::size_t row_bytes, std::size_t rows) = 0;

  /// The kernels of this backend. Throws InvalidArgument for backends that run none ("cpu").
  virtual Kernels& kernels() = 0;

  /// Create one communicator per device in `devices` (ncclCommInitAll); returns the shared state
  /// the per-rank Communicator handles wrap. Devices are validated by core.
  virtual std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>& devices,
                                                                const CommOptions& options) = 0;

  /// A trainer tells the backend that training step `step` (0-based, counted over the whole run)
  /// begins, before enqueueing any of its work. Default: nothing; the simulator fires the faults
  /// injected for that step (backend_sim/sim_faults.h).
  virtual void begin_step(std::int64_t /*step*/) {}

  /// Backend-specific extras, looked up by name (after ggml's get_proc_address): the object
  /// implementing the interface named `name` (e.g. CostModelExtension::kExtensionName,
  /// core/runtime/extensions.h), or nullptr when this backend has none. The object lives as long
  /// as the backend. Default: none.
  virtual void* extension(std::string_view /*name*/) { return nullptr; }

  /// Typed form: `be.extension<CostModelExtension>()` is the backend's T (named
  /// T::kExtensionName), or nullptr. Callers never dynamic_cast to a backend's class.
  template <class T>
  T* extension() {
    return static_cast<T*>(extension(T::kExtensionName));
  }
};

/// The backend that runs on any machine (the simulator's virtual devices): TrainerConfig's
/// default, and what "auto" resolves to without a usable CUDA device.
inline constexpr std::string_view kDefaultBackend = "sim";

/// Factory registered under a name.
using BackendFactory = std::function<std::shared_ptr<Backend>(const BackendOptions&)>;

/// Register a backend factory (done by each backend at library start-up).
void register_backend(const std::string& name, BackendFactory factory);

/// Names of registered backends, in registration order ("cpu", "sim", then "cuda" if built).
std::vector<std::string> registered_backends();

/// (Re)create the process-wide instance of backend `name` with `options`. Tensors on a previous
/// instance keep it alive until they die. "auto" resolves to "cuda" when a CUDA device is usable,
/// else "sim". Returns the instance. Throws InvalidArgument for an unknown name, BackendError when
/// the backend cannot start (e.g. "no CUDA device: <reason>").
Backend& init_backend(const std::string& name, const BackendOptions& options = {});

/// The process-wide instance of backend `name`, created with default options on first use.
Backend& get_backend(const std::string& name);

/// Same, as a shared_ptr (Buffers hold one so memory outlives a re-init).
std::shared_ptr<Backend> get_backend_ptr(const std::string& name);

/// Resolve "auto" (and pass other names through): "cuda" if usable, else "sim". If `reason` is
/// given and cuda was not usable, it receives why.
std::string resolve_backend_name(const std::string& name, std::string* reason = nullptr);

/// Whether `device` belongs to a backend that runs dry (Backend::dry_run; false for the host).
bool is_dry_run(const Device& device);

/// Devices `backend:0` .. `backend:n-1`; throws InvalidArgument when n exceeds the device count.
std::vector<Device> devices(const std::string& backend, int n);

}  // namespace ditto
