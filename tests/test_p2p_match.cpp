// core/backend_api/p2p_match.h: point-to-point matching per ordered pair by position and the
// messages every backend gives (Note [Point-to-point matching]).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend_api/p2p_match.h"

namespace ditto {
namespace {

using detail::CollectiveCall;
using detail::P2PMatcher;
using detail::P2PPair;
using Kind = CollectiveKind;

CollectiveCall p2p(Kind kind, int peer, std::int64_t count, DType dtype = DType::f32,
                   double tag = 0) {
  CollectiveCall c;
  c.kind = kind;
  c.peer = peer;
  c.count = count;
  c.dtype = dtype;
  c.scalar = tag;  // marks the call, to see which ones were paired
  return c;
}

TEST(P2PMatch, PairsTheKthSendWithTheKthRecvOfTheSamePair) {
  P2PMatcher<> m(4);
  // Rank 1 sends three messages to rank 2 before rank 2 posts anything.
  for (int i = 0; i < 3; ++i) {
    auto p = m.post(1, p2p(Kind::send, 2, 10 + i, DType::f32, 100 + i));
    EXPECT_FALSE(p.match);
    EXPECT_EQ(p.seq, static_cast<std::uint64_t>(i + 1));
    EXPECT_EQ(p.pair, (P2PPair{1, 2}));
  }
  // A recv on rank 2 from rank 3 is another pair: no match.
  EXPECT_FALSE(m.post(2, p2p(Kind::recv, 3, 10)).match);
  EXPECT_EQ(m.waiting(), 4u);
  for (int i = 0; i < 3; ++i) {
    auto p = m.post(2, p2p(Kind::recv, 1, 10 + i, DType::f32, 200 + i));
    ASSERT_TRUE(p.match);
    EXPECT_EQ(p.seq, static_cast<std::uint64_t>(i + 1));
    EXPECT_EQ(p.match->send.scalar, 100 + i);
    EXPECT_EQ(p.match->recv.scalar, 200 + i);
    EXPECT_EQ(p.match->pair, (P2PPair{1, 2}));
    EXPECT_TRUE(p.match->mismatch.empty()) << p.match->mismatch;
  }
  EXPECT_EQ(m.waiting(), 1u);
  // Recvs first, then the sends: the same positions.
  EXPECT_FALSE(m.post(3, p2p(Kind::recv, 0, 5, DType::bf16, 1)).match);
  EXPECT_FALSE(m.post(3, p2p(Kind::recv, 0, 6, DType::bf16, 2)).match);
  auto a = m.post(0, p2p(Kind::send, 3, 5, DType::bf16, 3));
  ASSERT_TRUE(a.match);
  EXPECT_EQ(a.match->recv.scalar, 1);
  auto b = m.post(0, p2p(Kind::send, 3, 6, DType::bf16, 4));
  ASSERT_TRUE(b.match);
  EXPECT_EQ(b.match->recv.scalar, 2);
  EXPECT_EQ(b.seq, 2u);
}

TEST(P2PMatch, SelfSendIsThePairRankRank) {
  P2PMatcher<> m(2);
  auto s = m.post(1, p2p(Kind::send, 1, 4));
  EXPECT_FALSE(s.match);
  EXPECT_EQ(s.pair, (P2PPair{1, 1}));
  auto r = m.post(1, p2p(Kind::recv, 1, 4));
  ASSERT_TRUE(r.match);
  EXPECT_EQ(m.waiting(), 0u);
}

TEST(P2PMatch, MismatchUsesUpThePosition) {
  P2PMatcher<> m(8);
  m.post(5, p2p(Kind::send, 6, 12, DType::f32));
  auto bad = m.post(6, p2p(Kind::recv, 5, 12, DType::bf16));
  ASSERT_TRUE(bad.match);
  EXPECT_EQ(bad.match->mismatch,
            "send/recv: rank 5 sends 12 elements of f32 to rank 6, but rank 6 receives 12 "
            "elements of bf16 from rank 5 (point-to-point #1 from rank 5 to rank 6; a send and "
            "its recv must have the same count and dtype)");
  m.post(5, p2p(Kind::send, 6, 3));
  auto next = m.post(6, p2p(Kind::recv, 5, 4));
  ASSERT_TRUE(next.match);
  EXPECT_NE(next.match->mismatch.find("rank 5 sends 3 elements of f32 to rank 6, but rank 6 "
                                      "receives 4 elements of f32 from rank 5 (point-to-point #2"),
            std::string::npos)
      << next.match->mismatch;
}

TEST(P2PMatch, TimeoutReasonsNameBothRanks) {
  EXPECT_EQ(detail::p2p_timeout_reason(Kind::send, {0, 3}, 2, 200),
            "send (point-to-point #2 from rank 0 to rank 3): rank 3 did not post the matching "
            "recv from rank 0 within 200 ms");
  EXPECT_EQ(detail::p2p_timeout_reason(Kind::recv, {0, 3}, 1, 50),
            "recv (point-to-point #1 from rank 0 to rank 3): rank 0 did not post the matching "
            "send to rank 3 within 50 ms");
}

TEST(P2PMatch, TakeWaitingEmptiesTheMatcher) {
  P2PMatcher<> m(3);
  m.post(0, p2p(Kind::send, 1, 1));
  m.post(0, p2p(Kind::send, 1, 1));
  m.post(2, p2p(Kind::recv, 0, 1));
  int seen = 0;
  m.for_each_waiting([&](const auto&) { ++seen; });
  EXPECT_EQ(seen, 3);
  auto all = m.take_waiting();
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(m.waiting(), 0u);
  // Counters stay: the next recv on (0, 1) is position 1 and finds no waiting send.
  auto r = m.post(1, p2p(Kind::recv, 0, 1));
  EXPECT_FALSE(r.match);
  EXPECT_EQ(r.seq, 1u);
}

}  // namespace
}  // namespace ditto
