// CUDA's cross_entropy_fused (backend_cuda/cuda_fused.cu, Note [CUDA fused cross-entropy]; issue
// 29, llm.c's fused_classifier) against the CUDA backend's two kernels, cross_entropy(_ex) and
// cross_entropy_backward(_ex), on a GPU (skips without one; listed in tools/gpu-check-tests.txt).
// CPU halves: ctest CudaEmu.Kernels (the kernel against a double reference,
// tools/cuda_emu/test_emu_fused.cpp) and XentFused.* (the ops and the loss, tests/
// test_cross_entropy_fused.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaXentFused = CudaSuite<>;

// V = 50257 (GPT-2's vocabulary) and 50304 (its padding), f32 / bf16 / f16: the losses within
// 3e-5 max(1, |loss|) of cross_entropy(_ex)'s, the gradient within 3e-5 |factor| p + 1e-9 of
// cross_entropy_backward(_ex)'s (plus the rounding of both results: f32 2^-22, bf16 2^-7,
// f16 2^-10 relative), the targets first and last classes included.
TEST_F(CudaXentFused, OnePassMatchesTheTwoKernels) {
  Kernels& k = get_backend("cuda").kernels();
  ASSERT_TRUE(k.has_cross_entropy_fused(DType::bf16, Determinism::fast));
  ASSERT_FALSE(k.has_cross_entropy_fused(DType::bf16, Determinism::bitwise));
  for (std::int64_t C : {std::int64_t{50257}, std::int64_t{50304}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " V " + std::to_string(C));
      const std::int64_t N = 6;
      const Tensor targets = xent_targets(N, C, 7919, "cuda");
      const Tensor gl = Tensor::full({}, 0.75f, Device("cuda", 0));
      const float scale = 1.0f / 3.0f;
      const Tensor ref_in = xent_logits({N, C}, dt, 29, 9, "cuda");
      const auto ref_loss =
          ops::cross_entropy(ref_in, targets).to(Device::cpu()).to_vector<float>();
      const auto ref_grad = ops::cross_entropy_backward(ref_in, targets, gl, scale)
                                .to(DType::f32)
                                .to(Device::cpu())
                                .to_vector<float>();
      Tensor logits = xent_logits({N, C}, dt, 29, 9, "cuda");
      const auto loss =
          ops::cross_entropy_fused(logits, targets, gl, scale).to(Device::cpu()).to_vector<float>();
      const auto grad = logits.to(DType::f32).to(Device::cpu()).to_vector<float>();
      const double rel = dt == DType::f32 ? 0x1p-22 : dt == DType::bf16 ? 0x1p-7 : 0x1p-10;
      const double factor = 0.75 * scale;
      for (std::int64_t r = 0; r < N; ++r)
        EXPECT_NEAR(loss[r], ref_loss[r], 3e-5 * std::max(1.0, std::fabs(double(ref_loss[r]))))
            << "row " << r;
      int bad = 0;
      for (std::size_t i = 0; i < grad.size() && bad < 5; ++i) {
        const double p = std::fabs(double(ref_grad[i]) / factor);  // |p - onehot|
        const double tol = factor * (3e-5 * p + 1e-9) + rel * std::fabs(double(ref_grad[i])) +
                           (dt == DType::f16 ? 0x1p-24 : 0.0);
        if (!(std::fabs(double(grad[i]) - double(ref_grad[i])) <= tol)) {
          ++bad;
          ADD_FAILURE() << "element " << i << ": " << grad[i] << " vs " << ref_grad[i];
        }
      }
    }
}

}  // namespace
}  // namespace ditto
