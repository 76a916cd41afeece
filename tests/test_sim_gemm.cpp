// The simulator's GEMM routines on their own (backend_sim/sim_gemm.h): the blocked bitwise kernel
// against the plain loop of Note [Canonical GEMM] (every shape class the blocking has a branch
// for: row and column tails, 16- and 32-column panels, several k blocks, each trans and epilogue),
// the sharded kernel against the recursive tree of Note [Canonical tree], the split over the pool
// against one call; and Executor::parallel_for (Note [Intra-op parallelism]).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "backend_sim/sim_executor.h"
#include "backend_sim/sim_gemm.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using I = std::int64_t;

std::vector<float> random_floats(I n, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = u(g);
  return v;
}

// Note [Canonical GEMM], spelled as the plain loop.
void reference_gemm(bool ta, bool tb, I M, I N, I K, float alpha, const float* A, I lda,
                    const float* B, I ldb, float beta, float* C, I ldc) {
  for (I i = 0; i < M; ++i)
    for (I j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (I k = 0; k < K; ++k)
        acc = std::fma(ta ? A[k * lda + i] : A[i * lda + k], tb ? B[j * ldb + k] : B[k * ldb + j],
                       acc);
      float& c = C[i * ldc + j];
      c = beta == 0.0f ? (alpha == 1.0f ? acc : alpha * acc) : std::fma(beta, c, alpha * acc);
    }
}

// One element of the sharded product: the canonical tree (left subtree: the largest power of
// two below the count) over the shards' chains.
float reference_tree(const float* A, I lda, const float* B, I ldb, I i, I j,
                     const std::vector<I>& bounds, I lo, I hi) {
  if (hi - lo == 1) {
    float acc = 0.0f;
    for (I k = bounds[static_cast<std::size_t>(lo)]; k < bounds[static_cast<std::size_t>(hi)]; ++k)
      acc = std::fma(A[k * lda + i], B[k * ldb + j], acc);
    return acc;
  }
  I p = 1;
  while (p * 2 < hi - lo) p *= 2;
  const float left = reference_tree(A, lda, B, ldb, i, j, bounds, lo, lo + p);
  const float right = reference_tree(A, lda, B, ldb, i, j, bounds, lo + p, hi);
  return left + right;
}

// C (M x N, row stride ldc) as gemm_tn_sharded_bitwise must leave it: each element the canonical
// tree over the shards of bounds, added to C's old value when accumulating.
void reference_tn_sharded(const float* A, I lda, const float* B, I ldb, I M, I N,
                          const std::vector<I>& bounds, float* C, I ldc, bool accumulate) {
  const I shards = static_cast<I>(bounds.size()) - 1;
  for (I i = 0; i < M; ++i)
    for (I j = 0; j < N; ++j) {
      const float t = reference_tree(A, lda, B, ldb, i, j, bounds, 0, shards);
      float& c = C[i * ldc + j];
      c = accumulate ? c + t : t;
    }
}

TEST(SimGemm, BitwiseKernelGivesTheBitsOfTheCanonicalLoop) {
  const I dims[] = {1, 11, 12, 13, 16, 17, 33, 121};
  const I ks[] = {0, 1, 17, 321, 700};  // 321 and 700: several k blocks
  int cases = 0;
  for (I M : dims)
    for (I N : dims)
      for (I K : ks)
        for (int t = 0; t < 4; ++t)
          for (int e = 0; e < 3; ++e) {
            if (K > 100 && (M + N + K + t + e) % 4 != 0) continue;  // keep the test short
            const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
            const float alpha = e == 1 ? 0.5f : 1.0f, beta = e == 2 ? 0.75f : 0.0f;
            const I lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
            const auto A = random_floats((ta ? K : M) * lda + 1, 1);
            const auto B = random_floats((tb ? N : K) * ldb + 1, 2);
            auto want = random_floats(M * ldc, 3);
            auto got = want;
            reference_gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(),
                           ldc);
            sim::gemm_bitwise(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
                              got.data(), ldc);
            ASSERT_TRUE(bits_equal(got, want)) << "M " << M << " N " << N << " K " << K
                                               << " trans " << t << " alpha " << alpha
                                               << " beta " << beta;
            ++cases;
          }
  EXPECT_GT(cases, 1000);
}

// The block edges of both SIMD kernels (AVX-512: 12 x 32 tiles, 120-row A blocks, k blocks of
// at most 320; AVX2: 6 x 16 tiles, 8-, 16-column panels, 144-row A blocks, k blocks of at most
// 256): M, N and K around the tiles, panels, blocks and the 8- and 16-wide transposes, several k
// blocks with an uneven split, each trans and epilogue (alpha in {1, 0.7}, beta in {0, 1, 0.3}),
// row strides larger than the rows or equal, and every operand allocated to end exactly at its
// last element (a read past it is out of bounds under ASan). Large products are sampled.
TEST(SimGemm, BitwiseKernelGivesTheBitsOfTheCanonicalLoopAtTheBlockEdges) {
  const I ms[] = {1, 5, 6, 7, 12, 13, 64, 100, 127, 129, 257};
  const I ns[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 1024};
  const I ks[] = {1, 7, 256, 257, 784, 1000};
  int seen = 0, cases = 0;
  for (I M : ms)
    for (I N : ns)
      for (I K : ks) {
        const double macs = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
        if (!(macs <= 2e6 || (++seen % 7 == 0 && macs <= 4e7))) continue;
        const int t = cases % 4, e = (cases / 4) % 6;
        const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
        const float alpha = e % 2 == 0 ? 1.0f : 0.7f;
        const float beta = e / 2 == 0 ? 0.0f : e / 2 == 1 ? 1.0f : 0.3f;
        const I pad = (cases / 24) % 2 == 0 ? 0 : 3;  // ld == the row's length, or 3 more
        const I a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
        const I lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
        const auto A = random_floats((a_rows - 1) * lda + a_cols, 21);
        const auto B = random_floats((b_rows - 1) * ldb + b_cols, 22);
        auto want = random_floats((M - 1) * ldc + N, 23);
        auto got = want;
        reference_gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, want.data(), ldc);
        sim::gemm_bitwise(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, got.data(),
                          ldc);
        ASSERT_TRUE(bits_equal(got, want)) << "M " << M << " N " << N << " K " << K << " trans "
                                           << t << " alpha " << alpha << " beta " << beta
                                           << " pad " << pad;
        ++cases;
      }
  EXPECT_GT(cases, 600);
}

TEST(SimGemm, ShardedKernelGivesTheBitsOfTheCanonicalTree) {
  for (I M : {1, 12, 13, 40})
    for (I N : {1, 16, 17, 50})
      for (I shards : {1, 3, 4, 7, 64})
        for (I rows : {0, 5, 64, 300})
          for (bool accumulate : {false, true}) {
            std::vector<I> bounds;
            for (I s = 0; s <= shards; ++s) bounds.push_back(s * rows / shards);
            const I lda = M + 1, ldb = N + 3, ldc = N + 2;
            const auto A = random_floats(rows * lda + 1, 4), B = random_floats(rows * ldb + 1, 5);
            auto want = random_floats(M * ldc, 6);
            auto got = want;
            reference_tn_sharded(A.data(), lda, B.data(), ldb, M, N, bounds, want.data(), ldc,
                                 accumulate);
            sim::gemm_tn_sharded_bitwise(M, N, A.data(), lda, B.data(), ldb, bounds, got.data(),
                                         ldc, accumulate);
            ASSERT_TRUE(bits_equal(got, want)) << "M " << M << " N " << N << " shards " << shards
                                               << " rows " << rows << " acc " << accumulate;
          }
}

// The sharded kernel at the AVX2 kernel's edges too: row tails around 6, a second 144-row A
// block, 8-column and partial panels, operands ending exactly at their last element.
TEST(SimGemm, ShardedKernelGivesTheBitsOfTheCanonicalTreeAtTheBlockEdges) {
  int cases = 0;
  for (I M : {5, 6, 7, 150})
    for (I N : {7, 8, 24, 33})
      for (I shards : {1, 2, 5})
        for (I rows : {9, 64}) {
          std::vector<I> bounds;
          for (I s = 0; s <= shards; ++s) bounds.push_back(s * rows / shards);
          const bool accumulate = cases % 2 == 1;
          const I pad = cases % 3 == 0 ? 0 : 2;
          const I lda = M + pad, ldb = N + pad, ldc = N + pad;
          const auto A = random_floats((rows - 1) * lda + M, 24);
          const auto B = random_floats((rows - 1) * ldb + N, 25);
          auto want = random_floats((M - 1) * ldc + N, 26);
          auto got = want;
          reference_tn_sharded(A.data(), lda, B.data(), ldb, M, N, bounds, want.data(), ldc,
                               accumulate);
          sim::gemm_tn_sharded_bitwise(M, N, A.data(), lda, B.data(), ldb, bounds, got.data(), ldc,
                                       accumulate);
          ASSERT_TRUE(bits_equal(got, want)) << "M " << M << " N " << N << " shards " << shards
                                             << " rows " << rows << " acc " << accumulate;
          ++cases;
        }
  EXPECT_EQ(cases, 96);
}

// Large enough to be split (more than 2e7 flops), by columns (N > M) and by rows (M > N).
TEST(SimGemm, SplitOverThePoolGivesTheBitsOfOneCall) {
  struct Shape {
    I M, N, K;
  };
  for (const Shape s : {Shape{100, 1000, 130}, Shape{1000, 100, 130}}) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
      const I lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
      const auto A = random_floats(s.M * s.K, 7), B = random_floats(s.K * s.N, 8);
      auto one = random_floats(s.M * s.N, 9);
      auto split = one;
      sim::gemm_bitwise(ta, tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.5f,
                        one.data(), s.N);
      sim::gemm_split(true, ta, tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.5f,
                      split.data(), s.N);
      ASSERT_TRUE(bits_equal(split, one)) << "M " << s.M << " N " << s.N << " trans " << t;
    }
    const std::vector<I> bounds = {0, 30, 64, 64, 100, 130};
    const auto A = random_floats(s.K * s.M, 10), B = random_floats(s.K * s.N, 11);
    std::vector<float> one(static_cast<std::size_t>(s.M * s.N)), split(one.size());
    sim::gemm_tn_sharded_bitwise(s.M, s.N, A.data(), s.M, B.data(), s.N, bounds, one.data(), s.N,
                                 false);
    sim::gemm_tn_sharded_split(s.M, s.N, A.data(), s.M, B.data(), s.N, bounds, split.data(), s.N,
                               false);
    ASSERT_TRUE(bits_equal(split, one)) << "sharded M " << s.M << " N " << s.N;
  }
}

TEST(SimExecutor, ParallelForRunsEveryIndexOnce) {
  for (std::int64_t n : {1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
    sim::Executor::instance().parallel_for(
        n, [&](std::int64_t i) { runs[static_cast<std::size_t>(i)].fetch_add(1); });
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << "n " << n << " i " << i;
  }
  sim::Executor::instance().parallel_for(0, [](std::int64_t) { FAIL() << "n = 0 runs nothing"; });
}

// A parallel_for on a pool thread while every other pool thread is held by a blocking task: no
// helper can come, and the call must still finish (on its own thread) before they are released.
TEST(SimExecutor, ParallelForFinishesOnAPoolThreadWhileTheOthersAreBlocked) {
  sim::Executor& ex = sim::Executor::instance();
  const int t = ex.threads();
  std::atomic<bool> release{false};
  std::atomic<int> blocked{0};
  for (int i = 0; i < t - 1; ++i)
    ex.post(
        [&] {
          blocked.fetch_add(1);
          while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          blocked.fetch_sub(1);
        },
        static_cast<std::uint64_t>(i));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (blocked.load() < t - 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(blocked.load(), t - 1);
  std::atomic<std::int64_t> sum{0};
  std::atomic<bool> finished{false};
  ex.post(
      [&] {
        ex.parallel_for(100, [&](std::int64_t i) { sum.fetch_add(i); }, t);
        finished.store(true);
      },
      static_cast<std::uint64_t>(t - 1));
  while (!finished.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const bool done_while_blocked = finished.load();
  release.store(true);
  while ((!finished.load() || blocked.load() > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(done_while_blocked);
  EXPECT_EQ(sum.load(), 99 * 100 / 2);
}

// Three jobs queued on one thread, the first two blocked until the third has run: the first holds
// its home thread, an idle thread steals the second and is held by it, and the third must still
// be stolen by another thread. Before the fix only a post() to a busy thread woke a poller, so the
// third job waited for a thread that waited for it (the jobs give up after 10 s, so a failure
// reports instead of hanging).
TEST(SimExecutor, AJobLeftBehindAStolenJobThatBlocksIsStolenToo) {
  sim::Executor& ex = sim::Executor::instance();
  ASSERT_GE(ex.threads(), 3);
  const std::uint64_t home = 1;
  std::atomic<bool> third_ran{false};
  std::atomic<int> finished{0};
  std::atomic<int> gave_up{0};
  auto wait_for_third = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!third_ran.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!third_ran.load()) gave_up.fetch_add(1);
    finished.fetch_add(1);
  };
  // Post the three from a job on their home thread, so all are queued before it takes the first;
  // the pause lets the thread woken by the first post start polling, so that the later posts
  // (to a busy thread, with a poller already there) wake nobody more.
  ex.post(
      [&] {
        ex.post(wait_for_third, home);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        ex.post(wait_for_third, home);
        ex.post(
            [&] {
              third_ran.store(true);
              finished.fetch_add(1);
            },
            home);
      },
      home);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (finished.load() < 3 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(finished.load(), 3);
  EXPECT_EQ(gave_up.load(), 0) << "the third job ran only after the others gave up waiting";
}

}  // namespace
}  // namespace ditto
