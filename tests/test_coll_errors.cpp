// Argument errors of the collectives of issue 13, each a test: mismatched dtype or count between
// ranks (every rank fails, the communicator stays usable), all_to_all_v counts that do not add
// up (across ranks and within one rank), blocks out of bounds or overlapping, roots and peers
// out of range, a bare premul_sum, integer PreMulSum scalars the dtype cannot hold.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CollErrors = SimSuite<8>;

Tensor make(std::int64_t n, DType dtype, const Device& d) { return Tensor::empty({n}, dtype, d); }

std::vector<Tensor> per_rank(const std::vector<Communicator>& comms, std::int64_t n, DType dtype) {
  std::vector<Tensor> t;
  for (const auto& c : comms) t.push_back(make(n, dtype, c.device()));
  return t;
}

// Every rank's stream rethrows `message` (InvalidArgument) from the mismatched call.
void expect_every_rank_fails(std::vector<Communicator>& comms, const std::string& message) {
  for (auto& c : comms) expect_error<InvalidArgument>([&] { c.stream().synchronize(); }, message);
}

TEST_F(CollErrors, AllToAllWithADifferentDtypeOnOneRankFailsEveryRank) {
  auto comms = Communicator::init_all(devices("sim", 3));
  auto send = per_rank(comms, 6, DType::f32), recv = per_rank(comms, 6, DType::f32);
  Tensor s1 = make(6, DType::bf16, comms[1].device()), r1 = make(6, DType::bf16, comms[1].device());
  comms[0].all_to_all(send[0], recv[0]);
  comms[1].all_to_all(s1, r1);
  comms[2].all_to_all(send[2], recv[2]);
  expect_every_rank_fails(comms, "all_to_all: rank 1 called with dtype bf16, rank 0 with dtype f32 "
                                 "(collective #1 on this communicator");
  // Still usable.
  all_to_all(comms, send, recv);
  EXPECT_NO_THROW(synchronize(comms));
}

// On two ranks, rank r calls call(r, its communicator, send, recv) with a send of send_count[r]
// and a recv of recv_count[r] elements of `dtype` (0: an undefined recv); then every rank's stream
// rethrows `message`.
void expect_two_ranks_fail(DType dtype, std::array<std::int64_t, 2> send_count,
                           std::array<std::int64_t, 2> recv_count,
                           const std::function<void(int, Communicator&, Tensor&, Tensor&)>& call,
                           const std::string& message) {
  auto comms = Communicator::init_all(devices("sim", 2));
  std::vector<Tensor> send, recv;
  for (int r = 0; r < 2; ++r) {
    send.push_back(make(send_count[r], dtype, comms[r].device()));
    recv.push_back(recv_count[r] ? make(recv_count[r], dtype, comms[r].device()) : Tensor());
  }
  for (int r = 0; r < 2; ++r) call(r, comms[r], send[r], recv[r]);
  expect_every_rank_fails(comms, message);
}

TEST_F(CollErrors, GatherWithADifferentCountOnOneRankFailsEveryRank) {
  expect_two_ranks_fail(
      DType::i8, {4, 3}, {8, 0},
      [](int, Communicator& c, Tensor& s, Tensor& r) { c.gather(s, r, 0); },
      "gather: rank 1 called with count 3, rank 0 with count 4");
}

TEST_F(CollErrors, ScatterWithDifferentRootsFailsEveryRank) {
  expect_two_ranks_fail(
      DType::u8, {4, 4}, {2, 2},
      [](int rank, Communicator& c, Tensor& s, Tensor& r) { c.scatter(s, r, rank); },
      "scatter: rank 1 called with root 1, rank 0 with root 0");
}

TEST_F(CollErrors, AllToAllVCountsThatDoNotAddUpAcrossRanksFailEveryRankNamingBoth) {
  // Rank 0 sends 2 to rank 1, which expects 1 from rank 0.
  expect_two_ranks_fail(
      DType::f32, {3, 4}, {3, 2},
      [](int rank, Communicator& c, Tensor& s, Tensor& r) {
        if (rank == 0)
          c.all_to_all_v(s, {1, 2}, r, {1, 2});
        else
          c.all_to_all_v(s, {2, 2}, r, {1, 1});
      },
      "all_to_all_v: rank 0 sends 2 elements to rank 1 (send_counts[1]), but rank 1 expects 1 "
      "from rank 0 (recv_counts[0]) (collective #1 on this communicator");
}

using Counts = std::vector<std::int64_t>;

TEST_F(CollErrors, AllToAllVPackedCountsMustAddUpToTheTensor) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor s = make(5, DType::f32, comms[0].device()), r = make(4, DType::f32, comms[0].device());
  // comms[0].all_to_all_v(s, send_counts, r, recv_counts) refused with `message`.
  auto refused = [&](const Counts& send_counts, const Counts& recv_counts,
                     const std::string& message) {
    expect_invalid([&] { comms[0].all_to_all_v(s, send_counts, r, recv_counts); },
                   "Communicator::all_to_all_v: " + message);
  };
  refused({2, 2}, {2, 2},
          "send_counts: expected counts that add up to the 5 elements of send [5] f32 on sim:0 "
          "(packed blocks), got a sum of 4");
  refused({2, 3}, {2, 3}, "recv_counts: expected counts that add up to the 4 elements of recv");
  refused({6, -1}, {2, 2}, "send_counts[1]: expected a count >= 0, got -1");
  refused({5}, {2, 2}, "send_counts: expected 2 entries (one per rank), got 1");
  // The single-controller form checks every rank first.
  std::vector<Tensor> send = per_rank(comms, 4, DType::f32), recv = per_rank(comms, 4, DType::f32);
  expect_invalid(
      [&] {
        all_to_all_v(comms, send, {{2, 2}, {2, 2}}, recv, {{2, 2}, {1, 2}});
      },
      "Communicator::all_to_all_v: recv_counts: expected counts that add up to the 4 "
      "elements of recv [4] f32 on sim:1");
}

TEST_F(CollErrors, AllToAllVBlocksMustBeInsideTheirTensorsAndNotOverlap) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor s = make(4, DType::i32, comms[0].device()), r = make(6, DType::i32, comms[0].device());
  // comms[0].all_to_all_v(s, send_counts, send_displs, r, recv_counts, recv_displs) refused
  // with `message`.
  auto refused = [&](const Counts& sc, const Counts& sd, const Counts& rc, const Counts& rd,
                     const std::string& message) {
    expect_invalid([&] { comms[0].all_to_all_v(s, sc, sd, r, rc, rd); },
                   "Communicator::all_to_all_v: " + message);
  };
  refused({2, 2}, {0, 3}, {2, 2}, {0, 2},
          "send_displs[1], send_counts[1]: expected a block inside send [4] i32 on sim:0, got 2 "
          "elements at element 3");
  refused({2, 2}, {0, -2}, {2, 2}, {0, 2}, "send_displs[1]: expected a displacement >= 0, got -2");
  refused({2, 2}, {0, 2}, {3, 2}, {0, 2},
          "recv_displs: the blocks from rank 0 ([0, 3)) and rank 1 ([2, 4)) overlap in recv");
  // A recv block inside send.
  Tensor both = make(8, DType::i32, comms[0].device());
  expect_invalid(
      [&] {
        Tensor recv_view = both.narrow(2, 6);
        comms[0].all_to_all_v(both.narrow(0, 4), {2, 2}, {0, 2}, recv_view, {2, 2}, {0, 4});
      },
      "Communicator::all_to_all_v: recv: the block from rank 0 (elements [0, 2) of [6] i32 on "
      "sim:0) overlaps send [4] i32 on sim:0");
}

TEST_F(CollErrors, AllToAllNeedsEqualBlocksAndNoInPlace) {
  auto comms = Communicator::init_all(devices("sim", 4));
  Tensor a = make(6, DType::f16, comms[0].device()), b = make(6, DType::f16, comms[0].device());
  expect_invalid([&] { comms[0].all_to_all(a, b); },
                 "Communicator::all_to_all: send: expected a number of elements divisible by the "
                 "size 4 (one equal block per rank), got [6] f16 on sim:0");
  Tensor c = make(8, DType::f16, comms[0].device()), d = make(4, DType::f16, comms[0].device());
  expect_invalid([&] { comms[0].all_to_all(c, d); },
                 "Communicator::all_to_all: recv: expected 8 elements (like send [8] f16 on "
                 "sim:0), got [4] f16 on sim:0");
  expect_invalid([&] { comms[0].all_to_all(c, c); },
                 "Communicator::all_to_all: recv: expected a tensor that does not overlap send");
  Tensor e = make(8, DType::bf16, comms[0].device());
  expect_invalid([&] { comms[0].all_to_all(c, e); },
                 "Communicator::all_to_all: recv: expected dtype f16 (like send), got [8] bf16");
}

// A recv that partly overlaps send is refused; the same buffer, NCCL's in-place layouts and
// disjoint buffers are accepted. Before, all_reduce of [1, 2, 3] on 3 ranks with recv = send
// shifted by one element returned [3, 9, 27] (slices read values written by another slice).
TEST_F(CollErrors, PartlyOverlappingSendAndRecvAreRefusedInPlaceLayoutsAccepted) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor buf = make(16, DType::f32, comms[1].device());
  Tensor send = buf.narrow(0, 4), shifted = buf.narrow(1, 4), apart = buf.narrow(8, 4);
  const char* msg = "recv: expected a tensor that does not overlap send, or NCCL's in-place layout";
  expect_invalid([&] { comms[1].all_reduce(send, shifted); },
                 std::string("Communicator::all_reduce: ") + msg + " (recv is send, rank 1)");
  expect_invalid([&] { comms[1].reduce(send, shifted, ReduceOp::sum, 1); },
                 std::string("Communicator::reduce: ") + msg);
  expect_invalid([&] { comms[1].broadcast(send, shifted, 1); },
                 std::string("Communicator::broadcast: ") + msg);
  // all_gather: send must be block rank() (= 1) of recv, not block 0.
  Tensor gathered = buf.narrow(0, 8);
  expect_invalid(
      [&] { comms[1].all_gather(buf.narrow(0, 4), gathered); },
      std::string("Communicator::all_gather: ") + msg + " (send is block rank() of recv, rank 1)");
  Tensor block0 = buf.narrow(0, 4);
  expect_invalid([&] { comms[1].reduce_scatter(gathered, block0); },
                 std::string("Communicator::reduce_scatter: ") + msg +
                     " (recv is block rank() of send, rank 1)");
  // Rank 0 (block 0) is told the same layout, not "recv is send", which its sizes cannot have
  // (tester D: recv = block 1 of send on rank 0, in a group; send = block 1 of recv likewise).
  comms = Communicator::init_all(devices("sim", 2));
  Tensor buf0 = make(8, DType::f32, comms[0].device());
  Tensor block1 = buf0.narrow(4, 4);
  expect_invalid([&] { comms[0].reduce_scatter(buf0, block1); },
                 std::string("Communicator::reduce_scatter: ") + msg +
                     " (recv is block rank() of send, rank 0), got recv [4] f32 on sim:0 partly "
                     "overlapping send [8] f32 on sim:0");
  comms = Communicator::init_all(devices("sim", 2));
  expect_invalid(
      [&] { comms[0].all_gather(block1, buf0); },
      std::string("Communicator::all_gather: ") + msg + " (send is block rank() of recv, rank 0)");
  // Accepted: the real in-place layouts and disjoint buffers, on both ranks (then run them), on
  // new handles (each per-rank refusal above aborted the communicator).
  comms = Communicator::init_all(devices("sim", 2));
  std::vector<Tensor> b0{make(8, DType::f32, comms[0].device()), buf.narrow(0, 8)};
  for (auto& t : b0) ops::fill_(t, 1.0);
  std::vector<Tensor> g_send{b0[0].narrow(0, 4), b0[1].narrow(4, 4)}, g_recv{b0[0], b0[1]};
  EXPECT_NO_THROW(all_gather(comms, g_send, g_recv));
  std::vector<Tensor> r_send{b0[0], b0[1]}, r_recv{b0[0].narrow(0, 4), b0[1].narrow(4, 4)};
  EXPECT_NO_THROW(reduce_scatter(comms, r_send, r_recv));
  std::vector<Tensor> a_send{b0[0].narrow(0, 4), send}, a_recv{b0[0].narrow(4, 4), apart};
  EXPECT_NO_THROW(all_reduce(comms, a_send, a_recv));
  EXPECT_NO_THROW(synchronize(comms));
  // 2 (rank 0: its reduce_scatter block) + 1 (rank 1: untouched by the reduce_scatter).
  EXPECT_EQ(a_recv[1].to_vector<float>(), std::vector<float>(4, 3.0f));
}

TEST_F(CollErrors, RootOutOfRangeIsRefusedBeforeEnqueueing) {
  auto comms = Communicator::init_all(devices("sim", 3));
  Tensor s = make(2, DType::f64, comms[0].device()), r = make(6, DType::f64, comms[0].device());
  expect_invalid([&] { comms[0].gather(s, r, 3); },
                 "Communicator::gather: root: expected a rank in [0, 3), got 3");
  expect_invalid([&] { comms[0].scatter(r, s, -1); },
                 "Communicator::scatter: root: expected a rank in [0, 3), got -1");
  std::vector<Tensor> send = per_rank(comms, 2, DType::f64), recv = per_rank(comms, 6, DType::f64);
  expect_invalid([&] { gather(comms, send, recv, 7); },
                 "Communicator::gather: root: expected a rank in [0, 3), got 7");
  // Sizes on the root.
  Tensor small = make(5, DType::f64, comms[0].device());
  expect_invalid([&] { comms[0].gather(s, small, 0); },
                 "Communicator::gather: recv: expected 6 elements on the root (size 3 x send's 2)");
  expect_invalid(
      [&] { comms[0].scatter(small, s, 0); },
      "Communicator::scatter: send: expected 6 elements on the root (size 3 x recv's 2)");
  // The root's small buffer inside the big one, but not at its own block.
  expect_invalid([&] { comms[0].gather(r.narrow(2, 2), r, 0); },
                 "Communicator::gather: recv: expected a tensor that does not overlap send or "
                 "holds it in place as its block 0");
}

// Issue 16 (9): a per-rank call refused for its root used to leave the other ranks waiting for
// it until their timeout; now it aborts the communicator and they fail at once, naming it.
TEST_F(CollErrors, RootOutOfRangeOnOneRankFailsTheOthersAtOnceNamingIt) {
  CommOptions opts;
  opts.timeout_ms = 20000;  // a peer that waited for the timeout would take 20 s
  for (const char* call : {"broadcast", "reduce", "gather", "scatter"}) {
    SCOPED_TRACE(call);
    auto comms = Communicator::init_all(devices("sim", 3), opts);
    std::vector<Tensor> s = per_rank(comms, 6, DType::f32), r = per_rank(comms, 6, DType::f32);
    std::vector<Tensor> small = per_rank(comms, 2, DType::f32);
    auto issue = [&](int rank, int root) {
      const std::string c = call;
      if (c == "broadcast")
        comms[rank].broadcast(s[rank], root);
      else if (c == "reduce")
        comms[rank].reduce(s[rank], r[rank], ReduceOp::sum, root);
      else if (c == "gather")
        comms[rank].gather(small[rank], r[rank], root);
      else
        comms[rank].scatter(r[rank], small[rank], root);
    };
    issue(1, 0);
    issue(2, 0);
    const auto t0 = std::chrono::steady_clock::now();
    expect_invalid([&] { issue(0, 3); }, std::string("Communicator::") + call +
                                             ": root: expected a rank in [0, 3), got 3");
    for (int rank : {1, 2}) {
      try {
        comms[rank].stream().synchronize();
        ADD_FAILURE() << "rank " << rank << ": expected PeerFailure";
      } catch (const PeerFailure& e) {
        EXPECT_EQ(e.failed_rank(), 0);
        EXPECT_NE(std::string(e.what()).find(std::string("rank 0 failed: Communicator::") + call +
                                             ": root: expected a rank in [0, 3), got 3"),
                  std::string::npos)
            << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": expected PeerFailure, got " << e.what();
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 5.0) << "the other ranks waited for the refused call";
  }
}

// Every per-rank refusal, not only a root's (tester hB, 3): rank 0's call refused for its
// sizes (rank 1 and 2 called correctly) used to leave ranks 1 and 2 waiting for it until their
// timeout, then throw Timeout without the reason; now the refusal aborts the communicator and
// they fail at once with a PeerFailure naming rank 0 and its refusal.
TEST_F(CollErrors, EveryPerRankRefusalFailsTheOthersAtOnceNamingIt) {
  CommOptions opts;
  opts.timeout_ms = 20000;  // a peer that waited for the timeout would take 20 s
  struct Case {
    const char* call;
    // issue(rank, comm, bad): rank's call; `bad` (rank 0 only) with the wrong sizes
    std::function<void(int, Communicator&, bool)> issue;
    const char* refusal;
  };
  auto n = [](bool bad, std::int64_t good) { return bad ? good - 1 : good; };
  auto t = [](const Communicator& c, std::int64_t count) {
    return make(count, DType::f32, c.device());
  };
  const std::vector<Case> cases = {
      {"all_reduce",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 4));
         c.all_reduce(t(c, 4), r);
       },
       "Communicator::all_reduce: recv: expected 4 elements (like send [4] f32 on sim:0), got "
       "[3] f32 on sim:0"},
      {"reduce",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 4));
         c.reduce(t(c, 4), r, ReduceOp::sum, 0);
       },
       "Communicator::reduce: recv: expected 4 elements on the root"},
      {"broadcast",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 4));
         c.broadcast(t(c, 4), r, 0);
       },
       "Communicator::broadcast: recv: expected 4 elements"},
      {"all_gather",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 12));
         c.all_gather(t(c, 4), r);
       },
       "Communicator::all_gather: recv: expected 12 elements"},
      {"reduce_scatter",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, 4);
         c.reduce_scatter(t(c, n(bad, 12)), r);
       },
       "Communicator::reduce_scatter: send: expected 12 elements"},
      {"all_to_all",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 6));
         c.all_to_all(t(c, 6), r);
       },
       "Communicator::all_to_all: recv: expected 6 elements"},
      {"all_to_all_v",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, 6);
         c.all_to_all_v(t(c, 6), {2, 2, 2}, r, {2, 2, bad ? 1 : 2});
       },
       "Communicator::all_to_all_v: recv_counts: expected counts that add up to the 6 elements "
       "of recv"},
      {"gather",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, n(bad, 6));
         c.gather(t(c, 2), r, 0);
       },
       "Communicator::gather: recv: expected 6 elements on the root"},
      {"scatter",
       [&](int, Communicator& c, bool bad) {
         Tensor r = t(c, 2);
         c.scatter(t(c, n(bad, 6)), r, 0);
       },
       "Communicator::scatter: send: expected 6 elements on the root"},
      {"send",  // rank 0 sends to rank 1 a tensor of rank 1's device; rank 2 sends nothing
       [&](int rank, Communicator& c, bool bad) {
         if (rank == 0) {
           c.send(bad ? make(4, DType::f32, c.devices()[1]) : t(c, 4), 1);
         } else if (rank == 1) {
           Tensor r = t(c, 4);
           c.recv(r, 0);
         }
       },
       "Communicator::send: tensor: expected a tensor on sim:0 (rank 0 of 3), got [4] f32 on "
       "sim:1"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.call);
    auto comms = Communicator::init_all(devices("sim", 3), opts);
    k.issue(1, comms[1], false);
    k.issue(2, comms[2], false);
    const auto t0 = std::chrono::steady_clock::now();
    expect_invalid([&] { k.issue(0, comms[0], true); }, k.refusal);
    for (int rank : {1, 2}) {
      try {
        comms[rank].stream().synchronize();
        if (std::string(k.call) != "send" || rank == 1)
          ADD_FAILURE() << "rank " << rank << ": expected PeerFailure";
      } catch (const PeerFailure& e) {
        EXPECT_EQ(e.failed_rank(), 0);
        EXPECT_NE(std::string(e.what()).find(std::string("rank 0 failed: ") + k.refusal),
                  std::string::npos)
            << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << ": expected PeerFailure, got " << e.what();
      }
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(waited, 5.0) << "the other ranks waited for the refused call";
    // The communicator stays failed: a later call of any rank fails at once, with the reason.
    Tensor x = t(comms[2], 4);
    expect_error<PeerFailure>([&] { comms[2].all_reduce(x); },
                              "all_reduce: communicator aborted by an earlier error: ");
    expect_error<PeerFailure>([&] { comms[2].barrier(); }, k.refusal);
  }
}

// One thread per rank, as the tester's program: rank 1's all_reduce recv has 5 elements instead
// of 4; ranks 0 and 2 fail at once naming rank 1 and why, not with a Timeout after 20 s.
TEST_F(CollErrors, PerRankRefusalWithAThreadPerRankFailsThePeersAtOnce) {
  CommOptions opts;
  opts.timeout_ms = 20000;
  auto comms = Communicator::init_all(devices("sim", 3), opts);
  std::array<std::string, 3> what;
  std::array<double, 3> seconds{};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        Tensor s = Tensor::full({4}, 1.0f, comms[r].device());
        Tensor recv = Tensor::zeros({r == 1 ? 5 : 4}, DType::f32, comms[r].device());
        comms[r].all_reduce(s, recv);
        comms[r].stream().synchronize();
        what[r] = "ok";
      } catch (const PeerFailure& e) {
        what[r] = std::string("PeerFailure: ") + e.what();
      } catch (const InvalidArgument& e) {
        what[r] = std::string("InvalidArgument: ") + e.what();
      } catch (const std::exception& e) {
        what[r] = std::string("other: ") + e.what();
      }
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& th : threads) th.join();
  const std::string refusal =
      "Communicator::all_reduce: recv: expected 4 elements (like send [4] f32 on sim:1), got [5] "
      "f32 on sim:1";
  EXPECT_EQ(what[1], "InvalidArgument: " + refusal);
  for (int r : {0, 2}) {
    EXPECT_EQ(what[r].rfind("PeerFailure: ", 0), 0u) << "rank " << r << ": " << what[r];
    EXPECT_NE(what[r].find("rank 1 failed: " + refusal), std::string::npos) << what[r];
    EXPECT_LT(seconds[r], 5.0) << "rank " << r << " waited for the refused rank";
  }
}

TEST_F(CollErrors, PeerOutOfRangeIsRefused) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor t = make(3, DType::bf16, comms[0].device());
  expect_invalid([&] { comms[0].send(t, 2); },
                 "Communicator::send: peer: expected a rank in [0, 2), got 2");
  expect_invalid([&] { comms[0].recv(t, -1); },
                 "Communicator::recv: peer: expected a rank in [0, 2), got -1");
  Tensor elsewhere = make(3, DType::bf16, comms[1].device());
  expect_invalid([&] { comms[0].send(elsewhere, 1); },
                 "Communicator::send: tensor: expected a tensor on sim:0 (rank 0 of 2)");
}

TEST_F(CollErrors, BarePremulSumIsRefused) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor a = make(4, DType::f32, comms[0].device()), b = make(2, DType::f32, comms[0].device());
  const std::string why = ": op: premul_sum needs its scalar: pass PreMulSum{scalar}";
  expect_invalid([&] { comms[0].all_reduce(a, ReduceOp::premul_sum); },
                 "Communicator::all_reduce" + why);
  expect_invalid([&] { comms[0].reduce(a, a, ReduceOp::premul_sum, 0); },
                 "Communicator::reduce" + why);
  expect_invalid([&] { comms[0].reduce_scatter(a, b, ReduceOp::premul_sum); },
                 "Communicator::reduce_scatter" + why);
  std::vector<Tensor> t = per_rank(comms, 4, DType::f32);
  expect_invalid([&] { all_reduce(comms, t, ReduceOp::premul_sum); },
                 "Communicator::all_reduce" + why);
  expect_invalid([&] { comms[0].all_reduce(a, static_cast<ReduceOp>(9)); },
                 "Communicator::all_reduce: op: expected sum, prod, min, max, avg or premul_sum, "
                 "got 9");
}

TEST_F(CollErrors, IntegerPreMulSumScalarMustBeAnIntegerTheDtypeHolds) {
  auto comms = Communicator::init_all(devices("sim", 2));
  Tensor i = make(4, DType::i32, comms[0].device()), u = make(4, DType::u8, comms[0].device());
  expect_invalid([&] { comms[0].all_reduce(i, i, PreMulSum{0.5}); },
                 "Communicator::all_reduce: op: PreMulSum scalar for dtype i32: expected an "
                 "integer in [-2147483648, 2147483647], got 0.5");
  expect_invalid([&] { comms[0].all_reduce(u, u, PreMulSum{256}); },
                 "Communicator::all_reduce: op: PreMulSum scalar for dtype u8: expected an integer "
                 "in [0, 255], got 256");
  expect_invalid([&] { comms[0].reduce(u, u, PreMulSum{-1}, 0); },
                 "PreMulSum scalar for dtype u8: expected an integer in [0, 255], got -1");
  Tensor l = make(4, DType::i64, comms[0].device());
  expect_invalid([&] { comms[0].all_reduce(l, l, PreMulSum{9223372036854775808.0}); },
                 "PreMulSum scalar for dtype i64: expected an integer in [-9223372036854775808, "
                 "9223372036854775807]");
  // The vector form checks every rank's scalar, and the count of scalars.
  std::vector<Tensor> t = per_rank(comms, 4, DType::i32);
  expect_invalid([&] { all_reduce(comms, t, t, {PreMulSum{2}, PreMulSum{1.5}}); }, "got 1.5");
  expect_invalid([&] { all_reduce(comms, t, t, {PreMulSum{2}}); },
                 "all_reduce: ops: expected 2 PreMulSum values (one per rank), got 1");
  // Floating dtypes take any scalar (new handles: each per-rank refusal above aborted the
  // communicator).
  comms = Communicator::init_all(devices("sim", 2));
  Tensor f = make(4, DType::bf16, comms[0].device());
  std::vector<Tensor> fs = per_rank(comms, 4, DType::bf16);
  EXPECT_NO_THROW(all_reduce(comms, fs, fs, {PreMulSum{0.1}, PreMulSum{-3.5}}));
  EXPECT_NO_THROW(synchronize(comms));
  (void)f;
}

}  // namespace
}  // namespace ditto
