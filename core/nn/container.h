// nn::Container: a module built from child modules (the GPT's attention, MLP, block and model),
// which passes the settings of Module on to every child, as torch's Module.train() and
// Module.apply() reach a module's submodules, and clones itself child by child.
#pragma once

#include <memory>
#include <string>
#include <utility>
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
  /// Same structure and settings, parameters sharing this one's data (grads undefined):
  /// empty_clone() given the clones of the children that add_child added, in order and under
  /// the same names, then this module's settings (copy_settings).
  std::unique_ptr<Module> clone() const override;

 protected:
  /// The child modules, in a fixed order (valid while this module lives): their parameters'
  /// order too. Default: those add_child added, in the order added.
  virtual std::vector<Module*> children();
  /// Appends `child` (owned; not null) to children() and prefixes its parameters' names with
  /// `name` + "." (torch's register_module; an empty name leaves them). Returns it.
  template <class T>
  T& add_child(const std::string& name, std::unique_ptr<T> child) {
    T& added = *child;
    add_module(name, std::move(child));
    return added;
  }
  /// Child `i` (in the order added) as its type T.
  template <class T>
  T& child(std::size_t i) const {
    return static_cast<T&>(*children_.at(i).module);
  }
  /// How many children add_child added.
  std::size_t num_children() const { return children_.size(); }
  /// x through children() in order (torch.nn.Sequential's forward).
  Tensor forward_chain(const Tensor& x);
  /// grad_output back through children() in reverse order; after each child's backward, its
  /// parameters go to the grad-ready hook (set_grad_ready_hook), if one is set.
  Tensor backward_chain(const Tensor& grad_output);
  /// For clone(): a module of this type and configuration without children (clone() adds
  /// them). Default: throws InternalError (a container that overrides children() clones itself).
  virtual std::unique_ptr<Container> empty_clone() const;
  /// Parameters of `child` each renamed `prefix` + "." + its name.
  static void prefix_names(Module& child, const std::string& prefix);

 private:
  struct Child {
    std::string name;
    std::unique_ptr<Module> module;
  };
  void add_module(const std::string& child_name, std::unique_ptr<Module> child);
  std::vector<Child> children_;
};

/// m.clone() as its own type (for a container's clone of its typed children).
template <class T>
std::unique_ptr<T> clone_as(const T& m) {
  return std::unique_ptr<T>(static_cast<T*>(m.clone().release()));
}

}  // namespace ditto::nn
