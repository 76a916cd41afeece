// nn::ReLU: y = max(x, 0) elementwise (torch.nn.ReLU).
#pragma once

#include "core/nn/activation.h"

namespace ditto::nn {

/// torch.nn.ReLU: input any shape, f32 (or bf16 / f16) -> the same shape; keeps the output for
/// backward, which gives grad_output where output > 0, else 0 (Elementwise).
using ReLU = Elementwise<ReluFn>;

}  // namespace ditto::nn
