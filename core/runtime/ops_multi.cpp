// The multi-tensor ops of core/runtime/ops.h (adam_step_multi_, sum_squares_multi,
// scale_multi_, fill_multi_, copy_multi_): argument checks per entry, then one Kernels call on the
// device's current stream (Kernels::adam_step_multi and siblings; the defaults loop the per-tensor
// kernels).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/ops_check.h"

namespace ditto::ops {

using namespace internal;

bool has_multi_tensor_kernels(const Device& device) {
  return !device.is_cpu() && device.backend().kernels().has_multi_tensor_kernels();
}

bool has_multi_tensor_ex(const Device& device, DType t) {
  return !device.is_cpu() && device.backend().kernels().has_multi_tensor_ex(t);
}

namespace {

// A typed multi-tensor argument: bf16 or f16 (f32 where `f32_ok`), on `device`, and the device
// runs the typed kernels on its dtype.
void check_typed(const char* op, const char* arg, const Tensor& t, const Device& device,
                 const char* ref, bool f32_ok) {
  DITTO_CHECK(t.defined(), op, ": ", arg, ": expected a defined tensor, got an undefined tensor");
  check_device(op, arg, t, device, ref);
  const DType dt = t.dtype();
  DITTO_CHECK(dt == DType::bf16 || dt == DType::f16 || (f32_ok && dt == DType::f32), op, ": ", arg,
              ": expected dtype ", f32_ok ? "f32, bf16 or f16" : "bf16 or f16", ", got ", t.str());
  DITTO_CHECK(has_multi_tensor_ex(device, dt), op, ": ", arg, ": ", dtype_name(dt), " needs ",
              device.str(),
              "'s backend to run the typed multi-tensor kernels "
              "(Kernels::has_multi_tensor_ex), which it does not; got ",
              t.str());
}

// A Kernels::AdamTensor or AdamTensorEx with its Kernels::AdamParamState from entry t
// (checked); the caller sets the gradient.
template <class A>
A adam_tensor(const AdamStepTensors& t, bool amsgrad) {
  A a;
  a.param = t.param->data<float>();
  a.exp_avg = t.exp_avg->data<float>();
  a.exp_avg_sq = t.exp_avg_sq->data<float>();
  a.max_exp_avg_sq = amsgrad ? t.max_exp_avg_sq->data<float>() : nullptr;
  a.n = t.param->numel();
  a.bias_correction1 = t.bias_correction1;
  a.bias_correction2 = t.bias_correction2;
  a.decay = t.decay_scale.has_value();
  a.decay_scale = t.decay_scale.value_or(1.0f);
  return a;
}

// adam_step_multi_ with a typed argument: the same checks, grads and models as typed, then one
// Kernels::adam_step_multi_ex call.
void adam_step_multi_typed(const std::vector<AdamStepTensors>& tensors, double lr, double beta1,
                           double beta2, double eps, double weight_decay, bool amsgrad,
                           std::optional<float> grad_scale) {
  constexpr const char* op = "ops::adam_step_multi_";
  std::vector<Kernels::AdamTensorEx> list;
  list.reserve(tensors.size());
  const Tensor* first = nullptr;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const AdamStepTensors& t = tensors[i];
    const std::string at = "tensors[" + std::to_string(i) + "].";
    const std::string names[6] = {at + "param",      at + "grad",           at + "exp_avg",
                                  at + "exp_avg_sq", at + "max_exp_avg_sq", at + "model"};
    const Tensor* parts[5] = {t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq};
    for (int k = 0; k < (amsgrad ? 5 : 4); ++k)
      DITTO_CHECK(parts[k] != nullptr, op, ": ", names[k], ": expected a tensor, got null");
    check_tensor(op, names[0].c_str(), *t.param);
    if (first == nullptr) first = t.param;
    const Device& dev = first->device();
    check_device(op, names[0].c_str(), *t.param, dev, "tensors[0].param");
    check_typed(op, names[1].c_str(), *t.grad, dev, "tensors[0].param", /*f32_ok=*/true);
    DITTO_CHECK(t.grad->shape() == t.param->shape(), op, ": ", names[1], ": expected ",
                shape_str(t.param->shape()), " (the shape of ", names[0], "), got ", t.grad->str());
    for (int k = 2; k < (amsgrad ? 5 : 4); ++k)
      check_like(op, names[k].c_str(), *parts[k], names[0].c_str(), *t.param);
    auto a = adam_tensor<Kernels::AdamTensorEx>(t, amsgrad);
    a.grad = t.grad->data_ptr();
    a.grad_type = t.grad->dtype();
    if (t.model != nullptr) {
      check_typed(op, names[5].c_str(), *t.model, dev, "tensors[0].param", /*f32_ok=*/false);
      DITTO_CHECK(t.model->shape() == t.param->shape(), op, ": ", names[5], ": expected ",
                  shape_str(t.param->shape()), " (the shape of ", names[0], "), got ",
                  t.model->str());
      check_no_overlap(op, names[5].c_str(), *t.model, names[0].c_str(), *t.param);
      check_no_overlap(op, names[5].c_str(), *t.model, names[1].c_str(), *t.grad);
      a.model = t.model->data_ptr();
      a.model_type = t.model->dtype();
    }
    list.push_back(a);
  }
  kernels_of(*first).adam_step_multi_ex(stream_of(*first), list, lr, beta1, beta2, eps,
                                        weight_decay, amsgrad, grad_scale.has_value(),
                                        grad_scale.value_or(1.0f));
}

}  // namespace

void adam_step_multi_(const std::vector<AdamStepTensors>& tensors, double lr, double beta1,
                      double beta2, double eps, double weight_decay, bool amsgrad,
                      std::optional<float> grad_scale) {
  constexpr const char* op = "ops::adam_step_multi_";
  if (tensors.empty()) return;
  bool typed = grad_scale.has_value();
  for (const AdamStepTensors& t : tensors)
    typed = typed || t.model != nullptr ||
            (t.grad != nullptr && t.grad->defined() && t.grad->dtype() != DType::f32);
  if (typed)
    return adam_step_multi_typed(tensors, lr, beta1, beta2, eps, weight_decay, amsgrad, grad_scale);
  std::vector<Kernels::AdamTensor> list;
  list.reserve(tensors.size());
  const Tensor* first = nullptr;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const AdamStepTensors& t = tensors[i];
    const std::string at = "tensors[" + std::to_string(i) + "].";
    const std::string names[5] = {at + "param", at + "grad", at + "exp_avg", at + "exp_avg_sq",
                                  at + "max_exp_avg_sq"};
    const Tensor* parts[5] = {t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq};
    for (int k = 0; k < (amsgrad ? 5 : 4); ++k)
      DITTO_CHECK(parts[k] != nullptr, op, ": ", names[k], ": expected a tensor, got null");
    check_tensor(op, names[0].c_str(), *t.param);
    if (first == nullptr) first = t.param;
    check_device(op, names[0].c_str(), *t.param, first->device(), "tensors[0].param");
    for (int k = 1; k < (amsgrad ? 5 : 4); ++k)
      check_like(op, names[k].c_str(), *parts[k], names[0].c_str(), *t.param);
    auto a = adam_tensor<Kernels::AdamTensor>(t, amsgrad);
    a.grad = t.grad->data<float>();
    list.push_back(a);
  }
  kernels_of(*first).adam_step_multi(stream_of(*first), list, lr, beta1, beta2, eps, weight_decay,
                                     amsgrad);
}

namespace {

// Each xs[i] an f32 tensor on xs[0]'s device; returns the data pointers and sizes.
template <class T, class P>
void check_list(const char* op, const std::vector<T*>& xs, std::vector<P>& ptrs,
                std::vector<std::int64_t>& ns) {
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::string arg = "xs[" + std::to_string(i) + "]";
    DITTO_CHECK(xs[i] != nullptr, op, ": ", arg, ": expected a tensor, got null");
    check_tensor(op, arg.c_str(), *xs[i]);
    check_device(op, arg.c_str(), *xs[i], xs[0]->device(), "xs[0]");
    ptrs.push_back(xs[i]->template data<float>());
    ns.push_back(xs[i]->numel());
  }
}

}  // namespace

Tensor sum_squares_multi(const std::vector<const Tensor*>& xs, Determinism mode) {
  constexpr const char* op = "ops::sum_squares_multi";
  DITTO_CHECK(!xs.empty(), op, ": xs: expected at least one tensor, got none");
  bool typed = false;
  for (const Tensor* x : xs)
    typed = typed || (x != nullptr && x->defined() && x->dtype() != DType::f32);
  if (typed) {  // Kernels::sum_squares_multi_ex on the tensors as stored
    std::vector<const void*> ptrs;
    std::vector<DType> types;
    std::vector<std::int64_t> ns;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::string arg = "xs[" + std::to_string(i) + "]";
      DITTO_CHECK(xs[i] != nullptr, op, ": ", arg, ": expected a tensor, got null");
      DITTO_CHECK(xs[i]->defined() && !xs[i]->device().is_cpu(), op, ": ", arg,
                  ": expected a defined tensor on a device (sim or cuda), got ",
                  xs[i]->defined() ? xs[i]->str() : std::string("an undefined tensor"));
      check_typed(op, arg.c_str(), *xs[i], xs[0]->device(), "xs[0]", /*f32_ok=*/true);
      ptrs.push_back(xs[i]->data_ptr());
      types.push_back(xs[i]->dtype());
      ns.push_back(xs[i]->numel());
    }
    Tensor out = Tensor::empty({static_cast<std::int64_t>(xs.size())}, DType::f32, xs[0]->device());
    kernels_of(*xs[0]).sum_squares_multi_ex(stream_of(*xs[0]), ptrs, types, ns, out.data<float>(),
                                            mode);
    return out;
  }
  std::vector<const float*> ptrs;
  std::vector<std::int64_t> ns;
  check_list(op, xs, ptrs, ns);
  Tensor out = Tensor::empty({static_cast<std::int64_t>(xs.size())}, DType::f32, xs[0]->device());
  kernels_of(*xs[0]).sum_squares_multi(stream_of(*xs[0]), ptrs, ns, out.data<float>(), mode);
  return out;
}

void scale_multi_(const std::vector<Tensor*>& xs, float alpha) {
  constexpr const char* op = "ops::scale_multi_";
  if (xs.empty()) return;
  std::vector<float*> ptrs;
  std::vector<std::int64_t> ns;
  check_list(op, xs, ptrs, ns);
  kernels_of(*xs[0]).scale_multi(stream_of(*xs[0]), ptrs, ns, alpha);
}

void fill_multi_(const std::vector<Tensor*>& xs, float value) {
  constexpr const char* op = "ops::fill_multi_";
  if (xs.empty()) return;
  std::vector<float*> ptrs;
  std::vector<std::int64_t> ns;
  check_list(op, xs, ptrs, ns);
  kernels_of(*xs[0]).fill_multi(stream_of(*xs[0]), ptrs, ns, value);
}

void copy_multi_(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs) {
  constexpr const char* op = "ops::copy_multi_";
  DITTO_CHECK(dsts.size() == srcs.size(), op, ": dsts, srcs: expected lists of one length, got ",
              dsts.size(), " dsts and ", srcs.size(), " srcs");
  if (dsts.empty()) return;
  DITTO_CHECK(dsts[0].defined() && srcs[0].defined(), op, ": ",
              dsts[0].defined() ? "srcs[0]" : "dsts[0]",
              ": expected a defined tensor, got an undefined tensor");
  const DType from = srcs[0].dtype(), to = dsts[0].dtype();
  const bool convert_ok = from == to ||
                          (from == DType::f32 && (to == DType::bf16 || to == DType::f16)) ||
                          (to == DType::f32 && (from == DType::bf16 || from == DType::f16));
  DITTO_CHECK(convert_ok, op,
              ": srcs[0], dsts[0]: expected one dtype, or f32 -> bf16 / f16, or "
              "bf16 / f16 -> f32, got ",
              srcs[0].str(), " -> ", dsts[0].str());
  const Device& device = dsts[0].device();
  std::vector<const void*> src_ptrs;
  std::vector<void*> dst_ptrs;
  std::vector<std::int64_t> ns;
  for (std::size_t i = 0; i < dsts.size(); ++i) {
    const std::string d = "dsts[" + std::to_string(i) + "]", r = "srcs[" + std::to_string(i) + "]";
    check_tensor(op, d.c_str(), dsts[i], to);
    check_device(op, d.c_str(), dsts[i], device, "dsts[0]");
    check_tensor(op, r.c_str(), srcs[i], from);
    check_device(op, r.c_str(), srcs[i], device, "dsts[0]");
    DITTO_CHECK(dsts[i].numel() == srcs[i].numel(), op, ": ", d, ": expected ", srcs[i].numel(),
                " elements (those of ", r, "), got ", dsts[i].str());
    src_ptrs.push_back(srcs[i].data_ptr());
    dst_ptrs.push_back(dsts[i].data_ptr());
    ns.push_back(dsts[i].numel());
  }
  // No dst overlaps another dst or any src: the dsts sorted by (buffer, start), neighbours
  // apart, and each src's range against the dsts of its buffer that start before its end.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < dsts.size(); ++i)
    if (dsts[i].nbytes() > 0) order.push_back(i);
  auto key = [&](const Tensor& t) { return std::make_pair(t.buffer().get(), t.offset_bytes()); };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return key(dsts[a]) < key(dsts[b]); });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const Tensor &a = dsts[order[k - 1]], &b = dsts[order[k]];
    DITTO_CHECK(!overlaps(a, b), op, ": dsts[", order[k], "]: must not share memory with dsts[",
                order[k - 1], "] (got ", b.str(), " overlapping ", a.str(), ")");
  }
  for (std::size_t i = 0; i < srcs.size(); ++i) {
    if (srcs[i].nbytes() == 0) continue;
    // Of the sorted, disjoint dsts the last one starting before the src's end ends last: if it
    // does not reach into the src, none does.
    const auto end =
        std::make_pair(srcs[i].buffer().get(), srcs[i].offset_bytes() + srcs[i].nbytes());
    auto it = std::lower_bound(order.begin(), order.end(), end,
                               [&](std::size_t a, const auto& e) { return key(dsts[a]) < e; });
    if (it == order.begin()) continue;
    const std::size_t j = *(it - 1);
    DITTO_CHECK(!overlaps(dsts[j], srcs[i]), op, ": dsts[", j,
                "]: must not share memory with srcs[", i, "] (got ", dsts[j].str(), " overlapping ",
                srcs[i].str(), ")");
  }
  kernels_of(dsts[0]).copy_multi(stream_of(dsts[0]), from, to, src_ptrs, dst_ptrs, ns);
}

}  // namespace ditto::ops
