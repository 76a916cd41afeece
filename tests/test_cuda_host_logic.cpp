// The CUDA backend's decisions that need no GPU (backend_cuda/cuda_host_logic.h), checked on any
// machine: which destinations a one-rank in-GPU collective may skip, the one-rank-per-GPU rule of
// the MPI communicator, exception safety of NCCL groups, the host wait's polling steps, memory
// accounting and the pool's release threshold, and the typed GEMM's cuBLASLt descriptors (executed
// here by a naive column-major GEMM against a double-precision reference) and their per-stream
// cache's keys and LRU. The GPU paths that use
// them are tested in test_cuda*.cpp (skipped without a GPU; tools/gpu-check-tests.txt lists them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
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

// ---- NCCL older at run time than at build time (Note [NCCL newer than the library]) ------------

TEST(CudaHostLogic, NcclVersionCodesAreNcclsOwn) {
  // nccl.h's NCCL_VERSION: four digits up to 2.8, five from 2.9 (ncclGetVersion answers these).
  EXPECT_EQ(nccl_version_code(2, 8, 4), 2804);
  EXPECT_EQ(nccl_version_code(2, 9, 6), 20906);
  EXPECT_EQ(nccl_version_code(2, 27, 7), 22707);
  EXPECT_EQ(nccl_version_code(2, 28, 0), 22800);
  EXPECT_EQ(nccl_version_code(3, 0, 1), 30001);
}

TEST(CudaHostLogic, AllToAllGatherScatterUseNcclsCallsOnlyWhereTheLoadedLibraryHasThem) {
  // A PyTorch wheel's NCCL 2.27 under a build against 2.28's headers: ncclSend / ncclRecv.
  EXPECT_EQ(nccl_rooted_path(22707, false), NcclRootedPath::send_recv);
  EXPECT_EQ(nccl_rooted_path(22703, true), NcclRootedPath::send_recv);  // 2.27 exporting a name
  EXPECT_EQ(nccl_rooted_path(2804, false), NcclRootedPath::send_recv);
  EXPECT_EQ(nccl_rooted_path(0, true), NcclRootedPath::send_recv);  // ncclGetVersion failed
  // 2.28 and later with the three symbols: NCCL's own calls.
  EXPECT_EQ(nccl_rooted_path(22800, true), NcclRootedPath::native);
  EXPECT_EQ(nccl_rooted_path(22903, true), NcclRootedPath::native);
  EXPECT_EQ(nccl_rooted_path(30001, true), NcclRootedPath::native);
  // A 2.28 that lacks one of them (a stripped or static build): ncclSend / ncclRecv.
  EXPECT_EQ(nccl_rooted_path(22800, false), NcclRootedPath::send_recv);
}

// Review 3 of issue 29: fp8 broadcast / all_gather / send / recv / all_to_all / gather /
// scatter and the bitwise block algorithm's copies went to NCCL as ncclFloat8e4m3 /
// ncclFloat8e5m2, which NCCL before 2.24 (a PyTorch wheel's) refuses, although they only move
// bytes. Now they move as u8 (ncclUint8, the same count); only NCCL's own reductions keep the
// type (Note [NCCL fp8]).
TEST(CudaHostLogic, Fp8DataMovementGoesToNcclAsBytes) {
  using K = CollectiveKind;
  auto name = [](DType t) { return std::string(dtype_name(t)); };  // readable failures
  for (DType t : {DType::f8_e4m3, DType::f8_e5m2}) {
    SCOPED_TRACE(dtype_name(t));
    EXPECT_EQ(name(nccl_move_dtype(t)), "u8");
    EXPECT_EQ(dtype_size(nccl_move_dtype(t)), dtype_size(t));  // same count, same bytes
    for (K k : {K::broadcast, K::all_gather, K::all_to_all, K::all_to_all_v, K::gather, K::scatter,
                K::send, K::recv})
      EXPECT_EQ(name(nccl_wire_dtype(k, t)), "u8") << collective_name(k);
    for (K k : {K::all_reduce, K::reduce, K::reduce_scatter})  // NCCL does the arithmetic
      EXPECT_EQ(name(nccl_wire_dtype(k, t)), name(t)) << collective_name(k);
  }
  for (DType t : kAllDTypes) {  // every other dtype goes as itself, whatever the kind
    if (t == DType::f8_e4m3 || t == DType::f8_e5m2) continue;
    EXPECT_EQ(name(nccl_move_dtype(t)), name(t));
    EXPECT_EQ(name(nccl_wire_dtype(K::all_gather, t)), name(t));
    EXPECT_EQ(name(nccl_wire_dtype(K::all_reduce, t)), name(t));
  }
}

// NCCL's own fp8 reductions need 2.24 in the headers and in the loaded library (ncclGetVersion):
// before, a clear BackendError naming the call, both versions and bitwise mode; fp8 data
// movement and every other dtype pass on any NCCL.
TEST(CudaHostLogic, Fp8ReductionsNeedNccl224InTheHeadersAndTheLoadedLibrary) {
  using K = CollectiveKind;
  const int v2_28 = nccl_version_code(2, 28, 3), v2_21 = nccl_version_code(2, 21, 5);
  EXPECT_EQ(kNcclFp8Version, 22400);
  EXPECT_EQ(nccl_version_string(v2_21), "2.21.5");
  EXPECT_EQ(nccl_version_string(nccl_version_code(2, 8, 4)), "2.8.4");
  EXPECT_EQ(nccl_version_string(0), "unknown");
  for (K k : {K::all_reduce, K::reduce, K::reduce_scatter}) {
    SCOPED_TRACE(collective_name(k));
    EXPECT_NO_THROW(check_nccl_reduction_dtype(k, DType::f8_e4m3, v2_28, v2_28, "w"));
    EXPECT_NO_THROW(check_nccl_reduction_dtype(k, DType::f8_e5m2, v2_28, 22400, "w"));
    for (DType t : kAllDTypes) {
      if (t == DType::f8_e4m3 || t == DType::f8_e5m2) continue;
      EXPECT_NO_THROW(check_nccl_reduction_dtype(k, t, 21903, 21903, "w")) << dtype_name(t);
    }
    const std::string msg = expect_error<BackendError>(
        [&] { check_nccl_reduction_dtype(k, DType::f8_e4m3, v2_28, v2_21, "cuda:0 (GPU 0)"); },
        std::string("cuda:0 (GPU 0): ") + collective_name(k) + " of f8_e4m3 in fast mode");
    for (const char* part :
         {"NCCL reduces fp8 from 2.24", "built with NCCL 2.28.3's headers and runs NCCL 2.21.5",
          "Determinism::bitwise"})
      EXPECT_NE(msg.find(part), std::string::npos) << msg << "\nexpected to contain: " << part;
    expect_error<BackendError>(  // headers too old, whatever the library
        [&] { check_nccl_reduction_dtype(k, DType::f8_e5m2, 22305, v2_28, "w"); },
        "f8_e5m2 in fast mode: NCCL reduces fp8 from 2.24 (ncclFloat8e4m3 / ncclFloat8e5m2); ditto "
        "was built with NCCL 2.23.5's headers and runs NCCL 2.28.3");
    expect_error<BackendError>(  // ncclGetVersion failed
        [&] { check_nccl_reduction_dtype(k, DType::f8_e5m2, v2_28, 0, "w"); }, "runs NCCL unknown");
  }
  for (K k : {K::broadcast, K::all_gather, K::all_to_all, K::all_to_all_v, K::gather, K::scatter,
              K::send, K::recv, K::barrier})
    EXPECT_NO_THROW(check_nccl_reduction_dtype(k, DType::f8_e4m3, v2_21, v2_21, "w"))
        << collective_name(k);
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

TEST(CudaHostLogic, AllocationErrorsNameTheCallMade) {
  // Before, an error of cudaMalloc (a GPU without memory pools) was reported as
  // cudaMallocFromPoolAsync's.
  EXPECT_STREQ(device_malloc_call(true), "cudaMallocFromPoolAsync");
  EXPECT_STREQ(device_malloc_call(false), "cudaMalloc");
}

TEST(CudaHostLogic, PeerAccessIsEnabledOncePerOrderedPairPerProcess) {
  // A second CudaBackend in the process (every test makes one) asked again and got
  // cudaErrorPeerAccessAlreadyEnabled, which compute-sanitizer reports as an API error.
  PeerPairs peers;
  int calls = 0;
  auto succeeds = [&] {
    ++calls;
    return 0;  // cudaSuccess
  };
  EXPECT_TRUE(peers.ensure(0, 1, succeeds));
  EXPECT_TRUE(peers.ensure(0, 1, succeeds));
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(peers.ensure(1, 0, succeeds));  // the other direction is its own call
  EXPECT_TRUE(peers.ensure(0, 2, succeeds));
  EXPECT_TRUE(peers.ensure(1, 0, succeeds));
  EXPECT_TRUE(peers.ensure(0, 2, succeeds));
  EXPECT_EQ(calls, 3);
  EXPECT_TRUE(peers.enabled(0, 1));
  EXPECT_FALSE(peers.enabled(2, 0));
}

// Review 3 of issue 29: the pair was recorded before cudaDeviceEnablePeerAccess, so a call that
// failed was never retried and the pair passed for enabled (the in-GPU transport's kernels then
// fault on the peer's memory). Now only a granted pair is recorded, and a failed one is asked
// again; cudaErrorPeerAccessAlreadyEnabled (someone else enabled it) counts as enabled.
TEST(CudaHostLogic, PeerAccessThatFailedIsNotRecordedAndIsTriedAgain) {
  EXPECT_TRUE(peer_access_granted(0));     // cudaSuccess
  EXPECT_TRUE(peer_access_granted(704));   // cudaErrorPeerAccessAlreadyEnabled
  EXPECT_FALSE(peer_access_granted(711));  // cudaErrorTooManyPeers
  EXPECT_FALSE(peer_access_granted(217));  // cudaErrorPeerAccessUnsupported
  EXPECT_FALSE(peer_access_granted(2));    // cudaErrorMemoryAllocation
  PeerPairs peers;
  std::vector<int> answers = {711, 2, 0};  // fails twice, then succeeds
  int calls = 0;
  auto enable = [&] { return answers[static_cast<std::size_t>(calls++)]; };
  EXPECT_FALSE(peers.ensure(0, 1, enable));
  EXPECT_FALSE(peers.enabled(0, 1));
  EXPECT_FALSE(peers.ensure(0, 1, enable));  // asked again, not taken for enabled
  EXPECT_TRUE(peers.ensure(0, 1, enable));
  EXPECT_TRUE(peers.enabled(0, 1));
  EXPECT_TRUE(peers.ensure(0, 1, enable));  // once granted, never asked again
  EXPECT_EQ(calls, 3);
  auto already = [] { return 704; };  // PyTorch enabled (2, 3) first
  EXPECT_TRUE(peers.ensure(2, 3, already));
  EXPECT_TRUE(peers.enabled(2, 3));
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

TEST(CudaHostLogic, TypedShardedGemmDtypes) {
  for (DType ab : {DType::f32, DType::bf16, DType::f16})
    for (DType c : {DType::f32, DType::bf16, DType::f16})
      EXPECT_TRUE(typed_sharded_gemm_supported(ab, ab, c)) << dtype_name(ab) << dtype_name(c);
  EXPECT_FALSE(typed_sharded_gemm_supported(DType::bf16, DType::f32, DType::f32));  // mixed A / B
  EXPECT_FALSE(typed_sharded_gemm_supported(DType::f16, DType::bf16, DType::f32));
  EXPECT_FALSE(typed_sharded_gemm_supported(DType::bf16, DType::bf16, DType::f64));
  EXPECT_FALSE(typed_sharded_gemm_supported(DType::f64, DType::f64, DType::f64));
  EXPECT_FALSE(typed_sharded_gemm_supported(DType::i32, DType::i32, DType::f32));
}

// ---- the cuBLASLt descriptor cache --------------------------------------------------------------

GemmExArgs lt_args() {
  GemmExArgs g;
  g.trans_a = false;
  g.trans_b = true;
  g.M = 64, g.N = 48, g.K = 40, g.lda = 40, g.ldb = 40, g.ldc = 48;
  g.a_type = g.b_type = g.c_type = DType::bf16;
  g.A = reinterpret_cast<const void*>(std::uintptr_t{0x10000});
  g.B = reinterpret_cast<const void*>(std::uintptr_t{0x20000});
  g.C = reinterpret_cast<void*>(std::uintptr_t{0x30000});
  g.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40000});
  return g;
}

TEST(CudaHostLogic, CublasLtKeyDiffersInEveryFieldItDependsOn) {
  const GemmExArgs g = lt_args();
  const LtGemmKey k = lt_gemm_key(g, false);
  const LtGemmKeyHash hash;
  // What the descriptors do not depend on: other pointers of the same alignment, alpha, beta, the
  // bias pointer, the mode.
  GemmExArgs same = g;
  same.A = reinterpret_cast<const void*>(std::uintptr_t{0x90000});
  same.C = reinterpret_cast<void*>(std::uintptr_t{0x70100});
  same.alpha = 0.5f;
  same.beta = 1.0f;
  same.bias = reinterpret_cast<const void*>(std::uintptr_t{0x50002});
  same.mode = Determinism::bitwise;
  EXPECT_EQ(lt_gemm_key(same, false), k);
  EXPECT_EQ(hash(lt_gemm_key(same, false)), hash(k));
  // Each field alone makes another key.
  std::vector<std::pair<const char*, GemmExArgs>> one_off;
  auto vary = [&](const char* what, auto&& f) {
    GemmExArgs v = g;
    f(v);
    one_off.emplace_back(what, v);
  };
  vary("trans_a", [](GemmExArgs& v) { v.trans_a = true; });
  vary("trans_b", [](GemmExArgs& v) { v.trans_b = false; });
  vary("M", [](GemmExArgs& v) { v.M = 65; });
  vary("N", [](GemmExArgs& v) { v.N = 47; });
  vary("K", [](GemmExArgs& v) { v.K = 39; });
  vary("lda", [](GemmExArgs& v) { v.lda = 48; });
  vary("ldb", [](GemmExArgs& v) { v.ldb = 48; });
  vary("ldc", [](GemmExArgs& v) { v.ldc = 56; });
  vary("a_type", [](GemmExArgs& v) { v.a_type = DType::f16; });
  vary("b_type", [](GemmExArgs& v) { v.b_type = DType::f16; });
  vary("c_type", [](GemmExArgs& v) { v.c_type = DType::f32; });
  vary("epilogue", [](GemmExArgs& v) { v.epilogue = GemmEpilogue::bias; });
  vary("alignment of A", [](GemmExArgs& v) { v.A = reinterpret_cast<const void*>(0x10002); });
  vary("alignment of B", [](GemmExArgs& v) { v.B = reinterpret_cast<const void*>(0x20008); });
  vary("alignment of C", [](GemmExArgs& v) { v.C = reinterpret_cast<void*>(0x30010); });
  LruCache<LtGemmKey, int, LtGemmKeyHash> cache(64);
  cache.insert(k, 0);
  for (const auto& [what, v] : one_off) {
    EXPECT_FALSE(lt_gemm_key(v, false) == k) << what;
    EXPECT_EQ(cache.find(lt_gemm_key(v, false)), nullptr) << what;
  }
  EXPECT_FALSE(lt_gemm_key(g, true) == k) << "tf32";
  EXPECT_EQ(cache.find(lt_gemm_key(g, true)), nullptr) << "tf32";
  ASSERT_NE(cache.find(lt_gemm_key(same, false)), nullptr);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), static_cast<std::int64_t>(one_off.size()) + 1);
}

TEST(CudaHostLogic, CublasLtCacheHitsMissesAndEvictsTheLeastRecentlyUsed) {
  // Values that count their destruction (the descriptors' destroy calls of the real entries).
  struct Owned {
    int id = -1;
    std::vector<int>* destroyed = nullptr;
    Owned(int i, std::vector<int>* d) : id(i), destroyed(d) {}
    Owned(Owned&& o) noexcept : id(std::exchange(o.id, -1)), destroyed(o.destroyed) {}
    Owned& operator=(Owned&& o) noexcept {
      std::swap(id, o.id);
      std::swap(destroyed, o.destroyed);
      return *this;
    }
    ~Owned() {
      if (id >= 0) destroyed->push_back(id);
    }
  };
  std::vector<int> destroyed;
  {
    LruCache<LtGemmKey, Owned, LtGemmKeyHash> cache(3);
    EXPECT_EQ(cache.capacity(), 3u);
    auto key = [](std::int64_t m) {
      GemmExArgs g = lt_args();
      g.M = m;
      return lt_gemm_key(g, false);
    };
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(cache.find(key(i)), nullptr);
      const Owned& v = cache.insert(key(i), Owned(i, &destroyed));
      EXPECT_EQ(v.id, i);
    }
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_TRUE(destroyed.empty());
    // A hit returns the stored value (one address while held) and makes it the most recent.
    Owned* zero = cache.find(key(0));
    ASSERT_NE(zero, nullptr);
    EXPECT_EQ(zero->id, 0);
    EXPECT_EQ(cache.find(key(0)), zero);
    // Full: a fourth key evicts the least recently used, 1 (0 was just used), destroying it.
    EXPECT_EQ(cache.find(key(3)), nullptr);
    cache.insert(key(3), Owned(3, &destroyed));
    EXPECT_EQ(destroyed, std::vector<int>{1});
    EXPECT_EQ(cache.find(key(1)), nullptr);
    EXPECT_NE(cache.find(key(2)), nullptr);
    EXPECT_NE(cache.find(key(0)), nullptr);
    EXPECT_NE(cache.find(key(3)), nullptr);
    // Now 2 is the least recent.
    cache.insert(key(4), Owned(4, &destroyed));
    EXPECT_EQ(destroyed, (std::vector<int>{1, 2}));
    EXPECT_EQ(cache.size(), 3u);
    EXPECT_EQ(cache.evictions(), 2);
    EXPECT_EQ(cache.hits(), 5);
    EXPECT_EQ(cache.misses(), 5);
  }
  // The cache's death destroys what it held (the stream's death, for the real one).
  std::sort(destroyed.begin(), destroyed.end());
  EXPECT_EQ(destroyed, (std::vector<int>{0, 1, 2, 3, 4}));
  // The real cache's bound holds a training step's GEMM shapes.
  EXPECT_GE(kLtCacheEntries, 32u);
}

// ---- the GELU epilogues (Kernels::has_gemm_gelu_epilogue)

TEST(CudaHostLogic, GeluEpiloguesOnlyInFastModeForTheTypedGemmsDtypes) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_TRUE(gemm_gelu_epilogue_supported(t, Determinism::fast)) << dtype_name(t);
    EXPECT_FALSE(gemm_gelu_epilogue_supported(t, Determinism::bitwise)) << dtype_name(t);
  }
  for (DType t : {DType::f64, DType::i32, DType::u8})
    EXPECT_FALSE(gemm_gelu_epilogue_supported(t, Determinism::fast)) << dtype_name(t);
}

// The GELU epilogue probe caught every ditto::Error, so a sticky CUDA error from an earlier fault
// made it answer "unfused" and surfaced later at another call; then (review 3 of issue 29) it
// rethrew every status but NOT_SUPPORTED / ARCH_MISMATCH, so cuBLASLt's INVALID_VALUE for a
// combination it does not take, or a heuristic's INVALID_VALUE / ARCH_MISMATCH, ended a fast-mode
// run that the unfused path runs. Now (Note [cuBLASLt declines], from cublasLt.h's return values)
// "not offered here" takes the unfused path / ditto's kernel, and only real failures surface.
TEST(CudaHostLogic, CublasLtDeclinesTakeTheUnfusedPathAndFailuresSurface) {
  // cublasLtMatmul: NOT_SUPPORTED, ARCH_MISMATCH, INVALID_VALUE enqueue nothing: declined.
  EXPECT_EQ(lt_matmul_answer(0), LtAnswer::ok);
  for (int st : {15, 8, 7}) EXPECT_EQ(lt_matmul_answer(st), LtAnswer::declined) << st;
  // NOT_INITIALIZED, ALLOC_FAILED, MAPPING_ERROR, EXECUTION_FAILED, INTERNAL_ERROR,
  // LICENSE_ERROR, and a status this cuBLAS does not name: failures, rethrown.
  for (int st : {1, 3, 11, 13, 14, 16, 99}) EXPECT_EQ(lt_matmul_answer(st), LtAnswer::failed) << st;
  // cublasLtMatmulAlgoGetHeuristic: an algorithm only with SUCCESS, a result and its state SUCCESS.
  EXPECT_EQ(lt_heuristic_answer(0, 1, 0), LtAnswer::ok);
  EXPECT_EQ(lt_heuristic_answer(0, 0, 0), LtAnswer::declined);   // no result
  EXPECT_EQ(lt_heuristic_answer(0, 1, 15), LtAnswer::declined);  // a result not usable
  for (int st : {15, 7, 8}) EXPECT_EQ(lt_heuristic_answer(st, 0, 0), LtAnswer::declined) << st;
  for (int st : {1, 3, 11, 13, 14, 16})
    EXPECT_EQ(lt_heuristic_answer(st, 0, 0), LtAnswer::failed) << st;
}

// cuBLASLt's documented aux constraints (ld a multiple of 8, at least the output's rows, here N)
// and the 16-byte alignment ditto asks of the aux pointer; other epilogues have no aux.
TEST(CudaHostLogic, GeluEpilogueAuxMatrixCublasLtTakes) {
  GemmExArgs g = lt_args();  // M 64, N 48
  g.aux = reinterpret_cast<void*>(std::uintptr_t{0x50000});
  g.ld_aux = 48;
  for (GemmEpilogue e : {GemmEpilogue::gelu_aux_bias, GemmEpilogue::dgelu}) {
    SCOPED_TRACE(static_cast<int>(e));
    GemmExArgs v = g;
    v.epilogue = e;
    EXPECT_TRUE(lt_epilogue_valid(v));
    v.bias = nullptr;  // GELU_AUX without a bias; dgelu has none
    EXPECT_TRUE(lt_epilogue_valid(v));
    v.ld_aux = 56;  // a wider row stride
    EXPECT_TRUE(lt_epilogue_valid(v));
    v.ld_aux = 52;  // not a multiple of 8
    EXPECT_FALSE(lt_epilogue_valid(v));
    v.ld_aux = 40;  // fewer than N
    EXPECT_FALSE(lt_epilogue_valid(v));
    v.ld_aux = 48;
    v.aux = reinterpret_cast<void*>(std::uintptr_t{0x50008});  // 8-byte aligned
    EXPECT_FALSE(lt_epilogue_valid(v));
    v.aux = nullptr;
    EXPECT_FALSE(lt_epilogue_valid(v));
  }
  for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::bias}) {
    GemmExArgs v = g;
    v.epilogue = e;
    v.aux = nullptr;
    v.ld_aux = 3;
    EXPECT_TRUE(lt_epilogue_valid(v)) << static_cast<int>(e);
  }
}

// A bias cuBLASLt may load 16 bytes at a time (its alignment preferences do not cover the bias):
// a bias at an odd offset (a view) is refused, so the canonical kernel adds it, with the bias
// epilogue and with GELU_AUX_BIAS; GELU_AUX without a bias, dgelu and no epilogue ignore it.
TEST(CudaHostLogic, CublasLtBiasEpiloguesNeedASixteenByteAlignedBias) {
  GemmExArgs g = lt_args();  // bias at 0x40000
  g.aux = reinterpret_cast<void*>(std::uintptr_t{0x50000});
  g.ld_aux = 48;
  for (GemmEpilogue e : {GemmEpilogue::bias, GemmEpilogue::gelu_aux_bias}) {
    SCOPED_TRACE(static_cast<int>(e));
    GemmExArgs v = g;
    v.epilogue = e;
    EXPECT_TRUE(lt_epilogue_valid(v));
    v.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40010});  // 16-byte aligned
    EXPECT_TRUE(lt_epilogue_valid(v));
    for (std::uintptr_t off : {2u, 4u, 8u}) {  // bf16 views at element offsets 1, 2 and 4
      v.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40000} + off);
      EXPECT_FALSE(lt_epilogue_valid(v)) << "bias at +" << off << " bytes";
    }
  }
  for (GemmEpilogue e : {GemmEpilogue::none, GemmEpilogue::dgelu}) {
    GemmExArgs v = g;
    v.epilogue = e;
    v.bias = reinterpret_cast<const void*>(std::uintptr_t{0x40002});  // unused
    EXPECT_TRUE(lt_epilogue_valid(v)) << static_cast<int>(e);
  }
  GemmExArgs v = g;  // GELU_AUX: no bias
  v.epilogue = GemmEpilogue::gelu_aux_bias;
  v.bias = nullptr;
  EXPECT_TRUE(lt_epilogue_valid(v));
}

// The GELU epilogues' descriptors depend on the aux matrix's stride and alignment and on the
// forward's bias (GELU_AUX_BIAS or GELU_AUX), not on its pointer; other epilogues ignore aux.
TEST(CudaHostLogic, CublasLtKeyOfTheGeluEpilogues) {
  GemmExArgs g = lt_args();
  g.epilogue = GemmEpilogue::gelu_aux_bias;
  g.aux = reinterpret_cast<void*>(std::uintptr_t{0x50000});
  g.ld_aux = 48;
  const LtGemmKey k = lt_gemm_key(g, false);
  GemmExArgs v = g;
  v.aux = reinterpret_cast<void*>(std::uintptr_t{0x60000});
  EXPECT_EQ(lt_gemm_key(v, false), k);
  v.aux = reinterpret_cast<void*>(std::uintptr_t{0x60010});
  EXPECT_FALSE(lt_gemm_key(v, false) == k) << "aux alignment";
  v = g;
  v.ld_aux = 56;
  EXPECT_FALSE(lt_gemm_key(v, false) == k) << "ld_aux";
  v = g;
  v.bias = nullptr;
  EXPECT_FALSE(lt_gemm_key(v, false) == k) << "no bias";
  EXPECT_NE(LtGemmKeyHash{}(lt_gemm_key(v, false)), LtGemmKeyHash{}(k));
  v = g;
  v.epilogue = GemmEpilogue::dgelu;
  EXPECT_FALSE(lt_gemm_key(v, false) == k) << "dgelu";
  GemmExArgs b = lt_args(), b2 = b;
  b.epilogue = b2.epilogue = GemmEpilogue::bias;
  b2.aux = reinterpret_cast<void*>(std::uintptr_t{0x60010});
  b2.ld_aux = 56;
  EXPECT_EQ(lt_gemm_key(b2, false), lt_gemm_key(b, false));
}

// The probe's decision rule on values computed both ways: ditto's tanh form (gpt::gelu, f32) and
// the erf form (double, rounded to f32) are told apart and each recognised; the tanh form off by
// a little more than the tolerance at one point, a NaN, or mismatched sizes are neither.
TEST(CudaHostLogic, GeluProbeTellsTheTanhFromTheErfForm) {
  const std::vector<float> x = gelu_probe_inputs(kGeluProbeRows * 16);
  ASSERT_EQ(x.size(), 2048u);
  EXPECT_EQ(x.front(), -kGeluProbeRange);
  EXPECT_EQ(x.back(), kGeluProbeRange);
  std::vector<float> tanh(x.size()), erf(x.size());
  double gap = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    tanh[i] = gpt::gelu(x[i]);
    erf[i] = static_cast<float>(gelu_erf(x[i]));
    gap = std::max(gap, std::fabs(static_cast<double>(tanh[i]) - erf[i]));
  }
  EXPECT_NEAR(gap, 4.7e-4, 0.1e-4);  // the forms' largest gap on the range
  EXPECT_EQ(gelu_epilogue_form(x, tanh), GeluForm::tanh);
  EXPECT_EQ(gelu_epilogue_form(x, erf), GeluForm::erf);
  // A fast tanh: the tanh form with an error of up to 5e-4 on tanh (PTX tanh.approx.f32's
  // 2^-10.99), i.e. up to 0.5 |x| 5e-4 on the GELU, past the forms' gap at most points; its
  // sign alternating over x as a rounding pattern does. Still the tanh form; likewise for erf.
  std::vector<float> noisy_tanh = tanh, noisy_erf = erf;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float e = 0.5f * std::fabs(x[i]) * 5e-4f * ((i * 7919 % 13) % 2 == 0 ? 1.0f : -1.0f) *
                    static_cast<float>(i * 104729 % 1000) / 1000.0f;
    noisy_tanh[i] += e;
    noisy_erf[i] += e;
  }
  EXPECT_EQ(gelu_epilogue_form(x, noisy_tanh), GeluForm::tanh);
  EXPECT_EQ(gelu_epilogue_form(x, noisy_erf), GeluForm::erf);
  std::vector<float> d(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) d[i] = 0.5f * (tanh[i] + erf[i]);  // half-way
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  for (std::size_t i = 0; i < x.size(); ++i) d[i] = tanh[i] + 0.2f * (erf[i] - tanh[i]);
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::tanh);  // a = 0.2: within the share tolerance
  for (std::size_t i = 0; i < x.size(); ++i) d[i] = tanh[i] + 0.3f * (erf[i] - tanh[i]);
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);  // a = 0.3: past it
  d = tanh;
  d[1000] += 2.5e-3f;  // one value past the residual bound: not a GELU
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  d = x;  // the identity (an epilogue not applied)
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  d = tanh;
  d[7] = std::nanf("");
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  d = tanh;
  d[9] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  d = tanh;
  d.pop_back();
  EXPECT_EQ(gelu_epilogue_form(x, d), GeluForm::other);
  EXPECT_EQ(gelu_epilogue_form({}, {}), GeluForm::other);
}

}  // namespace
}  // namespace ditto::cuda
