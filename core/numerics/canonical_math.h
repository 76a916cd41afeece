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
#include <cstdint>

#include "core/numerics/portable_math.h"  // defines DITTO_HD

namespace ditto::canonical {

// ---- rounded primitives (Note [Rounded primitives]) -------------------------------------------

// The correctly rounded +, -, *, / and fma are portable_math.h's (one definition for both headers).
using pmath::fma;
using pmath::detail::add;
using pmath::detail::div;
using pmath::detail::mul;
using pmath::detail::sub;

/// Correctly rounded square root (IEEE 754 requires it, like + - * /).
DITTO_HD inline float sqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// ---- transcendental functions ------------------------------------------------------------------
// DESIGN rule 4: one portable implementation built from +, *, fma, / and sqrt, identical on the
// host and on CUDA devices (core/numerics/portable_math.h, Note [Portable math]); never libm or CUDA's
// intrinsics. Every kernel calls them only through here.

DITTO_HD inline float exp(float x) { return pmath::exp(x); }

DITTO_HD inline float log(float x) { return pmath::log(x); }

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

/// max(x, 0) with NaN propagated, as torch.relu does.
DITTO_HD inline float relu(float x) { return (x > 0.0f || x != x) ? x : 0.0f; }

/// Gradient of ReLU from its output y: gy where y > 0, else 0.
DITTO_HD inline float relu_grad(float y, float gy) { return y > 0.0f ? gy : 0.0f; }

/// Squared error of one sample: the ascending chain acc = fma(d, d, acc) from 0.0f over
/// c = 0..n-1, d = x[c] - t[c].
DITTO_HD inline float squared_error_sum(const float* x, const float* t, std::int64_t n) {
  float acc = 0.0f;
  for (std::int64_t c = 0; c < n; ++c) {
    const float d = sub(x[c], t[c]);
    acc = dot_step(d, d, acc);
  }
  return acc;
}

/// Factor of the MSE gradient, grad_loss * scale * 2, and one element of it: factor * (x - t).
DITTO_HD inline float mse_grad_factor(float grad_loss, float scale) {
  return mul(mul(grad_loss, scale), 2.0f);
}
DITTO_HD inline float mse_grad(float factor, float x, float t) { return mul(factor, sub(x, t)); }

/// Row statistics of a softmax over n logits: the maximum (as std::max folds it from -inf in
/// ascending order, so NaN entries are skipped) and the ascending sum of exp(x - max) from 0.0f.
struct SoftmaxStats {
  float max;
  float sum;
};

DITTO_HD inline SoftmaxStats softmax_stats(const float* x, std::int64_t n) {
  float m = -pmath::detail::infinity();
  for (std::int64_t c = 0; c < n; ++c) m = (m < x[c]) ? x[c] : m;  // std::max(m, x[c])
  float s = 0.0f;
  for (std::int64_t c = 0; c < n; ++c) s = sum_step(s, exp(sub(x[c], m)));
  return {m, s};
}

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

// ---- Adam ---------------------------------------------------------------------------------------
//
// Note [Adam step]
// torch.optim.Adam's single-tensor path (torch/optim/adam.py, _single_tensor_adam, foreach=False,
// fused=False, capturable=False, maximize=False) runs, for a float32 parameter:
//   grad = grad.add(param, alpha=wd)                          (only when wd != 0)
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   [amsgrad] torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
//   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)   (max_exp_avg_sq if amsgrad)
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// with step_size = lr / bias_correction1 and bias_correction2_sqrt = sqrt(bias_correction2)
// computed in double on the host (Python floats), and every Python scalar rounded to float when
// it meets a float tensor. Per element, ATen's CPU kernels compute these as:
//   add(alpha):  fma(alpha, other, self)             ufunc::add's vectorised body is fmadd
//   lerp(w):     |w| < 0.5 ? fma(w, end - self, self) : fma(w - 1, end - self, end)
//   mul, then addcmul(value):  self + (value * t1) * t2, three roundings
//   sqrt, then division by the float scalar (a true division on the CPU), then + eps
//   addcdiv(value): self + (value * t1) / t2
//   maximum: NaN-propagating
// adam_update below spells exactly that sequence. PyTorch's own backends are not consistent
// with one another at the last bit (its CUDA kernels divide by a scalar through a reciprocal and
// compute addcdiv as self + value * (t1 / t2)); ditto follows the CPU kernels on every backend.

/// Float scalars of one Adam step, rounded from the double hyper-parameters as PyTorch rounds
/// Python floats. Computed once per parameter on the host (adam_scalars).
struct AdamScalars {
  float weight_decay;           ///< float(wd)
  float lerp_weight;            ///< float(1 - beta1)
  float beta2;                  ///< float(beta2)
  float one_minus_beta2;        ///< float(1 - beta2)
  float bias_correction2_sqrt;  ///< float(sqrt(bias_correction2))
  float eps;                    ///< float(eps)
  float neg_step_size;          ///< float(-(lr / bias_correction1))
  bool amsgrad;
};

/// The float scalars of Note [Adam step]; host only (double arithmetic as in Python).
inline AdamScalars adam_scalars(double lr, double beta1, double beta2, double eps,
                                double weight_decay, double bias_correction1,
                                double bias_correction2, bool amsgrad) {
  AdamScalars s{};
  s.weight_decay = static_cast<float>(weight_decay);
  s.lerp_weight = static_cast<float>(1.0 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(eps);
  s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
  s.amsgrad = amsgrad;
  return s;
}

/// torch.maximum of two floats: NaN if either is NaN.
DITTO_HD inline float maximum_nan(float a, float b) {
  if (a != a) return a;
  return a > b ? a : b;  // b when b is NaN
}

/// One torch.optim.Adam update of one element (Note [Adam step]); `vmax` is null unless amsgrad.
DITTO_HD inline void adam_update(float& p, float g, float& m, float& v, float* vmax,
                                 const AdamScalars& s) {
  if (s.weight_decay != 0.0f) g = fma(s.weight_decay, p, g);
  const float w = s.lerp_weight;
  const float d = sub(g, m);
  m = (w < 0.5f && w > -0.5f) ? fma(w, d, m) : fma(sub(w, 1.0f), d, g);
  v = add(mul(v, s.beta2), mul(mul(s.one_minus_beta2, g), g));
  float second = v;
  if (s.amsgrad) {
    *vmax = maximum_nan(*vmax, v);
    second = *vmax;
  }
  const float denom = add(div(sqrt(second), s.bias_correction2_sqrt), s.eps);
  p = add(p, div(mul(s.neg_step_size, m), denom));
}

}  // namespace ditto::canonical
