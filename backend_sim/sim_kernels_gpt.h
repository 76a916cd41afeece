// The simulator's transformer kernels (Kernels::embedding_forward .. sum_squares): the work each
// runs once its stream reaches it, and its KernelCost for the cost model. SimKernels
// (sim_kernels.cpp) enqueues them. Every function follows Note [GPT kernels]
// (core/numerics/gpt_math.h) to the bit; the loops are arranged for speed (keys transposed per
// head so that independent chains vectorise) without changing any chain.
#pragma once

#include <cstdint>
#include <vector>

#include "backend_sim/cost_model.h"
#include "core/numerics/determinism.h"
#include "core/numerics/gpt_math.h"

namespace ditto::sim::gpt_kernels {

void embedding_forward(const std::int64_t* idx, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t T, std::int64_t C, float* out);
KernelCost embedding_forward_cost(std::int64_t N, std::int64_t C, bool wpe);

void embedding_backward(const std::int64_t* idx, const float* dy, std::int64_t N, std::int64_t C,
                        std::int64_t V, const std::vector<std::int64_t>& bounds, float* grad_wte,
                        bool accumulate);
KernelCost embedding_backward_cost(std::int64_t N, std::int64_t C, std::int64_t V, bool accumulate);
/// Kernels::embedding_backward_ex's cost (Note [Typed kernels], cost_model.h): the f32 kernel's
/// FLOPs, dy's N x C elements in `storage`, grad_wte's V x C (twice with accumulate) in
/// `grad_type`, the ids 8 bytes a row; operands `storage`.
KernelCost embedding_backward_ex_cost(std::int64_t N, std::int64_t C, std::int64_t V,
                                      bool accumulate, DType storage, DType grad_type);

void layernorm_forward(const float* x, const float* w, const float* b, std::int64_t N,
                       std::int64_t C, float eps, float* y, float* mean, float* rstd);
KernelCost layernorm_forward_cost(std::int64_t N, std::int64_t C);
/// Kernels::layernorm_forward_add's f32 cost (a dry run prices CUDA's kernel): the residual's
/// add and layernorm_forward's, one FLOP an element more, x and branch read, the residual and y
/// written (N x C each; the kernel's re-reads of its own row are not counted, as the forward's
/// three passes over x are not).
KernelCost layernorm_forward_add_cost(std::int64_t N, std::int64_t C);

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, std::int64_t N, std::int64_t C, float* dx,
                        float* dy_xhat);
KernelCost layernorm_backward_cost(std::int64_t N, std::int64_t C);
/// Kernels::layernorm_backward_add's f32 cost (a dry run prices CUDA's kernel):
/// layernorm_backward's and the residual's add, one FLOP and one read of N x C more; dx is written
/// once, as the sum.
KernelCost layernorm_backward_add_cost(std::int64_t N, std::int64_t C);

void gelu_forward(const float* x, float* y, std::int64_t n);
void gelu_backward(const float* x, const float* gy, float* gx, std::int64_t n);
KernelCost gelu_cost(std::int64_t n, bool backward);

/// Kernels::attention_forward with the dropout key `drop` (inactive: no mask drawn): y and the
/// softmax stats [B, nh, T, 2] (Note [Attention memory] in core/numerics/gpt_math.h).
void attention_forward(const float* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
                       std::int64_t nh, float* y, float* stats, const gpt::AttentionDropout& drop);
KernelCost attention_forward_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                                  bool dropout);

/// Kernels::attention_backward: dqkv from the forward's stats; scratch receives pd [B, nh, T].
void attention_backward(const float* dy, const float* qkv, const float* stats, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t nh, float* dqkv,
                        float* scratch, const gpt::AttentionDropout& drop);
/// Its cost; d_from_y: pd read as rowsum(dy * y) from the forward's output (CUDA's fast tiled
/// kernels given y: 7 products per pair, not 9).
KernelCost attention_backward_cost(std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t nh,
                                   bool dropout, bool d_from_y = false);

/// Forward and backward alike: y[i] = kept(index_base + i) ? x[i] * scale : 0.
void dropout(const float* x, float* y, std::int64_t n, float p, std::uint64_t seed,
             std::uint64_t stream, std::uint64_t index_base);
KernelCost dropout_cost(std::int64_t n);

float sum_squares(const float* x, std::int64_t n, Determinism mode);
KernelCost sum_squares_cost(std::int64_t n);

}  // namespace ditto::sim::gpt_kernels
