// The new collectives on the simulator (all_to_all, all_to_all_v, gather, scatter) moving the
// exact bytes of every dtype, single controller and SPMD; premul_sum (a scalar per rank) and
// avg on integers (NCCL's wrapped sum, truncating division); the f16 / bf16 rule (the sum
// accumulates in f32 and rounds once); the cost model's new kinds. The full collective x dtype x
// op x ranks matrix is tests/test_coll_matrix*.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "backend_sim/cost_model.h"
#include "backend_sim/sim_backend.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CollBasic = SimSuite<8>;

// ---- raw tensors: every dtype as bytes (copies must move them exactly) --------------------------

// The test byte of element i, byte b of rank r's send buffer (never 0).
unsigned char pattern(int r, std::int64_t i, std::size_t b) {
  return static_cast<unsigned char>(1 + (r * 53 + i * 7 + static_cast<std::int64_t>(b) * 31) % 251);
}

Tensor from_bytes(const std::vector<unsigned char>& bytes, DType dtype, const Device& d) {
  const auto n = static_cast<std::int64_t>(bytes.size() / dtype_size(dtype));
  Tensor host = Tensor::empty({n}, dtype, Device::cpu());
  if (!bytes.empty()) std::memcpy(host.data_ptr(), bytes.data(), bytes.size());
  return host.to(d);
}

// Rank r's n elements of `dtype`, element i holding pattern(r, first + i, .).
std::vector<unsigned char> rank_bytes(int r, std::int64_t first, std::int64_t n, DType dtype) {
  const std::size_t e = dtype_size(dtype);
  std::vector<unsigned char> v(static_cast<std::size_t>(n) * e);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::size_t b = 0; b < e; ++b)
      v[static_cast<std::size_t>(i) * e + b] = pattern(r, first + i, b);
  return v;
}

template <typename T>
Tensor typed(const std::vector<T>& v, const Device& d) {
  std::vector<unsigned char> bytes(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  return from_bytes(bytes, dtype_of<T>(), d);
}
template <typename T>
std::vector<T> values(const Tensor& t) {
  const std::vector<unsigned char> b = tensor_bytes(t);
  std::vector<T> v(b.size() / sizeof(T));
  if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Runs a collective: its single-controller form over every rank (`all`), then synchronises; or
// per_rank(r) from a thread per rank (SPMD, issue_ranks).
void run_collective(std::vector<Communicator>& comms, bool spmd, const std::function<void()>& all,
                    const std::function<void(int)>& per_rank) {
  if (spmd) {
    issue_ranks(comms, true, per_rank);
  } else {
    all();
    synchronize(comms);
  }
}

// ---- all_to_all
// -----------------------------------------------------------------------------------

void check_all_to_all(int n, DType dtype, std::int64_t block, bool spmd, bool free_form) {
  SCOPED_TRACE(detail::cat(n, " ranks, ", dtype_name(dtype), ", block ", block,
                           spmd        ? ", spmd"
                           : free_form ? ", free function"
                                       : ", group"));
  auto comms = Communicator::init_all(devices("sim", n));
  std::vector<Tensor> send, recv;
  const std::size_t e = dtype_size(dtype);
  for (int r = 0; r < n; ++r) {
    send.push_back(from_bytes(rank_bytes(r, 0, n * block, dtype), dtype, comms[r].device()));
    recv.push_back(
        from_bytes(std::vector<unsigned char>(n * block * e, 0), dtype, comms[r].device()));
  }
  if (free_form) {
    all_to_all(comms, send, recv);
    synchronize(comms);
  } else {
    issue_ranks(comms, spmd, [&](int r) { comms[r].all_to_all(send[r], recv[r]); });
  }
  // Block q of rank r's recv is block r of rank q's send.
  for (int r = 0; r < n; ++r) {
    std::vector<unsigned char> expected;
    for (int q = 0; q < n; ++q) {
      const std::vector<unsigned char> b = rank_bytes(q, r * block, block, dtype);
      expected.insert(expected.end(), b.begin(), b.end());
    }
    EXPECT_EQ(tensor_bytes(recv[r]), expected) << "rank " << r;
  }
}

TEST_F(CollBasic, AllToAllMovesBlockQOfEveryRankToRankQForEveryDtype) {
  for (DType dtype : kAllDTypes) check_all_to_all(3, dtype, 5, false, false);
  for (int n : {1, 2, 4, 8}) check_all_to_all(n, DType::bf16, 3, false, true);
  check_all_to_all(4, DType::f64, 7, true, false);
  check_all_to_all(2, DType::i8, 0, false, true);  // empty blocks
}

// ---- all_to_all_v
// ---------------------------------------------------------------------------------

// Rank r sends (r + 2q) % 4 elements to rank q (some zero).
std::int64_t a2av_count(int r, int q) { return (r + 2 * q) % 4; }

TEST_F(CollBasic, AllToAllVPackedDeliversEachRanksCountsInRankOrder) {
  for (bool spmd : {false, true})
    for (DType dtype : {DType::f32, DType::bf16, DType::u64, DType::f8_e5m2}) {
      SCOPED_TRACE(detail::cat(dtype_name(dtype), spmd ? " spmd" : " group"));
      const int n = 3;
      auto comms = Communicator::init_all(devices("sim", n));
      std::vector<Tensor> send, recv;
      std::vector<std::vector<std::int64_t>> sc(n), rc(n);
      for (int r = 0; r < n; ++r) {
        std::int64_t total_s = 0, total_r = 0;
        for (int q = 0; q < n; ++q) {
          sc[r].push_back(a2av_count(r, q));
          rc[r].push_back(a2av_count(q, r));
          total_s += sc[r].back();
          total_r += rc[r].back();
        }
        send.push_back(from_bytes(rank_bytes(r, 0, total_s, dtype), dtype, comms[r].device()));
        recv.push_back(from_bytes(std::vector<unsigned char>(total_r * dtype_size(dtype), 0), dtype,
                                  comms[r].device()));
      }
      run_collective(
          comms, spmd, [&] { all_to_all_v(comms, send, sc, recv, rc); },
          [&](int r) { comms[r].all_to_all_v(send[r], sc[r], recv[r], rc[r]); });
      for (int r = 0; r < n; ++r) {
        std::vector<unsigned char> expected;
        for (int q = 0; q < n; ++q) {
          std::int64_t first = 0;  // where rank q's block for r starts in q's send
          for (int p = 0; p < r; ++p) first += a2av_count(q, p);
          const auto b = rank_bytes(q, first, a2av_count(q, r), dtype);
          expected.insert(expected.end(), b.begin(), b.end());
        }
        EXPECT_EQ(tensor_bytes(recv[r]), expected) << "rank " << r;
      }
    }
}

TEST_F(CollBasic, AllToAllVWithDisplacementsLeavesTheGapsAlone) {
  // 2 ranks; rank r sends 2 elements to each rank from the end of its send backwards, and places
  // what it receives from rank q at element 1 + 4q (gaps keep their -1).
  auto comms = Communicator::init_all(devices("sim", 2));
  std::vector<Tensor> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.push_back(typed<std::int32_t>({10 * r + 0, 10 * r + 1, 10 * r + 2, 10 * r + 3, 10 * r + 4},
                                       comms[r].device()));
    recv.push_back(typed<std::int32_t>(std::vector<std::int32_t>(8, -1), comms[r].device()));
  }
  issue_ranks(comms, false, [&](int r) {
    comms[r].all_to_all_v(send[r], {2, 2}, {3, 1}, recv[r], {2, 2}, {1, 5});
  });
  // From rank 0: its elements [3, 5) for rank 0 and [1, 3) for rank 1; likewise from rank 1.
  EXPECT_EQ(values<std::int32_t>(recv[0]),
            (std::vector<std::int32_t>{-1, 3, 4, -1, -1, 13, 14, -1}));
  EXPECT_EQ(values<std::int32_t>(recv[1]),
            (std::vector<std::int32_t>{-1, 1, 2, -1, -1, 11, 12, -1}));
}

// ---- gather / scatter
// -------------------------------------------------------------------------------

// One rooted case: n ranks' handles and an undefined send and recv tensor for each, to fill.
struct RootedCase {
  int n, root;
  bool in_place, spmd;
  std::vector<Communicator> comms;
  std::vector<Tensor> send, recv;
};

// Runs `check` on every rooted case: 1, 3 and 4 ranks, the first and last root, in and out of
// place, single controller and SPMD.
void for_each_rooted_case(const std::function<void(RootedCase&)>& check) {
  for (int n : {1, 3, 4})
    for (int root : {0, n - 1})
      for (bool in_place : {false, true})
        for (bool spmd : {false, true}) {
          SCOPED_TRACE(detail::cat(n, " ranks, root ", root, in_place ? " in place" : "",
                                   spmd ? " spmd" : " group"));
          RootedCase c{n, root, in_place, spmd, Communicator::init_all(devices("sim", n)), {}, {}};
          c.send.resize(n);
          c.recv.resize(n);
          check(c);
        }
}

TEST_F(CollBasic, GatherCollectsEveryRankOnTheRootInRankOrder) {
  for_each_rooted_case([](RootedCase& c) {
    const DType dtype = DType::f16;
    const std::int64_t k = 6;
    c.recv[c.root] =
        from_bytes(std::vector<unsigned char>(c.n * k * 2, 0), dtype, c.comms[c.root].device());
    std::vector<unsigned char> expected;  // every rank's send, in rank order
    for (int r = 0; r < c.n; ++r) {
      const auto b = rank_bytes(r, 0, k, dtype);
      expected.insert(expected.end(), b.begin(), b.end());
      if (c.in_place && r == c.root) {  // the root's send is its block of recv
        c.send[r] = c.recv[r].narrow(r * k, k);
        c.send[r].copy_(from_bytes(b, dtype, c.comms[r].device()));
      } else {
        c.send[r] = from_bytes(b, dtype, c.comms[r].device());
      }
    }
    run_collective(
        c.comms, c.spmd, [&] { gather(c.comms, c.send, c.recv, c.root); },
        [&](int r) { c.comms[r].gather(c.send[r], c.recv[r], c.root); });
    EXPECT_EQ(tensor_bytes(c.recv[c.root]), expected);
  });
}

TEST_F(CollBasic, ScatterSendsBlockQOfTheRootToRankQ) {
  for_each_rooted_case([](RootedCase& c) {
    const DType dtype = DType::u32;
    const std::int64_t k = 5;
    c.send[c.root] =
        from_bytes(rank_bytes(c.root, 0, c.n * k, dtype), dtype, c.comms[c.root].device());
    for (int r = 0; r < c.n; ++r)
      c.recv[r] = c.in_place && r == c.root ? c.send[r].narrow(r * k, k)
                                            : from_bytes(std::vector<unsigned char>(k * 4, 0),
                                                         dtype, c.comms[r].device());
    run_collective(
        c.comms, c.spmd, [&] { scatter(c.comms, c.send, c.recv, c.root); },
        [&](int r) { c.comms[r].scatter(c.send[r], c.recv[r], c.root); });
    for (int r = 0; r < c.n; ++r)
      EXPECT_EQ(tensor_bytes(c.recv[r]), rank_bytes(c.root, r * k, k, dtype)) << "rank " << r;
  });
}

// ---- premul_sum and integer avg
// ---------------------------------------------------------------------

TEST_F(CollBasic, PreMulSumScalesEachRanksValuesByItsOwnScalar) {
  const std::vector<PreMulSum> ops = {{0.5}, {0.25}, {2.0}};
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    CommOptions o;
    o.determinism = mode;
    auto comms = Communicator::init_all(devices("sim", 3), o);
    // f32: 0.5 * 4 + 0.25 * 8 + 2 * 1 = 6 (exact), element-wise.
    std::vector<Tensor> send, recv;
    for (int r = 0; r < 3; ++r) {
      const float x = r == 0 ? 4.0f : r == 1 ? 8.0f : 1.0f;
      send.push_back(typed<float>({x, -x, 0.0f}, comms[r].device()));
      recv.push_back(typed<float>({0, 0, 0}, comms[r].device()));
    }
    all_reduce(comms, send, recv, ops);
    synchronize(comms);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(values<float>(recv[r]), (std::vector<float>{6.0f, -6.0f, 0.0f}));

    // i32 with integral scalars 3, -1, 2 and wrap-around: 3 * 2^30 wraps.
    std::vector<Tensor> isend, irecv;
    for (int r = 0; r < 3; ++r) {
      isend.push_back(typed<std::int32_t>({r == 0 ? (1 << 30) : 0, r + 1}, comms[r].device()));
      irecv.push_back(typed<std::int32_t>({0, 0}, comms[r].device()));
    }
    issue_ranks(comms, true, [&](int r) {
      comms[r].all_reduce(isend[r], irecv[r], PreMulSum{r == 0 ? 3.0 : r == 1 ? -1.0 : 2.0});
    });
    const std::int32_t wrapped = static_cast<std::int32_t>(std::uint32_t(3) << 30);
    for (int r = 0; r < 3; ++r)
      EXPECT_EQ(values<std::int32_t>(irecv[r]),
                (std::vector<std::int32_t>{wrapped, 3 * 1 - 2 + 2 * 3}));

    // reduce (root 1) and reduce_scatter (free function) with the same scalars.
    std::vector<Tensor> big, part;
    for (int r = 0; r < 3; ++r) {
      big.push_back(typed<double>({1.0 * (r + 1), 10.0, 100.0}, comms[r].device()));
      part.push_back(typed<double>({0.0}, comms[r].device()));
    }
    Tensor root_out = typed<double>({0, 0, 0}, comms[1].device());
    issue_ranks(comms, false, [&](int r) {
      Tensor out = r == 1 ? root_out : Tensor();
      comms[r].reduce(big[r], out, ops[r], 1);
    });
    EXPECT_EQ(values<double>(root_out), (std::vector<double>{0.5 + 0.5 + 6.0, 27.5, 275.0}));
    reduce_scatter(comms, big, part, ops);
    synchronize(comms);
    EXPECT_EQ(values<double>(part[0]), (std::vector<double>{7.0}));
    EXPECT_EQ(values<double>(part[1]), (std::vector<double>{27.5}));
    EXPECT_EQ(values<double>(part[2]), (std::vector<double>{275.0}));
  }
}

TEST_F(CollBasic, IntegerAvgIsTheWrappedSumDividedWithTruncation) {
  auto comms = Communicator::init_all(devices("sim", 2));
  // i32: (-7 + 0) / 2 = -3 (toward zero), (7 + 0) / 2 = 3, (-1 + -2) / 2 = -1.
  std::vector<Tensor> a = {typed<std::int32_t>({-7, 7, -1}, comms[0].device()),
                           typed<std::int32_t>({0, 0, -2}, comms[1].device())};
  all_reduce(comms, a, ReduceOp::avg);
  synchronize(comms);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(values<std::int32_t>(a[r]), (std::vector<std::int32_t>{-3, 3, -1}));
  // u8: 200 + 100 wraps to 44 before the division: 22 (NCCL's FuncSumPostDiv), not 150.
  std::vector<Tensor> b = {typed<std::uint8_t>({200, 9}, comms[0].device()),
                           typed<std::uint8_t>({100, 0}, comms[1].device())};
  all_reduce(comms, b, ReduceOp::avg);
  synchronize(comms);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(values<std::uint8_t>(b[r]), (std::vector<std::uint8_t>{22, 4}));
  // i64 avg (refused before issue 13).
  std::vector<Tensor> c = {typed<std::int64_t>({-(std::int64_t(1) << 40) - 1}, comms[0].device()),
                           typed<std::int64_t>({0}, comms[1].device())};
  all_reduce(comms, c, ReduceOp::avg);
  synchronize(comms);
  EXPECT_EQ(values<std::int64_t>(c[1]), (std::vector<std::int64_t>{-(std::int64_t(1) << 39)}));
}

TEST_F(CollBasic, Bf16SumAccumulatesInF32AndRoundsOnce) {
  // 1 + 3 * 2^-9: per-step rounding to bf16 (8 significant bits) loses every 2^-9 (1 + 2^-9 is
  // below half an ulp of 1), one rounding at the end gives 1 + 2^-7 (the nearest bf16).
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    CommOptions o;
    o.determinism = mode;
    auto comms = Communicator::init_all(devices("sim", 4), o);
    std::vector<Tensor> t;
    for (int r = 0; r < 4; ++r)
      t.push_back(
          typed<bfloat16>({bfloat16::from(r == 0 ? 1.0f : 0.001953125f)}, comms[r].device()));
    all_reduce(comms, t);
    synchronize(comms);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(values<bfloat16>(t[r])[0].bits, 0x3F81) << "rank " << r;
    float stepwise = 1.0f;
    for (int q = 1; q < 4; ++q) stepwise = bfloat16::from(stepwise + 0.001953125f).to_float();
    EXPECT_EQ(stepwise, 1.0f);  // the per-step rule would give other bits
  }
}

// ---- virtual time of the new kinds
// --------------------------------------------------------------------

TEST(CollCost, NewKindsFollowTheirAlphaBetaFormulas) {
  const sim::ClusterSpec c{sim::device_profile("h100-sxm"), sim::interconnect_profile("nvlink"), 1,
                           8};
  const double S = 8 * 1048576.0, a = 6.6e-6, h = 0.6e-6, B = 18 * 20.6e9;
  const std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  for (CollectiveKind k : {CollectiveKind::all_to_all, CollectiveKind::all_to_all_v,
                           CollectiveKind::gather, CollectiveKind::scatter}) {
    const sim::CollectiveEstimate e = sim::collective_time(c, k, S, eight);
    EXPECT_NEAR(e.seconds, a + 7 * h + 7.0 / 8 * S / B, 1e-12) << collective_name(k);
    EXPECT_EQ(e.algo, sim::CollectiveAlgo::p2p);
    EXPECT_DOUBLE_EQ(sim::busbw_factor(k, 8), 0.875);
  }
  EXPECT_NEAR(sim::collective_time(c, CollectiveKind::send, S, {2, 5}).seconds, a + h + S / B,
              1e-12);
  EXPECT_DOUBLE_EQ(sim::busbw_factor(CollectiveKind::send, 2), 1.0);
  // To itself: a copy inside the device (read + write at memory bandwidth).
  const sim::CollectiveEstimate self = sim::collective_time(c, CollectiveKind::send, S, {3, 3});
  EXPECT_EQ(self.algo, sim::CollectiveAlgo::local);
  EXPECT_DOUBLE_EQ(self.seconds, sim::collective_time(c, CollectiveKind::send, S, {3}).seconds);
  EXPECT_NEAR(self.seconds, c.device.launch_latency + 2 * S / c.device.memory_bandwidth, 1e-15);
  // Across nodes a send pays the network's latency and NIC bandwidth.
  const sim::ClusterSpec c2{c.device, c.interconnect, 2, 8};
  EXPECT_NEAR(sim::collective_time(c2, CollectiveKind::recv, S, {0, 9}).seconds,
              a + 2.7e-6 + S / std::min(B, 48e9), 1e-12);
}

TEST(CollCost, AllToAllOnTheSimulatorAdvancesEveryClockByTheEstimate) {
  BackendOptions opts;
  opts.device_count = 4;
  auto& be = *init_backend("sim", opts).extension<sim::SimBackend>();
  auto comms = Communicator::init_all(devices("sim", 4));
  std::vector<Tensor> send, recv;
  const std::int64_t n = 4 * 1024;
  for (int r = 0; r < 4; ++r) {
    send.push_back(Tensor::empty({n}, DType::bf16, comms[r].device()));
    recv.push_back(Tensor::empty({n}, DType::bf16, comms[r].device()));
  }
  synchronize(comms);
  const sim::CostTotals t0 = be.cost_model().totals();
  all_to_all(comms, send, recv);
  synchronize(comms);
  const sim::CostTotals t1 = be.cost_model().totals();
  const sim::CollectiveEstimate e = sim::collective_time(
      be.cost_model().cluster(), CollectiveKind::all_to_all, 2.0 * n, {0, 1, 2, 3});
  for (int d = 0; d < 4; ++d) EXPECT_EQ(t1.comm[d] - t0.comm[d], sim::to_vtime(e.seconds));
}

}  // namespace
}  // namespace ditto
