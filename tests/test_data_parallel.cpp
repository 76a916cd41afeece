// parallel::DataParallel and parallel_apply: the cases users of torch.nn.DataParallel reported
// (small batches, uneven splits, several inputs, 0-dim outputs, a failing replica), equivalence of
// 1 and 4 devices after several SGD steps, and argument errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/nn/with_loss.h"
#include "core/numerics/random.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/parallel_apply.h"
#include "core/runtime/backend.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class DataParallelTest : public SimSuite<16> {
 protected:
  // Per test: the Trainer (core/train) starts the backend with the devices each run asks for.
  void SetUp() override { init_sim(16); }
  static std::vector<Device> devs(int n) { return devices("sim", n); }
};

Tensor random_tensor(const Shape& shape, std::uint64_t seed, const Device& d = Device::cpu()) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(seed, stream_id(kStreamSynthetic, 9), i, -1, 1);
  return Tensor::from_vector(v, shape, d);
}

Tensor labels(std::int64_t n, std::int64_t classes, std::uint64_t seed) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = philox_u32(seed, stream_id(kStreamSynthetic, 10), i) % classes;
  return Tensor::from_vector(v, {n});
}

/// Records the rows each replica saw and the devices it ran on; optionally throws on one device.
class Probe : public nn::Module {
 public:
  struct Log {
    std::mutex mu;
    std::vector<std::pair<int, std::vector<std::int64_t>>> calls;  // device index, rows per input
  };
  Probe(std::shared_ptr<Log> log, int throw_on = -1, int num_inputs = 1)
      : log_(std::move(log)), throw_on_(throw_on), n_inputs_(num_inputs) {}
  std::string name() const override { return "Probe"; }
  int num_inputs() const override { return n_inputs_; }
  using Module::forward;
  Tensor forward(const std::vector<Tensor>& inputs) override {
    DITTO_CHECK(static_cast<int>(inputs.size()) == n_inputs_, "Probe: inputs");
    std::vector<std::int64_t> rows;
    for (auto& t : inputs) rows.push_back(t.size(0));
    const Device d = inputs[0].device();
    {
      std::lock_guard lk(log_->mu);
      log_->calls.emplace_back(d.index, rows);
    }
    if (d.index == throw_on_) throw InvalidArgument("probe refuses to run here");
    for (auto& t : inputs) EXPECT_EQ(t.device(), d);
    return inputs[0].clone();
  }
  Tensor backward(const Tensor& g) override { return g; }
  std::unique_ptr<Module> clone() const override {
    return std::make_unique<Probe>(log_, throw_on_, n_inputs_);
  }

 private:
  std::shared_ptr<Log> log_;
  int throw_on_;
  int n_inputs_;
};

TEST_F(DataParallelTest, BatchOf9Over4DevicesRuns3ReplicasAndSplitsEveryInputAlike) {
  auto log = std::make_shared<Probe::Log>();
  Probe probe(log, -1, 2);
  parallel::DataParallel dp(probe, devs(4));
  Tensor x = random_tensor({9, 5}, 1), y = random_tensor({9, 2}, 2);
  Tensor out = dp.forward(std::vector<Tensor>{x, y});
  EXPECT_EQ(dp.last_num_replicas(), 3);
  EXPECT_EQ(dp.last_chunk_sizes(), (std::vector<std::int64_t>{3, 3, 3}));
  ASSERT_EQ(log->calls.size(), 3u);
  std::set<int> devices_used;
  for (auto& [dev, rows] : log->calls) {
    devices_used.insert(dev);
    EXPECT_EQ(rows, (std::vector<std::int64_t>{3, 3}));
  }
  EXPECT_EQ(devices_used, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(out.to_vector<float>(), x.to_vector<float>());  // gathered back in order
}

TEST_F(DataParallelTest, BatchOf36Over7DevicesRuns6ReplicasNoneEmpty) {
  auto log = std::make_shared<Probe::Log>();
  Probe probe(log);
  parallel::DataParallel dp(probe, devs(7));
  Tensor x = random_tensor({36, 3}, 3);
  Tensor out = dp.forward(x);
  EXPECT_EQ(dp.last_num_replicas(), 6);
  ASSERT_EQ(log->calls.size(), 6u);
  for (auto& [dev, rows] : log->calls) {
    EXPECT_LT(dev, 6);
    EXPECT_EQ(rows[0], 6);
  }
  EXPECT_EQ(out.to_vector<float>(), x.to_vector<float>());
}

TEST_F(DataParallelTest, InputsWithDifferentBatchSizesAreRefused) {
  auto log = std::make_shared<Probe::Log>();
  Probe probe(log, -1, 2);
  parallel::DataParallel dp(probe, devs(4));
  expect_invalid(
      [&] {
        dp.forward(std::vector<Tensor>{random_tensor({9, 5}, 1), random_tensor({8, 2}, 2)});
      },
      "inputs[1]: expected size 9 along dim 0");
}

TEST_F(DataParallelTest, ZeroDimLossesAreGatheredIntoAVectorAndBackwardRoutesEachEntry) {
  const int n = 4;
  auto make = [] {
    return std::make_unique<nn::WithLoss>(nn::mlp({5, 7, 3}, Device("sim", 0), 11),
                                          std::make_unique<nn::CrossEntropyLoss>());
  };
  auto model = make();
  parallel::DataParallel dp(*model, devs(n));
  Tensor x = random_tensor({10, 5}, 4);
  Tensor y = labels(10, 3, 5);
  Tensor losses = dp.forward(std::vector<Tensor>{x, y});
  ASSERT_EQ(losses.shape(), (Shape{4}));  // chunks 3, 3, 3, 1
  std::vector<float> lv = losses.to_vector<float>();

  // Each entry equals the loss of that replica's chunk computed by a single-device model.
  auto ref = make();
  const std::vector<std::int64_t> chunk{3, 3, 3, 1};
  std::int64_t start = 0;
  std::vector<float> weights{0.5f, -1.0f, 2.0f, 0.25f};
  for (int i = 0; i < n; ++i) {
    Tensor xi = x.narrow(start, chunk[i]).to(Device("sim", 0));
    Tensor yi = y.narrow(start, chunk[i]).to(Device("sim", 0));
    float li = ref->forward(std::vector<Tensor>{xi, yi}).item();
    EXPECT_NEAR(lv[i], li, 1e-6f) << "replica " << i;
    // Reference gradient of sum_i w_i * loss_i, accumulated chunk by chunk.
    ref->backward(Tensor::full({}, weights[i], Device("sim", 0)));
    start += chunk[i];
  }
  model->zero_grad();
  dp.backward(Tensor::from_vector(weights, {4}, Device("sim", 0)));
  auto p = model->parameters(), q = ref->parameters();
  ASSERT_EQ(p.size(), q.size());
  for (std::size_t k = 0; k < p.size(); ++k) {
    auto a = p[k]->grad.to_vector<float>(), b = q[k]->grad.to_vector<float>();
    for (std::size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-5f) << p[k]->name;
  }
}

// Issue 16, defect 7: bitwise mode runs a replica on every device, so a batch of 5 over 8 devices
// leaves 3 replicas of a WithLoss with no rows; their loss was 0/0 = NaN (Note [Empty replica
// loss]). Now 0: every loss finite, the sum the same as fast mode's (5 one-row replicas), and
// with set_global_batch(5) on the loss (kept by the replicas' clone, defect 8) the sum is the
// mean over the 5 rows of a one-device model.
TEST_F(DataParallelTest, BitwiseBatchSmallerThanTheDevicesGivesFiniteLossesThatSumRight) {
  auto make = [](std::int64_t global_batch) {
    auto ce = std::make_unique<nn::CrossEntropyLoss>();
    ce->set_global_batch(global_batch);
    return std::make_unique<nn::WithLoss>(nn::mlp({5, 7, 3}, Device("sim", 0), 11), std::move(ce));
  };
  Tensor x = random_tensor({5, 5}, 4);
  Tensor y = labels(5, 3, 5);
  auto ref = make(0);
  const double mean =
      ref->forward(std::vector<Tensor>{x.to(Device("sim", 0)), y.to(Device("sim", 0))}).item();
  for (std::int64_t global_batch : {0, 5}) {
    double sums[2] = {0, 0};
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      auto model = make(global_batch);
      parallel::DataParallelOptions o;
      o.determinism = mode;
      parallel::DataParallel dp(*model, devs(8), o);
      std::vector<float> lv = dp.forward(std::vector<Tensor>{x, y}).to_vector<float>();
      EXPECT_EQ(lv.size(), 5u);  // issue 31 item 12: the replicas with no rows are not gathered
      double sum = 0;
      for (std::size_t i = 0; i < lv.size(); ++i) {
        EXPECT_TRUE(std::isfinite(lv[i])) << determinism_name(mode) << " replica " << i << ": "
                                          << lv[i] << " (global batch " << global_batch << ")";
        sum += lv[i];
      }
      sums[mode == Determinism::bitwise] = sum;
      // The empty replicas' backward adds nothing and stays finite.
      model->zero_grad();
      dp.backward(Tensor::full({static_cast<std::int64_t>(lv.size())}, 1.0f, Device("sim", 0)));
      for (nn::Parameter* p : model->parameters())
        for (float g : p->grad.to_vector<float>())
          ASSERT_TRUE(std::isfinite(g)) << determinism_name(mode) << " " << p->name;
    }
    EXPECT_NEAR(sums[1], sums[0], 1e-5) << "global batch " << global_batch;
    if (global_batch == 5) {
      EXPECT_NEAR(sums[1], mean, 1e-5);
    }
  }
}

// Issue 31, item 12: bitwise mode gathered one entry per device (8 for B = 5, the empty
// replicas giving 0), where fast mode and torch.nn.DataParallel (which scatters B rows to B
// replicas) give 5; a user's losses.mean() then had a gradient 5/8 of fast mode's. Now both modes
// gather the same 5 entries, and the gradient of their mean is the same.
TEST_F(DataParallelTest, BitwiseBatchSmallerThanTheDevicesGathersTheEntriesFastModeGathers) {
  auto make = [] {
    return std::make_unique<nn::WithLoss>(nn::mlp({5, 7, 3}, Device("sim", 0), 11),
                                          std::make_unique<nn::CrossEntropyLoss>());
  };
  Tensor x = random_tensor({5, 5}, 4);
  Tensor y = labels(5, 3, 5);
  std::vector<float> entries[2];
  std::vector<std::vector<float>> grads[2];
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    const int m = mode == Determinism::bitwise;
    auto model = make();
    parallel::DataParallelOptions o;
    o.determinism = mode;
    parallel::DataParallel dp(*model, devs(8), o);
    Tensor losses = dp.forward(std::vector<Tensor>{x, y});
    ASSERT_EQ(losses.shape(), (Shape{5})) << determinism_name(mode);
    entries[m] = losses.to_vector<float>();
    model->zero_grad();
    dp.backward(Tensor::full({5}, 1.0f / 5, Device("sim", 0)));  // losses.mean()
    for (nn::Parameter* p : model->parameters()) grads[m].push_back(p->grad.to_vector<float>());
  }
  // One row per entry, in row order, in both modes.
  auto ref = make();
  for (std::int64_t i = 0; i < 5; ++i) {
    const float li = ref->forward(std::vector<Tensor>{x.narrow(i, 1).to(Device("sim", 0)),
                                                      y.narrow(i, 1).to(Device("sim", 0))})
                         .item();
    EXPECT_NEAR(entries[0][static_cast<std::size_t>(i)], li, 1e-6f) << "fast, row " << i;
    EXPECT_NEAR(entries[1][static_cast<std::size_t>(i)], li, 1e-6f) << "bitwise, row " << i;
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (std::size_t k = 0; k < grads[0].size(); ++k)
    for (std::size_t j = 0; j < grads[0][k].size(); ++j)
      EXPECT_NEAR(grads[1][k][j], grads[0][k][j], 1e-6f) << "parameter " << k << " [" << j << "]";
  // An empty batch: one entry in both modes (fast mode runs replica 0 alone).
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    auto model = make();
    parallel::DataParallelOptions o;
    o.determinism = mode;
    parallel::DataParallel dp(*model, devs(8), o);
    Tensor losses = dp.forward(std::vector<Tensor>{x.narrow(0, 0), y.narrow(0, 0)});
    EXPECT_EQ(losses.shape(), (Shape{1})) << determinism_name(mode);
    dp.backward(Tensor::full({1}, 1.0f, Device("sim", 0)));
  }
}

TEST_F(DataParallelTest, ReplicaThatThrowsGivesOneErrorNamingReplicaAndDevice) {
  auto log = std::make_shared<Probe::Log>();
  Probe probe(log, /*throw_on=*/2);
  parallel::DataParallel dp(probe, devs(4));
  const std::string m = expect_error<InvalidArgument>(
      [&] {
        dp.forward(random_tensor({8, 3}, 6));
      },
      "replica 2 on sim:2");
  EXPECT_NE(m.find("probe refuses to run here"), std::string::npos) << m;
  EXPECT_EQ(log->calls.size(), 4u);  // the others ran to completion
  // The wrapper stays usable: no backward without a successful forward, and a new forward works.
  EXPECT_THROW(dp.backward(Tensor::zeros({8, 3}, DType::f32, Device("sim", 0))), InvalidArgument);
}

TEST_F(DataParallelTest, ParallelApplyReportsFirstFailingReplica) {
  std::atomic<int> ran{0};
  expect_error<OutOfMemory>(
      [&] {
        parallel::parallel_apply(devs(3), "forward", [&](int i) {
          ++ran;
          if (i >= 1) throw OutOfMemory("boom " + std::to_string(i), OutOfMemory::Kind::device);
        });
      },
      "replica 1 on sim:1 failed in forward: boom 1");
  EXPECT_EQ(ran.load(), 3);
  // The replica's OutOfMemory keeps its kind (which memory ran out) through the rethrow.
  for (OutOfMemory::Kind kind : {OutOfMemory::Kind::device, OutOfMemory::Kind::host}) {
    try {
      parallel::parallel_apply(devs(2), "forward", [&](int i) {
        if (i == 1) throw OutOfMemory("boom", kind);
      });
      ADD_FAILURE() << "no OutOfMemory";
    } catch (const OutOfMemory& e) {
      EXPECT_EQ(e.kind(), kind);
    }
  }
}

// A replica's std::bad_alloc (a host allocation under `ulimit -v`) is reported as OutOfMemory
// naming the replica and "out of host memory", not as the bare "std::bad_alloc".
TEST_F(DataParallelTest, ParallelApplyNamesAHostAllocationFailure) {
  expect_error<OutOfMemory>(
      [] {
        parallel::parallel_apply(devs(2), "backward", [](int i) {
          if (i == 1) throw std::bad_alloc();
        });
      },
      "DataParallel: replica 1 on sim:1 failed in backward: out of host memory (std::bad_alloc: "
      "a host allocation failed");
  try {  // the host's memory, said by its kind
    parallel::parallel_apply(devs(2), "backward", [](int i) {
      if (i == 1) throw std::bad_alloc();
    });
    ADD_FAILURE() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.kind(), OutOfMemory::Kind::host);
  }
}

/// Trains `steps` SGD steps of an MLP on `n` devices (fast mode, the library Trainer) and
/// returns the flattened parameters.
std::vector<float> train(int n, int steps, std::int64_t batch) {
  train::TrainerConfig c;
  c.devices = n;
  c.epochs = steps > 0 ? 1 : 0;
  c.determinism = Determinism::fast;
  c.hidden = {16};
  c.seed = 21;
  c.lr = 0.1f;
  auto data = std::make_shared<train::FunctionSource>(
      std::max(steps, 1), 6, 4, [batch](std::int64_t, std::int64_t s) {
        return data::Batch{random_tensor({batch, 6}, 100 + s), labels(batch, 4, 200 + s)};
      });
  return fitted_parameters(c, data);
}

TEST_F(DataParallelTest, OneAndFourDevicesGiveTheSameParametersWithinTolerance) {
  std::vector<float> one = train(1, 6, 30), four = train(4, 6, 30);
  ASSERT_EQ(one.size(), four.size());
  double max_diff = 0;
  for (std::size_t i = 0; i < one.size(); ++i)
    max_diff = std::max(max_diff, std::abs(double(one[i]) - four[i]));
  EXPECT_LT(max_diff, 1e-5);
  // And training moved the parameters: compare against zero steps.
  std::vector<float> start = train(1, 0, 30);
  double moved = 0;
  for (std::size_t i = 0; i < one.size(); ++i)
    moved = std::max(moved, std::abs(double(one[i]) - start[i]));
  EXPECT_GT(moved, 1e-3);
}

TEST_F(DataParallelTest, GradientsAccumulateAcrossBackwardsLikeAutograd) {
  auto model = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  parallel::DataParallel dp(*model, devs(2));
  Tensor x = random_tensor({6, 3}, 7);
  Tensor g = random_tensor({6, 2}, 8);
  dp.forward(x);
  dp.backward(g);
  std::vector<float> once = model->parameters()[0]->grad.to_vector<float>();
  dp.forward(x);
  dp.backward(g);
  std::vector<float> twice = model->parameters()[0]->grad.to_vector<float>();
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-6f);
}

TEST_F(DataParallelTest, InputGradientIsGatheredOnTheInputDevice) {
  auto model = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  auto ref = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  model->set_input_requires_grad(true);  // nn::mlp starts with it off
  ref->set_input_requires_grad(true);
  parallel::DataParallel dp(*model, devs(3));
  Tensor x = random_tensor({7, 3}, 9, Device("sim", 1));
  Tensor g = random_tensor({7, 2}, 10);
  dp.forward(x);
  Tensor gx = dp.backward(g);
  ASSERT_TRUE(gx.defined());
  EXPECT_EQ(gx.device(), Device("sim", 1));
  ref->forward(x.to(Device("sim", 0)));
  std::vector<float> want = ref->backward(g.to(Device("sim", 0))).to_vector<float>();
  std::vector<float> got = gx.to_vector<float>();
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f);
}

// A grad_output of the wrong dtype (tester hB, 6) was refused inside a replica, naming its slice
// ("expected [2, 3] f32"), and the forward was gone: a corrected retry said "no forward to go back
// through". Now shape and dtype are checked up front, naming the gathered output, and the
// forward is kept for the retry, which gives the gradients of a backward that never failed.
TEST_F(DataParallelTest, BackwardRefusesAWrongDtypeUpFrontAndKeepsTheForward) {
  auto model = nn::mlp({8, 16, 3}, Device("sim", 0), 0);
  auto ref = nn::mlp({8, 16, 3}, Device("sim", 0), 0);
  parallel::DataParallel dp(*model, devs(4));
  parallel::DataParallel ref_dp(*ref, devs(4));
  Tensor x = random_tensor({6, 8}, 3);
  Tensor g = random_tensor({6, 3}, 4, Device("sim", 0));
  dp.forward(x);
  ref_dp.forward(x);
  expect_invalid([&] { dp.backward(g.to(DType::f64)); },
                 "DataParallel.backward: grad_output: expected shape [6, 3] and dtype f32 (the "
                 "last output), got [6, 3] f64 on sim:0");
  expect_invalid(
      [&] {
        dp.backward(Tensor::full({5, 3}, 1.0f, Device("sim", 0)));
      },
      "DataParallel.backward: grad_output: expected shape [6, 3] and dtype f32 (the "
      "last output), got [5, 3] f32 on sim:0");
  dp.backward(g);  // the retry: the forward is still there
  ref_dp.backward(g);
  for (std::size_t p = 0; p < model->parameters().size(); ++p)
    EXPECT_EQ(model->parameters()[p]->grad.to_vector<float>(),
              ref->parameters()[p]->grad.to_vector<float>())
        << "parameter " << p;
  expect_invalid([&] { dp.backward(g); }, "DataParallel.backward: no forward to go back through");
}

TEST_F(DataParallelTest, ArgumentErrors) {
  auto model = nn::mlp({3, 4, 2}, Device("sim", 1), 5);
  const auto& expect = test::expect_invalid;
  expect([&] { parallel::DataParallel dp(*model, {}); }, "empty list");
  expect(
      [&] {
        parallel::DataParallel dp(*model, {Device("sim", 1), Device("sim", 1)});
      },
      "sim:1 is repeated");
  expect(
      [&] {
        parallel::DataParallel dp(*model, {Device("sim", 1), Device("sim", 99)});
      },
      "sim:99");
  expect([&] { parallel::DataParallel dp(*model, devs(2)); },
         "parameters on sim:0 (devices[0]) but parameter '0.weight' is on sim:1");
  auto m0 = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  parallel::DataParallel dp(*m0, devs(2));
  expect([&] { dp.forward(random_tensor({4, 5}, 1)); }, "expected [N, 3], got [2, 5]");
  // Bitwise mode: micro_shards must be a power of two, at least the device count, and bounded
  // (a huge K once made ditto-train allocate without limit).
  parallel::DataParallelOptions o;
  o.determinism = Determinism::bitwise;
  o.micro_shards = std::int64_t(1) << 30;
  expect([&] { parallel::DataParallel bad(*m0, devs(2), o); },
         "micro_shards: expected a power of two in [1, 65536], got 1073741824");
  o.micro_shards = 3;
  expect([&] { parallel::DataParallel bad(*m0, devs(2), o); }, "got 3");
  o.micro_shards = 2;
  expect([&] { parallel::DataParallel bad(*m0, devs(4), o); }, "supports at most 2 devices");
}

// A parameter that is not f32, bf16 or f16 is refused by the constructor, naming it, as DDP refuses
// it. It used to be accepted, and then sent replicate and backward down a path that could only
// throw.
TEST_F(DataParallelTest, ParameterThatIsNotF32IsRejectedNamingIt) {
  auto model = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  nn::Parameter* bias = model->parameters()[1];
  bias->data = Tensor::zeros(bias->data.shape(), DType::i64, Device("sim", 0));
  test::expect_invalid(
      [&] { parallel::DataParallel dp(*model, devs(2)); },
      "DataParallel: parameter 1 ('0.bias'): expected dtype f32, bf16 or f16, got ");
  // One made i64 after construction is refused at the next forward that replicates the module.
  auto m = nn::mlp({3, 4, 2}, Device("sim", 0), 5);
  parallel::DataParallel dp(*m, devs(2));
  nn::Parameter* w = m->parameters()[2];
  w->data = Tensor::zeros(w->data.shape(), DType::i64, Device("sim", 0));
  test::expect_invalid(
      [&] {
        dp.forward(random_tensor({4, 3}, 1));
      },
      "DataParallel: parameter 2 ('2.weight'): expected dtype f32, bf16 or f16, got ");
}

}  // namespace
}  // namespace ditto

namespace ditto {
namespace {

TEST_F(DataParallelTest, NestedParallelApplyDoesNotDeadlock) {
  std::atomic<int> inner{0};
  parallel::parallel_apply(devs(3), "forward", [&](int) {
    parallel::parallel_apply(devs(2), "forward", [&](int) { ++inner; });
  });
  EXPECT_EQ(inner.load(), 6);
}

TEST_F(DataParallelTest, ParallelApplyRunsEveryReplicaOnItsOwnThreadConcurrently) {
  // All replicas must be running at once (each waits for the others, bounded so it cannot hang).
  std::atomic<int> arrived{0};
  std::atomic<int> saw_all{0};
  parallel::parallel_apply(devs(4), "forward", [&](int) {
    ++arrived;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < 4 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (arrived.load() == 4) ++saw_all;
  });
  EXPECT_EQ(saw_all.load(), 4);
}

// Two torch.nn.DataParallel models trained at once in two host threads over the same devices (a
// library user's pattern, tester helper-87): before Note [DataParallel models in several
// threads], their calls interleaved on the devices' streams and most runs of 300 steps stopped
// in a Timeout (the default timeout: a 5-minute hang). Each model must finish with the bits it
// gets when trained alone in one thread.
std::vector<float> train_dp_model(int worker, int steps, const std::vector<Device>& devices) {
  const Determinism det = Determinism::bitwise;
  const std::int64_t batch = 64;
  Tensor x = random_tensor({batch, 32}, 300 + worker);
  Tensor y = labels(batch, 4, 400 + worker);
  auto model = nn::mlp({32, 256, 4}, devices[0], 7 + worker);
  parallel::DataParallelOptions o;
  o.determinism = det;
  o.comm_timeout_ms = 60000;
  parallel::DataParallel dp(*model, devices, o);
  nn::CrossEntropyLoss loss;
  loss.set_determinism(det);
  optim::SGD opt(model->parameters(), {.lr = 0.1f});
  for (int s = 0; s < steps; ++s) {
    Tensor out = dp.forward(x);
    loss.forward(out, y.to(out.device()));
    opt.zero_grad(true);
    dp.backward(loss.backward());
    opt.step();
  }
  std::vector<float> flat;
  for (nn::Parameter* p : model->parameters()) {
    std::vector<float> v = p->data.to_vector<float>();
    flat.insert(flat.end(), v.begin(), v.end());
  }
  return flat;
}

TEST_F(DataParallelTest, TwoModelsTrainedInTwoThreadsOverTheSameDevicesGiveTheirOwnBits) {
  const int steps = 300;
  const std::vector<float> alone0 = train_dp_model(0, steps, devs(4));
  const std::vector<float> alone1 = train_dp_model(1, steps, devs(4));
  ASSERT_NE(alone0, alone1);  // two different models
  std::vector<float> got[2];
  std::string error[2];
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&, w] {
      try {
        got[w] = train_dp_model(w, steps, devs(4));
      } catch (const std::exception& e) {
        error[w] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(error[0], "") << "after " << s << " s";
  EXPECT_EQ(error[1], "") << "after " << s << " s";
  EXPECT_EQ(got[0], alone0);
  EXPECT_EQ(got[1], alone1);
}

}  // namespace
}  // namespace ditto
