// Host-side parameter initialisation shared by the layers: nanoGPT's normal(0, std) drawn from
// Philox (Note [Normal init]), identical on every backend and platform.
//
// Note [Normal init]
// torch.nn.init.normal_ draws from the generator of the device, which differs between CPU and
// CUDA; ditto draws every element on the host from Philox instead (Note [Random streams] in
// core/numerics/random.h), with the Marsaglia polar method written in float with the portable
// log (core/numerics/portable_math.h) and the correctly rounded sqrt, so no libm result enters.
// Element i of an n-element tensor under (seed, stream), attempt a = 0, 1, ...:
//   k = 2 * (a * n + i),  u1 = uniform01(seed, stream, k),  u2 = uniform01(seed, stream, k + 1)
//   x = 2 u1 - 1,  y = 2 u2 - 1  (both exact),  s = x*x + y*y  (two products, one add)
//   accepted when 0 < s < 1 (probability pi/4), then
//   value = std * (x * sqrt((-2 * log(s)) / s))     (each operation rounded once, in this order)
// Only x's normal of the pair is used, so every element is drawn independently of the others
// and of n's other elements' attempts. Attempt a covers indices [2an, 2(a+1)n) of the stream.
#pragma once

#include <cstdint>

#include "core/runtime/tensor.h"

namespace ditto::nn {

/// One normal(0, std) sample for element `index` of an `n`-element tensor (Note [Normal init]).
/// Throws InvalidArgument unless 0 <= index < n and std is finite and >= 0.
float normal_sample(std::uint64_t seed, std::uint64_t stream, std::int64_t index, std::int64_t n,
                    float std);

/// Stands for a host -> device upload of `dst`'s bytes on a dry device (is_dry_run,
/// core/runtime/backend.h; Note [Dry run] in backend_sim/sim_backend.h): the backend prices the
/// copy (the same virtual time as a real upload) and writes nothing; no host buffer is needed.
/// Initialisation that would fill a host tensor only to upload it calls this instead. Throws
/// InvalidArgument when dst is undefined or not on a dry device.
void dry_upload(const Tensor& dst);

/// A new f32 tensor of `shape` on `device` with every element normal_sample(seed, stream, i,
/// numel, std) (drawn on the host, then copied). The device memory is allocated first, so a
/// tensor too large for the device fails with its OutOfMemory before host memory is spent. On a
/// dry device (is_dry_run) nothing is drawn: the upload is priced, no host memory is used.
Tensor normal_tensor(const Shape& shape, const Device& device, std::uint64_t seed,
                     std::uint64_t stream, float std);

}  // namespace ditto::nn
