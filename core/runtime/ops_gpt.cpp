// The transformer ops of core/runtime/ops.h (embedding .. sum_squares): argument checks, then one
// call into the backend's kernels (Kernels::embedding_forward and siblings; their operation
// order is Note [GPT kernels] in core/numerics/gpt_math.h).
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/numerics/gpt_math.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/ops.h"
#include "core/runtime/ops_check.h"
#include "core/runtime/ops_mixed.h"

namespace ditto::ops {

namespace {

using namespace internal;  // the argument checks (ops_check.h)

/// On the host: every id of the i64 tensor `idx` lies in [0, V); the first bad one is named
/// with its position (as [b, t] for a 2-dim idx).
void check_ids(const char* op, const Tensor& idx, std::int64_t V, const char* v_arg) {
  const std::vector<std::int64_t> ids = idx.to_vector<std::int64_t>();
  const std::int64_t T = idx.dim() == 2 ? idx.size(1) : 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0 && ids[i] < V) continue;
    const auto n = static_cast<std::int64_t>(i);
    const std::string where = T > 0 ? detail::cat(n / T, ", ", n % T) : detail::cat(n);
    throw InvalidArgument(detail::cat(op, ": idx[", where, "] = ", ids[i], " out of range [0, ", V,
                                      ") (the rows of ", v_arg, ")"));
  }
}

/// idx is an i64 [B, T] batch of token ids (or flat [N] when `flat_ok`).
void check_idx(const char* op, const Tensor& idx, bool flat_ok) {
  check_tensor(op, "idx", idx, DType::i64);
  DITTO_CHECK(idx.dim() == 2 || (flat_ok && idx.dim() == 1), op, ": idx: expected ",
              flat_ok ? "a 2-dim [B, T] or 1-dim [N]" : "a 2-dim [B, T]",
              " tensor of token ids, got ", idx.str());
}

/// `t` is a `dt` tensor (f32, or the storage dtype of a typed kernel) on `ref`'s device whose
/// shape is `expected`.
void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected,
                 const char* what, const Tensor& ref, const char* ref_arg, DType dt = DType::f32) {
  check_tensor(op, arg, t, dt);
  check_device(op, arg, t, ref.device(), ref_arg);
  DITTO_CHECK(t.shape() == expected, op, ": ", arg, ": expected ", what, " = ", shape_str(expected),
              ", got ", t.str());
}

/// A drop probability: 0 <= p < 1.
void check_p(const char* op, float p) {
  DITTO_CHECK(p >= 0.0f && p < 1.0f, op, ": p: expected a drop probability in [0, 1), got ", p);
}

void check_mode(const char* op, Determinism mode) {
  DITTO_CHECK(is_valid_determinism(mode), op,
              ": mode: expected Determinism::fast or "
              "Determinism::bitwise, got value ",
              static_cast<int>(mode));
}

/// Rows of x [..., C]: the product of the leading dims (1 for a 1-dim x).
std::int64_t leading_rows(const Tensor& x) {
  std::int64_t rows = 1;
  for (std::int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

/// qkv [B, T, 3C] of `dtype` and n_head; returns C.
std::int64_t check_qkv(const char* op, const Tensor& qkv, std::int64_t n_head,
                       DType dtype = DType::f32) {
  check_tensor(op, "qkv", qkv, dtype);
  check_dims(op, "qkv", qkv, 3, "[B, T, 3C]");
  const std::int64_t w = qkv.size(2);
  DITTO_CHECK(w % 3 == 0, op, ": qkv: expected [B, T, 3C] (the last dim a multiple of 3), got ",
              qkv.str());
  const std::int64_t C = w / 3;
  DITTO_CHECK(n_head >= 1, op, ": n_head: expected n_head >= 1, got ", n_head);
  DITTO_CHECK(C % n_head == 0, op, ": n_head: expected a divisor of C = ", C, " (qkv of ",
              shape_str(qkv.shape()), "), got ", n_head);
  return C;
}

/// Whether attention on a bf16 / f16 qkv (and dy, when defined: the same dtype) runs as the
/// backend's typed kernels (Kernels::has_attention_ex) instead of MixedOp's f32 scratch: qkv is a
/// well-formed [B, T, 3C] on a device, n_head divides C, the mode is valid and the backend takes
/// the dtype and head width. Otherwise the MixedOp path runs (and reports any bad argument).
bool native_attention(const Tensor& qkv, const Tensor& dy, std::int64_t n_head, Determinism mode) {
  if (!is_half(qkv) || qkv.device().is_cpu() || qkv.dim() != 3 || qkv.size(2) % 3 != 0 ||
      n_head < 1 || (qkv.size(2) / 3) % n_head != 0 || !is_valid_determinism(mode))
    return false;
  if (dy.defined() && (dy.dtype() != qkv.dtype() || dy.device() != qkv.device())) return false;
  return kernels_of(qkv).has_attention_ex(qkv.dtype(), qkv.size(2) / 3 / n_head, mode);
}

}  // namespace

Tensor embedding(const Tensor& idx, const Tensor& wte, const Tensor& wpe) {
  constexpr const char* op = "ops::embedding";
  // dt: bf16 / f16 where the backend runs embedding_forward_ex on them, else f32.
  const DType dt = native_rows({&wte, &wpe});
  if (dt == DType::f32 && any_half({&wte, &wpe})) {  // Note [Mixed precision]
    MixedOp m(op, {&wte, &wpe});
    return m.out(m.run([&] { return embedding(idx, m.in(wte), m.in(wpe)); }));
  }
  check_idx(op, idx, /*flat_ok=*/false);
  check_tensor(op, "wte", wte, dt);
  check_device(op, "wte", wte, idx.device(), "idx");
  check_dims(op, "wte", wte, 2, "[V, C]");
  const std::int64_t B = idx.size(0), T = idx.size(1), V = wte.size(0), C = wte.size(1);
  if (wpe.defined()) {
    check_tensor(op, "wpe", wpe, dt);
    check_device(op, "wpe", wpe, idx.device(), "idx");
    DITTO_CHECK(wpe.dim() == 2 && wpe.size(1) == C && wpe.size(0) >= T, op,
                ": wpe: expected [P, C] with C = ", C, " (the width of wte) and P >= T = ", T,
                " (the length of idx), got ", wpe.str());
  }
  check_ids(op, idx, V, "wte");
  Tensor out = Tensor::empty({B, T, C}, dt, idx.device());
  if (out.numel() == 0) return out;
  if (dt != DType::f32) {
    kernels_of(idx).embedding_forward_ex(stream_of(idx), dt, idx.data<std::int64_t>(),
                                         wte.data_ptr(), wpe.defined() ? wpe.data_ptr() : nullptr,
                                         B * T, T, C, out.data_ptr());
    return out;
  }
  kernels_of(idx).embedding_forward(stream_of(idx), idx.data<std::int64_t>(), wte.data<float>(),
                                    wpe.defined() ? wpe.data<float>() : nullptr, B * T, T, C,
                                    out.data<float>());
  return out;
}

void embedding_backward(const Tensor& idx, const Tensor& dy, Tensor& grad_wte,
                        const std::vector<std::int64_t>& bounds, bool accumulate) {
  constexpr const char* op = "ops::embedding_backward";
  // dt: dy's bf16 / f16 where the backend runs embedding_backward_ex on it and grad_wte is f32
  // or of dy's dtype (gt), else f32 (MixedOp, or the f32 path).
  DType dt = native_rows({&dy});
  const DType gt = grad_wte.defined() ? grad_wte.dtype() : DType::f32;
  if (gt != DType::f32 && gt != dt) dt = DType::f32;
  if (dt == DType::f32 && any_half({&dy, &grad_wte})) {  // grad_wte may stay f32: written directly
    check_no_overlap(op, "grad_wte", grad_wte, "dy", dy);
    MixedOp m(op, {&dy, &grad_wte});
    Tensor gf = m.in(grad_wte);
    m.run([&] { embedding_backward(idx, m.in(dy), gf, bounds, accumulate); });
    m.write_back(gf, grad_wte);
    return;
  }
  check_idx(op, idx, /*flat_ok=*/true);
  check_tensor(op, "dy", dy, dt);
  check_device(op, "dy", dy, idx.device(), "idx");
  const std::int64_t N = idx.numel();
  Shape with_c = idx.shape();
  with_c.push_back(dy.dim() > 0 ? dy.size(dy.dim() - 1) : 0);
  DITTO_CHECK(dy.shape() == with_c, op, ": dy: expected idx's shape ", shape_str(idx.shape()),
              " plus a channel dim ([B, T, C] or [N, C]), got ", dy.str());
  const std::int64_t C = dy.size(dy.dim() - 1);
  check_tensor(op, "grad_wte", grad_wte, dt == DType::f32 ? DType::f32 : gt);
  check_device(op, "grad_wte", grad_wte, idx.device(), "idx");
  DITTO_CHECK(grad_wte.dim() == 2 && grad_wte.size(1) == C, op,
              ": grad_wte: expected [V, C] with C = ", C, " (the width of dy), got ",
              grad_wte.str());
  check_no_overlap(op, "grad_wte", grad_wte, "dy", dy);
  check_shard_bounds(op, bounds, N);
  const std::int64_t V = grad_wte.size(0);
  check_ids(op, idx, V, "grad_wte");
  if (grad_wte.numel() == 0) return;
  if (dt != DType::f32) {
    kernels_of(idx).embedding_backward_ex(stream_of(idx), dt, idx.data<std::int64_t>(),
                                          dy.data_ptr(), N, C, V, bounds, gt, grad_wte.data_ptr(),
                                          accumulate);
    return;
  }
  kernels_of(idx).embedding_backward(stream_of(idx), idx.data<std::int64_t>(), dy.data<float>(), N,
                                     C, V, bounds, grad_wte.data<float>(), accumulate);
}

namespace {

/// layernorm's body, its errors naming `op`; with `branch` defined (the caller checked
/// layernorm_add_fused) one Kernels::layernorm_forward_add of x + branch, setting `residual`.
Tensor run_layernorm(const char* op, const Tensor& x, const Tensor& branch, const Tensor& w,
                     const Tensor& b, float eps, Tensor& residual, Tensor& mean, Tensor& rstd) {
  const DType dt = native_rows({&x, &w, &b});        // layernorm_forward_ex's dtype, else f32
  if (dt == DType::f32 && any_half({&x, &w, &b})) {  // y in the storage dtype; mean, rstd f32
    MixedOp m(op, {&x, &w, &b});
    Tensor mf, rf, unused;
    Tensor y = m.out(m.run([&] {
      return run_layernorm(op, m.in(x), Tensor(), m.in(w), m.in(b), eps, unused, mf, rf);
    }));
    mean = m.out(mf, DType::f32);
    rstd = m.out(rf, DType::f32);
    return y;
  }
  check_tensor(op, "x", x, dt);
  DITTO_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) > 0, op,
              ": x: expected a tensor [..., C] of at least 1 dim with C >= 1, got ", x.str());
  const std::int64_t C = x.size(x.dim() - 1), N = leading_rows(x);
  check_shape(op, "w", w, {C}, "[C]", x, "x", dt);
  if (b.defined()) check_shape(op, "b", b, {C}, "[C]", x, "x", dt);
  DITTO_CHECK(std::isfinite(eps) && eps >= 0.0f, op, ": eps: expected a finite eps >= 0, got ",
              eps);
  // The residual first, as ops::add allocates it before the LayerNorm's outputs.
  if (branch.defined()) residual = Tensor::empty(x.shape(), dt, x.device());
  Tensor y = Tensor::empty(x.shape(), dt, x.device());
  mean = Tensor::empty({N}, DType::f32, x.device());
  rstd = Tensor::empty({N}, DType::f32, x.device());
  if (N == 0) return y;
  if (branch.defined()) {  // residual = x + branch, and y its LayerNorm, in one kernel
    kernels_of(x).layernorm_forward_add(stream_of(x), dt, x.data_ptr(), branch.data_ptr(),
                                        w.data_ptr(), b.defined() ? b.data_ptr() : nullptr, N, C,
                                        eps, residual.data_ptr(), y.data_ptr(), mean.data<float>(),
                                        rstd.data<float>());
    return y;
  }
  if (dt != DType::f32) {
    kernels_of(x).layernorm_forward_ex(stream_of(x), dt, x.data_ptr(), w.data_ptr(),
                                       b.defined() ? b.data_ptr() : nullptr, N, C, eps,
                                       y.data_ptr(), mean.data<float>(), rstd.data<float>());
    return y;
  }
  kernels_of(x).layernorm_forward(stream_of(x), x.data<float>(), w.data<float>(),
                                  b.defined() ? b.data<float>() : nullptr, N, C, eps,
                                  y.data<float>(), mean.data<float>(), rstd.data<float>());
  return y;
}

}  // namespace

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& mean,
                 Tensor& rstd) {
  Tensor unused;
  return run_layernorm("ops::layernorm", x, Tensor(), w, b, eps, unused, mean, rstd);
}

bool layernorm_add_fused(const Tensor& x, const Tensor& branch, const Tensor& w, const Tensor& b) {
  for (const Tensor* t : {&x, &branch, &w})
    if (!t->defined() || t->device().is_cpu() || t->device() != x.device()) return false;
  // One dtype: f32, or the storage dtype whose typed row kernels the backend has.
  const DType dt = x.dtype();
  if (branch.dtype() != dt || w.dtype() != dt || branch.shape() != x.shape()) return false;
  if (b.defined() && (b.dtype() != dt || b.device() != x.device())) return false;
  if (dt != DType::f32 && native_rows({&x, &branch, &w, &b}) != dt) return false;
  return kernels_of(x).has_layernorm_forward_add(dt);
}

Tensor layernorm_add(const Tensor& x, const Tensor& branch, const Tensor& w, const Tensor& b,
                     float eps, Tensor& residual, Tensor& mean, Tensor& rstd) {
  constexpr const char* op = "ops::layernorm_add";
  DITTO_CHECK(x.defined(), op, ": x: expected a defined tensor, got an undefined tensor");
  check_like_any(op, "branch", branch, "x", x);
  if (layernorm_add_fused(x, branch, w, b))
    return run_layernorm(op, x, branch, w, b, eps, residual, mean, rstd);
  // The two ops (the simulator's path): the same bits. The LayerNorm's shape and eps checks
  // first, so a bad argument launches nothing here either.
  DITTO_CHECK(x.dim() >= 1 && x.size(x.dim() - 1) > 0, op,
              ": x: expected a tensor [..., C] of at least 1 dim with C >= 1, got ", x.str());
  const std::int64_t C = x.size(x.dim() - 1);
  DITTO_CHECK(w.defined() && w.shape() == Shape{C}, op, ": w: expected [C] = ", shape_str({C}),
              ", got ", w.defined() ? w.str() : std::string("an undefined tensor"));
  DITTO_CHECK(!b.defined() || b.shape() == Shape{C}, op, ": b: expected [C] = ", shape_str({C}),
              ", got ", b.defined() ? b.str() : std::string("an undefined tensor"));
  DITTO_CHECK(std::isfinite(eps) && eps >= 0.0f, op, ": eps: expected a finite eps >= 0, got ",
              eps);
  Tensor r = add(x, branch);
  Tensor unused;
  Tensor y = run_layernorm(op, r, Tensor(), w, b, eps, unused, mean, rstd);
  residual = std::move(r);
  return y;
}

namespace {

/// layernorm_backward's body, its errors naming `op`; with `residual` defined (the caller checked
/// layernorm_backward_add_fused) one Kernels::layernorm_backward_add, returning residual + dx.
Tensor run_layernorm_backward(const char* op, const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                              Tensor& dy_xhat) {
  // layernorm_backward_ex's dtype (dy, x, w of one storage dtype; mean, rstd f32), else f32.
  const DType dt = any_half({&mean, &rstd}) ? DType::f32 : native_rows({&dy, &x, &w});
  if (dt == DType::f32 && any_half({&dy, &x, &w, &mean, &rstd})) {  // dx, dy_xhat: storage
    MixedOp m(op, {&dy, &x, &w, &mean, &rstd});
    Tensor hf;
    Tensor dx = m.out(m.run([&] {
      return run_layernorm_backward(op, m.in(dy), m.in(x), m.in(w), m.in(mean), m.in(rstd),
                                    Tensor(), hf);
    }));
    dy_xhat = m.out(hf);
    return dx;
  }
  check_tensor(op, "dy", dy, dt);
  DITTO_CHECK(dy.dim() >= 1 && dy.size(dy.dim() - 1) > 0, op,
              ": dy: expected a tensor [..., C] of at least 1 dim with C >= 1, got ", dy.str());
  check_like_any(op, "x", x, "dy", dy);
  const std::int64_t C = x.size(x.dim() - 1), N = leading_rows(x);
  check_shape(op, "w", w, {C}, "[C]", dy, "dy", dt);
  check_shape(op, "mean", mean, {N}, "[rows]", dy, "dy");
  check_shape(op, "rstd", rstd, {N}, "[rows]", dy, "dy");
  Tensor dx = Tensor::empty(x.shape(), dt, x.device());
  dy_xhat = Tensor::empty(x.shape(), dt, x.device());
  if (N == 0) return dx;
  if (residual.defined()) {  // dx = residual + dx in the kernel's store
    kernels_of(x).layernorm_backward_add(
        stream_of(x), dt, dy.data_ptr(), x.data_ptr(), w.data_ptr(), mean.data<float>(),
        rstd.data<float>(), residual.data_ptr(), N, C, dx.data_ptr(), dy_xhat.data_ptr());
    return dx;
  }
  if (dt != DType::f32) {
    kernels_of(x).layernorm_backward_ex(stream_of(x), dt, dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                        mean.data<float>(), rstd.data<float>(), N, C, dx.data_ptr(),
                                        dy_xhat.data_ptr());
    return dx;
  }
  kernels_of(x).layernorm_backward(stream_of(x), dy.data<float>(), x.data<float>(), w.data<float>(),
                                   mean.data<float>(), rstd.data<float>(), N, C, dx.data<float>(),
                                   dy_xhat.data<float>());
  return dx;
}

}  // namespace

Tensor layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd, Tensor& dy_xhat) {
  return run_layernorm_backward("ops::layernorm_backward", dy, x, w, mean, rstd, Tensor(), dy_xhat);
}

bool layernorm_backward_add_fused(const Tensor& dy, const Tensor& x, const Tensor& w,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& residual) {
  for (const Tensor* t : {&dy, &x, &w, &mean, &rstd, &residual})
    if (!t->defined() || t->device().is_cpu() || t->device() != dy.device()) return false;
  if (mean.dtype() != DType::f32 || rstd.dtype() != DType::f32) return false;
  // One dtype: f32, or the storage dtype whose typed row kernels the backend has.
  const DType dt = dy.dtype();
  if (x.dtype() != dt || w.dtype() != dt || residual.dtype() != dt ||
      residual.shape() != dy.shape())
    return false;
  if (dt != DType::f32 && native_rows({&dy, &x, &w, &residual}) != dt) return false;
  return kernels_of(dy).has_layernorm_backward_add(dt);
}

Tensor layernorm_backward_add(const Tensor& dy, const Tensor& x, const Tensor& w,
                              const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                              Tensor& dy_xhat) {
  constexpr const char* op = "ops::layernorm_backward_add";
  DITTO_CHECK(dy.defined(), op, ": dy: expected a defined tensor, got an undefined tensor");
  check_like_any(op, "residual", residual, "dy", dy);
  if (layernorm_backward_add_fused(dy, x, w, mean, rstd, residual))
    return run_layernorm_backward(op, dy, x, w, mean, rstd, residual, dy_xhat);
  // The two ops (the simulator's path): the same bits.
  const Tensor dx = run_layernorm_backward(op, dy, x, w, mean, rstd, Tensor(), dy_xhat);
  return add(residual, dx);
}

namespace {

/// A LayerNorm parameter's gradient for layernorm_backward_params: a contiguous tensor of C
/// elements on dy's device, f32 or dy's dtype, sharing no memory with dy, x or the residual.
void check_param_grad(const char* op, const char* arg, const Tensor& g, std::int64_t C,
                      const Tensor& dy, const Tensor& x, const Tensor& residual) {
  DITTO_CHECK(g.defined(), op, ": ", arg, ": expected a defined tensor, got an undefined tensor");
  DITTO_CHECK(g.dtype() == DType::f32 || g.dtype() == dy.dtype(), op, ": ", arg,
              ": expected dtype f32 or ", dtype_name(dy.dtype()), " (dy's), got ", g.str());
  check_device(op, arg, g, dy.device(), "dy");
  DITTO_CHECK(g.dim() == 1 && g.size(0) == C, op, ": ", arg, ": expected [C] = [", C, "], got ",
              g.str());
  check_no_overlap(op, arg, g, "dy", dy);
  check_no_overlap(op, arg, g, "x", x);
  if (residual.defined()) check_no_overlap(op, arg, g, "residual", residual);
}

}  // namespace

namespace internal {

Tensor layernorm_backward_with(const Tensor& dy, const Tensor& x, const Tensor& w,
                               const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                               const std::function<void(const Tensor& dy_xhat)>& row_sums,
                               const char* op_name) {
  // The fused add's decision, taken once: one kernel before the row sums, or the add after them
  // (dy_xhat freed first: the simulator's launches and peak memory as nn::Block ran them).
  const bool fused =
      residual.defined() && layernorm_backward_add_fused(dy, x, w, mean, rstd, residual);
  Tensor dy_xhat;
  Tensor dx;
  const char* op = op_name != nullptr   ? op_name
                   : residual.defined() ? "ops::layernorm_backward_add"
                                        : "ops::layernorm_backward";
  if (fused) {
    dx = run_layernorm_backward(op, dy, x, w, mean, rstd, residual, dy_xhat);
  } else {
    if (residual.defined()) {
      DITTO_CHECK(dy.defined(), op, ": dy: expected a defined tensor, got an undefined tensor");
      check_like_any(op, "residual", residual, "dy", dy);
    }
    dx = run_layernorm_backward(op, dy, x, w, mean, rstd, Tensor(), dy_xhat);
  }
  row_sums(dy_xhat);
  if (residual.defined() && !fused) {
    dy_xhat = Tensor();
    dx = add(residual, dx);
  }
  return dx;
}

}  // namespace internal

bool layernorm_backward_params_fused(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                                     DType grad_type) {
  for (const Tensor* t : {&dy, &x, &w, &mean, &rstd})
    if (!t->defined() || t->device().is_cpu() || t->device() != dy.device()) return false;
  if (mean.dtype() != DType::f32 || rstd.dtype() != DType::f32) return false;
  const DType dt = dy.dtype();
  if (x.dtype() != dt || w.dtype() != dt || x.shape() != dy.shape()) return false;
  if (residual.defined() && (residual.device() != dy.device() || residual.dtype() != dt ||
                             residual.shape() != dy.shape()))
    return false;
  if (dt != DType::f32 && native_rows({&dy, &x, &w, &residual}, Determinism::fast) != dt)
    return false;
  if (grad_type != DType::f32 && grad_type != dt) return false;
  return kernels_of(dy).has_layernorm_backward_params(dt, Determinism::fast);
}

Tensor layernorm_backward_params(const Tensor& dy, const Tensor& x, const Tensor& w,
                                 const Tensor& mean, const Tensor& rstd, const Tensor& residual,
                                 Tensor& grad_w, bool accumulate_w, Tensor& grad_b,
                                 bool accumulate_b) {
  constexpr const char* op = "ops::layernorm_backward_params";
  DITTO_CHECK(dy.defined(), op, ": dy: expected a defined tensor, got an undefined tensor");
  DITTO_CHECK(dy.dim() >= 1 && dy.size(dy.dim() - 1) > 0, op,
              ": dy: expected a tensor [..., C] of at least 1 dim with C >= 1, got ", dy.str());
  if (residual.defined()) check_like_any(op, "residual", residual, "dy", dy);
  const std::int64_t C = dy.size(dy.dim() - 1);
  check_param_grad(op, "grad_w", grad_w, C, dy, x, residual);
  if (grad_b.defined()) {
    check_param_grad(op, "grad_b", grad_b, C, dy, x, residual);
    DITTO_CHECK(grad_b.dtype() == grad_w.dtype(), op, ": grad_b: expected dtype ",
                dtype_name(grad_w.dtype()), " (grad_w's), got ", grad_b.str());
    check_no_overlap(op, "grad_b", grad_b, "grad_w", grad_w);
  }
  if (!layernorm_backward_params_fused(dy, x, w, mean, rstd, residual, grad_w.dtype())) {
    // Today's path: the backward (and the add), then the two fast row sums.
    return internal::layernorm_backward_with(
        dy, x, w, mean, rstd, residual,
        [&](const Tensor& dy_xhat) {
          sum_rows(dy_xhat.view({-1, C}), grad_w, accumulate_w ? 1.0f : 0.0f, Determinism::fast);
          if (grad_b.defined())
            sum_rows(dy.view({-1, C}), grad_b, accumulate_b ? 1.0f : 0.0f, Determinism::fast);
        },
        op);
  }
  const DType dt = dy.dtype();
  check_like_any(op, "x", x, "dy", dy);
  const std::int64_t N = leading_rows(x);
  check_shape(op, "w", w, {C}, "[C]", dy, "dy", dt);
  check_shape(op, "mean", mean, {N}, "[rows]", dy, "dy");
  check_shape(op, "rstd", rstd, {N}, "[rows]", dy, "dy");
  Tensor dx = Tensor::empty(x.shape(), dt, x.device());
  kernels_of(x).layernorm_backward_params(
      stream_of(x), dt, dy.data_ptr(), x.data_ptr(), w.data_ptr(), mean.data<float>(),
      rstd.data<float>(), residual.defined() ? residual.data_ptr() : nullptr, N, C, dx.data_ptr(),
      grad_w.dtype(), grad_w.data_ptr(), accumulate_w,
      grad_b.defined() ? grad_b.data_ptr() : nullptr, accumulate_b);
  return dx;
}

Tensor gelu(const Tensor& x) {
  const DType dt = native_rows({&x});
  if (dt == DType::f32) return internal::unary_op("ops::gelu", x, gelu, &Kernels::gelu_forward);
  check_tensor("ops::gelu", "x", x, dt);  // gelu_forward_ex on the storage dtype
  Tensor y = Tensor::empty(x.shape(), dt, x.device());
  if (x.numel() > 0)
    kernels_of(x).gelu_forward_ex(stream_of(x), dt, x.data_ptr(), y.data_ptr(), x.numel());
  return y;
}

Tensor gelu_backward(const Tensor& x, const Tensor& grad_y) {
  constexpr const char* op = "ops::gelu_backward";
  const DType dt = native_rows({&x, &grad_y});
  if (dt == DType::f32)
    return internal::unary_backward_op(op, "x", x, grad_y, gelu_backward, &Kernels::gelu_backward);
  check_tensor(op, "x", x, dt);  // gelu_backward_ex on the storage dtype
  check_like_any(op, "grad_y", grad_y, "x", x);
  Tensor gx = Tensor::empty(x.shape(), dt, x.device());
  if (x.numel() > 0)
    kernels_of(x).gelu_backward_ex(stream_of(x), dt, x.data_ptr(), grad_y.data_ptr(), gx.data_ptr(),
                                   x.numel());
  return gx;
}

Tensor attention(const Tensor& qkv, std::int64_t n_head, Tensor& stats, float p, std::uint64_t seed,
                 std::uint64_t stream, std::uint64_t index_base, Determinism mode) {
  constexpr const char* op = "ops::attention";
  if (native_attention(qkv, Tensor(), n_head, mode)) {  // typed kernels: no f32 copy of qkv
    const std::int64_t C = check_qkv(op, qkv, n_head, qkv.dtype());
    check_p(op, p);
    const std::int64_t B = qkv.size(0), T = qkv.size(1);
    Tensor y = Tensor::empty({B, T, C}, qkv.dtype(), qkv.device());
    stats = Tensor::empty({B, n_head, T, 2}, DType::f32, qkv.device());
    if (y.numel() == 0) return y;
    kernels_of(qkv).attention_forward_ex(stream_of(qkv), qkv.data_ptr(), qkv.dtype(), B, T, C,
                                         n_head, y.data_ptr(), stats.data<float>(), p, seed, stream,
                                         index_base, mode);
    return y;
  }
  if (any_half({&qkv})) {  // y in the storage dtype; the softmax stats stay f32
    MixedOp m(op, {&qkv});
    Tensor sf;
    Tensor y = m.out(
        m.run([&] { return attention(m.in(qkv), n_head, sf, p, seed, stream, index_base, mode); }));
    stats = m.out(sf, DType::f32);
    return y;
  }
  const std::int64_t C = check_qkv(op, qkv, n_head);
  check_p(op, p);
  check_mode(op, mode);
  const std::int64_t B = qkv.size(0), T = qkv.size(1);
  Tensor y = Tensor::empty({B, T, C}, DType::f32, qkv.device());
  stats = Tensor::empty({B, n_head, T, 2}, DType::f32, qkv.device());
  if (y.numel() == 0) return y;
  kernels_of(qkv).attention_forward(stream_of(qkv), qkv.data<float>(), B, T, C, n_head,
                                    y.data<float>(), stats.data<float>(), p, seed, stream,
                                    index_base, mode);
  return y;
}

Tensor attention_backward(const Tensor& dy, const Tensor& qkv, const Tensor& stats,
                          std::int64_t n_head, float p, std::uint64_t seed, std::uint64_t stream,
                          std::uint64_t index_base, Determinism mode, const Tensor& y) {
  constexpr const char* op = "ops::attention_backward";
  // y, where given: the forward's output, [B, T, C] in qkv's dtype on its device.
  const auto check_y = [&](std::int64_t C) {
    if (y.defined())
      check_shape(op, "y", y, {qkv.size(0), qkv.size(1), C}, "[B, T, C] (the forward's output)",
                  qkv, "qkv", qkv.dtype());
  };
  if (dy.defined() && native_attention(qkv, dy, n_head, mode)) {  // typed kernels
    const std::int64_t C = check_qkv(op, qkv, n_head, qkv.dtype());
    check_p(op, p);
    const std::int64_t B = qkv.size(0), T = qkv.size(1);
    check_tensor(op, "dy", dy, qkv.dtype());
    check_device(op, "dy", dy, qkv.device(), "qkv");
    DITTO_CHECK(dy.shape() == Shape({B, T, C}), op,
                ": dy: expected [B, T, C] = ", shape_str(Shape({B, T, C})), ", got ", dy.str());
    check_shape(op, "stats", stats, {B, n_head, T, 2}, "[B, n_head, T, 2]", qkv, "qkv");
    check_y(C);
    Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), qkv.device());
    if (dy.numel() == 0) return dqkv;
    Tensor scratch = Tensor::empty({B * n_head * T}, DType::f32, qkv.device());
    Stream& s = stream_of(qkv);
    kernels_of(qkv).attention_backward_ex(s, dy.data_ptr(), qkv.data_ptr(),
                                          y.defined() ? y.data_ptr() : nullptr, qkv.dtype(),
                                          stats.data<float>(), B, T, C, n_head, dqkv.data_ptr(),
                                          scratch.data<float>(), p, seed, stream, index_base, mode);
    // scratch: freed ordered after the default stream, as below.
    if (&s != &qkv.device().backend().default_stream(qkv.device().index)) s.synchronize();
    return dqkv;
  }
  if (any_half({&dy, &qkv})) {  // y (checked) is not needed: the f32 kernels recompute pd
    if (y.defined()) check_y(check_qkv(op, qkv, n_head, qkv.dtype()));
    MixedOp m(op, {&dy, &qkv});
    return m.out(m.run([&] {
      return attention_backward(m.in(dy), m.in(qkv), stats, n_head, p, seed, stream, index_base,
                                mode);
    }));
  }
  const std::int64_t C = check_qkv(op, qkv, n_head);
  check_p(op, p);
  check_mode(op, mode);
  const std::int64_t B = qkv.size(0), T = qkv.size(1);
  check_shape(op, "dy", dy, {B, T, C}, "[B, T, C]", qkv, "qkv");
  check_y(C);
  check_shape(op, "stats", stats, {B, n_head, T, 2}, "[B, n_head, T, 2]", qkv, "qkv");
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f32, qkv.device());
  if (dy.numel() == 0) return dqkv;
  Tensor scratch = Tensor::empty({B * n_head * T}, DType::f32, qkv.device());
  Stream& s = stream_of(qkv);
  // y: fast mode reads pd = rowsum(dy * y) from it (Kernels::attention_backward).
  kernels_of(qkv).attention_backward(s, dy.data<float>(), qkv.data<float>(),
                                     y.defined() ? y.data<float>() : nullptr, stats.data<float>(),
                                     B, T, C, n_head, dqkv.data<float>(), scratch.data<float>(), p,
                                     seed, stream, index_base, mode);
  // scratch is freed ordered after the device's default stream (Buffer); on another stream the
  // kernel must finish first.
  if (&s != &qkv.device().backend().default_stream(qkv.device().index)) s.synchronize();
  return dqkv;
}

namespace {

// Kernels::dropout_forward or dropout_backward (the same mask and arithmetic) on x.
Tensor run_dropout(const char* op, const char* arg, const Tensor& x, float p, std::uint64_t seed,
                   std::uint64_t stream, std::uint64_t index_base, bool forward) {
  const DType dt = native_rows({&x});  // dropout_*_ex on the storage dtype, else f32
  if (dt != DType::f32) {
    check_tensor(op, arg, x, dt);
    check_p(op, p);
    if (p == 0.0f) return x;
    Tensor y = Tensor::empty(x.shape(), dt, x.device());
    if (x.numel() == 0) return y;
    Kernels& k = kernels_of(x);
    if (forward)
      k.dropout_forward_ex(stream_of(x), dt, x.data_ptr(), y.data_ptr(), x.numel(), p, seed, stream,
                           index_base);
    else
      k.dropout_backward_ex(stream_of(x), dt, x.data_ptr(), y.data_ptr(), x.numel(), p, seed,
                            stream, index_base);
    return y;
  }
  if (any_half({&x})) {
    check_p(op, p);
    if (p == 0.0f) return x;
    MixedOp m(op, {&x});
    return m.out(
        m.run([&] { return run_dropout(op, arg, m.in(x), p, seed, stream, index_base, forward); }));
  }
  check_tensor(op, arg, x);
  check_p(op, p);
  if (p == 0.0f) return x;
  Tensor y = Tensor::empty(x.shape(), DType::f32, x.device());
  if (x.numel() == 0) return y;
  Kernels& k = kernels_of(x);
  if (forward)
    k.dropout_forward(stream_of(x), x.data<float>(), y.data<float>(), x.numel(), p, seed, stream,
                      index_base);
  else
    k.dropout_backward(stream_of(x), x.data<float>(), y.data<float>(), x.numel(), p, seed, stream,
                       index_base);
  return y;
}

}  // namespace

Tensor dropout(const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream,
               std::uint64_t index_base) {
  return run_dropout("ops::dropout", "x", x, p, seed, stream, index_base, true);
}

Tensor dropout_backward(const Tensor& grad_y, float p, std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t index_base) {
  return run_dropout("ops::dropout_backward", "grad_y", grad_y, p, seed, stream, index_base, false);
}

Tensor add(const Tensor& a, const Tensor& b) {
  constexpr const char* op = "ops::add";
  const DType dt = native_rows({&a, &b});
  if (dt != DType::f32) {  // one add_any on the storage dtype: f32 add, rounded once
    check_tensor(op, "a", a, dt);
    check_like_any(op, "b", b, "a", a);
    Tensor out = Tensor::empty(a.shape(), dt, a.device());
    if (out.numel() > 0)
      kernels_of(a).add_any(stream_of(a), dt, a.data_ptr(), b.data_ptr(), out.data_ptr(),
                            out.numel());
    return out;
  }
  if (any_half({&a, &b})) {
    MixedOp m(op, {&a, &b});
    return m.out(m.run([&] { return add(m.in(a), m.in(b)); }));
  }
  check_tensor(op, "a", a);
  check_like(op, "b", b, "a", a);
  Tensor out = Tensor::empty(a.shape(), DType::f32, a.device());
  if (out.numel() == 0) return out;
  // The canonical tree over two inputs is one add per element (in both modes).
  const float* in[2] = {a.data<float>(), b.data<float>()};
  kernels_of(a).sum_inputs(stream_of(a), in, 2, out.data<float>(), out.numel(),
                           Determinism::bitwise);
  return out;
}

Tensor sum_squares(const Tensor& x, Determinism mode) {
  if (any_half({&x})) {  // a scalar: stays f32
    MixedOp m("ops::sum_squares", {&x});
    return m.out(m.run([&] { return sum_squares(m.in(x), mode); }), DType::f32);
  }
  check_tensor("ops::sum_squares", "x", x);
  Tensor out = Tensor::empty({}, DType::f32, x.device());
  // Launched for an empty x too: the sum of nothing is +0.
  kernels_of(x).sum_squares(stream_of(x), x.data<float>(), x.numel(), out.data<float>(), mode);
  return out;
}

Tensor sum_squares_blocks(const Tensor& x) {
  check_tensor("ops::sum_squares_blocks", "x", x);
  Tensor out = Tensor::empty({gpt::squares_blocks(x.numel())}, DType::f32, x.device());
  if (out.numel() > 0)
    kernels_of(x).sum_squares_blocks(stream_of(x), x.data<float>(), x.numel(), out.data<float>());
  return out;
}

}  // namespace ditto::ops
