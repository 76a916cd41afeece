// Tests of the CUDA communicator (backend_cuda/cuda_communicator.cpp, Note [CUDA collectives]):
// every collective for 1, 2, 3, 4 and 8 ranks on the cuda backend's 8 logical devices (on a
// machine with fewer GPUs they share them: the in-GPU transport; ranks on distinct GPUs: NCCL),
// fast and bitwise, driven by the single-controller forms, by a group around a loop over the
// handles and by one thread per rank, against a host computation; bitwise results against the
// host canonical tree and the simulator, bit for bit; call mismatches, timeouts and the group
// rules. Every test skips, saying why, where the cuda backend cannot start (no GPU, no driver, or
// a build without it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/runtime/backend.h"
#include "core/comm/communicator.h"
#include "core/numerics/determinism.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr int kDevices = 8;

using CudaCommTest = CudaSuite<kDevices>;

// ---- inputs and the host reference --------------------------------------------------------------

template <typename T>
std::vector<T> inputs(int r, std::int64_t count, std::int64_t offset = 0) {
  return exact_inputs<T>(r, count, offset);
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
  if constexpr (std::is_same_v<T, std::int64_t>) {
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
// (Note [Canonical tree]); avg divides the sum by the number of ranks.
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

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

// Equal, or (close_only) within a relative 1e-6: NCCL's own avg (fast mode) may scale before or
// after adding, so only the exact inputs' sums, products, min and max are exact there.
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

// ---- how a case drives the ranks -------------------------------------------------------------

enum class Drive { vector_form, grouped_loop, spmd };
const char* drive_name(Drive d) {
  return d == Drive::vector_form ? "vector" : d == Drive::grouped_loop ? "group" : "spmd";
}

// vector_form: core's single-controller function; grouped_loop: group_start, one call per handle,
// group_end; spmd: one std::thread per rank. Then synchronize every rank.
void drive(std::vector<Communicator>& comms, Drive how, const std::function<void()>& vector_form,
           const std::function<void(int)>& per_rank) {
  const int n = static_cast<int>(comms.size());
  if (how == Drive::vector_form) {
    vector_form();
  } else if (how == Drive::grouped_loop) {
    group_start();
    for (int r = 0; r < n; ++r) per_rank(r);
    group_end();
  } else {
    std::vector<std::exception_ptr> errors(comms.size());
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        try {
          per_rank(r);
        } catch (...) {
          errors[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  synchronize(comms);
}

// ---- every collective, every op -----------------------------------------------------------------

using Param = std::tuple<int, Determinism, Drive>;  // ranks, mode, drive

class CudaCollectiveTest : public CudaCommTest, public ::testing::WithParamInterface<Param> {
 protected:
  void SetUp() override {
    CudaCommTest::SetUp();
    if (IsSkipped()) return;
    std::tie(n_, mode_, how_) = GetParam();
    CommOptions o;
    o.determinism = mode_;
    o.timeout_ms = 60000;
    comms_ = Communicator::init_all(devices("cuda", n_), o);
  }
  int n_ = 0;
  Determinism mode_ = Determinism::fast;
  Drive how_ = Drive::vector_form;
  std::vector<Communicator> comms_;

  // Counts: none, one, uneven slices, and enough for the vector path and several blocks.
  static constexpr std::int64_t kCounts[] = {0, 1, 1003, 70001};

  bool close_only(ReduceOp op) const { return op == ReduceOp::avg && mode_ == Determinism::fast; }

  template <typename T>
  std::vector<std::vector<T>> all_inputs(std::int64_t count) {
    std::vector<std::vector<T>> v;
    for (int r = 0; r < n_; ++r) v.push_back(inputs<T>(r, count));
    return v;
  }

  template <typename T>
  void all_reduce(ReduceOp op, std::int64_t count, bool in_place) {
    SCOPED_TRACE(detail::cat("all_reduce ", reduce_op_name(op), " ", dtype_name(dtype_of<T>()),
                             " count ", count, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, count), comms_[r].device()));
      recv.push_back(in_place ? send[r] : make(sentinel<T>(count), comms_[r].device()));
    }
    drive(
        comms_, how_, [&] { ditto::all_reduce(comms_, send, recv, op); },
        [&](int r) { comms_[r].all_reduce(send[r], recv[r], op); });
    const auto expected = host_reduce(all_inputs<T>(count), op);
    for (int r = 0; r < n_; ++r) {
      expect_result(recv[r].to_vector<T>(), expected, close_only(op), r);
      if (!in_place) {
        EXPECT_EQ(send[r].to_vector<T>(), inputs<T>(r, count)) << "rank " << r;
      }
    }
  }

  template <typename T>
  void reduce(ReduceOp op, std::int64_t count, int root) {
    SCOPED_TRACE(detail::cat("reduce ", reduce_op_name(op), " ", dtype_name(dtype_of<T>()),
                             " count ", count, " root ", root));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, count), comms_[r].device()));
      recv.push_back(make(sentinel<T>(count), comms_[r].device()));
    }
    drive(
        comms_, how_, [&] { ditto::reduce(comms_, send, recv, op, root); },
        [&](int r) { comms_[r].reduce(send[r], recv[r], op, root); });
    const auto expected = host_reduce(all_inputs<T>(count), op);
    for (int r = 0; r < n_; ++r)
      expect_result(recv[r].to_vector<T>(), r == root ? expected : sentinel<T>(count),
                    close_only(op), r);
  }

  template <typename T>
  void reduce_scatter(ReduceOp op, std::int64_t count, bool in_place) {
    SCOPED_TRACE(detail::cat("reduce_scatter ", reduce_op_name(op), " ",
                             dtype_name(dtype_of<T>()), " count ", count,
                             in_place ? " in place" : ""));
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
      std::vector<std::vector<T>> blocks;
      for (int q = 0; q < n_; ++q) blocks.push_back(inputs<T>(q, count, r * count));
      expect_result(recv[r].to_vector<T>(), host_reduce(blocks, op), close_only(op), r);
    }
  }

  template <typename T>
  void broadcast(std::int64_t count, int root, bool in_place) {
    SCOPED_TRACE(detail::cat("broadcast ", dtype_name(dtype_of<T>()), " count ", count, " root ",
                             root, in_place ? " in place" : ""));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n_; ++r) {
      send.push_back(make(inputs<T>(r, count), comms_[r].device()));
      recv.push_back(in_place ? send[r] : make(sentinel<T>(count), comms_[r].device()));
    }
    drive(
        comms_, how_,
        [&] {
          if (in_place) {
            ditto::broadcast(comms_, send, root);
          } else {
            group_start();
            for (int r = 0; r < n_; ++r) comms_[r].broadcast(send[r], recv[r], root);
            group_end();
          }
        },
        [&](int r) { comms_[r].broadcast(r == root ? send[r] : Tensor(), recv[r], root); });
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
      if (in_place) {
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

TEST_P(CudaCollectiveTest, AllReduce) {
  for (std::int64_t count : kCounts) {
    for (ReduceOp op :
         {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg})
      all_reduce<float>(op, count, false);
    all_reduce<float>(ReduceOp::sum, count, true);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max})
      all_reduce<std::int64_t>(op, count, count % 2 == 1);
  }
}

TEST_P(CudaCollectiveTest, Reduce) {
  for (std::int64_t count : kCounts) {
    const int root = static_cast<int>((count + 1) % n_);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg})
      reduce<float>(op, count, root);
    reduce<std::int64_t>(ReduceOp::sum, count, root);
  }
}

TEST_P(CudaCollectiveTest, ReduceScatter) {
  for (std::int64_t count : {std::int64_t(0), std::int64_t(1), std::int64_t(1003),
                             std::int64_t(9001)}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::avg})
      reduce_scatter<float>(op, count, false);
    reduce_scatter<float>(ReduceOp::sum, count, true);
    reduce_scatter<std::int64_t>(ReduceOp::prod, count, false);
  }
}

TEST_P(CudaCollectiveTest, Broadcast) {
  for (std::int64_t count : kCounts) {
    const int root = static_cast<int>(count % n_);
    broadcast<float>(count, root, false);
    broadcast<float>(count, n_ - 1, true);
    broadcast<std::int64_t>(count, root, false);
  }
}

TEST_P(CudaCollectiveTest, AllGather) {
  for (std::int64_t count : kCounts) {
    all_gather<float>(count, false);
    all_gather<float>(count, true);
    all_gather<std::int64_t>(count, false);
  }
}

TEST_P(CudaCollectiveTest, BarrierAndManyCollectivesInARow) {
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
}

TEST_P(CudaCollectiveTest, BitwiseResultsFollowTheCanonicalTree) {
  if (mode_ != Determinism::bitwise) GTEST_SKIP() << "bitwise mode only";
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
    const auto expected = bits(host_reduce(in, op));
    for (int r = 0; r < n_; ++r) EXPECT_EQ(bits(recv[r].to_vector<float>()), expected) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksModesDrives, CudaCollectiveTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values(Determinism::fast, Determinism::bitwise),
                       ::testing::Values(Drive::vector_form, Drive::grouped_loop, Drive::spmd)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return detail::cat(std::get<0>(info.param), "ranks_",
                         determinism_name(std::get<1>(info.param)), "_",
                         drive_name(std::get<2>(info.param)));
    });

// ---- bitwise: the same bits as the simulator ----------------------------------------------------

TEST_F(CudaCommTest, BitwiseCollectivesEqualTheSimulatorBitForBit) {
  Backend& sim = get_backend("sim");
  if (sim.device_count() < kDevices) {
    BackendOptions o;
    o.device_count = kDevices;
    init_backend("sim", o);
  }
  CommOptions o;
  o.determinism = Determinism::bitwise;
  const std::int64_t count = 4099;
  for (int n : {1, 2, 3, 4, 8}) {
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
      EXPECT_EQ(bits(out[0][i]), bits(out[1][i])) << n << " ranks, result " << i;
  }
}

// ---- memory ---------------------------------------------------------------------------------------

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

// ---- errors -------------------------------------------------------------------------------------

TEST_F(CudaCommTest, MismatchedCallsFailEveryRankAndTheCommunicatorStaysUsable) {
  auto comms = Communicator::init_all(devices("cuda", 4));
  std::vector<Tensor> t;
  for (int r = 0; r < 4; ++r) t.push_back(Tensor::full({r == 2 ? 5 : 6}, 1.0f, comms[r].device()));
  std::vector<std::string> what(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      try {
        comms[r].all_reduce(t[r]);
      } catch (const InvalidArgument& e) {
        what[r] = e.what();
      } catch (const std::exception& e) {
        what[r] = std::string("wrong type: ") + e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(what[r].find("all_reduce: rank 2 called with count 5, rank 0 with count 6"),
              std::string::npos)
        << "rank " << r << ": " << what[r];
  // The same call again, matching: it works.
  t[2] = Tensor::full({6}, 1.0f, comms[2].device());
  ditto::all_reduce(comms, t);
  synchronize(comms);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(6, 4.0f));
}

TEST_F(CudaCommTest, RankThatNeverCallsTimesOutNamingItAndAbortsTheCommunicator) {
  CommOptions o;
  o.timeout_ms = 300;
  auto comms = Communicator::init_all(devices("cuda", 3), o);
  std::vector<Tensor> t;
  for (int r = 0; r < 3; ++r) t.push_back(Tensor::full({4}, 1.0f, comms[r].device()));
  std::string what[2];
  std::thread other([&] {
    try {
      comms[1].all_reduce(t[1]);
    } catch (const Timeout& e) {
      what[1] = e.what();
    } catch (const std::exception& e) {
      what[1] = std::string("wrong type: ") + e.what();
    }
  });
  try {
    comms[0].all_reduce(t[0]);
  } catch (const Timeout& e) {
    what[0] = e.what();
  } catch (const std::exception& e) {
    what[0] = std::string("wrong type: ") + e.what();
  }
  other.join();
  for (const std::string& w : what) {
    EXPECT_NE(w.find("all_reduce (collective #1 on this communicator): timed out after 300 ms "
                     "waiting for rank 2"),
              std::string::npos)
        << w;
  }
  expect_error<BackendError>([&] { comms[2].all_reduce(t[2]); },
                             "all_reduce: communicator aborted by an earlier error");
  expect_error<BackendError>([&] { comms[0].barrier(); }, "barrier: communicator aborted");
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
