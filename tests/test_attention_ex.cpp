// ops::attention / ops::attention_backward on bf16 / f16 tensors call the backend's typed
// attention (Kernels::attention_forward_ex / attention_backward_ex) exactly when
// Kernels::has_attention_ex says so, and MixedOp's f32 path (Kernels::attention_forward /
// attention_backward on widened copies) otherwise: a fake backend of host memory whose kernels
// record the calls. The simulator says no (its bits and MixedOp path stay). The kernels
// themselves are checked in ctest CudaEmu.Kernels (tools/cuda_emu/test_emu_attention.cpp) and on
// a GPU by CudaAttention.Typed* (tests/test_cuda_attention.cpp).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/numerics/float_formats.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

// What the fake's kernels saw.
struct AttnCalls {
  int forward = 0, backward = 0, forward_ex = 0, backward_ex = 0;
  DType ex_dtype = DType::f32;
  std::int64_t ex_hd = 0;
  const void* ex_y = nullptr;      // attention_forward_ex's y
  const void* ex_bwd_y = nullptr;  // attention_backward_ex's y
  const float* bwd_y = nullptr;    // attention_backward's y
  bool native = true;              // has_attention_ex's answer for bf16 / f16
  std::vector<std::pair<DType, std::int64_t>> asked;
};
AttnCalls calls;

[[noreturn]] void not_here(const char* k) {
  throw std::logic_error(std::string("fake backend: kernel ") + k + " not used by this test");
}

// Kernels over host memory: cast, has_attention_ex and the attention entries (recorded; they write
// zeros); every other kernel throws.
class FakeKernels final : public Kernels {
 public:
  void gemm(Stream&, bool, bool, std::int64_t, std::int64_t, std::int64_t, float, const float*,
            std::int64_t, const float*, std::int64_t, float, float*, std::int64_t,
            Determinism) override {
    not_here("gemm");
  }
  void add_bias(Stream&, float*, const float*, std::int64_t, std::int64_t) override {
    not_here("add_bias");
  }
  void sum_rows(Stream&, const float*, std::int64_t, std::int64_t, float, float*,
                Determinism) override {
    not_here("sum_rows");
  }
  void relu(Stream&, const float*, float*, std::int64_t) override { not_here("relu"); }
  void relu_backward(Stream&, const float*, const float*, float*, std::int64_t) override {
    not_here("relu_backward");
  }
  void cross_entropy(Stream&, const float*, const std::int64_t*, std::int64_t, std::int64_t,
                     float*) override {
    not_here("cross_entropy");
  }
  void cross_entropy_backward(Stream&, const float*, const std::int64_t*, std::int64_t,
                              std::int64_t, const float*, float, float*) override {
    not_here("cross_entropy_backward");
  }
  void mse(Stream&, const float*, const float*, std::int64_t, std::int64_t, float*) override {
    not_here("mse");
  }
  void mse_backward(Stream&, const float*, const float*, std::int64_t, const float*, float,
                    float*) override {
    not_here("mse_backward");
  }
  void sum(Stream&, const float*, std::int64_t, float, float*, Determinism) override {
    not_here("sum");
  }
  void fill_f32(Stream&, float*, float, std::int64_t) override { not_here("fill_f32"); }
  void axpy(Stream&, float, const float*, float*, std::int64_t) override { not_here("axpy"); }
  void scale(Stream&, float, float*, std::int64_t) override { not_here("scale"); }
  void sum_inputs(Stream&, const float* const*, int, float*, std::int64_t, Determinism) override {
    not_here("sum_inputs");
  }
  void sgd_step(Stream&, float*, const float*, float*, std::int64_t, float, float, float, float,
                bool, bool) override {
    not_here("sgd_step");
  }
  void gemm_tn_sharded(Stream&, std::int64_t, std::int64_t, const float*, std::int64_t,
                       const float*, std::int64_t, const std::vector<std::int64_t>&, float*,
                       std::int64_t, bool) override {
    not_here("gemm_tn_sharded");
  }
  void sum_rows_sharded(Stream&, const float*, std::int64_t, std::int64_t,
                        const std::vector<std::int64_t>&, float*, bool) override {
    not_here("sum_rows_sharded");
  }
  void sum_sharded(Stream&, const float*, const std::vector<std::int64_t>&, float,
                   float*) override {
    not_here("sum_sharded");
  }
  void adam_step(Stream&, float*, const float*, float*, float*, float*, std::int64_t, double,
                 double, double, double, double, double, double, bool) override {
    not_here("adam_step");
  }

  void cast(Stream&, const void* x, DType from, void* y, DType to, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) {
      float v = 0.0f;
      if (from == DType::f32)
        v = static_cast<const float*>(x)[i];
      else if (from == DType::bf16)
        v = static_cast<const bfloat16*>(x)[i].to_float();
      else if (from == DType::f16)
        v = static_cast<const float16*>(x)[i].to_float();
      else
        not_here("cast (dtype)");
      if (to == DType::f32)
        static_cast<float*>(y)[i] = v;
      else if (to == DType::bf16)
        static_cast<bfloat16*>(y)[i] = bfloat16::from(v);
      else if (to == DType::f16)
        static_cast<float16*>(y)[i] = float16::from(v);
      else
        not_here("cast (dtype)");
    }
  }
  bool has_attention_ex(DType t, std::int64_t hd, Determinism) const override {
    calls.asked.push_back({t, hd});
    return calls.native && (t == DType::bf16 || t == DType::f16);
  }
  void attention_forward(Stream&, const float*, std::int64_t B, std::int64_t T, std::int64_t C,
                         std::int64_t nh, float* y, float* stats, float, std::uint64_t,
                         std::uint64_t, std::uint64_t, Determinism) override {
    ++calls.forward;
    std::memset(y, 0, sizeof(float) * std::size_t(B * T * C));
    std::memset(stats, 0, sizeof(float) * std::size_t(B * nh * T * 2));
  }
  void attention_backward(Stream&, const float*, const float*, const float* y, const float*,
                          std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t, float* dqkv,
                          float*, float, std::uint64_t, std::uint64_t, std::uint64_t,
                          Determinism) override {
    ++calls.backward;
    calls.bwd_y = y;
    std::memset(dqkv, 0, sizeof(float) * std::size_t(B * T * 3 * C));
  }
  void attention_forward_ex(Stream&, const void*, DType dtype, std::int64_t B, std::int64_t T,
                            std::int64_t C, std::int64_t nh, void* y, float* stats, float,
                            std::uint64_t, std::uint64_t, std::uint64_t, Determinism) override {
    ++calls.forward_ex;
    calls.ex_dtype = dtype;
    calls.ex_hd = C / nh;
    calls.ex_y = y;
    std::memset(y, 0, 2 * std::size_t(B * T * C));
    std::memset(stats, 0, sizeof(float) * std::size_t(B * nh * T * 2));
  }
  void attention_backward_ex(Stream&, const void*, const void*, const void* y, DType dtype,
                             const float*, std::int64_t B, std::int64_t T, std::int64_t C,
                             std::int64_t, void* dqkv, float*, float, std::uint64_t, std::uint64_t,
                             std::uint64_t, Determinism) override {
    ++calls.backward_ex;
    calls.ex_dtype = dtype;
    calls.ex_bwd_y = y;
    std::memset(dqkv, 0, 2 * std::size_t(B * T * 3 * C));
  }
};

class FakeStream final : public Stream {
 public:
  Device device() const override { return Device("attn_ex_fake", 0); }
  void synchronize() override {}
  void record(Event&) override {}
  void wait(const Event&) override {}
};
class FakeEvent final : public Event {
 public:
  void synchronize() override {}
  bool query() override { return true; }
};

// One device of host memory running FakeKernels.
class FakeBackend final : public Backend {
 public:
  std::string name() const override { return "attn_ex_fake"; }
  int device_count() const override { return 1; }
  DeviceProperties properties(int) const override { return {"fake", 0}; }
  MemoryStats memory_stats(int) const override { return {0, 0, static_cast<std::size_t>(-1)}; }
  void reset_peak_memory(int) override {}
  void* allocate(int, std::size_t bytes) override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  }
  void deallocate(int, void* p, std::size_t) noexcept override { std::free(p); }
  Stream& default_stream(int) override { return stream_; }
  std::unique_ptr<Stream> create_stream(int) override { return std::make_unique<FakeStream>(); }
  std::unique_ptr<Event> create_event(int) override { return std::make_unique<FakeEvent>(); }
  void copy_from_host(Stream&, void* dst, const void* src, std::size_t n) override {
    if (n) std::memmove(dst, src, n);
  }
  void copy_to_host(Stream&, void* dst, const void* src, std::size_t n) override {
    if (n) std::memmove(dst, src, n);
  }
  void copy_2d(Stream&, void* dst, std::size_t dp, const void* src, std::size_t sp, std::size_t row,
               std::size_t rows) override {
    for (std::size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dp, static_cast<const char*>(src) + r * sp, row);
  }
  Kernels& kernels() override { return kernels_; }
  std::shared_ptr<CommunicatorImpl> create_communicator(const std::vector<int>&,
                                                        const CommOptions&) override {
    not_here("communicator");
  }

 private:
  FakeStream stream_;
  FakeKernels kernels_;
};

Device fake_device() {
  static const bool registered = [] {
    register_backend("attn_ex_fake",
                     [](const BackendOptions&) { return std::make_shared<FakeBackend>(); });
    init_backend("attn_ex_fake");
    return true;
  }();
  (void)registered;
  return Device("attn_ex_fake", 0);
}

Tensor on_fake(std::int64_t n, const Shape& shape, DType dtype) {
  std::vector<float> v(std::size_t(n), 0.5f);
  return Tensor::from_vector(v, shape).to(fake_device()).to(dtype);
}

// Forward then backward of a [2, 5, 3C] qkv of `dtype` with `nh` heads on the fake device.
void run(DType dtype, std::int64_t C, std::int64_t nh, Determinism mode, DType dy_dtype) {
  AttnCalls fresh;
  fresh.native = calls.native;
  calls = fresh;
  const Tensor qkv = on_fake(2 * 5 * 3 * C, {2, 5, 3 * C}, dtype);
  Tensor stats;
  const Tensor y = ops::attention(qkv, nh, stats, 0.1f, 1, 2, 3, mode);
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_EQ(stats.dtype(), DType::f32);
  const Tensor dy = on_fake(2 * 5 * C, {2, 5, C}, dy_dtype);
  const Tensor dqkv = ops::attention_backward(dy, qkv, stats, nh, 0.1f, 1, 2, 3, mode);
  // MixedOp's storage dtype: the first bf16 / f16 of (dy, qkv).
  EXPECT_EQ(dqkv.dtype(), dy_dtype != DType::f32 ? dy_dtype : dtype);
}

TEST(AttentionEx, OpsCallTheTypedKernelsWhenTheBackendHasThem) {
  calls.native = true;
  for (DType t : {DType::bf16, DType::f16})
    for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + determinism_name(mode));
      run(t, 24, 3, mode, t);
      EXPECT_EQ(calls.forward_ex, 1);
      EXPECT_EQ(calls.backward_ex, 1);
      EXPECT_EQ(calls.forward + calls.backward, 0);
      EXPECT_EQ(calls.ex_dtype, t);
      EXPECT_EQ(calls.ex_hd, 8);
      ASSERT_FALSE(calls.asked.empty());
      EXPECT_EQ(calls.asked[0], std::make_pair(t, std::int64_t(8)));
    }
}

TEST(AttentionEx, OpsRunMixedOpWhenTheBackendHasNone) {
  calls.native = false;
  run(DType::bf16, 24, 3, Determinism::fast, DType::bf16);
  EXPECT_EQ(calls.forward_ex + calls.backward_ex, 0);
  EXPECT_EQ(calls.forward, 1);
  EXPECT_EQ(calls.backward, 1);
  EXPECT_FALSE(calls.asked.empty());  // it was asked
}

TEST(AttentionEx, MixedDtypesAndF32NeverReachTheTypedKernels) {
  calls.native = true;
  run(DType::bf16, 24, 3, Determinism::fast, DType::f16);  // dy f16, qkv bf16: MixedOp backward
  EXPECT_EQ(calls.forward_ex, 1);
  EXPECT_EQ(calls.backward_ex, 0);
  EXPECT_EQ(calls.backward, 1);
  run(DType::f32, 24, 3, Determinism::fast, DType::f32);
  EXPECT_EQ(calls.forward_ex + calls.backward_ex, 0);
  EXPECT_EQ(calls.forward + calls.backward, 2);
  EXPECT_TRUE(calls.asked.empty());  // f32: not asked
}

TEST(AttentionEx, BadArgumentsOfATypedCallAreRefusedAsBefore) {
  calls.native = true;
  const Tensor qkv = on_fake(2 * 5 * 24, {2, 5, 24}, DType::bf16);  // C 8
  Tensor stats;
  test::expect_invalid([&] { ops::attention(qkv, 3, stats); },
                       "ops::attention: n_head: expected a divisor of C = 8");
  test::expect_invalid([&] { ops::attention(qkv, 2, stats, 1.0f); },
                       "ops::attention: p: expected a drop probability in [0, 1), got 1");
  const Tensor y = ops::attention(qkv, 2, stats);
  const Tensor bad_dy = on_fake(2 * 4 * 8, {2, 4, 8}, DType::bf16);
  test::expect_invalid([&] { ops::attention_backward(bad_dy, qkv, stats, 2); },
                       "ops::attention_backward: dy: expected [B, T, C] = [2, 5, 8], got");
  EXPECT_EQ(y.dtype(), DType::bf16);
}

// ops::attention_backward in fast mode given `bad_y` throws InvalidArgument containing `message`.
void expect_bad_y(const Tensor& dy, const Tensor& qkv, const Tensor& stats, const Tensor& bad_y,
                  const char* message) {
  test::expect_invalid(
      [&] { ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::fast, bad_y); },
      message);
}

// ops::attention_backward hands the forward's output y to the typed backward (its fast kernels
// read D = rowsum(dy * y) from it: 7 products, not 9), null when not given; a y of another
// dtype or shape is refused on every path.
TEST(AttentionEx, OpsPassTheForwardsOutputToTheTypedBackward) {
  calls.native = true;
  const Tensor qkv = on_fake(2 * 5 * 24, {2, 5, 24}, DType::bf16);  // C 8
  Tensor stats;
  const Tensor y = ops::attention(qkv, 2, stats, 0.0f, 0, 0, 0, Determinism::fast);
  EXPECT_EQ(calls.ex_y, y.data_ptr());
  const Tensor dy = on_fake(2 * 5 * 8, {2, 5, 8}, DType::bf16);
  ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::fast, y);
  EXPECT_EQ(calls.ex_bwd_y, y.data_ptr());
  ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::fast);
  EXPECT_EQ(calls.ex_bwd_y, nullptr);
  const Tensor y32 = on_fake(2 * 5 * 8, {2, 5, 8}, DType::f32);
  const Tensor y_short = on_fake(2 * 4 * 8, {2, 4, 8}, DType::bf16);
  for (bool native : {true, false}) {
    calls.native = native;  // the typed kernels, then MixedOp's path
    expect_bad_y(dy, qkv, stats, y32, "ops::attention_backward: y: expected dtype bf16, got");
    expect_bad_y(
        dy, qkv, stats, y_short,
        "ops::attention_backward: y: expected [B, T, C] (the forward's output) = [2, 5, 8], got");
  }
}

// The f32 backward alike (Kernels::attention_backward's y: CUDA's fast tiled kernels read pd =
// rowsum(dy * y) from it, 7 products, not 9): y handed on, null when not given; a y of another
// dtype, shape or device is refused naming the op and the argument. MixedOp's path (bf16 qkv, no
// typed kernel) checks y and hands the f32 backward none (y would need a widened copy).
TEST(AttentionEx, OpsPassTheForwardsOutputToTheF32Backward) {
  calls.native = true;
  const Tensor qkv = on_fake(2 * 5 * 24, {2, 5, 24}, DType::f32);  // C 8
  Tensor stats;
  const Tensor y = ops::attention(qkv, 2, stats, 0.0f, 0, 0, 0, Determinism::fast);
  const Tensor dy = on_fake(2 * 5 * 8, {2, 5, 8}, DType::f32);
  calls.bwd_y = nullptr;
  ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::fast, y);
  EXPECT_EQ(calls.bwd_y, y.data<float>());
  ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::bitwise, y);
  EXPECT_EQ(calls.bwd_y, y.data<float>());  // handed on: the backend's bitwise mode ignores it
  ops::attention_backward(dy, qkv, stats, 2, 0.0f, 0, 0, 0, Determinism::fast);
  EXPECT_EQ(calls.bwd_y, nullptr);
  const Tensor y_bf16 = on_fake(2 * 5 * 8, {2, 5, 8}, DType::bf16);
  const Tensor y_short = on_fake(2 * 5 * 4, {2, 5, 4}, DType::f32);
  const Tensor y_sim =
      Tensor::from_vector(std::vector<float>(80, 0.5f), {2, 5, 8}).to(Device("sim", 0));
  expect_bad_y(dy, qkv, stats, y_bf16, "ops::attention_backward: y: expected dtype f32, got");
  expect_bad_y(
      dy, qkv, stats, y_short,
      "ops::attention_backward: y: expected [B, T, C] (the forward's output) = [2, 5, 8], got");
  expect_bad_y(
      dy, qkv, stats, y_sim,
      "ops::attention_backward: y: expected a tensor on attn_ex_fake:0 (the device of qkv), got");
  // MixedOp's path: checked, not handed on.
  calls.native = false;
  const Tensor qkv16 = qkv.to(DType::bf16), dy16 = dy.to(DType::bf16);
  Tensor stats16;
  const Tensor y16 = ops::attention(qkv16, 2, stats16, 0.0f, 0, 0, 0, Determinism::fast);
  calls.bwd_y = y.data<float>();
  ops::attention_backward(dy16, qkv16, stats16, 2, 0.0f, 0, 0, 0, Determinism::fast, y16);
  EXPECT_EQ(calls.bwd_y, nullptr);
  expect_bad_y(dy16, qkv16, stats16, y, "ops::attention_backward: y: expected dtype bf16, got");
}

TEST(AttentionEx, TheSimulatorKeepsItsMixedOpPath) {
  Kernels& k = get_backend("sim").kernels();
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    for (Determinism mode : {Determinism::bitwise, Determinism::fast})
      EXPECT_FALSE(k.has_attention_ex(t, 64, mode));
}

}  // namespace
}  // namespace ditto
