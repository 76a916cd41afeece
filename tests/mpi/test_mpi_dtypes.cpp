// Issue 13 over MPI (one rank per process, Note [Sim collectives over MPI]): reductions on dtypes
// other than f32 / i64 (bf16, i8, u64, f64), integer avg, premul_sum with per-rank scalars, the new
// collectives (all_to_all, all_to_all_v with its cross-rank count check, gather, scatter) and
// send / recv between processes (ring in a group, order per pair, mismatch, timeout). Part of
// ditto_mpi_tests (main() in test_mpi_communicator.cpp); ctest runs it under mpirun -np 1, 2, 4, 8.
// Expected values are computed here on the host from the rank-dependent inputs; bitwise bf16
// results are compared bit for bit with the in-process simulator over world() virtual devices.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../test_util.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"
#include "mpi_test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using namespace ditto::test::mpi;

/// A tensor of any host type on `d` (through a host tensor: a byte copy).
template <typename T>
Tensor make(const std::vector<T>& v, const Device& d = kLocal) {
  Tensor host = Tensor::empty({static_cast<std::int64_t>(v.size())}, dtype_of<T>(), Device::cpu());
  if (!v.empty()) std::memcpy(host.data_ptr(), v.data(), v.size() * sizeof(T));
  Tensor t = Tensor::empty(host.shape(), host.dtype(), d);
  t.copy_(host);
  return t;
}
template <typename T>
std::vector<T> values(const Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::cpu());
  host.copy_(t);
  std::vector<T> v(static_cast<std::size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), host.data_ptr(), v.size() * sizeof(T));
  return v;
}

/// Small signed integers, exact in every dtype used here: x(r, i) in [-8, 8].
int small(int r, std::int64_t i) { return static_cast<int>((r * 5 + i * 3) % 17) - 8; }

template <typename T>
std::vector<T> small_inputs(int r, std::int64_t n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_integral_v<T>)
      v[i] = static_cast<T>(small(r, i));  // wraps for unsigned types, as the host sums below
    else
      v[i] = convert<T>(static_cast<float>(small(r, i)));
  }
  return v;
}

class MpiDTypes : public ::testing::TestWithParam<Determinism> {};

// sum / max over ranks of small integers: exact in bf16, i8 (|sum| <= 64), u64 (wraps for
// negatives, as the host's unsigned sum), f64.
TEST_P(MpiDTypes, AllReduceAndReduceScatterOnBf16I8U64F64) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const std::int64_t n = 37;
  auto check = [&](auto tag) {
    using T = decltype(tag);
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<T> want(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_integral_v<T>) {
          T acc = static_cast<T>(small(0, i));
          for (int q = 1; q < world(); ++q) {
            const T x = static_cast<T>(small(q, i));
            acc = op == ReduceOp::sum ? static_cast<T>(acc + x) : std::max(acc, x);
          }
          want[i] = acc;
        } else {
          float acc = static_cast<float>(small(0, i));
          for (int q = 1; q < world(); ++q)
            acc = op == ReduceOp::sum ? acc + small(q, i) : std::max<float>(acc, small(q, i));
          want[i] = convert<T>(acc);
        }
      }
      Tensor t = make(small_inputs<T>(me(), n));
      c.all_reduce(t, op);
      EXPECT_EQ(values<T>(t), want) << dtype_name(dtype_of<T>()) << " " << reduce_op_name(op);
      // reduce_scatter: rank r's block of the same inputs laid out as world() blocks of n.
      std::vector<T> big;
      for (int b = 0; b < world(); ++b) {
        std::vector<T> x = small_inputs<T>(me(), n);
        big.insert(big.end(), x.begin(), x.end());
      }
      Tensor recv = make(std::vector<T>(static_cast<std::size_t>(n)));
      const Tensor big_t = make(big);  // alive until the stream ran the call (values() waits)
      c.reduce_scatter(big_t, recv, op);
      EXPECT_EQ(values<T>(recv), want) << "reduce_scatter " << dtype_name(dtype_of<T>());
    }
  };
  check(bfloat16{});
  check(std::int8_t{});
  check(std::uint64_t{});
  check(double{});
}

// Integer avg is NCCL's: the wrapped sum divided by N, truncating toward zero.
TEST_P(MpiDTypes, IntegerAvgTruncatesTowardZero) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const std::int64_t n = 19;
  Tensor t = make(small_inputs<std::int32_t>(me(), n));
  c.all_reduce(t, ReduceOp::avg);
  std::vector<std::int32_t> want(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    std::int32_t s = 0;
    for (int q = 0; q < world(); ++q) s += small(q, i);
    want[i] = s / world();  // C++ division truncates toward zero
  }
  EXPECT_EQ(values<std::int32_t>(t), want);
}

// premul_sum: sum over ranks of scalar_r * x_r, every rank its own scalar.
TEST_P(MpiDTypes, PremulSumUsesEveryRanksScalar) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const std::int64_t n = 23;
  const double mine = me() + 1.0;
  {
    Tensor send = make(small_inputs<float>(me(), n));
    Tensor recv = make(std::vector<float>(static_cast<std::size_t>(n)));
    c.all_reduce(send, recv, PreMulSum{mine});
    std::vector<float> want(static_cast<std::size_t>(n), 0.0f);
    for (std::int64_t i = 0; i < n; ++i)
      for (int q = 0; q < world(); ++q) want[i] += static_cast<float>((q + 1) * small(q, i));
    EXPECT_EQ(values<float>(recv), want);
  }
  {
    Tensor send = make(small_inputs<std::int64_t>(me(), n));
    Tensor recv = make(std::vector<std::int64_t>(static_cast<std::size_t>(n)));
    const int root = world() - 1;
    c.reduce(send, recv, PreMulSum{mine}, root);
    std::vector<std::int64_t> want(static_cast<std::size_t>(n), 0);
    for (std::int64_t i = 0; i < n; ++i)
      for (int q = 0; q < world(); ++q) want[i] += (q + 1) * small(q, i);
    if (me() == root) {
      EXPECT_EQ(values<std::int64_t>(recv), want);
    }
    c.stream().synchronize();
  }
}

/// A value naming (source rank, destination rank, element): distinct for every element moved.
template <typename T>
T tagged(int src, int dst, std::int64_t j) {
  return static_cast<T>(src * 64 + dst * 8 + j % 8);
}

TEST_P(MpiDTypes, AllToAllAndAllToAllV) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const int n = world();
  const std::int64_t b = 5;
  std::vector<std::int32_t> send, want;
  for (int q = 0; q < n; ++q)
    for (std::int64_t j = 0; j < b; ++j) {
      send.push_back(tagged<std::int32_t>(me(), q, j));
      want.push_back(tagged<std::int32_t>(q, me(), j));
    }
  Tensor recv = make(std::vector<std::int32_t>(send.size()));
  const Tensor send_t = make(send);
  c.all_to_all(send_t, recv);
  EXPECT_EQ(values<std::int32_t>(recv), want);

  // all_to_all_v (packed): rank r sends r + 2q + 1 elements to rank q.
  std::vector<std::int64_t> sc, rc;
  std::vector<double> vs, vw;
  for (int q = 0; q < n; ++q) {
    sc.push_back(me() + 2 * q + 1);
    rc.push_back(q + 2 * me() + 1);
    for (std::int64_t j = 0; j < sc.back(); ++j) vs.push_back(tagged<double>(me(), q, j));
    for (std::int64_t j = 0; j < rc.back(); ++j) vw.push_back(tagged<double>(q, me(), j));
  }
  Tensor rv = make(std::vector<double>(vw.size()));
  const Tensor vs_t = make(vs);
  c.all_to_all_v(vs_t, sc, rv, rc);
  EXPECT_EQ(values<double>(rv), vw);
}

TEST(MpiAllToAllV, CountsThatDoNotAddUpFailEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
  // Every rank sends 2 to everyone, but rank 1 expects 3 from rank 0.
  std::vector<std::int64_t> sc(world(), 2), rc(world(), 2);
  if (me() == 1) rc[0] = 3;
  std::int64_t total = 0;
  for (std::int64_t x : rc) total += x;
  Tensor send = make(std::vector<float>(2 * world(), 1.0f));
  Tensor recv = make(std::vector<float>(static_cast<std::size_t>(total)));
  c.all_to_all_v(send, sc, recv, rc);
  expect_error<InvalidArgument>([&] { c.stream().synchronize(); },
                                "all_to_all_v: rank 0 sends 2 elements to rank 1 (send_counts[1]), "
                                "but rank 1 expects 3 from rank 0 (recv_counts[0]) (collective #1");
  // Still in step.
  Tensor t = make(std::vector<float>{1.0f});
  c.all_reduce(t);
  EXPECT_EQ(values<float>(t), std::vector<float>{static_cast<float>(world())});
}

TEST_P(MpiDTypes, GatherAndScatterFromEveryRoot) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(GetParam()));
  const int n = world();
  const std::int64_t b = 6;
  for (int root = 0; root < n; ++root) {
    std::vector<std::uint64_t> mine, all;
    for (std::int64_t j = 0; j < b; ++j) mine.push_back(tagged<std::uint64_t>(me(), root, j));
    for (int q = 0; q < n; ++q)
      for (std::int64_t j = 0; j < b; ++j) all.push_back(tagged<std::uint64_t>(q, root, j));
    Tensor recv = make(std::vector<std::uint64_t>(all.size()));
    const Tensor mine_t = make(mine);
    c.gather(mine_t, recv, root);
    if (me() == root) {
      EXPECT_EQ(values<std::uint64_t>(recv), all) << "gather root " << root;
    }
    // scatter the gathered buffer back: rank q gets its own block.
    Tensor back = make(std::vector<std::uint64_t>(static_cast<std::size_t>(b)));
    const Tensor all_t = me() == root ? make(all) : Tensor();
    c.scatter(all_t, back, root);
    EXPECT_EQ(values<std::uint64_t>(back), mine) << "scatter root " << root;
    // In place on the root: its send is its block of recv.
    Tensor whole = make(std::vector<std::uint64_t>(all.size()));
    Tensor block = whole.narrow(me() * b, b);
    block.copy_(mine_t);
    c.gather(block, whole, root);
    if (me() == root) {
      EXPECT_EQ(values<std::uint64_t>(whole), all) << "in place, root " << root;
    }
    c.stream().synchronize();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, MpiDTypes,
                         ::testing::Values(Determinism::bitwise, Determinism::fast),
                         [](const auto& info) {
                           return std::string(determinism_name(info.param));
                         });

// bitwise bf16 all_reduce over processes: the in-process simulator's bits (f32 accumulation in
// the canonical tree, one rounding), which a left-to-right bf16 sum does not give.
TEST(MpiBitwiseDTypes, Bf16AllReduceEqualsInProcessSimulatorBitForBit) {
  const std::int64_t n = 301;
  auto rough = [](int r) {
    std::vector<bfloat16> v(static_cast<std::size_t>(n));
    std::uint32_t s = 0x9e3779b9u * static_cast<std::uint32_t>(r + 1);
    for (auto& x : v) {
      s = s * 1664525u + 1013904223u;
      x = bfloat16::from(std::ldexp(static_cast<float>(s >> 8) / 16777216.0f - 0.5f,
                                    static_cast<int>((s >> 4) % 12) - 6));
    }
    return v;
  };
  std::vector<Communicator> comms =
      Communicator::init_all(devices("sim", world()), opts(Determinism::bitwise));
  std::vector<Tensor> ref;
  for (int q = 0; q < world(); ++q) ref.push_back(make(rough(q), Device("sim", q)));
  all_reduce(comms, ref);
  synchronize(comms);
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::bitwise));
  Tensor t = make(rough(me()));
  c.all_reduce(t);
  const std::vector<bfloat16> got = values<bfloat16>(t);
  EXPECT_EQ(got, values<bfloat16>(ref[me()]));
  if (world() >= 4) {  // the test can tell the rounding apart: a bf16 sum per step differs
    std::vector<bfloat16> seq = rough(0);
    for (int q = 1; q < world(); ++q) {
      const std::vector<bfloat16> x = rough(q);
      for (std::int64_t i = 0; i < n; ++i)
        seq[i] = bfloat16::from(seq[i].to_float() + x[i].to_float());
    }
    EXPECT_NE(got, seq);
  }
}

// ---- send / recv between processes --------------------------------------------------------

TEST(MpiSendRecv, RingInAGroupAndSeveralSendsInOrder) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
  const int n = world(), next = (me() + 1) % n, prev = (me() + n - 1) % n;
  const std::int64_t len = 9;
  auto block = [&](int src, int k) {
    std::vector<bfloat16> v;
    for (std::int64_t j = 0; j < len; ++j) v.push_back(bfloat16::from(src * 100 + k * 10 + j));
    return v;
  };
  Tensor out = make(block(me(), 0));
  Tensor in = make(std::vector<bfloat16>(static_cast<std::size_t>(len)));
  group_start();
  c.send(out, next);
  c.recv(in, prev);
  group_end();
  EXPECT_EQ(values<bfloat16>(in), block(prev, 0));
  // Three sends to the same peer in one group arrive in order (the k-th with the k-th recv).
  std::vector<Tensor> outs, ins;
  group_start();
  for (int k = 0; k < 3; ++k) {
    outs.push_back(make(block(me(), k)));
    ins.push_back(make(std::vector<bfloat16>(static_cast<std::size_t>(len))));
    c.send(outs.back(), next);
  }
  for (int k = 0; k < 3; ++k) c.recv(ins[k], prev);
  group_end();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(values<bfloat16>(ins[k]), block(prev, k)) << "k " << k;
  // Outside a group: rank 0 sends first, the others receive first, so the chain does not close.
  if (n >= 2) {
    Tensor x = make(std::vector<std::int8_t>{static_cast<std::int8_t>(me()), -1, 7});
    Tensor y = make(std::vector<std::int8_t>(3));
    if (me() == 0) {
      c.send(x, next);
      c.recv(y, prev);
    } else {
      c.recv(y, prev);
      c.send(x, next);
    }
    EXPECT_EQ(values<std::int8_t>(y),
              (std::vector<std::int8_t>{static_cast<std::int8_t>(prev), -1, 7}));
  }
}

TEST(MpiSendRecv, MismatchFailsBothSidesThenTheCommunicatorGoesOn) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
  const std::string want =
      "send/recv: rank 0 sends 5 elements of f32 to rank 1, but rank 1 receives 4 elements of "
      "bf16 from rank 0 (point-to-point #1 from rank 0 to rank 1; a send and its recv must have "
      "the same count and dtype)";
  const Tensor five = make(std::vector<float>(5, 1.0f));
  if (me() == 0) {
    c.send(five, 1);
    expect_error<InvalidArgument>([&] { c.stream().synchronize(); }, want);
  } else if (me() == 1) {
    Tensor t = make(std::vector<bfloat16>(4));
    c.recv(t, 0);
    expect_error<InvalidArgument>([&] { c.stream().synchronize(); }, want);
  }
  // Position 1 is used up; #2 matches.
  Tensor a = make(std::vector<float>{3.0f, 4.0f});
  if (me() == 0) c.send(a, 1);
  if (me() == 1) c.recv(a, 0);
  c.stream().synchronize();
  EXPECT_EQ(values<float>(a), (std::vector<float>{3.0f, 4.0f}));
}

TEST(MpiSendRecv, SendWithoutRecvTimesOutNamingBothRanks) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  {  // the ranks arrive together, so the short timeout below is not spent in init_rank
    Communicator aligned = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
    aligned.barrier();
    aligned.stream().synchronize();
  }
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast, 500));
  const Tensor three = make(std::vector<float>(3, 1.0f));
  if (me() == 0) {
    c.send(three, 1);
    expect_error<Timeout>([&] { c.stream().synchronize(); },
                          "send (point-to-point #1 from rank 0 to rank 1): rank 1 did not post "
                          "the matching recv from rank 0 within 500 ms");
    expect_error<BackendError>([&] { c.send(three, 1); },
                               "communicator aborted by an earlier error");
  }
}

// A rank that aborts (another thread of its process, as DDP's failing rank does) ends its own
// waiting recv at once, naming the call and the reason.
TEST(MpiSendRecv, AbortEndsAWaitingRecvAtOnce) {
  if (world() < 2) GTEST_SKIP() << "needs 2 ranks";
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
  if (me() != 0) return;  // rank 1 never sends
  Tensor t = make(std::vector<float>(4));
  c.recv(t, 1);
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    c.abort("boom in rank 0");
  });
  // (the 60 s timeout would say "did not post the matching send" instead)
  expect_error<PeerFailure>([&] { c.stream().synchronize(); },
                            "recv (point-to-point #1 from rank 1 to rank 0): rank 0 failed: boom "
                            "in rank 0");
  killer.join();
}

TEST(MpiSendRecv, PeerOutOfRange) {
  Communicator c = Communicator::init_rank(kLocal, world(), me(), opts(Determinism::fast));
  expect_error<InvalidArgument>([&] { c.send(make(std::vector<float>(1)), world()); },
                                "Communicator::send: peer: expected a rank in [0, " +
                                    std::to_string(world()) + "), got " + std::to_string(world()));
}

}  // namespace
}  // namespace ditto
