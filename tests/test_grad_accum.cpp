// Gradient accumulation (Note [Gradient accumulation], core/train/grad_accumulation.h): the rows
// of each micro-step, the canonical tree over micro-steps, and through the Trainer: K micro-steps
// of B/K give the bits of one step of B in bitwise mode (MLP and a tiny GPT, with dropout too,
// 1/2/4 devices, dp and ddp), fast mode stays close to K = 1, and bad settings are refused naming
// --grad-accum-steps, --micro-shards and --devices with the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <vector>

#include "core/comm/comm.h"
#include "core/data/text_source.h"
#include "core/nn/gpt.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "core/train/grad_accumulation.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto::train {
namespace {

using V = std::vector<std::int64_t>;

// ---- micro_batch: which rows each micro-step takes

TEST(GradAccumRows, BitwiseDpMicroStepsAreBlocksOfWholeMicroShards) {
  // B = 48 rows, M = 8 shards of 6 rows; K = 4: blocks of 2 shards = 12 rows.
  for (std::int64_t k = 0; k < 4; ++k) {
    MicroBatch m = micro_batch(48, 8, 1, 0, 4, k, Determinism::bitwise);
    EXPECT_EQ(m.first_row, 12 * k);
    EXPECT_EQ(m.end_row, 12 * (k + 1));
    EXPECT_EQ(m.shard_bounds, (V{0, 6, 12}));
  }
  // Uneven shards: B = 10, M = 4 -> bounds 0, 2, 5, 7, 10; K = 2: [0, 5) and [5, 10), each with
  // the global bounds restricted and rebased.
  MicroBatch a = micro_batch(10, 4, 1, 0, 2, 0, Determinism::bitwise);
  MicroBatch b = micro_batch(10, 4, 1, 0, 2, 1, Determinism::bitwise);
  EXPECT_EQ(a.first_row, 0);
  EXPECT_EQ(a.end_row, 5);
  EXPECT_EQ(a.shard_bounds, (V{0, 2, 5}));
  EXPECT_EQ(b.first_row, 5);
  EXPECT_EQ(b.end_row, 10);
  EXPECT_EQ(b.shard_bounds, (V{0, 2, 5}));
  // Fewer rows than shards: empty micro-steps are allowed (their shards are empty).
  // B = 2, M = 8: bounds 0,0,0,0,1,1,1,1,2; K = 4: micro-step 0 (shards 0, 1) is empty, micro-step
  // 1 (shards 2, 3) holds row 0 in its shard 3.
  MicroBatch e = micro_batch(2, 8, 1, 0, 4, 0, Determinism::bitwise);
  EXPECT_EQ(e.rows(), 0);
  EXPECT_EQ(e.shard_bounds, (V{0, 0, 0}));
  MicroBatch f = micro_batch(2, 8, 1, 0, 4, 1, Determinism::bitwise);
  EXPECT_EQ(f.first_row, 0);
  EXPECT_EQ(f.rows(), 1);
  EXPECT_EQ(f.shard_bounds, (V{0, 0, 1}));
}

TEST(GradAccumRows, BitwiseDdpMicroStepsSplitEachRanksLocalRows) {
  // B = 64, M = 16, D = 2 ranks, K = 2: rank 1 holds shards [8, 16) = rows [32, 64); its
  // micro-step 1 is shards [12, 16) = rows [48, 64).
  MicroBatch m = micro_batch(64, 16, 2, 1, 2, 1, Determinism::bitwise);
  EXPECT_EQ(m.first_row, 48);
  EXPECT_EQ(m.end_row, 64);
  EXPECT_EQ(m.shard_bounds, (V{0, 4, 8, 12, 16}));
  // The micro-steps of every rank tile the batch in order.
  std::int64_t next = 0;
  for (int r = 0; r < 4; ++r)
    for (std::int64_t k = 0; k < 4; ++k) {
      MicroBatch p = micro_batch(50, 64, 4, r, 4, k, Determinism::bitwise);
      EXPECT_EQ(p.first_row, next);
      EXPECT_EQ(p.shard_bounds.size(), 5u);
      EXPECT_EQ(p.shard_bounds.back(), p.rows());
      next = p.end_row;
    }
  EXPECT_EQ(next, 50);
}

TEST(GradAccumRows, FastMicroStepsAreNearEqualPartsOfTheRanksRows) {
  // dp: 10 rows in 3 parts: floor(k * 10 / 3) = 0, 3, 6, 10.
  EXPECT_EQ(micro_batch(10, 64, 1, 0, 3, 0, Determinism::fast).end_row, 3);
  EXPECT_EQ(micro_batch(10, 64, 1, 0, 3, 1, Determinism::fast).end_row, 6);
  MicroBatch last = micro_batch(10, 64, 1, 0, 3, 2, Determinism::fast);
  EXPECT_EQ(last.first_row, 6);
  EXPECT_EQ(last.end_row, 10);
  EXPECT_TRUE(last.shard_bounds.empty());
  // ddp: rank 1 of 2 holds rows [32, 64) of 64; K = 3 (not a divisor: fine in fast mode).
  MicroBatch r1 = micro_batch(64, 64, 2, 1, 3, 0, Determinism::fast);
  EXPECT_EQ(r1.first_row, 32);
  EXPECT_EQ(r1.end_row, 42);
}

// Fast mode splits a batch over ddp ranks as DataParallel's fast scatter does (torch.chunk,
// comm::chunk_sizes), whatever the micro-shards: 24 rows over 3 ranks are 8 each (they were 7, 8
// and 9, the bounds of 64 micro-shards; 6, 6 and 12 with 4). Bitwise keeps the micro-shards'
// (DdpTest.LocalRowsFollowMicroShardsInBitwiseModeTorchChunkInFast).
TEST(GradAccumRows, FastDdpRanksTakeTorchChunkPartsWhateverTheMicroShards) {
  for (std::int64_t shards : {4, 64})
    for (int r = 0; r < 3; ++r) {
      const MicroBatch m = micro_batch(24, shards, 3, r, 1, 0, Determinism::fast);
      EXPECT_EQ(m.first_row, 8 * r) << shards << " shards, rank " << r;
      EXPECT_EQ(m.rows(), 8) << shards << " shards, rank " << r;
    }
  // 48 over 6 ranks: 8 each, and each rank's 2 micro-steps 4 each.
  for (int r = 0; r < 6; ++r)
    for (std::int64_t k = 0; k < 2; ++k) {
      const MicroBatch m = micro_batch(48, 64, 6, r, 2, k, Determinism::fast);
      EXPECT_EQ(m.first_row, 8 * r + 4 * k);
      EXPECT_EQ(m.rows(), 4);
    }
  // An uneven batch: ceil(B / D) rows a rank, the last shorter (10 over 4: 3, 3, 3, 1), as
  // comm::chunk_sizes; 36 over 7: 6 ranks of 6 and an empty one (DataParallel uses 6 devices).
  std::int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const MicroBatch m = micro_batch(10, 64, 4, r, 1, 0, Determinism::fast);
    EXPECT_EQ(m.first_row, next);
    EXPECT_EQ(m.rows(), comm::chunk_sizes(10, 4)[static_cast<std::size_t>(r)]);
    next = m.end_row;
  }
  EXPECT_EQ(next, 10);
  EXPECT_EQ(micro_batch(36, 64, 7, 6, 1, 0, Determinism::fast).rows(), 0);
}

TEST(GradAccumRows, BadArgumentsAreRefused) {
  test::expect_invalid([] { micro_batch(48, 8, 1, 0, 3, 0, Determinism::bitwise); },
                       "micro_batch: bitwise mode needs micro_shards divisible by world x steps, "
                       "got 8 micro-shards, world 1, steps 3");
  test::expect_invalid([] { micro_batch(48, 8, 1, 0, 4, 4, Determinism::fast); },
                       "micro_batch: step: expected 0..3, got 4");
  test::expect_invalid([] { micro_batch(48, 6, 1, 0, 2, 0, Determinism::fast); },
                       "micro_batch: micro_shards: expected a power of two, got 6");
}

// ---- GradAccumulator: the canonical tree over micro-steps

float leaf_sum(const std::vector<float>& leaves) {
  Tensor dummy = Tensor::empty({1}, DType::f32, Device("sim", 0));
  nn::Parameter p;
  p.data = dummy;
  GradAccumulator acc;
  for (float v : leaves) {
    p.grad = Tensor::from_vector(std::vector<float>{v}, {1}, Device("sim", 0));
    acc.push({&p});
  }
  acc.finish({&p});
  return p.grad.item();
}

TEST(GradAccumTree, FoldsWithTheCanonicalTreeNotLeftToRight) {
  init_backend("sim", BackendOptions{});
  // (1e8 + 1) + (-1e8 + 1) = 1e8 + -1e8 = 0 in f32; left to right ((1e8 + 1) - 1e8) + 1 = 1.
  EXPECT_EQ(leaf_sum({1e8f, 1.0f, -1e8f, 1.0f}), 0.0f);
  // 3 leaves: (a + b) + c, the tree over [0, 3) split at 2.
  EXPECT_EQ(leaf_sum({1.0f, 1e8f, -1e8f}), -1e8f + (1.0f + 1e8f));
  EXPECT_EQ(leaf_sum({1.0f, 1e8f, -1e8f}), 0.0f);
  // 8 leaves: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
  const std::vector<float> l{3e7f, 1.5f, -3e7f, 2.25f, 1e-3f, 7e6f, -7e6f, 0.5f};
  const float want = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  EXPECT_EQ(leaf_sum(l), want);
  float chain = 0.0f;
  for (float v : l) chain += v;
  EXPECT_NE(chain, want);  // the left-to-right chain would give other bits
}

TEST(GradAccumTree, AParameterWithoutAGradIsZerosAndFinishNeedsAPush) {
  init_backend("sim", BackendOptions{});
  const Device d("sim", 0);
  nn::Parameter p;
  p.data = Tensor::empty({2}, DType::f32, d);
  GradAccumulator acc;
  acc.push({&p});  // no grad in micro-step 0
  p.grad = Tensor::from_vector(std::vector<float>{1.0f, -2.0f}, {2}, d);
  acc.push({&p});
  EXPECT_FALSE(p.grad.defined());  // moved into the tree
  acc.finish({&p});
  EXPECT_EQ(p.grad.to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  test::expect_invalid([&] { acc.finish({&p}); }, "GradAccumulator.finish: nothing was pushed");
}

// ---- through the Trainer

/// Mixed-magnitude synthetic classification data: 12 features, 5 classes.
data::Dataset synthetic(std::int64_t n) { return test::mixed_magnitude_classes(n); }

std::vector<float> flat(nn::Module& m) { return flat_parameters(m); }

/// MLP 12-32-16-5, SGD with Nesterov momentum, 2 epochs of 200 rows in batches of 48 (uneven
/// and empty micro-shards; the epoch's last batch has 8 rows).
TrainerConfig mlp(int devices, TrainerKind kind, std::int64_t accum, Determinism mode) {
  TrainerConfig c;
  c.devices = devices;
  c.trainer = kind;
  c.epochs = 2;
  c.batch_size = 48;
  c.determinism = mode;
  c.grad_accum_steps = accum;
  c.make_model = [](const Device& d) { return nn::mlp({12, 32, 16, 5}, d, 17); };
  c.make_optimizer = [](std::vector<nn::Parameter*> params, float) {
    return test::nesterov_sgd(std::move(params));
  };
  c.eval_batch_size = 64;
  return c;
}

std::shared_ptr<DataSource> mlp_data(std::int64_t rows = 200) {
  return std::make_shared<DatasetSource>(synthetic(rows), data::Dataset{}, /*seed=*/3);
}

struct FitRun {
  std::uint64_t checksum = 0;
  std::vector<float> params;
  double train_loss = 0;
};

FitRun fit(const TrainerConfig& c, std::shared_ptr<DataSource> data) {
  FitRun r;
  TrainerCallbacks cb;
  cb.on_finish = [&](Replica& rep) { r.params = flat(rep.model()); };
  FitResult f = Trainer(c, std::move(data), cb).fit();
  r.checksum = f.params_checksum;
  r.train_loss = f.train_loss;
  return r;
}

TEST(GradAccumTrainer, MlpBitwiseAccumulationGivesTheBitsOfOneStep) {
  auto data = mlp_data();
  const FitRun one = fit(mlp(1, TrainerKind::dp, 1, Determinism::bitwise), data);
  const FitRun fresh = fit(mlp(1, TrainerKind::dp, 1, Determinism::bitwise), mlp_data());
  ASSERT_EQ(fresh.checksum, one.checksum);
  for (std::int64_t k : {2, 4, 16})
    for (int n : {1, 2, 4})
      for (TrainerKind kind : {TrainerKind::dp, TrainerKind::ddp}) {
        if (k * n > 64) continue;
        const FitRun got = fit(mlp(n, kind, k, Determinism::bitwise), data);
        EXPECT_EQ(got.checksum, one.checksum)
            << "K=" << k << " devices=" << n << " " << trainer_kind_name(kind);
        EXPECT_NEAR(got.train_loss, one.train_loss, 1e-6 * std::abs(one.train_loss));
      }
  // The micro-steps really run: the loss sees K forwards of B/K rows (48 rows, M = 64: each
  // micro-step of K = 4 holds 16 shards, 12 rows), the epoch's last batch of 8 rows likewise.
  auto rows = std::make_shared<std::vector<std::int64_t>>();
  struct RecordingLoss final : nn::CrossEntropyLoss {
    std::shared_ptr<std::vector<std::int64_t>> rows;
    Tensor forward(const Tensor& input, const Tensor& target) override {
      rows->push_back(input.size(0));
      return nn::CrossEntropyLoss::forward(input, target);
    }
  };
  TrainerConfig rec = mlp(2, TrainerKind::dp, 4, Determinism::bitwise);
  rec.make_loss = [rows] {
    auto l = std::make_unique<RecordingLoss>();
    l->rows = rows;
    return l;
  };
  EXPECT_EQ(fit(rec, data).checksum, one.checksum);
  std::vector<std::int64_t> epoch{12, 12, 12, 12, 12, 12, 12, 12, 12, 12,
                                  12, 12, 12, 12, 12, 12, 2,  2,  2,  2};
  std::vector<std::int64_t> want = epoch;
  want.insert(want.end(), epoch.begin(), epoch.end());
  EXPECT_EQ(*rows, want);
  // And training changed the parameters (a no-op step would pass the comparison).
  TrainerConfig none = mlp(1, TrainerKind::dp, 1, Determinism::bitwise);
  none.epochs = 0;
  EXPECT_NE(fit(none, data).checksum, one.checksum);
}

TEST(GradAccumTrainer, MlpBitwiseWithMseAndClippingToo) {
  auto data = mlp_data(120);
  TrainerConfig c1 = mlp(1, TrainerKind::dp, 1, Determinism::bitwise);
  c1.loss = "mse";
  c1.grad_clip = 0.5;
  c1.micro_shards = 16;
  c1.batch_size = 30;
  const FitRun one = fit(c1, data);
  for (auto [n, kind, k] :
       {std::tuple{2, TrainerKind::ddp, 8}, {4, TrainerKind::dp, 4}, {1, TrainerKind::ddp, 2}}) {
    TrainerConfig c = c1;
    c.devices = n;
    c.trainer = kind;
    c.grad_accum_steps = k;
    EXPECT_EQ(fit(c, data).checksum, one.checksum) << n << " devices, K=" << k;
  }
}

TEST(GradAccumTrainer, MlpFastModeStaysCloseToOneStep) {
  auto data = mlp_data();
  const FitRun one = fit(mlp(2, TrainerKind::ddp, 1, Determinism::fast), data);
  for (std::int64_t k : {3, 4}) {
    for (TrainerKind kind : {TrainerKind::dp, TrainerKind::ddp}) {
      const FitRun got = fit(mlp(2, kind, k, Determinism::fast), data);
      ASSERT_EQ(got.params.size(), one.params.size());
      double worst = 0, scale = 0;
      for (std::size_t i = 0; i < got.params.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::abs(got.params[i] - one.params[i])));
        scale = std::max(scale, static_cast<double>(std::abs(one.params[i])));
      }
      EXPECT_LT(worst, 1e-4 * scale) << "K=" << k << " " << trainer_kind_name(kind);
      EXPECT_NEAR(got.train_loss, one.train_loss, 1e-4 * std::abs(one.train_loss));
    }
  }
}

// A tiny GPT (AdamW, nanoGPT's schedule, clipping) on the bundled text, as test_gpt_trainer.cpp.
TrainerConfig tiny_gpt_accum(int devices, TrainerKind kind, std::int64_t accum,
                             float dropout = 0.0f) {
  TrainerConfig c =
      test::tiny_gpt_trainer({.block_size = 16,
                              .vocab_size = 78,
                              .n_layer = 2,
                              .n_head = 2,
                              .n_embd = 16,
                              .dropout = dropout},
                             devices, kind, {.max_iters = 6, .eval_interval = 3, .eval_iters = 1});
  c.grad_accum_steps = accum;
  return c;
}

TEST(GradAccumTrainer, GptBitwiseAccumulationGivesTheBitsOfOneStepWithAndWithoutDropout) {
  auto text = std::make_shared<TextDataSource>(DITTO_SHAKESPEARE_TXT, 16, 0);
  std::vector<EvalMetrics> evals1, evals4;
  TrainerCallbacks cb1, cb4;
  cb1.on_eval = [&](const EvalMetrics& m) { evals1.push_back(m); };
  cb4.on_eval = [&](const EvalMetrics& m) { evals4.push_back(m); };
  const FitResult one = Trainer(tiny_gpt_accum(1, TrainerKind::dp, 1), text, cb1).fit();
  const FitResult four = Trainer(tiny_gpt_accum(2, TrainerKind::ddp, 4), text, cb4).fit();
  EXPECT_EQ(four.params_checksum, one.params_checksum);
  // Evaluations (and so the losses they print) are the same; tokens count the whole steps.
  ASSERT_EQ(evals4.size(), evals1.size());
  for (std::size_t i = 0; i < evals1.size(); ++i) {
    EXPECT_EQ(evals4[i].val_loss, evals1[i].val_loss) << i;
    EXPECT_EQ(evals4[i].tokens, evals1[i].tokens) << i;
  }
  EXPECT_EQ(evals4[1].tokens, 3 * 8 * 16);
  for (auto [n, kind, k] : {std::tuple{1, TrainerKind::dp, 2},
                            {2, TrainerKind::dp, 4},
                            {4, TrainerKind::dp, 2},
                            {1, TrainerKind::ddp, 4},
                            {4, TrainerKind::ddp, 2}})
    EXPECT_EQ(Trainer(tiny_gpt_accum(n, kind, k), text).fit().params_checksum, one.params_checksum)
        << n << " devices, " << trainer_kind_name(kind) << ", K=" << k;
  // Dropout: masks keyed by the global row, so micro-steps draw the rows' own masks.
  const std::uint64_t drop1 =
      Trainer(tiny_gpt_accum(1, TrainerKind::dp, 1, 0.1f), text).fit().params_checksum;
  EXPECT_NE(drop1, one.params_checksum);
  EXPECT_EQ(Trainer(tiny_gpt_accum(1, TrainerKind::dp, 4, 0.1f), text).fit().params_checksum,
            drop1);
  EXPECT_EQ(Trainer(tiny_gpt_accum(2, TrainerKind::ddp, 2, 0.1f), text).fit().params_checksum,
            drop1);
}

TEST(GradAccumTrainer, ACheckpointResumesWithAnotherK) {
  // grad_accum_steps is no checkpoint setting (it does not change the bits): 1 epoch with K = 1,
  // resumed for the second with K = 4 on 2 ddp ranks, ends as 2 epochs with K = 1.
  auto data = mlp_data();
  const FitRun two = fit(mlp(1, TrainerKind::dp, 1, Determinism::bitwise), data);
  const std::filesystem::path dir = test::scratch_path("test_grad_accum", "resume");
  TrainerConfig first = mlp(1, TrainerKind::dp, 1, Determinism::bitwise);
  first.epochs = 1;
  first.checkpoint_dir = dir.string();
  fit(first, data);
  TrainerConfig rest = mlp(2, TrainerKind::ddp, 4, Determinism::bitwise);
  rest.resume_dir = dir.string();
  std::ostringstream log;
  rest.log = &log;
  EXPECT_EQ(fit(rest, data).checksum, two.checksum);
  std::filesystem::remove_all(dir);
}

TEST(GradAccumParallel, BlockForwardsRefuseBoundsThatDoNotFit) {
  BackendOptions o;
  o.device_count = 2;
  init_backend("sim", o);
  const std::vector<Device> devs = devices("sim", 2);
  auto model = nn::mlp({3, 2}, devs[0], 1);
  parallel::DataParallelOptions dpo;
  dpo.determinism = Determinism::bitwise;
  parallel::DataParallel dp(*model, devs, dpo);
  const Tensor x = Tensor::zeros({4, 3}, DType::f32, Device::cpu());
  test::expect_invalid(
      [&] {
        dp.forward({x}, 0, {0, 4});
      },
      "DataParallel.forward: shard_bounds: bitwise mode gives every device whole "
      "micro-shards: expected at least 2 shards (the devices), got 1");
  test::expect_invalid(
      [&] {
        dp.forward({x}, 0, {0, 1, 3});
      },
      "DataParallel.forward: bounds: expected the last entry to equal rows = 4, "
      "got 3");
  test::expect_invalid(
      [&] {
        dp.forward({x}, -1, {0, 2, 4});
      },
      "DataParallel.forward: first_row: expected >= 0, got -1");
  // A valid block: the replicas' first rows are offset by first_row (Note [Dropout masks]).
  EXPECT_EQ(dp.forward({x}, 8, {0, 1, 2, 3, 4}).shape(), (Shape{4, 2}));
  // DDP (one rank): sync_gradients is refused with join (its shadows follow backward only).
  CommOptions co;
  co.determinism = Determinism::bitwise;
  std::vector<Communicator> comms = Communicator::init_all({devs[0]}, co);
  auto single = nn::mlp({3, 2}, devs[0], 1);
  parallel::DistributedDataParallel ddp(*single, comms[0]);
  test::expect_invalid(
      [&] {
        ddp.forward({x}, 0, {0, 2, 5});
      },
      "DistributedDataParallel.forward: bounds: expected the last entry to equal "
      "rows = 4, got 5");
  ddp.enable_join();
  test::expect_invalid([&] { ddp.sync_gradients(); },
                       "DistributedDataParallel.sync_gradients: not available with enable_join()");
}

TEST(GradAccumTrainer, BadSettingsNameTheOptionsAndTheNumbers) {
  auto data = mlp_data();
  TrainerConfig c = mlp(4, TrainerKind::ddp, 3, Determinism::bitwise);
  c.field_names = {{"grad_accum_steps", "--grad-accum-steps"},
                   {"micro_shards", "--micro-shards"},
                   {"devices", "--devices"},
                   {"batch_size", "--batch-size"}};
  test::expect_invalid([&] { Trainer(c, data).fit(); },
                       "--grad-accum-steps: bitwise mode folds the micro-steps with the canonical "
                       "tree over a power of two of them (Note [Gradient accumulation]): expected "
                       "a power of two, got 3");
  c.grad_accum_steps = 32;
  test::expect_invalid([&] { Trainer(c, data).fit(); },
                       "--grad-accum-steps x --devices: bitwise mode gives every micro-step of "
                       "every device whole micro-shards: expected --micro-shards (64) divisible "
                       "by --grad-accum-steps (32) x --devices (4) = 128 (raise --micro-shards or "
                       "lower --grad-accum-steps)");
  c.trainer = TrainerKind::dp;  // dp splits each micro-step over the devices too
  test::expect_invalid([&] { Trainer(c, data).fit(); }, "= 128 (raise --micro-shards");
  // Session 56 (A1): no power-of-two --micro-shards is divisible by 2 x 3; it advised raising it.
  c.devices = 3;
  c.grad_accum_steps = 2;
  c.field_names["determinism"] = "--determinism";
  for (TrainerKind kind : {TrainerKind::dp, TrainerKind::ddp}) {
    c.trainer = kind;
    test::expect_invalid([&] { Trainer(c, data).fit(); },
                         "--grad-accum-steps x --devices: bitwise mode gives every micro-step of "
                         "every device whole micro-shards, and --micro-shards is a power of two: "
                         "expected a power-of-two device count (1, 2, 4, ...) with "
                         "--grad-accum-steps 2, got --devices 3 (use --determinism fast, a "
                         "power-of-two --devices, or --grad-accum-steps 1)");
  }
  c.devices = 4;
  c.grad_accum_steps = 0;
  test::expect_invalid([&] { Trainer(c, data).fit(); }, "--grad-accum-steps: expected >= 1, got 0");
  // Fast mode: every micro-step of every rank needs a row (48 rows over 4 ranks: 12 each).
  c.determinism = Determinism::fast;
  c.trainer = TrainerKind::ddp;
  c.grad_accum_steps = 13;
  test::expect_invalid([&] { Trainer(c, data).fit(); },
                       "--grad-accum-steps: every micro-step of every rank needs at least one row: "
                       "expected at most 12 (the smallest share of a batch of 48 rows over 4 "
                       "ranks), got 13 (raise --batch-size or lower --grad-accum-steps)");
  c.grad_accum_steps = 12;  // fits the batch of 48, but not the epoch's last batch of 8 rows
  test::expect_invalid([&] { Trainer(c, data).fit(); },
                       "expected at most 2 (the smallest share of a batch of 8 rows over 4 ranks)");
}

// Trainer::check (ditto-train's out-of-memory hint offers only what it accepts) checked fast
// mode's micro-steps against batch_size alone: it accepted grad_accum_steps 12 on 4 ranks for
// batches of 48 (12 rows a rank), which fit() refuses at the epoch's last batch of 8 rows (2 a
// rank). Both now refuse it through the same check (DataSource::shortest_batch_rows), fit()
// before training; iteration mode only where the run reaches that batch (step B - 1, B = 5).
TEST(GradAccumTrainer, CheckRefusesWhatTheEpochsShortLastBatchRefuses) {
  auto data = mlp_data();  // 200 rows: 4 batches of 48, then one of 8
  EXPECT_EQ(data->batches_per_epoch(48), 5);
  EXPECT_EQ(data->shortest_batch_rows(48), 8);
  EXPECT_EQ(data->shortest_batch_rows(50), 50);  // 4 x 50: no short batch
  EXPECT_EQ(data->shortest_batch_rows(500), 200);
  EXPECT_EQ(mlp_data(7)->shortest_batch_rows(48), 7);  // one batch, short
  TrainerConfig c = mlp(4, TrainerKind::ddp, 12, Determinism::fast);
  c.field_names = {{"grad_accum_steps", "--grad-accum-steps"}, {"batch_size", "--batch-size"}};
  const std::string refusal =
      "--grad-accum-steps: every micro-step of every rank needs at least one row: expected at "
      "most 2 (the smallest share of a batch of 8 rows over 4 ranks), got 12 (raise --batch-size "
      "or lower --grad-accum-steps)";
  test::expect_invalid([&] { Trainer::check(c, data); }, refusal);
  int started = 0;
  TrainerCallbacks cb;
  cb.on_start = [&](const RunInfo&) { ++started; };
  test::expect_invalid([&] { Trainer(c, data, cb).fit(); }, refusal);
  EXPECT_EQ(started, 0);   // refused before training, not at the end of epoch 1
  c.grad_accum_steps = 2;  // 2 rows a rank of the last batch: accepted
  EXPECT_NO_THROW(Trainer::check(c, data));
  c.trainer = TrainerKind::dp;  // dp: one rank, the whole batch of 8
  c.grad_accum_steps = 8;
  EXPECT_NO_THROW(Trainer::check(c, data));
  c.grad_accum_steps = 9;
  test::expect_invalid([&] { Trainer::check(c, data); },
                       "expected at most 8 (the rows of a batch of 8), got 9");
  // Iteration mode: steps 0..3 are full batches; step 4 is the short one.
  c.max_iters = 4;
  EXPECT_NO_THROW(Trainer::check(c, data));
  EXPECT_EQ(Trainer(c, data).fit().steps, 4);
  c.max_iters = 5;
  test::expect_invalid([&] { Trainer::check(c, data); },
                       "expected at most 8 (the rows of a batch of 8), got 9");
}

// A rank torch.chunk's split gives no rows (tester hB, 8): 4 rows over 3 ranks are 2, 2, 0.
// grad_accum_steps 1 ran with the empty rank, but 2 was refused "expected at most 0 (the
// smallest share of a batch of 4 rows over 3 ranks)", which no setting satisfies. The empty
// rank runs its micro-steps empty now; the bound is the smallest share that holds rows.
TEST(GradAccumTrainer, ARankGivenNoRowsRunsEmptyMicroStepsAndBoundsNothing) {
  TrainerConfig c = mlp(3, TrainerKind::ddp, 1, Determinism::fast);
  c.batch_size = 4;
  c.field_names = {{"grad_accum_steps", "--grad-accum-steps"}, {"batch_size", "--batch-size"}};
  auto data = mlp_data(12);  // 3 batches of 4: every batch 2, 2, 0 rows over the ranks
  const FitRun one = fit(c, data);
  c.grad_accum_steps = 2;
  EXPECT_NO_THROW(Trainer::check(c, data));
  const FitRun two = fit(c, data);  // refused before: "expected at most 0"
  ASSERT_EQ(two.params.size(), one.params.size());
  for (std::size_t i = 0; i < one.params.size(); ++i)
    EXPECT_NEAR(two.params[i], one.params[i], 1e-5f * std::max(1.0f, std::abs(one.params[i])))
        << "parameter element " << i;
  EXPECT_NEAR(two.train_loss, one.train_loss, 1e-5 * std::abs(one.train_loss));
  c.grad_accum_steps = 3;  // more micro-steps than the 2 rows of the ranks that hold rows
  test::expect_invalid([&] { Trainer::check(c, data); },
                       "--grad-accum-steps: every micro-step of every rank holding rows needs at "
                       "least one row: expected at most 2 (the smallest share of a batch of 4 "
                       "rows over 3 ranks, of the 2 given rows; torch.chunk's split gives 1 rank "
                       "none, which runs its micro-steps empty), got 3 (raise --batch-size or "
                       "lower --grad-accum-steps)");
  // The tester's 10 rows: the last batch of 2 is 1, 1, 0 over the ranks: at most 1, not 0.
  c.grad_accum_steps = 2;
  test::expect_invalid([&] { Trainer::check(c, mlp_data(10)); },
                       "expected at most 1 (the smallest share of a batch of 2 rows over 3 "
                       "ranks, of the 2 given rows; torch.chunk's split gives 1 rank none, which "
                       "runs its micro-steps empty), got 2");
}

}  // namespace
}  // namespace ditto::train
