// Tests of the rendezvous every communicator shares (core/backend_api/rendezvous.h, Note
// [Rendezvous]): matching the ranks' calls by ordinal, the deadline and the names of the missing
// ranks, and the abort state's errors. The backends' own suites (test_communicator, test_faults,
// tests/mpi) check the same words end to end.
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <string>

#include "core/backend_api/rendezvous.h"
#include "core/base/error.h"

namespace ditto::detail {
namespace {

using Call = CollectiveCall;
using Cause = AbortState::Cause;

Call all_reduce(std::int64_t count) {
  Call c;
  c.kind = CollectiveKind::all_reduce;
  c.count = count;
  return c;
}

// The message of the exception in `e`, and checks its type.
template <typename E>
std::string message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E& x) {
    return x.what();
  } catch (const std::exception& x) {
    ADD_FAILURE() << "wrong exception type: " << x.what();
  }
  return {};
}

TEST(Rendezvous, MatchesCallsByOrdinalAndTheLastArrivalClosesTheRound) {
  Rendezvous<Call> rv(3, 1000);
  // Rank 0 runs ahead (a grouped thread): its second call opens round #2 while #1 is open.
  auto r1 = rv.enter(0);
  EXPECT_FALSE(rv.arrive(*r1, 0, all_reduce(8)));
  auto r2 = rv.enter(0);
  EXPECT_FALSE(rv.arrive(*r2, 0, all_reduce(4)));
  EXPECT_EQ(r1->seq, 1u);
  EXPECT_EQ(r2->seq, 2u);
  EXPECT_EQ(rv.open().size(), 2u);
  for (int r : {2, 1}) {
    auto round = rv.enter(r);
    EXPECT_EQ(round, r1);  // the rank's first call joins round #1, whoever opened it
    EXPECT_EQ(rv.arrive(*round, r, all_reduce(8)), r == 1);
  }
  EXPECT_FALSE(rv.is_open(1));
  EXPECT_TRUE(rv.is_open(2));
  EXPECT_EQ(rv.mismatch(*r1), "");
  EXPECT_EQ(r2->missing(), (std::vector<int>{1, 2}));
  rv.close_all();
  EXPECT_TRUE(rv.open().empty());
}

TEST(Rendezvous, MismatchIsTheMessageEveryRankThrows) {
  Rendezvous<Call> rv(2, 1000);
  auto round = rv.enter(0);
  rv.arrive(*round, 0, all_reduce(12));
  rv.arrive(*rv.enter(1), 1, all_reduce(10));
  EXPECT_EQ(rv.mismatch(*round),
            "all_reduce: rank 1 called with count 10, rank 0 with count 12 (collective #1 on this "
            "communicator; every rank must call the same collectives in the same order with the "
            "same count, dtype, op and root)");
}

TEST(Rendezvous, DeadlineIsTheFirstArrivalPlusTheTimeoutAndTheReasonNamesTheMissingRanks) {
  Rendezvous<Call> rv(4, 250);
  const auto before = std::chrono::steady_clock::now();
  auto round = rv.enter(1);
  const auto after = std::chrono::steady_clock::now();
  EXPECT_GE(round->deadline, before + std::chrono::milliseconds(250));
  EXPECT_LE(round->deadline, after + std::chrono::milliseconds(250));
  rv.arrive(*round, 1, all_reduce(1));
  EXPECT_EQ(rv.enter(3)->deadline, round->deadline);  // later ranks keep the first's deadline
  rv.arrive(*round, 3, all_reduce(1));
  EXPECT_EQ(rv.timeout_reason(*round, CollectiveKind::all_reduce),
            "all_reduce (collective #1 on this communicator): timed out after 250 ms waiting for "
            "ranks 0, 2 (communicator of 4 ranks; it is now aborted)");
  EXPECT_EQ(timeout_reason("barrier (collective #7 on this communicator)", 5, {3}, 4,
                           " in MPI processes"),
            "barrier (collective #7 on this communicator): timed out after 5 ms waiting for rank "
            "3 (communicator of 4 ranks in MPI processes; it is now aborted)");
}

TEST(AbortState, KeepsTheFirstReasonAndLaterCallsNameIt) {
  AbortState a;
  EXPECT_NO_THROW(a.throw_if_aborted(CollectiveKind::barrier));
  EXPECT_TRUE(a.rank_failed(2, "disk full"));
  EXPECT_FALSE(a.abort(Cause::timeout, "later"));
  EXPECT_FALSE(a.rank_failed(1, "later"));
  EXPECT_EQ(a.reason(), "rank 2 failed: disk full");
  EXPECT_EQ(a.failed_rank(), 2);
  try {
    a.throw_if_aborted(CollectiveKind::broadcast);
    ADD_FAILURE() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_EQ(std::string(e.what()),
              "broadcast: communicator aborted by an earlier error: rank 2 failed: disk full");
  }
}

TEST(AbortState, WaitersGetTimeoutThePeersFailureInTheirOwnCollectiveOrTheReason) {
  const std::string label = collective_label(CollectiveKind::all_gather, 3);
  EXPECT_EQ(label, "all_gather (collective #3 on this communicator)");
  AbortState timeout, peer, error;
  timeout.abort(Cause::timeout, "x: timed out");
  peer.rank_failed(0, "out of data");
  error.abort(Cause::error, "y: ncclSend failed");
  EXPECT_EQ(message<Timeout>(timeout.error_for(label)), "x: timed out");
  EXPECT_EQ(message<BackendError>(peer.error_for(label)),
            "all_gather (collective #3 on this communicator): rank 0 failed: out of data");
  EXPECT_EQ(message<BackendError>(error.error_for(label)), "y: ncclSend failed");
}

}  // namespace
}  // namespace ditto::detail
