// optim::clip_grad_norm_: torch.nn.utils.clip_grad_norm_ (norm_type 2), between backward and the
// optimizer step (nanoGPT's grad_clip).
#pragma once

#include <optional>
#include <vector>

#include "core/nn/module.h"
#include "core/numerics/determinism.h"

namespace ditto::optim {

/// Scales the gradients of `params` so that their joint 2-norm is at most max_norm, and returns
/// the norm before clipping (torch.nn.utils.clip_grad_norm_(params, max_norm), which returns it
/// as a 0-dim tensor). Parameters whose grad is undefined are skipped (an empty set gives 0).
///   total = sqrt(s_0 + s_1 + ...)   s_k = ops::sum_squares(grad_k, mode), summed in float on the
///                                   host in parameter order, then a float sqrt
///   coef  = float(max_norm) / (total + 1e-6f)
///   grads *= coef unless coef >= 1  (torch multiplies by clamp(coef, max=1), so a non-finite
///                                   norm turns every grad into NaN or 0 there as here)
/// In bitwise mode each sum of squares is canonical (Note [GPT kernels], kSquaresBlock), so the
/// result depends on the gradients' values only: ranks holding the same (all-reduced) gradients
/// get the same bits on any device. Blocks (the sums are read on the host). Throws
/// InvalidArgument when max_norm is not finite and > 0, or a grad is not f32 of its parameter's
/// shape on its device (naming it).
/// On backends with multi-tensor kernels (ops::has_multi_tensor_kernels: cuda) the sums are one
/// ops::sum_squares_multi and the scaling one ops::scale_multi_ per device, with the same bits.
float clip_grad_norm_(const std::vector<nn::Parameter*>& params, double max_norm,
                      Determinism mode = Determinism::fast);

namespace detail {
/// The norm of clip_grad_norm_ over `grads` (each defined, of a float dtype, on a device;
/// bf16 / f16 only with multi_tensor on devices that has_multi_tensor_ex them, read as stored:
/// the bits of their f32 casts), and the coefficient the clip multiplies them by, unset where
/// it does not scale. multi_tensor: per device one ops::sum_squares_multi, else one
/// ops::sum_squares per grad (the same bits). `call` names the caller in the max_norm check.
/// optim::MasterWeights' fused clip (Note [Typed optimizer step]) scales in its step instead.
struct GradNorm {
  float total = 0.0f;
  std::optional<float> scale;
};
GradNorm grad_norm(const std::vector<const Tensor*>& grads, double max_norm, Determinism mode,
                   bool multi_tensor, const char* call);
/// clip_grad_norm_ with its path given: multi_tensor true takes the multi-tensor ops on every
/// backend (their defaults loop the per-tensor kernels), false the per-gradient ops. For tests:
/// both must give the same bits.
float clip_grad_norm_with(const std::vector<nn::Parameter*>& params, double max_norm,
                          Determinism mode, bool multi_tensor);
/// The indices of `xs` grouped by device, devices in order of first appearance, indices
/// ascending in each group: the per-device lists of the multi-tensor ops (also GradScaler's).
std::vector<std::vector<std::size_t>> by_device(const std::vector<const Tensor*>& xs);
}  // namespace detail

}  // namespace ditto::optim
