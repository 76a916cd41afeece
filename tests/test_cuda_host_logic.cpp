// The CUDA backend's decisions that need no GPU (backend_cuda/cuda_host_logic.h), checked on any
// machine: which destinations a one-rank in-GPU collective may skip, the one-rank-per-GPU rule of
// the MPI communicator, exception safety of NCCL groups, the host wait's polling steps, memory
// accounting and the pool's release threshold, and the typed GEMM's cuBLASLt descriptors (executed
// here by a naive column-major GEMM against a double-precision reference). The GPU paths that use
// them are tested in test_cuda*.cpp (skipped without a GPU; tools/gpu-check-tests.txt lists them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend_cuda/cuda_host_logic.h"
#include "core/base/error.h"
#include "test_util.h"

namespace ditto::cuda {
namespace {

using test::expect_error;

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
  const std::string m = expect_error<BackendError>(
      [] {
        check_one_rank_per_gpu({"h0/GPU-a", "h0/GPU-a"},
                               {"cuda:0 (GPU 0) on host h0", "cuda:0 (GPU 0) on host h0"});
      },
      "Communicator::init_rank: ranks 0 and 1 of 2 are on the same GPU (cuda:0 (GPU 0) on host "
      "h0)");
  EXPECT_NE(m.find("NCCL refuses two ranks of one communicator on one GPU"), std::string::npos);
  EXPECT_NE(m.find("one process per GPU"), std::string::npos);
  EXPECT_NE(m.find("--devices N"), std::string::npos);
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
  EXPECT_EQ(log.calls, (std::vector<std::string>{"prepare 0", "prepare 1", "prepare 2", "prepare 3",
                                                 "start", "enqueue 0 op 0", "enqueue 1 op 10",
                                                 "enqueue 2 op 20", "enqueue 3 op 30", "end"}));
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

// ---- memory
// --------------------------------------------------------------------------------------

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

// ---- the typed GEMM's cuBLASLt mapping (cuda_blaslt.cpp) ----------------------------------------

// What cublasLtMatmul computes from the plan's descriptors (column-major, element (i, j) of a
// layout at i + j * ld): D[i, j] = alpha * sum_l op(first)[i, l] * op(second)[l, j] + beta * C[i,
// j]
// + bias[i], executed naively in double over `first` = the plan's first operand's memory etc.
void run_plan(const LtGemmPlan& p, double alpha, const std::vector<double>& first,
              const std::vector<double>& second, double beta, std::vector<double>& out,
              const std::vector<double>* bias) {
  auto at = [](const LtMatrix& x, const std::vector<double>& mem, std::int64_t i, std::int64_t j) {
    // op(x)[i, j]: x itself, or its transpose
    const std::int64_t r = x.trans ? j : i, c = x.trans ? i : j;
    EXPECT_LT(r, x.rows);
    EXPECT_LT(c, x.cols);
    return mem.at(static_cast<std::size_t>(r + c * x.ld));
  };
  // op(first) is m x k, op(second) k x n, out m x n
  EXPECT_EQ(p.first.trans ? p.first.cols : p.first.rows, p.m);
  EXPECT_EQ(p.first.trans ? p.first.rows : p.first.cols, p.k);
  EXPECT_EQ(p.second.trans ? p.second.cols : p.second.rows, p.k);
  EXPECT_EQ(p.second.trans ? p.second.rows : p.second.cols, p.n);
  EXPECT_EQ(p.out.rows, p.m);
  EXPECT_EQ(p.out.cols, p.n);
  for (std::int64_t j = 0; j < p.n; ++j)
    for (std::int64_t i = 0; i < p.m; ++i) {
      double acc = 0;
      for (std::int64_t l = 0; l < p.k; ++l)
        acc += at(p.first, first, i, l) * at(p.second, second, l, j);
      double& d = out.at(static_cast<std::size_t>(i + j * p.out.ld));
      d = alpha * acc + beta * d + (bias ? bias->at(static_cast<std::size_t>(i)) : 0.0);
    }
}

TEST(CudaHostLogic, CublasLtPlanComputesTheRowMajorGemmForEveryTransposeAndStride) {
  std::mt19937 gen(29);
  std::uniform_real_distribution<double> u(-1, 1);
  auto fill = [&](std::size_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = u(gen);
    return v;
  };
  struct Case {
    std::int64_t M, N, K, pad;
  };
  for (const Case& z : {Case{1, 1, 1, 0}, Case{7, 5, 3, 0}, Case{3, 9, 4, 2}, Case{16, 1, 33, 5}})
    for (int t = 0; t < 4; ++t)
      for (bool with_bias : {false, true}) {
        const bool ta = t & 1, tb = t & 2;
        // Row-major as ditto stores them: A [M, K] or [K, M], B [K, N] or [N, K], C [M, N].
        const std::int64_t ar = ta ? z.K : z.M, ac = ta ? z.M : z.K;
        const std::int64_t br = tb ? z.N : z.K, bc = tb ? z.K : z.N;
        const std::int64_t lda = ac + z.pad, ldb = bc + z.pad, ldc = z.N + z.pad;
        const auto A = fill(static_cast<std::size_t>(ar * lda));
        const auto B = fill(static_cast<std::size_t>(br * ldb));
        const auto C0 = fill(static_cast<std::size_t>(z.M * ldc));
        const auto bias = fill(static_cast<std::size_t>(z.N));
        const double alpha = 0.5, beta = -1.25;
        std::vector<double> ref = C0;
        for (std::int64_t r = 0; r < z.M; ++r)
          for (std::int64_t c = 0; c < z.N; ++c) {
            double acc = 0;
            for (std::int64_t k = 0; k < z.K; ++k)
              acc +=
                  (ta ? A[k * lda + r] : A[r * lda + k]) * (tb ? B[c * ldb + k] : B[k * ldb + c]);
            double& d = ref[static_cast<std::size_t>(r * ldc + c)];
            d = alpha * acc + beta * d + (with_bias ? bias[static_cast<std::size_t>(c)] : 0.0);
          }
        const LtGemmPlan p = lt_gemm_plan(ta, tb, z.M, z.N, z.K, lda, ldb, ldc);
        ASSERT_TRUE(lt_plan_valid(p));
        std::vector<double> out = C0;
        run_plan(p, alpha, /*first=*/B, /*second=*/A, beta, out, with_bias ? &bias : nullptr);
        for (std::size_t i = 0; i < out.size(); ++i)
          ASSERT_NEAR(out[i], ref[i], 1e-12)
              << "M " << z.M << " N " << z.N << " K " << z.K << " t" << t << " at " << i;
      }
}

TEST(CudaHostLogic, CublasLtPlanRefusesWhatCublasLtCannotTake) {
  EXPECT_FALSE(lt_plan_valid(lt_gemm_plan(false, false, 4, 4, 0, 1, 4, 4)));  // K == 0
  EXPECT_FALSE(lt_plan_valid(lt_gemm_plan(false, false, 4, 4, 3, 2, 4, 4)));  // lda < K
  EXPECT_FALSE(lt_plan_valid(lt_gemm_plan(false, true, 4, 4, 3, 3, 2, 4)));   // ldb < K
  EXPECT_FALSE(lt_plan_valid(lt_gemm_plan(false, false, 4, 5, 3, 3, 5, 4)));  // ldc < N
  EXPECT_TRUE(lt_plan_valid(lt_gemm_plan(true, true, 4, 5, 3, 4, 3, 5)));
  // Alignment cuBLASLt may assume: the largest power of two dividing the address, <= 256.
  EXPECT_EQ(lt_alignment(0x1000), 256u);
  EXPECT_EQ(lt_alignment(0x1002), 2u);
  EXPECT_EQ(lt_alignment(0x1010), 16u);
  EXPECT_EQ(lt_alignment(0x1004), 4u);
  EXPECT_EQ(lt_alignment(0x1001), 1u);
}

TEST(CudaHostLogic, TypedGemmDtypesAndTf32) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_TRUE(typed_gemm_supported(t, t, t));
    EXPECT_TRUE(typed_gemm_supported(t, t, DType::f32));
  }
  EXPECT_FALSE(typed_gemm_supported(DType::bf16, DType::f32, DType::bf16));  // mixed A / B
  EXPECT_FALSE(typed_gemm_supported(DType::bf16, DType::bf16, DType::f16));
  EXPECT_FALSE(typed_gemm_supported(DType::f32, DType::f32, DType::bf16));
  EXPECT_FALSE(typed_gemm_supported(DType::f64, DType::f64, DType::f64));
  EXPECT_FALSE(typed_gemm_supported(DType::i32, DType::i32, DType::f32));
  // TF32 only for f32 operands and only when allowed (torch's allow_tf32, off by default).
  EXPECT_TRUE(lt_use_tf32(DType::f32, true));
  EXPECT_FALSE(lt_use_tf32(DType::f32, false));
  EXPECT_FALSE(lt_use_tf32(DType::bf16, true));
  EXPECT_FALSE(lt_use_tf32(DType::f16, true));
}

}  // namespace
}  // namespace ditto::cuda
