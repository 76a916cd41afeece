// DataParallel's persistent replica buffers (Note [Persistent replica buffers] in
// core/parallel/data_parallel.cpp): the buffers are reused from step to step, so these tests
// check, bit for bit in bitwise mode against one device, that every step sees the module's
// current parameters (also after a parameter tensor is replaced between steps), that buckets
// smaller than the model give the same bits, and that a smaller batch (fewer replicas in fast
// mode) and a later full batch both reduce over the right replicas.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "train_step.h"

namespace ditto {
namespace {

class DataParallelBuffersTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions o;
    o.device_count = 8;
    init_backend("sim", o);
  }
};

std::vector<std::uint32_t> param_bits(nn::Module& m) {
  std::vector<std::uint32_t> out;
  for (nn::Parameter* p : m.parameters())
    for (float f : p->data.to_vector<float>()) {
      std::uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      out.push_back(u);
    }
  return out;
}

/// Trains an MLP 12-9-7-3 for `steps` steps on `n_dev` devices; before step `replace_at` every
/// parameter tensor is replaced by a scaled copy (as loading a checkpoint would). Batch sizes
/// cycle through `batches`. Returns the parameters' bits.
std::vector<std::uint32_t> train(int n_dev, Determinism mode, std::size_t buffer_size, int steps,
                                 int replace_at, const std::vector<std::int64_t>& batches) {
  std::vector<Device> devs = devices("sim", n_dev);
  auto model = nn::mlp({12, 9, 7, 3}, devs[0], 5);
  parallel::DataParallelOptions o;
  o.determinism = mode;
  o.buffer_size = buffer_size;
  parallel::DataParallel dp(*model, devs, o);
  nn::CrossEntropyLoss loss;
  loss.set_determinism(mode);
  optim::SGD opt(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
  for (int s = 0; s < steps; ++s) {
    if (s == replace_at) {
      for (nn::Parameter* p : model->parameters()) {
        std::vector<float> v = p->data.to_vector<float>();
        for (float& f : v) f = f * 0.5f + 0.125f;
        p->data = Tensor::from_vector(v, p->data.shape(), devs[0]);
      }
    }
    const std::int64_t b = batches[static_cast<std::size_t>(s) % batches.size()];
    const auto seed = static_cast<std::uint64_t>(s);
    test::train_step(dp, loss, test::random_x(b, 12, seed), test::random_y(b, 3, seed), &opt);
  }
  return param_bits(*model);
}

TEST_F(DataParallelBuffersTest,
       ReusedBuffersGiveTheBitsOfOneDeviceAcrossStepsAndReplacedParameters) {
  const auto one = train(1, Determinism::bitwise, std::size_t(10) << 20, 6, 3, {32});
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(detail::cat(n, " devices"));
    EXPECT_EQ(train(n, Determinism::bitwise, std::size_t(10) << 20, 6, 3, {32}), one);
    // Buckets of at most 64 bytes: every parameter (and the 36-float bias pair) in its own.
    EXPECT_EQ(train(n, Determinism::bitwise, 64, 6, 3, {32}), one);
  }
  // Without the replacement the result differs, so the test above sees the replaced values.
  EXPECT_NE(train(4, Determinism::bitwise, std::size_t(10) << 20, 6, -1, {32}), one);
}

TEST_F(DataParallelBuffersTest, FastModeWithFewerReplicasThenAllMatchesOneDeviceWithinTolerance) {
  // Batch 3 over 4 devices runs 3 replicas (torch.chunk), batch 16 runs 4: the reduction must use
  // exactly the replicas of the step (the buffers of replica 3 hold the previous step's grads).
  const auto bits1 = train(1, Determinism::fast, std::size_t(10) << 20, 6, -1, {16, 3});
  const auto bits4 = train(4, Determinism::fast, std::size_t(10) << 20, 6, -1, {16, 3});
  ASSERT_EQ(bits1.size(), bits4.size());
  for (std::size_t i = 0; i < bits1.size(); ++i) {
    float a, b;
    std::memcpy(&a, &bits1[i], sizeof a);
    std::memcpy(&b, &bits4[i], sizeof b);
    EXPECT_NEAR(a, b, 1e-5f) << "parameter element " << i;
  }
}

}  // namespace
}  // namespace ditto
