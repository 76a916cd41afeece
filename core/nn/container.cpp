// nn::Container: the children it owns, settings passed on to them, clone child by child.
#include "core/nn/container.h"

#include "core/nn/checked_clone.h"

namespace ditto::nn {

void Container::set_determinism(Determinism d) {
  determinism_ = d;
  for (Module* c : children()) c->set_determinism(d);
}

void Container::set_micro_shards(std::vector<std::int64_t> bounds) {
  for (Module* c : children()) c->set_micro_shards(bounds);
  micro_shards_ = std::move(bounds);
}

void Container::set_training(bool v) {
  training_ = v;
  for (Module* c : children()) c->set_training(v);
}

void Container::set_step(std::int64_t step) {
  step_ = step;
  for (Module* c : children()) c->set_step(step);
}

void Container::set_first_row(std::int64_t row) {
  first_row_ = row;
  for (Module* c : children()) c->set_first_row(row);
}

std::vector<Parameter*> Container::parameters() {
  std::vector<Parameter*> out;
  for (Module* c : children())
    for (Parameter* p : c->parameters()) out.push_back(p);
  return out;
}

std::vector<Module*> Container::children() {
  std::vector<Module*> out;
  for (const Child& c : children_) out.push_back(c.module.get());
  return out;
}

void Container::add_module(const std::string& child_name, std::unique_ptr<Module> child) {
  DITTO_CHECK(child != nullptr, name(), ".add_child: ", child_name,
              ": expected a module, got null");
  if (!child_name.empty()) prefix_names(*child, child_name);
  children_.push_back({child_name, std::move(child)});
}

Tensor Container::forward_chain(const Tensor& x) {
  Tensor y = x;
  for (Module* c : children()) y = c->forward(y);
  return y;
}

Tensor Container::backward_chain(const Tensor& grad_output) {
  const std::vector<Module*> layers = children();
  Tensor g = grad_output;
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    g = (*it)->backward(g);
    if (grad_ready_hook_)
      for (Parameter* p : (*it)->parameters()) grad_ready_hook_(*p);
  }
  return g;
}

std::unique_ptr<Module> Container::clone() const {
  std::unique_ptr<Container> m =
      detail::checked_made(empty_clone(), *this, "Container::clone", "empty_clone");
  for (const Child& c : children_)
    m->add_module(c.name, checked_clone(*c.module, "Container::clone: a child"));
  copy_settings(*this, *m);
  return m;
}

std::unique_ptr<Container> Container::empty_clone() const {
  throw InternalError(name() + ".clone: a container that overrides children() overrides clone()");
}

void Container::prefix_names(Module& child, const std::string& prefix) {
  for (Parameter* p : child.parameters()) p->name = prefix + "." + p->name;
}

}  // namespace ditto::nn
