// nn::Container: settings passed on to the children.
#include "core/nn/container.h"

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

void Container::prefix_names(Module& child, const std::string& prefix) {
  for (Parameter* p : child.parameters()) p->name = prefix + "." + p->name;
}

}  // namespace ditto::nn
