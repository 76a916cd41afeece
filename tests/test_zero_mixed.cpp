// optim::ZeroRedundancyOptimizer over bf16 / f16 parameters (Note [ZeRO mixed precision],
// core/optim/zero.h): the f32 masters in the shard give, bit for bit, what MasterWeights gives
// without ZeRO (AdamW with nanoGPT's groups, bitwise, 1 / 2 / 4 ranks, with the clip, f32 and
// bf16 grads); state_bytes = masters + moments = 12 bytes / parameter / N; the consolidated
// state is MasterWeights' layout (master.<i>) and loads back; f16 with a GradScaler skips the
// same steps on every rank when only one rank's shard holds the inf; the Trainer gives the same
// checksum with --zero-stage 1 as without in bf16 and f16.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/data/data_source.h"
#include "core/numerics/gpt_math.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/optim/grad_scaler.h"
#include "core/optim/master_weights.h"
#include "core/optim/zero.h"
#include "core/runtime/ops.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"
#include "zero_test_util.h"

namespace ditto {
namespace {

using optim::ZeroRedundancyOptimizer;

using test::run_ranks;

using test::make_params;
using test::ptrs;

/// Rank r's grads of step t in dtype `dt`; `inf_at` >= 0 puts +inf at that flat element of p0.
void set_grads(std::vector<nn::Parameter>& ps, int r, int t, DType dt, float gain = 1.0f) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto seed = static_cast<std::uint32_t>(1000 * t + 37 * r + static_cast<int>(i));
    std::vector<float> v = test::random_values(static_cast<std::size_t>(ps[i].data.numel()), seed);
    for (float& x : v) x *= gain;
    ps[i].grad = Tensor::from_vector(v, ps[i].data.shape(), ps[i].data.device()).to(dt);
  }
}

std::vector<std::uint8_t> bytes(std::vector<nn::Parameter>& ps) {
  std::vector<std::uint8_t> all;
  for (auto& p : ps) {
    std::vector<std::uint8_t> b = test::tensor_bytes(p.data);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

optim::AdamWOptions adamw_options() {  // nanoGPT's
  optim::AdamWOptions o;
  o.lr = 0.01;
  o.beta2 = 0.95;
  o.weight_decay = 0.1;
  return o;
}

optim::InnerOptimizerFactory master_adamw() {
  return [](std::vector<nn::Parameter*> ms) {
    return std::make_unique<optim::AdamW>(ms, adamw_options());
  };
}

using test::kShapes;

class ZeroMixedTest : public ::testing::Test {
 protected:
  void SetUp() override { test::init_sim(8); }
};

/// ZeRO over `dt` parameters against all_reduce + MasterWeights (+ clip on the masters).
void expect_master_weights_bits(int world, DType dt, DType grad_dt, double clip) {
  run_ranks(world, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params(kShapes, comm.device(), dt);
    std::vector<nn::Parameter> b = make_params(kShapes, comm.device(), dt);
    optim::ZeroOptions zo;
    zo.max_grad_norm = clip;
    ZeroRedundancyOptimizer zero(ptrs(a), comm, test::zero_adamw(), 0.01f, zo);
    optim::MasterWeights mw(ptrs(b), master_adamw());
    for (int t = 0; t < 3; ++t) {
      set_grads(a, r, t, grad_dt);
      set_grads(b, r, t, grad_dt);
      zero.step();
      for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
      mw.load_master_grads();
      if (clip > 0) {
        const float norm =
            optim::clip_grad_norm_(mw.master_parameters(), clip, Determinism::bitwise);
        EXPECT_EQ(test::bits(zero.last_grad_norm()), test::bits(norm)) << r << " " << t;
      }
      mw.step();
      for (auto& p : a) ASSERT_EQ(p.data.dtype(), dt);
      EXPECT_EQ(bytes(a), bytes(b)) << dtype_name(dt) << " grads " << dtype_name(grad_dt) << " "
                                    << world << " ranks, rank " << r << " step " << t;
    }
  });
}

TEST_F(ZeroMixedTest, Bf16MastersInTheShardEqualMasterWeightsOn124Ranks) {
  for (int n : {1, 2, 4}) {
    expect_master_weights_bits(n, DType::bf16, DType::f32, 0.0);   // bitwise rule: f32 grads
    expect_master_weights_bits(n, DType::bf16, DType::f32, 0.5);   // with the clip
    expect_master_weights_bits(n, DType::bf16, DType::bf16, 0.5);  // bf16 grads (fast's dtype)
  }
  expect_master_weights_bits(4, DType::f16, DType::f16, 0.5);
}

TEST_F(ZeroMixedTest, StateBytesAreMastersPlusMomentsOverN) {
  const std::int64_t blk = gpt::kSquaresBlock;
  const std::vector<Shape> shapes{{3, blk}, {3 * blk}, {blk, 3}, {3 * blk}};
  const std::size_t params = 12 * static_cast<std::size_t>(blk);
  for (int n : {1, 2, 4}) {
    std::vector<std::size_t> got(static_cast<std::size_t>(n));
    run_ranks(n, Determinism::bitwise, [&](int r, Communicator& comm) {
      std::vector<nn::Parameter> a = make_params(shapes, comm.device(), DType::bf16);
      ZeroRedundancyOptimizer zero(ptrs(a), comm, test::zero_adamw(), 0.01f);
      // Before a step: the masters only (4 bytes each of this rank's share).
      EXPECT_EQ(zero.state_bytes(), 4 * params / static_cast<std::size_t>(n));
      set_grads(a, r, 0, DType::f32);
      zero.step();
      got[static_cast<std::size_t>(r)] = zero.state_bytes();
    });
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(got[static_cast<std::size_t>(r)], 12 * params / static_cast<std::size_t>(n))
          << n << " ranks, rank " << r;
  }
}

using test::tensor_bytes;

TEST_F(ZeroMixedTest, ConsolidatedStateIsMasterWeightsStateWithMastersAndLoadsBack) {
  for (int n : {1, 2, 4})
    run_ranks(n, Determinism::bitwise, [&](int r, Communicator& comm) {
      std::vector<nn::Parameter> a = make_params(kShapes, comm.device(), DType::bf16);
      std::vector<nn::Parameter> b = make_params(kShapes, comm.device(), DType::bf16);
      std::vector<nn::Parameter> c = make_params(kShapes, comm.device(), DType::bf16);
      ZeroRedundancyOptimizer zero(ptrs(a), comm, test::zero_adamw(), 0.01f);
      optim::MasterWeights mw(ptrs(b), master_adamw());
      for (int t = 0; t < 2; ++t) {
        set_grads(a, r, t, DType::f32);
        set_grads(b, r, t, DType::f32);
        zero.step();
        for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
        mw.step();
      }
      zero.consolidate_state_dict(0);
      const optim::OptimizerState want = mw.state_dict();
      if (r == 0) {
        const optim::OptimizerState got = zero.state_dict();
        EXPECT_EQ(got.type, want.type);
        auto ga = got.options, wa = want.options;  // lr: the float 0.01f vs the double 0.01
        ga.erase("lr");
        wa.erase("lr");
        EXPECT_EQ(ga, wa);
        EXPECT_EQ(got.options.at("master_weights"), "f32");
        EXPECT_EQ(tensor_bytes(got), tensor_bytes(want)) << n << " ranks";
        EXPECT_EQ(tensor_bytes(got).count("master.5"), 1u);
      }
      // A new ZeRO over the bf16 parameters loads it (the masters' low bits included): the next
      // step gives MasterWeights' bits.
      for (std::size_t i = 0; i < c.size(); ++i) c[i].data.copy_(b[i].data);
      ZeroRedundancyOptimizer loaded(ptrs(c), comm, test::zero_adamw(), 0.01f);
      loaded.load_state_dict(want);
      set_grads(c, r, 2, DType::f32);
      set_grads(b, r, 2, DType::f32);
      loaded.step();
      for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
      mw.step();
      EXPECT_EQ(bytes(c), bytes(b)) << n << " ranks, rank " << r;
      // Without masters (an f32 run's state) it is refused, as MasterWeights refuses it.
      optim::OptimizerState plain = want;
      plain.options.erase("master_weights");
      test::expect_invalid([&] { loaded.load_state_dict(plain); },
                           "load_state_dict: state: saved without master weights");
      optim::OptimizerState missing = want;
      std::erase_if(missing.tensors, [](const auto& nt) { return nt.first == "master.2"; });
      test::expect_invalid([&] { loaded.load_state_dict(missing); },
                           "tensor 'master.2' (the master of 'p2') is missing");
    });
}

TEST_F(ZeroMixedTest, F16GradScalerSeesTheWholeGradient) {
  // Step 0: clean; step 1: an inf on the last rank only, in the last parameter (the last rank's
  // shard): every rank skips, the scale backs off alike; step 2: clean again. The same bits and
  // scales as MasterWeights + GradScaler over all-reduced grads.
  for (int n : {1, 2, 4})
    run_ranks(n, Determinism::bitwise, [&](int r, Communicator& comm) {
      std::vector<nn::Parameter> a = make_params(kShapes, comm.device(), DType::f16);
      std::vector<nn::Parameter> b = make_params(kShapes, comm.device(), DType::f16);
      optim::GradScalerOptions so;
      so.init_scale = 1024.0;
      so.growth_interval = 2;
      optim::GradScaler sa(so), sb(so);
      ZeroRedundancyOptimizer zero(ptrs(a), comm, test::zero_adamw(), 0.01f);
      zero.attach_grad_scaler(&sa);
      optim::MasterWeights mw(ptrs(b), master_adamw());
      for (int t = 0; t < 3; ++t) {
        set_grads(a, r, t, DType::f16, 64.0f);
        set_grads(b, r, t, DType::f16, 64.0f);
        if (t == 1 && r == n - 1) {
          Tensor inf =
              Tensor::from_vector(std::vector<float>{std::numeric_limits<float>::infinity()}, {1},
                                  comm.device())
                  .to(DType::f16);
          a.back().grad.narrow(0, 1).copy_(inf);
          b.back().grad.narrow(0, 1).copy_(inf);
        }
        const std::vector<std::uint8_t> before = bytes(a);
        zero.step();
        const bool skipped = sa.found_inf();
        sa.update();
        for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
        mw.load_master_grads();
        if (!sb.unscale_(mw.master_parameters(), Determinism::bitwise)) mw.step();
        sb.update();
        EXPECT_EQ(skipped, t == 1) << r << " " << t;
        EXPECT_EQ(sa.scale(), sb.scale()) << r << " " << t;
        if (t == 1) {
          EXPECT_EQ(bytes(a), before) << "rank " << r;
        }
        EXPECT_EQ(bytes(a), bytes(b)) << n << " ranks, rank " << r << " step " << t;
      }
      EXPECT_EQ(sa.skipped_steps(), 1);
      zero.consolidate_state_dict(0);
      if (r == 0) {
        EXPECT_EQ(zero.state_dict().options.at("grad_scaler.scale"), "512");
      }
    });
}

TEST_F(ZeroMixedTest, MixedDtypesAreRefused) {
  run_ranks(1, Determinism::bitwise, [&](int, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params({{4, 3}, {3}}, comm.device(), DType::bf16);
    a[1].data = a[1].data.to(DType::f32);
    test::expect_invalid([&] { ZeroRedundancyOptimizer(ptrs(a), comm, test::zero_adamw(), 0.1f); },
                         "params[1] ('p1'): expected bf16 data (the dtype of params[0]; every "
                         "parameter of one dtype), got");
  });
}

// ---- the Trainer ---------------------------------------------------------------------------

using test::digits;

train::TrainerConfig ddp(DType dt, int devices, int zero_stage) {
  train::TrainerConfig c;
  c.dtype = dt;
  c.devices = devices;
  c.trainer = train::TrainerKind::ddp;
  c.optimizer = "adam";
  c.epochs = 2;
  c.grad_clip = 0.5;
  c.zero_stage = zero_stage;
  return c;
}

TEST(ZeroMixedTrainer, Bf16AndF16ZeroStage1GiveTheChecksumWithout) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const train::FitResult want = train::Trainer(ddp(dt, 1, 0), digits()).fit();
    for (int n : {1, 2, 4}) {
      const train::FitResult got = train::Trainer(ddp(dt, n, 1), digits()).fit();
      EXPECT_EQ(got.params_checksum, want.params_checksum) << dtype_name(dt) << " " << n;
      EXPECT_EQ(got.loss_scale.has_value(), dt == DType::f16);
      if (dt == DType::f16) {
        EXPECT_EQ(*got.loss_scale, *want.loss_scale) << n;
      }
    }
  }
  // f16 with a scale that overflows: the same skipped steps with ZeRO on 4 ranks.
  train::TrainerConfig a = ddp(DType::f16, 1, 0), b = ddp(DType::f16, 4, 1);
  a.grad_scaler.init_scale = b.grad_scaler.init_scale = 1099511627776.0;  // 2^40
  const train::FitResult ra = train::Trainer(a, digits()).fit();
  const train::FitResult rb = train::Trainer(b, digits()).fit();
  EXPECT_GT(ra.skipped_steps, 10);
  EXPECT_EQ(rb.skipped_steps, ra.skipped_steps);
  EXPECT_EQ(rb.params_checksum, ra.params_checksum);
}

}  // namespace
}  // namespace ditto
