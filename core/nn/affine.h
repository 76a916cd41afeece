// nn::Affine: the weight and optional bias that nn::Linear and nn::LayerNorm hold (torch's
// Linear(bias=...) and LayerNorm(elementwise_affine=True, bias=...)).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/module.h"

namespace ditto::nn {

/// A layer with parameters "weight" and, unless built without one, "bias".
class Affine : public Module {
 public:
  /// "Linear", "LayerNorm".
  std::string name() const override { return name_; }
  /// The layer as torch prints it: "Linear(64, 128)", "LayerNorm(128)", with ", bias=False"
  /// before the ")" for a layer without bias.
  std::string str() const;
  /// {weight, bias}, or {weight} without bias.
  std::vector<Parameter*> parameters() override;
  bool has_bias() const { return has_bias_; }
  Parameter& weight() { return weight_; }
  /// Throws InvalidArgument for a layer without bias.
  Parameter& bias();

 protected:
  /// `sizes`: str()'s arguments before the bias ("64, 128").
  Affine(const char* name, std::string sizes, bool bias)
      : name_(name), sizes_(std::move(sizes)), has_bias_(bias) {}
  /// For clone(): `copy` (built without parameters) with weight and bias sharing this layer's
  /// data (grads undefined, names "weight" and "bias") and this layer's settings.
  std::unique_ptr<Module> share_parameters(std::unique_ptr<Affine> copy) const;

  const char* name_;
  std::string sizes_;
  bool has_bias_ = true;
  Parameter weight_{"weight", {}, {}};
  Parameter bias_{"bias", {}, {}};
};

}  // namespace ditto::nn
