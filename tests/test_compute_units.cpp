// The cost model's compute units (Note [Compute units], backend_sim/cost_model.h; issue 29 item
// 5): each kernel priced on the unit ditto's CUDA backend runs it on. A GEMM's FLOP and byte
// counts; fast-mode GEMMs on cuBLASLt's tensor cores (bf16, f16, TF32 with allow_tf32) or strict
// FP32; bitwise GEMMs on ditto's SIMT kernel at simt_efficiency; attention on the SIMT cores
// without [B, H, T, T] bytes; the per-kernel ledger and the --verbose table, whose rows add up to
// the predicted step; and GPT-2 124M bf16 B 8 on one H200, fast and bitwise, computed here from
// the model's shapes and the profile's rates. Virtual times are exact integers (picoseconds)
// from the model, never wall-clock timings.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backend_cuda/cuda_host_logic.h"
#include "backend_sim/cost_model.h"
#include "backend_sim/profiles.h"
#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_run.h"
#include "core/data/synthetic_source.h"
#include "core/nn/gpt.h"
#include "core/optim/adamw.h"
#include "core/optim/clip.h"
#include "core/optim/master_weights.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "core/train/cost_meter.h"
#include "core/train/trainer.h"
#include "test_util.h"
#include "trainer_test_util.h"

using namespace ditto;
using sim::GemmPath;
using sim::KernelCost;
using sim::PricedUnit;

namespace {

// The H200 profile's figures, from its data sheet and the published fractions (profiles.cpp).
constexpr double kFp32 = 67e12, kTf32 = 494.5e12, kBf16 = 989.5e12, kF16 = 989.5e12;
constexpr double kBw = 4.8e12, kLaunch = 3e-6;
constexpr double kGemmEff = 794.5 / 989, kHbmEff = 4.15 / 4.8, kSimtEff = 18.237 / 38.7;
constexpr double kMmaEff = 0.25;  // profiles.cpp's estimate for ditto's mma.sync kernels

sim::SimBackend& fresh_sim(bool dry, bool allow_tf32 = false) {
  BackendOptions o;
  o.device_count = 1;
  o.dry_run = dry;
  o.allow_tf32 = allow_tf32;
  sim::SimBackend& be = *init_backend("sim", o).extension<sim::SimBackend>();
  be.cost_model().configure(
      {sim::device_profile("h200"), sim::interconnect_profile("nvlink"), 1, 1});
  return be;
}

// Device 0's ledger row named `name` (count 0 when there is none).
sim::CostModel::LedgerRow row(sim::SimBackend& be, const std::string& name) {
  for (const auto& r : be.cost_model().ledger(0))
    if (r.name == name) return r;
  return {};
}

// The work of row `name` since the ledger was `before` (its count, FLOPs, bytes and time).
sim::CostModel::LedgerRow row_since(sim::SimBackend& be, const std::string& name,
                                    const std::vector<sim::CostModel::LedgerRow>& before) {
  sim::CostModel::LedgerRow r = row(be, name);
  for (const auto& o : before)
    if (o.name == name) {
      r.count -= o.count;
      r.flops -= o.flops;
      r.bytes -= o.bytes;
      r.time -= o.time;
    }
  return r;
}

// A memory-bound kernel's seconds on the H200: launch latency + bytes / (HBM x
// memory_efficiency).
double memory_time(double launches, double bytes) {
  return launches * kLaunch + bytes / (kBw * kHbmEff);
}

}  // namespace

TEST(ComputeUnits, H200ProfileCarriesEveryRateWithItsSource) {
  const sim::DeviceProfile h = sim::device_profile("h200");
  EXPECT_DOUBLE_EQ(h.fp32_flops, kFp32);
  EXPECT_DOUBLE_EQ(h.tf32_flops, kTf32);
  EXPECT_DOUBLE_EQ(h.bf16_flops, kBf16);
  EXPECT_DOUBLE_EQ(h.f16_flops, kF16);
  EXPECT_DOUBLE_EQ(h.simt_efficiency, kSimtEff);
  for (const sim::DeviceProfile& p : sim::builtin_device_profiles()) {
    SCOPED_TRACE(p.key);
    EXPECT_GT(p.f16_flops, 0.0);
    EXPECT_GE(p.bf16_flops, p.tf32_flops);
    EXPECT_GE(p.tf32_flops, p.fp32_flops);
    EXPECT_DOUBLE_EQ(p.simt_efficiency, kSimtEff);
  }
  EXPECT_DOUBLE_EQ(sim::device_profile("a100-sxm-80gb").f16_flops, 312e12);
}

// A GEMM's FLOPs are 2 M N K and its bytes A, B and C (C twice when beta != 0: read and
// written), in the operands' storage dtype; the ledger counts them per launch.
TEST(ComputeUnits, GemmFlopsAndBytesInTheLedger) {
  sim::SimBackend& be = fresh_sim(false);
  const std::int64_t M = 48, N = 40, K = 24;
  const Device dev("sim", 0);
  Tensor a = Tensor::zeros({M, K}, DType::f32, dev), b = Tensor::zeros({K, N}, DType::f32, dev);
  Tensor c = Tensor::zeros({M, N}, DType::f32, dev);
  be.default_stream(0).synchronize();
  ops::gemm(a, b, c, false, false, 1.0f, 0.0f, Determinism::fast);
  ops::gemm(a, b, c, false, false, 1.0f, 1.0f, Determinism::fast);
  be.default_stream(0).synchronize();
  sim::CostModel::LedgerRow g = row(be, "gemm");
  EXPECT_EQ(g.count, 2);
  EXPECT_DOUBLE_EQ(g.flops, 2 * (2.0 * M * N * K));
  EXPECT_DOUBLE_EQ(g.bytes, 4.0 * (M * K + K * N + M * N) + 4.0 * (M * K + K * N + 2.0 * M * N));
  // bf16 operands: half the bytes, the same FLOPs (the conversions are free: Note [Mixed
  // precision]).
  Tensor a16 = Tensor::zeros({M, K}, DType::bf16, dev),
         b16 = Tensor::zeros({K, N}, DType::bf16, dev);
  be.default_stream(0).synchronize();
  (void)ops::matmul(a16, b16, false, false, Determinism::fast);
  be.default_stream(0).synchronize();
  const sim::CostModel::LedgerRow g2 = row(be, "gemm");
  EXPECT_EQ(g2.count, 3);
  EXPECT_DOUBLE_EQ(g2.flops - g.flops, 2.0 * M * N * K);
  EXPECT_DOUBLE_EQ(g2.bytes - g.bytes, 2.0 * (M * K + K * N + M * N));
}

// Each path of a compute-bound GEMM (4096^3) at its own rate (Note [Compute units]).
TEST(ComputeUnits, GemmPricedOnTheUnitItRunsOn) {
  const sim::DeviceProfile h = sim::device_profile("h200");
  const double n = 4096, flops = 2 * n * n * n;
  KernelCost f32{flops, 4 * 3 * n * n, true};
  auto price = [&](KernelCost k, bool tf32 = false) { return sim::kernel_price(h, k, tf32); };
  // fast, bf16 operands: cuBLASLt on the tensor cores.
  const sim::KernelPrice bf16 = price(sim::native_cost(f32, DType::bf16));
  EXPECT_EQ(bf16.unit, PricedUnit::tensor_core_bf16);
  EXPECT_NEAR(bf16.seconds, kLaunch + flops / (kBf16 * kGemmEff), 1e-15);
  EXPECT_NEAR(bf16.seconds, 175.9e-6, 0.1e-6);  // 137.4 GFLOP at 794.9 TFLOP/s
  const sim::KernelPrice f16 = price(sim::native_cost(f32, DType::f16));
  EXPECT_EQ(f16.unit, PricedUnit::tensor_core_f16);
  EXPECT_NEAR(f16.seconds, kLaunch + flops / (kF16 * kGemmEff), 1e-15);
  // fast, f32: strict FP32 on the SIMT cores by default, TF32 tensor cores with allow_tf32.
  const sim::KernelPrice strict = price(f32);
  EXPECT_EQ(strict.unit, PricedUnit::simt_library);
  EXPECT_NEAR(strict.seconds, kLaunch + flops / (kFp32 * kGemmEff), 1e-15);
  const sim::KernelPrice tf32 = price(f32, true);
  EXPECT_EQ(tf32.unit, PricedUnit::tensor_core_tf32);
  EXPECT_NEAR(tf32.seconds, kLaunch + flops / (kTf32 * kGemmEff), 1e-15);
  // bitwise: ditto's fma-chain kernel on the SIMT cores, whatever the storage dtype and
  // allow_tf32 (bits never depend on it).
  KernelCost bitwise = sim::native_cost(f32, DType::bf16);
  bitwise.path = GemmPath::simt;
  for (bool allow : {false, true}) {
    const sim::KernelPrice p = price(bitwise, allow);
    EXPECT_EQ(p.unit, PricedUnit::simt_ditto);
    EXPECT_NEAR(p.seconds, kLaunch + flops / (kFp32 * kSimtEff), 1e-15);
    EXPECT_NEAR(p.seconds, 4.356e-3, 1e-6);  // 137.4 GFLOP at 31.6 TFLOP/s
  }
  // The ratio the two modes' GEMMs differ by: (989.5 x 0.803) / (67 x 0.471) = 25.2.
  EXPECT_NEAR((price(bitwise).seconds - kLaunch) / (bf16.seconds - kLaunch), 25.17, 0.01);
  // A memory-bound GEMM (an outer product) is priced on the memory whatever its path.
  const sim::KernelPrice outer =
      price(sim::native_cost({2 * n * n, 4 * (2 * n + n * n), true}, DType::bf16));
  EXPECT_EQ(outer.unit, PricedUnit::memory);
  EXPECT_EQ(outer.compute_unit, PricedUnit::tensor_core_bf16);
  EXPECT_NEAR(outer.seconds, kLaunch + 2 * (2 * n + n * n) / (kBw * kHbmEff), 1e-15);
}

// The simulator's own gemm and gemm_tn_sharded take their path from the determinism mode, and
// BackendOptions::allow_tf32 reaches the cost model (a dry run: nothing computed).
TEST(ComputeUnits, SimKernelsTakeTheirPathFromTheModeAndAllowTf32) {
  const std::int64_t n = 1024;  // 2.1 GFLOP over 12.6 MB: compute bound on every unit
  const double flops = 2.0 * n * n * n;
  for (bool allow : {false, true}) {
    SCOPED_TRACE(allow ? "allow_tf32" : "strict f32");
    sim::SimBackend& be = fresh_sim(true, allow);
    EXPECT_EQ(be.cost_model().allow_tf32(), allow);
    const Device dev("sim", 0);
    Tensor a = Tensor::empty({n, n}, DType::f32, dev), c = Tensor::empty({n, n}, DType::f32, dev);
    ops::gemm(a, a, c, false, false, 1.0f, 0.0f, Determinism::fast);
    ops::gemm(a, a, c, false, false, 1.0f, 0.0f, Determinism::bitwise);
    ops::gemm_tn_sharded(a, a, c, {0, n / 2, n}, false);
    be.default_stream(0).synchronize();
    const auto ledger = be.cost_model().ledger(0);
    std::map<std::string, sim::CostModel::LedgerRow> by;
    for (const auto& r : ledger) by[r.name + " / " + sim::unit_name(r.unit)] = r;
    const std::string fast_key =
        std::string("gemm / ") + (allow ? "tensor core tf32" : "SIMT f32 (cuBLASLt)");
    ASSERT_TRUE(by.count(fast_key)) << fast_key;
    ASSERT_TRUE(by.count("gemm / SIMT f32 (ditto)"));
    ASSERT_TRUE(by.count("gemm_tn_sharded / SIMT f32 (ditto)"));
    const double fast_rate = (allow ? kTf32 : kFp32) * kGemmEff;
    EXPECT_EQ(by[fast_key].time, sim::to_vtime(kLaunch + flops / fast_rate));
    EXPECT_EQ(by["gemm / SIMT f32 (ditto)"].time,
              sim::to_vtime(kLaunch + flops / (kFp32 * kSimtEff)));
    EXPECT_EQ(by["gemm_tn_sharded / SIMT f32 (ditto)"].time,
              sim::to_vtime(kLaunch + flops / (kFp32 * kSimtEff)));
  }
}

// Attention (ditto's kernels, SIMT cores in both modes): its matrix-product FLOPs at the SIMT
// rate x simt_efficiency, the rest at the FP32 peak; its bytes q, k, v, y and the softmax stats
// (8 bytes per row), never the [B, H, T, T] weights.
TEST(ComputeUnits, AttentionOnSimtWithoutTTBytes) {
  sim::SimBackend& be = fresh_sim(true);
  const std::int64_t B = 8, T = 1024, C = 768, H = 12, hd = C / H;
  const Device dev("sim", 0);
  Tensor qkv = Tensor::empty({B, T, 3 * C}, DType::f32, dev);
  Tensor y = Tensor::empty({B, T, C}, DType::f32, dev);
  Tensor stats = Tensor::empty({B * H * T * 2}, DType::f32, dev);
  be.kernels().attention_forward(be.default_stream(0), qkv.data<float>(), B, T, C, H,
                                 y.data<float>(), stats.data<float>(), 0.0f, 0, 0, 0,
                                 Determinism::bitwise);
  be.default_stream(0).synchronize();
  const sim::CostModel::LedgerRow a = row(be, "attention_forward");
  ASSERT_EQ(a.count, 1);
  const double pairs = double(B) * H * T * (T + 1) / 2;  // causal (query, key) pairs
  EXPECT_DOUBLE_EQ(a.flops, pairs * (4.0 * hd + 24));
  const double bytes = 4.0 * (B * T * 3 * C + B * T * C) + 4.0 * 2 * B * H * T;
  EXPECT_DOUBLE_EQ(a.bytes, bytes);
  EXPECT_LT(a.bytes, 4.0 * B * H * T * T / 3);  // a quarter of att [B, H, T, T] in f32 alone
  const double compute = pairs * 4 * hd / (kFp32 * kSimtEff) + pairs * 24 / kFp32;
  ASSERT_GT(compute, bytes / (kBw * kHbmEff));  // compute bound on the SIMT cores
  EXPECT_EQ(a.time, sim::to_vtime(kLaunch + compute));
  EXPECT_EQ(a.unit, PricedUnit::simt_ditto);
}

// The f32 attention backward (Kernels::attention_backward) in a dry run, as CUDA's tiled kernels
// run it (Note [CUDA attention]): given the forward's output y (ops::attention_backward's y, which
// nn::CausalSelfAttention passes), fast mode reads pd = rowsum(dy * y) from it: 7 T x T x hd
// products over the causal pairs, not 9, plus 2 C FLOPs and y's 4 C bytes a token, in CUDA's two
// launches. Bitwise mode, no y, or heads wider than 128 (the reference kernels) make 9. A real run
// keeps the simulator's price (9, one launch) whatever y.
TEST(ComputeUnits, DryRunF32AttentionBackwardGivenYMakesSevenProducts) {
  struct Case {
    bool dry;
    std::int64_t B, T, C, H;
    Determinism mode;
    bool with_y;
    double products;
  };
  for (const Case& c : {Case{true, 64, 256, 384, 6, Determinism::fast, true, 7},  // the char model
                        Case{true, 64, 256, 384, 6, Determinism::fast, false, 9},
                        Case{true, 64, 256, 384, 6, Determinism::bitwise, true, 9},
                        Case{true, 2, 64, 272, 2, Determinism::fast, true, 9},  // hd 136
                        Case{false, 2, 64, 128, 2, Determinism::fast, true, 9}}) {
    SCOPED_TRACE(std::string(c.dry ? "dry" : "real") + " C " + std::to_string(c.C) + " " +
                 determinism_name(c.mode) + (c.with_y ? " given y" : ""));
    sim::SimBackend& be = fresh_sim(c.dry);
    const Device dev("sim", 0);
    const Tensor qkv = Tensor::zeros({c.B, c.T, 3 * c.C}, DType::f32, dev);
    const Tensor dy = Tensor::zeros({c.B, c.T, c.C}, DType::f32, dev);
    Tensor stats;
    const Tensor y = ops::attention(qkv, c.H, stats, 0.0f, 0, 0, 0, c.mode);
    const auto before = be.cost_model().ledger(0);
    ops::attention_backward(dy, qkv, stats, c.H, 0.0f, 0, 0, 0, c.mode, c.with_y ? y : Tensor());
    be.default_stream(0).synchronize();
    const sim::CostModel::LedgerRow r = row_since(be, "attention_backward", before);
    const double hd = double(c.C / c.H), tokens = double(c.B * c.T),
                 pairs = double(c.B * c.H) * c.T * (c.T + 1) / 2;
    const double d_flops = c.products == 7 ? 2 * tokens * c.C : 0;
    const int launches = c.dry ? 2 : 1;
    EXPECT_EQ(r.count, launches);
    EXPECT_DOUBLE_EQ(r.flops, pairs * (2 * c.products * hd + 26) + d_flops);
    EXPECT_DOUBLE_EQ(
        r.bytes, 4.0 * (tokens * (c.products == 7 ? 8 : 7) * c.C + 3 * double(c.B * c.H) * c.T));
    EXPECT_EQ(r.unit, PricedUnit::simt_ditto);
    EXPECT_EQ(r.time,
              sim::to_vtime(launches * kLaunch + pairs * 2 * c.products * hd / (kFp32 * kSimtEff) +
                            (pairs * 26 + d_flops) / kFp32));
  }
}

// ---- the typed GEMM and MixedOp's scratch as the CUDA backend runs them -----------------------

// Note [Predicted launches]: a dry run answers has_gemm_ex as the CUDA backend does
// (cuda_host_logic.h's typed_gemm_supported: a == b in {f32, bf16, f16}, c in {a, f32}), in both
// modes; a real run answers false (it keeps MixedOp's path and bits).
TEST(ComputeUnits, DryRunHasTheCudaBackendsTypedGemm) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (DType a : kAllDTypes)
      for (DType b : kAllDTypes)
        for (DType c : kAllDTypes)
          for (Determinism mode : {Determinism::fast, Determinism::bitwise})
            EXPECT_EQ(k.has_gemm_ex(a, b, c, mode), dry && cuda::typed_gemm_supported(a, b, c))
                << dtype_name(a) << " " << dtype_name(b) << " " << dtype_name(c)
                << (dry ? " dry" : " real");
    // The typed micro-sharded dW likewise (bitwise mode's weight gradient).
    for (DType a : kAllDTypes)
      for (DType b : kAllDTypes)
        for (DType c : kAllDTypes)
          EXPECT_EQ(k.has_gemm_tn_sharded_ex(a, b, c),
                    dry && cuda::typed_sharded_gemm_supported(a, b, c))
              << dtype_name(a) << " " << dtype_name(b) << " " << dtype_name(c)
              << (dry ? " dry" : " real");
  }
}

// A Linear in a dry run is one gemm_ex launch, as on CUDA: bf16 x, w, bias, y; no f32 copies of
// x or w, no add_bias; FLOPs 2 M N K, bytes x, w, y and bias in bf16; fast mode on the bf16
// tensor cores at gemm_efficiency, bitwise on ditto's SIMT kernel. An f32 Linear with a bias
// takes gemm_ex too (CUDA's bias epilogue), on the SIMT cores at cuBLASLt's rate. The memory is
// y alone (a real run's MixedOp path charges the same: its scratch is uncharged).
TEST(ComputeUnits, DryRunLinearIsOneTypedGemmWithTheBiasInItsEpilogue) {
  const std::int64_t M = 2048, N = 3072, K = 768;
  const double flops = 2.0 * M * N * K, bytes16 = 2.0 * (M * K + N * K + M * N + N);
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    const bool bitwise = mode == Determinism::bitwise;
    SCOPED_TRACE(bitwise ? "bitwise" : "fast");
    sim::SimBackend& be = fresh_sim(true);
    const Device dev("sim", 0);
    Tensor x = Tensor::empty({M, K}, DType::bf16, dev), w = Tensor::empty({N, K}, DType::bf16, dev);
    Tensor bias = Tensor::empty({N}, DType::bf16, dev);
    be.default_stream(0).synchronize();
    const std::size_t before = be.memory_stats(0).in_use;
    be.reset_peak_memory(0);
    Tensor y = ops::linear(x, w, bias, mode);
    be.default_stream(0).synchronize();
    EXPECT_EQ(y.dtype(), DType::bf16);
    EXPECT_EQ(be.memory_stats(0).peak - before, std::size_t(2 * M * N));  // y, no scratch
    const auto ledger = be.cost_model().ledger(0);
    ASSERT_EQ(ledger.size(), 1u) << ledger[1].name;  // no cast_f32_scratch, no add_bias
    const sim::CostModel::LedgerRow g = ledger[0];
    EXPECT_EQ(g.name, "gemm_ex");
    EXPECT_EQ(g.count, 1);
    EXPECT_DOUBLE_EQ(g.flops, flops);
    EXPECT_DOUBLE_EQ(g.bytes, bytes16);
    EXPECT_EQ(g.unit, bitwise ? PricedUnit::simt_ditto : PricedUnit::tensor_core_bf16);
    const double rate = bitwise ? kFp32 * kSimtEff : kBf16 * kGemmEff;
    EXPECT_EQ(g.time, sim::to_vtime(kLaunch + flops / rate));
  }
  sim::SimBackend& be = fresh_sim(true);
  const Device dev("sim", 0);
  Tensor x = Tensor::empty({M, K}, DType::f32, dev), w = Tensor::empty({N, K}, DType::f32, dev);
  Tensor bias = Tensor::empty({N}, DType::f32, dev);
  (void)ops::linear(x, w, bias, Determinism::fast);
  be.default_stream(0).synchronize();
  const sim::CostModel::LedgerRow g = row(be, "gemm_ex");
  EXPECT_EQ(g.count, 1);
  EXPECT_DOUBLE_EQ(g.bytes, 2 * bytes16);
  EXPECT_EQ(g.unit, PricedUnit::simt_library);
  EXPECT_EQ(row(be, "add_bias").count, 0);
  // gemm_ex_cost itself: C read and written when beta != 0, each operand in its own dtype.
  GemmExArgs a;
  a.M = 4, a.N = 8, a.K = 16, a.a_type = DType::f16, a.b_type = DType::f16, a.c_type = DType::f32;
  a.beta = 1.0f;
  const KernelCost c = sim::gemm_ex_cost(a);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * (4 * 16 + 16 * 8) + 2 * 4.0 * (4 * 8));
  EXPECT_EQ(c.operands, DType::f16);
  EXPECT_EQ(c.path, GemmPath::library);
  EXPECT_TRUE(c.gemm);
}

// An op with no typed CUDA kernel (ReLU here) runs on bf16 tensors through MixedOp's f32 scratch
// on CUDA, and a dry run prices it so (Note [Predicted launches]): x converted (a cast launch, n
// x (2 + 4) bytes), the f32 kernel over f32 bytes, y rounded back (another cast), and the f32
// scratch charged to the device. A real run prices the native kernel (bf16 bytes, free
// conversions) and charges only y.
TEST(ComputeUnits, DryRunPricesMixedOpScratchAsCudaRunsIt) {
  const std::int64_t n = 1 << 20;
  for (bool dry : {true, false}) {
    SCOPED_TRACE(dry ? "dry run" : "real run");
    sim::SimBackend& be = fresh_sim(dry);
    const Device dev("sim", 0);
    Tensor x = Tensor::zeros({n}, DType::bf16, dev);
    be.default_stream(0).synchronize();
    const std::size_t before = be.memory_stats(0).in_use;
    be.reset_peak_memory(0);
    const auto ledger_before = be.cost_model().ledger(0);
    Tensor y = ops::relu(x);
    be.default_stream(0).synchronize();
    EXPECT_EQ(y.dtype(), DType::bf16);
    const sim::CostModel::LedgerRow g = row(be, "relu");
    EXPECT_EQ(g.count, 1);
    const sim::CostModel::LedgerRow casts = row(be, "cast_f32_scratch");
    if (dry) {
      EXPECT_DOUBLE_EQ(g.bytes, 8.0 * n);  // f32 in, f32 out
      EXPECT_EQ(casts.count, 2);           // x in, y out
      EXPECT_DOUBLE_EQ(casts.bytes, 2 * 6.0 * n);
      EXPECT_EQ(casts.unit, PricedUnit::memory);
      EXPECT_EQ(casts.time, 2 * sim::to_vtime(kLaunch + 6.0 * n / (kBw * kHbmEff)));
      // The f32 copy of x and the f32 result, then that result and y.
      EXPECT_EQ(be.memory_stats(0).peak - before, std::size_t(4 * n + 4 * n));
    } else {
      EXPECT_DOUBLE_EQ(g.bytes, 4.0 * n);  // bf16 in, bf16 out
      EXPECT_EQ(casts.count, 0);
      EXPECT_EQ(be.memory_stats(0).peak - before, std::size_t(2 * n));
    }
  }
}

// GELU has a typed CUDA kernel (Kernels::has_rows_ex): a dry run prices one gelu_forward_ex
// launch over bf16 bytes, no casts and no f32 scratch, as CUDA runs it (Note [Typed kernels]).
TEST(ComputeUnits, DryRunRowOpsTakeTheTypedKernels) {
  const std::int64_t n = 1 << 20;
  sim::SimBackend& be = fresh_sim(true);
  const Device dev("sim", 0);
  EXPECT_TRUE(be.kernels().has_rows_ex(DType::bf16, Determinism::bitwise));
  EXPECT_FALSE(be.kernels().has_rows_ex(DType::f32, Determinism::fast));
  EXPECT_FALSE(fresh_sim(false).kernels().has_rows_ex(DType::bf16, Determinism::fast));
  sim::SimBackend& dry = fresh_sim(true);
  Tensor x = Tensor::zeros({n}, DType::bf16, dev);
  dry.default_stream(0).synchronize();
  const std::size_t before = dry.memory_stats(0).in_use;
  dry.reset_peak_memory(0);
  Tensor y = ops::gelu(x);
  dry.default_stream(0).synchronize();
  EXPECT_EQ(y.dtype(), DType::bf16);
  const sim::CostModel::LedgerRow g = row(dry, "gelu_forward_ex");
  EXPECT_EQ(g.count, 1);
  EXPECT_DOUBLE_EQ(g.bytes, 4.0 * n);  // bf16 in, bf16 out
  EXPECT_EQ(row(dry, "cast_f32_scratch").count, 0);
  EXPECT_EQ(row(dry, "gelu_forward").count, 0);
  EXPECT_EQ(dry.memory_stats(0).peak - before, std::size_t(2 * n));  // y alone
}

// The bias and LayerNorm gradients' reductions over rows have typed CUDA kernels
// (Kernels::has_sum_rows_ex, cuda_host_logic.h's typed_sum_rows_supported: x bf16 / f16, out x's
// dtype or f32, both modes): a dry run answers as CUDA does (a real run no) and prices one
// sum_rows_ex / sum_rows_sharded_ex launch over x and out in their dtypes (sum_rows_ex_cost), no
// casts and no f32 scratch (Note [Typed kernels]); fast mode's sum_rows_ex over 4096 rows is
// CUDA's one launch over 43 row chunks, their f32 partials written and read
// (FastRowSumsPriceCudasRowChunks).
TEST(ComputeUnits, DryRunRowSumsTakeTheTypedKernels) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (DType x : kAllDTypes)
      for (DType out : kAllDTypes)
        for (Determinism mode : {Determinism::fast, Determinism::bitwise})
          EXPECT_EQ(k.has_sum_rows_ex(x, out, mode), dry && cuda::typed_sum_rows_supported(x, out))
              << dtype_name(x) << " " << dtype_name(out) << (dry ? " dry" : " real");
  }
  const std::int64_t rows = 4096, cols = 768;
  const KernelCost c = sim::sum_rows_ex_cost(rows, cols, DType::bf16, DType::f32);
  EXPECT_DOUBLE_EQ(c.flops, double(rows) * cols);
  EXPECT_DOUBLE_EQ(c.bytes, 2.0 * rows * cols + 4.0 * cols);
  EXPECT_EQ(c.operands, DType::bf16);
  EXPECT_EQ(c.launches, 1);
  sim::SimBackend& dry = fresh_sim(true);
  const Device dev("sim", 0);
  Tensor x = Tensor::zeros({rows, cols}, DType::bf16, dev);
  Tensor gb = Tensor::zeros({cols}, DType::bf16, dev), gf = Tensor::zeros({cols}, DType::f32, dev);
  dry.default_stream(0).synchronize();
  const std::size_t before = dry.memory_stats(0).in_use;
  dry.reset_peak_memory(0);
  ops::sum_rows(x, gb, 1.0f, Determinism::fast);                              // fast: grads in bf16
  ops::sum_rows_sharded(x, gf, {0, 1000, 1000, rows}, /*accumulate=*/false);  // bitwise: f32
  dry.default_stream(0).synchronize();
  const sim::CostModel::LedgerRow a = row(dry, "sum_rows_ex"), b = row(dry, "sum_rows_sharded_ex");
  const double chunks = 43;  // cuda::fast_row_chunks(4096, 768): 42 of 96 rows and one of 64
  EXPECT_EQ(a.count, 1);
  EXPECT_EQ(b.count, 1);
  EXPECT_DOUBLE_EQ(a.bytes, 2.0 * rows * cols + 2.0 * cols + 8.0 * chunks * cols);
  EXPECT_DOUBLE_EQ(b.bytes, 2.0 * rows * cols + 4.0 * cols);
  EXPECT_EQ(a.unit, PricedUnit::memory);
  EXPECT_EQ(a.time, sim::to_vtime(kLaunch + a.bytes / (kBw * kHbmEff)));
  EXPECT_EQ(row(dry, "cast_f32_scratch").count, 0);
  EXPECT_EQ(row(dry, "sum_rows").count + row(dry, "sum_rows_sharded").count, 0);
  EXPECT_EQ(dry.memory_stats(0).peak, before);  // no scratch
}

// CUDA's fast sum_rows splits the rows of a narrow matrix into chunks (Note [CUDA row sums],
// cuda_host_logic.h's fast_row_chunks): past 512 rows, chunks of at least 64 rows (a multiple of
// 8) making about 1024 blocks of 32 columns, whose f32 partials the last block of each 32
// columns adds in the same launch. Both backends price the fast sum_rows as that one launch and
// the partials' bytes (the simulator's real run too: sum_rows is among the kernels it prices as
// CUDA launches them), through the cost model's sim::cuda_fast_row_chunks, which reads the split
// CUDA launches (core/backend_api/cuda_launch_shapes.h, one definition for both); bitwise sum_rows
// and sum_rows_sharded are one launch too. A split has fewer column blocks than a stream's
// semaphores (one ticket counter each).
TEST(ComputeUnits, FastRowSumsPriceCudasRowChunks) {
  for (std::int64_t rows : {0, 1, 64, 511, 512, 513, 600, 1000, 4096, 8191, 8192, 16384, 1 << 20})
    for (std::int64_t cols : {1, 31, 32, 33, 384, 768, 1152, 2304, 3072, 32768, 32769, 786432}) {
      const cuda::RowChunks c = cuda::fast_row_chunks(rows, cols);
      EXPECT_EQ(sim::cuda_fast_row_chunks(rows, cols), c.chunks) << rows << " x " << cols;
      if (c.chunks == 1) {
        EXPECT_EQ(c.chunk_rows, rows);
        continue;
      }
      // Every row in exactly one chunk, the last one not empty; chunks of whole row groups.
      EXPECT_GT(rows, 512);
      EXPECT_GE(c.chunk_rows, 64);
      EXPECT_EQ(c.chunk_rows % 8, 0);
      EXPECT_GT(rows, (c.chunks - 1) * c.chunk_rows);
      EXPECT_LE(rows, c.chunks * c.chunk_rows);
      EXPECT_LE(c.chunks * ((cols + 31) / 32), 2 * 1024) << rows << " x " << cols;
      EXPECT_LT((cols + 31) / 32, cuda::kStreamSemaphores) << rows << " x " << cols;
    }
  // GPT-2 B 8's bias and LayerNorm gradients (8192 rows) and the char model's (16384 rows).
  const std::int64_t R = 8192;
  EXPECT_EQ(cuda::fast_row_chunks(R, 768).chunks, 43);  // 24 x 43 blocks (was 24)
  EXPECT_EQ(cuda::fast_row_chunks(R, 768).chunk_rows, 192);
  EXPECT_EQ(cuda::fast_row_chunks(R, 2304).chunks, 15);
  EXPECT_EQ(cuda::fast_row_chunks(R, 3072).chunks, 11);
  EXPECT_EQ(cuda::fast_row_chunks(16384, 384).chunks, 86);
  EXPECT_EQ(cuda::fast_row_chunks(8, 786432).chunks, 1);  // the wpe gradient: one pass
  const KernelCost k = sim::fast_sum_rows_cost(R, 768, DType::bf16, DType::bf16);
  EXPECT_DOUBLE_EQ(k.flops, double(R) * 768);
  EXPECT_DOUBLE_EQ(k.bytes, 2.0 * R * 768 + 2.0 * 768 + 8.0 * 43 * 768);
  EXPECT_EQ(k.launches, 1);
  EXPECT_EQ(sim::fast_sum_rows_cost(512, 768, DType::bf16, DType::bf16).launches, 1);
  // The f32 kernel, priced in a real run and a dry run alike: fast over 1000 x 40 is 16 chunks of
  // 64 rows (one launch, the partials' bytes), over 512 rows one; bitwise one launch.
  for (bool dry : {false, true}) {
    sim::SimBackend& be = fresh_sim(dry);
    const Device dev("sim", 0);
    Tensor x = Tensor::zeros({1000, 40}, DType::f32, dev),
           out = Tensor::zeros({40}, DType::f32, dev);
    be.default_stream(0).synchronize();
    auto before = be.cost_model().ledger(0);
    ops::sum_rows(x, out, 0.0f, Determinism::fast);
    be.default_stream(0).synchronize();
    sim::CostModel::LedgerRow r = row_since(be, "sum_rows", before);
    EXPECT_EQ(cuda::fast_row_chunks(1000, 40).chunks, 16);
    EXPECT_EQ(r.count, 1) << (dry ? "dry" : "real");
    EXPECT_DOUBLE_EQ(r.bytes, 4.0 * 1000 * 40 + 4.0 * 40 + 8.0 * 16 * 40);
    EXPECT_EQ(r.time, sim::to_vtime(kLaunch + r.bytes / (kBw * kHbmEff)));
    before = be.cost_model().ledger(0);
    ops::sum_rows(x.narrow(0, 512), out, 0.0f, Determinism::fast);
    ops::sum_rows(x, out, 0.0f, Determinism::bitwise);
    be.default_stream(0).synchronize();
    r = row_since(be, "sum_rows", before);
    EXPECT_EQ(r.count, 2);  // one launch each
    EXPECT_DOUBLE_EQ(r.bytes, 4.0 * 512 * 40 + 4.0 * 1000 * 40 + 8.0 * 40);
  }
}

// ---- the typed kernels of issue 29 items 2 and 3 (a dry run takes them, as CUDA does) ---------

// attention_ex_cost (Note [Typed kernels]) for GPT-2's attention (B 8, T 1024, C 768, 12 heads):
// fast bf16 on the tensor cores through ditto's mma.sync kernel at bf16_flops x mma_efficiency
// (0.25: an estimate), 2 T x T x hd passes forward, 7 backward in two launches when given the
// forward's output y (the dq kernel reads D = rowsum(dy * y), and y's bytes), 9 when not (its
// first pass recomputes S and dP for D: cuda_attention.cu); head widths other than 64 and 128,
// bitwise mode and f32 on the SIMT cores (fast: 7 given y, as the SIMT dq kernel reads D too;
// bitwise: 9, y or not); bytes of q, k, v, y (dy, dqkv) in the storage dtype and the stats in
// f32.
TEST(ComputeUnits, TypedAttentionOnTensorCoresInFastMode) {
  const sim::DeviceProfile h = sim::device_profile("h200");
  EXPECT_DOUBLE_EQ(h.mma_efficiency, 0.25);
  const std::int64_t B = 8, T = 1024, C = 768, H = 12;
  const double hd = 64, pairs = double(B) * H * T * (T + 1) / 2, tokens = double(B) * T;
  const double rows = tokens * H;
  const KernelCost fwd =
      sim::attention_ex_cost(B, T, C, H, DType::bf16, Determinism::fast, false, false);
  EXPECT_DOUBLE_EQ(fwd.matmul_flops, pairs * 2 * 2 * hd);
  EXPECT_DOUBLE_EQ(fwd.flops, pairs * (4 * hd + 24));
  EXPECT_DOUBLE_EQ(fwd.bytes, 2.0 * tokens * 4 * C + 8 * rows);
  EXPECT_EQ(fwd.launches, 1);
  const sim::KernelPrice pf = sim::kernel_price(h, fwd);
  EXPECT_EQ(pf.unit, PricedUnit::tensor_core_bf16_mma);
  EXPECT_STREQ(sim::unit_name(pf.unit), "tensor core bf16 mma");
  EXPECT_NEAR(pf.seconds, kLaunch + pairs * 4 * hd / (kBf16 * 0.25) + pairs * 24 / kFp32, 1e-15);
  const KernelCost bwd =
      sim::attention_ex_cost(B, T, C, H, DType::bf16, Determinism::fast, true, false);
  EXPECT_DOUBLE_EQ(bwd.matmul_flops, pairs * 9 * 2 * hd);
  EXPECT_DOUBLE_EQ(bwd.flops, pairs * (18 * hd + 52));
  EXPECT_DOUBLE_EQ(bwd.bytes, 2.0 * tokens * 11 * C + 24 * rows);
  EXPECT_EQ(bwd.launches, 2);
  const sim::KernelPrice pb = sim::kernel_price(h, bwd);
  EXPECT_EQ(pb.unit, PricedUnit::tensor_core_bf16_mma);
  EXPECT_NEAR(pb.seconds, 2 * kLaunch + pairs * 18 * hd / (kBf16 * 0.25) + pairs * 52 / kFp32,
              1e-15);
  // Given y: 7 products, D's 2 C FLOPs a token, y read once more.
  const KernelCost bwd_y =
      sim::attention_ex_cost(B, T, C, H, DType::bf16, Determinism::fast, true, false, true);
  EXPECT_DOUBLE_EQ(bwd_y.matmul_flops, pairs * 7 * 2 * hd);
  EXPECT_DOUBLE_EQ(bwd_y.flops, pairs * (14 * hd + 52) + 2 * tokens * C);
  EXPECT_DOUBLE_EQ(bwd_y.bytes, 2.0 * tokens * 12 * C + 24 * rows);
  EXPECT_EQ(bwd_y.launches, 2);
  EXPECT_NEAR(
      sim::kernel_price(h, bwd_y).seconds,
      2 * kLaunch + pairs * 14 * hd / (kBf16 * 0.25) + (pairs * 52 + 2 * tokens * C) / kFp32,
      1e-15);
  // Bitwise recomputes pd (bitwise's bits): 9 with y too; the fast SIMT widths read it from y.
  EXPECT_DOUBLE_EQ(
      sim::attention_ex_cost(B, T, C, H, DType::bf16, Determinism::bitwise, true, false, true)
          .matmul_flops,
      pairs * 9 * 2 * hd);
  EXPECT_DOUBLE_EQ(
      sim::attention_ex_cost(B, T, C, 16, DType::bf16, Determinism::fast, true, false, true)
          .matmul_flops,
      pairs / H * 16 * 7 * 2 * 48);  // 16 heads of 48
  const KernelCost f16 =
      sim::attention_ex_cost(B, T, C, H, DType::f16, Determinism::fast, false, true);
  EXPECT_EQ(sim::kernel_price(h, f16).unit, PricedUnit::tensor_core_f16_mma);
  EXPECT_DOUBLE_EQ(f16.flops, pairs * (4 * hd + 24 + 18));  // with a dropout mask
  // Bitwise bf16 and fast f32: the SIMT cores at simt_efficiency.
  for (const auto& [t, mode] :
       {std::pair{DType::bf16, Determinism::bitwise}, std::pair{DType::f32, Determinism::fast}}) {
    const KernelCost k = sim::attention_ex_cost(B, T, C, H, t, mode, false, false);
    const sim::KernelPrice p = sim::kernel_price(h, k);
    EXPECT_EQ(p.unit, PricedUnit::simt_ditto);
    EXPECT_NEAR(p.seconds, kLaunch + pairs * 4 * hd / (kFp32 * kSimtEff) + pairs * 24 / kFp32,
                1e-15);
    EXPECT_DOUBLE_EQ(k.bytes, double(dtype_size(t)) * tokens * 4 * C + 8 * rows);
  }
  // Fast bf16 with 16 heads of 48: no tensor-core kernel for that width, the SIMT cores.
  EXPECT_EQ(sim::kernel_price(h, sim::attention_ex_cost(B, T, C, 16, DType::bf16, Determinism::fast,
                                                        false, false))
                .unit,
            PricedUnit::simt_ditto);
  test::expect_error<InvalidArgument>(
      [] { sim::attention_ex_cost(8, 16, 30, 4, DType::bf16, Determinism::fast, false, false); },
      "attention_ex_cost (forward): expected C a positive multiple of nh >= 1, got C = 30, nh = 4");
  test::expect_error<InvalidArgument>(
      [] { sim::attention_ex_cost(8, 16, 32, 4, DType::i64, Determinism::fast, true, false); },
      "attention_ex_cost (backward): storage: expected f32, bf16 or f16, got i64");
  // A JSON profile sets the estimate (calibrated on a device).
  const std::string path = test::fresh_dir("compute_units", "mma_eff") + "/ditto_mma_eff.json";
  {
    std::ofstream f(path);
    f << R"({"key": "m", "fp32_tflops": 2, "memory_gib": 1, "memory_bandwidth_gbps": 100,
             "mma_efficiency": 0.4})";
  }
  EXPECT_DOUBLE_EQ(sim::device_profile(path).mma_efficiency, 0.4);
  {
    std::ofstream f(path);
    f << R"({"key": "m", "fp32_tflops": 2, "memory_gib": 1, "memory_bandwidth_gbps": 100,
             "mma_efficiency": 0})";
  }
  test::expect_error<InvalidArgument>([&] { sim::device_profile(path); }, "'mma_efficiency'");
  std::remove(path.c_str());
}

// storage_cost (Note [Typed kernels]): a typed row kernel's bytes are the f32 kernel's tensor
// bytes in the storage dtype, its f32 statistics / losses / ids unchanged. LayerNorm forward over
// [N, C]: x, y, and w, b (and the f32 kernel's third C) scale, mean and rstd (8 bytes a row) stay.
TEST(ComputeUnits, StorageCostScalesTensorBytesOnly) {
  const std::int64_t N = 8192, C = 768;
  const KernelCost f32{8.0 * N * C, 4.0 * (2.0 * N * C + 3.0 * C + 2.0 * N)};
  const KernelCost bf16 = sim::storage_cost(f32, DType::bf16, 8.0 * N);
  EXPECT_DOUBLE_EQ(bf16.bytes, 2.0 * (2.0 * N * C + 3.0 * C) + 8.0 * N);
  EXPECT_DOUBLE_EQ(bf16.flops, f32.flops);
  EXPECT_EQ(bf16.operands, DType::bf16);
  EXPECT_FALSE(bf16.gemm);
  EXPECT_DOUBLE_EQ(sim::storage_cost(f32, DType::f32, 8.0 * N).bytes, f32.bytes);
  EXPECT_DOUBLE_EQ(sim::storage_cost(f32, DType::f16, 0).bytes,
                   sim::native_cost(f32, DType::f16).bytes);
  // Memory bound: half the f32 kernel's time, near enough (the 8 bytes a row stay).
  const sim::DeviceProfile h = sim::device_profile("h200");
  const sim::KernelPrice p = sim::kernel_price(h, bf16);
  EXPECT_EQ(p.unit, PricedUnit::memory);
  EXPECT_NEAR(p.seconds, kLaunch + bf16.bytes / (kBw * kHbmEff), 1e-15);
  test::expect_error<InvalidArgument>(
      [&] { sim::storage_cost(f32, DType::bf16, -1); },
      "storage_cost: fixed_bytes: expected 0 <= fixed_bytes <= the f32 kernel's bytes");
  test::expect_error<InvalidArgument>([&] { sim::storage_cost(f32, DType::u8, 0); },
                                      "storage_cost: storage: expected f32, bf16 or f16, got u8");
}

// ---- the optimizer and the clip: the CUDA backend's multi-tensor launches ----------------------

namespace {

// A parameter of `shape` on sim:0 with a gradient (zeros: a dry run reads none).
nn::Parameter param_with_grad(const char* name, const Shape& shape) {
  const Device dev("sim", 0);
  return nn::Parameter{name, Tensor::zeros(shape, DType::f32, dev),
                       Tensor::zeros(shape, DType::f32, dev)};
}

}  // namespace

// Note [Predicted launches]: a dry run predicts the CUDA backend, so AdamW and clip_grad_norm_
// over three parameters (w [48, 40] decayed, as nanoGPT's groups do for 2-dim parameters; b [40]
// and x [300] not) are one adam_step_multi launch, two of sum_squares_multi (bitwise: one leaf of
// 4096 elements per tensor, then their sums) and one scale_multi, as
// backend_cuda/cuda_multi_tensor.cu launches them, with one copy of the three sums to the host;
// the FLOP and byte counts and times computed here by hand. A real run keeps the per-tensor
// kernels: a launch per parameter (and per decayed one), a copy per sum.
TEST(ComputeUnits, OptimizerAndClipPricedAsTheCudaMultiTensorLaunches) {
  const double nw = 48 * 40, nb = 40, nx = 300, n = nw + nb + nx;  // 2260 elements
  for (bool dry : {true, false}) {
    SCOPED_TRACE(dry ? "dry run" : "real run");
    sim::SimBackend& be = fresh_sim(dry);
    EXPECT_EQ(ops::has_multi_tensor_kernels(Device("sim", 0)), dry);
    nn::Parameter w = param_with_grad("w", {48, 40}), b = param_with_grad("b", {40}),
                  x = param_with_grad("x", {300});
    optim::AdamW opt({&w, &b, &x}, {.lr = 1e-3, .weight_decay = 0.1});
    be.default_stream(0).synchronize();
    const auto before = be.cost_model().ledger(0);
    // Clips: max_norm / (norm + 1e-6) < 1 (a dry run always prices the scaling).
    (void)optim::clip_grad_norm_({&w, &b, &x}, 1e-9, Determinism::bitwise);
    opt.step();
    be.default_stream(0).synchronize();
    auto step_row = [&](const std::string& name) { return row_since(be, name, before); };
    if (dry) {
      const sim::CostModel::LedgerRow adam = step_row("adam_step_multi");
      EXPECT_EQ(adam.count, 1);
      EXPECT_DOUBLE_EQ(adam.flops, 17 * nw + 16 * (nb + nx));  // the decay folded in
      EXPECT_DOUBLE_EQ(adam.bytes, 28 * n);  // p, g, m, v read, p, m, v written, f32
      EXPECT_EQ(adam.unit, PricedUnit::memory);
      EXPECT_NEAR(sim::to_seconds(adam.time), memory_time(1, 28 * n), 1e-12);
      const sim::CostModel::LedgerRow sq = step_row("sum_squares_multi");
      EXPECT_EQ(sq.count, 2);
      EXPECT_DOUBLE_EQ(sq.flops, 2 * n + 3);  // 3 leaves summed
      EXPECT_DOUBLE_EQ(sq.bytes, (4 * n + 4 * 3) + (4 * 3 + 4 * 3));
      EXPECT_NEAR(sim::to_seconds(sq.time), memory_time(2, 4 * n + 36), 1e-12);
      const sim::CostModel::LedgerRow sc = step_row("scale_multi");
      EXPECT_EQ(sc.count, 1);
      EXPECT_DOUBLE_EQ(sc.flops, n);
      EXPECT_DOUBLE_EQ(sc.bytes, 8 * n);
      EXPECT_NEAR(sim::to_seconds(sc.time), memory_time(1, 8 * n), 1e-12);
      EXPECT_EQ(step_row("copy_d2h").count, 1);
      EXPECT_DOUBLE_EQ(step_row("copy_d2h").bytes, 3 * 4);
      // The first step's moments (exp_avg, exp_avg_sq of each) zeroed in one launch.
      const sim::CostModel::LedgerRow fm = step_row("fill_multi");
      EXPECT_EQ(fm.count, 1);
      EXPECT_DOUBLE_EQ(fm.bytes, 2 * 4 * n);
      EXPECT_NEAR(sim::to_seconds(fm.time), memory_time(1, 8 * n), 1e-12);
      for (const char* per : {"adam_step", "sum_squares", "scale", "fill_f32"})
        EXPECT_EQ(step_row(per).count, 0) << per;
    } else {
      EXPECT_EQ(step_row("fill_f32").count, 2 * 3);  // a moment each
      EXPECT_EQ(step_row("fill_multi").count, 0);
      EXPECT_EQ(step_row("adam_step").count, 3);
      EXPECT_DOUBLE_EQ(step_row("adam_step").bytes, 28 * n);
      EXPECT_EQ(step_row("sum_squares").count, 3);
      EXPECT_EQ(step_row("scale").count, 3 + 1);  // the clip's, then w's decay
      EXPECT_DOUBLE_EQ(step_row("scale").bytes, 8 * n + 8 * nw);
      EXPECT_EQ(step_row("copy_d2h").count, 3);
      for (const char* multi : {"adam_step_multi", "sum_squares_multi", "scale_multi"})
        EXPECT_EQ(step_row(multi).count, 0) << multi;
    }
  }
}

// The launches of one call: a table of at most 256 tensors each (kMultiCap in
// backend_cuda/cuda_multi_tensor.cu); adam and scale skip empty tensors, the sums keep them (a
// +0 each) and launch no leaves kernel for a table without elements; fast mode's leaves are
// chunks of 8192 elements.
TEST(ComputeUnits, MultiTensorCostsCutIntoTablesOf256) {
  std::vector<std::int64_t> ns(300, 10);
  ns[7] = 0;  // 299 tensors with elements: tables of 256 and 43
  const std::vector<bool> decay(300, true);
  const auto adam = sim::adam_step_multi_costs(ns, decay, /*amsgrad=*/true);
  ASSERT_EQ(adam.size(), 2u);
  EXPECT_DOUBLE_EQ(adam[0].bytes, 36.0 * 10 * 256);
  EXPECT_DOUBLE_EQ(adam[1].bytes, 36.0 * 10 * 43);
  EXPECT_DOUBLE_EQ(adam[1].flops, 17.0 * 10 * 43);
  const auto sc = sim::scale_multi_costs(ns);
  ASSERT_EQ(sc.size(), 2u);
  EXPECT_DOUBLE_EQ(sc[0].bytes + sc[1].bytes, 8.0 * 10 * 299);
  const auto sq = sim::sum_squares_multi_costs(ns, Determinism::fast);
  ASSERT_EQ(sq.size(), 4u);  // tables of 256 and 44 tensors, each leaves + sums
  EXPECT_DOUBLE_EQ(sq[0].bytes, 4.0 * 10 * 255 + 4.0 * 255);  // a leaf per nonempty tensor
  EXPECT_DOUBLE_EQ(sq[1].bytes, 4.0 * 255 + 4.0 * 256);       // 255 leaves read, 256 sums
  EXPECT_DOUBLE_EQ(sq[3].bytes, 4.0 * 44 + 4.0 * 44);
  EXPECT_EQ(sim::sum_squares_multi_costs({0, 0}, Determinism::bitwise).size(), 1u);
  EXPECT_EQ(sim::sum_squares_multi_costs({20000}, Determinism::fast)[0].bytes, 4.0 * 20000 + 4 * 3);
  EXPECT_EQ(sim::sum_squares_multi_costs({20000}, Determinism::bitwise)[0].bytes,
            4.0 * 20000 + 4 * 5);
  EXPECT_TRUE(sim::adam_step_multi_costs({0}, {false}, false).empty());
  EXPECT_TRUE(sim::scale_multi_costs({}).empty());
  // fill_multi's table holds 1024 tensors (kFillCap): 1099 with elements are two launches.
  std::vector<std::int64_t> moments(1100, 10);
  moments[3] = 0;
  const auto fill = sim::fill_multi_costs(moments);
  ASSERT_EQ(fill.size(), 2u);
  EXPECT_DOUBLE_EQ(fill[0].bytes, 4.0 * 10 * 1024);
  EXPECT_DOUBLE_EQ(fill[1].bytes, 4.0 * 10 * 75);
  EXPECT_DOUBLE_EQ(fill[0].flops + fill[1].flops, 0.0);
  EXPECT_EQ(sim::fill_multi_costs(std::vector<std::int64_t>(296, 10)).size(), 1u);  // GPT-2's
  EXPECT_TRUE(sim::fill_multi_costs({0, 0}).empty());
  // copy_multi's table holds 1000 pieces (kCopyCap): 1099 with elements are two launches; a
  // copy reads and writes its bytes, a cast reads one dtype and writes the other, a FLOP each.
  const auto copies = sim::copy_multi_costs(moments, DType::bf16, DType::bf16);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_DOUBLE_EQ(copies[0].bytes, 4.0 * 10 * 1000);
  EXPECT_DOUBLE_EQ(copies[1].bytes, 4.0 * 10 * 99);
  EXPECT_DOUBLE_EQ(copies[0].flops + copies[1].flops, 0.0);
  const auto casts = sim::copy_multi_costs({7, 0, 5}, DType::f32, DType::bf16);
  ASSERT_EQ(casts.size(), 1u);
  EXPECT_DOUBLE_EQ(casts[0].bytes, 6.0 * 12);
  EXPECT_DOUBLE_EQ(casts[0].flops, 12.0);
  EXPECT_TRUE(sim::copy_multi_costs({0}, DType::f32, DType::f32).empty());
}

// Note [Typed optimizer step] (core/optim/master_weights.h): a dry run's has_multi_tensor_ex is
// CUDA's, so MasterWeights over bf16 weights with bf16 gradients (fast mode) clips with one
// sum_squares_multi_ex (two launches: leaves over bf16 bytes, then the sums) and steps with one
// adam_step_multi_ex launch that reads the bf16 gradients, scales them by the clip's
// coefficient, updates the f32 masters and moments and writes the bf16 weights: per element 2
// (g) + 8 (p) + 8 (m) + 8 (v) + 2 (the weight) bytes and 16 FLOPs, +1 for the decay (w), +1 for
// the scale; no cast, copy_d2d or scale_multi launch. A real run keeps the f32 path (a cast per
// gradient and weight, a copy per weight).
TEST(ComputeUnits, DryRunMasterWeightsStepIsOneTypedLaunch) {
  const double nw = 48 * 40, nb = 40, nx = 300, n = nw + nb + nx;  // 2260 elements
  for (bool dry : {true, false}) {
    SCOPED_TRACE(dry ? "dry run" : "real run");
    sim::SimBackend& be = fresh_sim(dry);
    const Device dev("sim", 0);
    EXPECT_EQ(ops::has_multi_tensor_ex(dev, DType::bf16), dry);
    auto bf16_param = [&](const char* name, const Shape& shape) {
      return nn::Parameter{name, Tensor::zeros(shape, DType::bf16, dev),
                           Tensor::zeros(shape, DType::bf16, dev)};
    };
    nn::Parameter w = bf16_param("w", {48, 40}), b = bf16_param("b", {40}),
                  x = bf16_param("x", {300});
    optim::MasterWeights mw({&w, &b, &x}, [](std::vector<nn::Parameter*> m) {
      return std::make_unique<optim::AdamW>(m,
                                            optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.1});
    });
    EXPECT_EQ(mw.fused_path(), dry);
    be.default_stream(0).synchronize();
    const auto before = be.cost_model().ledger(0);
    (void)mw.clip_grad_norm_(1e-9, Determinism::fast);  // a dry run prices the scaling anyway
    mw.step();
    be.default_stream(0).synchronize();
    auto step_row = [&](const std::string& name) { return row_since(be, name, before); };
    if (dry) {
      const sim::CostModel::LedgerRow adam = step_row("adam_step_multi_ex");
      EXPECT_EQ(adam.count, 1);
      EXPECT_DOUBLE_EQ(adam.flops, 18 * nw + 17 * (nb + nx));  // decay (w), the clip's scale
      EXPECT_DOUBLE_EQ(adam.bytes, 28 * n);
      EXPECT_EQ(adam.unit, PricedUnit::memory);
      EXPECT_NEAR(sim::to_seconds(adam.time), memory_time(1, 28 * n), 1e-12);
      const sim::CostModel::LedgerRow sq = step_row("sum_squares_multi_ex");
      EXPECT_EQ(sq.count, 2);
      const double leaves = 3;  // fast: one 8192-element chunk per tensor
      EXPECT_DOUBLE_EQ(sq.bytes, (2 * n + 4 * leaves) + (4 * leaves + 4 * 3));
      EXPECT_NEAR(sim::to_seconds(sq.time), memory_time(2, 2 * n + 36), 1e-12);
      for (const char* gone : {"cast", "cast_f32_scratch", "copy_d2d", "scale_multi",
                               "adam_step_multi", "sum_squares_multi", "scale"})
        EXPECT_EQ(step_row(gone).count, 0) << gone;
    } else {
      EXPECT_EQ(step_row("cast").count, 3 + 3);  // the grads in, the weights out
      EXPECT_EQ(step_row("adam_step").count, 3);
      EXPECT_EQ(step_row("adam_step_multi_ex").count, 0);
      EXPECT_EQ(step_row("sum_squares_multi_ex").count, 0);
    }
  }
}

// ---- GPT-2 124M, bf16, B 8, one H200 ------------------------------------------------------------

namespace {

struct Gpt2Run {
  train::FitResult r;
  std::map<std::string, CostLedgerRow> rows;  // "name / unit"
};

// ditto-train --model gpt --preset gpt2 --batch-size 8 --dtype bf16 --dry-run --profile h200
// --devices 1 (AdamW, clipping at 1, two steps), in `mode`.
Gpt2Run gpt2_dry(Determinism mode) {
  const nn::GPTConfig m = nn::gpt2_config("gpt2");
  train::TrainerConfig c = test::priced_gpt(m, {.profile = "h200",
                                                .determinism = mode,
                                                .batch_size = 8,
                                                .max_iters = 2,
                                                .lr = 6e-4f,
                                                .seed = 1337});
  c.dtype = DType::bf16;
  c.eval_iters = 0;
  Gpt2Run run;
  run.r =
      train::Trainer(c, std::make_shared<train::ZeroTokenSource>(m.block_size, m.vocab_size)).fit();
  if (run.r.prediction)
    for (const CostLedgerRow& k : run.r.prediction->kernels) run.rows[k.name + " / " + k.unit] = k;
  return run;
}

// A two-step dry run of the small GPT `m` (B 4, one H200, the Trainer's defaults otherwise) in
// `dt` and `mode`: its ledger rows by "name / unit" (empty, with a failure, without a
// prediction of two steps).
std::map<std::string, CostLedgerRow> priced_rows(const nn::GPTConfig& m, DType dt,
                                                 Determinism mode) {
  train::TrainerConfig c = test::priced_gpt(
      m, {.profile = "h200", .determinism = mode, .batch_size = 4, .max_iters = 2});
  c.dtype = dt;
  c.eval_iters = 0;
  const train::FitResult r =
      train::Trainer(c, std::make_shared<train::ZeroTokenSource>(m.block_size, m.vocab_size)).fit();
  std::map<std::string, CostLedgerRow> rows;
  if (!r.prediction || r.prediction->steps != 2) {
    ADD_FAILURE() << "priced_rows: expected a prediction of 2 steps";
    return rows;
  }
  for (const CostLedgerRow& k : r.prediction->kernels) rows[k.name + " / " + k.unit] = k;
  return rows;
}

}  // namespace

// The step priced from the model's shapes and the H200's rates, independently of the simulator:
// the GEMMs' FLOPs are 6 B T (12 L C^2 + C V) (forward, and the backward's two products), each
// GEMM on the mode's unit (the typed gemm_ex as CUDA runs it, a Linear's bias in its epilogue:
// no add_bias; bitwise mode's micro-sharded dW products gemm_tn_sharded_ex on the stored bf16
// operands); attention typed as CUDA runs it (attention_*_ex: fast mode on the tensor cores at
// bf16 x mma_efficiency, bitwise on the SIMT cores), from the causal pairs, its backward in two
// launches: fast 7 products (nn::CausalSelfAttention gives it the forward's output y: D =
// rowsum(dy * y), y read once more), bitwise 9 (pd recomputed: the simulator's bits); the row ops
// typed (*_ex); every other kernel memory bound at HBM x memory_efficiency over the bytes the
// ledger counted, at CUDA's launch counts (Note [Predicted launches]), MixedOp's conversions among
// them (cast_f32_scratch). The sum of the rows is the predicted step (one device, one stream: no
// idle time), so tokens/s = B T / that sum.
TEST(ComputeUnits, Gpt2Bf16B8OnH200FastAndBitwiseFollowTheFormula) {
  const double B = 8, T = 1024, C = 768, L = 12, V = 50304, H = 12, hd = C / H;
  const double gemm_flops = 6 * B * T * (12 * L * C * C + C * V);
  const double pairs = B * H * T * (T + 1) / 2;
  double tokens_per_s[2] = {0, 0};
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    const bool bitwise = mode == Determinism::bitwise;
    SCOPED_TRACE(bitwise ? "bitwise" : "fast");
    const Gpt2Run run = gpt2_dry(mode);
    ASSERT_TRUE(run.r.prediction);
    const train::CostPrediction& p = *run.r.prediction;
    ASSERT_EQ(p.steps, 2);
    const double steps = 2;
    // The GEMMs: every matrix product on the mode's unit, all compute bound.
    const std::string gemm_unit = bitwise ? "SIMT f32 (ditto)" : "tensor core bf16";
    const double gemm_rate = bitwise ? kFp32 * kSimtEff : kBf16 * kGemmEff;
    auto is_gemm = [](const std::string& name) {
      return name == "gemm" || name == "gemm_ex" || name == "gemm_tn_sharded" ||
             name == "gemm_tn_sharded_ex";
    };
    EXPECT_EQ(run.rows.count("gemm / " + gemm_unit), 0u);  // every product typed, as on CUDA
    EXPECT_EQ(run.rows.count("add_bias / memory"), 0u);    // in gemm_ex's epilogue
    EXPECT_EQ(run.rows.count("gemm_tn_sharded / " + gemm_unit), 0u);  // typed: no f32 copies
    EXPECT_EQ(run.rows.count("layernorm_forward / memory"), 0u);      // typed row kernels
    EXPECT_EQ(run.rows.count("gelu_forward / memory"), 0u);
    // The bias and LayerNorm gradients: typed row sums, no f32 copies (fast: sum_rows_ex into
    // bf16 gradients; bitwise: sum_rows_sharded_ex into f32 ones). A step sums, per layer,
    // LayerNorm 1 and 2's weight (dy xhat) and bias (dy) rows and the biases of c_attn (3C),
    // attn.c_proj (C), c_fc (4C), mlp.c_proj (C) over B T rows (13 C columns), ln_f's two (2 C),
    // and wpe's gradient over the B samples (T C columns): 12 x 8 + 2 + 1 = 99 calls over
    // B T C (12 x 13 + 2 + 1) bf16 elements, plus the outs. Fast: the LayerNorms' gradients are
    // summed in their backward's launch (layernorm_backward_params), leaving 12 x 4 + 1 = 49
    // calls over B T C (12 x 9 + 1) elements; the 48 over B T rows are one launch each over row
    // chunks (cuda::fast_row_chunks: 43 for C columns, 15 for 3C, 11 for 4C), their f32 partials
    // written and read in it; wpe's 8 rows one, no partials.
    const std::string sums = bitwise ? "sum_rows_sharded" : "sum_rows";
    EXPECT_EQ(run.rows.count(sums + " / memory"), 0u);
    const CostLedgerRow rs = run.rows.at(sums + "_ex / memory");
    EXPECT_EQ(rs.count, (bitwise ? 99 : 49) * 2);  // one launch a call in both modes
    const double out_size = bitwise ? 4 : 2;
    auto chunks = [&](double cols) {
      return double(cuda::fast_row_chunks(std::int64_t(B * T), std::int64_t(cols)).chunks);
    };
    const double partials =
        bitwise ? 0 : 8 * L * (2 * chunks(C) * C + chunks(3 * C) * 3 * C + chunks(4 * C) * 4 * C);
    const double cols = bitwise ? 12 * 13 + 2 : 12 * 9;  // columns summed over B T rows
    EXPECT_DOUBLE_EQ(rs.bytes / steps,
                     2.0 * B * T * C * (cols + 1) + out_size * C * (cols + T) + partials);
    EXPECT_EQ(run.rows.count("layernorm_backward_params / memory"), bitwise ? 0u : 1u);
    double flops = 0, gemm_s = 0, count = 0;
    for (const auto& [key, k] : run.rows)
      if (is_gemm(k.name)) {
        EXPECT_EQ(k.unit, gemm_unit) << key;
        flops += k.flops;
        count += static_cast<double>(k.count);
        gemm_s += static_cast<double>(k.time_ps) / 1e12;
      }
    EXPECT_DOUBLE_EQ(flops / steps, gemm_flops);  // 6.07 TFLOP a step
    EXPECT_NEAR(gemm_s, count * kLaunch + flops / gemm_rate, count * 1e-12);
    // Attention, typed, compute bound: fast mode's products on the tensor cores (ditto's
    // mma.sync flash attention), bitwise mode's on the SIMT cores; the softmax at the FP32 peak.
    const std::string attn_unit = bitwise ? "SIMT f32 (ditto)" : "tensor core bf16 mma";
    const double attn_rate = bitwise ? kFp32 * kSimtEff : kBf16 * kMmaEff;
    const double fwd = L * steps * (pairs * 4 * hd / attn_rate + pairs * 24 / kFp32);
    const double bwd_products = bitwise ? 9 : 7, d_flops = bitwise ? 0 : 2 * B * T * C;
    const double bwd =
        L * steps * (pairs * 2 * bwd_products * hd / attn_rate + (pairs * 52 + d_flops) / kFp32);
    const CostLedgerRow af = run.rows.at("attention_forward_ex / " + attn_unit);
    const CostLedgerRow ab = run.rows.at("attention_backward_ex / " + attn_unit);
    EXPECT_EQ(af.count, 12 * 2);
    EXPECT_EQ(ab.count, 12 * 2 * 2);  // two launches each
    EXPECT_NEAR(af.time_ps / 1e12, af.count * kLaunch + fwd, af.count * 1e-12);
    EXPECT_NEAR(ab.time_ps / 1e12, ab.count * kLaunch + bwd, ab.count * 1e-12);
    // qkv, y and the stats in bf16 / f32, never att [B, H, T, T].
    EXPECT_DOUBLE_EQ(af.bytes / af.count, 2.0 * B * T * 4 * C + 8 * B * H * T);
    // The optimizer (Note [Typed optimizer step]): one AdamW launch a step over the 124.5 M
    // parameters (grads read in bf16, fast; f32, bitwise), the bf16 weights written in it, and
    // no per-parameter cast or copy.
    const double n_params = static_cast<double>(nn::gpt_num_params(nn::gpt2_config("gpt2")));
    const CostLedgerRow adam = run.rows.at("adam_step_multi_ex / memory");
    EXPECT_EQ(adam.count, 2);
    EXPECT_DOUBLE_EQ(adam.bytes / steps, (24.0 + (bitwise ? 4 : 2) + 2) * n_params);
    EXPECT_EQ(run.rows.count("cast / memory"), 0u);
    EXPECT_EQ(run.rows.count("copy_d2d / memory"), 0u);
    EXPECT_EQ(run.rows.count("scale_multi / memory"), 0u);
    // Everything else: memory bound (or a few small FLOP-bound kernels at the FP32 peak).
    double step_s = gemm_s + af.time_ps / 1e12 + ab.time_ps / 1e12, rows_s = 0;
    for (const auto& [key, k] : run.rows) {
      rows_s += static_cast<double>(k.time_ps) / 1e12;
      if (is_gemm(k.name) || k.name.rfind("attention_", 0) == 0) continue;
      const double launches = static_cast<double>(k.count);  // CUDA's (embedding_backward: 6)
      double s = 0;
      // A copy inside the device (read + write) is priced at the data-sheet bandwidth
      // (CostModel::on_device_copy), memory-bound kernels at bandwidth x memory_efficiency.
      if (k.name == "copy_d2d")
        s = k.bytes / kBw;
      else if (k.unit == "memory")
        s = k.bytes / (kBw * kHbmEff);
      else if (k.unit == "SIMT f32")
        s = k.flops / kFp32;
      else if (k.unit == "PCIe")
        s = 0;  // host copies: checked below against the sum
      else
        ADD_FAILURE() << key << ": unexpected unit";
      if (k.unit != "PCIe") {
        EXPECT_NEAR(k.time_ps / 1e12, launches * kLaunch + s, k.count * 1e-12 + 1e-15) << key;
        step_s += launches * kLaunch + s;
      } else {
        step_s += static_cast<double>(k.time_ps) / 1e12;
      }
    }
    // The rows add up to the predicted step: one device, no idle time.
    EXPECT_NEAR(rows_s / steps, p.step_time_s, 1e-12);
    EXPECT_NEAR(step_s / steps, p.step_time_s, 1e-9);
    tokens_per_s[bitwise] = B * T / (step_s / steps);
    EXPECT_NEAR(p.samples_per_s * T, tokens_per_s[bitwise], 1e-6 * tokens_per_s[bitwise]);
    // The --verbose table: its total is the predicted step, with no idle line.
    const std::string table = train::format_step_kernels(
        p, bitwise ? "GPT-2 124M bf16 B 8, h200, bitwise:" : "GPT-2 124M bf16 B 8, h200, fast:");
    char total[64];
    std::snprintf(total, sizeof total, "%10.4f %6.1f%%", p.step_time_s * 1e3, 100.0);
    EXPECT_NE(table.find(std::string("total (sim:0 busy)")), std::string::npos) << table;
    EXPECT_EQ(table.find("idle"), std::string::npos) << table;
    EXPECT_EQ(table.find("overlap"), std::string::npos) << table;
    EXPECT_NE(table.find(total), std::string::npos) << table;
    std::printf("%.0f tokens/s, step %.3f ms\n%s", tokens_per_s[bitwise], p.step_time_s * 1e3,
                table.c_str());
  }
  // Bitwise prices the GEMMs 25x slower (SIMT x 0.47 vs tensor cores x 0.80), attention 8x
  // (SIMT x 0.47 vs the tensor cores x 0.25).
  EXPECT_GT(tokens_per_s[0], 2.0 * tokens_per_s[1]);
}

// ---- the embedding gradient and the step's fills (issue 29 item 3, branch i29-emb) -----------

// The embedding gradient has a typed CUDA kernel (Kernels::embedding_backward_ex, under
// has_rows_ex): a dry run prices bf16 dy read directly into a bf16 or an f32 grad_wte (bitwise
// mode's gradients) at CUDA's six launches, with no casts and no f32 scratch; a real run keeps
// MixedOp (has_rows_ex false).
TEST(ComputeUnits, DryRunEmbeddingBackwardIsTheTypedKernel) {
  const std::int64_t N = 96, C = 64, V = 50;
  const Device dev("sim", 0);
  sim::SimBackend& dry = fresh_sim(true);
  std::vector<std::int64_t> ids(N);
  for (std::int64_t r = 0; r < N; ++r) ids[static_cast<std::size_t>(r)] = (r * 7) % V;
  const Tensor idx = Tensor::from_vector(ids, {N}).to(dev);
  const Tensor dy = Tensor::zeros({N, C}, DType::bf16, dev);
  Tensor grad_bf16 = Tensor::zeros({V, C}, DType::bf16, dev);
  Tensor grad_f32 = Tensor::zeros({V, C}, DType::f32, dev);
  dry.default_stream(0).synchronize();
  const std::size_t before = dry.memory_stats(0).in_use;
  dry.reset_peak_memory(0);
  ops::embedding_backward(idx, dy, grad_bf16, {0, N}, true);           // fast mode's
  ops::embedding_backward(idx, dy, grad_f32, {0, 32, 32, 96}, false);  // bitwise mode's
  dry.default_stream(0).synchronize();
  const sim::CostModel::LedgerRow e = row(dry, "embedding_backward_ex");
  EXPECT_EQ(e.count, 2 * 6);
  EXPECT_DOUBLE_EQ(e.bytes, (2.0 * N * C + 8.0 * N + 2.0 * V * C * 2) +  // accumulate: read + write
                                (2.0 * N * C + 8.0 * N + 4.0 * V * C));
  EXPECT_DOUBLE_EQ(e.flops, (double(N) * C + double(V) * C) + double(N) * C);
  EXPECT_EQ(row(dry, "embedding_backward").count, 0);
  EXPECT_EQ(row(dry, "cast_f32_scratch").count, 0);
  EXPECT_EQ(dry.memory_stats(0).peak, before);  // no scratch
}

// GPT-2 124M bf16 B 8 on one H200, the rows this branch changed (per step, from the model's
// shapes): the embedding gradient is embedding_backward_ex (fast: one call of 6 launches on all N
// = B T tokens into the bf16 gradient; bitwise: one per micro-shard that holds a sample, 8 of the
// 64, into f32 parts); bitwise mode adds the 8 parts with B - 1 = 7 axpy over [V, C] and fills
// none for the 56 empty shards, so its fill_f32 row is fast mode's (the loss's gradient, one
// float a step) plus wpe's f32 gradient zeroed; fast mode fills no bias or LayerNorm gradient
// before sum_rows writes it: fill_bits is wpe's bf16 gradient alone (zeroed: its rows T.. get no
// gradient). AdamW's moments, made at step 1, are one fill_multi launch in both modes (the 296
// exp_avg and exp_avg_sq of the 148 parameters, 8 bytes a parameter element), not 296 fill_f32.
TEST(ComputeUnits, Gpt2EmbeddingGradientAndFillsFollowTheFormula) {
  const double B = 8, T = 1024, C = 768, V = 50304, N = B * T, steps = 2;
  std::map<std::string, CostLedgerRow> fast_rows;
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    const bool bitwise = mode == Determinism::bitwise;
    SCOPED_TRACE(bitwise ? "bitwise" : "fast");
    const Gpt2Run run = gpt2_dry(mode);
    ASSERT_TRUE(run.r.prediction);
    EXPECT_EQ(run.rows.count("embedding_backward / memory"), 0u);
    const CostLedgerRow moments = run.rows.at("fill_multi / memory");
    EXPECT_EQ(moments.count, 1);  // step 1 only
    EXPECT_DOUBLE_EQ(moments.bytes,
                     8.0 * static_cast<double>(nn::gpt_num_params(nn::gpt2_config("gpt2"))));
    const CostLedgerRow e = run.rows.at("embedding_backward_ex / memory");
    const double calls = bitwise ? B : 1, rows = bitwise ? T : N;
    const double grad_bytes = bitwise ? 4.0 : 2.0;
    EXPECT_EQ(e.count, static_cast<std::int64_t>(steps * calls * 6));
    EXPECT_DOUBLE_EQ(e.bytes / steps, calls * (2 * rows * C + 8 * rows + 2 * grad_bytes * V * C));
    if (bitwise) {
      const CostLedgerRow a = run.rows.at("axpy / memory");
      EXPECT_EQ(a.count, static_cast<std::int64_t>(steps * (B - 1)));
      EXPECT_DOUBLE_EQ(a.bytes / steps, (B - 1) * 12 * V * C);
      // fast mode's fills, and wpe's gradient zeroed in f32 (fast mode: fill_bits in bf16).
      const CostLedgerRow f = run.rows.at("fill_f32 / memory");
      EXPECT_EQ(f.count,
                fast_rows.at("fill_f32 / memory").count + static_cast<std::int64_t>(steps));
      EXPECT_DOUBLE_EQ(f.bytes, fast_rows.at("fill_f32 / memory").bytes + steps * 4 * T * C);
      EXPECT_EQ(run.rows.count("fill_bits / memory"), 0u);
    } else {
      EXPECT_EQ(run.rows.count("axpy / memory"), 0u);
      const CostLedgerRow loss = run.rows.at("fill_f32 / memory");
      EXPECT_EQ(loss.count, static_cast<std::int64_t>(steps));  // dloss = 1
      EXPECT_DOUBLE_EQ(loss.bytes, steps * 4);
      const CostLedgerRow f = run.rows.at("fill_bits / memory");
      EXPECT_EQ(f.count, static_cast<std::int64_t>(steps));
      EXPECT_DOUBLE_EQ(f.bytes / steps, 2.0 * T * C);  // wpe [block_size = T, C] in bf16
      fast_rows = run.rows;
    }
  }
}

// ---- the residual gradient's add in the LayerNorm backward (issue 29 item 3, branch i29-resid)

// nn::Block's two residual-gradient adds are folded into the LayerNorm backward below each (CUDA's
// layernorm_backward_add, f32 / bf16 / f16, both modes): a dry run answers
// has_layernorm_backward_add as CUDA does (a real run no) and prices, per block and step, 2
// layernorm_backward_add launches of 15 N C FLOPs over dy, x, the residual, the sum and dy_xhat (5
// N C elements), w (C) and mean, rstd (8 N bytes); the plain LayerNorm backward ln_f's alone, and
// no add row is left (the forward's adds are folded too:
// DryRunFoldsTheResidualAddsIntoTheLayerNormForward). A small GPT (L 2, C 64, T 32, B 4, N = B
// T), bf16 and f32, fast and bitwise, from the shapes.
TEST(ComputeUnits, DryRunFoldsTheResidualGradientAddsIntoTheLayerNormBackward) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (DType t : kAllDTypes)
      EXPECT_EQ(k.has_layernorm_backward_add(t),
                dry && (t == DType::f32 || t == DType::bf16 || t == DType::f16))
          << dtype_name(t) << (dry ? " dry" : " real");
  }
  const nn::GPTConfig m{
      .block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const double L = 2, C = 64, T = 32, B = 4, N = B * T, steps = 2;
  for (DType dt : {DType::bf16, DType::f32})
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const std::map<std::string, CostLedgerRow> rows = priced_rows(m, dt, mode);
      ASSERT_FALSE(rows.empty());
      const double s = static_cast<double>(dtype_size(dt));
      const bool half = dt != DType::f32;
      auto check = [&](const std::string& name, double count, double flops, double bytes) {
        SCOPED_TRACE(name);
        ASSERT_EQ(rows.count(name + " / memory"), 1u);
        const CostLedgerRow& k = rows.at(name + " / memory");
        EXPECT_EQ(k.count, static_cast<std::int64_t>(steps * count));
        EXPECT_DOUBLE_EQ(k.flops / steps, flops);
        EXPECT_DOUBLE_EQ(k.bytes / steps, bytes);
        EXPECT_NEAR(k.time_ps / 1e12, memory_time(static_cast<double>(k.count), k.bytes),
                    k.count * 1e-12);
      };
      if (mode == Determinism::bitwise) {
        check("layernorm_backward_add", 2 * L, 2 * L * 15 * N * C,
              2 * L * (s * (5 * N * C + C) + 8 * N));
        check(half ? "layernorm_backward_ex" : "layernorm_backward", 1, 14 * N * C,
              s * (4 * N * C + C) + 8 * N);
      } else {  // fast: the adds are folded into layernorm_backward_params (the test below)
        for (const char* name :
             {"layernorm_backward_add", "layernorm_backward_ex", "layernorm_backward"})
          EXPECT_EQ(rows.count(std::string(name) + " / memory"), 0u) << name;
      }
      EXPECT_EQ(rows.count(std::string(half ? "add_any" : "sum_inputs") + " / memory"), 0u);
    }
}

// ---- the residual add in the LayerNorm forward (issue 29 item 3, branch i29-resfwd)

// The GPT forward's residual adds are folded into the LayerNorm after each (CUDA's
// layernorm_forward_add, f32 / bf16 / f16, both modes): a dry run answers
// has_layernorm_forward_add as CUDA does (a real run no) and prices, per step, 2 L
// layernorm_forward_add launches (each block's ln_2, the next block's ln_1 and ln_f) of 9 N C
// FLOPs over x, the branch, the residual and y (4 N C elements), w and b (3 C, as the forward
// counts them) and mean, rstd (8 N bytes); the plain LayerNorm forward is block 0's ln_1 alone,
// and no add row is left (the backward's are folded too). The same small GPT as above.
TEST(ComputeUnits, DryRunFoldsTheResidualAddsIntoTheLayerNormForward) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (DType t : kAllDTypes)
      EXPECT_EQ(k.has_layernorm_forward_add(t),
                dry && (t == DType::f32 || t == DType::bf16 || t == DType::f16))
          << dtype_name(t) << (dry ? " dry" : " real");
  }
  const nn::GPTConfig m{
      .block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const double L = 2, C = 64, T = 32, B = 4, N = B * T, steps = 2;
  for (DType dt : {DType::bf16, DType::f32})
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const std::map<std::string, CostLedgerRow> rows = priced_rows(m, dt, mode);
      ASSERT_FALSE(rows.empty());
      const double s = static_cast<double>(dtype_size(dt));
      const bool half = dt != DType::f32;
      auto check = [&](const std::string& name, double count, double flops, double bytes) {
        SCOPED_TRACE(name);
        ASSERT_EQ(rows.count(name + " / memory"), 1u);
        const CostLedgerRow& k = rows.at(name + " / memory");
        EXPECT_EQ(k.count, static_cast<std::int64_t>(steps * count));
        EXPECT_DOUBLE_EQ(k.flops / steps, flops);
        EXPECT_DOUBLE_EQ(k.bytes / steps, bytes);
        EXPECT_NEAR(k.time_ps / 1e12, memory_time(static_cast<double>(k.count), k.bytes),
                    k.count * 1e-12);
      };
      check("layernorm_forward_add", 2 * L, 2 * L * 9 * N * C,
            2 * L * (s * (4 * N * C + 3 * C) + 8 * N));
      check(half ? "layernorm_forward_ex" : "layernorm_forward", 1, 8 * N * C,
            s * (2 * N * C + 3 * C) + 8 * N);
      EXPECT_EQ(rows.count(std::string(half ? "add_any" : "sum_inputs") + " / memory"), 0u);
    }
}

// ---- the softmax cross-entropy's forward and backward in one pass (issue 29, branch i29-xent)

// The GPT step's loss runs CUDA's cross_entropy_fused in fast mode (f32 / bf16 / f16; llm.c's
// fused_classifier): a dry run answers has_cross_entropy_fused as CUDA does (a real run no) and
// prices, per step, one cross_entropy_fused launch of 5 N V FLOPs over the logits read and their
// gradient written over them (2 N V elements) with a loss, a target (12 N bytes) and grad_loss (4)
// in place of cross_entropy(_ex) and cross_entropy_backward(_ex); bitwise mode keeps the two.
// The same small GPT as above.
TEST(ComputeUnits, DryRunFusesTheCrossEntropyForwardAndBackwardInFastMode) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (Determinism mode : {Determinism::fast, Determinism::bitwise})
      for (DType t : kAllDTypes)
        EXPECT_EQ(k.has_cross_entropy_fused(t, mode),
                  dry && mode == Determinism::fast &&
                      (t == DType::f32 || t == DType::bf16 || t == DType::f16))
            << dtype_name(t) << " " << determinism_name(mode) << (dry ? " dry" : " real");
  }
  const nn::GPTConfig m{
      .block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const double V = 65, T = 32, B = 4, N = B * T, steps = 2;
  for (DType dt : {DType::bf16, DType::f32})
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const std::map<std::string, CostLedgerRow> rows = priced_rows(m, dt, mode);
      ASSERT_FALSE(rows.empty());
      const double s = static_cast<double>(dtype_size(dt));
      const bool half = dt != DType::f32;
      const std::string fwd = half ? "cross_entropy_ex" : "cross_entropy",
                        bwd = half ? "cross_entropy_backward_ex" : "cross_entropy_backward";
      if (mode == Determinism::fast) {
        ASSERT_EQ(rows.count("cross_entropy_fused / memory"), 1u);
        const CostLedgerRow& k = rows.at("cross_entropy_fused / memory");
        EXPECT_EQ(k.count, static_cast<std::int64_t>(steps));
        EXPECT_DOUBLE_EQ(k.flops / steps, 5 * N * V);
        EXPECT_DOUBLE_EQ(k.bytes / steps, s * 2 * N * V + 12 * N + 4);
        EXPECT_NEAR(k.time_ps / 1e12, memory_time(static_cast<double>(k.count), k.bytes),
                    k.count * 1e-12);
        EXPECT_EQ(rows.count(fwd + " / memory"), 0u);
        EXPECT_EQ(rows.count(bwd + " / memory"), 0u);
      } else {
        EXPECT_EQ(rows.count("cross_entropy_fused / memory"), 0u);
        ASSERT_EQ(rows.count(fwd + " / memory"), 1u);
        ASSERT_EQ(rows.count(bwd + " / memory"), 1u);
        EXPECT_EQ(rows.at(bwd + " / memory").count, static_cast<std::int64_t>(steps));
      }
    }
}

// ---- the GPT MLP's GELU in its GEMMs' epilogues (issue 29 item 1, branch i29-gelu)

// A dry run answers has_gemm_gelu_epilogue as the CUDA backend whose probe found the tanh form
// (fast mode, f32 / bf16 / f16; a real run no; cuda_host_logic.h's rule before the probe), and
// prices gemm_ex's GELU epilogues with the aux matrix's M N elements (written or read) beside a
// bias's N.
TEST(ComputeUnits, DryRunAnswersTheGeluEpilogueAsCudaAndPricesItsAuxBytes) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (Determinism mode : {Determinism::fast, Determinism::bitwise})
      for (DType t : kAllDTypes)
        EXPECT_EQ(k.has_gemm_gelu_epilogue(t, mode),
                  dry && cuda::gemm_gelu_epilogue_supported(t, mode))
            << dtype_name(t) << " " << determinism_name(mode) << (dry ? " dry" : " real");
  }
  GemmExArgs a;
  a.M = 4, a.N = 8, a.K = 16, a.a_type = a.b_type = a.c_type = DType::bf16;
  const double plain = 2.0 * (4 * 16 + 16 * 8 + 4 * 8);
  a.epilogue = GemmEpilogue::gelu_aux_bias;
  a.bias = &a;  // any non-null pointer: with a bias
  EXPECT_DOUBLE_EQ(sim::gemm_ex_cost(a).bytes, plain + 2.0 * 8 + 2.0 * 4 * 8);
  a.bias = nullptr;  // GELU_AUX
  EXPECT_DOUBLE_EQ(sim::gemm_ex_cost(a).bytes, plain + 2.0 * 4 * 8);
  a.epilogue = GemmEpilogue::dgelu;
  EXPECT_DOUBLE_EQ(sim::gemm_ex_cost(a).bytes, plain + 2.0 * 4 * 8);
  EXPECT_EQ(sim::gemm_ex_cost(a).flops, 2.0 * 4 * 8 * 16);
}

// A dry GPT step (L 2, C 64, T 32, B 4, biases) in fast mode runs no GELU launch: each block's
// c_fc is one gemm_ex writing the pre-GELU (B T x 4C more bytes) and c_proj's input gradient one
// dgelu gemm_ex (reading it); bitwise mode keeps L GELU forward and L backward launches a step.
// f32: the backward's other products are Kernels::gemm, so gemm_ex counts exactly the forward's
// 4 L Linears and the L dgelu products; its bytes differ from bitwise mode's by the aux matrices
// and the dgelu products.
TEST(ComputeUnits, DryRunFusesTheMlpGeluIntoItsGemmsInFastModeOnly) {
  const nn::GPTConfig m{
      .block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64, .bias = true};
  const double L = 2, C = 64, T = 32, B = 4, N = B * T, steps = 2;
  for (DType dt : {DType::bf16, DType::f32}) {
    std::map<Determinism, std::map<std::string, CostLedgerRow>> by_mode;
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const std::map<std::string, CostLedgerRow> priced = priced_rows(m, dt, mode);
      ASSERT_FALSE(priced.empty());
      std::map<std::string, CostLedgerRow>& rows = by_mode[mode];
      for (const auto& [key, k] : priced) {
        CostLedgerRow& sum = rows[k.name];  // over units
        sum.count += k.count;
        sum.bytes += k.bytes;
      }
      const bool half = dt != DType::f32;
      const std::string fwd = half ? "gelu_forward_ex" : "gelu_forward";
      const std::string bwd = half ? "gelu_backward_ex" : "gelu_backward";
      const std::int64_t gelus =
          mode == Determinism::fast ? 0 : static_cast<std::int64_t>(L * steps);
      EXPECT_EQ(rows[fwd].count, gelus);
      EXPECT_EQ(rows[bwd].count, gelus);
    }
    if (dt != DType::f32) continue;
    const CostLedgerRow fast = by_mode[Determinism::fast]["gemm_ex"],
                        bitwise = by_mode[Determinism::bitwise]["gemm_ex"];
    EXPECT_EQ(fast.count, static_cast<std::int64_t>(5 * L * steps));
    EXPECT_EQ(bitwise.count, static_cast<std::int64_t>(4 * L * steps));
    // c_fc's aux [N, 4C]; dgelu: gy [N, C], w [C, 4C], the output and the aux [N, 4C]; f32.
    const double aux = 4 * N * 4 * C, dgelu = 4 * (N * C + C * 4 * C + 2 * N * 4 * C);
    EXPECT_DOUBLE_EQ((fast.bytes - bitwise.bytes) / steps, L * (aux + dgelu));
  }
}

// ---- the LayerNorm parameter gradients in the backward's launch (issue 29 item 3, fast mode)

// Fast mode's LayerNorm backward computes its weight and bias gradients in the same launch on
// CUDA (Kernels::layernorm_backward_params, Note [CUDA LayerNorm parameter gradients]): a dry run
// answers has_layernorm_backward_params as CUDA does (f32, bf16, f16 in fast mode; a real run
// and bitwise mode no) and prices every LayerNorm backward of a fast step as one
// layernorm_backward_params launch (layernorm_backward_params_cost): the model has no bias, so
// 16 N C FLOPs with the residual's add (the blocks' 2 L), 15 without (ln_f); dy, x, dx (and the
// residual) [N, C] and w in the storage dtype, mean and rstd f32, the weight's gradient written
// in the storage dtype (a new one: the trainer's zero_grad leaves none), the chunks' f32
// partials (cuda_layernorm_params_chunks: CUDA's layernorm_params_split, one definition). No
// LayerNorm row sum is left (the one sum_rows a step is wpe's gradient), and no
// layernorm_backward(_ex / _add).
TEST(ComputeUnits, DryRunPricesTheLayerNormParameterGradientsInTheBackward) {
  for (bool dry : {true, false}) {
    Kernels& k = fresh_sim(dry).kernels();
    for (DType t : kAllDTypes)
      for (Determinism mode : {Determinism::fast, Determinism::bitwise})
        EXPECT_EQ(k.has_layernorm_backward_params(t, mode),
                  dry && mode == Determinism::fast &&
                      (t == DType::f32 || t == DType::bf16 || t == DType::f16))
            << dtype_name(t) << " " << determinism_name(mode) << (dry ? " dry" : " real");
  }
  // The split, as CUDA launches it and the cost model reads it: every row in one chunk of whole
  // 8-row groups, about 512 chunks, their groups of 16 within the stream's semaphores.
  for (std::int64_t rows :
       {0, 1, 15, 16, 17, 100, 128, 200, 511, 512, 4096, 4100, 8191, 8192, 16384, 1 << 20}) {
    const cuda::LnParamsSplit sp = cuda::layernorm_params_split(rows);
    EXPECT_EQ(sim::cuda_layernorm_params_chunks(rows), sp.chunks) << rows;
    if (sp.chunks == 1) {
      EXPECT_EQ(sp.chunk_rows, rows);
      EXPECT_EQ(sp.groups, 1);
      continue;
    }
    EXPECT_GE(sp.chunk_rows, 16) << rows;
    EXPECT_EQ(sp.chunk_rows % 8, 0) << rows;
    EXPECT_GT(rows, (sp.chunks - 1) * sp.chunk_rows) << rows;
    EXPECT_LE(rows, sp.chunks * sp.chunk_rows) << rows;
    EXPECT_LE(sp.chunks, 512) << rows;
    EXPECT_EQ(sp.groups, (sp.chunks + 15) / 16) << rows;
    EXPECT_LT(sp.groups, cuda::kStreamSemaphores) << rows;
  }
  EXPECT_EQ(cuda::layernorm_params_split(8192).chunks, 512);  // GPT-2 B 8: 16 rows each
  EXPECT_EQ(cuda::layernorm_params_split(8192).groups, 32);
  EXPECT_EQ(cuda::layernorm_params_split(128).chunks, 8);
  {
    const double N = 8192, C = 768;
    const KernelCost c = sim::layernorm_backward_params_cost(8192, 768, DType::bf16, DType::bf16,
                                                             true, true, true, false);
    EXPECT_DOUBLE_EQ(c.flops, 17 * N * C);
    EXPECT_DOUBLE_EQ(c.bytes,
                     2 * (4 * N * C + C) + 8 * N + 2 * 2 * C + 2 * C + 16 * C * (512 + 32));
    EXPECT_EQ(c.operands, DType::bf16);
    EXPECT_EQ(c.launches, 1);
    const KernelCost one = sim::layernorm_backward_params_cost(16, 5, DType::f32, DType::f32, false,
                                                               false, false, false);
    EXPECT_DOUBLE_EQ(one.flops, 15 * 16 * 5);
    EXPECT_DOUBLE_EQ(one.bytes, 4 * (3 * 16 * 5 + 5) + 8 * 16 + 4 * 5);  // one chunk: no partials
    test::expect_error<InvalidArgument>(
        [] {
          sim::layernorm_backward_params_cost(4, 4, DType::f64, DType::f32, false, false, false,
                                              false);
        },
        "layernorm_backward_params_cost: expected storage and grad_type f32, bf16 or f16, got "
        "f64 and f32");
  }
  const nn::GPTConfig m{
      .block_size = 32, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const double L = 2, C = 64, T = 32, B = 4, N = B * T, steps = 2, chunks = 8;
  for (DType dt : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    const std::map<std::string, CostLedgerRow> rows = priced_rows(m, dt, Determinism::fast);
    ASSERT_FALSE(rows.empty());
    const double s = static_cast<double>(dtype_size(dt));
    ASSERT_EQ(rows.count("layernorm_backward_params / memory"), 1u);
    const CostLedgerRow& k = rows.at("layernorm_backward_params / memory");
    EXPECT_EQ(k.count, static_cast<std::int64_t>(steps * (2 * L + 1)));
    EXPECT_DOUBLE_EQ(k.flops / steps, 2 * L * 16 * N * C + 15 * N * C);  // no bias
    const double grads = C * s, partials = 16 * C * chunks;              // grad_w written
    EXPECT_DOUBLE_EQ(k.bytes / steps, 2 * L * (s * (4 * N * C + C) + 8 * N + grads + partials) +
                                          s * (3 * N * C + C) + 8 * N + grads + partials);
    EXPECT_NEAR(k.time_ps / 1e12, memory_time(static_cast<double>(k.count), k.bytes),
                k.count * 1e-12);
    for (const char* name :
         {"layernorm_backward_add", "layernorm_backward_ex", "layernorm_backward"})
      EXPECT_EQ(rows.count(std::string(name) + " / memory"), 0u) << name;
    const char* sums = dt == DType::f32 ? "sum_rows / memory" : "sum_rows_ex / memory";
    ASSERT_EQ(rows.count(sums), 1u);
    EXPECT_EQ(rows.at(sums).count, static_cast<std::int64_t>(steps));  // wpe's alone
  }
}
