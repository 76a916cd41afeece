// The simulator at scale (Note [Sim executor]): 1024 virtual devices on a bounded thread pool.
// all_reduce, all_gather and barrier over 1024 ranks give the right values (a rank that held a
// pool thread while waiting for the others would deadlock the pool: the ranks would time out);
// the process keeps a bounded number of threads; a few bitwise DataParallel steps of a small MLP
// on 1024 devices give the same bits as on one device; and streams parked on events hold no
// thread.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_executor.h"
#include "core/comm/communicator.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr int kDevices = 1024;

class SimScaleTest : public ::testing::Test {
 protected:
  // Per test: the Trainer (core/train) starts the backend with the devices each run asks for.
  void SetUp() override {
    BackendOptions o;
    o.device_count = kDevices;
    o.memory_capacity = std::size_t(16) << 20;
    init_backend("sim", o);
  }
};

// Threads of this process (Linux), or -1 where /proc is not there.
int thread_count() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

TEST_F(SimScaleTest, AllReduceAllGatherAndBarrierOver1024Ranks) {
  CommOptions opts;
  opts.timeout_ms = 20000;  // a blocked pool would show up as a Timeout, not a hang
  auto comms = Communicator::init_all(devices("sim", kDevices), opts);
  // f32: rank r holds r + 1 + i / 4 at element i; sums are exact (< 2^24, multiples of 1/4).
  const std::int64_t n = 5;
  std::vector<Tensor> t;
  for (int r = 0; r < kDevices; ++r) {
    std::vector<float> v(n);
    for (std::int64_t i = 0; i < n; ++i) v[i] = float(r + 1) + float(i) * 0.25f;
    t.push_back(Tensor::from_vector(v, {n}, Device("sim", r)));
  }
  all_reduce(comms, t);
  synchronize(comms);
  for (int r : {0, 1, 511, 1023}) {
    std::vector<float> got = t[r].to_vector<float>();
    for (std::int64_t i = 0; i < n; ++i)
      EXPECT_EQ(got[i], 1024.0f * 1025.0f / 2.0f + 1024.0f * float(i) * 0.25f)
          << "rank " << r << " element " << i;
  }
  // i64, large enough to be split into shares on several pool threads: rank r holds
  // r * 100000 + i; max over ranks is 1023 * 100000 + i.
  const std::int64_t m = 3000;
  std::vector<Tensor> u;
  for (int r = 0; r < kDevices; ++r) {
    std::vector<std::int64_t> v(m);
    for (std::int64_t i = 0; i < m; ++i) v[i] = std::int64_t(r) * 100000 + i;
    u.push_back(Tensor::from_vector(v, {m}, Device("sim", r)));
  }
  all_reduce(comms, u, ReduceOp::max);
  synchronize(comms);
  for (int r : {0, 700, 1023}) {
    std::vector<std::int64_t> got = u[r].to_vector<std::int64_t>();
    for (std::int64_t i : {std::int64_t(0), std::int64_t(1), m - 1})
      EXPECT_EQ(got[i], 1023 * 100000 + i) << "rank " << r << " element " << i;
  }
  // all_gather of one element per rank: every rank gets 0..1023.
  std::vector<Tensor> one, all;
  for (int r = 0; r < kDevices; ++r) {
    one.push_back(Tensor::full({1}, float(r), Device("sim", r)));
    all.push_back(Tensor::empty({kDevices}, DType::f32, Device("sim", r)));
  }
  all_gather(comms, one, all);
  for (auto& c : comms) c.barrier();
  synchronize(comms);
  for (int r : {3, 1000}) {
    std::vector<float> got = all[r].to_vector<float>();
    for (int q = 0; q < kDevices; ++q) ASSERT_EQ(got[q], float(q)) << "rank " << r;
  }
}

TEST_F(SimScaleTest, ThreadCountStaysBoundedWith1024BusyDevices) {
  const int before = thread_count();
  if (before < 0) GTEST_SKIP() << "no /proc/self/status: thread count not checked";
  // Work on every device, then wait for all.
  std::vector<Tensor> t;
  for (int d = 0; d < kDevices; ++d) t.push_back(Tensor::full({64}, float(d), Device("sim", d)));
  int during = thread_count();
  for (int d = 0; d < kDevices; ++d) get_backend("sim").default_stream(d).synchronize();
  EXPECT_EQ(t[777].to_vector<float>(), std::vector<float>(64, 777.0f));
  const int after = thread_count();
  const int pool = sim::Executor::instance().threads();
  // The pool, the watchdog, parallel_apply's helpers (at most 16 or hardware_concurrency) and
  // gtest's main thread: far below one thread per device.
  const int bound = pool + 1 + std::max(16, int(std::thread::hardware_concurrency())) + 8;
  EXPECT_LE(during, bound) << "threads before " << before << ", pool " << pool;
  EXPECT_LE(after, bound) << "threads before " << before << ", pool " << pool;
}

// Flattened parameters after `steps` bitwise SGD steps of a small MLP on the first `n` devices.
std::vector<float> train_bitwise(int n, int steps) {
  train::TrainerConfig c;  // the library Trainer: DataParallel, bitwise
  c.devices = n;
  c.epochs = steps > 0 ? 1 : 0;
  c.micro_shards = kDevices;
  c.hidden = {8};
  c.seed = 17;
  c.lr = 0.1f;
  const std::int64_t batch = 2048;  // two samples per device
  auto data = std::make_shared<train::FunctionSource>(
      std::max(steps, 1), 6, 3, [](std::int64_t, std::int64_t s) {
        std::vector<float> xs(static_cast<std::size_t>(batch * 6));
        for (std::size_t i = 0; i < xs.size(); ++i)
          xs[i] =
              static_cast<float>((i * 7 + static_cast<std::size_t>(s) * 3) % 13) * 0.125f - 0.75f;
        std::vector<std::int64_t> ys(static_cast<std::size_t>(batch));
        for (std::size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<std::int64_t>((i + s) % 3);
        return data::Batch{Tensor::from_vector(xs, {batch, 6}), Tensor::from_vector(ys, {batch})};
      });
  return fitted_parameters(c, data);
}

TEST_F(SimScaleTest, DataParallelOn1024DevicesGivesTheBitsOfOneDevice) {
  const std::vector<float> one = train_bitwise(1, 3), many = train_bitwise(kDevices, 3);
  const std::vector<float> start = train_bitwise(1, 0);
  ASSERT_EQ(one.size(), many.size());
  int moved = 0;
  for (std::size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(one[i]), std::bit_cast<std::uint32_t>(many[i]))
        << "parameter element " << i << ": " << one[i] << " vs " << many[i];
    moved += one[i] != start[i];
  }
  EXPECT_GT(moved, static_cast<int>(one.size()) / 2);  // training changed the parameters
}

TEST_F(SimScaleTest, StreamsParkedOnEventsHoldNoPoolThread) {
  // Many more streams than pool threads wait on one event; work on another stream still runs,
  // and once the event completes every waiter goes on.
  Backend& b = get_backend("sim");
  const int waiters = 8 * sim::Executor::instance().threads();
  auto gate_stream = b.create_stream(0);
  auto ev = b.create_event(0);
  std::atomic<bool> release{false};
  sim::as_sim(*gate_stream, "test").enqueue([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!release.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  gate_stream->record(*ev);
  std::vector<std::unique_ptr<Stream>> parked;
  std::atomic<int> ran{0};
  for (int i = 0; i < waiters; ++i) {
    parked.push_back(b.create_stream(1 + i));
    parked.back()->wait(*ev);
    sim::as_sim(*parked.back(), "test").enqueue([&] { ran.fetch_add(1); });
  }
  // Another device's stream is not starved by the parked ones (if they held pool threads, this
  // task could not run before the gate opens).
  std::atomic<bool> other{false};
  sim::as_sim(b.default_stream(900), "test").enqueue([&] { other = true; });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!other.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  EXPECT_TRUE(other.load()) << "a stream parked on an event held a pool thread";
  EXPECT_EQ(ran.load(), 0);
  release = true;
  for (auto& s : parked) s->synchronize();
  EXPECT_EQ(ran.load(), waiters);
}

}  // namespace
}  // namespace ditto

// Regression: the watchdog waited on a reference to its earliest deadline, which lives in the
// map entry that cancel() erases while the watchdog sleeps; wait_until reads that deadline again
// when it wakes (a heap-use-after-free that AddressSanitizer reported in 28 DataParallel, DDP and
// cost-model tests, where every collective schedules and cancels a timeout). Cancel the entry the
// watchdog is sleeping on, then check that a later deadline still fires. Under ASan this test
// failed before the fix.
TEST(SimWatchdog, CancellingTheDeadlineItSleepsOnIsSafeAndLaterDeadlinesStillFire) {
  using Clock = std::chrono::steady_clock;
  ditto::sim::Watchdog& w = ditto::sim::Watchdog::instance();
  for (int round = 0; round < 20; ++round) {
    const std::uint64_t far = w.schedule(Clock::now() + std::chrono::hours(1), [] {});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the watchdog sleeps on `far`
    w.cancel(far);
    std::atomic<bool> fired{false};
    w.schedule(Clock::now() + std::chrono::milliseconds(1), [&fired] { fired = true; });
    const auto give_up = Clock::now() + std::chrono::seconds(10);
    while (!fired && Clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(fired) << "round " << round << ": a deadline scheduled after a cancel never fired";
  }
}
