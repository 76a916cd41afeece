// nn::Sequential (children run in order, backward in reverse) and nn::mlp.
#include "core/nn/sequential.h"

#include "core/nn/linear.h"
#include "core/nn/relu.h"

namespace ditto::nn {

Sequential::Sequential(std::vector<std::unique_ptr<Module>> children) {
  for (auto& c : children) add(std::move(c));
}

Sequential& Sequential::add(std::unique_ptr<Module> child) {
  DITTO_CHECK(child != nullptr, "Sequential::add: child: expected a module, got null");
  DITTO_CHECK(child->num_inputs() == 1, "Sequential::add: child ", children_.size(), " (",
              child->name(), "): expected a module taking 1 input, got one taking ",
              child->num_inputs());
  const std::string prefix = std::to_string(children_.size()) + ".";
  for (Parameter* p : child->parameters()) p->name = prefix + p->name;
  child->set_determinism(determinism_);
  child->set_micro_shards(micro_shards_);
  child->set_training(training_);
  child->set_step(step_);
  child->set_first_row(first_row_);
  child->set_input_requires_grad(children_.empty() ? input_requires_grad_ : true);
  children_.push_back(std::move(child));
  return *this;
}

Module& Sequential::operator[](std::size_t i) const {
  DITTO_CHECK(i < children_.size(), "Sequential[]: index ", i, " out of range for ",
              children_.size(), " children");
  return *children_[i];
}

Tensor Sequential::forward(const Tensor& input) {
  DITTO_CHECK(!children_.empty(), "Sequential.forward: the container is empty");
  Tensor x = input;
  for (auto& c : children_) x = c->forward(x);
  return x;
}

Tensor Sequential::backward(const Tensor& grad_output) {
  DITTO_CHECK(!children_.empty(), "Sequential.backward: the container is empty");
  Tensor g = grad_output;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    g = (*it)->backward(g);
    if (grad_ready_hook_)
      for (Parameter* p : (*it)->parameters()) grad_ready_hook_(*p);
  }
  return g;
}

std::vector<Parameter*> Sequential::parameters() {
  std::vector<Parameter*> out;
  for (auto& c : children_)
    for (Parameter* p : c->parameters()) out.push_back(p);
  return out;
}

std::unique_ptr<Module> Sequential::clone() const {
  auto m = std::make_unique<Sequential>();
  copy_settings(*this, *m);
  for (auto& c : children_) m->add(c->clone());
  return m;
}

void Sequential::set_input_requires_grad(bool v) {
  input_requires_grad_ = v;
  if (!children_.empty()) children_.front()->set_input_requires_grad(v);
}

void Sequential::set_micro_shards(std::vector<std::int64_t> bounds) {
  for (auto& c : children_) c->set_micro_shards(bounds);
  micro_shards_ = std::move(bounds);
}

void Sequential::set_determinism(Determinism d) {
  determinism_ = d;
  for (auto& c : children_) c->set_determinism(d);
}

void Sequential::set_training(bool v) {
  training_ = v;
  for (auto& c : children_) c->set_training(v);
}

void Sequential::set_step(std::int64_t step) {
  step_ = step;
  for (auto& c : children_) c->set_step(step);
}

void Sequential::set_first_row(std::int64_t row) {
  first_row_ = row;
  for (auto& c : children_) c->set_first_row(row);
}

std::unique_ptr<Sequential> mlp(const std::vector<std::int64_t>& sizes, const Device& device,
                                std::uint64_t seed) {
  DITTO_CHECK(sizes.size() >= 2, "nn::mlp: sizes: expected at least 2 sizes (in, out), got ",
              sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    DITTO_CHECK(sizes[i] >= 1, "nn::mlp: sizes[", i, "]: expected >= 1, got ", sizes[i]);
  auto net = std::make_unique<Sequential>();
  net->set_input_requires_grad(false);
  for (std::size_t k = 0; k + 1 < sizes.size(); ++k) {
    if (k > 0) net->add(std::make_unique<ReLU>());
    net->add(std::make_unique<Linear>(sizes[k], sizes[k + 1], device, seed, k));
  }
  return net;
}

}  // namespace ditto::nn
