// Communicator::send / recv on the simulator (Note [Sim point-to-point],
// backend_sim/sim_communicator_p2p.h): ring exchanges in one group driven by one thread and by a
// thread per rank, several messages to one peer in order, a send to oneself, every dtype's bytes,
// count / dtype mismatches, timeouts naming both ranks, peers out of range, aborts, and virtual
// time.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using P2PTest = SimSuite<8>;

std::vector<Device> sim_devices(int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.emplace_back("sim", i);
  return d;
}

std::vector<Communicator> comms_of(int n, std::int64_t timeout_ms = 300000) {
  CommOptions o;
  o.timeout_ms = timeout_ms;
  return Communicator::init_all(sim_devices(n), o);
}

// A value only rank r's element i has: the ring tests see who sent what.
float tag(int r, std::int64_t i) { return static_cast<float>(1000 * r + i); }

std::vector<float> tags(int r, std::int64_t count) {
  std::vector<float> v;
  for (std::int64_t i = 0; i < count; ++i) v.push_back(tag(r, i));
  return v;
}

// Rank r's tags(r, count) on device sim:`on`.
Tensor tagged(int r, std::int64_t count, int on) {
  return Tensor::from_vector(tags(r, count), {count}, Device("sim", on));
}

// Zeros of `shape` and `dtype` on device sim:`on`.
Tensor zeros_on(int on, const Shape& shape, DType dtype = DType::f32) {
  return Tensor::zeros(shape, dtype, Device("sim", on));
}

// Once every stream ran: `recv` holds rank r's tags(r, recv.numel()).
void expect_tags_of(std::vector<Communicator>& comms, const Tensor& recv, int r) {
  synchronize(comms);
  EXPECT_EQ(recv.to_vector<float>(), tags(r, recv.numel()));
}

// comms[from].send(s, to) and comms[to].recv(r, from) in one group.
void send_recv_in_a_group(std::vector<Communicator>& comms, const Tensor& s, int from, Tensor& r,
                          int to) {
  group_start();
  comms[from].send(s, to);
  comms[to].recv(r, from);
  group_end();
}

// Each rank r sends `count` elements to r + 1 and receives from r - 1 (mod n) in one group:
// one thread for every rank, or a thread per rank. recv[r] then holds rank r - 1's tags.
void ring(std::vector<Communicator>& comms, std::int64_t count, bool thread_per_rank,
          std::vector<Tensor>& recv) {
  const int n = static_cast<int>(comms.size());
  std::vector<Tensor> send;
  recv.clear();
  for (int r = 0; r < n; ++r) {
    send.push_back(tagged(r, count, r));
    recv.push_back(zeros_on(r, {count}));
  }
  auto issue = [&](int r) {
    comms[r].send(send[r], (r + 1) % n);
    comms[r].recv(recv[r], (r + n - 1) % n);
  };
  issue_ranks(comms, thread_per_rank, issue, /*group_each_thread=*/true);
}

// Synchronises every rank, each expected to throw the same Timeout; returns its message.
std::string same_timeout_on_every_rank(std::vector<Communicator>& comms) {
  std::string first;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    try {
      comms[r].stream().synchronize();
      ADD_FAILURE() << "rank " << r << ": expected a Timeout";
    } catch (const Timeout& e) {
      if (first.empty()) first = e.what();
      EXPECT_EQ(first, e.what()) << "rank " << r;
    }
  }
  return first;
}

TEST_F(P2PTest, RingInOneGroupFromOneThread) {
  for (int n = 2; n <= 8; ++n) {
    auto comms = comms_of(n);
    std::vector<Tensor> recv;
    ring(comms, 37, false, recv);
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(recv[r].to_vector<float>(), tags((r + n - 1) % n, 37)) << n << " ranks, rank " << r;
  }
}

TEST_F(P2PTest, RingInOneGroupWithAThreadPerRank) {
  for (int n : {2, 3, 8}) {
    auto comms = comms_of(n);
    std::vector<Tensor> recv;
    for (int round = 0; round < 3; ++round) {  // positions go on counting per pair
      ring(comms, 64, true, recv);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(recv[r].to_vector<float>(), tags((r + n - 1) % n, 64))
            << n << " ranks, rank " << r << ", round " << round;
    }
  }
}

TEST_F(P2PTest, SeveralSendsToOnePeerArriveInOrderWithoutAGroup) {
  auto comms = comms_of(3);
  // Ungrouped: rank 0's sends block its stream one after the other until rank 2 posts the
  // recvs; no cycle, so it completes. Sizes differ: the k-th send meets the k-th recv.
  std::vector<Tensor> send, recv;
  for (int k = 0; k < 4; ++k) {
    send.push_back(tagged(k, k + 1, 0));
    recv.push_back(zeros_on(2, {k + 1}));
  }
  for (int k = 0; k < 4; ++k) comms[0].send(send[k], 2);
  for (int k = 0; k < 4; ++k) comms[2].recv(recv[k], 0);
  synchronize(comms);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(recv[k].to_vector<float>(), tags(k, k + 1)) << k;
}

TEST_F(P2PTest, PingPongWithoutAGroup) {
  auto comms = comms_of(2);
  Tensor a = tagged(0, 5, 0);
  Tensor b = zeros_on(1, {5});
  Tensor back = zeros_on(0, {5});
  comms[0].send(a, 1);
  comms[0].recv(back, 1);
  comms[1].recv(b, 0);
  comms[1].send(b, 0);
  expect_tags_of(comms, back, 0);
}

TEST_F(P2PTest, SendToItselfInAGroup) {
  auto comms = comms_of(2);
  Tensor a = tagged(1, 9, 1);
  Tensor b = zeros_on(1, {3, 3});
  send_recv_in_a_group(comms, a, 1, b, 1);
  expect_tags_of(comms, b, 1);
}

// Outside a group a send to oneself would wait for a recv that can only be issued after it (NCCL
// waits forever; the simulator timed out after the whole timeout, blaming a recv that was posted
// behind it): both calls are refused at once, naming the group they need, and nothing is enqueued.
TEST_F(P2PTest, SendToItselfWithoutAGroupIsRefusedAtOnce) {
  auto comms = comms_of(2, 200);
  Tensor a = zeros_on(1, {2});
  expect_invalid([&] { comms[1].send(a, 1); },
                 "Communicator::send: peer: rank 1 is this rank (sim:1 (rank 1 of 2)): a send to "
                 "itself needs its matching recv in the same group (group_start() ... group_end()");
  expect_invalid([&] { comms[1].recv(a, 1); },
                 "Communicator::recv: peer: rank 1 is this rank (sim:1 (rank 1 of 2)): a recv from "
                 "itself needs its matching send in the same group");
  EXPECT_NO_THROW(comms[1].stream().synchronize());
  // In a group the same pair runs (SendToItselfInAGroup), on new handles: each refusal above
  // aborted the communicator, as every per-rank refusal does (Note [Per-rank refusals abort]).
  comms = comms_of(2, 200);
  Tensor b = tagged(1, 2, 1);
  send_recv_in_a_group(comms, b, 1, a, 1);
  expect_tags_of(comms, a, 1);
}

// Note [Overlapping point-to-point buffers in a group] (communicator.cpp): tester D's in-place
// ring shift (send(t, r + 1) and recv(t, r - 1) in one group) raced, a different wrong result
// on every run; it is refused at the recv, naming the send, on the calling rank.
TEST_F(P2PTest, InPlaceRingShiftInAGroupIsRefused) {
  auto comms = comms_of(4, 2000);
  Tensor t = tagged(0, 2, 0);
  group_start();
  comms[0].send(t, 1);
  expect_invalid([&] { comms[0].recv(t, 3); },
                 "Communicator::recv: tensor: expected a tensor that does not overlap the send to "
                 "rank 1 earlier in this group on sim:0 (rank 0 of 4) (the sends and recvs of a "
                 "group run in no defined order, as NCCL's between ncclGroupStart and "
                 "ncclGroupEnd: the two would race), got [2] f32 on sim:0 sharing bytes [0, 8) of "
                 "that send's [2] f32 on sim:0");
  group_end();
  // The refusal aborted the communicator (Note [Per-rank refusals abort]): the send fails.
  EXPECT_THROW(comms[0].stream().synchronize(), PeerFailure);
}

// Part of a buffer, in either order (recv after send, send after recv), and two recvs into one
// buffer: each refused with the bytes they share; the tester's ring2 got 0 1 300 301 for 0 1 2 3.
TEST_F(P2PTest, PartlyOverlappingSendAndRecvOrTwoRecvsInAGroupAreRefused) {
  struct Case {
    bool send_first, both_recv;
    std::string message;
  };
  const std::vector<Case> cases = {
      {true, false,
       "Communicator::recv: tensor: expected a tensor that does not overlap the send to rank 0 "
       "earlier in this group on sim:1 (rank 1 of 2) (the sends and recvs of a group run in no "
       "defined order, as NCCL's between ncclGroupStart and ncclGroupEnd: the two would race), "
       "got [4] f32 on sim:1 sharing bytes [8, 16) of that send's [4] f32 on sim:1"},
      {false, false,
       "Communicator::send: tensor: expected a tensor that does not overlap the recv from rank 0 "
       "earlier in this group on sim:1 (rank 1 of 2)"},
      {false, true,
       "Communicator::recv: tensor: expected a tensor that does not overlap the recv from rank 0 "
       "earlier in this group on sim:1 (rank 1 of 2)"}};
  for (const Case& c : cases) {
    auto comms = comms_of(2, 2000);
    Tensor whole = tagged(1, 8, 1);
    Tensor first = whole.narrow(0, 4), second = whole.narrow(2, 4);
    group_start();
    if (c.both_recv) {
      comms[1].recv(first, 0);
      expect_invalid([&] { comms[1].recv(second, 0); }, c.message);
    } else if (c.send_first) {
      comms[1].send(first, 0);
      expect_invalid([&] { comms[1].recv(second, 0); }, c.message);
    } else {
      comms[1].recv(second, 0);
      expect_invalid([&] { comms[1].send(first, 0); }, c.message);
    }
    group_end();
    // The call enqueued before the refusal fails with the abort (its stream must not keep it).
    EXPECT_THROW(comms[1].stream().synchronize(), PeerFailure);
  }
}

// What stays allowed: disjoint views of one buffer (the tester's ring2 8, correct), one buffer
// sent to several peers (only read), and one buffer sent in one group and received into in the
// next (groups run in order). A thread per rank checks its own rank's calls in its own group.
TEST_F(P2PTest, DisjointViewsRepeatedSendsAndLaterGroupsRun) {
  auto comms = comms_of(3);
  std::vector<Tensor> buf;
  for (int r = 0; r < 3; ++r) buf.push_back(tagged(r, 8, r));
  std::vector<Tensor> got;
  for (int r = 0; r < 3; ++r) got.push_back(zeros_on(r, {4}));
  issue_ranks(
      comms, /*spmd=*/true,
      [&](int r) {
        Tensor lo = buf[r].narrow(0, 4), hi = buf[r].narrow(4, 4);
        comms[r].send(lo, (r + 1) % 3);
        comms[r].send(lo, (r + 2) % 3);  // the same bytes to the other peer too
        comms[r].recv(hi, (r + 2) % 3);
        comms[r].recv(got[r], (r + 1) % 3);
      },
      /*group_each_thread=*/true);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> expect = tags(r, 4), from = tags((r + 2) % 3, 4);
    expect.insert(expect.end(), from.begin(), from.end());
    EXPECT_EQ(buf[r].to_vector<float>(), expect) << "rank " << r;
    EXPECT_EQ(got[r].to_vector<float>(), tags((r + 1) % 3, 4)) << "rank " << r;
  }
  // Next group: the bytes rank 0 sent before are received into now.
  Tensor lo0 = buf[0].narrow(0, 4);
  Tensor from1 = tagged(1, 4, 1);
  send_recv_in_a_group(comms, from1, 1, lo0, 0);
  synchronize(comms);
  EXPECT_EQ(lo0.to_vector<float>(), tags(1, 4));
}

// SPMD: the refusal comes on the overlapping rank's own thread; the other rank, which called
// correctly, fails at once with a PeerFailure naming it.
TEST_F(P2PTest, OverlapIsRefusedOnItsOwnThreadInSpmd) {
  auto comms = comms_of(2, 5000);
  Tensor a = tagged(0, 3, 0), b = zeros_on(0, {3});
  Tensor t = tagged(1, 3, 1);
  std::string refusal;
  // Rank 1's refusal aborts the communicator (Note [Per-rank refusals abort]): rank 0 learns of it
  // at its next call, its group_end or its stream's synchronize, whichever comes first (a race
  // between the two threads); every one is caught and both streams drained, so that no error is
  // left on the streams for the next test.
  std::string failed[2];
  run_threads(2, [&](int r) {
    group_start();
    try {
      if (r == 0) {
        comms[0].send(a, 1);
        comms[0].recv(b, 1);
      } else {
        comms[1].send(t, 0);
        comms[1].recv(t, 0);
      }
    } catch (const InvalidArgument& e) {
      refusal = e.what();
    } catch (const Error& e) {  // rank 0's calls after rank 1's refusal aborted the communicator
      failed[r] = e.what();
    }
    try {
      group_end();
    } catch (const Error& e) {
      failed[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    try {
      comms[r].stream().synchronize();
    } catch (const PeerFailure& e) {
      if (failed[r].empty()) failed[r] = e.what();
    }
  }
  EXPECT_NE(refusal.find("Communicator::recv: tensor: expected a tensor that does not overlap "
                         "the send to rank 0 earlier in this group on sim:1 (rank 1 of 2)"),
            std::string::npos)
      << refusal;
  EXPECT_NE(failed[0].find("rank 1 failed: Communicator::recv: tensor"), std::string::npos)
      << failed[0];
  EXPECT_FALSE(failed[1].empty());  // its own send, aborted
}

TEST_F(P2PTest, PointToPointDoesNotCountAsACollective) {
  auto comms = comms_of(2);
  // Rank 0 makes three p2p calls, rank 1 one; then both all_reduce: the collectives still meet.
  Tensor x = tagged(0, 4, 0);
  Tensor y = zeros_on(1, {4});
  Tensor z = zeros_on(0, {4});
  group_start();
  comms[0].send(x, 0);
  comms[0].recv(z, 0);
  comms[0].send(x, 1);
  group_end();
  comms[1].recv(y, 0);
  std::vector<Tensor> t = {Tensor::full({2}, 1.0f, Device("sim", 0)),
                           Tensor::full({2}, 2.0f, Device("sim", 1))};
  all_reduce(comms, t);
  synchronize(comms);
  EXPECT_EQ(y.to_vector<float>(), tags(0, 4));
  EXPECT_EQ(z.to_vector<float>(), tags(0, 4));
  EXPECT_EQ(t[1].to_vector<float>(), (std::vector<float>{3.0f, 3.0f}));
}

TEST_F(P2PTest, EveryDtypeMovesItsBytesExactly) {
  auto comms = comms_of(2);
  for (DType dt : kAllDTypes) {
    const std::int64_t count = 37;
    Tensor s = Tensor::empty({count}, dt, Device("sim", 0));
    Tensor r = Tensor::empty({count}, dt, Device("sim", 1));
    synchronize(comms);
    // Simulator memory is host memory: every byte value, NaN and subnormal patterns included.
    const std::size_t bytes = s.nbytes();
    std::vector<unsigned char> pattern(bytes), zero(bytes, 0);
    for (std::size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<unsigned char>(i * 7 + 255);
    std::memcpy(s.data_ptr(), pattern.data(), bytes);
    std::memcpy(r.data_ptr(), zero.data(), bytes);
    send_recv_in_a_group(comms, s, 0, r, 1);
    synchronize(comms);
    EXPECT_EQ(std::memcmp(r.data_ptr(), pattern.data(), bytes), 0) << dtype_name(dt);
  }
}

TEST_F(P2PTest, CountMismatchFailsBothSidesAndTheCommunicatorGoesOn) {
  auto comms = comms_of(2);
  Tensor s = zeros_on(0, {12});
  Tensor r = zeros_on(1, {10});
  comms[0].send(s, 1);
  comms[1].recv(r, 0);
  const std::string msg =
      "send/recv: rank 0 sends 12 elements of f32 to rank 1, but rank 1 receives 10 elements of "
      "f32 from rank 0 (point-to-point #1 from rank 0 to rank 1; a send and its recv must have "
      "the same count and dtype)";
  expect_invalid([&] { comms[0].stream().synchronize(); }, msg);
  expect_invalid([&] { comms[1].stream().synchronize(); }, msg);
  // Position 2 of the pair matches again.
  Tensor s2 = tagged(0, 3, 0);
  Tensor r2 = zeros_on(1, {3});
  comms[1].recv(r2, 0);
  comms[0].send(s2, 1);
  expect_tags_of(comms, r2, 0);
}

TEST_F(P2PTest, DtypeMismatchFailsBothSides) {
  auto comms = comms_of(3);
  Tensor s = zeros_on(2, {4}, DType::i64);
  Tensor r = zeros_on(0, {4});
  send_recv_in_a_group(comms, s, 2, r, 0);
  const std::string msg =
      "send/recv: rank 2 sends 4 elements of i64 to rank 0, but rank 0 receives 4 elements of f32 "
      "from rank 2 (point-to-point #1 from rank 2 to rank 0;";
  expect_invalid([&] { comms[2].stream().synchronize(); }, msg);
  expect_invalid([&] { comms[0].stream().synchronize(); }, msg);
}

TEST_F(P2PTest, SendWithoutRecvTimesOutNamingBothRanks) {
  auto comms = comms_of(3, 200);
  Tensor s = zeros_on(1, {4});
  comms[1].send(s, 2);
  expect_error<Timeout>([&] { comms[1].stream().synchronize(); },
                        "send (point-to-point #1 from rank 1 to rank 2): rank 2 did not post the "
                        "matching recv from rank 1 within 200 ms");
  // The communicator is aborted, like after a collective's timeout.
  expect_error<BackendError>([&] { comms[0].barrier(); },
                             "barrier: communicator aborted by an earlier error: send "
                             "(point-to-point #1 from rank 1 to rank 2)");
  Tensor r = zeros_on(2, {4});
  expect_error<BackendError>([&] { comms[2].recv(r, 1); }, "recv: communicator aborted");
}

TEST_F(P2PTest, RecvWithoutSendTimesOutAndFailsTheOtherWaiters) {
  auto comms = comms_of(2, 200);
  Tensor r0 = zeros_on(0, {4});
  Tensor r1 = zeros_on(1, {4});
  comms[0].recv(r0, 1);
  comms[1].recv(r1, 0);  // both wait: a cycle of recvs
  const std::string from1 = "recv (point-to-point #1 from rank 1 to rank 0): rank 1 did not post "
                            "the matching send to rank 0 within 200 ms";
  const std::string from0 = "recv (point-to-point #1 from rank 0 to rank 1): rank 0 did not post "
                            "the matching send to rank 1 within 200 ms";
  // The first deadline to pass aborts the communicator; both ranks throw that one Timeout.
  const std::string first = same_timeout_on_every_rank(comms);
  EXPECT_TRUE(first == from1 || first == from0) << first;
}

TEST_F(P2PTest, PeerOutOfRange) {
  auto comms = comms_of(2);
  Tensor t = zeros_on(0, {4});
  expect_invalid([&] { comms[0].send(t, 2); },
                 "Communicator::send: peer: expected a rank in [0, 2), got 2");
  expect_invalid([&] { comms[0].recv(t, -1); },
                 "Communicator::recv: peer: expected a rank in [0, 2), got -1");
  Tensor elsewhere = zeros_on(1, {4});
  expect_invalid([&] { comms[0].send(elsewhere, 1); }, "Communicator::send: tensor: expected a "
                                                       "tensor on sim:0");
}

TEST_F(P2PTest, AbortOfAFailedRankFailsParkedBatchesAtOnce) {
  auto comms = comms_of(3);  // the default timeout (5 minutes): an abort must not wait for it
  Tensor r = zeros_on(0, {4});
  Tensor q = zeros_on(0, {4});
  Tensor s = zeros_on(2, {4});
  group_start();
  comms[0].recv(r, 1);
  comms[0].recv(q, 2);
  group_end();
  comms[2].send(s, 0);
  // Rank 2's send is done once rank 0's batch has posted its calls: it is parked, waiting for 1.
  comms[2].stream().synchronize();
  comms[1].abort("step 3 threw");
  expect_error<PeerFailure>([&] { comms[0].stream().synchronize(); },
                            "recv (point-to-point #1 from rank 1 to rank 0): rank 1 failed: step 3 "
                            "threw");
  expect_error<PeerFailure>([&] { comms[0].send(r, 2); },
                            "send: communicator aborted by an earlier error: rank 1 failed: step 3 "
                            "threw");
}

TEST_F(P2PTest, ACollectiveTimeoutFailsParkedPointToPoint) {
  auto comms = comms_of(2, 200);
  Tensor r = zeros_on(0, {4});
  comms[0].recv(r, 1);  // never matched
  comms[1].barrier();   // rank 0 never comes
  // Whichever deadline passes first aborts the communicator: both ranks throw its Timeout.
  const std::string first = same_timeout_on_every_rank(comms);
  EXPECT_TRUE(first.find("barrier (collective #1 on this communicator): timed out after 200 ms "
                         "waiting for rank 0") != std::string::npos ||
              first.find("recv (point-to-point #1 from rank 1 to rank 0): rank 1 did not post "
                         "the matching send") != std::string::npos)
      << first;
}

TEST_F(P2PTest, VirtualTimeOfAMessageIsTheLinkTime) {
  auto& be = *get_backend("sim").extension<sim::SimBackend>();
  auto comms = comms_of(2);
  const std::int64_t count = 1 << 18;  // 1 MiB of f32
  Tensor s = zeros_on(0, {count});
  Tensor r = zeros_on(1, {count});
  synchronize(comms);
  const sim::CostTotals t0 = be.cost_model().totals();
  send_recv_in_a_group(comms, s, 0, r, 1);
  synchronize(comms);
  const sim::CostTotals t1 = be.cost_model().totals();
  const auto& ic = be.cost_model().cluster().interconnect;
  const double expect = ic.base_latency + ic.hop_latency + 4.0 * count / ic.link_bandwidth;
  // Both start at the later arrival and end together, one message later.
  EXPECT_EQ(t1.comm[0] - t0.comm[0], sim::to_vtime(sim::to_seconds(sim::to_vtime(expect))));
  EXPECT_EQ(t1.comm[1] - t0.comm[1], t1.comm[0] - t0.comm[0]);
  EXPECT_GT(t1.comm[0], t0.comm[0]);
}

}  // namespace
}  // namespace ditto

namespace ditto {
namespace {

// A fresh simulator (the suite above keeps its own): device 1 fails at step 1.
TEST(P2PFaults, AFailedDeviceFailsItsBatchAndThePeerAtOnce) {
  auto& be = *test::init_sim(3).extension<sim::SimBackend>();
  sim::FaultConfig fc;
  fc.faults.push_back(sim::parse_fault("fail:device=1,step=1"));
  be.set_faults(fc);
  auto comms = Communicator::init_all({Device("sim", 0), Device("sim", 1), Device("sim", 2)});
  Tensor r = zeros_on(0, {4});
  Tensor s = zeros_on(1, {4});
  synchronize(comms);
  comms[0].recv(r, 1);
  be.begin_step(1);
  comms[1].send(s, 0);
  test::expect_own_backend_error([&] { comms[1].stream().synchronize(); },
                                 "sim:1: device failed (injected fault fail:device=1,step=1");
  // Parked, or started after the abort: either way it names the failed call and rank.
  test::expect_error<PeerFailure>([&] { comms[0].stream().synchronize(); },
                                  "send (point-to-point #1 from rank 1 to rank 0): rank 1 failed: "
                                  "sim:1: device failed");
  be.set_faults({});
}

}  // namespace
}  // namespace ditto
