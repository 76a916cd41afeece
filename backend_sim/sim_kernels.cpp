// The simulator's kernels (ditto::Kernels): each call enqueues its work on the virtual device's
// stream and returns at once; the work runs on a thread of the simulator's pool. Core has validated
// every argument (shapes, devices, target ranges), so these trust their inputs.
//
// Bitwise mode follows core/numerics/canonical_math.h (Note [Canonical GEMM], Note [Rounded
// primitives]) and core/numerics/determinism.h (Note [Canonical tree]); fast mode uses Eigen or any
// order. Kernels that take no Determinism argument have one fixed order, used in both modes.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_eigen.h"  // first: its pragma must precede Eigen
#include "backend_sim/sim_gemm.h"
#include "backend_sim/sim_kernels_dtype.h"
#include "backend_sim/sim_kernels_gpt.h"
#include "core/numerics/canonical_math.h"
#include "core/numerics/determinism.h"
#include "core/runtime/mixed_precision.h"

namespace ditto::sim {

namespace {

namespace cm = canonical;
namespace gk = gpt_kernels;
namespace dk = dtype_kernels;

using VecMap = Eigen::Map<Eigen::VectorXf>;
using ConstVecMap = Eigen::Map<const Eigen::VectorXf>;

// Kernels at most this large (KernelCost flops and bytes) run on the launching thread when
// their stream is idle (Note [Inline work], sim_stream.cpp): a few microseconds of work, less
// than a hand-off to a pool thread. DITTO_SIM_INLINE=0 turns it off (for measurements).
const double kInlineFlops = [] {
  const char* env = std::getenv("DITTO_SIM_INLINE");
  return env != nullptr && std::strcmp(env, "0") == 0 ? -1.0 : double(1 << 17);
}();
constexpr double kInlineBytes = double(1 << 19);

// Elements per block of the blocked elementwise reductions (fits in L1 with a few temporaries).
constexpr std::int64_t kBlock = 1024;

// dst[0..len) = canonical tree over inputs[lo, hi) of inputs[i][base..base+len) (Note
// [Canonical tree]). `dst` must not alias any input.
void tree_sum_block(const std::vector<const float*>& inputs, std::int64_t lo, std::int64_t hi,
                    std::int64_t base, std::int64_t len, float* dst) {
  if (hi - lo == 1) {
    std::memcpy(dst, inputs[static_cast<std::size_t>(lo)] + base,
                static_cast<std::size_t>(len) * sizeof(float));
    return;
  }
  const std::int64_t mid = tree_mid(lo, hi);
  float right[kBlock];
  tree_sum_block(inputs, lo, mid, base, len, dst);
  tree_sum_block(inputs, mid, hi, base, len, right);
  for (std::int64_t i = 0; i < len; ++i) dst[i] = cm::add(dst[i], right[i]);
}

// Depth of the canonical tree over n >= 1 leaves: the number of right-hand partials alive at
// once along a root-to-leaf path.
int tree_depth(std::int64_t n) {
  int d = 0;
  for (std::int64_t p = 1; p < n; p *= 2) ++d;
  return d;
}

// Recursive evaluation of the canonical tree over shards [lo, hi) of a batch reduction whose
// partial results have `len` floats each (Note [Canonical tree]). leaf(s, dst) writes shard s's
// partial into dst; the right subtree of a node at `level` goes to scratch + level * len, so
// scratch needs tree_depth(hi - lo) * len floats. dst must not overlap scratch.
template <typename Leaf>
void shard_tree(const Leaf& leaf, std::int64_t lo, std::int64_t hi, float* dst, float* scratch,
                std::int64_t len, int level) {
  if (hi - lo == 1) {
    leaf(lo, dst);
    return;
  }
  const std::int64_t mid = tree_mid(lo, hi);
  shard_tree(leaf, lo, mid, dst, scratch, len, level + 1);
  float* right = scratch + static_cast<std::int64_t>(level) * len;
  shard_tree(leaf, mid, hi, right, scratch, len, level + 1);
  for (std::int64_t i = 0; i < len; ++i) dst[i] = cm::add(dst[i], right[i]);
}

// The softmax cross-entropy's costs (f32): forward reads the logits, writes a loss and reads a
// target per row; backward reads the logits and writes their gradient, with grad_loss.
KernelCost cross_entropy_cost(std::int64_t rows, std::int64_t classes) {
  return KernelCost{4.0 * rows * classes, 4.0 * rows * classes + 12.0 * rows};
}
KernelCost cross_entropy_backward_cost(std::int64_t rows, std::int64_t classes) {
  return KernelCost{5.0 * rows * classes, 8.0 * rows * classes + 8.0 * rows + 4};
}
// The fused pair (Kernels::cross_entropy_fused, CUDA's one launch): the backward's FLOPs (its
// softmax statistics are the forward's), the logits read once and their gradient written once
// over them (a block's row is re-read from L2, not priced), a loss written and a target read per
// row, grad_loss read.
KernelCost cross_entropy_fused_cost(std::int64_t rows, std::int64_t classes) {
  return KernelCost{5.0 * rows * classes, 8.0 * rows * classes + 12.0 * rows + 4};
}

class SimKernels final : public Kernels {
 public:
  explicit SimKernels(std::shared_ptr<CostModel> cost) : cost_(std::move(cost)) {}

  void gemm(Stream& s, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
            float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
            float beta, float* C, std::int64_t ldc, Determinism mode) override {
    if (M <= 0 || N <= 0) return;
    // Note [Compute units]: fast mode is cuBLASLt's, bitwise ditto's own SIMT fma-chain kernel.
    KernelCost cost{2.0 * M * N * K, 4.0 * (M * K + K * N + (beta == 0.0f ? 1.0 : 2.0) * M * N),
                    true};
    cost.path = mode == Determinism::bitwise ? GemmPath::simt : GemmPath::library;
    launch(s, "gemm", cost, [=] {
      gemm_split(mode == Determinism::bitwise, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                 beta, C, ldc);
    });
  }

  // ---- the typed GEMM (Note [Predicted launches], Note [Typed kernels], cost_model.h) -------
  // A dry run predicts the CUDA backend, which runs these dtypes natively (cuda_host_logic.h's
  // typed_gemm_supported): ops::gemm / matmul / linear then call gemm_ex, priced as its one
  // launch. A real run keeps Kernels' default (false): MixedOp's f32 scratch and gemm, its bits.
  bool has_gemm_ex(DType a_type, DType b_type, DType c_type, Determinism) const override {
    const bool storage = a_type == DType::f32 || a_type == DType::bf16 || a_type == DType::f16;
    return cost_->dry_run() && storage && b_type == a_type &&
           (c_type == a_type || c_type == DType::f32);
  }

  // The GELU epilogues (Note [Typed kernels]): a dry run predicts CUDA's fast mode, which fuses
  // them where cuBLASLt's GELU is the tanh form (llm.c's and PyTorch's reading; the CUDA backend
  // probes each GPU): gemm_ex_cost with the aux matrix's bytes, no GELU launch. Bitwise mode and a
  // real run keep the GEMM and ditto's GELU kernels apart.
  bool has_gemm_gelu_epilogue(DType dtype, Determinism mode) const override {
    return mode == Determinism::fast && has_gemm_ex(dtype, dtype, dtype, mode);
  }

  void gemm_ex(Stream& s, const GemmExArgs& g) override {
    if (!cost_->dry_run()) return Kernels::gemm_ex(s, g);  // throws: has_gemm_ex is false
    if (g.M <= 0 || g.N <= 0) return;
    price(s, "gemm_ex", gemm_ex_cost(g));
  }

  void add_bias(Stream& s, float* y, const float* bias, std::int64_t rows,
                std::int64_t cols) override {
    if (rows <= 0 || cols <= 0) return;
    launch(s, "add_bias", KernelCost{double(rows) * cols, 4.0 * (2.0 * rows * cols + cols)}, [=] {
      for (std::int64_t r = 0; r < rows; ++r) {
        float* yr = y + r * cols;
        for (std::int64_t c = 0; c < cols; ++c) yr[c] = cm::add(yr[c], bias[c]);
      }
    });
  }

  void sum_rows(Stream& s, const float* x, std::int64_t rows, std::int64_t cols, float beta,
                float* out, Determinism mode) override {
    if (cols <= 0) return;
    const KernelCost cost =
        mode == Determinism::fast
            ? fast_sum_rows_cost(rows, cols, DType::f32, DType::f32)  // CUDA's row chunks
            : KernelCost{double(rows) * cols, 4.0 * (double(rows) * cols + cols)};
    launch(s, "sum_rows", cost, [=] {
      if (mode == Determinism::fast) {
        Eigen::Map<const RowMat> xm(x, rows, cols);
        Eigen::Map<Eigen::RowVectorXf> o(out, cols);
        if (beta == 0.0f)
          o.noalias() = xm.colwise().sum();
        else
          o = beta * o + xm.colwise().sum();
        return;
      }
      // Ascending rows per column, vectorised across a block of columns.
      float acc[kBlock];
      for (std::int64_t c0 = 0; c0 < cols; c0 += kBlock) {
        const std::int64_t len = std::min(kBlock, cols - c0);
        for (std::int64_t c = 0; c < len; ++c) acc[c] = 0.0f;
        for (std::int64_t r = 0; r < rows; ++r) {
          const float* xr = x + r * cols + c0;
          for (std::int64_t c = 0; c < len; ++c) acc[c] = cm::sum_step(acc[c], xr[c]);
        }
        float* o = out + c0;
        if (beta == 0.0f)
          for (std::int64_t c = 0; c < len; ++c) o[c] = acc[c];
        else
          for (std::int64_t c = 0; c < len; ++c) o[c] = cm::gemm_epilogue(acc[c], 1.0f, beta, o[c]);
      }
    });
  }

  void relu(Stream& s, const float* x, float* y, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "relu", KernelCost{double(n), 8.0 * n}, [=] {
      for (std::int64_t i = 0; i < n; ++i) y[i] = cm::relu(x[i]);
    });
  }

  void relu_backward(Stream& s, const float* y, const float* gy, float* gx,
                     std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "relu_backward", KernelCost{double(n), 12.0 * n}, [=] {
      for (std::int64_t i = 0; i < n; ++i) gx[i] = cm::relu_grad(y[i], gy[i]);
    });
  }

  void cross_entropy(Stream& s, const float* logits, const std::int64_t* targets, std::int64_t rows,
                     std::int64_t classes, float* losses) override {
    if (rows <= 0) return;
    launch(s, "cross_entropy", cross_entropy_cost(rows, classes), [=] {
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* x = logits + r * classes;
        const cm::SoftmaxStats st = cm::softmax_stats(x, classes);
        losses[r] = cm::cross_entropy_loss(st.max, st.sum, x[targets[r]]);
      }
    });
  }

  void cross_entropy_backward(Stream& s, const float* logits, const std::int64_t* targets,
                              std::int64_t rows, std::int64_t classes, const float* grad_loss,
                              float scale, float* grad_logits) override {
    if (rows <= 0 || classes <= 0) return;
    launch(s, "cross_entropy_backward", cross_entropy_backward_cost(rows, classes), [=] {
      const float factor = cm::mul(*grad_loss, scale);
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* x = logits + r * classes;
        float* g = grad_logits + r * classes;
        const cm::SoftmaxStats st = cm::softmax_stats(x, classes);
        for (std::int64_t c = 0; c < classes; ++c)
          g[c] = cm::cross_entropy_grad(factor, x[c], st.max, st.sum, c == targets[r]);
      }
    });
  }

  void mse(Stream& s, const float* x, const float* t, std::int64_t rows, std::int64_t cols,
           float* losses) override {
    if (rows <= 0) return;
    launch(s, "mse", KernelCost{3.0 * rows * cols, 8.0 * rows * cols + 4.0 * rows}, [=] {
      for (std::int64_t r = 0; r < rows; ++r)
        losses[r] = cm::squared_error_sum(x + r * cols, t + r * cols, cols);
    });
  }

  void mse_backward(Stream& s, const float* x, const float* t, std::int64_t n,
                    const float* grad_loss, float scale, float* gx) override {
    if (n <= 0) return;
    launch(s, "mse_backward", KernelCost{4.0 * n, 12.0 * n + 4}, [=] {
      const float factor = cm::mse_grad_factor(*grad_loss, scale);
      for (std::int64_t i = 0; i < n; ++i) gx[i] = cm::mse_grad(factor, x[i], t[i]);
    });
  }

  void sum(Stream& s, const float* x, std::int64_t n, float scale, float* out,
           Determinism mode) override {
    launch(s, "sum", KernelCost{double(n), 4.0 * n + 4}, [=] {
      float acc = 0.0f;
      if (mode == Determinism::fast) {
        if (n > 0) acc = ConstVecMap(x, n).sum();
      } else {
        for (std::int64_t i = 0; i < n; ++i) acc = cm::sum_step(acc, x[i]);
      }
      *out = cm::mul(scale, acc);
    });
  }

  void fill_f32(Stream& s, float* x, float value, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "fill_f32", KernelCost{0.0, 4.0 * n}, [=] { std::fill(x, x + n, value); });
  }

  void axpy(Stream& s, float alpha, const float* x, float* y, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "axpy", KernelCost{2.0 * n, 12.0 * n}, [=] {
      for (std::int64_t i = 0; i < n; ++i) y[i] = cm::axpy(alpha, x[i], y[i]);
    });
  }

  void scale(Stream& s, float alpha, float* x, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "scale", KernelCost{double(n), 8.0 * n}, [=] {
      for (std::int64_t i = 0; i < n; ++i) x[i] = cm::mul(alpha, x[i]);
    });
  }

  void sum_inputs(Stream& s, const float* const* inputs, int n_inputs, float* out,
                  std::int64_t numel, Determinism mode) override {
    if (numel <= 0) return;
    // The pointer array belongs to the caller: keep a copy for the asynchronous task.
    std::vector<const float*> in(inputs, inputs + std::max(n_inputs, 0));
    launch(s, "sum_inputs",
           KernelCost{double(std::max(n_inputs - 1, 0)) * numel,
                      4.0 * numel * (std::max(n_inputs, 0) + 1)},
           [in = std::move(in), out, numel, mode] {
             const auto n = static_cast<std::int64_t>(in.size());
             if (n == 0) {
               std::fill(out, out + numel, 0.0f);
               return;
             }
             if (mode == Determinism::fast) {  // left to right: ((in0 + in1) + in2) + ...
               if (out != in[0])
                 std::memcpy(out, in[0], static_cast<std::size_t>(numel) * sizeof(float));
               for (std::int64_t k = 1; k < n; ++k) {
                 const float* src = in[static_cast<std::size_t>(k)];
                 for (std::int64_t i = 0; i < numel; ++i) out[i] = cm::add(out[i], src[i]);
               }
               return;
             }
             float block[kBlock];  // out may alias in[0]: build each block aside, then store it
             for (std::int64_t base = 0; base < numel; base += kBlock) {
               const std::int64_t len = std::min(kBlock, numel - base);
               tree_sum_block(in, 0, n, base, len, block);
               std::memcpy(out + base, block, static_cast<std::size_t>(len) * sizeof(float));
             }
           });
  }

  void sgd_step(Stream& s, float* param, const float* grad, float* momentum_buf, std::int64_t n,
                float lr, float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    if (n <= 0) return;
    launch(s, "sgd_step", KernelCost{6.0 * n, (momentum_buf ? 20.0 : 12.0) * n}, [=] {
      // The common cases (no weight decay, no Nesterov) as branch-free loops over distinct
      // arrays, which the compiler vectorises: the same operations per element as
      // cm::sgd_update, in the same order (no contraction: -ffp-contract=off), so the same bits.
      const bool distinct = param != grad && param != momentum_buf && grad != momentum_buf;
      if (distinct && weight_decay == 0.0f && !nesterov) {
        float* __restrict p = param;
        const float* __restrict g = grad;
        float* __restrict b = momentum_buf;
        const float neg_lr = -lr;
        if (momentum == 0.0f) {
          for (std::int64_t i = 0; i < n; ++i) p[i] = cm::add(p[i], cm::mul(neg_lr, g[i]));
          return;
        }
        if (b != nullptr && first_step) {
          for (std::int64_t i = 0; i < n; ++i) {
            b[i] = g[i];
            p[i] = cm::add(p[i], cm::mul(neg_lr, g[i]));
          }
          return;
        }
        if (b != nullptr) {
          const float damp = cm::sub(1.0f, dampening);
          for (std::int64_t i = 0; i < n; ++i) {
            const float bi = cm::add(cm::mul(momentum, b[i]), cm::mul(damp, g[i]));
            b[i] = bi;
            p[i] = cm::add(p[i], cm::mul(neg_lr, bi));
          }
          return;
        }
      }
      for (std::int64_t i = 0; i < n; ++i)
        cm::sgd_update(param[i], grad[i], momentum_buf ? momentum_buf + i : nullptr, lr, momentum,
                       dampening, weight_decay, nesterov, first_step);
    });
  }

  // ---- micro-sharded batch reductions (Note [Micro-shards] in core/numerics/micro_shards.h)
  // -------------

  void gemm_tn_sharded(Stream& s, std::int64_t M, std::int64_t N, const float* A, std::int64_t lda,
                       const float* B, std::int64_t ldb, const std::vector<std::int64_t>& bounds,
                       float* C, std::int64_t ldc, bool accumulate) override {
    if (M <= 0 || N <= 0) return;
    // Bitwise mode's micro-sharded dW product: ditto's own SIMT kernel (Note [Compute units]).
    KernelCost cost{2.0 * M * N * bounds.back(),
                    4.0 * (double(bounds.back()) * (M + N) + (accumulate ? 2.0 : 1.0) * M * N),
                    true};
    cost.path = GemmPath::simt;
    launch(s, "gemm_tn_sharded", cost, [=, bounds = bounds] {
      gemm_tn_sharded_split(M, N, A, lda, B, ldb, bounds, C, ldc, accumulate);
    });
  }

  // The typed sharded dW (Note [Typed kernels]): a dry run takes CUDA's path
  // (cuda_host_logic.h's typed_sharded_gemm_supported: dY and X of one of f32, bf16, f16, dW of
  // any of them), the same kernel with its operand bytes in their storage dtypes, no f32 copies.
  // A real run keeps Kernels' default (false): MixedOp's f32 scratch, its bits.
  bool has_gemm_tn_sharded_ex(DType a_type, DType b_type, DType c_type) const override {
    auto storage = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
    return cost_->dry_run() && storage(a_type) && b_type == a_type && storage(c_type);
  }

  void gemm_tn_sharded_ex(Stream& s, std::int64_t M, std::int64_t N, const void* A, DType a_type,
                          std::int64_t lda, const void* B, DType b_type, std::int64_t ldb,
                          const std::vector<std::int64_t>& bounds, void* C, DType c_type,
                          std::int64_t ldc, bool accumulate) override {
    if (!cost_->dry_run())  // throws: has_gemm_tn_sharded_ex is false
      return Kernels::gemm_tn_sharded_ex(s, M, N, A, a_type, lda, B, b_type, ldb, bounds, C, c_type,
                                         ldc, accumulate);
    if (M <= 0 || N <= 0) return;
    const double rows = static_cast<double>(bounds.back());
    KernelCost cost{2.0 * M * N * rows,
                    rows * (double(dtype_size(a_type)) * M + double(dtype_size(b_type)) * N) +
                        (accumulate ? 2.0 : 1.0) * double(dtype_size(c_type)) * M * N,
                    true};
    cost.path = GemmPath::simt;
    cost.operands = a_type;
    price(s, "gemm_tn_sharded_ex", cost);
  }

  void sum_rows_sharded(Stream& s, const float* x, std::int64_t rows, std::int64_t cols,
                        const std::vector<std::int64_t>& bounds, float* out,
                        bool accumulate) override {
    if (cols <= 0) return;
    launch(
        s, "sum_rows_sharded", KernelCost{double(rows) * cols, 4.0 * (double(rows) * cols + cols)},
        [=, bounds = bounds] {
          const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
          std::vector<float> scratch(static_cast<std::size_t>((tree_depth(shards) + 1) * kBlock));
          for (std::int64_t c0 = 0; c0 < cols; c0 += kBlock) {
            const std::int64_t len = std::min(kBlock, cols - c0);
            // Ascending rows of the shard per column, vectorised across the block of columns.
            auto leaf = [&](std::int64_t sh, float* acc) {
              for (std::int64_t c = 0; c < len; ++c) acc[c] = 0.0f;
              const std::int64_t r1 = bounds[static_cast<std::size_t>(sh) + 1];
              for (std::int64_t r = bounds[static_cast<std::size_t>(sh)]; r < r1; ++r) {
                const float* xr = x + r * cols + c0;
                for (std::int64_t c = 0; c < len; ++c) acc[c] = cm::sum_step(acc[c], xr[c]);
              }
            };
            float* root = scratch.data();
            shard_tree(leaf, 0, shards, root, root + len, len, 0);
            float* o = out + c0;
            if (accumulate)
              for (std::int64_t c = 0; c < len; ++c) o[c] = cm::add(o[c], root[c]);
            else
              for (std::int64_t c = 0; c < len; ++c) o[c] = root[c];
          }
        });
  }

  void sum_sharded(Stream& s, const float* x, const std::vector<std::int64_t>& bounds, float scale,
                   float* out) override {
    launch(s, "sum_sharded", KernelCost{double(bounds.back()), 4.0 * bounds.back() + 4},
           [=, bounds = bounds] {
             const auto shards = static_cast<std::int64_t>(bounds.size()) - 1;
             std::vector<float> scratch(static_cast<std::size_t>(tree_depth(shards) + 1));
             auto leaf = [&](std::int64_t sh, float* acc) {
               float a = 0.0f;
               const std::int64_t i1 = bounds[static_cast<std::size_t>(sh) + 1];
               for (std::int64_t i = bounds[static_cast<std::size_t>(sh)]; i < i1; ++i)
                 a = cm::sum_step(a, x[i]);
               *acc = a;
             };
             shard_tree(leaf, 0, shards, scratch.data(), scratch.data() + 1, 1, 0);
             *out = cm::mul(scale, scratch[0]);
           });
  }

  // ---- the typed reductions over rows (Note [Typed kernels], cost_model.h) -------------------
  // A dry run predicts the CUDA backend, which sums bf16 / f16 rows natively in both modes
  // (cuda_host_logic.h's typed_sum_rows_supported): ops::sum_rows / sum_rows_sharded then call
  // these, each priced as one launch over x and out in their dtypes (sum_rows_ex_cost; fast
  // sum_rows_ex: fast_sum_rows_cost, CUDA's partials where it splits the rows), no casts.
  // A real run keeps Kernels' default (false): MixedOp's f32 scratch and the f32 kernels.
  bool has_sum_rows_ex(DType x_type, DType out_type, Determinism mode) const override {
    return cost_->dry_run() && (x_type == DType::bf16 || x_type == DType::f16) &&
           (out_type == x_type || out_type == DType::f32) && is_valid_determinism(mode);
  }

  void sum_rows_ex(Stream& s, const void* x, DType x_type, std::int64_t rows, std::int64_t cols,
                   float beta, void* out, DType out_type, Determinism mode) override {
    if (!cost_->dry_run())  // throws: has_sum_rows_ex is false
      return Kernels::sum_rows_ex(s, x, x_type, rows, cols, beta, out, out_type, mode);
    if (cols <= 0) return;
    price(s, "sum_rows_ex",
          mode == Determinism::fast ? fast_sum_rows_cost(rows, cols, x_type, out_type)
                                    : sum_rows_ex_cost(rows, cols, x_type, out_type));
  }

  void sum_rows_sharded_ex(Stream& s, const void* x, DType x_type, std::int64_t rows,
                           std::int64_t cols, const std::vector<std::int64_t>& bounds, void* out,
                           DType out_type, bool accumulate) override {
    if (!cost_->dry_run())  // throws: has_sum_rows_ex is false
      return Kernels::sum_rows_sharded_ex(s, x, x_type, rows, cols, bounds, out, out_type,
                                          accumulate);
    if (cols <= 0) return;
    price(s, "sum_rows_sharded_ex", sum_rows_ex_cost(rows, cols, x_type, out_type));
  }

  void adam_step(Stream& s, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, std::int64_t n, double lr, double beta1, double beta2,
                 double eps, double weight_decay, double bias_correction1, double bias_correction2,
                 bool amsgrad) override {
    if (n <= 0) return;
    const cm::AdamScalars k = cm::adam_scalars(lr, beta1, beta2, eps, weight_decay,
                                               bias_correction1, bias_correction2, amsgrad);
    launch(s, "adam_step", KernelCost{16.0 * n, (amsgrad ? 36.0 : 28.0) * n}, [=] {
      for (std::int64_t i = 0; i < n; ++i)
        cm::adam_update(param[i], grad[i], exp_avg[i], exp_avg_sq[i],
                        k.amsgrad ? max_exp_avg_sq + i : nullptr, k);
    });
  }

  // ---- transformer kernels (sim_kernels_gpt.cpp; Note [GPT kernels] in core/numerics/gpt_math.h)

  void embedding_forward(Stream& s, const std::int64_t* idx, const float* wte, const float* wpe,
                         std::int64_t N, std::int64_t T, std::int64_t C, float* out) override {
    if (N <= 0 || C <= 0) return;
    launch(s, "embedding_forward", gk::embedding_forward_cost(N, C, wpe != nullptr),
           [=] { gk::embedding_forward(idx, wte, wpe, N, T, C, out); });
  }

  void embedding_backward(Stream& s, const std::int64_t* idx, const float* dy, std::int64_t N,
                          std::int64_t C, std::int64_t V, const std::vector<std::int64_t>& bounds,
                          float* grad_wte, bool accumulate) override {
    if (V <= 0 || C <= 0) return;
    KernelCost cost = gk::embedding_backward_cost(N, C, V, accumulate);
    if (cost_->dry_run()) cost.launches = N > 0 ? 6 : 3;  // CUDA's (Note [Predicted launches])
    launch(s, "embedding_backward", cost, [=, bounds = bounds] {
      gk::embedding_backward(idx, dy, N, C, V, bounds, grad_wte, accumulate);
    });
  }

  void layernorm_forward(Stream& s, const float* x, const float* w, const float* b, std::int64_t N,
                         std::int64_t C, float eps, float* y, float* mean, float* rstd) override {
    if (N <= 0 || C <= 0) return;
    launch(s, "layernorm_forward", gk::layernorm_forward_cost(N, C),
           [=] { gk::layernorm_forward(x, w, b, N, C, eps, y, mean, rstd); });
  }

  void layernorm_backward(Stream& s, const float* dy, const float* x, const float* w,
                          const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                          float* dx, float* dy_xhat) override {
    if (N <= 0 || C <= 0) return;
    launch(s, "layernorm_backward", gk::layernorm_backward_cost(N, C),
           [=] { gk::layernorm_backward(dy, x, w, mean, rstd, N, C, dx, dy_xhat); });
  }

  void gelu_forward(Stream& s, const float* x, float* y, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "gelu_forward", gk::gelu_cost(n, false), [=] { gk::gelu_forward(x, y, n); });
  }

  void gelu_backward(Stream& s, const float* x, const float* gy, float* gx,
                     std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "gelu_backward", gk::gelu_cost(n, true), [=] { gk::gelu_backward(x, gy, gx, n); });
  }

  void attention_forward(Stream& s, const float* qkv, std::int64_t B, std::int64_t T,
                         std::int64_t C, std::int64_t nh, float* y, float* stats, float p,
                         std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base,
                         Determinism /*mode: one order (Note [GPT kernels]) in both*/) override {
    if (B <= 0 || T <= 0 || C <= 0) return;
    const gpt::AttentionDropout drop{p, seed, stream, index_base};
    launch(s, "attention_forward", gk::attention_forward_cost(B, T, C, nh, drop.active()),
           [=] { gk::attention_forward(qkv, B, T, C, nh, y, stats, drop); });
  }

  // A real run computes pd itself in both modes (y unused: the simulator's bits); a dry run
  // prices CUDA's kernels: given y in fast mode, the tiled dq kernel reads pd = rowsum(dy * y)
  // from it (7 products, not 9; head widths up to 128, as cuda_attention.cu's head_class).
  void attention_backward(Stream& s, const float* dy, const float* qkv, const float* y,
                          const float* stats, std::int64_t B, std::int64_t T, std::int64_t C,
                          std::int64_t nh, float* dqkv, float* scratch, float p, std::uint64_t seed,
                          std::uint64_t stream, std::uint64_t index_base,
                          Determinism mode) override {
    if (B <= 0 || T <= 0 || C <= 0) return;
    const gpt::AttentionDropout drop{p, seed, stream, index_base};
    const bool dry = cost_->dry_run();
    const bool d_from_y = dry && y != nullptr && mode == Determinism::fast && C / nh <= 128 &&
                          B * nh <= std::int64_t(0x7fffffff);
    KernelCost cost = gk::attention_backward_cost(B, T, C, nh, drop.active(), d_from_y);
    if (dry) cost.launches = 2;  // per query tile, per key tile (cuda_attention.cu)
    launch(s, "attention_backward", cost,
           [=] { gk::attention_backward(dy, qkv, stats, B, T, C, nh, dqkv, scratch, drop); });
  }

  void dropout_forward(Stream& s, const float* x, float* y, std::int64_t n, float p,
                       std::uint64_t seed, std::uint64_t stream,
                       std::uint64_t index_base) override {
    launch_dropout(s, "dropout_forward", x, y, n, p, seed, stream, index_base);
  }

  void dropout_backward(Stream& s, const float* gy, float* gx, std::int64_t n, float p,
                        std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t index_base) override {
    launch_dropout(s, "dropout_backward", gy, gx, n, p, seed, stream, index_base);
  }

  void sum_squares(Stream& s, const float* x, std::int64_t n, float* out,
                   Determinism mode) override {
    launch(s, "sum_squares", gk::sum_squares_cost(n), [=] { *out = gk::sum_squares(x, n, mode); });
  }

  void sum_squares_blocks(Stream& s, const float* x, std::int64_t n, float* out) override {
    launch(s, "sum_squares_blocks", gk::sum_squares_cost(n), [=] {
      for (std::int64_t j = 0, lo = 0; lo < n; ++j, lo += gpt::kSquaresBlock)
        out[j] = gpt::squares_chain(x + lo, std::min(gpt::kSquaresBlock, n - lo));
    });
  }

  // ---- the typed row kernels (Note [Typed kernels], cost_model.h) ----------------------------
  // A dry run predicts the CUDA backend, which runs the GPT step's row ops on bf16 / f16 in both
  // modes (CudaGptKernels::has_rows_ex): ops then call these, each priced as its f32 kernel with
  // the tensors' bytes in the storage dtype (storage_cost; LayerNorm's mean and rstd, losses and
  // token ids stay as they are), one launch and no casts. A real run keeps Kernels' default
  // (false): MixedOp's f32 scratch and the f32 kernels, their bits.
  bool has_rows_ex(DType storage, Determinism mode) const override {
    return cost_->dry_run() && (storage == DType::bf16 || storage == DType::f16) &&
           is_valid_determinism(mode);
  }

  void embedding_forward_ex(Stream& s, DType dtype, const std::int64_t* idx, const void* wte,
                            const void* wpe, std::int64_t N, std::int64_t T, std::int64_t C,
                            void* out) override {
    if (!cost_->dry_run())  // throws: has_rows_ex is false
      return Kernels::embedding_forward_ex(s, dtype, idx, wte, wpe, N, T, C, out);
    if (N <= 0 || C <= 0) return;
    price(s, "embedding_forward_ex",
          storage_cost(gk::embedding_forward_cost(N, C, wpe != nullptr), dtype, 8.0 * N));
  }

  // dy in the storage dtype; grad_wte in it too (fast mode) or f32 (bitwise mode's gradients):
  // embedding_backward_ex_cost, CUDA's launches.
  void embedding_backward_ex(Stream& s, DType dtype, const std::int64_t* idx, const void* dy,
                             std::int64_t N, std::int64_t C, std::int64_t V,
                             const std::vector<std::int64_t>& bounds, DType grad_type,
                             void* grad_wte, bool accumulate) override {
    if (!cost_->dry_run())
      return Kernels::embedding_backward_ex(s, dtype, idx, dy, N, C, V, bounds, grad_type, grad_wte,
                                            accumulate);
    if (V <= 0 || C <= 0) return;
    KernelCost cost = gk::embedding_backward_ex_cost(N, C, V, accumulate, dtype, grad_type);
    cost.launches = N > 0 ? 6 : 3;  // as embedding_backward's (Note [Predicted launches])
    price(s, "embedding_backward_ex", cost);
  }

  void layernorm_forward_ex(Stream& s, DType dtype, const void* x, const void* w, const void* b,
                            std::int64_t N, std::int64_t C, float eps, void* y, float* mean,
                            float* rstd) override {
    if (!cost_->dry_run())
      return Kernels::layernorm_forward_ex(s, dtype, x, w, b, N, C, eps, y, mean, rstd);
    if (N <= 0 || C <= 0) return;
    price(s, "layernorm_forward_ex",
          storage_cost(gk::layernorm_forward_cost(N, C), dtype, 8.0 * N));
  }

  void layernorm_backward_ex(Stream& s, DType dtype, const void* dy, const void* x, const void* w,
                             const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                             void* dx, void* dy_xhat) override {
    if (!cost_->dry_run())
      return Kernels::layernorm_backward_ex(s, dtype, dy, x, w, mean, rstd, N, C, dx, dy_xhat);
    if (N <= 0 || C <= 0) return;
    price(s, "layernorm_backward_ex",
          storage_cost(gk::layernorm_backward_cost(N, C), dtype, 8.0 * N));
  }

  // The residual add folded into the LayerNorm forward after it (CudaGptKernels answers true for
  // f32, bf16 and f16): a dry run prices CUDA's one launch, the tensors in `dtype`, mean and rstd
  // f32. A real run keeps Kernels' false: ops::add and layernorm_forward(_ex), their bits.
  bool has_layernorm_forward_add(DType dtype) const override {
    return cost_->dry_run() && (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }

  void layernorm_forward_add(Stream& s, DType dtype, const void* x, const void* branch,
                             const void* w, const void* b, std::int64_t N, std::int64_t C,
                             float eps, void* residual, void* y, float* mean,
                             float* rstd) override {
    if (!cost_->dry_run())
      return Kernels::layernorm_forward_add(s, dtype, x, branch, w, b, N, C, eps, residual, y, mean,
                                            rstd);
    if (N <= 0 || C <= 0) return;
    price(s, "layernorm_forward_add",
          storage_cost(gk::layernorm_forward_add_cost(N, C), dtype, 8.0 * N));
  }

  // The residual gradient's add folded into the LayerNorm backward (CudaGptKernels answers true
  // for f32, bf16 and f16): a dry run prices CUDA's one launch, the tensors in `dtype`, mean and
  // rstd f32. A real run keeps Kernels' false: layernorm_backward(_ex) and ops::add, their bits.
  bool has_layernorm_backward_add(DType dtype) const override {
    return cost_->dry_run() && (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }

  void layernorm_backward_add(Stream& s, DType dtype, const void* dy, const void* x, const void* w,
                              const float* mean, const float* rstd, const void* residual,
                              std::int64_t N, std::int64_t C, void* out, void* dy_xhat) override {
    if (!cost_->dry_run())
      return Kernels::layernorm_backward_add(s, dtype, dy, x, w, mean, rstd, residual, N, C, out,
                                             dy_xhat);
    if (N <= 0 || C <= 0) return;
    price(s, "layernorm_backward_add",
          storage_cost(gk::layernorm_backward_add_cost(N, C), dtype, 8.0 * N));
  }

  // The LayerNorm backward with its parameter gradients (CudaGptKernels answers true for f32,
  // bf16 and f16 in fast mode): a dry run prices CUDA's one launch
  // (layernorm_backward_params_cost). A real run keeps Kernels' false: layernorm_backward(_ex)
  // (or the residual's add) and the two row sums, their bits.
  bool has_layernorm_backward_params(DType dtype, Determinism mode) const override {
    return cost_->dry_run() && mode == Determinism::fast &&
           (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }

  void layernorm_backward_params(Stream& s, DType dtype, const void* dy, const void* x,
                                 const void* w, const float* mean, const float* rstd,
                                 const void* residual, std::int64_t N, std::int64_t C, void* dx,
                                 DType grad_type, void* grad_w, bool accumulate_w, void* grad_b,
                                 bool accumulate_b) override {
    if (!cost_->dry_run())
      return Kernels::layernorm_backward_params(s, dtype, dy, x, w, mean, rstd, residual, N, C, dx,
                                                grad_type, grad_w, accumulate_w, grad_b,
                                                accumulate_b);
    if (C <= 0) return;
    price(s, "layernorm_backward_params",
          layernorm_backward_params_cost(N, C, dtype, grad_type, residual != nullptr,
                                         grad_b != nullptr, accumulate_w, accumulate_b));
  }

  void gelu_forward_ex(Stream& s, DType dtype, const void* x, void* y, std::int64_t n) override {
    if (!cost_->dry_run()) return Kernels::gelu_forward_ex(s, dtype, x, y, n);
    if (n <= 0) return;
    price(s, "gelu_forward_ex", storage_cost(gk::gelu_cost(n, false), dtype, 0.0));
  }

  void gelu_backward_ex(Stream& s, DType dtype, const void* x, const void* gy, void* gx,
                        std::int64_t n) override {
    if (!cost_->dry_run()) return Kernels::gelu_backward_ex(s, dtype, x, gy, gx, n);
    if (n <= 0) return;
    price(s, "gelu_backward_ex", storage_cost(gk::gelu_cost(n, true), dtype, 0.0));
  }

  void cross_entropy_ex(Stream& s, DType dtype, const void* logits, const std::int64_t* targets,
                        std::int64_t rows, std::int64_t classes, float* losses) override {
    if (!cost_->dry_run())
      return Kernels::cross_entropy_ex(s, dtype, logits, targets, rows, classes, losses);
    if (rows <= 0 || classes <= 0) return;
    price(s, "cross_entropy_ex",
          storage_cost(cross_entropy_cost(rows, classes), dtype, 12.0 * rows));
  }

  void cross_entropy_backward_ex(Stream& s, DType dtype, const void* logits,
                                 const std::int64_t* targets, std::int64_t rows,
                                 std::int64_t classes, const float* grad_loss, float scale,
                                 void* grad_logits) override {
    if (!cost_->dry_run())
      return Kernels::cross_entropy_backward_ex(s, dtype, logits, targets, rows, classes, grad_loss,
                                                scale, grad_logits);
    if (rows <= 0 || classes <= 0) return;
    price(s, "cross_entropy_backward_ex",
          storage_cost(cross_entropy_backward_cost(rows, classes), dtype, 8.0 * rows + 4.0));
  }

  // The cross-entropy's forward and backward in one pass (CudaGptKernels answers true for f32,
  // bf16 and f16 in fast mode): a dry run prices CUDA's one launch, the gradient over the logits
  // (no [rows, classes] buffer). A real run keeps Kernels' false: cross_entropy(_ex) and
  // cross_entropy_backward(_ex), their bits.
  bool has_cross_entropy_fused(DType dtype, Determinism mode) const override {
    return cost_->dry_run() && mode == Determinism::fast &&
           (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16);
  }

  void cross_entropy_fused(Stream& s, DType dtype, void* logits, const std::int64_t* targets,
                           std::int64_t rows, std::int64_t classes, const float* grad_loss,
                           float scale, float* losses) override {
    if (!cost_->dry_run())
      return Kernels::cross_entropy_fused(s, dtype, logits, targets, rows, classes, grad_loss,
                                          scale, losses);
    if (rows <= 0 || classes <= 0) return;
    price(s, "cross_entropy_fused",
          storage_cost(cross_entropy_fused_cost(rows, classes), dtype, 12.0 * rows + 4.0));
  }

  void dropout_forward_ex(Stream& s, DType dtype, const void* x, void* y, std::int64_t n, float p,
                          std::uint64_t seed, std::uint64_t stream,
                          std::uint64_t index_base) override {
    if (!cost_->dry_run())
      return Kernels::dropout_forward_ex(s, dtype, x, y, n, p, seed, stream, index_base);
    if (n <= 0) return;
    price(s, "dropout_forward_ex", storage_cost(gk::dropout_cost(n), dtype, 0.0));
  }

  void dropout_backward_ex(Stream& s, DType dtype, const void* gy, void* gx, std::int64_t n,
                           float p, std::uint64_t seed, std::uint64_t stream,
                           std::uint64_t index_base) override {
    if (!cost_->dry_run())
      return Kernels::dropout_backward_ex(s, dtype, gy, gx, n, p, seed, stream, index_base);
    if (n <= 0) return;
    price(s, "dropout_backward_ex", storage_cost(gk::dropout_cost(n), dtype, 0.0));
  }

  // ---- the typed attention (Note [Typed kernels], cost_model.h) ------------------------------
  // A dry run predicts the CUDA backend, which runs bf16 / f16 attention natively for head
  // widths up to 128 in both modes (CudaGptKernels::has_attention_ex): ops::attention then calls
  // these, priced as CUDA's kernels (attention_ex_cost). A real run keeps Kernels' default
  // (false): MixedOp's f32 scratch and the f32 kernels, their bits.
  bool has_attention_ex(DType qkv_type, std::int64_t head_dim, Determinism mode) const override {
    return cost_->dry_run() && (qkv_type == DType::bf16 || qkv_type == DType::f16) &&
           head_dim >= 1 && head_dim <= 128 && is_valid_determinism(mode);
  }

  void attention_forward_ex(Stream& s, const void* qkv, DType dtype, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t nh, void* y, float* stats, float p,
                            std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base,
                            Determinism mode) override {
    if (!cost_->dry_run())  // throws: has_attention_ex is false
      return Kernels::attention_forward_ex(s, qkv, dtype, B, T, C, nh, y, stats, p, seed, stream,
                                           index_base, mode);
    if (B <= 0 || T <= 0) return;
    price(s, "attention_forward_ex", attention_ex_cost(B, T, C, nh, dtype, mode, false, p > 0.0f));
  }

  // Given y, CUDA's tensor-core backward reads D = rowsum(dy * y) from it: 7 products, not 9.
  void attention_backward_ex(Stream& s, const void* dy, const void* qkv, const void* y, DType dtype,
                             const float* stats, std::int64_t B, std::int64_t T, std::int64_t C,
                             std::int64_t nh, void* dqkv, float* scratch, float p,
                             std::uint64_t seed, std::uint64_t stream, std::uint64_t index_base,
                             Determinism mode) override {
    if (!cost_->dry_run())
      return Kernels::attention_backward_ex(s, dy, qkv, y, dtype, stats, B, T, C, nh, dqkv, scratch,
                                            p, seed, stream, index_base, mode);
    if (B <= 0 || T <= 0) return;
    price(s, "attention_backward_ex",
          attention_ex_cost(B, T, C, nh, dtype, mode, true, p > 0.0f, y != nullptr));
  }

  // ---- the optimizer's multi-tensor kernels (Note [Predicted launches], cost_model.h) --------
  // A dry run predicts the CUDA backend, so it takes CUDA's path: has_multi_tensor_kernels()
  // true, and each call priced as the launches backend_cuda/cuda_multi_tensor.cu makes (their
  // bits are the per-tensor kernels', so only the price differs; a dry run runs no work). A real
  // run keeps the per-tensor kernels of Kernels' defaults (their launches, virtual time, trace).

  bool has_multi_tensor_kernels() const override { return cost_->dry_run(); }

  void adam_step_multi(Stream& s, const std::vector<AdamTensor>& tensors, double lr, double beta1,
                       double beta2, double eps, double weight_decay, bool amsgrad) override {
    if (!cost_->dry_run())
      return Kernels::adam_step_multi(s, tensors, lr, beta1, beta2, eps, weight_decay, amsgrad);
    std::vector<std::int64_t> ns;
    std::vector<bool> decay;
    for (const AdamTensor& t : tensors) {
      ns.push_back(t.n);
      decay.push_back(t.decay);
    }
    for (const KernelCost& c : adam_step_multi_costs(ns, decay, amsgrad))
      price(s, "adam_step_multi", c);
  }

  void sum_squares_multi(Stream& s, const std::vector<const float*>& xs,
                         const std::vector<std::int64_t>& ns, float* out,
                         Determinism mode) override {
    if (!cost_->dry_run()) return Kernels::sum_squares_multi(s, xs, ns, out, mode);
    for (const KernelCost& c : sum_squares_multi_costs(ns, mode)) price(s, "sum_squares_multi", c);
  }

  void scale_multi(Stream& s, const std::vector<float*>& xs, const std::vector<std::int64_t>& ns,
                   float alpha) override {
    if (!cost_->dry_run()) return Kernels::scale_multi(s, xs, ns, alpha);
    for (const KernelCost& c : scale_multi_costs(ns)) price(s, "scale_multi", c);
  }

  void fill_multi(Stream& s, const std::vector<float*>& xs, const std::vector<std::int64_t>& ns,
                  float value) override {
    if (!cost_->dry_run()) return Kernels::fill_multi(s, xs, ns, value);
    for (const KernelCost& c : fill_multi_costs(ns)) price(s, "fill_multi", c);
  }

  // ZeRO-1's buffer packing and its masters' rounding (core/optim/zero.h): a real run keeps the
  // per-piece casts of Kernels' default (ZeroRedundancyOptimizer copies piece by piece there,
  // has_multi_tensor_kernels being false).
  void copy_multi(Stream& s, DType from, DType to, const std::vector<const void*>& srcs,
                  const std::vector<void*>& dsts, const std::vector<std::int64_t>& ns) override {
    if (!cost_->dry_run()) return Kernels::copy_multi(s, from, to, srcs, dsts, ns);
    for (const KernelCost& c : copy_multi_costs(ns, from, to))
      price(s, from == to ? "copy_multi" : "cast_multi", c);
  }

  // Typed (Note [Typed optimizer step], core/optim/master_weights.h): a dry run answers as
  // CUDA (f32, bf16, f16) and prices CUDA's launches over the storage-dtype bytes; a real run
  // says no (Kernels' defaults), so optim::MasterWeights keeps its f32 path and bits.
  bool has_multi_tensor_ex(DType t) const override {
    return cost_->dry_run() && (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }

  void adam_step_multi_ex(Stream& s, const std::vector<AdamTensorEx>& tensors, double lr,
                          double beta1, double beta2, double eps, double weight_decay, bool amsgrad,
                          bool scale_grads, float grad_scale) override {
    if (!cost_->dry_run())  // throws: has_multi_tensor_ex is false
      return Kernels::adam_step_multi_ex(s, tensors, lr, beta1, beta2, eps, weight_decay, amsgrad,
                                         scale_grads, grad_scale);
    std::vector<std::int64_t> ns;
    std::vector<bool> decay;
    std::vector<int> grad_bytes, model_bytes;
    for (const AdamTensorEx& t : tensors) {
      ns.push_back(t.n);
      decay.push_back(t.decay);
      grad_bytes.push_back(static_cast<int>(dtype_size(t.grad_type)));
      model_bytes.push_back(t.model != nullptr ? static_cast<int>(dtype_size(t.model_type)) : 0);
    }
    for (const KernelCost& c :
         adam_step_multi_ex_costs(ns, decay, grad_bytes, model_bytes, amsgrad, scale_grads))
      price(s, "adam_step_multi_ex", c);
  }

  void sum_squares_multi_ex(Stream& s, const std::vector<const void*>& xs,
                            const std::vector<DType>& types, const std::vector<std::int64_t>& ns,
                            float* out, Determinism mode) override {
    if (!cost_->dry_run()) return Kernels::sum_squares_multi_ex(s, xs, types, ns, out, mode);
    std::vector<int> bytes;
    for (DType t : types) bytes.push_back(static_cast<int>(dtype_size(t)));
    for (const KernelCost& c : sum_squares_multi_ex_costs(ns, bytes, mode))
      price(s, "sum_squares_multi_ex", c);
  }

 private:
  // Dropout forward and backward: the same mask, recomputed (Note [Dropout masks]).
  // ---- dtype-generic kernels (sim_kernels_dtype.h) ----

  void cast(Stream& s, const void* x, DType from, void* y, DType to, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "cast", dk::cast_cost(from, to, n), [=] { dk::cast(x, from, y, to, n); });
  }
  void fill_bits(Stream& s, void* x, std::size_t elem_size, std::uint64_t bits,
                 std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "fill_bits", dk::fill_bits_cost(elem_size, n),
           [=] { dk::fill_bits(x, elem_size, bits, n); });
  }
  void add_any(Stream& s, DType t, const void* a, const void* b, void* out,
               std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "add_any", dk::elementwise_cost(t, n, 2), [=] { dk::add_any(t, a, b, out, n); });
  }
  void scale_any(Stream& s, DType t, void* x, double alpha, std::int64_t n) override {
    if (n <= 0) return;
    launch(s, "scale_any", dk::elementwise_cost(t, n, 1), [=] { dk::scale_any(t, x, alpha, n); });
  }
  void reduce_inputs(Stream& s, DType t, const void* const* inputs, int n_inputs, void* out,
                     std::int64_t numel, int op, Determinism mode) override {
    if (numel <= 0 || n_inputs <= 0) return;
    // The pointer array belongs to the caller: keep a copy for the asynchronous task.
    std::vector<const void*> in(inputs, inputs + n_inputs);
    launch(s, "reduce_inputs", dk::reduce_inputs_cost(t, n_inputs, numel),
           [=, in = std::move(in)] { dk::reduce_inputs(t, in, out, numel, op, mode); });
  }

  void launch_dropout(Stream& s, const char* name, const float* x, float* y, std::int64_t n,
                      float p, std::uint64_t seed, std::uint64_t stream, std::uint64_t base) {
    if (n <= 0) return;
    launch(s, name, gk::dropout_cost(n), [=] { gk::dropout(x, y, n, p, seed, stream, base); });
  }

  // Enqueue `work` on `s`; once it has run, the cost model advances the stream's virtual clock by
  // the kernel's roofline time (Note [Virtual time], cost_model.h). The cost model only observes.
  // Note [Mixed precision] (core/runtime/mixed_precision.h): a kernel enqueued inside a
  // ConversionScope (the f32 scratch's casts) costs nothing and leaves no trace event; one
  // enqueued inside a StorageDTypeScope of bf16 / f16 is priced as the native kernel over that
  // dtype (native_cost). In a dry run `work` is skipped and only the price is paid (Note [Dry
  // run], sim_backend.h), and the price is the CUDA backend's (Note [Predicted launches],
  // cost_model.h): the scratch's casts are cast launches (ledger row cast_f32_scratch), the
  // kernel inside the scope the f32 kernel over the scratch.
  // A kernel below kInlineFlops and kInlineBytes may run on the launching thread (Note [Inline
  // work], sim_stream.cpp).
  template <typename F>
  void launch(Stream& s, const char* name, const KernelCost& cost, F&& work) {
    SimStream& ss = as_sim(s, name);
    const bool is_short = cost.flops <= kInlineFlops && cost.bytes <= kInlineBytes;
    auto submit = [&](std::function<void()> task) {
      if (is_short)
        ss.enqueue_short(std::move(task));
      else
        ss.enqueue(std::move(task));
    };
    if (cost_->dry_run()) {  // priced as CUDA runs it, not run
      const char* as = in_conversion_scope() ? "cast_f32_scratch" : name;
      submit([&ss, cm = cost_, as, cost] { cm->on_kernel(ss, as, cost); });
      return;
    }
    if (in_conversion_scope()) {
      submit([work = std::forward<F>(work)]() mutable { work(); });
      return;
    }
    submit([&ss, cm = cost_, name, cost = native_cost(cost, current_storage_dtype()),
            work = std::forward<F>(work)]() mutable {
      work();
      cm->on_kernel(ss, name, cost);
    });
  }

  // A dry run's launch priced as `cost` (no work, no native_cost: the cost is already the CUDA
  // backend's, in its operands' dtypes).
  void price(Stream& s, const char* name, const KernelCost& cost) {
    SimStream& ss = as_sim(s, name);
    ss.enqueue_short([&ss, cm = cost_, name, cost] { cm->on_kernel(ss, name, cost); });
  }

  std::shared_ptr<CostModel> cost_;
};

}  // namespace

std::unique_ptr<Kernels> make_sim_kernels(std::shared_ptr<CostModel> cost) {
  return std::make_unique<SimKernels>(std::move(cost));
}

}  // namespace ditto::sim
