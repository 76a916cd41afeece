// The Trainer in mixed precision (TrainerConfig::dtype): the MLP on digits in bf16 and f16,
// bitwise, gives one checksum for 1, 2, 4 devices x dp, ddp; the parameters are stored in the dtype
// and the optimizer is MasterWeights; f16 with an initial scale that overflows f16 skips steps and
// backs off (the same steps on every rank and device count); grad_accum_steps works with both;
// clipping applies to the f32 master grads.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/optim/master_weights.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto::train {
namespace {

using test::digits;

TrainerConfig amp(DType dt, int devices, TrainerKind kind) {
  TrainerConfig c;
  c.dtype = dt;
  c.devices = devices;
  c.trainer = kind;
  c.epochs = 2;
  return c;
}

TEST(AmpTrainer, Bf16AndF16GiveOneChecksumForAnyDeviceCountAndTrainer) {
  TrainerConfig f = amp(DType::f32, 1, TrainerKind::dp);
  const FitResult f32 = Trainer(f, digits()).fit();
  for (DType dt : {DType::bf16, DType::f16}) {
    TrainerConfig c = amp(dt, 1, TrainerKind::dp);
    TrainerCallbacks cb;
    bool checked = false;
    cb.on_finish = [&](Replica& rep) {
      for (nn::Parameter* p : rep.model().parameters()) EXPECT_EQ(p->data.dtype(), dt) << p->name;
      EXPECT_NE(dynamic_cast<optim::MasterWeights*>(&rep.optimizer()), nullptr);
      EXPECT_EQ(rep.grad_scaler() != nullptr, dt == DType::f16);
      checked = true;
    };
    const FitResult one = Trainer(c, digits(), cb).fit();
    EXPECT_TRUE(checked);
    EXPECT_EQ(one.dtype, dt);
    EXPECT_NE(one.params_checksum, f32.params_checksum) << dtype_name(dt);
    // Within noise of f32 on this easy task.
    EXPECT_NEAR(one.eval.accuracy, f32.eval.accuracy, 0.05) << dtype_name(dt);
    EXPECT_EQ(one.loss_scale.has_value(), dt == DType::f16);
    for (int n : {2, 4})
      for (TrainerKind k : {TrainerKind::dp, TrainerKind::ddp}) {
        const FitResult r = Trainer(amp(dt, n, k), digits()).fit();
        EXPECT_EQ(r.params_checksum, one.params_checksum)
            << dtype_name(dt) << " devices " << n << " " << trainer_kind_name(k);
      }
  }
}

TEST(AmpTrainer, F16OverflowingScaleSkipsTheSameStepsEverywhere) {
  // 2^40 x a loss gradient overflows f16's 65504 in the first backward: steps are skipped and the
  // scale halves until the gradients fit; then training goes on.
  std::uint64_t sum = 0;
  for (int n : {1, 4})
    for (TrainerKind k : {TrainerKind::dp, TrainerKind::ddp}) {
      TrainerConfig c = amp(DType::f16, n, k);
      c.grad_scaler.init_scale = 1099511627776.0;  // 2^40
      const FitResult r = Trainer(c, digits()).fit();
      ASSERT_TRUE(r.loss_scale.has_value());
      EXPECT_GT(r.skipped_steps, 10);
      EXPECT_LT(r.skipped_steps, r.steps);
      EXPECT_EQ(*r.loss_scale,
                static_cast<float>(std::ldexp(1.0, 40 - static_cast<int>(r.skipped_steps))));
      if (sum == 0) sum = r.params_checksum;
      EXPECT_EQ(r.params_checksum, sum) << n << " " << trainer_kind_name(k);
    }
}

TEST(AmpTrainer, ClipAndAccumulationInBf16) {
  // grad_clip acts on the f32 master grads; 2 micro-steps of B/2 equal one step of B (bitwise).
  TrainerConfig a = amp(DType::bf16, 2, TrainerKind::ddp);
  a.grad_clip = 0.5;
  TrainerConfig b = a;
  b.grad_accum_steps = 2;
  TrainerConfig c = a;
  c.trainer = TrainerKind::dp;
  c.devices = 4;
  const FitResult ra = Trainer(a, digits()).fit();
  EXPECT_EQ(Trainer(b, digits()).fit().params_checksum, ra.params_checksum);
  EXPECT_EQ(Trainer(c, digits()).fit().params_checksum, ra.params_checksum);
  TrainerConfig noclip = a;
  noclip.grad_clip = 0;
  EXPECT_NE(Trainer(noclip, digits()).fit().params_checksum, ra.params_checksum);
}

}  // namespace
}  // namespace ditto::train
