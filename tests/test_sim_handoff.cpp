// Stream hand-offs (Note [Stream hand-offs], backend_sim/sim_stream.cpp): a host thread that
// waits on a stream runs the stream's work itself when that work has not started on the pool,
// and a blocking copy on an idle stream runs on the calling thread; the order of the work and
// where its errors surface stay as they were. A collective's deadline, left armed across rounds
// (Note [Lazy deadline], sim_communicator.cpp), still times a round out at its own deadline.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_executor.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/error.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using Clock = std::chrono::steady_clock;

class SimHandoffTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { init_sim(4); }
};

// Waits (bounded) until `pred()`; its last value.
template <typename F>
bool eventually(F pred, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

TEST_F(SimHandoffTest, BlockingCopyOnAnIdleStreamRunsOnTheCallingThread) {
  auto s = get_backend("sim").create_stream(1);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  ss.synchronize();  // idle
  std::thread::id ran_on;
  ss.run_sync([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  // And the stream goes on as before: later work runs, in order.
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) ss.enqueue([&order, i] { order.push_back(i); });
  ss.run_sync([&] { order.push_back(3); });
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

TEST_F(SimHandoffTest, BlockingCopyOnAnIdleStreamStillReportsTheErrorsOfEarlierWork) {
  auto s = get_backend("sim").create_stream(2);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  std::atomic<bool> threw{false};
  ss.enqueue([&] {
    threw = true;
    throw BackendError("sim:2: earlier failure");
  });
  ASSERT_TRUE(eventually([&] { return threw.load(); }, std::chrono::seconds(10)));
  // The stream is idle again (or about to be); the copy runs, then reports the earlier error
  // (like cudaMemcpy), once.
  int value = 0;
  EXPECT_THROW_MSG(ss.run_sync([&] { value = 7; }), BackendError, "earlier failure");
  EXPECT_EQ(value, 7);
  EXPECT_NO_THROW(ss.synchronize());
  // Its own error comes first and leaves the earlier one for the next synchronize.
  threw = false;
  ss.enqueue([&] {
    threw = true;
    throw BackendError("sim:2: second earlier failure");
  });
  ASSERT_TRUE(eventually([&] { return threw.load(); }, std::chrono::seconds(10)));
  EXPECT_THROW_MSG(ss.run_sync([] { throw InvalidArgument("copy: its own failure"); }),
                   InvalidArgument, "its own failure");
  EXPECT_THROW_MSG(ss.synchronize(), BackendError, "second earlier failure");
  EXPECT_NO_THROW(ss.synchronize());
}

TEST_F(SimHandoffTest, SynchronizeRunsWorkThePoolHasNotStartedOnTheCallingThread) {
  // Every pool thread is held by a task of its own (streams created back to back get distinct
  // home threads); work then enqueued on another stream cannot start on the pool, and
  // synchronize() runs it on the calling thread instead of waiting for a pool thread.
  Backend& b = get_backend("sim");
  const int threads = sim::Executor::instance().threads();
  std::vector<std::unique_ptr<Stream>> holders;
  for (int i = 0; i < threads; ++i) holders.push_back(b.create_stream(i % 4));
  std::atomic<bool> release{false};
  std::atomic<int> holding{0};
  for (auto& h : holders)
    sim::as_sim(*h, "test").enqueue([&] {
      holding.fetch_add(1);
      // Bounded: before the change, synchronize() below waited for one of these to end.
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (!release.load() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
  ASSERT_TRUE(eventually([&] { return holding.load() == threads; }, std::chrono::seconds(10)));
  auto s = b.create_stream(3);
  std::vector<std::thread::id> ran_on;
  for (int i = 0; i < 3; ++i)
    sim::as_sim(*s, "test").enqueue([&] { ran_on.push_back(std::this_thread::get_id()); });
  s->synchronize();
  const bool held = !release.load() && holding.load() == threads;
  release = true;
  for (auto& h : holders) h->synchronize();
  ASSERT_EQ(ran_on.size(), 3u);
  EXPECT_TRUE(held);
  for (const auto& id : ran_on) EXPECT_EQ(id, std::this_thread::get_id());
}

TEST_F(SimHandoffTest, ARoundAfterACompletedOneTimesOutAtItsOwnDeadlineNotTheFirstRounds) {
  // Round 1 arms the deadline (its first arrival + 400 ms) and completes; round 2 starts 250 ms
  // later with rank 1 missing. Its timeout must come 400 ms after its own first arrival, not
  // when round 1's deadline passes (150 ms into round 2).
  CommOptions opts;
  opts.timeout_ms = 400;
  auto comms = Communicator::init_all(devices("sim", 2), opts);
  std::vector<Tensor> t;
  for (int r = 0; r < 2; ++r) t.push_back(Tensor::full({8}, 1.0f, comms[r].device()));
  all_reduce(comms, t);
  synchronize(comms);
  EXPECT_EQ(t[0].to_vector<float>(), std::vector<float>(8, 2.0f));
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  const auto start = Clock::now();
  comms[0].all_reduce(t[0]);
  EXPECT_THROW_MSG(comms[0].stream().synchronize(), Timeout,
                   "all_reduce (collective #2 on this communicator): timed out after 400 ms "
                   "waiting for rank 1");
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_GE(secs, 0.39);  // a lower bound only: a loaded machine can make it later, not earlier
}

}  // namespace
}  // namespace ditto
