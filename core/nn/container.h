// nn::Container: a module built from child modules (the GPT's attention, MLP, block and model),
// which passes the settings of Module on to every child, as torch's Module.train() and
// Module.apply() reach a module's submodules.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/nn/module.h"

namespace ditto::nn {

class Container : public Module {
 public:
  /// Each stores the setting and passes it on to every child (children()).
  void set_determinism(Determinism d) override;
  /// Sample bounds (Note [Micro-shards]): the children scale them to their token rows.
  void set_micro_shards(std::vector<std::int64_t> bounds) override;
  void set_training(bool v) override;
  void set_step(std::int64_t step) override;
  void set_first_row(std::int64_t row) override;
  /// The children's parameters, in children() order.
  std::vector<Parameter*> parameters() override;

 protected:
  /// The child modules, in a fixed order (valid while this module lives): their parameters'
  /// order too.
  virtual std::vector<Module*> children() = 0;
  /// Parameters of `children()` in order, each name prefixed by `prefix` + "." (at construction).
  static void prefix_names(Module& child, const std::string& prefix);
};

/// m.clone() as its own type (for a container's clone of its typed children).
template <class T>
std::unique_ptr<T> clone_as(const T& m) {
  return std::unique_ptr<T>(static_cast<T*>(m.clone().release()));
}

}  // namespace ditto::nn
