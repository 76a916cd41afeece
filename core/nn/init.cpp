// nanoGPT's normal initialisation from Philox with the Marsaglia polar method (Note [Normal init]).
#include "core/nn/init.h"

#include <cmath>

#include "core/numerics/canonical_math.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"

namespace ditto::nn {

float normal_sample(std::uint64_t seed, std::uint64_t stream, std::int64_t index, std::int64_t n,
                    float std) {
  DITTO_CHECK(n >= 1 && index >= 0 && index < n, "nn::normal_sample: index: expected in [0, ", n,
              "), got ", index);
  DITTO_CHECK(std::isfinite(std) && std >= 0.0f,
              "nn::normal_sample: std: expected a finite value >= 0, got ", std);
  namespace c = canonical;
  const auto un = static_cast<std::uint64_t>(n), ui = static_cast<std::uint64_t>(index);
  // Each attempt is accepted with probability pi/4: 200 rejections in a row have probability
  // below 1e-130, so the bound only guards against a broken generator.
  for (std::uint64_t a = 0; a < 200; ++a) {
    const std::uint64_t k = 2 * (a * un + ui);
    const float x = c::sub(c::mul(2.0f, uniform01(seed, stream, k)), 1.0f);
    const float y = c::sub(c::mul(2.0f, uniform01(seed, stream, k + 1)), 1.0f);
    const float s = c::add(c::mul(x, x), c::mul(y, y));
    if (!(s > 0.0f && s < 1.0f)) continue;
    const float r = c::sqrt(c::div(c::mul(-2.0f, c::log(s)), s));
    return c::mul(std, c::mul(x, r));
  }
  throw InternalError("nn::normal_sample: 200 rejected attempts in a row (broken Philox?)");
}

void dry_upload(const Tensor& dst) {
  DITTO_CHECK(dst.defined() && is_dry_run(dst.device()), "nn::dry_upload: expected a tensor on a "
              "dry device, got ", dst.defined() ? dst.str() : std::string("an undefined tensor"));
  // src is never read on a dry device (Note [Dry run], backend_sim/sim_backend.h).
  dst.device().backend().copy_from_host(current_stream(dst.device()), dst.data_ptr(),
                                        dst.data_ptr(), dst.nbytes());
}

Tensor normal_tensor(const Shape& shape, const Device& device, std::uint64_t seed,
                     std::uint64_t stream, float std) {
  Tensor out = Tensor::empty(shape, DType::f32, device);
  if (is_dry_run(device)) {  // no data to draw: price the upload only (Note [Dry run])
    dry_upload(out);
    return out;
  }
  Tensor host = device.is_cpu() ? out : Tensor::empty(shape, DType::f32, Device::cpu());
  float* p = host.data<float>();
  const std::int64_t n = out.numel();
  for (std::int64_t i = 0; i < n; ++i) p[i] = normal_sample(seed, stream, i, n, std);
  if (!device.is_cpu()) out.copy_(host);
  return out;
}

}  // namespace ditto::nn
