// Tensor-level ops: argument checks in one place (NCCL's argcheck pattern), then one call into the
// backend's kernels on the current stream of the tensors' device. Backends trust what gets here.
#include "core/runtime/ops.h"

#include <vector>

#include "core/base/error.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops_check.h"
#include "core/runtime/ops_mixed.h"

namespace ditto::ops {

namespace {

using namespace internal;  // the argument checks (ops_check.h)

/// `m` is a 2-dim [rows, cols] tensor of m_type (default f32) and `v` a [cols] of v_type on m's
/// device, the two not sharing memory (checked with the written one, `v` when `v_written`, as the
/// output).
void check_matrix_and_cols(const char* op, const char* m_arg, const Tensor& m, const char* v_arg,
                           const Tensor& v, bool v_written, DType m_type = DType::f32,
                           DType v_type = DType::f32) {
  check_tensor(op, m_arg, m, m_type);
  check_dims(op, m_arg, m, 2, "[rows, cols]");
  check_tensor(op, v_arg, v, v_type);
  check_device(op, v_arg, v, m.device(), m_arg);
  DITTO_CHECK(v.shape() == Shape{m.size(1)}, op, ": ", v_arg, ": expected [cols] = [", m.size(1),
              "] for ", m_arg, " of ", shape_str(m.shape()), ", got ", v.str());
  if (v_written)
    check_no_overlap(op, v_arg, v, m_arg, m);
  else
    check_no_overlap(op, m_arg, m, v_arg, v);
}

/// `c` is the f32 [M, N] output of a product of `a` and `b`, on a's device, sharing no memory
/// with either (`typed`: of any dtype, the typed GEMM's, whose dtypes the backend accepted).
void check_product_out(const char* op, const Tensor& c, const Tensor& a, const Tensor& b,
                       std::int64_t M, std::int64_t N, bool typed = false) {
  check_tensor(op, "c", c, typed && c.defined() ? c.dtype() : DType::f32);
  check_device(op, "c", c, a.device(), "a");
  DITTO_CHECK(c.shape() == (Shape{M, N}), op, ": c: expected [M, N] = ", shape_str({M, N}),
              " for a of ", shape_str(a.shape()), " and b of ", shape_str(b.shape()), ", got ",
              c.str());
  check_no_overlap(op, "c", c, "a", a);
  check_no_overlap(op, "c", c, "b", b);
}

/// Row stride of a contiguous 2-dim tensor; at least 1 so backends never see a zero stride.
std::int64_t row_stride(const Tensor& t) { return t.size(1) > 0 ? t.size(1) : 1; }

struct GemmDims {
  std::int64_t M, N, K;
};

/// Checks a and b of op(a) @ op(b) and returns M, N, K (`typed`: a and b of any dtype, the
/// typed GEMM's, whose dtypes the backend accepted; else f32).
GemmDims check_matmul_operands(const char* op, const Tensor& a, const Tensor& b, bool trans_a,
                               bool trans_b, bool typed = false) {
  check_tensor(op, "a", a, typed && a.defined() ? a.dtype() : DType::f32);
  check_tensor(op, "b", b, typed && b.defined() ? b.dtype() : DType::f32);
  check_device(op, "b", b, a.device(), "a");
  check_dims(op, "a", a, 2, trans_a ? "[K, M] (trans_a)" : "[M, K]");
  check_dims(op, "b", b, 2, trans_b ? "[N, K] (trans_b)" : "[K, N]");
  GemmDims d{};
  d.M = trans_a ? a.size(1) : a.size(0);
  d.K = trans_a ? a.size(0) : a.size(1);
  d.N = trans_b ? b.size(0) : b.size(1);
  const std::int64_t bk = trans_b ? b.size(1) : b.size(0);
  DITTO_CHECK(bk == d.K, op, ": b: expected ", trans_b ? "[N, K] = " : "[K, N] = ",
              shape_str(trans_b ? Shape{d.N, d.K} : Shape{d.K, d.N}), " for a of ",
              shape_str(a.shape()), trans_a ? " (trans_a)" : "", ", got ", b.str());
  return d;
}

void launch_gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                 const GemmDims& d, float alpha, float beta, Determinism mode) {
  if (d.M == 0 || d.N == 0) return;
  kernels_of(c).gemm(stream_of(c), trans_a, trans_b, d.M, d.N, d.K, alpha, a.data<float>(),
                     row_stride(a), b.data<float>(), row_stride(b), beta, c.data<float>(),
                     row_stride(c), mode);
}

/// Whether the product of `a` and `b` into a `c_type` output runs as one typed GEMM on their
/// backend (Kernels::has_gemm_ex): both on a device and the backend runs these dtypes natively.
/// Otherwise a bf16 / f16 product goes through MixedOp's f32 scratch (Note [Mixed precision]).
bool native_gemm(const Tensor& a, const Tensor& b, DType c_type, Determinism mode) {
  if (!a.defined() || !b.defined() || a.device().is_cpu() || b.device() != a.device()) return false;
  return kernels_of(a).has_gemm_ex(a.dtype(), b.dtype(), c_type, mode);
}

/// The typed GEMM c = alpha * op(a) @ op(b) + beta * c (+ bias[n] when bias is defined) on
/// checked tensors.
/// With `epilogue` gelu_aux_bias or dgelu, `aux` is its pre-GELU matrix.
void launch_gemm_ex(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b,
                    const GemmDims& d, float alpha, float beta, Determinism mode,
                    const Tensor& bias = Tensor(), GemmEpilogue epilogue = GemmEpilogue::none,
                    const Tensor& aux = Tensor()) {
  if (d.M == 0 || d.N == 0) return;
  const bool with_bias = bias.defined();
  if (with_bias && epilogue == GemmEpilogue::none) epilogue = GemmEpilogue::bias;
  const GemmExArgs g{.trans_a = trans_a,
                     .trans_b = trans_b,
                     .M = d.M,
                     .N = d.N,
                     .K = d.K,
                     .alpha = alpha,
                     .A = a.data_ptr(),
                     .a_type = a.dtype(),
                     .lda = row_stride(a),
                     .B = b.data_ptr(),
                     .b_type = b.dtype(),
                     .ldb = row_stride(b),
                     .beta = beta,
                     .C = c.data_ptr(),
                     .c_type = c.dtype(),
                     .ldc = row_stride(c),
                     .epilogue = epilogue,
                     .bias = with_bias ? bias.data_ptr() : nullptr,
                     .aux = aux.defined() ? aux.data_ptr() : nullptr,
                     .ld_aux = aux.defined() ? row_stride(aux) : 1,
                     .mode = mode};
  kernels_of(c).gemm_ex(stream_of(c), g);
}

/// The storage dtype of a new product of a and b: the first bf16 / f16 of the two, else f32
/// (MixedOp's rule, Note [Mixed precision]).
DType product_dtype(const Tensor& a, const Tensor& b) {
  if (is_half(a)) return a.dtype();
  if (is_half(b)) return b.dtype();
  return DType::f32;
}

/// Checks a one-element f32 gradient-of-loss tensor on `device`.
void check_grad_loss(const char* op, const Tensor& g, const Device& device, const char* ref) {
  check_tensor(op, "grad_loss", g);
  check_device(op, "grad_loss", g, device, ref);
  DITTO_CHECK(g.numel() == 1, op, ": grad_loss: expected a one-element (0-dim) f32 tensor, got ",
              g.str());
}

/// Checks logits [N, C] of dtype `dt` (f32, or the storage dtype of cross_entropy(_backward)_ex)
/// and targets [N] i64 on one device, and (on the host) that every target lies in [0, C).
void check_cross_entropy_args(const char* op, const Tensor& logits, const Tensor& targets,
                              DType dt = DType::f32) {
  check_tensor(op, "logits", logits, dt);
  check_dims(op, "logits", logits, 2, "[N, C]");
  check_tensor(op, "targets", targets, DType::i64);
  check_device(op, "targets", targets, logits.device(), "logits");
  const std::int64_t n = logits.size(0), classes = logits.size(1);
  DITTO_CHECK(targets.shape() == Shape{n}, op, ": targets: expected [N] = [", n, "] for logits of ",
              shape_str(logits.shape()), ", got ", targets.str());
  const std::vector<std::int64_t> t = targets.to_vector<std::int64_t>();
  for (std::size_t i = 0; i < t.size(); ++i)
    DITTO_CHECK(t[i] >= 0 && t[i] < classes, op, ": targets[", i, "] = ", t[i],
                " out of range [0, ", classes, ")");
}

/// Checks input/target of an MSE op (same shape, 1 or 2 dims); returns {rows, cols}.
std::pair<std::int64_t, std::int64_t> check_mse_args(const char* op, const Tensor& input,
                                                     const Tensor& target) {
  check_tensor(op, "input", input);
  check_tensor(op, "target", target);
  check_device(op, "target", target, input.device(), "input");
  DITTO_CHECK(input.dim() == 1 || input.dim() == 2, op,
              ": input: expected a 1-dim [N] or 2-dim [N, F] tensor, got ", input.str());
  DITTO_CHECK(target.shape() == input.shape(), op, ": target: expected ", shape_str(input.shape()),
              " (the shape of input), got ", target.str());
  return {input.size(0), input.dim() == 2 ? input.size(1) : 1};
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, Tensor& c, bool trans_a, bool trans_b, float alpha,
          float beta, Determinism mode) {
  constexpr const char* op = "ops::gemm";
  if (any_half({&a, &b, &c})) {  // Note [Mixed precision]
    check_no_overlap(op, "c", c, "a", a);
    check_no_overlap(op, "c", c, "b", b);
    if (c.defined() && native_gemm(a, b, c.dtype(), mode)) {  // one typed GEMM, no f32 copies
      const GemmDims d = check_matmul_operands(op, a, b, trans_a, trans_b, /*typed=*/true);
      check_product_out(op, c, a, b, d.M, d.N, /*typed=*/true);
      launch_gemm_ex(a, b, c, trans_a, trans_b, d, alpha, beta, mode);
      return;
    }
    MixedOp m(op, {&a, &b, &c});
    Tensor cf = m.in(c);
    m.run([&] { gemm(m.in(a), m.in(b), cf, trans_a, trans_b, alpha, beta, mode); });
    m.write_back(cf, c);
    return;
  }
  const GemmDims d = check_matmul_operands(op, a, b, trans_a, trans_b);
  check_product_out(op, c, a, b, d.M, d.N);
  launch_gemm(a, b, c, trans_a, trans_b, d, alpha, beta, mode);
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Determinism mode) {
  if (any_half({&a, &b})) {
    const DType storage = product_dtype(a, b);
    if (native_gemm(a, b, storage, mode)) {  // one typed GEMM into the storage dtype
      const GemmDims d = check_matmul_operands("ops::matmul", a, b, trans_a, trans_b, true);
      Tensor c = Tensor::empty({d.M, d.N}, storage, a.device());
      launch_gemm_ex(a, b, c, trans_a, trans_b, d, 1.0f, 0.0f, mode);
      return c;
    }
    MixedOp m("ops::matmul", {&a, &b});
    return m.out(m.run([&] { return matmul(m.in(a), m.in(b), trans_a, trans_b, mode); }));
  }
  const GemmDims d = check_matmul_operands("ops::matmul", a, b, trans_a, trans_b);
  Tensor c = Tensor::empty({d.M, d.N}, DType::f32, a.device());
  launch_gemm(a, b, c, trans_a, trans_b, d, 1.0f, 0.0f, mode);
  return c;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias, Determinism mode) {
  constexpr const char* op = "ops::linear";
  const DType out = x.defined() && w.defined() ? product_dtype(x, w) : DType::f32;
  if (bias.defined() && bias.dtype() == out && native_gemm(x, w, out, mode)) {
    const GemmDims d = check_matmul_operands(op, x, w, false, true, /*typed=*/true);
    check_tensor(op, "bias", bias, out);
    check_device(op, "bias", bias, x.device(), "x");
    DITTO_CHECK(bias.shape() == Shape{d.N}, op, ": bias: expected [out] = [", d.N, "] for w of ",
                shape_str(w.shape()), ", got ", bias.str());
    Tensor y = Tensor::empty({d.M, d.N}, out, x.device());
    launch_gemm_ex(x, w, y, false, true, d, 1.0f, 0.0f, mode, bias);
    return y;
  }
  Tensor y = matmul(x, w, false, true, mode);
  if (bias.defined()) add_bias_(y, bias);
  return y;
}

bool linear_gelu_fused(const Tensor& x, const Tensor& w, const Tensor& bias, Determinism mode) {
  if (mode != Determinism::fast || !x.defined() || !native_gemm(x, w, x.dtype(), mode))
    return false;
  const DType t = x.dtype();
  if (w.dtype() != t || (bias.defined() && (bias.dtype() != t || bias.device() != x.device())))
    return false;
  return kernels_of(x).has_gemm_gelu_epilogue(t, mode);
}

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre,
                   Determinism mode) {
  constexpr const char* op = "ops::linear_gelu";
  if (!linear_gelu_fused(x, w, bias, mode)) {  // the two ops, their bits
    pre = linear(x, w, bias, mode);
    return gelu(pre);
  }
  const GemmDims d = check_matmul_operands(op, x, w, false, true, /*typed=*/true);
  DITTO_CHECK(!bias.defined() || bias.shape() == Shape{d.N}, op, ": bias: expected [out] = [", d.N,
              "] for w of ", shape_str(w.shape()), ", got ", bias.str());
  pre = Tensor::empty({d.M, d.N}, x.dtype(), x.device());
  Tensor y = Tensor::empty({d.M, d.N}, x.dtype(), x.device());
  launch_gemm_ex(x, w, y, false, true, d, 1.0f, 0.0f, mode, bias, GemmEpilogue::gelu_aux_bias, pre);
  return y;
}

Tensor matmul_dgelu(const Tensor& gy, const Tensor& w, const Tensor& pre, Determinism mode) {
  constexpr const char* op = "ops::matmul_dgelu";
  if (!linear_gelu_fused(gy, w, pre, mode))  // the two ops, their bits
    return gelu_backward(pre, matmul(gy, w, false, false, mode));
  const GemmDims d = check_matmul_operands(op, gy, w, false, false, /*typed=*/true);
  DITTO_CHECK(pre.shape() == (Shape{d.M, d.N}), op,
              ": pre: expected [rows, in] = ", shape_str({d.M, d.N}), " for gy of ",
              shape_str(gy.shape()), " and w of ", shape_str(w.shape()), ", got ", pre.str());
  Tensor gx = Tensor::empty({d.M, d.N}, gy.dtype(), gy.device());
  launch_gemm_ex(gy, w, gx, false, false, d, 1.0f, 0.0f, mode, Tensor(), GemmEpilogue::dgelu, pre);
  return gx;
}

void add_bias_(Tensor& y, const Tensor& bias) {
  if (any_half({&y, &bias})) {
    MixedOp m("ops::add_bias_", {&y, &bias});
    Tensor yf = m.in(y);
    m.run([&] { add_bias_(yf, m.in(bias)); });
    m.write_back(yf, y);
    return;
  }
  check_matrix_and_cols("ops::add_bias_", "y", y, "bias", bias, /*v_written=*/false);
  if (y.numel() == 0) return;
  kernels_of(y).add_bias(stream_of(y), y.data<float>(), bias.data<float>(), y.size(0), y.size(1));
}

namespace {
// The bf16 / f16 path of a reduction over x's rows into `out` (Note [Mixed precision]): when
// either is bf16 or f16, runs f32_path(x in f32, out in f32) and rounds the result back into out,
// and returns true; else returns false (the caller runs its f32 path).
template <typename F>
bool mixed_rows(const char* op, const Tensor& x, Tensor& out, const F& f32_path) {
  if (!any_half({&x, &out})) return false;
  check_no_overlap(op, "out", out, "x", x);
  MixedOp m(op, {&x, &out});
  Tensor of = m.in(out);
  m.run([&] { f32_path(m.in(x), of); });
  m.write_back(of, out);
  return true;
}

// Whether a reduction over the rows of x into out runs as the backend's typed kernel
// (Kernels::has_sum_rows_ex): x bf16 / f16, out of x's dtype or f32, both on one device (not
// the host). Otherwise the op takes mixed_rows or its f32 path.
bool native_sum_rows(const Tensor& x, const Tensor& out, Determinism mode) {
  if (!is_half(x) || !out.defined() || x.device().is_cpu() || out.device() != x.device())
    return false;
  if (out.dtype() != x.dtype() && out.dtype() != DType::f32) return false;
  return kernels_of(x).has_sum_rows_ex(x.dtype(), out.dtype(), mode);
}
}  // namespace

void sum_rows(const Tensor& x, Tensor& out, float beta, Determinism mode) {
  constexpr const char* op = "ops::sum_rows";
  if (native_sum_rows(x, out, mode)) {  // sum_rows_ex on the stored x and out
    check_matrix_and_cols(op, "x", x, "out", out, /*v_written=*/true, x.dtype(), out.dtype());
    if (out.numel() == 0) return;
    kernels_of(x).sum_rows_ex(stream_of(x), x.data_ptr(), x.dtype(), x.size(0), x.size(1), beta,
                              out.data_ptr(), out.dtype(), mode);
    return;
  }
  auto f32 = [&](const Tensor& xf, Tensor& of) { sum_rows(xf, of, beta, mode); };
  if (mixed_rows(op, x, out, f32)) return;
  check_matrix_and_cols(op, "x", x, "out", out, /*v_written=*/true);
  if (out.numel() == 0) return;  // rows == 0 still sets out = beta * out
  kernels_of(x).sum_rows(stream_of(x), x.data<float>(), x.size(0), x.size(1), beta,
                         out.data<float>(), mode);
}

Tensor relu(const Tensor& x) { return internal::unary_op("ops::relu", x, relu, &Kernels::relu); }

Tensor relu_backward(const Tensor& y, const Tensor& grad_y) {
  return internal::unary_backward_op("ops::relu_backward", "y", y, grad_y, relu_backward,
                                     &Kernels::relu_backward);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  const DType dt = native_rows({&logits});
  if (dt != DType::f32) {  // cross_entropy_ex on the stored logits; losses f32
    check_cross_entropy_args("ops::cross_entropy", logits, targets, dt);
    const std::int64_t n = logits.size(0);
    Tensor losses = Tensor::empty({n}, DType::f32, logits.device());
    if (n > 0)
      kernels_of(logits).cross_entropy_ex(stream_of(logits), dt, logits.data_ptr(),
                                          targets.data<std::int64_t>(), n, logits.size(1),
                                          losses.data<float>());
    return losses;
  }
  if (any_half({&logits})) {  // per-sample losses stay f32
    MixedOp m("ops::cross_entropy", {&logits});
    return m.out(m.run([&] { return cross_entropy(m.in(logits), targets); }), DType::f32);
  }
  check_cross_entropy_args("ops::cross_entropy", logits, targets);
  const std::int64_t n = logits.size(0);
  Tensor losses = Tensor::empty({n}, DType::f32, logits.device());
  if (n > 0)
    kernels_of(logits).cross_entropy(stream_of(logits), logits.data<float>(),
                                     targets.data<std::int64_t>(), n, logits.size(1),
                                     losses.data<float>());
  return losses;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                              float scale) {
  constexpr const char* op = "ops::cross_entropy_backward";
  // cross_entropy_backward_ex on the stored logits (grad_loss f32), dlogits in their dtype.
  const DType dt = is_half(grad_loss) ? DType::f32 : native_rows({&logits});
  if (dt != DType::f32) {
    check_cross_entropy_args(op, logits, targets, dt);
    check_grad_loss(op, grad_loss, logits.device(), "logits");
    Tensor grad = Tensor::empty(logits.shape(), dt, logits.device());
    if (grad.numel() > 0)
      kernels_of(logits).cross_entropy_backward_ex(
          stream_of(logits), dt, logits.data_ptr(), targets.data<std::int64_t>(), logits.size(0),
          logits.size(1), grad_loss.data<float>(), scale, grad.data_ptr());
    return grad;
  }
  if (any_half({&logits, &grad_loss})) {  // dlogits in the logits' dtype
    MixedOp m(op, {&logits, &grad_loss});
    const DType out = is_half(logits) ? logits.dtype() : m.storage();
    return m.out(m.run([&] {
      return cross_entropy_backward(m.in(logits), targets, m.in(grad_loss), scale);
    }),
                 out);
  }
  check_cross_entropy_args(op, logits, targets);
  check_grad_loss(op, grad_loss, logits.device(), "logits");
  Tensor grad = Tensor::empty(logits.shape(), DType::f32, logits.device());
  if (grad.numel() > 0)
    kernels_of(logits).cross_entropy_backward(
        stream_of(logits), logits.data<float>(), targets.data<std::int64_t>(), logits.size(0),
        logits.size(1), grad_loss.data<float>(), scale, grad.data<float>());
  return grad;
}

bool cross_entropy_fused_available(const Tensor& logits, const Tensor& targets, Determinism mode) {
  if (mode != Determinism::fast || !logits.defined() || !targets.defined()) return false;
  if (logits.device().is_cpu() || targets.device() != logits.device() || logits.dim() != 2)
    return false;
  return kernels_of(logits).has_cross_entropy_fused(logits.dtype(), mode);
}

Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, const Tensor& grad_loss,
                           float scale) {
  constexpr const char* op = "ops::cross_entropy_fused";
  DITTO_CHECK(logits.defined(), op, ": logits: expected a defined tensor, got an undefined tensor");
  check_cross_entropy_args(op, logits, targets, logits.dtype());  // every target, on the host
  check_grad_loss(op, grad_loss, logits.device(), "logits");
  DITTO_CHECK(cross_entropy_fused_available(logits, targets, Determinism::fast), op,
              ": logits: expected f32, bf16 or f16 logits on a device whose backend "
              "has_cross_entropy_fused (fast mode; ops::cross_entropy_fused_available), got ",
              logits.str());
  const std::int64_t n = logits.size(0);
  Tensor losses = Tensor::empty({n}, DType::f32, logits.device());
  if (logits.numel() > 0)
    kernels_of(logits).cross_entropy_fused(stream_of(logits), logits.dtype(), logits.data_ptr(),
                                           targets.data<std::int64_t>(), n, logits.size(1),
                                           grad_loss.data<float>(), scale, losses.data<float>());
  return losses;
}

Tensor mse(const Tensor& input, const Tensor& target) {
  if (any_half({&input, &target})) {  // per-sample losses stay f32
    MixedOp m("ops::mse", {&input, &target});
    return m.out(m.run([&] { return mse(m.in(input), m.in(target)); }), DType::f32);
  }
  const auto [rows, cols] = check_mse_args("ops::mse", input, target);
  Tensor losses = Tensor::empty({rows}, DType::f32, input.device());
  if (rows > 0)  // cols == 0 gives zero losses
    kernels_of(input).mse(stream_of(input), input.data<float>(), target.data<float>(), rows, cols,
                          losses.data<float>());
  return losses;
}

Tensor mse_backward(const Tensor& input, const Tensor& target, const Tensor& grad_loss,
                    float scale) {
  constexpr const char* op = "ops::mse_backward";
  if (any_half({&input, &target, &grad_loss})) {  // grad_input in the input's dtype
    MixedOp m(op, {&input, &target, &grad_loss});
    const DType out = is_half(input) ? input.dtype() : m.storage();
    return m.out(
        m.run([&] { return mse_backward(m.in(input), m.in(target), m.in(grad_loss), scale); }),
        out);
  }
  check_mse_args(op, input, target);
  check_grad_loss(op, grad_loss, input.device(), "input");
  Tensor grad = Tensor::empty(input.shape(), DType::f32, input.device());
  if (grad.numel() > 0)
    kernels_of(input).mse_backward(stream_of(input), input.data<float>(), target.data<float>(),
                                   input.numel(), grad_loss.data<float>(), scale,
                                   grad.data<float>());
  return grad;
}

Tensor sum(const Tensor& x, float scale, Determinism mode) {
  if (any_half({&x})) {  // a scalar: stays f32
    MixedOp m("ops::sum", {&x});
    return m.out(m.run([&] { return sum(m.in(x), scale, mode); }), DType::f32);
  }
  check_tensor("ops::sum", "x", x);
  Tensor out = Tensor::empty({}, DType::f32, x.device());
  // Launched for an empty x too: the sum of nothing is 0.
  kernels_of(x).sum(stream_of(x), x.data<float>(), x.numel(), scale, out.data<float>(), mode);
  return out;
}

void fill_(Tensor& x, float value) {
  // fill_(u8_tensor, 3.0f) picks this overload: fill any other dtype through the generic one
  // instead of refusing it (a trap a newcomer fell into; f32 keeps its own kernel and bits).
  if (x.defined() && x.dtype() != DType::f32) return fill_(x, static_cast<double>(value));
  check_tensor("ops::fill_", "x", x);
  if (x.numel() > 0) kernels_of(x).fill_f32(stream_of(x), x.data<float>(), value, x.numel());
}

void axpy_(float alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "ops::axpy_";
  if (any_half({&x, &y})) {
    MixedOp m(op, {&x, &y});
    Tensor yf = m.in(y);
    m.run([&] { axpy_(alpha, m.in(x), yf); });
    m.write_back(yf, y);
    return;
  }
  check_tensor(op, "x", x);
  check_like(op, "y", y, "x", x);
  if (x.numel() > 0)
    kernels_of(y).axpy(stream_of(y), alpha, x.data<float>(), y.data<float>(), y.numel());
}

void scale_(Tensor& x, float alpha) {
  if (any_half({&x})) {
    MixedOp m("ops::scale_", {&x});
    Tensor xf = m.in(x);
    m.run([&] { scale_(xf, alpha); });
    m.write_back(xf, x);
    return;
  }
  check_tensor("ops::scale_", "x", x);
  if (x.numel() > 0) kernels_of(x).scale(stream_of(x), alpha, x.data<float>(), x.numel());
}

void sum_inputs(const std::vector<Tensor>& inputs, Tensor& out, Determinism mode) {
  constexpr const char* op = "ops::sum_inputs";
  check_tensor(op, "out", out);
  std::vector<const float*> ptrs;
  for (const void* p : check_reduce_inputs(op, inputs, out))
    ptrs.push_back(static_cast<const float*>(p));
  if (out.numel() == 0) return;
  kernels_of(out).sum_inputs(stream_of(out), ptrs.data(), static_cast<int>(ptrs.size()),
                             out.data<float>(), out.numel(), mode);
}

// ---- micro-sharded batch reductions ------------------------------------------------------------

void gemm_tn_sharded(const Tensor& a, const Tensor& b, Tensor& c,
                     const std::vector<std::int64_t>& bounds, bool accumulate) {
  constexpr const char* op = "ops::gemm_tn_sharded";
  // One typed kernel where the backend has it (Kernels::has_gemm_tn_sharded_ex): dY and X are
  // read in their storage dtype, no f32 copies; the bits of the MixedOp path below.
  bool typed = false;
  if (any_half({&a, &b, &c})) {  // c (a weight gradient) may stay f32: written directly
    check_no_overlap(op, "c", c, "a", a);
    check_no_overlap(op, "c", c, "b", b);
    typed = c.defined() && a.defined() && b.defined() && !a.device().is_cpu() &&
            b.device() == a.device() && c.device() == a.device() &&
            kernels_of(a).has_gemm_tn_sharded_ex(a.dtype(), b.dtype(), c.dtype());
    if (!typed) {
      MixedOp m(op, {&a, &b, &c});
      Tensor cf = m.in(c);
      m.run([&] { gemm_tn_sharded(m.in(a), m.in(b), cf, bounds, accumulate); });
      m.write_back(cf, c);
      return;
    }
  }
  check_tensor(op, "a", a, typed ? a.dtype() : DType::f32);
  check_dims(op, "a", a, 2, "[rows, M]");
  check_tensor(op, "b", b, typed ? b.dtype() : DType::f32);
  check_device(op, "b", b, a.device(), "a");
  check_dims(op, "b", b, 2, "[rows, N]");
  const std::int64_t rows = a.size(0), M = a.size(1), N = b.size(1);
  DITTO_CHECK(b.size(0) == rows, op, ": b: expected [rows, N] with rows = ", rows,
              " (the rows of a of ", shape_str(a.shape()), "), got ", b.str());
  check_product_out(op, c, a, b, M, N, typed);
  check_shard_bounds(op, bounds, rows);
  if (M == 0 || N == 0) return;
  if (typed) {
    kernels_of(c).gemm_tn_sharded_ex(stream_of(c), M, N, a.data_ptr(), a.dtype(), row_stride(a),
                                     b.data_ptr(), b.dtype(), row_stride(b), bounds, c.data_ptr(),
                                     c.dtype(), row_stride(c), accumulate);
    return;
  }
  kernels_of(c).gemm_tn_sharded(stream_of(c), M, N, a.data<float>(), row_stride(a), b.data<float>(),
                                row_stride(b), bounds, c.data<float>(), row_stride(c), accumulate);
}

void sum_rows_sharded(const Tensor& x, Tensor& out, const std::vector<std::int64_t>& bounds,
                      bool accumulate) {
  constexpr const char* op = "ops::sum_rows_sharded";
  // The typed kernel has one order in both modes: asked as bitwise.
  if (native_sum_rows(x, out, Determinism::bitwise)) {  // sum_rows_sharded_ex, stored x and out
    check_matrix_and_cols(op, "x", x, "out", out, /*v_written=*/true, x.dtype(), out.dtype());
    check_shard_bounds(op, bounds, x.size(0));
    if (out.numel() == 0) return;
    kernels_of(x).sum_rows_sharded_ex(stream_of(x), x.data_ptr(), x.dtype(), x.size(0), x.size(1),
                                      bounds, out.data_ptr(), out.dtype(), accumulate);
    return;
  }
  auto f32 = [&](const Tensor& xf, Tensor& of) { sum_rows_sharded(xf, of, bounds, accumulate); };
  if (mixed_rows(op, x, out, f32)) return;
  check_matrix_and_cols(op, "x", x, "out", out, /*v_written=*/true);
  check_shard_bounds(op, bounds, x.size(0));
  if (out.numel() == 0) return;
  kernels_of(x).sum_rows_sharded(stream_of(x), x.data<float>(), x.size(0), x.size(1), bounds,
                                 out.data<float>(), accumulate);
}

Tensor sum_sharded(const Tensor& x, const std::vector<std::int64_t>& bounds, float scale) {
  constexpr const char* op = "ops::sum_sharded";
  if (any_half({&x})) {  // a scalar: stays f32
    MixedOp m(op, {&x});
    return m.out(m.run([&] { return sum_sharded(m.in(x), bounds, scale); }), DType::f32);
  }
  check_tensor(op, "x", x);
  check_dims(op, "x", x, 1, "[n]");
  check_shard_bounds(op, bounds, x.size(0));
  Tensor out = Tensor::empty({}, DType::f32, x.device());
  // Launched for an empty x too: the sum of nothing is +0.
  kernels_of(x).sum_sharded(stream_of(x), x.data<float>(), bounds, scale, out.data<float>());
  return out;
}

// ---- Adam ---------------------------------------------------------------------------------------

void adam_step_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                Tensor& max_exp_avg_sq, double lr, double beta1, double beta2, double eps,
                double weight_decay, double bias_correction1, double bias_correction2,
                bool amsgrad) {
  constexpr const char* op = "ops::adam_step_";
  check_tensor(op, "param", param);
  auto check_like_param = [&](const char* arg, const Tensor& t) {
    check_like(op, arg, t, "param", param);
  };
  check_like_param("grad", grad);
  check_like_param("exp_avg", exp_avg);
  check_like_param("exp_avg_sq", exp_avg_sq);
  if (amsgrad) check_like_param("max_exp_avg_sq", max_exp_avg_sq);
  if (param.numel() == 0) return;
  kernels_of(param).adam_step(
      stream_of(param), param.data<float>(), grad.data<float>(), exp_avg.data<float>(),
      exp_avg_sq.data<float>(), amsgrad ? max_exp_avg_sq.data<float>() : nullptr, param.numel(), lr,
      beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, amsgrad);
}

}  // namespace ditto::ops
