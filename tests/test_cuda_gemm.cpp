// The typed GEMM on a GPU (issue 29; Kernels::gemm_ex, backend_cuda/cuda_blaslt.cpp): cuBLASLt
// with f32 (strict and TF32), bf16 and f16 operands, C of their dtype or f32, every transpose
// pair, ragged sizes, beta 0 and 1 and the bias epilogue (a bias view at an odd offset: the
// canonical kernel), against a double-precision reference of
// the stored (widened) inputs within the tolerance of each mode; and the bitwise typed kernel
// through the ops against the simulator's bits; the typed sharded dW (gemm_tn_sharded_ex) through
// ops::gemm_tn_sharded against the simulator's bits; the per-stream cuBLASLt descriptor cache.
// The descriptors' row-major -> column-major mapping
// is checked on any machine (CudaHostLogic.CublasLtPlan*), the bitwise kernel on the CPU too
// (CudaEmu.Kernels). Without a usable GPU every test reports SKIPPED with the reason;
// tools/gpu-check-tests.txt lists them for the GPU check.
#if defined(DITTO_TEST_CUDA_BUILT)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_blaslt.h"
#include "backend_cuda/cuda_stream.h"
#include "core/numerics/float_formats.h"
#include "core/numerics/micro_shards.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaGemm = CudaSuite<>;  // kCudaTestDevices

// Host values of dtype t: random in [-1, 1], rounded to t, kept as the bytes to upload and as
// their exact f32 values (the reference's inputs).
struct HostMatrix {
  DType t;
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
};

// `values` rounded to t: the bytes to upload and their exact f32 values.
HostMatrix host_matrix(DType t, std::vector<float> values) {
  HostMatrix m{t, std::vector<std::uint8_t>(values.size() * dtype_size(t)), std::move(values)};
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    const float x = m.values[i];
    if (t == DType::bf16) {
      const bfloat16 h = bfloat16::from(x);
      std::memcpy(m.bytes.data() + 2 * i, &h.bits, 2);
      m.values[i] = h.to_float();
    } else if (t == DType::f16) {
      const float16 h = float16::from(x);
      std::memcpy(m.bytes.data() + 2 * i, &h.bits, 2);
      m.values[i] = h.to_float();
    } else {
      std::memcpy(m.bytes.data() + 4 * i, &x, 4);
    }
  }
  return m;
}

HostMatrix random_matrix(DType t, std::size_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = u(gen);
  return host_matrix(t, std::move(x));
}

std::vector<float> widen(DType t, const std::vector<std::uint8_t>& bytes) {
  const std::size_t n = bytes.size() / dtype_size(t);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      std::memcpy(&v[i], bytes.data() + 4 * i, 4);
    } else {
      std::uint16_t b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      v[i] = t == DType::bf16 ? bfloat16{b}.to_float() : float16{b}.to_float();
    }
  }
  return v;
}

// Device memory of a backend of the test's own (freed at scope end).
struct DeviceBytes {
  cuda::CudaBackend& b;
  std::size_t n;
  void* p;
  DeviceBytes(cuda::CudaBackend& backend, const std::vector<std::uint8_t>& host)
      : b(backend), n(host.size()), p(backend.allocate(0, host.size())) {
    b.copy_from_host(b.default_stream(0), p, host.data(), n);
  }
  ~DeviceBytes() { b.deallocate(0, p, n); }
  std::vector<std::uint8_t> read() {
    std::vector<std::uint8_t> h(n);
    b.copy_to_host(b.default_stream(0), h.data(), p, n);
    return h;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// How far the GPU may be from the double reference, relative to
// scale = |alpha| * sum_k |a_ik b_kj| + |beta c_ij| + |bias_j| (a bound on every partial sum):
// strict f32 accumulation of K <= 160 terms (at most K * 2^-24 < 1e-5: 2e-5); bf16 / f16 inputs
// are exact in the reference and their products exact in f32, but the tensor cores' f32
// accumulation may truncate (1e-4); TF32 inputs (10-bit mantissa, truncated or rounded: at most
// 2 * 2^-10 per product, 3e-3); a bf16 / f16 output rounded once (half an ulp: 2^-8 / 2^-11 of
// the value, which scale bounds; twice with a bias where cuBLASLt has no algorithm and the
// canonical kernel runs, which rounds the product, then the sum with the bias).
double tolerance(DType ab, DType c, bool tf32, bool bias = false) {
  double tol = ab == DType::f32 ? 2e-5 : 1e-4;
  if (tf32) tol = 3e-3;
  const double roundings = bias ? 2.0 : 1.0;
  if (c == DType::bf16) tol += 3.91e-3 * roundings;
  if (c == DType::f16) tol += 4.9e-4 * roundings;
  return tol;
}

struct Case {
  std::int64_t M, N, K;
};

// One typed GEMM through cuBLASLt (blaslt_gemm must take it: ASSERT) and, for the same inputs,
// through Kernels::gemm_ex (fast mode), each against the double reference.
void check_lt(cuda::CudaBackend& be, DType ab, DType ct, bool tf32, bool ta, bool tb, const Case& z,
              float alpha, float beta, bool bias, std::mt19937& gen) {
  const std::int64_t ar = ta ? z.K : z.M, ac = ta ? z.M : z.K;
  const std::int64_t br = tb ? z.N : z.K, bc = tb ? z.K : z.N;
  const HostMatrix A = random_matrix(ab, static_cast<std::size_t>(ar * ac), gen);
  const HostMatrix B = random_matrix(ab, static_cast<std::size_t>(br * bc), gen);
  const HostMatrix C = random_matrix(ct, static_cast<std::size_t>(z.M * z.N), gen);
  const HostMatrix Bias = random_matrix(ct, static_cast<std::size_t>(z.N), gen);
  std::vector<double> ref(static_cast<std::size_t>(z.M * z.N)), scale(ref.size());
  for (std::int64_t i = 0; i < z.M; ++i)
    for (std::int64_t j = 0; j < z.N; ++j) {
      double acc = 0, mag = 0;
      for (std::int64_t k = 0; k < z.K; ++k) {
        const double a = A.values[static_cast<std::size_t>(ta ? k * ac + i : i * ac + k)];
        const double b = B.values[static_cast<std::size_t>(tb ? j * bc + k : k * bc + j)];
        acc += a * b;
        mag += std::fabs(a * b);
      }
      const std::size_t at = static_cast<std::size_t>(i * z.N + j);
      const double c = beta != 0.0f ? C.values[at] : 0.0;
      const double bj = bias ? Bias.values[static_cast<std::size_t>(j)] : 0.0;
      ref[at] = alpha * acc + beta * c + bj;
      scale[at] = std::fabs(alpha) * mag + std::fabs(beta * c) + std::fabs(bj) + 1e-30;
    }
  const std::string what = std::string(dtype_name(ab)) + (tf32 ? " (tf32)" : "") + " -> " +
                           dtype_name(ct) + " " + std::to_string(z.M) + "x" + std::to_string(z.N) +
                           "x" + std::to_string(z.K) + (ta ? " trans_a" : "") +
                           (tb ? " trans_b" : "") + " alpha " + std::to_string(alpha) + " beta " +
                           std::to_string(beta) + (bias ? " bias" : "");
  DeviceBytes dA(be, A.bytes), dB(be, B.bytes), dBias(be, Bias.bytes);
  for (int path = 0; path < 2; ++path) {  // 0: blaslt_gemm itself, 1: Kernels::gemm_ex
    DeviceBytes dC(be, C.bytes);
    GemmExArgs g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.M = z.M, g.N = z.N, g.K = z.K;
    g.alpha = alpha, g.beta = beta;
    g.A = dA.p, g.a_type = ab, g.lda = ac;
    g.B = dB.p, g.b_type = ab, g.ldb = bc;
    g.C = dC.p, g.c_type = ct, g.ldc = z.N;
    g.epilogue = bias ? GemmEpilogue::bias : GemmEpilogue::none;
    g.bias = dBias.p;
    g.mode = Determinism::fast;
    if (path == 0) {
      bool took = false;
      {
        cuda::DeviceGuard guard(be.physical_device(0));
        took = cuda::blaslt_gemm(be.cuda_stream(0), g, tf32, "test");
      }
      // Leading dimensions of whole 16-byte rows: cuBLASLt must have an algorithm. Ragged ones
      // (an odd ld of bf16) may fall back to the canonical kernel (gemm_ex, path 1).
      const std::size_t row_align = 16 / dtype_size(ab);
      const bool aligned = ac % static_cast<std::int64_t>(row_align) == 0 &&
                           bc % static_cast<std::int64_t>(row_align) == 0 &&
                           z.N % static_cast<std::int64_t>(16 / dtype_size(ct)) == 0;
      if (!took) {
        EXPECT_FALSE(aligned) << what << ": cuBLASLt found no algorithm";
        std::printf("note: %s: cuBLASLt has no algorithm (ragged leading dimensions)\n",
                    what.c_str());
        continue;
      }
    } else {
      ASSERT_TRUE(be.kernels().has_gemm_ex(ab, ab, ct, Determinism::fast)) << what;
      be.kernels().gemm_ex(be.default_stream(0), g);
    }
    const std::vector<float> got = widen(ct, dC.read());
    const double tol = tolerance(ab, ct, tf32, bias && path == 1);
    std::size_t bad = 0, first = 0;
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double err = std::fabs(got[i] - ref[i]) / scale[i];
      if (!(err <= tol) && bad++ == 0) first = i;
      if (err > worst || err != err) worst = err;
    }
    EXPECT_EQ(bad, 0u) << what << (path == 0 ? " (blaslt_gemm)" : " (gemm_ex)") << ": " << bad
                       << " of " << got.size() << " elements off by more than " << tol
                       << " x scale; first at " << first << ": " << got[first] << " vs "
                       << ref[first] << "; worst " << worst;
  }
}

TEST_F(CudaGemm, CublasLtTypedGemmMatchesADoubleReference) {
  BackendOptions strict_opts, tf32_opts;
  strict_opts.device_count = 1;
  tf32_opts.device_count = 1;
  tf32_opts.allow_tf32 = true;
  cuda::CudaBackend strict(strict_opts), tf32(tf32_opts);
  ASSERT_FALSE(strict.allow_tf32());
  ASSERT_TRUE(tf32.allow_tf32());
  std::mt19937 gen(29);
  const Case cases[] = {{64, 48, 40}, {33, 17, 70}, {256, 192, 160}, {1, 8, 8}};
  int variant = 0;
  struct Kind {
    DType ab, c;
    bool tf32;
  };
  const Kind kinds[] = {{DType::f32, DType::f32, false},   {DType::f32, DType::f32, true},
                        {DType::bf16, DType::bf16, false}, {DType::bf16, DType::f32, false},
                        {DType::f16, DType::f16, false},   {DType::f16, DType::f32, false}};
  for (const Kind& k : kinds)
    for (const Case& z : cases)
      for (int t = 0; t < 4; ++t) {
        ++variant;
        const float alpha = variant % 3 == 0 ? 0.5f : 1.0f;
        const float beta = variant % 2 == 0 ? 1.0f : 0.0f;
        const bool bias = (variant / 2) % 2 == 1;
        check_lt(k.tf32 ? tf32 : strict, k.ab, k.c, k.tf32, t & 1, t & 2, z, alpha, beta, bias,
                 gen);
        if (HasFatalFailure()) return;
      }
}

// Kernels::gemm on f32 in fast mode: strict cuBLAS sgemm by default, cuBLASLt TF32 under
// allow_tf32; both within their tolerance of the double reference.
TEST_F(CudaGemm, F32GemmStrictByDefaultTf32WhenAllowed) {
  for (bool allow : {false, true}) {
    BackendOptions o;
    o.device_count = 1;
    o.allow_tf32 = allow;
    cuda::CudaBackend be(o);
    std::mt19937 gen(7);
    const Case z{96, 80, 128};
    const HostMatrix A = random_matrix(DType::f32, 96 * 128, gen);
    const HostMatrix B = random_matrix(DType::f32, 128 * 80, gen);
    DeviceBytes dA(be, A.bytes), dB(be, B.bytes), dC(be, std::vector<std::uint8_t>(96 * 80 * 4, 0));
    be.kernels().gemm(be.default_stream(0), false, false, z.M, z.N, z.K, 1.0f,
                      static_cast<const float*>(dA.p), z.K, static_cast<const float*>(dB.p), z.N,
                      0.0f, static_cast<float*>(dC.p), z.N, Determinism::fast);
    const std::vector<float> got = widen(DType::f32, dC.read());
    double worst = 0;
    for (std::int64_t i = 0; i < z.M; ++i)
      for (std::int64_t j = 0; j < z.N; ++j) {
        double acc = 0, mag = 0;
        for (std::int64_t k = 0; k < z.K; ++k) {
          const double p = double(A.values[i * z.K + k]) * B.values[k * z.N + j];
          acc += p;
          mag += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(got[i * z.N + j] - acc) / (mag + 1e-30));
      }
    EXPECT_LE(worst, tolerance(DType::f32, DType::f32, allow)) << "allow_tf32 " << allow;
  }
}

// A bias that is a view one element into its buffer (ops::linear takes any bias tensor): cuBLASLt's
// alignment preferences do not cover the bias, so a kernel that loads it 16 bytes at a time
// would fault with "misaligned address" (a sticky error: every later test of the process fails).
// blaslt_gemm declines it (lt_epilogue_valid) and gemm_ex's canonical kernel adds it, within the
// tolerance of the double reference, for f32, bf16 and f16; the context stays usable.
TEST_F(CudaGemm, MisalignedBiasTakesTheCanonicalKernel) {
  BackendOptions o;
  o.device_count = 1;
  cuda::CudaBackend be(o);
  std::mt19937 gen(41);
  const Case z{64, 48, 40};
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const std::string what = std::string(dtype_name(t)) + " bias at element 1 of its buffer";
    const HostMatrix A = random_matrix(t, static_cast<std::size_t>(z.M * z.K), gen);
    const HostMatrix B = random_matrix(t, static_cast<std::size_t>(z.N * z.K), gen);
    const HostMatrix Bias = random_matrix(t, static_cast<std::size_t>(z.N + 1), gen);
    DeviceBytes dA(be, A.bytes), dB(be, B.bytes), dBias(be, Bias.bytes);
    DeviceBytes dC(
        be, std::vector<std::uint8_t>(static_cast<std::size_t>(z.M * z.N) * dtype_size(t), 0));
    GemmExArgs g;
    g.trans_b = true;  // nn::Linear's x @ w^T + b
    g.M = z.M, g.N = z.N, g.K = z.K;
    g.A = dA.p, g.a_type = t, g.lda = z.K;
    g.B = dB.p, g.b_type = t, g.ldb = z.K;
    g.C = dC.p, g.c_type = t, g.ldc = z.N;
    g.epilogue = GemmEpilogue::bias;
    g.bias = static_cast<const std::uint8_t*>(dBias.p) + dtype_size(t);
    g.mode = Determinism::fast;
    {
      cuda::DeviceGuard guard(be.physical_device(0));
      EXPECT_FALSE(cuda::blaslt_gemm(be.cuda_stream(0), g, false, "test")) << what;
    }
    be.kernels().gemm_ex(be.default_stream(0), g);
    const std::vector<float> got = widen(t, dC.read());
    const double tol = tolerance(t, t, false, true);
    std::size_t bad = 0;
    for (std::int64_t i = 0; i < z.M; ++i)
      for (std::int64_t j = 0; j < z.N; ++j) {
        double acc = 0, mag = 0;
        for (std::int64_t k = 0; k < z.K; ++k) {
          const double p = double(A.values[static_cast<std::size_t>(i * z.K + k)]) *
                           B.values[static_cast<std::size_t>(j * z.K + k)];
          acc += p;
          mag += std::fabs(p);
        }
        const double bj = Bias.values[static_cast<std::size_t>(j + 1)];
        const double err = std::fabs(got[static_cast<std::size_t>(i * z.N + j)] - (acc + bj));
        if (!(err <= tol * (mag + std::fabs(bj) + 1e-30))) ++bad;
      }
    EXPECT_EQ(bad, 0u) << what << ": elements off by more than " << tol << " x scale";
  }
}

// The bitwise typed kernel through the ops (ops::matmul, ops::gemm, ops::linear on bf16 / f16:
// one gemm_ex, no f32 copies) gives the simulator's bits (its MixedOp path).
TEST_F(CudaGemm, BitwiseTypedOpsEqualTheSimulator) {
  std::mt19937 gen(3);
  for (DType t : {DType::bf16, DType::f16}) {
    auto run = [&](const char* backend, unsigned seed) {
      std::mt19937 g2(seed);
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      auto host = [&](std::vector<std::int64_t> shape) {
        std::int64_t n = 1;
        for (auto d : shape) n *= d;
        std::vector<float> v(static_cast<std::size_t>(n));
        for (float& x : v) x = u(g2);
        return Tensor::from_vector(v, Shape(shape.begin(), shape.end()))
            .to(t)
            .to(Device(backend, 0));
      };
      Tensor x = host({37, 70}), w = host({45, 70}), b = host({45}), c = host({45, 70});
      Tensor y = ops::matmul(x, w, false, true, Determinism::bitwise);    // [37, 45]
      Tensor l = ops::linear(x, w, b, Determinism::bitwise);              // [37, 45]
      ops::gemm(y, x, c, true, false, 0.5f, 1.0f, Determinism::bitwise);  // c += y^T x / 2
      std::vector<std::vector<float>> out;
      for (const Tensor* r : {&y, &l, &c}) out.push_back(r->to(DType::f32).to_vector<float>());
      return out;
    };
    const unsigned seed = gen();
    const auto cuda = run("cuda", seed), sim = run("sim", seed);
    for (std::size_t i = 0; i < sim.size(); ++i)
      EXPECT_TRUE(bits_equal(cuda[i], sim[i])) << dtype_name(t) << " result " << i;
  }
}

// ops::gemm_tn_sharded on bf16 / f16 dY and X (the bitwise weight gradient of a bf16 run): one
// Kernels::gemm_tn_sharded_ex, which reads them in their storage dtype (no f32 copy: nothing is
// allocated for up to kShardCap = 64 shards), with the simulator's bits (its MixedOp path), for a
// dW of f32 (nn::grad_dtype in bitwise mode) and of the storage dtype, accumulate on and off,
// ragged and empty shards and more shards than one launch takes.
TEST_F(CudaGemm, TypedShardedWeightGradientEqualsTheSimulator) {
  std::mt19937 gen(31);
  const std::int64_t rows = 150, M = 96, N = 70;
  const std::vector<std::vector<std::int64_t>> all_bounds = {{0, 150},
                                                             {0, 0, 40, 40, 149, 150},
                                                             micro_shard_bounds(rows, 8),
                                                             micro_shard_bounds(rows, 70)};
  for (DType t : {DType::bf16, DType::f16})
    for (DType ct : {DType::f32, t})
      for (const auto& bounds : all_bounds)
        for (bool acc : {false, true}) {
          const unsigned seed = gen();
          auto run = [&](const char* backend, std::size_t* scratch) {
            std::mt19937 g2(seed);
            std::uniform_real_distribution<float> u(-2.0f, 2.0f);
            auto host = [&](std::int64_t r, std::int64_t c, DType dt) {
              std::vector<float> v(static_cast<std::size_t>(r * c));
              for (float& x : v) x = u(g2);
              return Tensor::from_vector(v, Shape{r, c}).to(dt).to(Device(backend, 0));
            };
            Tensor a = host(rows, M, t), b = host(rows, N, t), c = host(M, N, ct);
            Backend& be = a.device().backend();
            current_stream(a.device()).synchronize();
            const std::size_t before = be.memory_stats(0).in_use;
            be.reset_peak_memory(0);
            ops::gemm_tn_sharded(a, b, c, bounds, acc);
            current_stream(a.device()).synchronize();
            if (scratch) *scratch = be.memory_stats(0).peak - before;
            return c.to(DType::f32).to_vector<float>();
          };
          std::size_t scratch = 0;
          const auto cuda = run("cuda", &scratch), sim = run("sim", nullptr);
          const std::string what = std::string(dtype_name(t)) + " -> " + dtype_name(ct) + ", " +
                                   std::to_string(bounds.size() - 1) + " shards, acc " +
                                   std::to_string(acc);
          EXPECT_TRUE(bits_equal(cuda, sim)) << what;
          if (bounds.size() - 1 <= 64) {
            EXPECT_EQ(scratch, 0u) << what << ": f32 copies were made";
          }
        }
}

// The cuBLASLt descriptor cache (cuda_blaslt.cpp, LtDescCache): a second identical call (other
// buffers of the same alignment, another beta) finds the first call's entry, makes no new
// descriptors and gives the same bits; a call of another shape misses.
TEST_F(CudaGemm, CublasLtDescriptorCacheReusesTheEntryOfAnIdenticalCall) {
  BackendOptions o;
  o.device_count = 1;
  cuda::CudaBackend be(o);
  std::mt19937 gen(5);
  const Case z{64, 48, 40};
  const HostMatrix A = random_matrix(DType::bf16, 64 * 40, gen);
  const HostMatrix B = random_matrix(DType::bf16, 40 * 48, gen);
  const HostMatrix Bias = random_matrix(DType::bf16, 48, gen);
  const std::vector<std::uint8_t> zeros(64 * 48 * 2, 0);
  DeviceBytes dA(be, A.bytes), dB(be, B.bytes), dBias(be, Bias.bytes);
  DeviceBytes dC1(be, zeros), dC2(be, zeros), dC3(be, zeros);
  cuda::CudaStream& s = be.cuda_stream(0);
  cuda::DeviceGuard guard(be.physical_device(0));
  auto call = [&](void* C, std::int64_t M) {
    GemmExArgs g;
    g.M = M, g.N = z.N, g.K = z.K;
    g.A = dA.p, g.a_type = DType::bf16, g.lda = z.K;
    g.B = dB.p, g.b_type = DType::bf16, g.ldb = z.N;
    g.C = C, g.c_type = DType::bf16, g.ldc = z.N;
    g.epilogue = GemmEpilogue::bias;
    g.bias = dBias.p;
    g.mode = Determinism::fast;
    return cuda::blaslt_gemm(s, g, false, "test");
  };
  const cuda::LtCacheStats s0 = cuda::blaslt_cache_stats(s);
  ASSERT_TRUE(call(dC1.p, z.M));
  const cuda::LtCacheStats s1 = cuda::blaslt_cache_stats(s);
  EXPECT_EQ(s1.misses, s0.misses + 1);
  EXPECT_EQ(s1.hits, s0.hits);
  ASSERT_TRUE(call(dC2.p, z.M));
  const cuda::LtCacheStats s2 = cuda::blaslt_cache_stats(s);
  EXPECT_EQ(s2.misses, s1.misses) << "an identical call made new descriptors";
  EXPECT_EQ(s2.hits, s1.hits + 1);
  EXPECT_EQ(s2.size, s1.size);
  EXPECT_EQ(dC1.read(), dC2.read()) << "the cached descriptors gave other bits";
  ASSERT_TRUE(call(dC3.p, z.M - 1));  // another shape: a new entry
  const cuda::LtCacheStats s3 = cuda::blaslt_cache_stats(s);
  EXPECT_EQ(s3.misses, s2.misses + 1);
  EXPECT_EQ(s3.size, s2.size + 1);
}

// What cuBLASLt's GELU epilogue computes (cuda::blaslt_gelu_epilogue): the tanh form (the GPT's
// GELU, gpt::gelu) or the erf form. No document says; the answer decides whether fast mode may
// fuse the GPT's GELU into the c_fc GEMM (issue 29). x spans [-6, 6] (the two forms differ by up
// to 4.7e-4, at x = -2.7, and agree to 1e-8 at |x| = 6); the test passes when the epilogue is
// one of them within a quarter of their largest difference, and prints which and how far.
TEST_F(CudaGemm, CublasLtGeluEpilogueIsTheTanhOrTheErfForm) {
  BackendOptions o;
  o.device_count = 1;
  cuda::CudaBackend be(o);
  const std::int64_t cols = cuda::kGeluProbeCols, rows = 128;
  std::vector<float> x(static_cast<std::size_t>(rows * cols)), eye(cols * cols, 0.0f);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = -6.0f + 12.0f * static_cast<float>(i) / static_cast<float>(x.size() - 1);
  for (std::int64_t i = 0; i < cols; ++i) eye[i * cols + i] = 1.0f;
  auto bytes = [](const std::vector<float>& v) {
    std::vector<std::uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  DeviceBytes dX(be, bytes(x)), dEye(be, bytes(eye)), dD(be, bytes(std::vector<float>(x.size())));
  {
    cuda::DeviceGuard guard(be.physical_device(0));
    cuda::blaslt_gelu_epilogue(be.cuda_stream(0), static_cast<const float*>(dX.p),
                               static_cast<const float*>(dEye.p), static_cast<float*>(dD.p), rows,
                               "CublasLtGeluEpilogue");
  }
  const std::vector<std::uint8_t> out = dD.read();
  std::vector<float> d(x.size());
  std::memcpy(d.data(), out.data(), out.size());
  double err_tanh = 0, err_erf = 0, spread = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    const double t = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    const double e = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    err_tanh = std::max(err_tanh, std::fabs(d[i] - t));
    err_erf = std::max(err_erf, std::fabs(d[i] - e));
    spread = std::max(spread, std::fabs(t - e));
  }
  const char* form = err_tanh < err_erf ? "tanh" : "erf";
  std::printf("note: cuBLASLt's CUBLASLT_EPILOGUE_GELU is the %s form: max |d - tanh form| %.3g, "
              "max |d - erf form| %.3g (the forms differ by up to %.3g)\n",
              form, err_tanh, err_erf, spread);
  RecordProperty("gelu_epilogue_form", form);
  EXPECT_GT(spread, 4e-4);
  EXPECT_LT(std::min(err_tanh, err_erf), spread / 4)
      << "the epilogue is neither form: tanh " << err_tanh << ", erf " << err_erf;
}

// The GELU epilogues through Kernels::gemm_ex (fast mode; issue 29): gelu_aux_bias (with a bias
// and without: GELU_AUX) writes the pre-GELU x @ w^T (+ bias) into aux and its tanh-form GELU into
// C, dgelu writes gelu'(aux) * (gy @ w) into C, against a double reference, for f32, bf16 and
// f16, where cuBLASLt fuses them (N = 48: aux rows of 16 bytes) and where the backend falls back
// to the GEMM and its GELU kernel (N = 20: an aux stride cuBLASLt refuses). Tolerance: the
// GEMM's (tolerance above, two roundings: the fallback rounds the product, then the GELU) times
// GELU's largest slope, plus 2e-4 of the value (a GELU within the probe's tolerance of the tanh
// form). Prints whether the backend fuses (its probe's answer).
TEST_F(CudaGemm, GeluEpiloguesMatchAReference) {
  BackendOptions o;
  o.device_count = 1;
  cuda::CudaBackend be(o);
  std::mt19937 gen(31);
  auto gelu = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  };
  auto gelu_grad = [](double x) {
    const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::printf("note: %s: has_gemm_gelu_epilogue %d\n", dtype_name(t),
                be.kernels().has_gemm_gelu_epilogue(t, Determinism::fast) ? 1 : 0);
    for (const Case& z : {Case{64, 48, 40}, Case{33, 20, 70}})
      for (int kind = 0; kind < 3; ++kind) {  // gelu_aux_bias with a bias, without, dgelu
        const bool backward = kind == 2, bias = kind == 0;
        const std::string what = std::string(dtype_name(t)) + " " + std::to_string(z.M) + "x" +
                                 std::to_string(z.N) + "x" + std::to_string(z.K) +
                                 (backward ? " dgelu"
                                  : bias   ? " gelu_aux_bias"
                                           : " gelu_aux");
        // forward: A = x [M, K], B = w [N, K] (trans_b); backward: A = gy [M, K], B = w [K, N].
        const HostMatrix A = random_matrix(t, static_cast<std::size_t>(z.M * z.K), gen);
        const HostMatrix B = random_matrix(t, static_cast<std::size_t>(z.N * z.K), gen);
        const HostMatrix Bias = random_matrix(t, static_cast<std::size_t>(z.N), gen);
        HostMatrix Aux = random_matrix(t, static_cast<std::size_t>(z.M * z.N), gen);
        for (float& v : Aux.values) v *= 3.0f;  // dgelu's pre-GELU over [-3, 3]: bytes below
        Aux = host_matrix(t, Aux.values);
        DeviceBytes dA(be, A.bytes), dB(be, B.bytes), dBias(be, Bias.bytes), dAux(be, Aux.bytes);
        DeviceBytes dC(be, std::vector<std::uint8_t>(Aux.bytes.size(), 0));
        GemmExArgs g;
        g.trans_b = !backward;
        g.M = z.M, g.N = z.N, g.K = z.K;
        g.A = dA.p, g.a_type = t, g.lda = z.K;
        g.B = dB.p, g.b_type = t, g.ldb = backward ? z.N : z.K;
        g.C = dC.p, g.c_type = t, g.ldc = z.N;
        g.epilogue = backward ? GemmEpilogue::dgelu : GemmEpilogue::gelu_aux_bias;
        g.bias = bias ? dBias.p : nullptr;
        g.aux = dAux.p, g.ld_aux = z.N;
        g.mode = Determinism::fast;
        be.kernels().gemm_ex(be.default_stream(0), g);
        const std::vector<float> c = widen(t, dC.read()), aux = widen(t, dAux.read());
        const double tol = 1.2 * tolerance(t, t, false, true);
        std::size_t bad = 0;
        double worst = 0;
        for (std::int64_t i = 0; i < z.M; ++i)
          for (std::int64_t j = 0; j < z.N; ++j) {
            double acc = 0, mag = 0;
            for (std::int64_t k = 0; k < z.K; ++k) {
              const double a = A.values[static_cast<std::size_t>(i * z.K + k)];
              const double b =
                  B.values[static_cast<std::size_t>(backward ? k * z.N + j : j * z.K + k)];
              acc += a * b;
              mag += std::fabs(a * b);
            }
            const std::size_t at = static_cast<std::size_t>(i * z.N + j);
            const double bj = bias ? Bias.values[static_cast<std::size_t>(j)] : 0.0;
            const double scale = mag + std::fabs(bj) + 1e-30;
            double got = c[at], want = 0;
            if (backward) {
              want = gelu_grad(Aux.values[at]) * acc;
            } else {
              want = gelu(acc + bj);
              const double pre_err = std::fabs(aux[at] - (acc + bj));
              if (!(pre_err <= tol * scale) && bad++ == 0)
                ADD_FAILURE() << what << ": aux[" << at << "] " << aux[at] << " vs " << acc + bj;
            }
            const double err = std::fabs(got - want);
            worst = std::max(worst, err / scale);
            if (!(err <= tol * scale + 2e-4 * (1.0 + std::fabs(want))) && bad++ == 0)
              ADD_FAILURE() << what << ": C[" << at << "] " << got << " vs " << want;
          }
        EXPECT_EQ(bad, 0u) << what << ": worst " << worst << " x scale";
        if (!backward) continue;
        EXPECT_EQ(aux, Aux.values) << what << ": dgelu wrote its aux input";
      }
  }
}

}  // namespace
}  // namespace ditto
#endif  // DITTO_TEST_CUDA_BUILT
