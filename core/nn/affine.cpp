// nn::Affine: str(), parameters(), bias() and the clone's shared parameters of Linear and
// LayerNorm.
#include "core/nn/affine.h"

namespace ditto::nn {

std::string Affine::str() const {
  return detail::cat(name_, "(", sizes_, has_bias_ ? "" : ", bias=False", ")");
}

std::vector<Parameter*> Affine::parameters() {
  if (!has_bias_) return {&weight_};
  return {&weight_, &bias_};
}

Parameter& Affine::bias() {
  DITTO_CHECK(has_bias_, str(), ".bias: the layer has no bias (constructed with bias = false)");
  return bias_;
}

std::unique_ptr<Module> Affine::share_parameters(std::unique_ptr<Affine> copy) const {
  copy->weight_.data = weight_.data;
  copy->bias_.data = bias_.data;
  copy_settings(*this, *copy);
  return copy;
}

}  // namespace ditto::nn
