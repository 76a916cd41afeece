// The dry run against the CUDA backend it predicts (Note [Predicted launches],
// backend_sim/cost_model.h; issue 29 item 5): the memory a dry run charges for bf16 ops is what
// the CUDA backend allocates for them. A typed GEMM (ops::linear, bias in cuBLASLt's epilogue)
// and a typed row kernel (GELU: gelu_forward_ex, CudaGptKernels::has_rows_ex) hold only their
// output; an op with no typed CUDA kernel (ReLU) holds MixedOp's f32 scratch, which a dry run
// charges as CUDA does. The GPU test skips without a GPU; its dry-run half runs everywhere
// (CudaDryRunPrediction.*), as do ComputeUnits.DryRunLinearIsOneTypedGemmWithTheBiasInItsEpilogue,
// ComputeUnits.DryRunRowOpsTakeTheTypedKernels and
// ComputeUnits.DryRunPricesMixedOpScratchAsCudaRunsIt. (Until the review of issue 29 the test
// expected GELU's f32 scratch, from before GELU had a typed CUDA kernel: it would have failed on
// the first GPU run, for CUDA and the dry run alike.)
#if defined(DITTO_TEST_CUDA_BUILT)
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaDryRun = CudaSuite<>;

// Peak bytes above the live ones while `op` runs on device 0 of `be` (synchronised before and
// after; `op` keeps its results alive until it returns).
template <class Op>
std::size_t peak_growth(Backend& be, const Op& op) {
  be.default_stream(0).synchronize();
  const std::size_t before = be.memory_stats(0).in_use;
  be.reset_peak_memory(0);
  op();
  be.default_stream(0).synchronize();
  return be.memory_stats(0).peak - before;
}

// ops on bf16 tensors of `backend` (cuda, or the simulator in a dry run): a Linear's output, a
// GELU's output (typed kernel) and a ReLU's scratch (MixedOp). Sizes are multiples of 512
// elements (no allocator rounding in the counts).
struct Growth {
  std::size_t linear = 0, gelu = 0, relu = 0;
};
Growth bf16_growth(const std::string& backend, Backend& be) {
  const std::int64_t M = 1024, N = 1536, K = 512, n = 1 << 20;
  const Device dev(backend, 0);
  Tensor x = Tensor::zeros({M, K}, DType::bf16, dev), w = Tensor::zeros({N, K}, DType::bf16, dev);
  Tensor b = Tensor::zeros({N}, DType::bf16, dev), g = Tensor::zeros({n}, DType::bf16, dev);
  (void)ops::linear(x, w, b, Determinism::fast);  // warm-up: cuBLASLt's handle and workspace
  (void)ops::gelu(g);
  (void)ops::relu(g);
  Growth r;
  r.linear = peak_growth(be, [&] { (void)ops::linear(x, w, b, Determinism::fast); });
  r.gelu = peak_growth(be, [&] { (void)ops::gelu(g); });
  r.relu = peak_growth(be, [&] { (void)ops::relu(g); });
  EXPECT_EQ(r.linear, std::size_t(2 * M * N)) << backend << ": y only, no f32 copies";
  EXPECT_EQ(r.gelu, std::size_t(2 * n)) << backend << ": y only (gelu_forward_ex)";
  EXPECT_EQ(r.relu, std::size_t(4 * n + 4 * n)) << backend << ": x in f32, the f32 result";
  return r;
}

TEST_F(CudaDryRun, Bf16OpsHoldTheMemoryTheDryRunCharges) {
  const Growth cuda = bf16_growth("cuda", get_backend("cuda"));
  BackendOptions o;
  o.device_count = 1;
  o.dry_run = true;
  Backend& dry = init_backend("sim", o);
  const Growth predicted = bf16_growth("sim", dry);
  EXPECT_EQ(predicted.linear, cuda.linear);
  EXPECT_EQ(predicted.gelu, cuda.gelu);
  EXPECT_EQ(predicted.relu, cuda.relu);
  init_sim(kCudaTestDevices);  // the suite's simulator again, for the tests after this one
}

// The dry-run half of the test above, on any machine: what a dry run charges for the same ops.
TEST(CudaDryRunPrediction, Bf16OpsChargeWhatTheCudaBackendAllocates) {
  BackendOptions o;
  o.device_count = 1;
  o.dry_run = true;
  (void)bf16_growth("sim", init_backend("sim", o));
  init_sim(kCudaTestDevices);
}

}  // namespace
}  // namespace ditto
#endif  // DITTO_TEST_CUDA_BUILT
