// optim::GradScaler against torch.amp.GradScaler: the scale sequence of tools/
// grad_scaler_reference.py (tests/data/grad_scaler_reference.txt) bit for bit, the exact non-finite
// check (large finite gradients whose squares overflow are not an inf), unscale_ by the inverse
// scale, skipped steps, the disabled scaler, state_dict and errors.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/optim/grad_scaler.h"
#include "core/optim/sgd.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class GradScalerTest : public SimSuite<2> {
 protected:
  static Device dev() { return Device("sim", 0); }
  static nn::Parameter param(std::vector<float> data, std::vector<float> grad) {
    const auto n = static_cast<std::int64_t>(data.size());
    return {"w", Tensor::from_vector(data, {n}, dev()), Tensor::from_vector(grad, {n}, dev())};
  }
};

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST_F(GradScalerTest, ScaleSequenceEqualsTorchBitForBit) {
  std::ifstream in(std::string(DITTO_TEST_DATA_DIR) + "/grad_scaler_reference.txt");
  ASSERT_TRUE(in) << "tests/data/grad_scaler_reference.txt (tools/grad_scaler_reference.py)";
  std::string line;
  int scenarios = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string name;
    optim::GradScalerOptions o;
    ls >> name >> o.init_scale >> o.growth_factor >> o.backoff_factor >> o.growth_interval;
    optim::GradScaler scaler(o);
    std::string step;
    int k = 0;
    while (ls >> step) {
      int inf = 0;
      unsigned bits = 0;
      long tracker = 0;
      ASSERT_EQ(std::sscanf(step.c_str(), "%d:%x:%ld", &inf, &bits, &tracker), 3) << step;
      // The flag comes from real gradients: one with an inf among finite values, or finite.
      nn::Parameter p = param({1, 2, 3}, {0.5f, inf ? kInf : 4.0f, -1.0f});
      optim::SGD sgd({&p}, {});
      EXPECT_EQ(scaler.step(sgd), inf == 0) << name << " step " << k;
      scaler.update();
      EXPECT_EQ(std::bit_cast<std::uint32_t>(scaler.scale()), bits)
          << name << " step " << k << ": scale " << scaler.scale();
      EXPECT_EQ(scaler.growth_tracker(), tracker) << name << " step " << k;
      ++k;
    }
    EXPECT_GT(k, 0) << name;
    ++scenarios;
  }
  EXPECT_EQ(scenarios, 4);
}

TEST_F(GradScalerTest, LargeFiniteGradientsAreNotAnOverflow) {
  // 3e20^2 is past f32's range: a sum-of-squares check alone would call this an inf.
  nn::Parameter p = param({0, 0, 0}, {3e20f, -3e20f, 1.0f});
  optim::GradScaler scaler;
  EXPECT_FALSE(scaler.unscale_({&p}));
  const std::vector<float> g = p.grad.to_vector<float>();
  const float inv = static_cast<float>(1.0 / 65536.0);
  EXPECT_EQ(g, (std::vector<float>{3e20f * inv, -3e20f * inv, inv}));
  EXPECT_TRUE(optim::all_finite(Tensor::from_vector(std::vector<float>{3e20f, 1e30f}, {2}, dev())));
}

TEST_F(GradScalerTest, InfAndNanAnywhereAreFound) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {kInf, -kInf, nan}) {
    for (int at : {0, 500, 1023}) {
      std::vector<float> g(1024, 1.0f);
      g[static_cast<std::size_t>(at)] = bad;
      EXPECT_FALSE(optim::all_finite(Tensor::from_vector(g, {1024}, dev())));
      nn::Parameter ok = param(std::vector<float>(4, 0.0f), std::vector<float>(4, 2.0f));
      nn::Parameter p = param(std::vector<float>(1024, 0.0f), g);
      optim::GradScaler scaler;
      EXPECT_TRUE(scaler.unscale_({&ok, &p}, Determinism::bitwise)) << bad << " at " << at;
    }
  }
}

TEST_F(GradScalerTest, Bf16GradsAreCheckedAndUnscaledThroughF32) {
  nn::Parameter p{"w", Tensor::zeros({3}, DType::bf16, dev()),
                  Tensor::from_vector(std::vector<float>{65536.0f, -2.0f, 3.0f}, {3}, dev())
                      .to(DType::bf16)};
  optim::GradScaler scaler;
  EXPECT_FALSE(scaler.unscale_({&p}));
  EXPECT_EQ(p.grad.dtype(), DType::bf16);
  EXPECT_EQ(p.grad.to(DType::f32).to_vector<float>(),
            (std::vector<float>{1.0f, -2.0f / 65536.0f, 3.0f / 65536.0f}));
}

TEST_F(GradScalerTest, SkippedStepLeavesTheParametersAndBacksOff) {
  nn::Parameter p = param({1, 2}, {kInf, 1.0f});
  optim::SGDOptions so;
  so.lr = 0.5;
  optim::SGD sgd({&p}, so);
  optim::GradScaler scaler;
  EXPECT_FALSE(scaler.step(sgd));
  EXPECT_TRUE(scaler.found_inf());
  scaler.update();
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  // A clean step: unscaled by 1/32768, then SGD's p - lr * g.
  p.grad = Tensor::from_vector(std::vector<float>{32768.0f, -65536.0f}, {2}, dev());
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(p.data.to_vector<float>(), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST_F(GradScalerTest, LossGradIsTheScale) {
  optim::GradScaler scaler;
  Tensor g = scaler.loss_grad(dev());
  EXPECT_EQ(g.dim(), 0);
  EXPECT_EQ(g.item(), 65536.0f);
}

TEST_F(GradScalerTest, DisabledScalesByOneAndAlwaysSteps) {
  optim::GradScalerOptions o;
  o.enabled = false;
  optim::GradScaler scaler(o);
  EXPECT_EQ(scaler.scale(), 1.0f);
  nn::Parameter p = param({1}, {kInf});
  optim::SGD sgd({&p}, {});
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.skipped_steps(), 0);
  EXPECT_EQ(scaler.scale(), 1.0f);
}

TEST_F(GradScalerTest, ReducerCombinesTheRanksFlags) {
  nn::Parameter p = param({1}, {1.0f});
  optim::GradScaler scaler;
  bool seen = true;
  scaler.set_found_inf_reducer([&](bool local) {
    seen = local;
    return true;  // another rank's shard had an inf
  });
  EXPECT_TRUE(scaler.unscale_({&p}));
  EXPECT_FALSE(seen);
  scaler.update();
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

TEST_F(GradScalerTest, StateDictRoundTrips) {
  optim::GradScalerOptions o;
  o.growth_interval = 5;
  optim::GradScaler a(o);
  nn::Parameter p = param({1}, {kInf});
  a.unscale_({&p});
  a.update();
  p.grad = Tensor::from_vector(std::vector<float>{1.0f}, {1}, dev());
  a.unscale_({&p});
  a.update();
  optim::GradScaler b(o);
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.scale(), 32768.0f);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.skipped_steps(), 1);
  optim::GradScaler other;  // growth_interval 2000
  expect_error<InvalidArgument>([&] { other.load_state_dict(a.state_dict()); },
                                "growth_interval: the state was saved with 5, this scaler has 2000");
}

TEST_F(GradScalerTest, Errors) {
  auto bad = [](auto set, const std::string& part) {
    optim::GradScalerOptions o;
    set(o);
    expect_error<InvalidArgument>([&] { optim::GradScaler s(o); }, part);
  };
  bad([](auto& o) { o.init_scale = 0; }, "init_scale: expected a finite value > 0, got 0");
  bad([](auto& o) { o.init_scale = 1e39; }, "init_scale: expected a value that fits in f32");
  bad([](auto& o) { o.growth_factor = 1.0; }, "growth_factor: The growth factor must be > 1.0");
  bad([](auto& o) { o.backoff_factor = 1.0; }, "backoff_factor: The backoff factor must be < 1.0");
  bad([](auto& o) { o.growth_interval = 0; }, "growth_interval: expected >= 1, got 0");
  optim::GradScaler s;
  nn::Parameter p = param({1}, {1.0f});
  expect_error<InvalidArgument>([&] { s.update(); }, "no unscale_() or step() since the last update()");
  s.unscale_({&p});
  expect_error<InvalidArgument>([&] { s.unscale_({&p}); },
                                "unscale_() has already been called on this optimizer since the last update()");
  expect_error<InvalidArgument>(
      [&] { optim::all_finite(Tensor::zeros({2}, DType::bf16, dev())); },
      "optim::all_finite: x: expected an f32 tensor");
}

}  // namespace
}  // namespace ditto
