// Canonical per-element arithmetic of bitwise mode (../DESIGN.md, "The determinism contract").
//
// One definition of each rounding-sensitive formula, shared by the simulator's kernels and the
// CUDA kernels (every function is DITTO_HD: __host__ __device__ under nvcc), so both backends
// perform the same IEEE 754 operations in the same order and round identically.
//
// Note [Rounded primitives]
// The build uses -ffp-contract=off on the host, so `a * b + c` is two roundings there. nvcc
// contracts such expressions into an fma by default (-fmad=true); the __fmul_rn / __fadd_rn
// intrinsics are never contracted. The helpers mul/add/sub/div below therefore spell every
// rounding explicitly, and fma is written where an fma is meant. Use them in all bitwise code.
//
// Note [Canonical GEMM]
// In bitwise mode each element of C = alpha * op(A) @ op(B) + beta * C is
//   acc = 0.0f;  for k = 0, 1, ..., K-1:  acc = fma(op(A)[i,k], op(B)[k,j], acc)
//   C[i,j] = gemm_epilogue(acc, alpha, beta, C[i,j])
// where gemm_epilogue is acc when alpha == 1 and beta == 0, alpha*acc when beta == 0 (C is not
// read), else fma(beta, C, alpha*acc). Implementations may block over i and j and vectorise across
// output elements freely, but must never split or reorder the k chain (no split-K, no tensor
// cores, no partial sums combined later).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DITTO_HD __host__ __device__
#else
#define DITTO_HD
#endif

namespace ditto::canonical {

// ---- rounded primitives (Note [Rounded primitives]) -------------------------------------------

DITTO_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

DITTO_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

DITTO_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DITTO_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// a * b + c with a single rounding.
DITTO_HD inline float fma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---- transcendental functions ------------------------------------------------------------------
// DESIGN rule 4 asks for one portable implementation built from +, *, fma, / and sqrt. Until it
// lands these forward to the platform's libm; every kernel calls them only through here so the
// swap is one edit.

DITTO_HD inline float exp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}

DITTO_HD inline float log(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}

// ---- reductions ----------------------------------------------------------------------------------

/// One step of a dot product: acc + a * b, one rounding (DESIGN rule 3).
DITTO_HD inline float dot_step(float a, float b, float acc) { return fma(a, b, acc); }

/// One step of a plain sum (row sums, sum): acc + x. Identical to fma(1, x, acc).
DITTO_HD inline float sum_step(float acc, float x) { return add(acc, x); }

/// Final value of a GEMM element (Note [Canonical GEMM]); `c` is ignored when beta == 0.
DITTO_HD inline float gemm_epilogue(float acc, float alpha, float beta, float c) {
  if (beta == 0.0f) return alpha == 1.0f ? acc : mul(alpha, acc);
  return fma(beta, c, mul(alpha, acc));
}

// ---- pointwise ---------------------------------------------------------------------------------

/// y + alpha * x (two roundings).
DITTO_HD inline float axpy(float alpha, float x, float y) { return add(y, mul(alpha, x)); }

/// Cross-entropy of one sample from its row max `m`, sum of exp(x - m) `s` and target logit `xt`:
/// log(s) - (xt - m).
DITTO_HD inline float cross_entropy_loss(float m, float s, float xt) {
  return sub(log(s), sub(xt, m));
}

/// Gradient of one logit: factor * (exp(x - m) / s - onehot).
DITTO_HD inline float cross_entropy_grad(float factor, float x, float m, float s, bool is_target) {
  float p = div(exp(sub(x, m)), s);
  return mul(factor, is_target ? sub(p, 1.0f) : p);
}

/// One torch.optim.SGD update of one element; `buf` is null when momentum == 0.
/// g += wd * p; buf = g (first step) or momentum * buf + (1 - dampening) * g;
/// g = nesterov ? g + momentum * buf : buf; p = p - lr * g (PyTorch's p.add_(g, alpha=-lr)).
DITTO_HD inline void sgd_update(float& p, float g, float* buf, float lr, float momentum,
                                float dampening, float weight_decay, bool nesterov,
                                bool first_step) {
  if (weight_decay != 0.0f) g = add(g, mul(weight_decay, p));
  if (momentum != 0.0f) {
    float b = first_step ? g : add(mul(momentum, *buf), mul(sub(1.0f, dampening), g));
    *buf = b;
    g = nesterov ? add(g, mul(momentum, b)) : b;
  }
  p = add(p, mul(-lr, g));
}

}  // namespace ditto::canonical
