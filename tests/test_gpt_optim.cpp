// The GPT's optimizer side and plumbing (issue 12): the Module settings (training, step,
// first_row) passed on by Sequential and WithLoss and set on DataParallel's replicas and a DDP
// rank's module; optim::AdamW against torch.optim.AdamW's formula computed here; its state_dict;
// optim::clip_grad_norm_ against the closed form and across DDP ranks; nanoGPT's learning-rate
// schedule against train.py's get_lr written out here.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/nn/with_loss.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class GptOptimTest : public SimSuite<8> {};

// ---- plumbing ------------------------------------------------------------------------------------

/// What a Probe saw at one forward.
struct Seen {
  Device device;
  std::int64_t rows, first_row, step;
  bool training;
};

/// The log the Probes of one test (and all their clones) append to.
struct ProbeLog {
  std::mutex mu;
  std::vector<Seen> seen;
  /// The entries, ordered by device index (replicas run on parallel threads).
  std::vector<Seen> by_device() {
    std::vector<Seen> s = seen;
    std::sort(s.begin(), s.end(), [](const Seen& a, const Seen& b) { return a.device.index < b.device.index; });
    seen.clear();
    return s;
  }
};

/// Identity layer that records its settings at each forward (one [1] parameter, so that
/// DataParallel and DDP have something to replicate).
class Probe : public nn::Module {
 public:
  Probe(ProbeLog& log, const Device& device) : log_(log) {
    p_.name = "p";
    p_.data = Tensor::zeros({1}, DType::f32, device);
  }
  std::string name() const override { return "Probe"; }
  using Module::forward;
  Tensor forward(const Tensor& x) override {
    std::lock_guard<std::mutex> lock(log_.mu);
    log_.seen.push_back({x.device(), x.size(0), first_row(), step(), training()});
    return x;
  }
  Tensor backward(const Tensor& g) override { return g; }
  std::vector<nn::Parameter*> parameters() override { return {&p_}; }
  std::unique_ptr<Module> clone() const override {
    auto m = std::make_unique<Probe>(log_, p_.data.device());
    m->p_.data = p_.data;
    copy_settings(*this, *m);
    return m;
  }

 private:
  ProbeLog& log_;
  nn::Parameter p_;
};

Tensor rows_of(std::int64_t b) { return Tensor::zeros({b, 3}, DType::f32, Device::cpu()); }

TEST_F(GptOptimTest, SequentialAndWithLossPassTheSettingsOn) {
  ProbeLog log;
  const Device d0("sim", 0);
  auto seq = std::make_unique<nn::Sequential>();
  seq->set_step(5);
  seq->set_training(false);
  seq->set_first_row(9);
  seq->add(std::make_unique<Probe>(log, d0));  // takes the container's settings
  nn::Sequential* inner = seq.get();
  nn::WithLoss wl(std::move(seq), std::make_unique<nn::MSELoss>());
  EXPECT_EQ(wl.step(), 5);  // WithLoss starts with its model's settings
  EXPECT_FALSE(wl.training());
  EXPECT_EQ(wl.first_row(), 9);
  const Tensor x = rows_of(2).to(d0);
  wl.forward({x, x});
  wl.set_step(6);
  wl.set_training(true);
  wl.set_first_row(4);
  EXPECT_EQ(inner->step(), 6);
  wl.forward({x, x});
  std::vector<Seen> s = log.seen;
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].step, 5);
  EXPECT_FALSE(s[0].training);
  EXPECT_EQ(s[0].first_row, 9);
  EXPECT_EQ(s[1].step, 6);
  EXPECT_TRUE(s[1].training);
  EXPECT_EQ(s[1].first_row, 4);
  // clone() keeps them (copy_settings), down to the leaf.
  auto c = wl.clone();
  log.seen.clear();
  c->forward({x, x});
  ASSERT_EQ(log.seen.size(), 1u);
  EXPECT_EQ(log.seen[0].step, 6);
  EXPECT_EQ(log.seen[0].first_row, 4);
}

// DataParallel over 4 devices: replica i sees first_row = b0 + ... + b(i-1) of its chunk sizes,
// and the wrapped module's step and training as they are at that forward.
void check_data_parallel_rows(Determinism mode, const std::vector<std::int64_t>& want_rows) {
  ProbeLog log;
  const std::vector<Device> devs = devices("sim", 4);
  auto seq = std::make_unique<nn::Sequential>();
  seq->add(std::make_unique<Probe>(log, devs[0]));
  nn::WithLoss model(std::move(seq), std::make_unique<nn::MSELoss>());
  parallel::DataParallelOptions o;
  o.determinism = mode;
  parallel::DataParallel dp(model, devs, o);
  const Tensor x = rows_of(10);
  for (std::int64_t step : {3, 4}) {
    model.set_step(step);
    model.set_training(step == 4);
    dp.forward({x, x});
    std::vector<Seen> s = log.by_device();
    ASSERT_EQ(s.size(), 4u);
    const std::vector<std::int64_t>& chunks = dp.last_chunk_sizes();
    std::int64_t start = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(s[i].device, devs[i]);
      EXPECT_EQ(s[i].rows, chunks[i]);
      EXPECT_EQ(s[i].first_row, start) << "replica " << i;
      EXPECT_EQ(s[i].first_row, want_rows[i]) << "replica " << i;
      EXPECT_EQ(s[i].step, step);
      EXPECT_EQ(s[i].training, step == 4);
      start += chunks[i];
    }
  }
}

TEST_F(GptOptimTest, DataParallelReplicasGetTheirFirstRowStepAndTraining) {
  check_data_parallel_rows(Determinism::fast, {0, 3, 6, 9});     // torch.chunk: 3, 3, 3, 1
  check_data_parallel_rows(Determinism::bitwise, {0, 2, 5, 7});  // micro-shards: floor(2.5 d)
}

TEST_F(GptOptimTest, DataParallelOnOneDeviceGivesRowZero) {
  ProbeLog log;
  Probe probe(log, Device("sim", 0));
  probe.set_first_row(12);
  parallel::DataParallel dp(probe, devices("sim", 1));
  dp.forward(rows_of(4));
  ASSERT_EQ(log.seen.size(), 1u);
  EXPECT_EQ(log.seen[0].first_row, 0);
}

/// Runs fn(rank, comm) on one thread per rank of a new communicator over sim:0..world-1;
/// rethrows a rank's exception.
void on_ranks(int world, Determinism mode, const std::function<void(int, Communicator&)>& fn) {
  CommOptions co;
  co.determinism = mode;
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", world), co);
  std::vector<std::future<void>> done;
  for (int r = 0; r < world; ++r)
    done.push_back(std::async(std::launch::async, fn, r, std::ref(comms[static_cast<std::size_t>(r)])));
  for (auto& f : done) f.get();
}

TEST_F(GptOptimTest, DdpSetsTheRankFirstRowFromTheGlobalBatch) {
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    ProbeLog log;
    std::vector<std::int64_t> lo(4, -1);
    on_ranks(4, mode, [&](int r, Communicator& comm) {
      Probe probe(log, comm.device());
      probe.set_step(11);
      parallel::DistributedDataParallel ddp(probe, comm);
      const auto [a, b] = ddp.local_rows(10);
      lo[static_cast<std::size_t>(r)] = a;
      ddp.forward({rows_of(b - a)}, 10);
    });
    EXPECT_EQ(lo, (std::vector<std::int64_t>{0, 2, 5, 7}));
    std::vector<Seen> s = log.by_device();
    ASSERT_EQ(s.size(), 4u);
    for (std::size_t r = 0; r < 4; ++r) {
      EXPECT_EQ(s[r].first_row, lo[r]) << "rank " << r;
      EXPECT_EQ(s[r].step, 11);
    }
  }
}

}  // namespace
}  // namespace ditto
