// The Trainer's evaluation as a library user meets it (tester7's findings on the library API):
// Replica::eval_loss from on_finish under ddp, data sources that give the ranks different eval
// batches, errors of a bad eval batch, losses and modules whose clone() is their base's.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/nn/linear.h"
#include "core/nn/loss.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/ops.h"
#include "core/train/replica.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto::train {
namespace {

using test::digits;

TrainerConfig eval_run(int devices, TrainerKind kind) {
  TrainerConfig c;
  c.devices = devices;
  c.trainer = kind;
  c.max_iters = 4;
  c.eval_interval = 2;
  c.eval_iters = 2;
  c.batch_size = 32;
  c.comm_timeout_ms = 20000;  // a hang fails as a Timeout, not after the default 300 s
  return c;
}

/// digits(), with eval_batch(split, k) changed by `edit` on every call after the first for the
/// same (split, k) when `edit_later_calls`, else on every call: a source that is not a function of
/// (split, k) alone (a sequential reader; one that is not thread-safe).
class EditedEvalSource : public test::ForwardingSource {
 public:
  using Edit = std::function<void(data::Batch&, EvalSplit, std::int64_t)>;
  EditedEvalSource(Edit edit, bool edit_later_calls)
      : ForwardingSource(digits()), edit_(std::move(edit)), later_(edit_later_calls) {}
  data::Batch eval_batch(EvalSplit split, std::int64_t k, std::int64_t batch_size) override {
    data::Batch b = inner_->eval_batch(split, k, batch_size);
    bool edit = !later_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      edit = edit || calls_[{static_cast<int>(split), k}]++ > 0;
    }
    if (edit) edit_(b, split, k);
    return b;
  }

 private:
  Edit edit_;
  bool later_;
  std::mutex mu_;
  std::map<std::pair<int, std::int64_t>, int> calls_;
};

// tester7's F2: on_finish runs on rank 0 alone, and Replica::eval_loss there (nanoGPT's last
// estimate_loss) was the ddp collective: it waited for the other ranks until the communicator's
// timeout (300 s by default) and failed. Now it evaluates on the calling rank alone, with the
// bits of the evaluation the Trainer made at the last step and of dp on one device.
TEST(TrainerEval, EvalLossInOnFinishUnderDdpGivesTheLossOfOneDevice) {
  auto finish_loss = [](int n, TrainerKind k, double* last_eval) {
    auto data = digits();
    double loss = -1;
    TrainerCallbacks cb;
    cb.on_eval = [&](const EvalMetrics& m) { *last_eval = m.val_loss; };
    cb.on_finish = [&](Replica& rep) { loss = rep.eval_loss(*data, EvalSplit::val, 2, 32); };
    Trainer(eval_run(n, k), data, cb).fit();
    return loss;
  };
  double one_eval = 0;
  const double one = finish_loss(1, TrainerKind::dp, &one_eval);
  EXPECT_EQ(std::bit_cast<std::uint64_t>(one), std::bit_cast<std::uint64_t>(one_eval));
  for (int n : {2, 4}) {
    double last_eval = 0;
    const double ddp = finish_loss(n, TrainerKind::ddp, &last_eval);
    EXPECT_EQ(std::bit_cast<std::uint64_t>(ddp), std::bit_cast<std::uint64_t>(one)) << n;
    EXPECT_EQ(std::bit_cast<std::uint64_t>(last_eval), std::bit_cast<std::uint64_t>(one)) << n;
  }
}

// tester7's F3 and F4: under ddp every rank's thread calls eval_batch; a source that gives the
// ranks other batches for one (split, k) mixed them without a word (same rows, other contents)
// or left the ranks waiting for each other until the timeout (other rows). Now every rank
// refuses at once, naming the batch and the ranks.
TEST(TrainerEval, EvalBatchesThatDifferBetweenRanksAreRefusedOnEveryRankAtOnce) {
  auto other_contents = [](data::Batch& b, EvalSplit, std::int64_t) {
    b.x = b.x.to(Device::cpu());
    std::vector<float> x = b.x.to_vector<float>();
    x[0] += 1.0f;
    b.x = Tensor::from_vector(x, b.x.shape(), Device::cpu());
  };
  auto fewer_rows = [](data::Batch& b, EvalSplit, std::int64_t) {
    b.x = b.x.narrow(0, b.x.size(0) - 4);
    b.y = b.y.narrow(0, b.y.size(0) - 4);
  };
  for (auto* edit : {+other_contents, +fewer_rows}) {
    const bool rows = edit == +fewer_rows;
    test::expect_invalid(
        [&] {
          Trainer(eval_run(4, TrainerKind::ddp), std::make_shared<EditedEvalSource>(edit, true))
              .fit();
        },
        // Which rank's thread calls first (and gets the unedited batch) varies.
        rows ? "DataSource::eval_batch(train, 0) gave the ranks different batches (rows: rank 0 "
             : "DataSource::eval_batch(train, 0) gave the ranks different batches (rows: rank 0 "
               "32, rank 1 32, rank 2 32, rank 3 32; ranks whose rows or contents differ from "
               "rank 0's: ");
    if (rows)  // three ranks got 28 rows, one 32
      test::expect_invalid(
          [&] {
            Trainer(eval_run(4, TrainerKind::ddp), std::make_shared<EditedEvalSource>(edit, true))
                .fit();
          },
          " 28, rank ");
  }
  // The same edit on every call is a function of (split, k): evaluated, as on one device.
  std::vector<double> one, four;
  for (auto [n, k, out] : {std::tuple{1, TrainerKind::dp, &one}, {4, TrainerKind::ddp, &four}}) {
    TrainerCallbacks cb;
    cb.on_eval = [out = out](const EvalMetrics& m) { out->push_back(m.val_loss); };
    Trainer(eval_run(n, k), std::make_shared<EditedEvalSource>(+other_contents, false), cb).fit();
  }
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(four.size(), 3u);
  for (std::size_t i = 0; i < one.size(); ++i)
    EXPECT_EQ(std::bit_cast<std::uint64_t>(four[i]), std::bit_cast<std::uint64_t>(one[i])) << i;
}

// tester7's F5: an error in a bad eval batch named neither the batch nor, under ddp, which rows
// of it the rank's piece holds (a label out of range in row 31 was `targets[7]` on rank 3).
TEST(TrainerEval, ABadEvalBatchsErrorNamesTheBatchAndTheRanksRows) {
  auto bad_label = [](data::Batch& b, EvalSplit split, std::int64_t k) {
    if (split != EvalSplit::val || k != 1) return;
    std::vector<std::int64_t> y = b.y.to_vector<std::int64_t>();
    y.back() = 99;
    b.y = Tensor::from_vector(y, b.y.shape(), Device::cpu());
  };
  test::expect_invalid(
      [&] {
        Trainer(eval_run(1, TrainerKind::dp), std::make_shared<EditedEvalSource>(bad_label, false))
            .fit();
      },
      "evaluating DataSource::eval_batch(val, 1), all 32 rows: ");
  test::expect_invalid(
      [&] {
        Trainer(eval_run(4, TrainerKind::ddp), std::make_shared<EditedEvalSource>(bad_label, false))
            .fit();
      },
      "evaluating DataSource::eval_batch(val, 1), rows [24, 32) of its 32 on rank 3 in pieces of "
      "up to 8 (an index below is one in its piece): ");
}

/// A loss that is twice cross-entropy: forward overridden, clone() inherited (LossOf's) unless
/// `Own`.
template <bool Own>
class TwiceCrossEntropy : public nn::CrossEntropyLoss {
 public:
  Tensor forward(const Tensor& input, const Tensor& target) override {
    Tensor l = nn::CrossEntropyLoss::forward(input, target);
    return Tensor::from_vector(std::vector<float>{2.0f * l.item()}, {}, l.device());
  }
  std::unique_ptr<nn::Loss> clone() const override {
    if constexpr (Own) {
      auto c = std::make_unique<TwiceCrossEntropy>();
      c->set_determinism(determinism());
      c->set_global_batch(global_batch());
      return c;
    } else {
      return nn::CrossEntropyLoss::clone();
    }
  }
};

// tester7's F1: a loss subclass that overrides forward but inherits clone() was evaluated under
// ddp as its base (the evaluation's copy is a clone): half dp's loss here, without a word. Now
// the clone is refused, naming both types; with its own clone() ddp gives dp's loss.
TEST(TrainerEval, ALossWhoseCloneIsItsBaseIsRefusedWhereTheTrainerClonesIt) {
  TrainerConfig sliced = eval_run(2, TrainerKind::ddp);
  sliced.make_loss = [] { return std::make_unique<TwiceCrossEntropy<false>>(); };
  test::expect_invalid([&] { Trainer(sliced, digits()).fit(); },
                       "TwiceCrossEntropy<false>::clone() returned a ditto::nn::CrossEntropyLoss, "
                       "not a ditto::train::(anonymous namespace)::TwiceCrossEntropy<false>");
  std::vector<double> dp, ddp;
  for (auto [n, k, out] : {std::tuple{1, TrainerKind::dp, &dp}, {2, TrainerKind::ddp, &ddp}}) {
    TrainerConfig c = eval_run(n, k);
    c.make_loss = [] { return std::make_unique<TwiceCrossEntropy<true>>(); };
    TrainerCallbacks cb;
    cb.on_eval = [out = out](const EvalMetrics& m) { out->push_back(m.val_loss); };
    Trainer(c, digits(), cb).fit();
  }
  ASSERT_EQ(dp.size(), 3u);
  ASSERT_EQ(ddp.size(), 3u);
  EXPECT_GT(dp[0], 2 * 2.0);  // twice about ln(10) at step 0
  for (std::size_t i = 0; i < dp.size(); ++i) EXPECT_NEAR(ddp[i], dp[i], 1e-5 * dp[i]) << i;
}

/// nn::Linear with another forward (a doubled output); clone() inherited (Linear's): its
/// DataParallel replicas would be plain Linears.
class DoubledLinear : public nn::Linear {
 public:
  DoubledLinear() : nn::Linear(4, 3, Device("sim", 0), 0) {}
  Tensor forward(const Tensor& x) override {
    Tensor y = nn::Linear::forward(x);
    ops::scale_(y, 2.0f);
    return y;
  }
};

/// nn::Linear whose backward returns no input gradient (a first layer of a user's), clone()
/// its own.
class NoInputGradLinear : public nn::Linear {
 public:
  explicit NoInputGradLinear(const Device& d) : nn::Linear(4, 3, d, 0), device_(d) {}
  Tensor backward(const Tensor& g) override {
    nn::Linear::backward(g);
    return Tensor();
  }
  std::unique_ptr<nn::Module> clone() const override {
    auto c = std::make_unique<NoInputGradLinear>(device_);  // DataParallel rebinds the data
    c->set_input_requires_grad(input_requires_grad());
    return c;
  }

 private:
  Device device_;
};

TEST(TrainerEval, DataParallelRefusesAModuleWhoseCloneIsItsBaseAndTakesOneWithoutInputGrad) {
  test::init_sim(2);
  DoubledLinear sliced;
  Tensor x = Tensor::from_vector(std::vector<float>(8 * 4, 0.5f), {8, 4}, Device("sim", 0));
  test::expect_invalid(
      [&] {
        parallel::DataParallel dp(sliced, {Device("sim", 0), Device("sim", 1)});
        dp.forward(x);
      },
      "DataParallel: the module's replica: ditto::train::(anonymous namespace)::DoubledLinear::"
      "clone() returned a ditto::nn::Linear, not a ");
  // tester7's F6: no input gradient from the replicas gives none, as on one device (comm::gather
  // refused the undefined tensors, naming its own argument).
  NoInputGradLinear first(Device("sim", 0));
  for (int n : {1, 2}) {
    std::vector<Device> devs{Device("sim", 0)};
    if (n == 2) devs.push_back(Device("sim", 1));
    parallel::DataParallel dp(first, devs);
    Tensor y = dp.forward(x);
    Tensor g = Tensor::from_vector(std::vector<float>(8 * 3, 1.0f), {8, 3}, Device("sim", 0));
    EXPECT_FALSE(dp.backward(g).defined()) << n << " devices";
    for (nn::Parameter* p : first.parameters()) EXPECT_TRUE(p->grad.defined()) << n;
    for (nn::Parameter* p : first.parameters()) p->grad = Tensor();
  }
}

}  // namespace
}  // namespace ditto::train
