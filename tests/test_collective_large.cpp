// The simulator's collectives on buffers large enough for the streaming-store path (Note
// [Streaming stores] in backend_sim/sim_communicator.cpp: more than 4 MiB written per call) and
// on views that start off a vector boundary, so the unaligned head and tail of each stored block
// are exercised: every element of every rank's result is compared with a host reference, bit for
// bit (bitwise mode against the canonical tree; fast mode on inputs whose sums are exact).
// Also: min / max propagate NaN and prod multiplies, through the per-op vectorised loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/comm/communicator.h"
#include "core/numerics/determinism.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CollectiveLargeTest = SimSuite<8, std::size_t(1) << 30>;

// Values of widely different magnitudes: a different reduction order changes the bits.
float mixed(int r, std::int64_t i) { return mixed_rank_value(r, i, 777u); }
// What a receive buffer holds before the call (no input takes this value).
float stale(int, std::int64_t) { return -7.25f; }
// Small multiples of 0.5: sums over up to 8 ranks are exact in any order.
float exact(int r, std::int64_t i) { return static_cast<float>((r * 5 + i * 3) % 11 - 5) * 0.5f; }

float mixed_cached(int r, std::int64_t i);
float host_tree(int lo, int hi, std::int64_t i) { return test::host_tree(lo, hi, i, mixed_cached); }

// A 1-dim f32 tensor of `count` elements that starts `skew` elements into its buffer (a view of
// a larger tensor), filled with f(r, i).
template <typename F>
Tensor skewed(std::int64_t count, std::int64_t skew, const Device& d, int r, F f) {
  std::vector<float> v(static_cast<std::size_t>(count + skew), -1.0f);
  for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(skew + i)] = f(r, i);
  return Tensor::from_vector(v, {count + skew}, d).narrow(skew, count);
}

// 1 M + 3 elements (4 MiB + 12 B per rank): every collective below writes more than 4 MiB.
constexpr std::int64_t kLargeCount = (std::int64_t(1) << 20) + 3;

// mixed(r, i) for r < 4, i < kLargeCount, computed once.
const std::vector<std::vector<float>>& mixed_table() {
  static const std::vector<std::vector<float>> t = [] {
    std::vector<std::vector<float>> v(4, std::vector<float>(static_cast<std::size_t>(kLargeCount)));
    for (int r = 0; r < 4; ++r)
      for (std::int64_t i = 0; i < kLargeCount; ++i)
        v[r][static_cast<std::size_t>(i)] = mixed(r, i);
    return v;
  }();
  return t;
}
float mixed_cached(int r, std::int64_t i) { return mixed_table()[r][static_cast<std::size_t>(i)]; }

TEST_F(CollectiveLargeTest, AllReduceReduceAndReduceScatterMatchTheCanonicalTreeBitForBit) {
  const int n = 4;
  CommOptions o;
  o.determinism = Determinism::bitwise;
  auto comms = Communicator::init_all(devices("sim", n), o);
  std::vector<float> tree(static_cast<std::size_t>(kLargeCount));
  int differ = 0;
  for (std::int64_t i = 0; i < kLargeCount; ++i) {
    tree[i] = host_tree(0, n, i);
    float left = mixed_cached(0, i);
    for (int r = 1; r < n; ++r) left = left + mixed_cached(r, i);
    differ += bits(left) != bits(tree[i]);
  }
  ASSERT_GT(differ, 1000) << "inputs do not tell the tree from a left-to-right sum";
  for (bool in_place : {false, true}) {
    SCOPED_TRACE(in_place ? "in place" : "out of place");
    std::vector<Tensor> send, recv, red_send, red_recv, rs_send, rs_recv;
    for (int r = 0; r < n; ++r) {
      const Device d = comms[r].device();
      send.push_back(skewed(kLargeCount, 1, d, r, mixed_cached));
      recv.push_back(in_place ? send[r] : skewed(kLargeCount, 3, d, r, exact));
      red_send.push_back(skewed(kLargeCount, 2, d, r, mixed_cached));
      red_recv.push_back(in_place ? red_send[r] : Tensor::zeros({kLargeCount}, DType::f32, d));
      // reduce_scatter: block b of rank r's send holds mixed(r, i) for its elements i.
      rs_send.push_back(skewed(n * kLargeCount, 1, d, r, [](int q, std::int64_t i) {
        return mixed_cached(q, i % kLargeCount);
      }));
      rs_recv.push_back(in_place ? rs_send[r].narrow(r * kLargeCount, kLargeCount)
                                 : skewed(kLargeCount, 1, d, r, exact));
    }
    all_reduce(comms, send, recv);
    reduce(comms, red_send, red_recv, ReduceOp::sum, 2);
    reduce_scatter(comms, rs_send, rs_recv);
    synchronize(comms);
    for (int r = 0; r < n; ++r) {
      const auto got = recv[r].to_vector<float>();
      const auto got_rs = rs_recv[r].to_vector<float>();
      for (std::int64_t i = 0; i < kLargeCount; ++i) {
        ASSERT_EQ(bits(got[i]), bits(tree[i])) << "all_reduce rank " << r << " element " << i;
        ASSERT_EQ(bits(got_rs[i]), bits(tree[i]))
            << "reduce_scatter rank " << r << " element " << i;
      }
    }
    const auto got = red_recv[2].to_vector<float>();
    for (std::int64_t i = 0; i < kLargeCount; ++i)
      ASSERT_EQ(bits(got[i]), bits(tree[i])) << "reduce " << i;
  }
}

TEST_F(CollectiveLargeTest, BroadcastAndAllGatherCopyEveryElementOutOfPlaceAndInPlace) {
  for (int n : {2, 3, 8}) {
    SCOPED_TRACE(detail::cat(n, " ranks"));
    auto comms = Communicator::init_all(devices("sim", n));
    const std::int64_t per = kLargeCount / n + 5;  // all_gather: per rank
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "out of place");
      std::vector<Tensor> bsend, brecv, gsend, grecv;
      for (int r = 0; r < n; ++r) {
        const Device d = comms[r].device();
        bsend.push_back(skewed(kLargeCount, 1, d, r, exact));
        brecv.push_back(in_place ? bsend[r] : skewed(kLargeCount, 3, d, r, stale));
        grecv.push_back(skewed(n * per, 1, d, r, stale));
        gsend.push_back(in_place ? grecv[r].narrow(r * per, per) : skewed(per, 2, d, r, exact));
        if (in_place)
          gsend[r].copy_(Tensor::from_vector(
              [&] {
                std::vector<float> v(static_cast<std::size_t>(per));
                for (std::int64_t i = 0; i < per; ++i) v[i] = exact(r, i);
                return v;
              }(),
              {per}));
      }
      const int root = n - 1;
      if (in_place) {
        broadcast(comms, bsend, root);
      } else {
        for (int r = 0; r < n; ++r) comms[r].broadcast(bsend[r], brecv[r], root);
      }
      all_gather(comms, gsend, grecv);
      synchronize(comms);
      for (int r = 0; r < n; ++r) {
        const auto b = brecv[r].to_vector<float>();
        for (std::int64_t i = 0; i < kLargeCount; ++i)
          ASSERT_EQ(b[i], exact(root, i)) << "broadcast rank " << r << " element " << i;
        const auto g = grecv[r].to_vector<float>();
        for (std::int64_t i = 0; i < n * per; ++i)
          ASSERT_EQ(g[i], exact(static_cast<int>(i / per), i % per))
              << "all_gather rank " << r << " element " << i;
      }
    }
  }
}

TEST_F(CollectiveLargeTest, FastAllReduceOfEveryOpMatchesTheHostAndMinMaxPropagateNan) {
  const int n = 3;
  auto comms = Communicator::init_all(devices("sim", n));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // NaN on rank 1 at every 1000th element (inside vector lanes and in the unaligned tails).
  auto value = [&](int r, std::int64_t i) {
    return r == 1 && i % 1000 == 7 ? nan : exact(r, i) + 3.0f;
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
    SCOPED_TRACE(reduce_op_name(op));
    std::vector<Tensor> send, recv;
    for (int r = 0; r < n; ++r) {
      send.push_back(skewed(kLargeCount, 1, comms[r].device(), r, value));
      recv.push_back(Tensor::zeros({kLargeCount}, DType::f32, comms[r].device()));
    }
    all_reduce(comms, send, recv, op);
    synchronize(comms);
    for (int r = 0; r < n; ++r) {
      const auto got = recv[r].to_vector<float>();
      for (std::int64_t i = 0; i < kLargeCount; ++i) {
        const float a = value(0, i), b = value(1, i), c = value(2, i);
        if (std::isnan(b)) {
          ASSERT_TRUE(std::isnan(got[i])) << "rank " << r << " element " << i;
          continue;
        }
        float want = 0;
        switch (op) {
          case ReduceOp::sum: want = (a + b) + c; break;
          case ReduceOp::avg: want = ((a + b) + c) / 3.0f; break;
          case ReduceOp::prod: want = (a * b) * c; break;
          case ReduceOp::min: want = std::min(std::min(a, b), c); break;
          case ReduceOp::max: want = std::max(std::max(a, b), c); break;
          case ReduceOp::premul_sum: FAIL() << "premul_sum is not in this test's ops";
        }
        ASSERT_EQ(bits(got[i]), bits(want)) << "rank " << r << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ditto
