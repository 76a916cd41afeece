// Tests of Communicator (core/comm/communicator.h) on every backend, the collective matrix's
// backend axis (tests/test_coll_matrix.cpp): the simulator, and cuda (its 8 logical devices; on a
// machine with fewer GPUs they share them: the in-GPU transport; ranks on distinct GPUs: NCCL),
// whose rows skip saying why where the cuda backend cannot start (no GPU, no driver, or a build
// without it).
//  - CommCollectives (backend x {fast, bitwise} x drive): every collective and op for 1, 2, 3, 4
//    and 8 ranks, counts 0, 1, 7, 1000, 1003 and 70001 (uneven slices, the vector path, several
//    blocks), in place and out of place, driven by the single-controller functions, by one thread
//    looping over the handles (sim only: cuda blocks in each call outside a group), by a group
//    around that loop and SPMD (one thread per rank); expected values from a host loop over
//    rank-dependent inputs exact in any order; bitwise results against the canonical tree.
//  - CommBackends (backend): many calls in a row, bitwise mode against the host canonical tree
//    for 1..16 ranks (cuda: 1..8), fast mode within tolerance, call mismatches and timeouts.
//  - CommunicatorTest (sim) and CudaCommTest (cuda): what only one backend does (argument errors
//    naming sim devices, two streams of one rank, cuda's group rules and NCCL scratch, cuda's bits
//    against the simulator's).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/comm/communicator.h"
#include "core/numerics/determinism.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr int kCudaDevices = 8;
constexpr int kSimDevices = 16;
constexpr std::size_t kSimCapacity = std::size_t(1) << 30;

using CommunicatorTest = SimSuite<kSimDevices, kSimCapacity>;
using CudaCommTest = CudaSuite<kCudaDevices>;

// ---- rank-dependent inputs and the host reference ---------------------------------------------

// Rank-dependent inputs exact under any order of reduction (exact_f32, exact_i64). Made once per
// (rank, count, offset) and kept: CommCollectives asks for the same inputs for the send buffers,
// the reference and the check, out of place and in place, and making them (with host_reduce's
// tree below) was about half of those tests' CPU time under the check build's sanitizers.
template <typename T>
const std::vector<T>& inputs(int r, std::int64_t count, std::int64_t offset = 0) {
  static std::mutex mu;
  static std::map<std::tuple<int, std::int64_t, std::int64_t>, std::vector<T>> made;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = made.try_emplace({r, count, offset});
  if (inserted) it->second = exact_inputs<T>(r, count, offset);
  return it->second;
}

// Floats with all mantissa bits in use (an LCG): their sums round, so only the canonical order
// gives the expected bits.
std::vector<float> rough_inputs(int r, std::int64_t count) {
  std::vector<float> v(static_cast<std::size_t>(count));
  std::uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 1);
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<std::int64_t>(s >> 40) - (1ll << 23)) / 3.0e5f;
  }
  return v;
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

// Element-wise reduction over ranks of per-rank vectors, in the canonical tree over rank index
// (Note [Canonical tree]); avg divides the sum by the number of ranks. On exact inputs any order
// gives these values.
template <typename T>
T host_tree(const std::vector<std::vector<T>>& v, std::size_t i, std::int64_t lo, std::int64_t hi,
            ReduceOp op) {
  if (hi - lo == 1) return v[static_cast<std::size_t>(lo)][i];
  const std::int64_t mid = tree_mid(lo, hi);
  return host_op(host_tree(v, i, lo, mid, op), host_tree(v, i, mid, hi, op), op);
}
template <typename T>
std::vector<T> host_reduce(const std::vector<std::vector<T>>& v, ReduceOp op) {
  const auto n = static_cast<std::int64_t>(v.size());
  std::vector<T> out(v[0].size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = host_tree(v, i, 0, n, op);
    if constexpr (std::is_same_v<T, float>)
      if (op == ReduceOp::avg) out[i] = out[i] / static_cast<float>(n);
  }
  return out;
}
// reduce over n ranks of inputs<T>(q, count, offset); made once per (n, count, op, offset) and
// kept, as inputs() is.
template <typename T>
const std::vector<T>& host_reduce(int n, std::int64_t count, ReduceOp op, std::int64_t offset = 0) {
  static std::mutex mu;
  static std::map<std::tuple<int, std::int64_t, int, std::int64_t>, std::vector<T>> made;
  std::vector<std::vector<T>> v;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = made.find({n, count, static_cast<int>(op), offset});
    if (it != made.end()) return it->second;
  }
  for (int q = 0; q < n; ++q) v.push_back(inputs<T>(q, count, offset));
  std::vector<T> out = host_reduce(v, op);
  std::lock_guard<std::mutex> lock(mu);
  return made.try_emplace({n, count, static_cast<int>(op), offset}, std::move(out)).first->second;
}

std::vector<std::uint32_t> value_bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Equal, or (close_only) within a relative 1e-6: NCCL's own avg (cuda's fast mode) may scale
// before or after adding, so only the exact inputs' sums, products, min and max are exact there.
template <typename T>
void expect_result(const std::vector<T>& got, const std::vector<T>& want, bool close_only,
                   int rank) {
  if constexpr (std::is_same_v<T, float>) {
    if (close_only) {
      ASSERT_EQ(got.size(), want.size()) << "rank " << rank;
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::abs(want[i])))
            << "rank " << rank << " element " << i;
      return;
    }
  }
  EXPECT_EQ(got, want) << "rank " << rank;
}

template <typename T>
Tensor make(const std::vector<T>& v, const Device& d) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
}
template <typename T>
std::vector<T> sentinel(std::int64_t count) {
  return std::vector<T>(static_cast<std::size_t>(count), static_cast<T>(-7));
}

// Skips the test (from SetUp) where `backend` cannot start with kCudaDevices devices.
std::string unavailable(const std::string& backend) {
  return backend == "sim" ? "" : backend_unavailable(backend, kCudaDevices);
}
int max_devices(const std::string& backend) {
  return backend == "sim" ? kSimDevices : kCudaDevices;
}

// ---- how a case drives the ranks --------------------------------------------------------------

enum class Drive { vector_form, loop, grouped_loop, spmd };
const char* drive_name(Drive d) {
  switch (d) {
    case Drive::vector_form: return "vector";
    case Drive::loop: return "loop";
    case Drive::grouped_loop: return "group";
    default: return "spmd";
  }
}

// vector_form: core's single-controller function; loop: one thread calls every handle (the
// simulator enqueues and returns; cuda would block in the first call); grouped_loop:
// group_start, one call per handle, group_end; spmd: one std::thread per rank. Then synchronize
// every rank.
void drive(std::vector<Communicator>& comms, Drive how, const std::function<void()>& vector_form,
           const std::function<void(int)>& per_rank) {
  const int n = static_cast<int>(comms.size());
  switch (how) {
    case Drive::vector_form: vector_form(); break;
    case Drive::loop:
      for (int r = 0; r < n; ++r) per_rank(r);
      break;
    case Drive::grouped_loop:
      group_start();
      for (int r = 0; r < n; ++r) per_rank(r);
      group_end();
      break;
    case Drive::spmd: run_threads(n, per_rank); break;
  }
  synchronize(comms);
}

// ---- every collective, every op ---------------------------------------------------------------

using Param = std::tuple<std::string, Determinism, Drive>;  // backend, mode, drive

constexpr int kRanks[] = {1, 2, 3, 4, 8};
// Counts: none, one, uneven slices, and enough for the vector path and several blocks.
constexpr std::int64_t kCounts[] = {0, 1, 7, 1000, 1003, 70001};
constexpr std::int64_t kScatterCounts[] = {0, 1, 7, 1000, 1003, 9001};

class CommCollectives : public ::testing::TestWithParam<Param> {
 protected:
  static void SetUpTestSuite() { init_sim(kSimDevices, kSimCapacity); }
  void SetUp() override {
    std::tie(backend_, mode_, how_) = GetParam();
    const std::string why = unavailable(backend_);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  std::string backend_;
  Determinism mode_ = Determinism::fast;
  Drive how_ = Drive::vector_form;
  int n_ = 0;
  std::vector<Communicator> comms_;

  // Runs body() for each number of ranks, on a new communicator of that many.
  void for_each_ranks(const std::function<void()>& body) {
    for (int n : kRanks) {
      SCOPED_TRACE(detail::cat(n, " ranks"));
      n_ = n;
      CommOptions o;
      o.determinism = mode_;
      o.timeout_ms = 60000;
      comms_ = Communicator::init_all(devices(backend_, n), o);
      body();
    }
  }

  // For each number of ranks, count of `counts`, out of place then in place: check(float{}, op,
  // count, in_place) for every op (sum, prod, min, max, avg), then check(std::int64_t{}, op, ...)
  // for each op of `i64_ops`.
  template <std::size_t N, typename Check>
  void for_each_reduction(const std::int64_t (&counts)[N], std::initializer_list<ReduceOp> i64_ops,
                          Check check) {
    for_each_ranks([&] {
      for (std::int64_t count : counts)
        for (bool in_place : {false, true}) {
          for (ReduceOp op :
               {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
            check(float{}, op, count, in_place);
          for (ReduceOp op : i64_ops) check(std::int64_t{}, op, count, in_place);
        }
    });
  }

  bool close_only(ReduceOp op) const {
    return op == ReduceOp::avg && mode_ == Determinism::fast && backend_ != "sim";
  }

  // Each rank's inputs of `count` elements, and its receive buffer: the send buffer itself in
  // place, else `count` sentinels.
  template <typename T>
  void make_send_recv(std::int64_t count, bool in_place, std::vector<Tensor>& send,
                      std::vector<Tensor>& recv) {
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, count), comms_[r].device()));
      recv.push_back(in_place ? send[r] : make(sentinel<T>(count), comms_[r].device()));
    }
  }

  template <typename T>
  void all_reduce(ReduceOp op, std::int64_t count, bool in_place) {
    SCOPED_TRACE(detail::cat("all_reduce ", reduce_op_name(op), " ", dtype_name(dtype_of<T>()),
                             " count ", count, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    make_send_recv<T>(count, in_place, send, recv);
    drive(
        comms_, how_,
        [&] {
          if (in_place)
            ditto::all_reduce(comms_, send, op);
          else
            ditto::all_reduce(comms_, send, recv, op);
        },
        [&](int r) {
          if (in_place)
            comms_[r].all_reduce(send[r], op);
          else
            comms_[r].all_reduce(send[r], recv[r], op);
        });
    const auto expected = host_reduce<T>(n_, count, op);
    for (int r = 0; r < n_; ++r) {
      expect_result(recv[r].to_vector<T>(), expected, close_only(op), r);
      if (!in_place) {
        EXPECT_EQ(send[r].to_vector<T>(), inputs<T>(r, count)) << "rank " << r;
      }
    }
  }

  template <typename T>
  void reduce(ReduceOp op, std::int64_t count, bool in_place) {
    const int root = static_cast<int>((count + 1) % n_);
    SCOPED_TRACE(detail::cat("reduce ", reduce_op_name(op), " ", dtype_name(dtype_of<T>()),
                             " count ", count, " root ", root, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    make_send_recv<T>(count, in_place, send, recv);
    drive(
        comms_, how_, [&] { ditto::reduce(comms_, send, recv, op, root); },
        [&](int r) { comms_[r].reduce(send[r], recv[r], op, root); });
    for (int r = 0; r < n_; ++r) {
      std::vector<T> expected = r == root  ? host_reduce<T>(n_, count, op)
                                : in_place ? inputs<T>(r, count)
                                           : sentinel<T>(count);
      expect_result(recv[r].to_vector<T>(), expected, close_only(op) && r == root, r);
    }
  }

  template <typename T>
  void reduce_scatter(ReduceOp op, std::int64_t count, bool in_place) {
    SCOPED_TRACE(detail::cat("reduce_scatter ", reduce_op_name(op), " ", dtype_name(dtype_of<T>()),
                             " count ", count, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, n_ * count), comms_[r].device()));
      recv.push_back(in_place ? send[r].narrow(r * count, count)
                              : make(sentinel<T>(count), comms_[r].device()));
    }
    drive(
        comms_, how_, [&] { ditto::reduce_scatter(comms_, send, recv, op); },
        [&](int r) { comms_[r].reduce_scatter(send[r], recv[r], op); });
    for (int r = 0; r < n_; ++r) {
      expect_result(recv[r].to_vector<T>(), host_reduce<T>(n_, count, op, r * count),
                    close_only(op), r);
      // The other blocks of send stay as they were (also in place).
      auto s = send[r].to_vector<T>();
      auto in = inputs<T>(r, n_ * count);
      for (std::int64_t i = 0; i < n_ * count; ++i)
        if (i / std::max<std::int64_t>(count, 1) != r || !in_place) {
          ASSERT_EQ(s[i], in[i]) << "rank " << r << " send element " << i;
        }
    }
  }

  template <typename T>
  void broadcast(std::int64_t count, int root, bool in_place) {
    SCOPED_TRACE(detail::cat("broadcast ", dtype_name(dtype_of<T>()), " count ", count, " root ",
                             root, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    make_send_recv<T>(count, in_place, send, recv);
    drive(
        comms_, how_,
        [&] {
          if (in_place) {
            ditto::broadcast(comms_, send, root);
          } else {  // the vector form is in place only: a grouped loop
            group_start();
            for (int r = 0; r < n_; ++r) comms_[r].broadcast(send[r], recv[r], root);
            group_end();
          }
        },
        [&](int r) {
          if (in_place)
            comms_[r].broadcast(send[r], root);
          else
            comms_[r].broadcast(r == root ? send[r] : Tensor(), recv[r], root);
        });
    for (int r = 0; r < n_; ++r)
      EXPECT_EQ(recv[r].to_vector<T>(), inputs<T>(root, count)) << "rank " << r;
  }

  template <typename T>
  void all_gather(std::int64_t count, bool in_place) {
    SCOPED_TRACE(detail::cat("all_gather ", dtype_name(dtype_of<T>()), " count ", count,
                             in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    std::vector<T> expected;
    for (int r = 0; r < n_; ++r) {
      auto in = inputs<T>(r, count);
      expected.insert(expected.end(), in.begin(), in.end());
    }
    for (int r = 0; r < n_; ++r) {
      if (in_place) {  // send is block r of recv
        auto v = sentinel<T>(n_ * count);
        auto in = inputs<T>(r, count);
        std::copy(in.begin(), in.end(), v.begin() + r * count);
        recv.push_back(make(v, comms_[r].device()));
        send.push_back(recv[r].narrow(r * count, count));
      } else {
        send.push_back(make(inputs<T>(r, count), comms_[r].device()));
        recv.push_back(make(sentinel<T>(n_ * count), comms_[r].device()));
      }
    }
    drive(
        comms_, how_, [&] { ditto::all_gather(comms_, send, recv); },
        [&](int r) { comms_[r].all_gather(send[r], recv[r]); });
    for (int r = 0; r < n_; ++r) EXPECT_EQ(recv[r].to_vector<T>(), expected) << "rank " << r;
  }
};

TEST_P(CommCollectives, AllReduce) {
  for_each_reduction(kCounts, {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max},
                     [&](auto type, ReduceOp op, std::int64_t count, bool in_place) {
                       all_reduce<decltype(type)>(op, count, in_place);
                     });
}

TEST_P(CommCollectives, Reduce) {
  for_each_reduction(kCounts, {ReduceOp::sum, ReduceOp::max},
                     [&](auto type, ReduceOp op, std::int64_t count, bool in_place) {
                       reduce<decltype(type)>(op, count, in_place);
                     });
}

TEST_P(CommCollectives, ReduceScatter) {
  for_each_reduction(kScatterCounts, {ReduceOp::sum, ReduceOp::min, ReduceOp::prod},
                     [&](auto type, ReduceOp op, std::int64_t count, bool in_place) {
                       reduce_scatter<decltype(type)>(op, count, in_place);
                     });
}

TEST_P(CommCollectives, Broadcast) {
  for_each_ranks([&] {
    for (std::int64_t count : kCounts)
      for (bool in_place : {false, true})
        for (int root : {static_cast<int>(count % n_), n_ - 1}) {
          broadcast<float>(count, root, in_place);
          broadcast<std::int64_t>(count, root, in_place);
        }
  });
}

TEST_P(CommCollectives, AllGather) {
  for_each_ranks([&] {
    for (std::int64_t count : kCounts)
      for (bool in_place : {false, true}) {
        all_gather<float>(count, in_place);
        all_gather<std::int64_t>(count, in_place);
      }
  });
}

TEST_P(CommCollectives, BarrierAndManyCollectivesInARow) {
  for_each_ranks([&] {
    std::vector<Tensor> t;
    for (int r = 0; r < n_; ++r) t.push_back(Tensor::full({257}, 1.0f, comms_[r].device()));
    for (int k = 0; k < 20; ++k)
      drive(
          comms_, how_,
          [&] {
            ditto::all_reduce(comms_, t, ReduceOp::sum);
            group_start();
            for (auto& c : comms_) c.barrier();
            group_end();
          },
          [&](int r) {
            comms_[r].all_reduce(t[r], ReduceOp::sum);
            comms_[r].barrier();
          });
    // Each round multiplies by n (one rounding, whatever the order of the equal addends).
    float expected = 1.0f;
    for (int k = 0; k < 20; ++k) expected *= static_cast<float>(n_);
    for (int r = 0; r < n_; ++r)
      EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(257, expected)) << "rank " << r;
  });
}

TEST_P(CommCollectives, BitwiseResultsFollowTheCanonicalTree) {
  if (mode_ != Determinism::bitwise) GTEST_SKIP() << "bitwise mode only";
  for_each_ranks([&] {
    const std::int64_t count = 5003;
    std::vector<std::vector<float>> in;
    for (int r = 0; r < n_; ++r) in.push_back(rough_inputs(r, count));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::prod}) {
      SCOPED_TRACE(reduce_op_name(op));
      std::vector<Tensor> send, recv;
      for (int r = 0; r < n_; ++r) {
        send.push_back(make(in[r], comms_[r].device()));
        recv.push_back(make(sentinel<float>(count), comms_[r].device()));
      }
      drive(
          comms_, how_, [&] { ditto::all_reduce(comms_, send, recv, op); },
          [&](int r) { comms_[r].all_reduce(send[r], recv[r], op); });
      const auto expected = value_bits(host_reduce(in, op));
      for (int r = 0; r < n_; ++r) EXPECT_EQ(value_bits(recv[r].to_vector<float>()), expected) << r;
    }
  });
}

std::string collectives_name(const ::testing::TestParamInfo<Param>& info) {
  return detail::cat(std::get<0>(info.param), "_", determinism_name(std::get<1>(info.param)), "_",
                     drive_name(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Sim, CommCollectives,
                         ::testing::Combine(::testing::Values(std::string("sim")),
                                            ::testing::Values(Determinism::fast,
                                                              Determinism::bitwise),
                                            ::testing::Values(Drive::vector_form, Drive::loop,
                                                              Drive::grouped_loop, Drive::spmd)),
                         collectives_name);
// No Drive::loop: one thread calling every handle outside a group blocks in the first call
// (CudaCommTest.OneThreadCallingEveryHandleOutsideAGroupTimesOutWithAHint).
INSTANTIATE_TEST_SUITE_P(
    Cuda, CommCollectives,
    ::testing::Combine(::testing::Values(std::string("cuda")),
                       ::testing::Values(Determinism::fast, Determinism::bitwise),
                       ::testing::Values(Drive::vector_form, Drive::grouped_loop, Drive::spmd)),
    collectives_name);

// ---- one backend at a time ----------------------------------------------------------------------

class CommBackends : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { init_sim(kSimDevices, kSimCapacity); }
  void SetUp() override {
    backend_ = GetParam();
    const std::string why = unavailable(backend_);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  std::vector<Communicator> init(int n, CommOptions o = {}) {
    return Communicator::init_all(devices(backend_, n), o);
  }
  std::string backend_;
};

INSTANTIATE_TEST_SUITE_P(Backends, CommBackends,
                         ::testing::Values(std::string("sim"), std::string("cuda")),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(CommBackends, AllGatherIntoMatrixAndManyCallsInARow) {
  auto comms = init(4);
  EXPECT_EQ(comms[2].rank(), 2);
  EXPECT_EQ(comms[2].size(), 4);
  EXPECT_EQ(comms[2].device(), Device(backend_, 2));
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

// Mixed magnitudes: a left-to-right sum over ranks differs from the canonical tree.
float mixed_value(int r, std::int64_t i) { return mixed_rank_value(r, i, 12345u); }

float mixed_tree(int lo, int hi, std::int64_t i) { return test::host_tree(lo, hi, i, mixed_value); }

TEST_P(CommBackends, BitwiseReductionsFollowTheCanonicalTree) {
  const std::int64_t count = 1003;
  for (int n = 1; n <= max_devices(backend_); ++n) {
    SCOPED_TRACE(detail::cat(n, " ranks"));
    std::vector<float> tree(count), left(count);
    int differ = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      tree[i] = mixed_tree(0, n, i);
      float acc = mixed_value(0, i);
      for (int r = 1; r < n; ++r) acc = acc + mixed_value(r, i);
      left[i] = acc;
      differ += test::bits(tree[i]) != test::bits(left[i]);
    }
    // For 1..3 ranks the canonical tree is the left-to-right sum; from 4 on the inputs must tell
    // them apart, or the bit-for-bit checks below would prove nothing.
    if (n >= 4) {
      ASSERT_GT(differ, 10) << "inputs do not tell the tree from a left-to-right sum";
    }

    CommOptions opts;
    opts.determinism = Determinism::bitwise;
    auto comms = init(n, opts);
    // Element i of rank r holds mixed_value(r, i % count): for reduce_scatter every block of a
    // rank's send repeats the all_reduce input, so block b reduces to `tree` as well.
    auto rank_inputs = [&](int r, std::int64_t cnt) {
      std::vector<float> v(static_cast<std::size_t>(cnt));
      for (std::int64_t i = 0; i < cnt; ++i) v[i] = mixed_value(r, i % count);
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
          ASSERT_EQ(test::bits(got[i]), test::bits(tree[i]))
              << "all_reduce rank " << r << " element " << i;
          ASSERT_EQ(test::bits(got_rs[i]), test::bits(tree[i]))
              << "reduce_scatter rank " << r << " element " << i;
        }
      }
      auto got = red[n - 1].to_vector<float>();
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(test::bits(got[i]), test::bits(tree[i])) << "reduce element " << i;
    }
  }
}

TEST_P(CommBackends, FastModeAgreesWithTheTreeWithinTolerance) {
  const int n = 8;
  const std::int64_t count = 257;
  auto comms = init(n);
  std::vector<Tensor> t;
  for (int r = 0; r < n; ++r) {
    std::vector<float> v(count);
    for (std::int64_t i = 0; i < count; ++i) v[i] = mixed_value(r, i);
    t.push_back(make(v, comms[r].device()));
  }
  all_reduce(comms, t);
  synchronize(comms);
  auto got = t[3].to_vector<float>();
  for (std::int64_t i = 0; i < count; ++i) {
    double exact = 0, mag = 0;
    for (int r = 0; r < n; ++r) exact += mixed_value(r, i), mag += std::fabs(mixed_value(r, i));
    EXPECT_NEAR(got[i], exact, 1e-6 * mag) << "element " << i;
  }
}

// ---- mismatches, timeouts, abort
// ------------------------------------------------------------------

// Each rank's call from a thread of its own (SPMD), then its stream's synchronize: the simulator
// reports a failed collective there, cuda in the call itself. Returns each rank's message of an
// E, or "wrong type: ..." / "" (no exception).
template <typename E>
std::vector<std::string> spmd_errors(std::vector<Communicator>& comms, int ranks,
                                     const std::function<void(int)>& call) {
  std::vector<std::string> what(static_cast<std::size_t>(ranks));
  run_threads(ranks, [&](int r) {
    try {
      call(r);
      comms[r].stream().synchronize();
    } catch (const E& e) {
      what[r] = e.what();
    } catch (const std::exception& e) {
      what[r] = std::string("wrong type: ") + e.what();
    }
  });
  return what;
}

TEST_P(CommBackends, MismatchedCallsFailEveryRankAndTheCommunicatorStaysUsable) {
  auto comms = init(3);
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
      {[&] { comms[1].broadcast(t[1], 0); }, [&] { comms[2].broadcast(t[2], 1); },
       "broadcast: rank 2 called with root 1, rank 0 with root 0"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    auto rank0 = [&] {
      if (c.message.rfind("broadcast", 0) == 0)
        comms[0].broadcast(t[0], 0);
      else
        comms[0].all_reduce(t[0]);
    };
    // One thread per rank, every backend.
    const auto what = spmd_errors<InvalidArgument>(comms, 3, [&](int r) {
      if (r == 0) rank0();
      if (r == 1) c.rank1();
      if (r == 2) c.rank2();
    });
    for (int r = 0; r < 3; ++r)
      EXPECT_NE(what[r].find(c.message), std::string::npos) << "rank " << r << ": " << what[r];
    // One thread calling every handle: the simulator only (cuda blocks in the first call).
    if (backend_ == "sim") {
      rank0();
      c.rank1();
      c.rank2();
      for (int r = 0; r < 3; ++r)
        expect_error<InvalidArgument>([&] { comms[r].stream().synchronize(); }, c.message);
    }
  }

  // Still usable, and nothing was written by the failed calls.
  all_reduce(comms, t);
  synchronize(comms);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(12, 3.0f));
}

TEST_P(CommBackends, RankThatNeverCallsTimesOutNamingItAndAbortsTheCommunicator) {
  CommOptions opts;
  opts.timeout_ms = 200;
  auto comms = init(4, opts);
  std::vector<Tensor> t;
  for (int r = 0; r < 4; ++r) t.push_back(Tensor::full({5}, 1.0f, comms[r].device()));
  // One collective that completes, then ranks 2 and 3 never join the second.
  all_reduce(comms, t);
  synchronize(comms);
  const auto start = std::chrono::steady_clock::now();
  const auto what = spmd_errors<Timeout>(comms, 2, [&](int r) { comms[r].all_reduce(t[r]); });
  for (const std::string& w : what)
    EXPECT_NE(w.find("all_reduce (collective #2 on this communicator): timed out after 200 ms "
                     "waiting for ranks 2, 3"),
              std::string::npos)
        << w;
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

TEST_P(CommBackends, BarrierTimeoutNamesTheSingleMissingRankInSpmd) {
  CommOptions opts;
  opts.timeout_ms = 150;
  auto comms = init(3, opts);
  const auto what = spmd_errors<Timeout>(comms, 2, [&](int r) { comms[r].barrier(); });
  for (const std::string& w : what)
    EXPECT_NE(w.find("barrier (collective #1 on this communicator): timed out after 150 ms "
                     "waiting for rank 2 "),
              std::string::npos)
        << w;
}

// ---- the simulator only
// ---------------------------------------------------------------------------

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

TEST_F(CommunicatorTest, InitAllRejectsBadDeviceLists) {
  expect_error<InvalidArgument>(
      [] { Communicator::init_all({}); },
      "Communicator::init_all: devices: expected at least one device, got an empty list");
  expect_error<InvalidArgument>(
      [] {
        Communicator::init_all({Device("sim", 0), Device::cpu()});
      },
      "devices[1]: expected a device of a GPU backend (sim, cuda), got cpu");
  expect_error<InvalidArgument>([] { Communicator::init_all({Device::cpu()}); },
                                "devices[0]: expected a device of a GPU backend");
  expect_error<InvalidArgument>(
      [] {
        Communicator::init_all({Device("sim", 0), Device("cuda", 1)});
      },
      "devices[1]: expected a device of backend sim (like devices[0]), got cuda:1");
  expect_error<InvalidArgument>(
      [] {
        Communicator::init_all({Device("sim", 0), Device("sim", 16)});
      },
      "devices[1]: sim:16 is out of range (backend sim has 16 devices)");
  expect_error<InvalidArgument>(
      [] {
        Communicator::init_all({Device("sim", 3), Device("sim", 1), Device("sim", 3)});
      },
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

  expect_error<InvalidArgument>(
      [&] { comms[0].all_reduce(undefined); },
      "Communicator::all_reduce: send: expected a tensor on sim:0 (rank 0 "
      "of 2), got an undefined tensor");
  expect_error<InvalidArgument>(
      [&] { comms[0].all_reduce(a1); },
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
    expect_error<InvalidArgument>(
        [&] { broadcast(comms, both, -1); },
        "Communicator::broadcast: root: expected a rank in [0, 2), got -1");
  }
  expect_error<InvalidArgument>([&] { comms[0].broadcast(a0, b0, 0); },
                                "Communicator::broadcast: recv: expected 6 elements");
  expect_error<InvalidArgument>([&] { comms[0].all_gather(a0, a0); },
                                "Communicator::all_gather: recv: expected 12 elements (size 2 x "
                                "send's 6), got [6] f32 on sim:0");
  expect_error<InvalidArgument>(
      [&] { comms[0].reduce_scatter(a0, a0); },
      "Communicator::reduce_scatter: send: expected 12 elements (size 2 x "
      "recv's 6), got [6] f32 on sim:0");
  expect_error<InvalidArgument>([&] { comms[1].reduce_scatter(big1, l0); },
                                "Communicator::reduce_scatter: recv: expected a tensor on sim:1");

  // Each per-rank refusal above aborted the communicator (its peer would wait for the refused
  // call: CollErrors.EveryPerRankRefusalFailsTheOthersAtOnceNamingIt); new handles for the rest.
  comms = Communicator::init_all(devices("sim", 2), opts);
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

// ---- cuda only
// ------------------------------------------------------------------------------------

// cuda's bitwise collectives give the simulator's bits (both follow Note [Canonical tree]).
TEST_F(CudaCommTest, BitwiseCollectivesEqualTheSimulatorBitForBit) {
  Backend& sim = get_backend("sim");
  if (sim.device_count() < kCudaDevices) init_sim(kCudaDevices);
  CommOptions o;
  o.determinism = Determinism::bitwise;
  const std::int64_t count = 4099;
  for (int n : kRanks) {
    std::vector<std::vector<float>> out[2];  // [sim, cuda][kind * rank]
    int b = 0;
    for (const char* backend : {"sim", "cuda"}) {
      SCOPED_TRACE(detail::cat(backend, " ", n, " ranks"));
      auto comms = Communicator::init_all(devices(backend, n), o);
      std::vector<Tensor> send, recv, scattered;
      for (int r = 0; r < n; ++r) {
        send.push_back(make(rough_inputs(r, n * count), comms[r].device()));
        recv.push_back(make(sentinel<float>(n * count), comms[r].device()));
        scattered.push_back(make(sentinel<float>(count), comms[r].device()));
      }
      ditto::all_reduce(comms, send, recv, ReduceOp::sum);
      synchronize(comms);
      for (int r = 0; r < n; ++r) out[b].push_back(recv[r].to_vector<float>());
      ditto::all_reduce(comms, send, recv, ReduceOp::avg);
      ditto::reduce_scatter(comms, send, scattered, ReduceOp::sum);
      synchronize(comms);
      for (int r = 0; r < n; ++r) {
        out[b].push_back(recv[r].to_vector<float>());
        out[b].push_back(scattered[r].to_vector<float>());
      }
      ++b;
    }
    ASSERT_EQ(out[0].size(), out[1].size());
    for (std::size_t i = 0; i < out[0].size(); ++i)
      EXPECT_EQ(value_bits(out[0][i]), value_bits(out[1][i])) << n << " ranks, result " << i;
  }
}

// The GPU logical device `index` runs on, as the backend's errors name it ("cuda:1 (GPU 1): out of
// memory ..."): the tests see no CUDA API.
int physical_gpu(int index) {
  Backend& b = get_backend("cuda");
  try {
    void* p = b.allocate(index, b.memory_stats(index).capacity + 1);
    b.deallocate(index, p, b.memory_stats(index).capacity + 1);
  } catch (const OutOfMemory& e) {
    const std::string m = e.what();
    const std::size_t at = m.find("(GPU ");
    if (at != std::string::npos) return std::stoi(m.substr(at + 5));
  }
  return -1;
}

TEST_F(CudaCommTest, BitwiseNcclScratchIsCountedByTheDevicesMemoryStats) {
  if (physical_gpu(0) == physical_gpu(1))
    GTEST_SKIP() << "needs two GPUs: ranks sharing a GPU use the in-GPU transport, which has no "
                    "scratch";
  Backend& b = get_backend("cuda");
  CommOptions o;
  o.determinism = Determinism::bitwise;
  auto comms = Communicator::init_all(devices("cuda", 2), o);
  const std::int64_t count = std::int64_t(1) << 20;  // two even blocks of 2^19 floats
  std::vector<Tensor> t;
  for (int r = 0; r < 2; ++r) t.push_back(make(inputs<float>(r, count), comms[r].device()));
  synchronize(comms);
  std::size_t before[2];
  for (int r = 0; r < 2; ++r) {
    b.reset_peak_memory(r);
    before[r] = b.memory_stats(r).in_use;
  }
  ditto::all_reduce(comms, t);
  synchronize(comms);
  // Each rank's scratch of [2 ranks, 2^19] floats (Note [CUDA bitwise collectives]) went through
  // the backend's allocator: the peak saw it, and it was given back.
  const std::size_t scratch = 2 * (std::size_t(1) << 19) * sizeof(float);
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(b.memory_stats(r).peak, before[r] + scratch) << "rank " << r;
    EXPECT_EQ(b.memory_stats(r).in_use, before[r]) << "rank " << r;
  }
  EXPECT_EQ(t[1].to_vector<float>()[5], inputs<float>(0, count)[5] + inputs<float>(1, count)[5]);
}

TEST_F(CudaCommTest, OneThreadCallingEveryHandleOutsideAGroupTimesOutWithAHint) {
  CommOptions o;
  o.timeout_ms = 200;
  auto comms = Communicator::init_all(devices("cuda", 2), o);
  Tensor t = Tensor::full({3}, 1.0f, comms[0].device());
  expect_error<Timeout>([&] { comms[0].all_reduce(t); }, "inside group_start()/group_end()");
}

TEST_F(CudaCommTest, GroupEndWithoutGroupStartIsAnError) {
  expect_error<InvalidArgument>([] { group_end(); },
                                "group_end: expected a matching group_start() on this thread");
}

TEST_F(CudaCommTest, GroupedMismatchIsReportedByGroupEnd) {
  auto comms = Communicator::init_all(devices("cuda", 2));
  Tensor a = Tensor::full({4}, 1.0f, comms[0].device());
  Tensor b = Tensor::full({4}, 1.0f, comms[1].device());
  group_start();
  comms[0].all_reduce(a, ReduceOp::sum);
  comms[1].all_reduce(b, ReduceOp::max);
  expect_error<InvalidArgument>([] { group_end(); },
                                "all_reduce: rank 1 called with op max, rank 0 with op sum");
}

}  // namespace
}  // namespace ditto
