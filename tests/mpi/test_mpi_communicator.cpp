// Tests of the communicator with one rank per process (Communicator::init_rank,
// core/distributed/distributed.h) on the simulator over MPI. Run by ctest under `mpirun -np N` for
// N = 1, 2, 4, 8 (tests/ CMakeLists.txt); every process runs every test as its rank, and only rank
// 0 prints. Checks: every collective and op in both determinism modes against host values from
// rank-dependent inputs; bitwise all_reduce, reduce and reduce_scatter equal bit for bit to the
// in-process simulator's (Communicator::init_all over N virtual devices of this process); call
// mismatches; a rank that never arrives (Timeout naming it); argument errors of init_rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "../main/scratch_cleanup.h"
#include "../test_util.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"
#include "core/train/launcher.h"
#include "core/train/trainer.h"
#include "mpi_test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using namespace ditto::test::mpi;

// Rank-dependent inputs exact under any order of reduction (exact_f32, exact_i64).
template <typename T>
std::vector<T> inputs(int r, std::int64_t n, std::int64_t offset = 0) {
  return exact_inputs<T>(r, n, offset);
}
template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum: return a + b;  // premul_sum: scalars 1 (test_mpi_dtypes.cpp)
    case ReduceOp::prod: return a * b;
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::max: return std::max(a, b);
  }
  return a;
}
// op over ranks of inputs(r, n, offset), left to right (exact for these inputs).
template <typename T>
std::vector<T> host_reduce(int n_ranks, std::int64_t n, ReduceOp op, std::int64_t offset = 0) {
  std::vector<T> acc = inputs<T>(0, n, offset);
  for (int r = 1; r < n_ranks; ++r) {
    std::vector<T> x = inputs<T>(r, n, offset);
    for (std::int64_t i = 0; i < n; ++i) acc[i] = combine(acc[i], x[i], op);
  }
  if constexpr (std::is_same_v<T, float>)
    if (op == ReduceOp::avg)
      for (auto& v : acc) v = v / static_cast<float>(n_ranks);
  return acc;
}

template <typename T>
Tensor on_device(const std::vector<T>& v) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, kLocal);
}

// ---- every collective against host values -------------------------------------------------------

class MpiCollectives : public ::testing::TestWithParam<Determinism> {};

TEST_P(MpiCollectives, DescribesItsRanks) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  EXPECT_TRUE(c.multiprocess());
  EXPECT_EQ(c.rank(), me());
  EXPECT_EQ(c.size(), world());
  ASSERT_EQ(static_cast<int>(c.devices().size()), world());
  EXPECT_EQ(c.device(), kLocal);
  for (const Device& d : c.devices()) EXPECT_EQ(d, kLocal);  // every process's sim:0
}

TEST_P(MpiCollectives, AllReduceEveryOpAndCount) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  for (std::int64_t n : {0, 1, 7, 1000, 4099}) {
    for (ReduceOp op :
         {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
      Tensor send = on_device(inputs<float>(me(), n));
      Tensor recv = Tensor::zeros({n}, DType::f32, kLocal);
      c.all_reduce(send, recv, op);
      EXPECT_EQ(recv.to_vector<float>(), host_reduce<float>(world(), n, op))
          << "count " << n << " op " << reduce_op_name(op);
      EXPECT_EQ(send.to_vector<float>(), inputs<float>(me(), n));  // send untouched
      c.all_reduce(send, op);                                      // in place
      EXPECT_EQ(send.to_vector<float>(), host_reduce<float>(world(), n, op))
          << "in place, count " << n << " op " << reduce_op_name(op);
    }
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
      Tensor t = on_device(inputs<std::int64_t>(me(), n));
      c.all_reduce(t, op);
      EXPECT_EQ(t.to_vector<std::int64_t>(), host_reduce<std::int64_t>(world(), n, op))
          << "i64 count " << n << " op " << reduce_op_name(op);
    }
  }
}

TEST_P(MpiCollectives, ReduceToEveryRoot) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const std::int64_t n = 1003;
  for (int root = 0; root < world(); ++root) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      Tensor send = on_device(inputs<float>(me(), n));
      Tensor recv = Tensor::full({n}, -7.0f, kLocal);
      c.reduce(send, recv, op, root);
      std::vector<float> got = recv.to_vector<float>();
      if (me() == root)
        EXPECT_EQ(got, host_reduce<float>(world(), n, op)) << "root " << root;
      else
        EXPECT_EQ(got, std::vector<float>(n, -7.0f)) << "recv off the root must stay untouched";
    }
    Tensor t = on_device(inputs<float>(me(), n));  // in place on the root
    c.reduce(t, t, ReduceOp::sum, root);
    if (me() == root) {
      EXPECT_EQ(t.to_vector<float>(), host_reduce<float>(world(), n, ReduceOp::sum));
    }
  }
}

TEST_P(MpiCollectives, BroadcastFromEveryRoot) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  for (std::int64_t n : {1, 1000}) {
    for (int root = 0; root < world(); ++root) {
      Tensor send = on_device(inputs<float>(me(), n));
      Tensor recv = Tensor::zeros({n}, DType::f32, kLocal);
      c.broadcast(send, recv, root);
      EXPECT_EQ(recv.to_vector<float>(), inputs<float>(root, n)) << "root " << root;
      Tensor t = on_device(inputs<std::int64_t>(me(), n));
      c.broadcast(t, root);
      EXPECT_EQ(t.to_vector<std::int64_t>(), inputs<std::int64_t>(root, n)) << "root " << root;
    }
  }
}

TEST_P(MpiCollectives, AllGatherOutOfPlaceAndInPlace) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const std::int64_t n = 333;
  std::vector<float> expected;
  for (int q = 0; q < world(); ++q) {
    std::vector<float> x = inputs<float>(q, n);
    expected.insert(expected.end(), x.begin(), x.end());
  }
  Tensor send = on_device(inputs<float>(me(), n));
  Tensor recv = Tensor::zeros({world() * n}, DType::f32, kLocal);
  c.all_gather(send, recv);
  EXPECT_EQ(recv.to_vector<float>(), expected);
  // In place: send is this rank's block of recv.
  Tensor whole = Tensor::zeros({world() * n}, DType::f32, kLocal);
  Tensor block = whole.narrow(me() * n, n);
  block.copy_(send);
  c.all_gather(block, whole);
  EXPECT_EQ(whole.to_vector<float>(), expected);
}

TEST_P(MpiCollectives, ReduceScatterEveryOp) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  for (std::int64_t n : {1, 250, 1001}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::avg}) {
      Tensor send = on_device(inputs<float>(me(), world() * n));
      Tensor recv = Tensor::zeros({n}, DType::f32, kLocal);
      c.reduce_scatter(send, recv, op);
      EXPECT_EQ(recv.to_vector<float>(), host_reduce<float>(world(), n, op, me() * n))
          << "count " << n << " op " << reduce_op_name(op);
      // In place: recv is this rank's block of send.
      Tensor block = send.narrow(me() * n, n);
      c.reduce_scatter(send, block, op);
      EXPECT_EQ(block.to_vector<float>(), host_reduce<float>(world(), n, op, me() * n))
          << "in place, count " << n << " op " << reduce_op_name(op);
    }
  }
}

TEST_P(MpiCollectives, BarrierThenMoreWork) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  for (int i = 0; i < 5; ++i) c.barrier();
  Tensor t = on_device(inputs<float>(me(), 10));
  c.all_reduce(t);
  EXPECT_EQ(t.to_vector<float>(), host_reduce<float>(world(), 10, ReduceOp::sum));
}

INSTANTIATE_TEST_SUITE_P(Modes, MpiCollectives,
                         ::testing::Values(Determinism::bitwise, Determinism::fast),
                         [](const auto& info) {
                           return std::string(determinism_name(info.param));
                         });

// ---- bitwise: the in-process simulator's bits ---------------------------------------------------

// Values with mixed signs and exponents: their sum depends on the order of the adds.
std::vector<float> rough_inputs(int r, std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t s = 0x9e3779b9u * static_cast<std::uint32_t>(r + 1);
  for (std::int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float mant = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
    v[i] = std::ldexp(mant, static_cast<int>((s >> 4) % 24) - 12);
  }
  return v;
}

// The in-process simulator's bitwise result of `run` over world() virtual devices of this
// process, for every rank's rough inputs.
std::vector<std::vector<float>> in_process(
    std::int64_t send_n, std::int64_t recv_n,
    const std::function<void(std::vector<Communicator>&, std::vector<Tensor>&,
                             std::vector<Tensor>&)>& run) {
  std::vector<Communicator> comms =
      Communicator::init_all(devices("sim", world()), opts(Determinism::bitwise));
  std::vector<Tensor> send, recv;
  for (int q = 0; q < world(); ++q) {
    send.push_back(Tensor::from_vector(rough_inputs(q, send_n), {send_n}, Device("sim", q)));
    recv.push_back(Tensor::zeros({recv_n}, DType::f32, Device("sim", q)));
  }
  run(comms, send, recv);
  std::vector<std::vector<float>> out;
  for (int q = 0; q < world(); ++q) out.push_back(recv[q].to_vector<float>());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ctest starts every process on this one machine: the MPI_COMM_TYPE_SHARED split of the world is
// the world, so each process's node-local rank is its rank (ditto-train picks its GPU by it).
TEST(MpiDist, LocalRankAndSizeOnOneNodeAreTheWorlds) {
  EXPECT_EQ(dist::local_rank(), dist::rank());
  EXPECT_EQ(dist::local_size(), dist::world_size());
  EXPECT_GE(dist::local_size(), 1);
}

TEST(MpiBitwise, AllReduceEqualsInProcessSimulatorBitForBit) {
  const std::int64_t n = 5003;  // not a multiple of the world size
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
    auto ref = in_process(
        n, n, [&](auto& comms, auto& send, auto& recv) { all_reduce(comms, send, recv, op); });
    Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise));
    Tensor t = on_device(rough_inputs(me(), n));
    c.all_reduce(t, op);
    std::vector<float> got = t.to_vector<float>();
    EXPECT_TRUE(same_bits(got, ref[me()])) << "op " << reduce_op_name(op);
    if (world() >= 3 && op == ReduceOp::sum) {
      // The test can tell orders apart: plain left-to-right sums differ somewhere.
      std::vector<float> seq = rough_inputs(0, n);
      for (int q = 1; q < world(); ++q) {
        std::vector<float> x = rough_inputs(q, n);
        for (std::int64_t i = 0; i < n; ++i) seq[i] = seq[i] + x[i];
      }
      EXPECT_FALSE(same_bits(got, seq));
    }
  }
}

TEST(MpiBitwise, ReduceAndReduceScatterEqualInProcessSimulator) {
  const std::int64_t n = 777;
  const int root = world() - 1;
  auto ref = in_process(n, n, [&](auto& comms, auto& send, auto& recv) {
    reduce(comms, send, recv, ReduceOp::sum, root);
  });
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise));
  Tensor send = on_device(rough_inputs(me(), n));
  Tensor recv = Tensor::zeros({n}, DType::f32, kLocal);
  c.reduce(send, recv, ReduceOp::sum, root);
  if (me() == root) {
    EXPECT_TRUE(same_bits(recv.to_vector<float>(), ref[root]));
  }

  auto ref_rs = in_process(world() * n, n, [&](auto& comms, auto& s, auto& r) {
    reduce_scatter(comms, s, r, ReduceOp::sum);
  });
  Tensor big = on_device(rough_inputs(me(), world() * n));
  c.reduce_scatter(big, recv, ReduceOp::sum);
  EXPECT_TRUE(same_bits(recv.to_vector<float>(), ref_rs[me()]));
}

// ---- errors ---------------------------------------------------------------------------------

// A timeout past 2^31 ms is refused on every rank (now + it overflowed: an instant timeout);
// checked before any message, so no rank waits for another.
TEST(MpiErrors, InitRankRefusesATimeoutPastTheLongest) {
  expect_error<InvalidArgument>(
      [] {
        Communicator::init_rank(kLocal, world(), me(),
                                opts(Determinism::fast, std::numeric_limits<std::int64_t>::max()));
      },
      "Communicator::init_rank: options.timeout_ms: expected a positive number of milliseconds "
      "<= 2147483648 (2^31, about 24.9 days), got 9223372036854775807");
}

TEST(MpiErrors, MismatchedCountsFailEveryRankThenTheCommunicatorGoesOn) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise));
  const int odd = world() - 1;
  Tensor t = Tensor::zeros({me() == odd ? 10 : 12}, DType::f32, kLocal);
  c.all_reduce(t);
  expect_error<InvalidArgument>([&] { c.stream().synchronize(); },
                                "all_reduce: rank " + std::to_string(odd) +
                                    " called with count 10, rank 0 with count 12 (collective #1");
  Tensor root_probe = Tensor::zeros({4}, DType::f32, kLocal);
  c.broadcast(root_probe, me() == odd ? 1 : 0);
  expect_error<InvalidArgument>([&] { c.stream().synchronize(); },
                                "broadcast: rank " + std::to_string(odd) +
                                    " called with root 1, rank 0 with root 0 (collective #2");
  if (me() == odd)
    c.barrier();
  else
    c.all_reduce(root_probe);
  // Each process's error starts with its own call (tester C, C7: the odd rank's barrier failed
  // with "all_reduce: ...").
  expect_error<InvalidArgument>([&] { c.stream().synchronize(); },
                                std::string(me() == odd ? "barrier" : "all_reduce") + ": rank " +
                                    std::to_string(odd) +
                                    " called barrier, rank 0 called all_reduce (collective #3");
  // Still in step: a matching call works.
  Tensor ok = on_device(inputs<float>(me(), 9));
  c.all_reduce(ok);
  EXPECT_EQ(ok.to_vector<float>(), host_reduce<float>(world(), 9, ReduceOp::sum));
}

TEST(MpiErrors, RankThatNeverArrivesTimesOutTheOthers) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast, 300));
  const int absent = world() - 1;
  if (me() != absent) {
    Tensor t = Tensor::zeros({16}, DType::f32, kLocal);
    c.all_reduce(t);
    expect_error<Timeout>([&] { c.stream().synchronize(); },
                          "all_reduce (collective #1 on this communicator): timed out after 300 "
                          "ms waiting for rank " +
                              std::to_string(absent));
    // Aborted: later calls fail at once.
    expect_error<BackendError>([&] { c.all_reduce(t); },
                               "all_reduce: communicator aborted by an earlier error");
  }
}

// Tester C, C3: the slow collective's warning (Note [Slow collective warning]) came from the
// in-process communicators only; under mpirun a rank waited silently until its timeout.
TEST(MpiErrors, AWaitingCollectiveWarnsOnceNamingTheLateRank) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  ::setenv("DITTO_COMM_WARN_AFTER_MS", "200", 1);  // read when the communicator is made
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast, 20000));
  ::unsetenv("DITTO_COMM_WARN_AFTER_MS");
  Tensor t = Tensor::full({4}, 1.0f, kLocal);
  c.all_reduce(t);  // #1: every rank in step
  c.stream().synchronize();
  const int late = world() - 1;
  testing::internal::CaptureStderr();
  if (me() == late) std::this_thread::sleep_for(std::chrono::milliseconds(700));
  c.all_reduce(t);  // #2: the others wait 700 ms for `late`
  c.stream().synchronize();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(4, float(world() * world())));
  if (me() == late) {
    EXPECT_EQ(err.find("ditto: warning"), std::string::npos) << err;
    return;
  }
  // Ranks listed in order, `late` the last (another rank may be late too on a loaded machine).
  const std::string head =
      "ditto: warning: all_reduce (collective #2 on this communicator): waited 200 ms for rank";
  const std::string tail = std::to_string(late) + " (communicator of " + std::to_string(world()) +
                           " ranks in MPI processes); it fails with a timeout after 20000 ms\n";
  EXPECT_EQ(err.rfind(head, 0), 0u) << err;
  EXPECT_TRUE(err.size() > tail.size() &&
              err.compare(err.size() - tail.size(), tail.size(), tail) == 0)
      << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;  // once
}

TEST(MpiErrors, RankThatAbortsFailsTheOthersAtOnceNamingIt) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  // A long timeout: only the abort notice can end the others' wait within the test's time.
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise));
  const int failing = world() - 1;
  Tensor t = Tensor::zeros({16}, DType::f32, kLocal);
  c.all_reduce(t);  // collective #1 completes on every rank
  c.stream().synchronize();
  if (me() == failing) {
    c.abort("boom in the training loop");
    expect_error<PeerFailure>([&] { c.all_reduce(t); },
                              "all_reduce: communicator aborted by an earlier error: rank " +
                                  std::to_string(failing) + " failed: boom in the training loop");
  } else {
    c.all_reduce(t);
    expect_error<PeerFailure>([&] { c.stream().synchronize(); },
                              "all_reduce (collective #2 on this communicator): rank " +
                                  std::to_string(failing) + " failed: boom in the training loop");
  }
  // Typed (core/train/launcher.h finds the root error by it): the failed rank as a field.
  try {
    c.all_reduce(t);
    ADD_FAILURE() << "expected PeerFailure";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.failed_rank(), failing) << e.what();
  }
}

// Issue 16 (3): processes of different determinism crashed inside Open MPI (one rank's bitwise
// messages against another's fast ones); init_rank now refuses them on every rank.
TEST(MpiErrors, InitRankRefusesRanksOfDifferentDeterminismOnEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = world() - 1;
  const std::string r = std::to_string(me()), o = std::to_string(odd);
  expect_error<InvalidArgument>(
      [&] {
        Communicator::init_rank(kLocal, world(), me(),
                                opts(me() == odd ? Determinism::fast : Determinism::bitwise));
      },
      "Communicator::init_rank: options.determinism: rank " +
          (me() == odd ? "0 uses bitwise, rank " + o + " uses fast"
                       : o + " uses fast, rank " + r + " uses bitwise") +
          " (every rank must use the same)");
}

// Issue 16 (9): a root out of range on one rank failed only that rank; the others waited for its
// call until their timeout. The refused rank now aborts the communicator.
TEST(MpiErrors, RootOutOfRangeOnOneRankFailsTheOthersAtOnceNamingIt) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c =
      Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise, 20000));
  const int bad = world() - 1;
  const std::string refusal = "Communicator::broadcast: root: expected a rank in [0, " +
                              std::to_string(world()) + "), got " + std::to_string(world());
  Tensor t = Tensor::zeros({4}, DType::f32, kLocal);
  const auto t0 = std::chrono::steady_clock::now();
  if (me() == bad) {
    expect_error<InvalidArgument>([&] { c.broadcast(t, world()); }, refusal);
  } else {
    c.broadcast(t, 0);
    try {
      c.stream().synchronize();
      ADD_FAILURE() << "expected PeerFailure";
    } catch (const PeerFailure& e) {
      EXPECT_EQ(e.failed_rank(), bad) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(bad) + " failed: " + refusal),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected PeerFailure, got " << e.what();
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 5.0) << "rank " << me() << " waited for the refused call";
}

// Tester hB (3): every per-rank refusal, not only a root's: one process's all_reduce with a recv
// of the wrong size failed that process at once and left the others waiting until their timeout
// (a Timeout without the reason). The refusing rank now aborts the communicator.
TEST(MpiErrors, ARecvOfTheWrongSizeOnOneRankFailsTheOthersAtOnceNamingIt) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c =
      Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise, 20000));
  const int bad = world() - 1;
  const std::string refusal =
      "Communicator::all_reduce: recv: expected 4 elements (like send [4] f32 on sim:0), got [5] "
      "f32 on sim:0";
  Tensor send = Tensor::zeros({4}, DType::f32, kLocal);
  Tensor recv = Tensor::zeros({me() == bad ? 5 : 4}, DType::f32, kLocal);
  const auto t0 = std::chrono::steady_clock::now();
  if (me() == bad) {
    expect_error<InvalidArgument>([&] { c.all_reduce(send, recv); }, refusal);
  } else {
    c.all_reduce(send, recv);
    try {
      c.stream().synchronize();
      ADD_FAILURE() << "expected PeerFailure";
    } catch (const PeerFailure& e) {
      EXPECT_EQ(e.failed_rank(), bad) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(bad) + " failed: " + refusal),
                std::string::npos)
          << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "expected PeerFailure, got " << e.what();
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 5.0) << "rank " << me() << " waited for the refused call";
}

// Issue 16 (4): the configuration check of a run's start (train::check_ranks_agree) over
// dist::all_gather_text.
TEST(MpiDist, AllGatherTextGivesEveryProcessesTextInRankOrder) {
  const std::vector<std::string> same = dist::all_gather_text("same", 20000);
  EXPECT_EQ(same, std::vector<std::string>(static_cast<std::size_t>(world()), "same"));
  const std::vector<std::string> texts =
      dist::all_gather_text("rank " + std::string(static_cast<std::size_t>(me()), '*'), 20000);
  ASSERT_EQ(texts.size(), static_cast<std::size_t>(world()));
  for (int q = 0; q < world(); ++q)
    EXPECT_EQ(texts[static_cast<std::size_t>(q)],
              "rank " + std::string(static_cast<std::size_t>(q), '*'));
}

TEST(MpiDist, CheckRanksAgreeFailsEveryRankNamingTheSettingBothValuesAndRanks) {
  EXPECT_NO_THROW(train::check_ranks_agree({{"--loss", "mse"}, {"--micro-shards", "8"}}, 20000));
  if (world() < 2) return;
  const int odd = world() - 1;
  expect_error<InvalidArgument>(
      [&] {
        train::check_ranks_agree({{"--loss", "mse"}, {"--micro-shards", me() == odd ? "4" : "8"}},
                                 20000);
      },
      "ranks disagree on --micro-shards: rank 0 has 8, rank " + std::to_string(odd) + " has 4");
  // Still in step afterwards: the next exchange agrees.
  EXPECT_NO_THROW(train::check_ranks_agree({{"--seed", "1"}}, 20000));
}

// Issue 16: a process that refused its own arguments (its --data file missing, a path only it
// cannot write) left the others waiting in the next exchange for the whole timeout (300 s by
// default). Its error now travels in the exchange: the refusing process rethrows its own, every
// other one throws PeerFailure naming it, at once.
TEST(MpiDist, CheckRanksAgreeCarriesARanksRefusalToEveryRankAtOnce) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = world() - 1;
  const std::string why = "--data: cannot open 'd.csv': No such file or directory";
  const train::RankSettings mine{{"--loss", "mse"}};
  const auto t0 = std::chrono::steady_clock::now();
  try {
    train::check_ranks_agree(mine, 300000,
                             me() == odd ? std::make_exception_ptr(InvalidArgument(why)) : nullptr);
    ADD_FAILURE() << "rank " << me() << ": expected an error";
  } catch (const PeerFailure& e) {
    EXPECT_NE(me(), odd) << e.what();
    EXPECT_EQ(e.failed_rank(), odd);
    EXPECT_EQ(std::string(e.what()),
              "rank " + std::to_string(odd) + " refused its arguments: " + why);
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(me(), odd) << e.what();  // its own error, as it was
    EXPECT_EQ(std::string(e.what()), why);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0)
      << "rank " << me() << " waited for the refusing rank (the timeout was 300 s)";
  if (world() >= 3) {  // two refusals: the first named, the other counted
    const bool refuses = me() >= 1;
    try {
      train::check_ranks_agree(
          mine, 300000,
          refuses ? std::make_exception_ptr(InvalidArgument("mine " + std::to_string(me())))
                  : nullptr);
      ADD_FAILURE() << "rank " << me() << ": expected an error";
    } catch (const PeerFailure& e) {
      EXPECT_EQ(me(), 0);
      EXPECT_EQ(std::string(e.what()), "rank 1 refused its arguments: mine 1 (and " +
                                           std::to_string(world() - 2) + " more rank" +
                                           (world() > 3 ? "s)" : ")"));
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(std::string(e.what()), "mine " + std::to_string(me()));
    }
  }
  // Still in step afterwards: the next exchange agrees.
  EXPECT_NO_THROW(train::check_ranks_agree(mine, 20000, nullptr));
}

// The two Trainer::fit tests below: 32 rows of 4 features, 2 classes, and a one-epoch DDP MLP.
std::shared_ptr<train::DatasetSource> small_source() {
  const std::int64_t n = 32, f = 4;
  std::vector<float> x(static_cast<std::size_t>(n * f));
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n * f; ++i) x[static_cast<std::size_t>(i)] = float(i % 7) - 3.0f;
  for (std::int64_t i = 0; i < n; ++i) y[static_cast<std::size_t>(i)] = i % 2;
  data::Dataset d;
  d.features = Tensor::from_vector(x, {n, f});
  d.labels = Tensor::from_vector(y, {n});
  return std::make_shared<train::DatasetSource>(d);
}

// fit() restarts the backend with this rank's device: main()'s again when the test ends.
struct RestoreMainsBackend {
  RestoreMainsBackend() = default;
  RestoreMainsBackend(const RestoreMainsBackend&) = delete;
  RestoreMainsBackend& operator=(const RestoreMainsBackend&) = delete;
  ~RestoreMainsBackend() {
    BackendOptions o;
    o.device_count = world();
    o.memory_capacity = std::size_t(1) << 30;
    init_backend("sim", o);
  }
};

train::TrainerConfig small_ddp_config() {
  train::TrainerConfig c;
  c.trainer = train::TrainerKind::ddp;
  c.hidden = {8};
  c.epochs = 1;
  c.batch_size = 8;
  return c;
}

// Trainer::fit under mpirun checks its TrainerConfig across the processes first (before this
// micro_shards would make the ranks' bitwise sums differ, a run that ends with no error).
TEST(MpiDist, TrainerFitRefusesProcessesOfDifferentSettingsBeforeTraining) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int odd = world() - 1;
  train::TrainerConfig c = small_ddp_config();
  c.micro_shards = me() == odd ? 4 : 8;
  c.field_names = {{"micro_shards", "--micro-shards"}};
  c.log = nullptr;
  train::Trainer t(c, small_source());
  expect_error<InvalidArgument>(
      [&] { t.fit(); },
      "ranks disagree on --micro-shards: rank 0 has 8, rank " + std::to_string(odd) + " has 4");
}

// Trainer::fit: rank 0 alone checks the output paths (it writes them): its refusal reaches the
// other processes in the start-up exchange instead of leaving them at the communicator.
TEST(MpiDist, TrainerFitCarriesRankZerosRefusalToEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  train::TrainerConfig c = small_ddp_config();
  c.checkpoint_dir = "/dev/null/ck";  // not a directory (only rank 0 finds out)
  c.field_names = {{"checkpoint_dir", "--checkpoint"}};
  c.log = nullptr;
  train::Trainer t(c, small_source());
  const RestoreMainsBackend restore;
  const std::string why = "--checkpoint: cannot create directory '/dev/null/ck'";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    t.fit();
    ADD_FAILURE() << "rank " << me() << ": expected an error";
  } catch (const PeerFailure& e) {
    EXPECT_NE(me(), 0) << e.what();
    EXPECT_EQ(e.failed_rank(), 0);
    EXPECT_EQ(std::string(e.what()).rfind("rank 0 refused its arguments: " + why, 0), 0u)
        << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(me(), 0) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(why, 0), 0u) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0)
      << "rank " << me() << " waited for rank 0 (the timeout was 300 s)";
}

// A stop request (TrainerConfig::stop: ditto-train's signal flag) that reached one rank only
// (a scheduler signalling one node, `kill -TERM` of one rank) stops every rank after the same
// step, and every rank reports that rank's value: ditto-train's other ranks exited 128 ("stopped
// by signal") for 143, since each read its own flag. Two ranks asked with different values: all
// report the smaller.
TEST(MpiDist, TrainerFitStopsEveryRankWithTheAskedRanksValue) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  const RestoreMainsBackend restore;
  const int last = world() - 1;
  for (const bool both : {false, true}) {
    std::atomic<int> stop{me() == last ? SIGTERM : both && me() == 0 ? SIGINT : 0};
    train::TrainerConfig c = small_ddp_config();
    c.epochs = 2;  // 8 steps: the stop is checked after the first
    c.stop = &stop;
    c.log = nullptr;
    const train::FitResult r = train::Trainer(c, small_source()).fit();
    EXPECT_TRUE(r.stopped) << "rank " << me();
    EXPECT_EQ(r.steps, 1) << "rank " << me();
    EXPECT_EQ(r.stop_signal, both ? SIGINT : SIGTERM) << "rank " << me();
  }
}

TEST(MpiErrors, InitRankChecksItsArguments) {
  expect_error<InvalidArgument>(
      [] { Communicator::init_rank(kLocal, world() + 1, me()); },
      "Communicator::init_rank: world_size: expected " + std::to_string(world()));
  expect_error<InvalidArgument>(
      [] { Communicator::init_rank(kLocal, world(), (me() + 1) % (world() + 1)); },
      "Communicator::init_rank: rank: expected " + std::to_string(me()));
  expect_error<InvalidArgument>([] { Communicator::init_rank(Device::cpu(), world(), me()); },
                                "local_device: expected a device of a GPU backend");
  expect_error<InvalidArgument>([] { Communicator::init_rank(Device("sim", 1000), world(), me()); },
                                "out of range");
}

TEST(MpiErrors, SingleControllerFormsRefuseAProcessHandle) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<Communicator> comms{
      Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise))};
  std::vector<Tensor> t{Tensor::zeros({4}, DType::f32, kLocal)};
  expect_error<InvalidArgument>([&] { all_reduce(comms, t); },
                                "got a handle of Communicator::init_rank");
}

}  // namespace
}  // namespace ditto

namespace {
// Ranks other than 0 print only their failures, each line marked with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (UnitTest::current_test_info() would deadlock here: gtest holds its lock while reporting.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s: %s:%d: %s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

// Every process runs the suite as its rank; rank 0 prints the usual report, the others only their
// failures (the exit code of each process reports its own failures to mpirun).
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ditto::dist::init(&argc, &argv);
  ditto::BackendOptions o;
  o.device_count =
      ditto::dist::world_size();  // sim:0 is this rank's; all for the in-process reference
  o.memory_capacity = std::size_t(1) << 30;
  ditto::init_backend("sim", o);
  if (ditto::dist::rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(ditto::dist::rank()));
  }
  // Each rank's scratch directories (Note [Test scratch directories], tests/scratch_dirs.h).
  ::testing::UnitTest::GetInstance()->listeners().Append(new ditto::test::ScratchCleanup);
  int rc = RUN_ALL_TESTS();
  ditto::dist::finalize();
  return rc;
}
