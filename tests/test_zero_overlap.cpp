// ZeRO-1's reduce_scatter overlapped with the backward (optim::ZeroOptions::overlap_comm, Note
// [ZeRO overlapped reduce_scatter] in core/optim/zero.h): fed grad_ready() in a backward's order,
// each grad made just before it is reported, the parameters get the bits of ZeRO without overlap
// (every reduce_scatter in step()) on 1, 2, 3 and 4 ranks, f32 / bf16 / f16, bitwise and fast,
// with the clip and a parameter without grad, and every chunk starts before step(); a grad that
// appears after its chunk started is refused; the shard and the buffer live from the first chunk
// to the end of step(). The Trainer: --zero-overlap-comm on and off give
// the same checksum (the MLP with chunks smaller than a layer, with and without gradient
// accumulation; the tiny GPT, whose wte is also its lm_head).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/comm/communicator.h"
#include "core/data/text_source.h"
#include "core/nn/gpt.h"
#include "core/optim/adamw.h"
#include "core/optim/zero.h"
#include "core/runtime/backend.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"
#include "zero_test_util.h"

namespace ditto {
namespace {

using optim::ZeroOptions;
using optim::ZeroRedundancyOptimizer;

/// Rank r's grad of parameter i at step t in dtype `dt` (seeded: different on every rank, step
/// and parameter, the same for both optimizers).
Tensor overlap_grad(const nn::Parameter& p, int r, int t, std::size_t i, DType dt) {
  const auto seed = static_cast<std::uint32_t>(1000 * t + 37 * r + static_cast<int>(i));
  Tensor g = Tensor::from_vector(
      test::random_values(static_cast<std::size_t>(p.data.numel()), seed, -0.1f, 0.1f),
      p.data.shape(), p.data.device());
  return dt == DType::f32 ? g : g.to(dt);
}

/// Every parameter's value in f32 (bf16 / f16: exact), in order.
std::vector<float> overlap_values(const std::vector<nn::Parameter>& ps) {
  std::vector<float> all;
  for (const auto& p : ps) {
    std::vector<float> v = p.data.to(DType::f32).to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

struct OverlapCase {
  int world = 2;
  DType dtype = DType::f32;
  Determinism mode = Determinism::bitwise;
  int skip = -1;  // a parameter without grad (never reported)
};

// Chunks of one block per rank (4096 elements; 3 on one rank): kShapes' 12 blocks of slots make
// 3 to 12 chunks, several inside one parameter (p5's 20000 elements, p0's 9100).
constexpr double kOverlapCapMb = 0.05;

/// ZeRO's options for these tests: kOverlapCapMb chunks, `overlap` as overlap_comm.
ZeroOptions overlap_options(bool overlap, double max_grad_norm = 0.0) {
  ZeroOptions o;
  o.max_grad_norm = max_grad_norm;
  o.bucket_cap_mb = kOverlapCapMb;
  o.overlap_comm = overlap;
  return o;
}

/// ZeRO with overlap_comm fed by grad_ready() in reverse parameter order (a backward's), each
/// grad made just before it is reported, against ZeRO without overlap fed the same grads: the
/// same parameter bits (and clip norm) after each of 3 steps; every chunk started before step()
/// unless a parameter has no grad (its chunks wait for step()).
void expect_overlap_bits(const OverlapCase& k) {
  SCOPED_TRACE(::testing::Message() << k.world << " ranks " << dtype_name(k.dtype) << " "
                                    << determinism_name(k.mode) << " skip " << k.skip);
  test::run_ranks(k.world, k.mode, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = test::make_params(test::kShapes, comm.device(), k.dtype);
    std::vector<nn::Parameter> b = test::make_params(test::kShapes, comm.device(), k.dtype);
    const ZeroOptions on = overlap_options(true, 0.5), off = overlap_options(false, 0.5);
    ZeroRedundancyOptimizer zon(test::ptrs(a), comm, test::zero_adamw(), 0.01f, on);
    ZeroRedundancyOptimizer zoff(test::ptrs(b), comm, test::zero_adamw(), 0.01f, off);
    const std::int64_t chunks = (zon.shard_numel() + zon.chunk_numel() - 1) / zon.chunk_numel();
    EXPECT_GE(chunks, 3);
    const DType gd = nn::grad_dtype(k.dtype, k.mode);
    for (int t = 0; t < 3; ++t) {
      for (auto& p : a) p.grad = Tensor();
      zon.prepare_overlap();
      for (std::size_t i = a.size(); i-- > 0;) {
        if (static_cast<int>(i) == k.skip) continue;
        a[i].grad = overlap_grad(a[i], r, t, i, gd);
        zon.grad_ready(a[i]);
      }
      zon.step();
      for (std::size_t i = 0; i < b.size(); ++i)
        b[i].grad = static_cast<int>(i) == k.skip ? Tensor() : overlap_grad(b[i], r, t, i, gd);
      zoff.step();
      EXPECT_TRUE(test::bits_equal(overlap_values(a), overlap_values(b)))
          << "rank " << r << " of " << k.world << " step " << t << " " << dtype_name(k.dtype) << " "
          << determinism_name(k.mode) << " skip " << k.skip;
      EXPECT_EQ(test::bits(zon.last_grad_norm()), test::bits(zoff.last_grad_norm()))
          << "rank " << r << " of " << k.world << " step " << t << " " << dtype_name(k.dtype) << " "
          << determinism_name(k.mode) << " skip " << k.skip;
      EXPECT_GT(zon.last_grad_norm(), 0.5f);  // the clip scales
      if (k.skip < 0)
        EXPECT_EQ(zon.chunks_overlapped(), static_cast<std::size_t>(chunks));
      else
        EXPECT_LT(zon.chunks_overlapped(), static_cast<std::size_t>(chunks));
      EXPECT_EQ(zoff.chunks_overlapped(), 0u);
    }
  });
}

class ZeroOverlapTest : public ::testing::Test {
 protected:
  void SetUp() override { test::init_sim(8); }
};

TEST_F(ZeroOverlapTest, F32ChunksStartedInTheBackwardGiveTheBitsOfStepOnly) {
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (int n : {1, 2, 3, 4}) expect_overlap_bits({n, DType::f32, mode});
  expect_overlap_bits({4, DType::f32, Determinism::bitwise, 1});  // p1 has no grad
  expect_overlap_bits({2, DType::f32, Determinism::fast, 5});
}

TEST_F(ZeroOverlapTest, Bf16AndF16ChunksStartedInTheBackwardGiveTheBitsOfStepOnly) {
  // bitwise: f32 grads of bf16 / f16 parameters; fast: grads in the parameters' dtype, reduced
  // in it and upcast into the shard (Note [ZeRO mixed precision]).
  for (DType dt : {DType::bf16, DType::f16})
    for (Determinism mode : {Determinism::bitwise, Determinism::fast})
      for (int n : {1, 2, 3, 4}) expect_overlap_bits({n, dt, mode});
  expect_overlap_bits({4, DType::bf16, Determinism::fast, 0});  // p0 has no grad
}

TEST_F(ZeroOverlapTest, WithoutPrepareOverlapStepDoesItAll) {
  // overlap_comm's layout without prepare_overlap() (bitwise gradient accumulation's fold):
  // grad_ready() does nothing and step() reduce_scatters every chunk, with the same bits.
  test::run_ranks(2, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = test::make_params(test::kShapes, comm.device());
    std::vector<nn::Parameter> b = test::make_params(test::kShapes, comm.device());
    const ZeroOptions on = overlap_options(true), off = overlap_options(false);
    ZeroRedundancyOptimizer zon(test::ptrs(a), comm, test::zero_adamw(), 0.01f, on);
    ZeroRedundancyOptimizer zoff(test::ptrs(b), comm, test::zero_adamw(), 0.01f, off);
    for (int t = 0; t < 2; ++t) {
      for (std::size_t i = a.size(); i-- > 0;) {
        a[i].grad = overlap_grad(a[i], r, t, i, DType::f32);
        b[i].grad = overlap_grad(b[i], r, t, i, DType::f32);
        zon.grad_ready(a[i]);
      }
      zon.step();
      zoff.step();
      EXPECT_EQ(zon.chunks_overlapped(), 0u);
      EXPECT_TRUE(test::bits_equal(overlap_values(a), overlap_values(b))) << "rank " << r;
    }
  });
}

TEST_F(ZeroOverlapTest, AGradNotFinalWhenReportedIsRefused) {
  test::run_ranks(2, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = test::make_params(test::kShapes, comm.device());
    const ZeroOptions on = overlap_options(true);
    ZeroRedundancyOptimizer zon(test::ptrs(a), comm, test::zero_adamw(), 0.01f, on);
    // p2 reported before its grad exists: its chunk started without it.
    zon.prepare_overlap();
    for (std::size_t i = a.size(); i-- > 0;) {
      if (i != 2) a[i].grad = overlap_grad(a[i], r, 0, i, DType::f32);
      zon.grad_ready(a[i]);
      if (i == 2) a[i].grad = overlap_grad(a[i], r, 0, i, DType::f32);
    }
    test::expect_invalid([&] { zon.step(); },
                         "params[2] ('p2'): grad appeared after its chunk's reduce_scatter "
                         "started (overlap_comm: grad_ready() must report a parameter only once "
                         "its grad is final for the step)");
    // bf16 parameters with bf16 grads: step() alone reduces them in bf16, but overlap_comm
    // reduces in nn::grad_dtype (bitwise: f32), so the grads are refused (p5's chunk first).
    std::vector<nn::Parameter> h = test::make_params(test::kShapes, comm.device(), DType::bf16);
    ZeroRedundancyOptimizer zh(test::ptrs(h), comm, test::zero_adamw(), 0.01f, on);
    zh.prepare_overlap();
    for (std::size_t i = h.size(); i-- > 0;) {
      h[i].grad = overlap_grad(h[i], r, 1, i, DType::bf16);
      zh.grad_ready(h[i]);
    }
    test::expect_invalid(
        [&] { zh.step(); },
        "params[5] ('p5'): grad: expected [20000] f32 on sim:" + std::to_string(r) +
            " (overlap_comm reduces in nn::grad_dtype), got [20000] bf16");
  });
}

TEST_F(ZeroOverlapTest, ShardAndBufferLiveFromTheFirstChunkToTheEndOfStep) {
  // Note [ZeRO overlapped reduce_scatter]: the f32 shard and the buffer are allocated when the
  // first chunk starts (in the backward) and freed by step(), so a memory report (the dry run's
  // peak) counts them from there; between steps ZeRO holds nothing but its state.
  Backend& be = test::init_sim(8);
  test::run_ranks(2, Determinism::bitwise, [&](int r, Communicator& comm) {
    std::vector<nn::Parameter> a = test::make_params(test::kShapes, comm.device());
    const ZeroOptions on = overlap_options(true);
    ZeroRedundancyOptimizer zon(test::ptrs(a), comm, test::zero_adamw(), 0.01f, on);
    const int dev = comm.device().index;
    for (int t = 0; t < 2; ++t) {
      for (std::size_t i = 0; i < a.size(); ++i)
        a[i].grad = overlap_grad(a[i], r, t, i, DType::f32);
      const std::size_t before = be.memory_stats(dev).in_use;
      zon.prepare_overlap();
      EXPECT_EQ(be.memory_stats(dev).in_use, before);
      zon.grad_ready(a[5]);  // chunk 0: p5's first two blocks
      const std::size_t bytes =
          static_cast<std::size_t>(zon.shard_numel() + 2 * zon.chunk_numel()) * 4;
      EXPECT_GE(be.memory_stats(dev).in_use, before + bytes) << "rank " << r << " step " << t;
      for (std::size_t i = a.size() - 1; i-- > 0;) zon.grad_ready(a[i]);
      zon.step();
      if (t == 1) {  // (step 0 made AdamW's moments)
        EXPECT_EQ(be.memory_stats(dev).in_use, before) << "rank " << r;
      }
    }
  });
}

// ---- the Trainer ---------------------------------------------------------------------------

/// ddp Adam on the digits MLP with ZeRO-1, the clip, chunks smaller than a layer.
train::TrainerConfig overlap_ddp(DType dt, Determinism mode, int devices, std::int64_t accum,
                                 bool overlap) {
  train::TrainerConfig c;
  c.devices = devices;
  c.trainer = train::TrainerKind::ddp;
  c.optimizer = "adam";
  c.max_iters = 6;  // six optimizer steps (an epoch is 23: the same cases at a quarter the time)
  c.eval_iters = 0;
  c.grad_clip = 0.5;
  c.dtype = dt;
  c.determinism = mode;
  c.grad_accum_steps = accum;
  c.zero_stage = 1;
  c.zero_overlap_comm = overlap;
  c.bucket_cap_mb = 0.02;  // a few blocks per chunk: fc1's weight spans several
  return c;
}

void expect_overlap_checksums(DType dt) {
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (int n : {1, 2, 3, 4})
      for (std::int64_t k : {1, 2}) {
        if (mode == Determinism::bitwise && n == 3 && k == 2) continue;  // not a power of two
        const train::FitResult off =
            train::Trainer(overlap_ddp(dt, mode, n, k, false), test::digits()).fit();
        const train::FitResult on =
            train::Trainer(overlap_ddp(dt, mode, n, k, true), test::digits()).fit();
        EXPECT_EQ(on.params_checksum, off.params_checksum)
            << dtype_name(dt) << " " << determinism_name(mode) << " " << n << " x " << k;
        EXPECT_EQ(on.skipped_steps, off.skipped_steps);
      }
}

TEST(ZeroOverlapTrainer, F32OverlapGivesTheChecksumWithout) {
  expect_overlap_checksums(DType::f32);
}

TEST(ZeroOverlapTrainer, Bf16OverlapGivesTheChecksumWithout) {
  expect_overlap_checksums(DType::bf16);
}

TEST(ZeroOverlapTrainer, F16OverlapGivesTheChecksumWithout) {
  expect_overlap_checksums(DType::f16);  // the GradScaler unscales the overlapped shard
}

TEST(ZeroOverlapTrainer, TiedGptOverlapGivesTheChecksumWithout) {
  // GPT's wte is also its lm_head: its grad is final only after the embedding's backward, when
  // GPT reports it last (its chunks go last); wpe's rows past T get no grad.
  const nn::GPTConfig m{
      .block_size = 16, .vocab_size = 78, .n_layer = 2, .n_head = 2, .n_embd = 32, .bias = true};
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (DType dt : {DType::f32, DType::bf16})
      for (int n : {2, 4}) {
        train::TrainerConfig c =
            test::tiny_gpt_trainer(m, n, train::TrainerKind::ddp, {.max_iters = 3});
        c.determinism = mode;
        c.dtype = dt;
        c.zero_stage = 1;
        c.bucket_cap_mb = 0.02;
        c.eval_iters = 0;
        auto data = [] {  // tiny Shakespeare: 78 characters
          return std::make_shared<train::TextDataSource>(DITTO_SHAKESPEARE_TXT, 16, 0);
        };
        c.zero_overlap_comm = false;
        const std::uint64_t off = train::Trainer(c, data()).fit().params_checksum;
        c.zero_overlap_comm = true;
        EXPECT_EQ(train::Trainer(c, data()).fit().params_checksum, off)
            << determinism_name(mode) << " " << dtype_name(dt) << " " << n;
      }
}

}  // namespace
}  // namespace ditto
