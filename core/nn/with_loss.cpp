// nn::WithLoss: forward runs model then loss; backward runs loss then model.
#include "core/nn/with_loss.h"

#include "core/nn/checked_clone.h"

namespace ditto::nn {

WithLoss::WithLoss(std::unique_ptr<Module> model, std::unique_ptr<Loss> loss)
    : loss_(std::move(loss)) {
  DITTO_CHECK(model != nullptr, "WithLoss: model: expected a module, got null");
  DITTO_CHECK(loss_ != nullptr, "WithLoss: loss: expected a loss, got null");
  DITTO_CHECK(model->num_inputs() == 1, "WithLoss: model: expected a module taking 1 input, ",
              "got ", model->name(), " taking ", model->num_inputs());
  input_requires_grad_ = model->input_requires_grad();
  determinism_ = model->determinism();
  training_ = model->training();
  step_ = model->step();
  first_row_ = model->first_row();
  loss_->set_determinism(determinism_);
  add_child("", std::move(model));
}

Tensor WithLoss::forward(const std::vector<Tensor>& inputs) {
  DITTO_CHECK(inputs.size() == 2, "WithLoss.forward: takes 2 inputs (input, target), got ",
              inputs.size());
  Tensor out = model().forward(inputs[0]);
  return loss_->forward(out, inputs[1]);
}

Tensor WithLoss::backward(const Tensor& grad_output) {
  Tensor g = loss_->backward(grad_output);
  return model().backward(g);
}

std::unique_ptr<Module> WithLoss::clone() const {
  auto m = std::make_unique<WithLoss>(checked_clone(child<Module>(0), "WithLoss::clone: model"),
                                      checked_clone(*loss_, "WithLoss::clone: loss"));
  copy_settings(*this, *m);
  return m;
}

void WithLoss::set_input_requires_grad(bool v) {
  input_requires_grad_ = v;
  model().set_input_requires_grad(v);
}

void WithLoss::set_grad_ready_hook(GradReadyHook hook) {
  model().set_grad_ready_hook(std::move(hook));
}

void WithLoss::set_determinism(Determinism d) {
  Container::set_determinism(d);
  loss_->set_determinism(d);
}

}  // namespace ditto::nn
