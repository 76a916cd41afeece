// nn::WithLoss: forward runs model then loss; backward runs loss then model.
#include "core/nn/with_loss.h"

namespace ditto::nn {

WithLoss::WithLoss(std::unique_ptr<Module> model, std::unique_ptr<Loss> loss)
    : model_(std::move(model)), loss_(std::move(loss)) {
  DITTO_CHECK(model_ != nullptr, "WithLoss: model: expected a module, got null");
  DITTO_CHECK(loss_ != nullptr, "WithLoss: loss: expected a loss, got null");
  DITTO_CHECK(model_->num_inputs() == 1, "WithLoss: model: expected a module taking 1 input, ",
              "got ", model_->name(), " taking ", model_->num_inputs());
  input_requires_grad_ = model_->input_requires_grad();
  determinism_ = model_->determinism();
  training_ = model_->training();
  step_ = model_->step();
  first_row_ = model_->first_row();
  loss_->set_determinism(determinism_);
}

Tensor WithLoss::forward(const std::vector<Tensor>& inputs) {
  DITTO_CHECK(inputs.size() == 2, "WithLoss.forward: takes 2 inputs (input, target), got ",
              inputs.size());
  Tensor out = model_->forward(inputs[0]);
  return loss_->forward(out, inputs[1]);
}

Tensor WithLoss::backward(const Tensor& grad_output) {
  Tensor g = loss_->backward(grad_output);
  return model_->backward(g);
}

std::unique_ptr<Module> WithLoss::clone() const {
  auto m = std::make_unique<WithLoss>(model_->clone(), loss_->clone());
  copy_settings(*this, *m);
  return m;
}

void WithLoss::set_input_requires_grad(bool v) {
  input_requires_grad_ = v;
  model_->set_input_requires_grad(v);
}

void WithLoss::set_grad_ready_hook(GradReadyHook hook) { model_->set_grad_ready_hook(std::move(hook)); }

void WithLoss::set_micro_shards(std::vector<std::int64_t> bounds) {
  model_->set_micro_shards(bounds);
  micro_shards_ = std::move(bounds);
}

void WithLoss::set_training(bool v) {
  training_ = v;
  model_->set_training(v);
}

void WithLoss::set_step(std::int64_t step) {
  step_ = step;
  model_->set_step(step);
}

void WithLoss::set_first_row(std::int64_t row) {
  first_row_ = row;
  model_->set_first_row(row);
}

void WithLoss::set_determinism(Determinism d) {
  determinism_ = d;
  model_->set_determinism(d);
  loss_->set_determinism(d);
}

}  // namespace ditto::nn
