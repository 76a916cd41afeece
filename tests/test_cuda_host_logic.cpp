// The CUDA backend's decisions that need no GPU (backend_cuda/cuda_host_logic.h), checked on any
// machine: which destinations a one-rank in-GPU collective may skip, the one-rank-per-GPU rule of
// the MPI communicator, exception safety of NCCL groups, the host wait's polling steps, memory
// accounting and the pool's release threshold. The GPU paths that use them are tested in
// test_cuda*.cpp (skipped without a GPU; tools/gpu-check-tests.txt lists them).
#include "backend_cuda/cuda_host_logic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/runtime/error.h"

namespace ditto::cuda {
namespace {

// ---- one-rank in-GPU collectives ---------------------------------------------------------------

TEST(CudaHostLogic, OneRankInPlaceAvgAndPremulSumStillWriteTheirDestination) {
  float t = 0, other = 0;
  const std::vector<const void*> srcs = {&t};
  const std::vector<void*> in_place = {&t}, out_of_place = {&other};
  // all_reduce(t, t, premul_sum 0.5) on one rank is t * 0.5: the kernel must run (before the
  // fix the only destination was dropped as a copy onto itself and t stayed unchanged).
  EXPECT_EQ(comm_destinations(srcs, in_place, ReduceOp::premul_sum), in_place);
  EXPECT_EQ(comm_destinations(srcs, in_place, ReduceOp::avg), in_place);
  EXPECT_EQ(comm_destinations(srcs, out_of_place, ReduceOp::premul_sum), out_of_place);
  EXPECT_EQ(comm_destinations(srcs, out_of_place, ReduceOp::avg), out_of_place);
  // sum / prod / min / max of one source are its bits: in place is no work.
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max}) {
    EXPECT_TRUE(comm_destinations(srcs, in_place, op).empty()) << reduce_op_name(op);
    EXPECT_EQ(comm_destinations(srcs, out_of_place, op), out_of_place) << reduce_op_name(op);
  }
  // Several sources: every destination is written, whatever the op.
  float u = 0;
  const std::vector<const void*> two = {&t, &u};
  const std::vector<void*> both = {&t, &u};
  EXPECT_EQ(comm_destinations(two, both, ReduceOp::sum), both);
  // Broadcast / all_gather of one rank in place (op sum: data movement): no work.
  EXPECT_TRUE(comm_destinations(srcs, in_place, ReduceOp::sum).empty());
}

// ---- one rank per GPU under MPI -----------------------------------------------------------------

TEST(CudaHostLogic, MpiRanksSharingAGpuAreRefusedNamingTheFix) {
  EXPECT_EQ(first_shared_gpu({"h0/GPU-a", "h0/GPU-b", "h1/GPU-a"}), std::nullopt);
  EXPECT_EQ(first_shared_gpu({"h0/GPU-a"}), std::nullopt);
  EXPECT_EQ(first_shared_gpu({"h0/GPU-a", "h0/GPU-b", "h0/GPU-a", "h0/GPU-b"}),
            (std::pair<int, int>(0, 2)));
  EXPECT_NO_THROW(check_one_rank_per_gpu({"h0/GPU-a", "h0/GPU-b"}, {"x", "y"}));
  // mpirun -np 2 on a one-GPU node: both ranks take local_rank % 1 = GPU 0.
  try {
    check_one_rank_per_gpu({"h0/GPU-a", "h0/GPU-a"},
                           {"cuda:0 (GPU 0) on host h0", "cuda:0 (GPU 0) on host h0"});
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("Communicator::init_rank: ranks 0 and 1 of 2 are on the same GPU "
                     "(cuda:0 (GPU 0) on host h0)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("NCCL refuses two ranks of one communicator on one GPU"), std::string::npos);
    EXPECT_NE(m.find("one process per GPU"), std::string::npos);
    EXPECT_NE(m.find("--devices N"), std::string::npos);
  }
}

// ---- NCCL groups --------------------------------------------------------------------------------

struct GroupLog {
  std::vector<std::string> calls;
  int open = 0;
};

TEST(CudaHostLogic, FailureWhilePreparingRankRLaunchesNoRankOfTheGroup) {
  GroupLog log;
  auto run = [&](int fail_prepare, int fail_enqueue) {
    return enqueue_group<int>(
        4,
        [&](int r) {
          if (r == fail_prepare) throw BackendError("ncclRedOpCreatePreMulSum failed");
          log.calls.push_back("prepare " + std::to_string(r));
          return r * 10;
        },
        [&] {
          log.calls.push_back("start");
          ++log.open;
        },
        [&](int r, int op) {
          if (r == fail_enqueue) throw BackendError("ncclAllReduce failed");
          log.calls.push_back("enqueue " + std::to_string(r) + " op " + std::to_string(op));
        },
        [&] {
          log.calls.push_back("end");
          --log.open;
        },
        [&] {
          log.calls.push_back("abandon");
          --log.open;
        });
  };
  // Rank 2's premul_sum op fails: no group was opened, nothing enqueued (before: ranks 0 and 1
  // were enqueued inside the group and launched by the guard's ncclGroupEnd).
  EXPECT_THROW(run(2, -1), BackendError);
  EXPECT_EQ(log.calls, (std::vector<std::string>{"prepare 0", "prepare 1"}));
  EXPECT_EQ(log.open, 0);
  // Every rank prepared first, then one group.
  log = {};
  EXPECT_EQ(run(-1, -1), (std::vector<int>{0, 10, 20, 30}));
  EXPECT_EQ(log.calls, (std::vector<std::string>{"prepare 0", "prepare 1", "prepare 2",
                                                 "prepare 3", "start", "enqueue 0 op 0",
                                                 "enqueue 1 op 10", "enqueue 2 op 20",
                                                 "enqueue 3 op 30", "end"}));
  // An NCCL enqueue fails inside the group: the group is left through abandon, never end.
  log = {};
  EXPECT_THROW(run(-1, 1), BackendError);
  EXPECT_EQ(log.calls.back(), "abandon");
  EXPECT_EQ(std::count(log.calls.begin(), log.calls.end(), "end"), 0);
  EXPECT_EQ(log.open, 0);
}

// ---- host waits on NCCL work -------------------------------------------------------------------

TEST(CudaHostLogic, WaitOnAStreamStopsAtAnAsyncNcclErrorOrACollectiveTimeout) {
  // Before: a bare cudaStreamSynchronize, which never returns when a peer rank died after its
  // partners enqueued their sends.
  EXPECT_EQ(wait_step(true, true, 99999, 1000), WaitStep::done);
  EXPECT_EQ(wait_step(false, false, -1, 1000), WaitStep::poll);
  EXPECT_EQ(wait_step(false, false, 500, 1000), WaitStep::poll);
  EXPECT_EQ(wait_step(false, true, 0, 1000), WaitStep::failed);
  EXPECT_EQ(wait_step(false, false, 1001, 1000), WaitStep::timed_out);
  EXPECT_EQ(wait_step(false, false, 1001, 0), WaitStep::poll);  // no timeout set
}

// ---- memory --------------------------------------------------------------------------------------

TEST(CudaHostLogic, PeakCountsOnlyAllocationsThatSucceeded) {
  MemoryAccount m;
  m.capacity = 1000;
  ASSERT_TRUE(m.reserve(300));
  m.commit(300);
  ASSERT_TRUE(m.reserve(600));  // fits our accounting, then CUDA says out of memory
  m.release(600, false);
  EXPECT_EQ(m.peak, 300u);  // before: 900, a failed allocation counted
  EXPECT_EQ(m.in_use, 300u);
  EXPECT_FALSE(m.reserve(701));  // past the capacity: refused before CUDA is asked
  EXPECT_EQ(m.in_use, 300u);
  ASSERT_TRUE(m.reserve(700));
  m.commit(700);
  EXPECT_EQ(m.peak, 1000u);
  m.release(700, true);
  m.release(300, true);
  EXPECT_EQ(m.in_use, 0u);
  EXPECT_EQ(m.peak, 1000u);
}

TEST(CudaHostLogic, PoolReleaseThresholdIsFiniteAndSharedByTheLogicalDevicesOfAGpu) {
  const std::uint64_t gib = 1ull << 30;
  EXPECT_EQ(pool_release_threshold(140 * gib, 1), 35 * gib);
  EXPECT_EQ(pool_release_threshold(140 * gib, 4), 35 * gib / 4);
  EXPECT_LT(pool_release_threshold(140 * gib, 1), 140 * gib);  // before: UINT64_MAX
  EXPECT_EQ(pool_release_threshold(8, 0), 2u);
}

}  // namespace
}  // namespace ditto::cuda
