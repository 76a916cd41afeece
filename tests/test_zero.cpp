// optim::ZeroRedundancyOptimizer (ZeRO-1, core/optim/zero.h): on 1, 2, 4 and 8 ranks its
// parameters equal, bit for bit, the unsharded optimizer's after an all_reduce of the same grads
// (SGD with momentum, Adam, AdamW with nanoGPT's groups; with and without the clip, whose norm
// must equal clip_grad_norm_'s), in chunks smaller than a shard and with ranks that hold only
// padding; fast mode within a tolerance; the flat layout; sum_squares_blocks; the optimizer
// state per rank is 1/N; bad arguments. The Trainer: --zero-stage 1 gives the same checksum as
// without (MLP ddp Adam, with clip), the sim's peak memory drops, dp and checkpoints are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/data/data_source.h"
#include "core/numerics/gpt_math.h"
#include "core/optim/adam.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/optim/sgd.h"
#include "core/optim/zero.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"
#include "zero_test_util.h"

namespace ditto {
namespace {

using InnerOptimizerFactory = optim::ZeroInnerFactory;
using optim::ZeroOptions;
using optim::ZeroRedundancyOptimizer;

using test::run_ranks;

using test::make_params;
using test::ptrs;

/// Rank r's grads of step t (different on every rank and step); `skip` leaves one undefined.
void set_grads(std::vector<nn::Parameter>& ps, int r, int t, int skip = -1) {
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (static_cast<int>(i) == skip) {
      ps[i].grad = Tensor();
      continue;
    }
    const auto seed = static_cast<std::uint32_t>(1000 * t + 37 * r + static_cast<int>(i));
    ps[i].grad =
        Tensor::from_vector(test::random_values(static_cast<std::size_t>(ps[i].data.numel()), seed),
                            ps[i].data.shape(), ps[i].data.device());
  }
}

std::vector<float> values(std::vector<nn::Parameter>& ps) {
  std::vector<float> all;
  for (auto& p : ps) {
    std::vector<float> v = p.data.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

InnerOptimizerFactory sgd_factory() {
  return [](std::vector<nn::Parameter*> ps, float lr) {
    optim::SGDOptions o;
    o.lr = lr;
    o.momentum = 0.9f;
    o.weight_decay = 0.01f;
    return std::make_unique<optim::SGD>(std::move(ps), o);
  };
}

InnerOptimizerFactory adam_factory() {
  return [](std::vector<nn::Parameter*> ps, float lr) {
    optim::AdamOptions o;
    o.lr = lr;
    o.weight_decay = 0.01;
    return std::make_unique<optim::Adam>(std::move(ps), o);
  };
}

using test::kShapes;

struct Case {
  InnerOptimizerFactory factory;
  double clip = 0.0;
  double bucket_cap_mb = 25.0;
  int skip = -1;  // a parameter without grad
};

/// ZeRO on `world` ranks against all_reduce + (clip_grad_norm_) + the unsharded optimizer:
/// the same bits after 3 steps, the same norm each step.
void expect_same_bits(int world, const Case& k, const std::vector<Shape>& shapes = kShapes) {
  run_ranks(world, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params(shapes, comm.device());
    std::vector<nn::Parameter> b = make_params(shapes, comm.device());
    ZeroOptions zo;
    zo.max_grad_norm = k.clip;
    zo.bucket_cap_mb = k.bucket_cap_mb;
    ZeroRedundancyOptimizer zero(ptrs(a), comm, k.factory, 0.01f, zo);
    std::unique_ptr<optim::Optimizer> ref = k.factory(ptrs(b), 0.01f);
    for (int t = 0; t < 3; ++t) {
      set_grads(a, r, t, k.skip);
      set_grads(b, r, t, k.skip);
      zero.step();
      for (auto& p : b)
        if (p.grad.defined()) comm.all_reduce(p.grad, ReduceOp::sum);
      if (k.clip > 0) {
        const float norm = optim::clip_grad_norm_(ptrs(b), k.clip, Determinism::bitwise);
        EXPECT_EQ(test::bits(zero.last_grad_norm()), test::bits(norm))
            << "rank " << r << " step " << t;
      }
      ref->step();
      EXPECT_TRUE(test::bits_equal(values(a), values(b))) << "rank " << r << " step " << t;
    }
  });
}

class ZeroTest : public ::testing::Test {
 protected:
  void SetUp() override { test::init_sim(8); }
};

TEST_F(ZeroTest, SgdMomentumEqualsTheUnshardedBitsOn1248Ranks) {
  for (int n : {1, 2, 4, 8}) expect_same_bits(n, {sgd_factory()});
}

TEST_F(ZeroTest, AdamEqualsTheUnshardedBitsOn1248Ranks) {
  for (int n : {1, 2, 4, 8}) expect_same_bits(n, {adam_factory()});
}

TEST_F(ZeroTest, AdamWWithNanoGptGroupsEqualsTheUnshardedBits) {
  for (int n : {1, 2, 4, 8}) expect_same_bits(n, {test::zero_adamw()});
}

TEST_F(ZeroTest, ClipInsideGivesClipGradNormsNormAndBits) {
  for (int n : {1, 2, 4, 8}) {
    expect_same_bits(n, {test::zero_adamw(), 0.5});  // clips every step
    expect_same_bits(n, {sgd_factory(), 1e6});       // never clips, same norm
  }
}

TEST_F(ZeroTest, ChunksSmallerThanAShardGiveTheSameBits) {
  // bucket_cap_mb this small: one block per rank per chunk, several chunks per shard.
  for (int n : {2, 4}) expect_same_bits(n, {adam_factory(), 0.5, 0.001});
}

TEST_F(ZeroTest, ARankWithOnlyPaddingAndAParameterWithoutGrad) {
  // 12 + 4 elements over 8 ranks: ranks 2..7 hold padding only (a placeholder segment).
  expect_same_bits(8, {adam_factory(), 0.5}, {{4, 3}, {4}});
  // The parameter without grad gets no update and no state, as torch (and no norm term).
  expect_same_bits(4, {test::zero_adamw(), 0.5, 25.0, 1});
}

TEST_F(ZeroTest, FlatLayoutIsBlockAlignedAndShardsAreEqual) {
  run_ranks(4, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params(kShapes, comm.device());
    ZeroOptions zo;
    zo.bucket_cap_mb = 0.001;
    ZeroRedundancyOptimizer zero(ptrs(a), comm, adam_factory(), 0.01f, zo);
    const std::int64_t blk = gpt::kSquaresBlock;
    // Slots in the backward's order (reverse): 5, 1, 1, 1, 1, 3 blocks = 12 blocks; 4 ranks x
    // 3 blocks, chunks of one block per rank.
    EXPECT_EQ(zero.slot_offset(5), 0);
    EXPECT_EQ(zero.slot_offset(4), 5 * blk);
    EXPECT_EQ(zero.slot_offset(1), 8 * blk);
    EXPECT_EQ(zero.slot_offset(0), 9 * blk);
    EXPECT_EQ(zero.flat_numel(), 12 * blk);
    EXPECT_EQ(zero.shard_numel(), 3 * blk);
    EXPECT_EQ(zero.chunk_numel(), blk);
    // Blocks: p5 [0, 5) (20000 elements), p4 5, p3 6, p2 7, p1 8, p0 [9, 12) (9100). Chunk c is
    // blocks [4c, 4c + 4), rank q owning block 4c + q: rank 0 p5's blocks 0 and 4 (two
    // segments) and p1; rank 1 p5's block 1, p4, p0's block 0; rank 2 p5's 2, p3, p0's 1;
    // rank 3 p5's 3, p2, p0's 2.
    const std::vector<std::size_t> segs{3, 3, 3, 3};
    EXPECT_EQ(zero.num_segments(), segs[static_cast<std::size_t>(r)]) << "rank " << r;
  });
}

TEST_F(ZeroTest, FastModeIsCloseToTheUnsharded) {
  run_ranks(4, Determinism::fast, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params(kShapes, comm.device());
    std::vector<nn::Parameter> b = make_params(kShapes, comm.device());
    ZeroOptions zo;
    zo.max_grad_norm = 0.5;
    ZeroRedundancyOptimizer zero(ptrs(a), comm, adam_factory(), 0.01f, zo);
    std::unique_ptr<optim::Optimizer> ref = adam_factory()(ptrs(b), 0.01f);
    for (int t = 0; t < 3; ++t) {
      set_grads(a, r, t);
      set_grads(b, r, t);
      zero.step();
      for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
      const float norm = optim::clip_grad_norm_(ptrs(b), 0.5, Determinism::fast);
      EXPECT_NEAR(zero.last_grad_norm(), norm, 1e-4 * norm);
      ref->step();
    }
    const std::vector<float> va = values(a), vb = values(b);
    for (std::size_t i = 0; i < va.size(); ++i) ASSERT_NEAR(va[i], vb[i], 1e-5) << i;
  });
}

TEST_F(ZeroTest, OptimizerStateIsOneNthOfTheUnsharded) {
  // Equal slots (4 x 3 blocks): each rank's share of Adam's moments is exactly 1/N.
  const std::int64_t blk = gpt::kSquaresBlock;
  const std::vector<Shape> shapes{{3, blk}, {3 * blk}, {blk, 3}, {3 * blk}};
  std::size_t unsharded = 0;
  {
    Device dev("sim", 0);
    std::vector<nn::Parameter> b = make_params(shapes, dev);
    std::unique_ptr<optim::Optimizer> ref = adam_factory()(ptrs(b), 0.01f);
    set_grads(b, 0, 0);
    ref->step();
    unsharded = ref->state_bytes();
    EXPECT_EQ(unsharded, static_cast<std::size_t>(2 * 12 * blk * 4));  // exp_avg + exp_avg_sq
  }
  for (int n : {1, 2, 4}) {
    std::vector<std::size_t> bytes(static_cast<std::size_t>(n));
    run_ranks(n, Determinism::bitwise, [&](int r, Communicator& comm) {
      std::vector<nn::Parameter> a = make_params(shapes, comm.device());
      ZeroRedundancyOptimizer zero(ptrs(a), comm, adam_factory(), 0.01f);
      EXPECT_EQ(zero.state_bytes(), 0u);  // nothing before the first step, as torch
      set_grads(a, r, 0);
      zero.step();
      bytes[static_cast<std::size_t>(r)] = zero.state_bytes();
    });
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(bytes[static_cast<std::size_t>(r)], unsharded / static_cast<std::size_t>(n))
          << n << " ranks, rank " << r;
  }
}

TEST_F(ZeroTest, SumSquaresBlocksAreTheLeavesOfSumSquares) {
  const std::int64_t blk = gpt::kSquaresBlock;
  const std::int64_t n = 2 * blk + 77;
  Tensor x = Tensor::from_vector(test::random_values(static_cast<std::size_t>(n), 5), {n},
                                 Device("sim", 0));
  std::vector<float> leaves = ops::sum_squares_blocks(x).to_vector<float>();
  ASSERT_EQ(leaves.size(), 3u);
  std::vector<float> h = x.to_vector<float>();
  for (std::size_t j = 0; j < 3; ++j) {
    const std::int64_t lo = static_cast<std::int64_t>(j) * blk;
    EXPECT_EQ(test::bits(leaves[j]),
              test::bits(gpt::squares_chain(h.data() + lo, std::min(blk, n - lo))));
    // One block's sum_squares is its leaf (a tree over one leaf), what the default uses.
    EXPECT_EQ(
        test::bits(leaves[j]),
        test::bits(
            ops::sum_squares(x.narrow(lo, std::min(blk, n - lo)), Determinism::bitwise).item()));
  }
  // The tree over the three leaves is sum_squares' bitwise result.
  EXPECT_EQ(test::bits(ops::sum_squares(x, Determinism::bitwise).item()),
            test::bits((leaves[0] + leaves[1]) + leaves[2]));
  EXPECT_EQ(ops::sum_squares_blocks(Tensor::empty({0}, DType::f32, Device("sim", 0))).numel(), 0);
}

/// Each tensor's bytes by name.
using test::tensor_bytes;

TEST_F(ZeroTest, ConsolidatedStateIsTheUnshardedStateAndLoadsBack) {
  for (const InnerOptimizerFactory& f : {sgd_factory(), adam_factory(), test::zero_adamw()})
    for (int n : {1, 2, 4, 8})
      run_ranks(n, Determinism::bitwise, [&](int r, Communicator& comm) {
        std::vector<nn::Parameter> a = make_params(kShapes, comm.device());
        std::vector<nn::Parameter> b = make_params(kShapes, comm.device());
        std::vector<nn::Parameter> c = make_params(kShapes, comm.device());
        ZeroRedundancyOptimizer zero(ptrs(a), comm, f, 0.01f);
        std::unique_ptr<optim::Optimizer> ref = f(ptrs(b), 0.01f);
        for (int t = 0; t < 2; ++t) {
          set_grads(a, r, t);
          set_grads(b, r, t);
          zero.step();
          for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
          ref->step();
        }
        zero.consolidate_state_dict(0);
        const optim::OptimizerState want = ref->state_dict();
        if (r == 0) {
          const optim::OptimizerState got = zero.state_dict();
          EXPECT_EQ(got.type, want.type);
          EXPECT_EQ(got.options, want.options);
          EXPECT_EQ(tensor_bytes(got), tensor_bytes(want)) << n << " ranks";
        } else {
          test::expect_invalid([&] { zero.state_dict(); },
                               "expected consolidate_state_dict(to) on every rank first");
        }
        // A new ZeRO loads the unsharded state (the parameters as the reference's): the next
        // step gives the reference's bits.
        for (std::size_t i = 0; i < c.size(); ++i) c[i].data.copy_(b[i].data);
        ZeroRedundancyOptimizer loaded(ptrs(c), comm, f, 0.01f);
        loaded.load_state_dict(want);
        set_grads(c, r, 2);
        set_grads(b, r, 2);
        loaded.step();
        for (auto& p : b) comm.all_reduce(p.grad, ReduceOp::sum);
        ref->step();
        EXPECT_TRUE(test::bits_equal(values(c), values(b))) << n << " ranks, rank " << r;
        // A state of another optimizer type is refused as the unsharded optimizer refuses it.
        optim::OptimizerState other = want;
        other.type = "Other";
        test::expect_invalid([&] { loaded.load_state_dict(other); }, "expected the state of a");
      });
}

TEST_F(ZeroTest, BadArgumentsAreInvalidArguments) {
  run_ranks(2, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = make_params({{4, 3}}, comm.device());
    ZeroOptions zo;
    zo.max_grad_norm = -1;
    test::expect_invalid([&] { ZeroRedundancyOptimizer(ptrs(a), comm, adam_factory(), 0.1f, zo); },
                         "optim::ZeroRedundancyOptimizer: options.max_grad_norm: expected a "
                         "finite value >= 0");
    zo = {};
    zo.bucket_cap_mb = 0;
    test::expect_invalid([&] { ZeroRedundancyOptimizer(ptrs(a), comm, adam_factory(), 0.1f, zo); },
                         "options.bucket_cap_mb: expected a finite size in MiB > 0, got 0");
    test::expect_invalid([&] { ZeroRedundancyOptimizer(ptrs(a), comm, {}, 0.1f); },
                         "make_inner: expected an optimizer factory");
    std::vector<nn::Parameter> other = make_params({{4, 3}}, Device("sim", 1 - r));
    test::expect_invalid([&] { ZeroRedundancyOptimizer(ptrs(other), comm, adam_factory(), 0.1f); },
                         "params[0] ('p0'): expected a parameter on sim:" + std::to_string(r));
    ZeroRedundancyOptimizer zero(ptrs(a), comm, adam_factory(), 0.1f);
    a[0].grad = Tensor::zeros({3, 4}, DType::f32, comm.device());
    test::expect_invalid([&] { zero.step(); },
                         "optim::ZeroRedundancyOptimizer: params[0] ('p0'): grad: expected [4, 3] "
                         "f32 on sim:" +
                             std::to_string(r));
    test::expect_invalid([&] { zero.set_lr(-1); }, "Invalid learning rate");
    test::expect_invalid([&] { zero.state_dict(); }, "expected consolidate_state_dict(to)");
    test::expect_invalid([&] { zero.consolidate_state_dict(2); },
                         "consolidate_state_dict: to: expected a rank in [0, 2), got 2");
  });
}

// ---- the Trainer ---------------------------------------------------------------------------

using test::digits;

train::TrainerConfig ddp_adam(int devices, int zero_stage) {
  train::TrainerConfig c;
  c.devices = devices;
  c.trainer = train::TrainerKind::ddp;
  c.optimizer = "adam";
  c.epochs = 2;
  c.zero_stage = zero_stage;
  return c;
}

TEST(ZeroTrainer, ZeroStage1GivesTheSameChecksumAsWithoutOn124Devices) {
  const std::uint64_t want = train::Trainer(ddp_adam(1, 0), digits()).fit().params_checksum;
  for (int n : {1, 2, 4}) {
    EXPECT_EQ(train::Trainer(ddp_adam(n, 0), digits()).fit().params_checksum, want) << n;
    EXPECT_EQ(train::Trainer(ddp_adam(n, 1), digits()).fit().params_checksum, want) << n;
  }
  // With the clip inside ZeRO (a max_norm the digits' gradients exceed).
  train::TrainerConfig c = ddp_adam(1, 0);
  c.grad_clip = 0.05;
  const std::uint64_t clipped = train::Trainer(c, digits()).fit().params_checksum;
  EXPECT_NE(clipped, want);
  for (int n : {2, 4}) {
    c = ddp_adam(n, 1);
    c.grad_clip = 0.05;
    EXPECT_EQ(train::Trainer(c, digits()).fit().params_checksum, clipped) << n;
  }
}

TEST(ZeroTrainer, WithGradAccumulationEqualsOneStepWithoutZero) {
  // Plan rule 6: every micro-step's backward under no_sync, the ZeRO step reduce_scatters the
  // folded grads: --grad-accum-steps K --zero-stage 1 equals one step of the batch without ZeRO.
  train::TrainerConfig c = ddp_adam(1, 0);
  c.grad_clip = 0.05;
  const std::uint64_t want = train::Trainer(c, digits()).fit().params_checksum;
  for (int n : {2, 4})
    for (std::int64_t k : {2, 4}) {
      c = ddp_adam(n, 1);
      c.grad_clip = 0.05;
      c.grad_accum_steps = k;
      EXPECT_EQ(train::Trainer(c, digits()).fit().params_checksum, want) << n << " x " << k;
    }
}

TEST(ZeroTrainer, OptimizerStateAndPeakMemoryPerDeviceDrop) {
  // The MLP 64-512-10 (38410 parameters: the slots' padding is small beside them) and chunks of
  // one block per rank (bucket_cap_mb), so ZeRO's own buffers are small beside the moments.
  constexpr std::size_t kParams = 64 * 512 + 512 + 512 * 10 + 10;
  for (int n : {1, 2, 4}) {
    train::TrainerConfig pc = ddp_adam(n, 0), zc = ddp_adam(n, 1);
    pc.hidden = zc.hidden = {512};
    pc.epochs = zc.epochs = 1;
    pc.bucket_cap_mb = zc.bucket_cap_mb = 0.0625;
    train::FitResult plain = train::Trainer(pc, digits()).fit();
    train::FitResult zero = train::Trainer(zc, digits()).fit();
    EXPECT_EQ(zero.params_checksum, plain.params_checksum);
    ASSERT_EQ(plain.memory.size(), static_cast<std::size_t>(n));
    ASSERT_EQ(zero.memory.size(), static_cast<std::size_t>(n));
    std::size_t sum = 0;
    for (int d = 0; d < n; ++d) {
      const auto& p = plain.memory[static_cast<std::size_t>(d)];
      const auto& z = zero.memory[static_cast<std::size_t>(d)];
      // Adam's two f32 moments of every parameter on every device.
      EXPECT_EQ(p.optimizer_state_bytes, 2u * kParams * 4u) << n << " devices, " << d;
      EXPECT_LE(z.optimizer_state_bytes, p.optimizer_state_bytes) << n << " devices, " << d;
      if (n > 1) {
        EXPECT_LT(z.stats.peak, p.stats.peak) << n << " devices, " << d;
      }
      sum += z.optimizer_state_bytes;
    }
    // The shards partition the moments (ranks of only padding hold 8 placeholder bytes).
    EXPECT_GE(sum, 2u * kParams * 4u);
    EXPECT_LE(sum, 2u * kParams * 4u + 8u * static_cast<std::size_t>(n));
  }
}

TEST(ZeroTrainer, DpIsRefused) {
  train::TrainerConfig c = ddp_adam(2, 1);
  c.trainer = train::TrainerKind::dp;
  c.field_names = {{"zero_stage", "--zero-stage"}, {"trainer", "--trainer"}};
  test::expect_invalid([&] { train::Trainer(c, digits()); },
                       "--zero-stage 1 needs --trainer ddp (ZeRO shards the optimizer over "
                       "DDP's ranks), got dp");
}

std::string scratch(const std::string& name) { return test::scratch_path("test_zero", name); }

TEST(ZeroTrainer, CheckpointsMoveBetweenZeroAndPlainRuns) {
  // The consolidated (unsharded) layout: a ZeRO run's checkpoint resumes without ZeRO on another
  // device count, and a plain run's resumes with ZeRO, both ending in the uninterrupted bits.
  const std::uint64_t want = train::Trainer(ddp_adam(2, 0), digits()).fit().params_checksum;
  for (int first_zero : {1, 0}) {
    const std::string dir = scratch("ck" + std::to_string(first_zero));
    train::TrainerConfig a = ddp_adam(2, first_zero);
    a.epochs = 1;
    a.checkpoint_dir = dir;
    train::Trainer(a, digits()).fit();
    train::TrainerConfig b = ddp_adam(4, 1 - first_zero);
    b.resume_dir = dir;
    std::ostringstream log;
    b.log = &log;
    EXPECT_EQ(train::Trainer(b, digits()).fit().params_checksum, want) << first_zero;
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace ditto
