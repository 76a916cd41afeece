// nn::Module defaults shared by every layer: multi-input forward dispatch, zero_grad, to, device,
// num_parameters, copy_settings.
#include "core/nn/module.h"

#include <cstring>
#include <string>

#include "core/runtime/ops.h"

namespace ditto::nn {

Tensor Module::forward(const Tensor&) {
  throw InvalidArgument(detail::cat(name(), ".forward: takes ", num_inputs(),
                                    " inputs, got 1 (call forward({...}) with all of them)"));
}

Tensor Module::forward(const std::vector<Tensor>& inputs) {
  DITTO_CHECK(static_cast<int>(inputs.size()) == num_inputs(), name(), ".forward: takes ",
              num_inputs(), " input", num_inputs() == 1 ? "" : "s", ", got ", inputs.size());
  return forward(inputs[0]);
}

void Module::require_forward(const std::string& call) const {
  DITTO_CHECK(has_forward_, call,
              ": no forward to go back through (call forward first; each forward allows one "
              "backward)");
}

namespace {
/// A dtype's name, or "DType value N" for a value outside the enumeration.
std::string dtype_description(DType t) {
  return is_valid_dtype(t) ? std::string(dtype_name(t))
                           : detail::cat("DType value ", static_cast<int>(t));
}
}  // namespace

DType grad_dtype(DType param, Determinism mode) {
  DITTO_CHECK(is_float_storage(param), "nn::grad_dtype: param: expected f32, bf16 or f16, got ",
              dtype_description(param));
  return mode == Determinism::bitwise ? DType::f32 : param;
}

Tensor& new_grad(Parameter& p, DType dtype, const Device& device, bool zero) {
  if (p.grad.defined()) return p.grad;
  const Tensor& home = p.grad_home;
  if (home.defined() && home.shape() == p.data.shape() && home.dtype() == dtype &&
      home.device() == device) {
    p.grad = home;
    if (zero) ops::fill_(p.grad, 0.0f);
  } else {
    p.grad = zero ? Tensor::zeros(p.data.shape(), dtype, device)
                  : Tensor::empty(p.data.shape(), dtype, device);
  }
  return p.grad;
}

void Module::zero_grad() {
  for (Parameter* p : parameters()) {
    const Device& dev = p->data.device();
    const DType gd = grad_dtype(p->data.dtype(), determinism_);
    if (!p->grad.defined() || p->grad.shape() != p->data.shape() || p->grad.device() != dev ||
        p->grad.dtype() != gd) {
      p->grad = Tensor();
      new_grad(*p, gd, dev, /*zero=*/true);
    } else if (dev.is_cpu()) {
      if (p->grad.numel() > 0) std::memset(p->grad.data_ptr(), 0, p->grad.nbytes());
    } else {
      ops::fill_(p->grad, 0.0f);  // in place: keeps views of the grad (e.g. buckets) valid
    }
  }
}

void Module::to(const Device& device) {
  for (Parameter* p : parameters()) {
    p->data = p->data.to(device);
    if (p->grad.defined()) p->grad = p->grad.to(device);
  }
}

void Module::to(DType dtype) {
  DITTO_CHECK(is_float_storage(dtype), name(), ".to: dtype: expected f32, bf16 or f16, got ",
              dtype_description(dtype));
  for (Parameter* p : parameters()) {
    p->data = p->data.to(dtype);
    p->grad = Tensor();
  }
}

Device Module::device() {
  auto ps = parameters();
  return ps.empty() ? Device::cpu() : ps.front()->data.device();
}

std::int64_t Module::num_parameters() {
  std::int64_t n = 0;
  for (Parameter* p : parameters()) n += p->data.numel();
  return n;
}

void copy_settings(const Module& from, Module& to) {
  to.set_determinism(from.determinism());
  to.set_input_requires_grad(from.input_requires_grad());
  to.set_micro_shards(from.micro_shards());
  to.set_training(from.training());
  to.set_step(from.step());
  to.set_first_row(from.first_row());
}

}  // namespace ditto::nn
