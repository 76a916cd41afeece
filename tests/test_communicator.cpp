// Tests of Communicator (core/comm/communicator.h) on the simulator: every collective and op for
// 1, 2, 3, 4 and 8 ranks, counts 0, 1, 7, 1000 and 1003, in place and out of place, driven by the
// single-controller free functions, by one thread looping over the handles, and SPMD (one thread
// per rank); expected values from a host loop over rank-dependent inputs. Then bitwise mode
// against the host canonical tree, call mismatches, timeouts, aborts and argument errors.
#include <gtest/gtest.h>

#include <limits>

#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/runtime/backend.h"
#include "core/comm/communicator.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CommunicatorTest = SimSuite<16, std::size_t(1) << 30>;

// ---- rank-dependent inputs and the host reference ---------------------------------------------

// Rank-dependent inputs exact under any order of reduction (exact_f32, exact_i64).
template <typename T>
T input(int r, std::int64_t i) {
  return exact_inputs<T>(r, 1, i)[0];
}
template <typename T>
std::vector<T> inputs(int r, std::int64_t count, std::int64_t offset = 0) {
  return exact_inputs<T>(r, count, offset);
}

template <typename T>
T host_op(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, std::int64_t>) {  // wraps like the device
    auto ua = static_cast<std::uint64_t>(a), ub = static_cast<std::uint64_t>(b);
    if (op == ReduceOp::sum) return static_cast<T>(ua + ub);
    if (op == ReduceOp::prod) return static_cast<T>(ua * ub);
  } else {
    if (op == ReduceOp::sum || op == ReduceOp::avg) return a + b;
    if (op == ReduceOp::prod) return a * b;
  }
  return op == ReduceOp::min ? std::min(a, b) : std::max(a, b);
}

// reduce over ranks of input<T>(q, offset + i), i in [0, count).
template <typename T>
std::vector<T> host_reduce(int n, std::int64_t count, ReduceOp op, std::int64_t offset = 0) {
  std::vector<T> out = inputs<T>(0, count, offset);
  for (int q = 1; q < n; ++q)
    for (std::int64_t i = 0; i < count; ++i) out[i] = host_op(out[i], input<T>(q, offset + i), op);
  if constexpr (std::is_same_v<T, float>)
    if (op == ReduceOp::avg)
      for (auto& x : out) x = x / static_cast<float>(n);
  return out;
}

// ---- how a case drives the ranks --------------------------------------------------------------

enum class Drive { group, loop, spmd };
const char* drive_name(Drive d) {
  return d == Drive::group ? "group" : d == Drive::loop ? "loop" : "spmd";
}

// group: the single-controller free function; loop: one thread calls every handle; spmd: one
// std::thread per rank calls its own handle. Then synchronize every rank.
void drive(std::vector<Communicator>& comms, Drive how, const std::function<void()>& group,
           const std::function<void(int)>& per_rank) {
  const int n = static_cast<int>(comms.size());
  if (how == Drive::group) {
    group();
  } else if (how == Drive::loop) {
    for (int r = 0; r < n; ++r) per_rank(r);
  } else {
    std::vector<std::exception_ptr> errors(comms.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          per_rank(r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  synchronize(comms);
}

template <typename T>
DType dtype_for() {
  return dtype_of<T>();
}
template <typename T>
Tensor make(const std::vector<T>& v, const Device& d) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
}
template <typename T>
std::vector<T> sentinel(std::int64_t count) {
  return std::vector<T>(static_cast<std::size_t>(count), static_cast<T>(-7));
}

using Param = std::tuple<int, std::int64_t, bool, Drive>;  // ranks, count, in place, drive

class CollectiveTest : public CommunicatorTest, public ::testing::WithParamInterface<Param> {
 protected:
  void SetUp() override {
    std::tie(n_, count_, in_place_, how_) = GetParam();
    comms_ = Communicator::init_all(devices("sim", n_));
  }
  int n_ = 0;
  std::int64_t count_ = 0;
  bool in_place_ = false;
  Drive how_ = Drive::group;
  std::vector<Communicator> comms_;

  // Each rank's inputs of count_ elements, and its receive buffer: the send buffer itself in
  // place, else count_ sentinels.
  template <typename T>
  void make_send_recv(std::vector<Tensor>& send, std::vector<Tensor>& recv) {
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, count_), comms_[r].device()));
      recv.push_back(in_place_ ? send[r] : make(sentinel<T>(count_), comms_[r].device()));
    }
  }

  template <typename T>
  void all_reduce(ReduceOp op) {
    SCOPED_TRACE(detail::cat("all_reduce ", reduce_op_name(op), " ", dtype_name(dtype_for<T>())));
    std::vector<Tensor> send, recv;
    make_send_recv<T>(send, recv);
    drive(
        comms_, how_,
        [&] {
          if (in_place_)
            ditto::all_reduce(comms_, send, op);
          else
            ditto::all_reduce(comms_, send, recv, op);
        },
        [&](int r) {
          if (in_place_)
            comms_[r].all_reduce(send[r], op);
          else
            comms_[r].all_reduce(send[r], recv[r], op);
        });
    const auto expected = host_reduce<T>(n_, count_, op);
    for (int r = 0; r < n_; ++r) {
      EXPECT_EQ(recv[r].to_vector<T>(), expected) << "rank " << r;
      if (!in_place_) {
        EXPECT_EQ(send[r].to_vector<T>(), inputs<T>(r, count_)) << "rank " << r;
      }
    }
  }

  template <typename T>
  void reduce(ReduceOp op) {
    SCOPED_TRACE(detail::cat("reduce ", reduce_op_name(op), " ", dtype_name(dtype_for<T>())));
    const int root = static_cast<int>((count_ + 1) % n_);
    std::vector<Tensor> send, recv;
    make_send_recv<T>(send, recv);
    drive(
        comms_, how_, [&] { ditto::reduce(comms_, send, recv, op, root); },
        [&](int r) { comms_[r].reduce(send[r], recv[r], op, root); });
    for (int r = 0; r < n_; ++r) {
      std::vector<T> expected = r == root         ? host_reduce<T>(n_, count_, op)
                                : in_place_ ? inputs<T>(r, count_)
                                            : sentinel<T>(count_);
      EXPECT_EQ(recv[r].to_vector<T>(), expected) << "rank " << r << " root " << root;
    }
  }

  template <typename T>
  void reduce_scatter(ReduceOp op) {
    SCOPED_TRACE(
        detail::cat("reduce_scatter ", reduce_op_name(op), " ", dtype_name(dtype_for<T>())));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, n_ * count_), comms_[r].device()));
      recv.push_back(in_place_ ? send[r].narrow(r * count_, count_)
                               : make(sentinel<T>(count_), comms_[r].device()));
    }
    drive(
        comms_, how_, [&] { ditto::reduce_scatter(comms_, send, recv, op); },
        [&](int r) { comms_[r].reduce_scatter(send[r], recv[r], op); });
    for (int r = 0; r < n_; ++r) {
      EXPECT_EQ(recv[r].to_vector<T>(), host_reduce<T>(n_, count_, op, r * count_))
          << "rank " << r;
      // The other blocks of send stay as they were (also in place).
      auto s = send[r].to_vector<T>();
      auto in = inputs<T>(r, n_ * count_);
      for (std::int64_t i = 0; i < n_ * count_; ++i)
        if (i / std::max<std::int64_t>(count_, 1) != r || !in_place_) {
          ASSERT_EQ(s[i], in[i]) << "rank " << r << " send element " << i;
        }
    }
  }

  template <typename T>
  void broadcast() {
    SCOPED_TRACE(detail::cat("broadcast ", dtype_name(dtype_for<T>())));
    const int root = static_cast<int>(count_ % n_);
    std::vector<Tensor> send, recv;
    make_send_recv<T>(send, recv);
    drive(
        comms_, how_,
        [&] {
          if (in_place_) {
            ditto::broadcast(comms_, send, root);
          } else {
            for (int r = 0; r < n_; ++r) comms_[r].broadcast(send[r], recv[r], root);
          }
        },
        [&](int r) {
          if (in_place_)
            comms_[r].broadcast(send[r], root);
          else
            comms_[r].broadcast(r == root ? send[r] : Tensor(), recv[r], root);
        });
    for (int r = 0; r < n_; ++r)
      EXPECT_EQ(recv[r].to_vector<T>(), inputs<T>(root, count_)) << "rank " << r;
  }

  template <typename T>
  void all_gather() {
    SCOPED_TRACE(detail::cat("all_gather ", dtype_name(dtype_for<T>())));
    std::vector<Tensor> send, recv;
    std::vector<T> expected;
    for (int r = 0; r < n_; ++r) {
      auto in = inputs<T>(r, count_);
      expected.insert(expected.end(), in.begin(), in.end());
    }
    for (int r = 0; r < n_; ++r) {
      if (in_place_) {
        auto v = sentinel<T>(n_ * count_);
        auto in = inputs<T>(r, count_);
        std::copy(in.begin(), in.end(), v.begin() + r * count_);
        recv.push_back(make(v, comms_[r].device()));
        send.push_back(recv[r].narrow(r * count_, count_));
      } else {
        send.push_back(make(inputs<T>(r, count_), comms_[r].device()));
        recv.push_back(make(sentinel<T>(n_ * count_), comms_[r].device()));
      }
    }
    drive(
        comms_, how_, [&] { ditto::all_gather(comms_, send, recv); },
        [&](int r) { comms_[r].all_gather(send[r], recv[r]); });
    for (int r = 0; r < n_; ++r) EXPECT_EQ(recv[r].to_vector<T>(), expected) << "rank " << r;
  }
};

TEST_P(CollectiveTest, AllReduce) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
    all_reduce<float>(op);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max})
    all_reduce<std::int64_t>(op);
}

TEST_P(CollectiveTest, Reduce) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
    reduce<float>(op);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) reduce<std::int64_t>(op);
}

TEST_P(CollectiveTest, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
    reduce_scatter<float>(op);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min}) reduce_scatter<std::int64_t>(op);
}

TEST_P(CollectiveTest, Broadcast) {
  broadcast<float>();
  broadcast<std::int64_t>();
}

TEST_P(CollectiveTest, AllGather) {
  all_gather<float>();
  all_gather<std::int64_t>();
}

TEST_P(CollectiveTest, Barrier) {
  drive(
      comms_, how_, [&] { for (auto& c : comms_) c.barrier(); },
      [&](int r) { comms_[r].barrier(); });
}

INSTANTIATE_TEST_SUITE_P(
    RanksCountsInPlaceDrive, CollectiveTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values(std::int64_t(0), std::int64_t(1), std::int64_t(7),
                                         std::int64_t(1000), std::int64_t(1003)),
                       ::testing::Bool(),
                       ::testing::Values(Drive::group, Drive::loop, Drive::spmd)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return detail::cat("n", std::get<0>(info.param), "_count", std::get<1>(info.param),
                         std::get<2>(info.param) ? "_inplace_" : "_outofplace_",
                         drive_name(std::get<3>(info.param)));
    });

// ---- more shapes, repeated use ------------------------------------------------------------------

TEST_F(CommunicatorTest, AllGatherIntoMatrixAndManyCallsInARow) {
  auto comms = Communicator::init_all(devices("sim", 4));
  EXPECT_EQ(comms[2].rank(), 2);
  EXPECT_EQ(comms[2].size(), 4);
  EXPECT_EQ(comms[2].device(), Device("sim", 2));
  std::vector<Tensor> send, recv;
  for (int r = 0; r < 4; ++r) {
    send.push_back(Tensor::full({2, 3}, static_cast<float>(r), comms[r].device()));
    recv.push_back(Tensor::zeros({4, 2, 3}, DType::f32, comms[r].device()));
  }
  // 50 collectives queued back to back on every rank before one synchronize.
  for (int k = 0; k < 50; ++k) {
    all_gather(comms, send, recv);
    all_reduce(comms, send);
  }
  synchronize(comms);
  // After round k (0-based) every send holds 6 * 4^k (exact in f32); the last gather saw the
  // values of round 48.
  const float before_last = 6.0f * std::pow(4.0f, 48.0f);
  for (int r = 0; r < 4; ++r) {
    for (float x : recv[r].to_vector<float>()) ASSERT_EQ(x, before_last);
    for (float x : send[r].to_vector<float>()) ASSERT_EQ(x, 4.0f * before_last);
  }
}

// ---- bitwise mode -------------------------------------------------------------------------------

// Mixed magnitudes: a left-to-right sum over ranks differs from the canonical tree.
float mixed(int r, std::int64_t i) { return mixed_rank_value(r, i, 12345u); }

float host_tree(int lo, int hi, std::int64_t i) { return test::host_tree(lo, hi, i, mixed); }

TEST_F(CommunicatorTest, BitwiseReductionsFollowTheCanonicalTree) {
  const std::int64_t count = 1003;
  for (int n = 1; n <= 16; ++n) {
    SCOPED_TRACE(detail::cat(n, " ranks"));
    std::vector<float> tree(count), left(count);
    int differ = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      tree[i] = host_tree(0, n, i);
      float acc = mixed(0, i);
      for (int r = 1; r < n; ++r) acc = acc + mixed(r, i);
      left[i] = acc;
      differ += bits(tree[i]) != bits(left[i]);
    }
    // For 1..3 ranks the canonical tree is the left-to-right sum; from 4 on the inputs must tell
    // them apart, or the bit-for-bit checks below would prove nothing.
    if (n >= 4) {
      ASSERT_GT(differ, 10) << "inputs do not tell the tree from a left-to-right sum";
    }

    CommOptions opts;
    opts.determinism = Determinism::bitwise;
    auto comms = Communicator::init_all(devices("sim", n), opts);
    // Element i of rank r holds mixed(r, i % count): for reduce_scatter every block of a rank's
    // send repeats the all_reduce input, so block b reduces to `tree` as well.
    auto rank_inputs = [&](int r, std::int64_t cnt) {
      std::vector<float> v(static_cast<std::size_t>(cnt));
      for (std::int64_t i = 0; i < cnt; ++i) v[i] = mixed(r, i % count);
      return v;
    };
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "out of place");
      std::vector<Tensor> send, recv, rsend, rrecv, red;
      for (int r = 0; r < n; ++r) {
        const Device d = comms[r].device();
        send.push_back(make(rank_inputs(r, count), d));
        recv.push_back(in_place ? send[r] : Tensor::zeros({count}, DType::f32, d));
        red.push_back(in_place ? make(rank_inputs(r, count), d)
                               : Tensor::zeros({count}, DType::f32, d));
        rsend.push_back(make(rank_inputs(r, n * count), d));
        rrecv.push_back(in_place ? rsend[r].narrow(r * count, count)
                                 : Tensor::zeros({count}, DType::f32, d));
      }
      std::vector<Tensor> red_send = in_place ? red : send;
      all_reduce(comms, send, recv);
      reduce(comms, red_send, red, ReduceOp::sum, n - 1);
      reduce_scatter(comms, rsend, rrecv);
      synchronize(comms);
      for (int r = 0; r < n; ++r) {
        auto got = recv[r].to_vector<float>();
        auto got_rs = rrecv[r].to_vector<float>();
        for (std::int64_t i = 0; i < count; ++i) {
          ASSERT_EQ(bits(got[i]), bits(tree[i])) << "all_reduce rank " << r << " element " << i;
          ASSERT_EQ(bits(got_rs[i]), bits(tree[i]))
              << "reduce_scatter rank " << r << " element " << i;
        }
      }
      auto got = red[n - 1].to_vector<float>();
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(bits(got[i]), bits(tree[i])) << "reduce element " << i;
    }
  }
}

TEST_F(CommunicatorTest, FastModeAgreesWithTheTreeWithinTolerance) {
  const int n = 8;
  const std::int64_t count = 257;
  auto comms = Communicator::init_all(devices("sim", n));
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) {
    std::vector<float> v(count);
    for (std::int64_t i = 0; i < count; ++i) v[i] = mixed(r, i);
    t.push_back(make(v, comms[r].device()));
  }
  all_reduce(comms, t);
  synchronize(comms);
  auto got = t[3].to_vector<float>();
  for (std::int64_t i = 0; i < count; ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < n; ++r) exact += mixed(r, i), mag += std::fabs(mixed(r, i));
    EXPECT_NEAR(got[i], exact, 1e-6 * mag) << "element " << i;
  }
}

// ---- mismatches, timeouts, abort ------------------------------------------------------------------

TEST_F(CommunicatorTest, MismatchedCallsFailEveryRankAndTheCommunicatorStaysUsable) {
  auto comms = Communicator::init_all(devices("sim", 3));
  std::vector<Tensor> t;
  for (int r = 0; r < 3; ++r) t.push_back(Tensor::full({12}, 1.0f, comms[r].device()));
  Tensor short_t = Tensor::full({10}, 1.0f, comms[2].device());
  Tensor i64 = Tensor::zeros({12}, DType::i64, comms[1].device());

  struct Case {
    std::function<void()> rank1, rank2;
    std::string message;
  };
  std::vector<Case> cases = {
      {[&] { comms[1].all_reduce(t[1]); }, [&] { comms[2].all_reduce(short_t); },
       "all_reduce: rank 2 called with count 10, rank 0 with count 12"},
      {[&] { comms[1].broadcast(t[1], 0); }, [&] { comms[2].all_reduce(t[2]); },
       "all_reduce: rank 1 called broadcast, rank 0 called all_reduce"},
      {[&] { comms[1].all_reduce(t[1], ReduceOp::max); }, [&] { comms[2].all_reduce(t[2]); },
       "all_reduce: rank 1 called with op max, rank 0 with op sum"},
      {[&] { comms[1].all_reduce(i64); }, [&] { comms[2].all_reduce(t[2]); },
       "all_reduce: rank 1 called with dtype i64, rank 0 with dtype f32"},
  };
  for (const auto& c : cases) {
    comms[0].all_reduce(t[0]);
    c.rank1();
    c.rank2();
    for (int r = 0; r < 3; ++r)
      expect_error<InvalidArgument>([&] { comms[r].stream().synchronize(); }, c.message);
  }
  // Root mismatch.
  for (int r = 0; r < 3; ++r) comms[r].broadcast(t[r], r == 2 ? 1 : 0);
  for (int r = 0; r < 3; ++r)
    expect_error<InvalidArgument>([&] { comms[r].stream().synchronize(); },
                                  "broadcast: rank 2 called with root 1, rank 0 with root 0");

  // Still usable, and nothing was written by the failed calls.
  all_reduce(comms, t);
  synchronize(comms);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(12, 3.0f));
}

TEST_F(CommunicatorTest, RankThatNeverCallsTimesOutNamingItAndAbortsTheCommunicator) {
  CommOptions opts;
  opts.timeout_ms = 200;
  auto comms = Communicator::init_all(devices("sim", 4), opts);
  std::vector<Tensor> t;
  for (int r = 0; r < 4; ++r) t.push_back(Tensor::full({5}, 1.0f, comms[r].device()));
  // One collective that completes, then ranks 2 and 3 never join the second.
  all_reduce(comms, t);
  synchronize(comms);
  const auto start = std::chrono::steady_clock::now();
  comms[0].all_reduce(t[0]);
  comms[1].all_reduce(t[1]);
  for (int r = 0; r < 2; ++r)
    expect_error<Timeout>(
        [&] { comms[r].stream().synchronize(); },
        "all_reduce (collective #2 on this communicator): timed out after 200 ms waiting for "
        "ranks 2, 3");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 3.0);
  EXPECT_GE(secs, 0.15);
  // Aborted: every later call throws at once, on every rank.
  for (int r = 0; r < 4; ++r) {
    expect_error<BackendError>([&] { comms[r].all_reduce(t[r]); },
                               "all_reduce: communicator aborted by an earlier error: all_reduce "
                               "(collective #2");
    expect_error<BackendError>([&] { comms[r].barrier(); }, "barrier: communicator aborted");
  }
  synchronize(comms);  // nothing was enqueued
}

TEST_F(CommunicatorTest, BarrierTimeoutNamesTheSingleMissingRankInSpmd) {
  CommOptions opts;
  opts.timeout_ms = 150;
  auto comms = Communicator::init_all(devices("sim", 3), opts);
  std::vector<std::string> messages(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      comms[r].barrier();
      try {
        comms[r].stream().synchronize();
      } catch (const Timeout& e) {
        messages[r] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(messages[r].find("barrier (collective #1 on this communicator): timed out after "
                               "150 ms waiting for rank 2 "),
              std::string::npos)
        << messages[r];
}

TEST_F(CommunicatorTest, TwoCollectivesOfOneRankRunningAtOnceAbortWithAClearError) {
  CommOptions opts;
  opts.timeout_ms = 2000;
  auto comms = Communicator::init_all(devices("sim", 2), opts);
  Tensor a = Tensor::full({4}, 1.0f, comms[0].device());
  Tensor b = Tensor::full({4}, 1.0f, comms[0].device());
  auto side = get_backend("sim").create_stream(comms[0].device().index);
  comms[0].all_reduce(a);  // default stream; waits for rank 1, which never comes
  {
    StreamGuard guard(*side);
    comms[0].all_reduce(b);  // rank 0 again, on another stream, while the first still waits
  }
  const std::string what = "while its previous one was still running (on another stream)";
  expect_error<BackendError>([&] { comms[0].stream().synchronize(); }, what);
  expect_error<BackendError>([&] { side->synchronize(); }, what);
  expect_error<BackendError>([&] { comms[1].barrier(); }, "communicator aborted");
}

// ---- argument errors ------------------------------------------------------------------------------

TEST_F(CommunicatorTest, InitAllRejectsBadDeviceLists) {
  expect_error<InvalidArgument>(
      [] { Communicator::init_all({}); },
      "Communicator::init_all: devices: expected at least one device, got an empty list");
  expect_error<InvalidArgument>([] { Communicator::init_all({Device("sim", 0), Device::cpu()}); },
                                "devices[1]: expected a device of a GPU backend (sim, cuda), got cpu");
  expect_error<InvalidArgument>([] { Communicator::init_all({Device::cpu()}); },
                                "devices[0]: expected a device of a GPU backend");
  expect_error<InvalidArgument>(
      [] { Communicator::init_all({Device("sim", 0), Device("cuda", 1)}); },
      "devices[1]: expected a device of backend sim (like devices[0]), got cuda:1");
  expect_error<InvalidArgument>(
      [] { Communicator::init_all({Device("sim", 0), Device("sim", 16)}); },
      "devices[1]: sim:16 is out of range (backend sim has 16 devices)");
  expect_error<InvalidArgument>(
      [] { Communicator::init_all({Device("sim", 3), Device("sim", 1), Device("sim", 3)}); },
      "Communicator::init_all: devices: expected distinct devices, got sim:3 twice (at positions 0 "
      "and 2)");
  CommOptions bad;
  bad.timeout_ms = 0;
  expect_error<InvalidArgument>([&] { Communicator::init_all(devices("sim", 2), bad); },
                                "options.timeout_ms: expected a positive number");
  // now + a huge timeout overflowed the clock: the collective timed out at once.
  bad.timeout_ms = std::numeric_limits<std::int64_t>::max();
  expect_error<InvalidArgument>([&] { Communicator::init_all(devices("sim", 2), bad); },
                                "Communicator::init_all: options.timeout_ms: expected a positive "
                                "number of milliseconds <= 2147483648 (2^31, about 24.9 days), got "
                                "9223372036854775807");
  bad.timeout_ms = kMaxCommTimeoutMs + 1;
  EXPECT_THROW(Communicator::init_all(devices("sim", 2), bad), InvalidArgument);
  bad.timeout_ms = kMaxCommTimeoutMs;
  EXPECT_EQ(Communicator::init_all(devices("sim", 2), bad).size(), 2u);
  // Any subset of devices in any order works: rank i on devices[i].
  auto comms = Communicator::init_all({Device("sim", 5), Device("sim", 2)});
  EXPECT_EQ(comms[0].device(), Device("sim", 5));
  std::vector<Tensor> t = {Tensor::full({3}, 2.0f, Device("sim", 5)),
                           Tensor::full({3}, 5.0f, Device("sim", 2))};
  all_reduce(comms, t, ReduceOp::prod);
  synchronize(comms);
  EXPECT_EQ(t[1].to_vector<float>(), std::vector<float>(3, 10.0f));
}

TEST_F(CommunicatorTest, CollectivesRejectBadTensorsBeforeEnqueueing) {
  CommOptions opts;
  opts.timeout_ms = 2000;  // a wrongly enqueued rank would make the test slow, not hang
  auto comms = Communicator::init_all(devices("sim", 2), opts);
  const Device d0("sim", 0), d1("sim", 1);
  Tensor a0 = Tensor::full({6}, 1.0f, d0), a1 = Tensor::full({6}, 1.0f, d1);
  Tensor b0 = Tensor::full({5}, 1.0f, d0);
  Tensor big0 = Tensor::full({12}, 1.0f, d0), big1 = Tensor::full({12}, 1.0f, d1);
  Tensor l0 = Tensor::zeros({6}, DType::i64, d0);
  Tensor undefined;

  expect_error<InvalidArgument>([&] { comms[0].all_reduce(undefined); },
                                "Communicator::all_reduce: send: expected a tensor on sim:0 (rank 0 "
                                "of 2), got an undefined tensor");
  expect_error<InvalidArgument>([&] { comms[0].all_reduce(a1); },
                                "Communicator::all_reduce: send: expected a tensor on sim:0 (rank 0 "
                                "of 2), got [6] f32 on sim:1");
  expect_error<InvalidArgument>([&] { comms[0].all_reduce(a0, b0); },
                                "Communicator::all_reduce: recv: expected 6 elements");
  expect_error<InvalidArgument>([&] { comms[0].all_reduce(a0, l0); },
                                "Communicator::all_reduce: recv: expected dtype f32 (like send)");
  expect_error<InvalidArgument>([&] { comms[0].all_reduce(l0, ReduceOp::premul_sum); },
                                "Communicator::all_reduce: op: premul_sum needs its scalar: pass "
                                "PreMulSum{scalar}");
  // A root out of range: the single-controller forms refuse it before enqueueing (the per-rank
  // forms also abort the communicator, as the others would wait for the refused rank:
  // CollErrors.RootOutOfRangeOnOneRankFailsTheOthersAtOnceNamingIt).
  {
    std::vector<Tensor> both = {a0, a1};
    expect_error<InvalidArgument>([&] { reduce(comms, both, both, ReduceOp::sum, 2); },
                                  "Communicator::reduce: root: expected a rank in [0, 2), got 2");
    expect_error<InvalidArgument>([&] { broadcast(comms, both, -1); },
                                  "Communicator::broadcast: root: expected a rank in [0, 2), got -1");
  }
  expect_error<InvalidArgument>([&] { comms[0].broadcast(a0, b0, 0); },
                                "Communicator::broadcast: recv: expected 6 elements");
  expect_error<InvalidArgument>([&] { comms[0].all_gather(a0, a0); },
                                "Communicator::all_gather: recv: expected 12 elements (size 2 x "
                                "send's 6), got [6] f32 on sim:0");
  expect_error<InvalidArgument>([&] { comms[0].reduce_scatter(a0, a0); },
                                "Communicator::reduce_scatter: send: expected 12 elements (size 2 x "
                                "recv's 6), got [6] f32 on sim:0");
  expect_error<InvalidArgument>([&] { comms[1].reduce_scatter(big1, l0); },
                                "Communicator::reduce_scatter: recv: expected a tensor on sim:1");

  // Single-controller forms check every rank before enqueueing any.
  std::vector<Tensor> good = {a0, a1}, bad = {a0, b0}, one = {a0};
  expect_error<InvalidArgument>([&] { all_reduce(comms, one); },
                                "all_reduce: send: expected 2 tensors (one per rank), got 1");
  expect_error<InvalidArgument>([&] { all_reduce(comms, bad); },
                                "Communicator::all_reduce: send: expected a tensor on sim:1 (rank "
                                "1 of 2), got [5] f32 on sim:0");
  std::vector<Communicator> swapped = {comms[1], comms[0]};
  expect_error<InvalidArgument>([&] { all_reduce(swapped, good); },
                                "all_reduce: comms[0]: expected the handle of rank 0 (handles in "
                                "rank order), got rank 1");
  std::vector<Communicator> half = {comms[0]};
  expect_error<InvalidArgument>([&] { broadcast(half, one, 0); },
                                "broadcast: comms: expected 2 handles (one per rank), got 1");
  std::vector<Tensor> gathered = {big0, big1};
  std::vector<Tensor> wrong_gather = {big0, a1};
  expect_error<InvalidArgument>([&] { all_gather(comms, good, wrong_gather); },
                                "Communicator::all_gather: recv: expected 12 elements");
  // Nothing was enqueued by the failed calls: the next collective completes at once.
  const auto start = std::chrono::steady_clock::now();
  all_gather(comms, good, gathered);
  reduce_scatter(comms, gathered, good, ReduceOp::max);
  synchronize(comms);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  EXPECT_EQ(a1.to_vector<float>(), std::vector<float>(6, 1.0f));
}

TEST(ReduceOpName, Names) {
  EXPECT_STREQ(reduce_op_name(ReduceOp::sum), "sum");
  EXPECT_STREQ(reduce_op_name(ReduceOp::prod), "prod");
  EXPECT_STREQ(reduce_op_name(ReduceOp::min), "min");
  EXPECT_STREQ(reduce_op_name(ReduceOp::max), "max");
  EXPECT_STREQ(reduce_op_name(ReduceOp::avg), "avg");
}

// The deadline of a collective saturates instead of overflowing (a past deadline: instant timeout).
TEST(CommunicatorInit, DeadlineSaturatesAtTheLongestTimeout) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point before = Clock::now();
  const Clock::time_point d =
      detail::comm_deadline<Clock>(std::numeric_limits<std::int64_t>::max());
  EXPECT_GE(d, before + std::chrono::milliseconds(kMaxCommTimeoutMs));
  const Clock::time_point after = Clock::now();
  EXPECT_LE(d, after + std::chrono::milliseconds(kMaxCommTimeoutMs));
  const Clock::time_point past = detail::comm_deadline<Clock>(-5);
  EXPECT_LE(past, Clock::now());
}

}  // namespace
}  // namespace ditto
