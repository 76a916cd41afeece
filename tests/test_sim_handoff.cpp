// Stream hand-offs (Note [Stream hand-offs], backend_sim/sim_stream.cpp): a host thread that
// waits on a stream runs the stream's work itself when that work has not started on the pool,
// and a blocking copy on an idle stream runs on the calling thread; the order of the work and
// where its errors surface stay as they were. A collective's deadline, left armed across rounds
// (Note [Lazy deadline], sim_communicator.cpp), still times a round out at its own deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_executor.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
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

// Note [Concurrent synchronize]: two host threads waiting on one stream when its work fails (a
// collective's timeout, here a parked task resumed with an error) both get the error; only one
// did before, and the other returned normally as if the work had run. A synchronize() entered
// after the report starts afresh.
TEST_F(SimHandoffTest, EveryThreadWaitingOnAStreamGetsTheErrorOfItsFailedWork) {
  auto s = get_backend("sim").create_stream(3);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  ss.synchronize();
  std::optional<sim::Resume> resume;
  std::atomic<bool> started{false};
  ss.enqueue_parked([&](sim::Resume r) {
    resume = r;
    started = true;
  });
  ASSERT_TRUE(eventually([&] { return started.load(); }, std::chrono::seconds(10)));
  const std::uint64_t before = ss.synchronize_calls();
  std::string got[2];
  std::vector<std::thread> waiters;
  for (int w = 0; w < 2; ++w)
    waiters.emplace_back([&ss, &got, w] {
      try {
        ss.synchronize();
        got[w] = "returned normally";
      } catch (const BackendError& e) {
        got[w] = e.what();
      }
    });
  ASSERT_TRUE(
      eventually([&] { return ss.synchronize_calls() == before + 2; }, std::chrono::seconds(10)));
  (*resume)(sim::error_ptr<BackendError>("sim:3: all_reduce timed out"));
  for (auto& t : waiters) t.join();
  EXPECT_NE(got[0].find("all_reduce timed out"), std::string::npos) << got[0];
  EXPECT_NE(got[1].find("all_reduce timed out"), std::string::npos) << got[1];
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

// Note [Inline work] (backend_sim/sim_stream.cpp): short work enqueued on an idle stream runs at
// once on the enqueuing thread; behind other work it queues and runs in order on the pool.
TEST_F(SimHandoffTest, ShortWorkOnAnIdleStreamRunsAtOnceOnTheCallingThread) {
  auto s = get_backend("sim").create_stream(1);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  ss.synchronize();  // idle
  std::thread::id ran_on;
  bool ran = false;
  ss.enqueue_short([&] {
    ran_on = std::this_thread::get_id();
    ran = true;
  });
  EXPECT_TRUE(ran);  // already run when enqueue_short returned
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_NO_THROW(ss.synchronize());
}

TEST_F(SimHandoffTest, ShortWorkBehindQueuedWorkWaitsForItAndKeepsTheOrder) {
  auto s = get_backend("sim").create_stream(2);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  std::atomic<bool> release{false}, started{false};
  std::vector<int> order;  // written only by the stream's tasks, one at a time
  ss.enqueue([&] {
    started = true;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!release.load() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    order.push_back(0);
  });
  ASSERT_TRUE(eventually([&] { return started.load(); }, std::chrono::seconds(10)));
  std::atomic<bool> short_ran{false};
  ss.enqueue_short([&] {
    order.push_back(1);
    short_ran = true;
  });
  ss.enqueue_internal_short([&] { order.push_back(2); });
  // The stream is running its first task: the short ones wait behind it, off this thread.
  EXPECT_FALSE(short_ran.load());
  release = true;
  ss.synchronize();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST_F(SimHandoffTest, ShortWorkThatThrowsReportsAtTheNextSynchronizeNotAtEnqueue) {
  auto s = get_backend("sim").create_stream(3);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  ss.synchronize();
  EXPECT_NO_THROW(ss.enqueue_short([] { throw BackendError("sim:3: short kernel failed"); }));
  int after = 0;
  ss.enqueue_short([&] { after = 1; });  // the stream goes on, as after any failed task
  EXPECT_EQ(after, 1);
  EXPECT_THROW_MSG(ss.synchronize(), BackendError, "short kernel failed");
  EXPECT_NO_THROW(ss.synchronize());  // reported once
}

TEST_F(SimHandoffTest, AShortParkingTaskParksTheStreamUntilResumed) {
  auto s = get_backend("sim").create_stream(0);
  sim::SimStream& ss = sim::as_sim(*s, "test");
  ss.synchronize();
  std::optional<sim::Resume> resume;
  ss.enqueue_parked_short([&](sim::Resume r) { resume = r; });  // parks: started here, at once
  ASSERT_TRUE(resume.has_value());
  std::atomic<bool> after{false};
  ss.enqueue_short([&] { after = true; });  // behind the parked task: not inline
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(after.load());
  (*resume)();
  ss.synchronize();
  EXPECT_TRUE(after.load());
  // One that resumes inside start() does not park: the next short task runs inline again.
  ss.enqueue_parked_short([](sim::Resume r) { r(); });
  bool inline_again = false;
  ss.enqueue_short([&] { inline_again = true; });
  EXPECT_TRUE(inline_again);
}

TEST_F(SimHandoffTest, ShortWorkBehindAnEventWaitRunsOnlyAfterTheEventInOrder) {
  // B waits on an event that A records behind a task that holds A; B's short work queues behind
  // the wait and runs once A's record completes it (the completing thread may run it: Note
  // [Inline work]), in order, before B is idle.
  Backend& b = get_backend("sim");
  auto sa = b.create_stream(0), sb = b.create_stream(1);
  sim::SimStream& a = sim::as_sim(*sa, "test");
  sim::SimStream& bs = sim::as_sim(*sb, "test");
  auto ev = b.create_event(0);
  std::atomic<bool> release{false}, a_done{false};
  a.enqueue([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!release.load() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    a_done = true;
  });
  a.record(*ev);
  bs.wait(*ev);
  std::vector<int> order;  // B's tasks, one at a time
  std::atomic<bool> saw_a_done{true};
  bs.enqueue_short([&] {
    saw_a_done = a_done.load();
    order.push_back(1);
  });
  bs.enqueue_short([&] { order.push_back(2); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(order.empty());  // still parked on the event
  release = true;
  bs.synchronize();
  EXPECT_TRUE(saw_a_done.load());
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  a.synchronize();
}

TEST_F(SimHandoffTest, SmallKernelsAndCollectivesFromOneHostThreadGiveTheSameValues) {
  // A small all_reduce issued on every rank by one thread runs inline (Note [Inline work]); the
  // sum is the one the pool gave: 1 + 2 + 3 + 4 in every element, on every rank.
  auto comms = Communicator::init_all(devices("sim", 4));
  std::vector<Tensor> xs;
  for (int r = 0; r < 4; ++r)
    xs.push_back(Tensor::full({1000}, static_cast<float>(r + 1), comms[r].device()));
  for (int round = 0; round < 3; ++round) all_reduce(comms, xs);
  synchronize(comms);
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> v = xs[r].to_vector<float>();
    ASSERT_EQ(v.size(), 1000u);
    // Three rounds: 10, then 40, then 160.
    EXPECT_EQ(v.front(), 160.0f);
    EXPECT_EQ(v.back(), 160.0f);
  }
}

TEST_F(SimHandoffTest, HardwareThreadsIsTheMachinesCount) {
  EXPECT_EQ(sim::Executor::hardware_threads(),
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
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
