// The typed row kernels (issue 29; Kernels::has_rows_ex and the *_ex entries, Note [Mixed
// precision]): the ops of core/runtime/ops.h call them on bf16 / f16 tensors exactly where the
// backend's has_rows_ex says so, with the bits of the MixedOp path they replace, and otherwise
// keep MixedOp (the simulator's path, unchanged). On the CPU through a probe backend: the
// simulator's kernels behind a Kernels that counts every call and answers has_rows_ex as told
// (its *_ex entries compute as MixedOp does: cast, the simulator's f32 kernel, cast). On a GPU
// (skips without one): the CUDA backend's typed kernels against the simulator's bits; their CPU
// half is ctest CudaEmu.Kernels (`cuda_emu_test rows`, tools/cuda_emu/test_emu_rows.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/gpt.h"
#include "core/nn/gpt_layers.h"
#include "core/nn/loss.h"
#include "core/numerics/float_formats.h"
#include "core/numerics/micro_shards.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "counting_kernels.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr const char* kRowsProbe = "rows_probe";

// The simulator's kernels, each call counted by name (and the bytes every cast moves); has_rows_ex
// answers `rows_ex` for bf16 / f16. Its *_ex entries run MixedOp's arithmetic on the simulator:
// the storage-dtype inputs cast to f32 scratch, the f32 kernel, each output cast once.
class RowsProbeKernels final : public CountingKernels {
 public:
  using CountingKernels::CountingKernels;

  bool rows_ex = false;
  bool sums_ex = false;         // has_sum_rows_ex's answer (x bf16 / f16, out x's dtype or f32)
  bool ln_add = false;          // has_layernorm_backward_add's answer (f32, bf16, f16)
  bool ln_params = false;       // has_layernorm_backward_params' answer (f32, bf16, f16; fast mode)
  bool ln_fwd_add = false;      // has_layernorm_forward_add's answer (f32, bf16, f16)
  std::int64_t cast_bytes = 0;  // read + written by the casts the ops asked for
  void reset() {
    calls.clear();
    cast_bytes = 0;
  }
  int ex_calls() const {
    int n = 0;
    for (const auto& [name, c] : calls)
      if (name.size() > 3 && name.compare(name.size() - 3, 3, "_ex") == 0 && name != "gemm_ex")
        n += c;
    return n;
  }

  bool has_rows_ex(DType storage, Determinism) const override {
    return rows_ex && (storage == DType::bf16 || storage == DType::f16);
  }
  void cast(Stream& s, const void* x, DType from, void* y, DType to, std::int64_t n) override {
    note("cast");
    cast_bytes += n * static_cast<std::int64_t>(dtype_size(from) + dtype_size(to));
    k_.cast(s, x, from, y, to, n);
  }

  void embedding_forward_ex(Stream& s, DType t, const std::int64_t* idx, const void* wte,
                            const void* wpe, std::int64_t N, std::int64_t T, std::int64_t C,
                            void* out) override {
    note("embedding_forward_ex");
    // wte's rows: at most the largest id + 1 (ids were checked); wpe's: T.
    std::int64_t V = 0;
    {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(N));
      sim_.copy_to_host(s, ids.data(), idx, ids.size() * sizeof(std::int64_t));
      for (std::int64_t v : ids) V = std::max(V, v + 1);
    }
    Scratch sc(*this, s);
    const float* w = sc.in(t, wte, V * C);
    const float* p = wpe != nullptr ? sc.in(t, wpe, T * C) : nullptr;
    float* o = sc.f32(N * C);
    k_.embedding_forward(s, idx, w, p, N, T, C, o);
    sc.out(o, t, out, N * C);
  }
  void embedding_backward_ex(Stream& s, DType t, const std::int64_t* idx, const void* dy,
                             std::int64_t N, std::int64_t C, std::int64_t V,
                             const std::vector<std::int64_t>& bounds, DType grad_type,
                             void* grad_wte, bool accumulate) override {
    note("embedding_backward_ex");
    Scratch sc(*this, s);
    float* g = static_cast<float*>(grad_wte);  // f32: written directly
    if (grad_type != DType::f32) {
      g = sc.f32(V * C);
      k_.cast(s, grad_wte, t, g, DType::f32, V * C);
    }
    k_.embedding_backward(s, idx, sc.in(t, dy, N * C), N, C, V, bounds, g, accumulate);
    if (grad_type != DType::f32) sc.out(g, t, grad_wte, V * C);
  }
  void layernorm_forward_ex(Stream& s, DType t, const void* x, const void* w, const void* b,
                            std::int64_t N, std::int64_t C, float eps, void* y, float* mean,
                            float* rstd) override {
    note("layernorm_forward_ex");
    Scratch sc(*this, s);
    float* yf = sc.f32(N * C);
    k_.layernorm_forward(s, sc.in(t, x, N * C), sc.in(t, w, C),
                         b != nullptr ? sc.in(t, b, C) : nullptr, N, C, eps, yf, mean, rstd);
    sc.out(yf, t, y, N * C);
  }
  void layernorm_backward_ex(Stream& s, DType t, const void* dy, const void* x, const void* w,
                             const float* mean, const float* rstd, std::int64_t N, std::int64_t C,
                             void* dx, void* dy_xhat) override {
    note("layernorm_backward_ex");
    Scratch sc(*this, s);
    float* dxf = sc.f32(N * C);
    float* hf = sc.f32(N * C);
    k_.layernorm_backward(s, sc.in(t, dy, N * C), sc.in(t, x, N * C), sc.in(t, w, C), mean, rstd, N,
                          C, dxf, hf);
    sc.out(dxf, t, dx, N * C);
    sc.out(hf, t, dy_xhat, N * C);
  }
  void gelu_forward_ex(Stream& s, DType t, const void* x, void* y, std::int64_t n) override {
    note("gelu_forward_ex");
    Scratch sc(*this, s);
    float* yf = sc.f32(n);
    k_.gelu_forward(s, sc.in(t, x, n), yf, n);
    sc.out(yf, t, y, n);
  }
  void gelu_backward_ex(Stream& s, DType t, const void* x, const void* gy, void* gx,
                        std::int64_t n) override {
    note("gelu_backward_ex");
    Scratch sc(*this, s);
    float* gf = sc.f32(n);
    k_.gelu_backward(s, sc.in(t, x, n), sc.in(t, gy, n), gf, n);
    sc.out(gf, t, gx, n);
  }
  void cross_entropy_ex(Stream& s, DType t, const void* logits, const std::int64_t* targets,
                        std::int64_t rows, std::int64_t classes, float* losses) override {
    note("cross_entropy_ex");
    Scratch sc(*this, s);
    k_.cross_entropy(s, sc.in(t, logits, rows * classes), targets, rows, classes, losses);
  }
  void cross_entropy_backward_ex(Stream& s, DType t, const void* logits,
                                 const std::int64_t* targets, std::int64_t rows,
                                 std::int64_t classes, const float* grad_loss, float scale,
                                 void* grad_logits) override {
    note("cross_entropy_backward_ex");
    Scratch sc(*this, s);
    float* gf = sc.f32(rows * classes);
    k_.cross_entropy_backward(s, sc.in(t, logits, rows * classes), targets, rows, classes,
                              grad_loss, scale, gf);
    sc.out(gf, t, grad_logits, rows * classes);
  }
  void dropout_forward_ex(Stream& s, DType t, const void* x, void* y, std::int64_t n, float p,
                          std::uint64_t seed, std::uint64_t stream,
                          std::uint64_t index_base) override {
    note("dropout_forward_ex");
    Scratch sc(*this, s);
    float* yf = sc.f32(n);
    k_.dropout_forward(s, sc.in(t, x, n), yf, n, p, seed, stream, index_base);
    sc.out(yf, t, y, n);
  }
  void dropout_backward_ex(Stream& s, DType t, const void* gy, void* gx, std::int64_t n, float p,
                           std::uint64_t seed, std::uint64_t stream,
                           std::uint64_t index_base) override {
    note("dropout_backward_ex");
    Scratch sc(*this, s);
    float* gf = sc.f32(n);
    k_.dropout_backward(s, sc.in(t, gy, n), gf, n, p, seed, stream, index_base);
    sc.out(gf, t, gx, n);
  }

  // The residual gradient's add in the LayerNorm backward (has_layernorm_backward_add): the two
  // ops' arithmetic, dx as layernorm_backward(_ex) computes it (f32 kernel, rounded into t), then
  // the simulator's add_any(t, residual, dx).
  bool has_layernorm_backward_add(DType t) const override {
    return ln_add && (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }
  void layernorm_backward_add(Stream& s, DType t, const void* dy, const void* x, const void* w,
                              const float* mean, const float* rstd, const void* residual,
                              std::int64_t N, std::int64_t C, void* out, void* dy_xhat) override {
    note("layernorm_backward_add");
    Scratch sc(*this, s);
    const std::int64_t n = N * C;
    float* dxf = sc.f32(n);
    if (t == DType::f32) {
      k_.layernorm_backward(s, static_cast<const float*>(dy), static_cast<const float*>(x),
                            static_cast<const float*>(w), mean, rstd, N, C, dxf,
                            static_cast<float*>(dy_xhat));
      k_.add_any(s, t, residual, dxf, out, n);
      return;
    }
    float* hf = sc.f32(n);
    k_.layernorm_backward(s, sc.in(t, dy, n), sc.in(t, x, n), sc.in(t, w, C), mean, rstd, N, C, dxf,
                          hf);
    float* dxt = sc.f32(n);  // dx rounded into t (2 bytes an element)
    sc.out(dxf, t, dxt, n);
    sc.out(hf, t, dy_xhat, n);
    k_.add_any(s, t, residual, dxt, out, n);
  }

  // The LayerNorm backward with its parameter gradients (has_layernorm_backward_params, fast
  // mode): the simulator's f32 layernorm_backward on the widened inputs, dy_xhat kept in f32
  // (never rounded into t, as CUDA's kernel never stores it), the residual added in f32 and dx
  // rounded once, the two fast f32 row sums into the widened gradients, rounded once.
  bool has_layernorm_backward_params(DType t, Determinism mode) const override {
    return ln_params && mode == Determinism::fast &&
           (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }
  void layernorm_backward_params(Stream& s, DType t, const void* dy, const void* x, const void* w,
                                 const float* mean, const float* rstd, const void* residual,
                                 std::int64_t N, std::int64_t C, void* dx, DType gt, void* grad_w,
                                 bool accumulate_w, void* grad_b, bool accumulate_b) override {
    note("layernorm_backward_params");
    Scratch sc(*this, s);
    const std::int64_t n = N * C;
    const float* dyf = sc.in(t, dy, n);
    float* dxf = sc.f32(n);
    float* hf = sc.f32(n);
    k_.layernorm_backward(s, dyf, sc.in(t, x, n), sc.in(t, w, C), mean, rstd, N, C, dxf, hf);
    if (residual != nullptr) {
      float* sum = sc.f32(n);
      const float* in[2] = {sc.in(t, residual, n), dxf};
      k_.sum_inputs(s, in, 2, sum, n, Determinism::fast);
      dxf = sum;
    }
    sc.out(dxf, t, dx, n);
    auto param = [&](const float* rows, void* g, bool acc) {
      float* gf = const_cast<float*>(sc.in(gt, g, C));
      k_.sum_rows(s, rows, N, C, acc ? 1.0f : 0.0f, gf, Determinism::fast);
      sc.out(gf, gt, g, C);
    };
    param(hf, grad_w, accumulate_w);
    if (grad_b != nullptr) param(dyf, grad_b, accumulate_b);
  }

  // The residual add in the LayerNorm forward (has_layernorm_forward_add): the two ops'
  // arithmetic, the simulator's add_any(t, x, branch) into the residual, then
  // layernorm_forward(_ex) of it (widened, the f32 kernel, y rounded into t).
  bool has_layernorm_forward_add(DType t) const override {
    return ln_fwd_add && (t == DType::f32 || t == DType::bf16 || t == DType::f16);
  }
  void layernorm_forward_add(Stream& s, DType t, const void* x, const void* branch, const void* w,
                             const void* b, std::int64_t N, std::int64_t C, float eps,
                             void* residual, void* y, float* mean, float* rstd) override {
    note("layernorm_forward_add");
    const std::int64_t n = N * C;
    k_.add_any(s, t, x, branch, residual, n);
    if (t == DType::f32) {
      k_.layernorm_forward(s, static_cast<const float*>(residual), static_cast<const float*>(w),
                           static_cast<const float*>(b), N, C, eps, static_cast<float*>(y), mean,
                           rstd);
      return;
    }
    Scratch sc(*this, s);
    float* yf = sc.f32(n);
    k_.layernorm_forward(s, sc.in(t, residual, n), sc.in(t, w, C),
                         b != nullptr ? sc.in(t, b, C) : nullptr, N, C, eps, yf, mean, rstd);
    sc.out(yf, t, y, n);
  }

  // The typed reductions over rows (has_sum_rows_ex): MixedOp's arithmetic, x and a typed out
  // widened, the simulator's f32 kernel, out cast back.
  bool has_sum_rows_ex(DType x_type, DType out_type, Determinism) const override {
    return sums_ex && (x_type == DType::bf16 || x_type == DType::f16) &&
           (out_type == x_type || out_type == DType::f32);
  }
  void sum_rows_ex(Stream& s, const void* x, DType xt, std::int64_t rows, std::int64_t cols,
                   float beta, void* out, DType ot, Determinism mode) override {
    note("sum_rows_ex");
    Scratch sc(*this, s);
    float* of =
        ot == DType::f32 ? static_cast<float*>(out) : const_cast<float*>(sc.in(ot, out, cols));
    k_.sum_rows(s, sc.in(xt, x, rows * cols), rows, cols, beta, of, mode);
    if (ot != DType::f32) sc.out(of, ot, out, cols);
  }
  void sum_rows_sharded_ex(Stream& s, const void* x, DType xt, std::int64_t rows, std::int64_t cols,
                           const std::vector<std::int64_t>& bounds, void* out, DType ot,
                           bool accumulate) override {
    note("sum_rows_sharded_ex");
    Scratch sc(*this, s);
    float* of =
        ot == DType::f32 ? static_cast<float*>(out) : const_cast<float*>(sc.in(ot, out, cols));
    k_.sum_rows_sharded(s, sc.in(xt, x, rows * cols), rows, cols, bounds, of, accumulate);
    if (ot != DType::f32) sc.out(of, ot, out, cols);
  }
};

class RowsEx : public SimSuite<2> {
 protected:
  static void SetUpTestSuite() {
    SimSuite<2>::SetUpTestSuite();
    register_probe_backend<RowsProbeKernels>(kRowsProbe);
  }
  static RowsProbeKernels& probe() {
    return static_cast<RowsProbeKernels&>(get_backend(kRowsProbe).kernels());
  }
};

/// Host values in [-2, 2) (Philox stream `sub`) as a `dt` tensor on `backend`:0.
Tensor input(const Shape& shape, DType dt, std::uint64_t sub, const std::string& backend) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(11, stream_id(kStreamSynthetic, sub), i, -2.0f, 2.0f);
  return Tensor::from_vector(v, shape).to(dt).to(Device(backend, 0));
}

/// Every row op of the GPT step on `dt` tensors of `backend`: their results' bytes, in order.
std::vector<std::vector<std::uint8_t>> run_row_ops(DType dt, const std::string& backend) {
  const std::int64_t B = 2, T = 5, C = 24, V = 11;
  const Device dev(backend, 0);
  std::vector<std::int64_t> ids(B * T), tg(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<std::int64_t>((i * 7 + 3) % V);
    tg[i] = static_cast<std::int64_t>((i * 5 + 1) % C);
  }
  const Tensor idx = Tensor::from_vector(ids, {B, T}).to(dev);
  const Tensor targets = Tensor::from_vector(tg, {B * T}).to(dev);
  const Tensor wte = input({V, C}, dt, 1, backend), wpe = input({T, C}, dt, 2, backend);
  const Tensor w = input({C}, dt, 3, backend), b = input({C}, dt, 4, backend);
  const Tensor dy = input({B * T, C}, dt, 5, backend);
  std::vector<Tensor> out;
  const Tensor x = ops::embedding(idx, wte, wpe).view({B * T, C});
  out.push_back(x);
  Tensor mean, rstd, dy_xhat;
  out.push_back(ops::layernorm(x, w, b, 1e-5f, mean, rstd));
  out.push_back(mean);
  out.push_back(rstd);
  out.push_back(ops::layernorm_backward(dy, x, w, mean, rstd, dy_xhat));
  out.push_back(dy_xhat);
  out.push_back(ops::gelu(x));
  out.push_back(ops::gelu_backward(x, dy));
  out.push_back(ops::cross_entropy(x, targets));
  const Tensor grad_loss = Tensor::from_vector(std::vector<float>{0.5f}, {}).to(dev);
  out.push_back(ops::cross_entropy_backward(x, targets, grad_loss, 0.25f));
  out.push_back(ops::add(x, dy));
  out.push_back(ops::dropout(x, 0.25f, 9, 3, 100));
  out.push_back(ops::dropout_backward(dy, 0.25f, 9, 3, 100));
  // The embedding gradient into dt over micro-shards, accumulated, and into f32 (bitwise mode's
  // gradients) over one shard, stored.
  Tensor grad_wte = input({V, C}, dt, 6, backend), grad_f32 = input({V, C}, DType::f32, 7, backend);
  ops::embedding_backward(idx, dy.view({B, T, C}), grad_wte, {0, 3, 3, 7, 10}, true);
  ops::embedding_backward(idx, dy.view({B, T, C}), grad_f32, {0, B * T}, false);
  out.push_back(grad_wte);
  out.push_back(grad_f32);
  std::vector<std::vector<std::uint8_t>> bytes;
  for (const Tensor& t : out) bytes.push_back(tensor_bytes(t));
  return bytes;
}

// The dispatch rule: with has_rows_ex false (the simulator's answer) every op takes MixedOp's
// casts and no *_ex kernel runs; with it true each op is one *_ex launch (add: add_any) and no
// cast, with the same bytes (the embedding gradient into f32 too: bitwise mode's gradients); a
// mixed call (a bf16 x with an f32 or f16 weight, a gradient of the other half dtype) keeps
// MixedOp.
TEST_F(RowsEx, OpsCallTheTypedRowKernelsOnlyWhereHasRowsExSaysSo) {
  RowsProbeKernels& k = probe();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto sim = run_row_ops(dt, "sim");
    k.rows_ex = false;
    k.reset();
    const auto mixed = run_row_ops(dt, kRowsProbe);
    EXPECT_EQ(k.ex_calls(), 0);
    EXPECT_EQ(k.calls["add_any"], 0);
    EXPECT_GT(k.calls["cast"], 0);
    k.rows_ex = true;
    k.reset();
    const auto typed = run_row_ops(dt, kRowsProbe);
    for (const char* name :
         {"embedding_forward_ex", "layernorm_forward_ex", "layernorm_backward_ex",
          "gelu_forward_ex", "gelu_backward_ex", "cross_entropy_ex", "cross_entropy_backward_ex",
          "dropout_forward_ex", "dropout_backward_ex", "add_any"})
      EXPECT_EQ(k.calls[name], 1) << name;
    EXPECT_EQ(k.calls["embedding_backward_ex"], 2);  // into dt and into f32
    EXPECT_EQ(k.calls["cast"], 0);  // no f32 scratch: the inputs were uploaded in dt
    ASSERT_EQ(typed.size(), sim.size());
    for (std::size_t i = 0; i < sim.size(); ++i) {
      EXPECT_EQ(mixed[i], sim[i]) << "result " << i << " (has_rows_ex false)";
      EXPECT_EQ(typed[i], sim[i]) << "result " << i << " (has_rows_ex true)";
    }
    // Mixed dtypes: MixedOp, as on the simulator.
    k.reset();
    const Tensor x = input({3, 8}, dt, 6, kRowsProbe);
    const DType other = dt == DType::bf16 ? DType::f16 : DType::bf16;
    Tensor mean, rstd;
    ops::layernorm(x, input({8}, DType::f32, 7, kRowsProbe), Tensor(), 1e-5f, mean, rstd);
    ops::add(x, input({3, 8}, other, 8, kRowsProbe));
    Tensor grad_other = input({5, 8}, other, 9, kRowsProbe);  // grad_wte neither f32 nor x's dtype
    const std::vector<std::int64_t> ids{4, 0, 4};
    ops::embedding_backward(Tensor::from_vector(ids, {3}).to(Device(kRowsProbe, 0)), x, grad_other,
                            {0, 3}, true);
    EXPECT_EQ(k.ex_calls(), 0);
    EXPECT_EQ(k.calls["add_any"], 0);
  }
  k.rows_ex = false;
}

// The typed path's argument checks say what the f32 path says (no MixedOp note: nothing was
// copied).
TEST_F(RowsEx, TypedPathErrorsNameTheOpAndTheArgument) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  const Tensor x = input({3, 8}, DType::bf16, 1, kRowsProbe);
  Tensor mean, rstd;
  expect_invalid(
      [&] {
        ops::layernorm(x, input({7}, DType::bf16, 2, kRowsProbe), Tensor(), 1e-5f, mean, rstd);
      },
      "ops::layernorm: w: expected [C] = [8], got");
  expect_invalid(
      [&] {
        ops::add(x, input({3, 7}, DType::bf16, 3, kRowsProbe));
      },
      "ops::add: b: expected [3, 8] (the shape of a), got");
  expect_invalid(
      [&] {
        ops::gelu_backward(x, input({8, 3}, DType::bf16, 4, kRowsProbe));
      },
      "ops::gelu_backward: grad_y: expected [3, 8] (the shape of x), got");
  expect_invalid(
      [&] {
        Tensor narrow = input({5, 7}, DType::f32, 5, kRowsProbe);
        const std::vector<std::int64_t> ids{4, 0, 4};
        ops::embedding_backward(Tensor::from_vector(ids, {3}).to(Device(kRowsProbe, 0)), x, narrow,
                                {0, 3}, true);
      },
      "ops::embedding_backward: grad_wte: expected [V, C] with C = 8 (the width of dy), got");
  EXPECT_EQ(k.ex_calls(), 0);
  k.rows_ex = false;
}

/// One bitwise forward + backward of a tiny GPT (2 layers, C 32, T 16, V 65, dropout 0.1) cast
/// to `dt` on the probe; the loss and every gradient's bytes.
struct Step {
  float loss = 0;
  std::vector<std::vector<std::uint8_t>> grads;
};
Step gpt_step(DType dt, Determinism mode = Determinism::bitwise) {
  const nn::GPTConfig cfg{
      .block_size = 16, .vocab_size = 65, .n_layer = 2, .n_head = 4, .n_embd = 32, .dropout = 0.1f};
  nn::GPT model(cfg, Device(kRowsProbe, 0), 1337);
  model.to(dt);
  model.set_step(3);
  model.set_determinism(mode);
  const std::int64_t B = 4, T = cfg.block_size;
  std::vector<std::int64_t> ids(B * T), tg(B * T);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = philox_u32(5, stream_id(kStreamSynthetic, 40), i) % 65u;
    tg[i] = philox_u32(5, stream_id(kStreamSynthetic, 41), i) % 65u;
  }
  const Device dev(kRowsProbe, 0);
  nn::CrossEntropyLoss crit;
  crit.set_determinism(mode);
  const Tensor logits = model.forward(Tensor::from_vector(ids, {B, T}).to(dev));
  const Tensor loss = crit.forward(logits, Tensor::from_vector(tg, {B, T}).to(dev));
  model.backward(crit.backward());
  Step r;
  r.loss = loss.item();
  for (nn::Parameter* p : model.parameters()) r.grads.push_back(tensor_bytes(p->grad));
  return r;
}

// A bf16 / f16 GPT step with the typed row kernels has the MixedOp step's loss and gradient
// bytes, and runs none of the casts of the row ops: what is left is the matrix products' and
// attention's scratch (their own typed kernels: gemm_ex, the attention) and the f32 gradients'
// reductions. The counts are printed (the launches and bytes a bf16 step saves).
TEST_F(RowsEx, TinyGptStepKeepsItsBitsWithoutTheRowOpsCasts) {
  RowsProbeKernels& k = probe();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    k.rows_ex = false;
    k.reset();
    const Step mixed = gpt_step(dt);
    const std::map<std::string, int> mixed_calls = k.calls;
    const std::int64_t mixed_bytes = k.cast_bytes;
    k.rows_ex = true;
    k.reset();
    const Step typed = gpt_step(dt);
    EXPECT_EQ(typed.loss, mixed.loss);
    EXPECT_EQ(typed.grads, mixed.grads);
    int launches_mixed = 0, launches_typed = 0;
    for (const auto& [name, c] : mixed_calls) launches_mixed += c;
    for (const auto& [name, c] : k.calls) launches_typed += c;
    EXPECT_GT(k.ex_calls(), 0);
    EXPECT_LT(k.calls["cast"], mixed_calls.at("cast"));
    EXPECT_LT(k.cast_bytes, mixed_bytes);
    std::printf("%s tiny GPT step: launches %d -> %d, casts %d -> %d, cast bytes %lld -> %lld\n",
                dtype_name(dt), launches_mixed, launches_typed, mixed_calls.at("cast"),
                k.calls["cast"], static_cast<long long>(mixed_bytes),
                static_cast<long long>(k.cast_bytes));
    for (const auto& [name, c] : k.calls)
      if (c != (mixed_calls.count(name) ? mixed_calls.at(name) : 0))
        std::printf("  %-28s %4d -> %4d\n", name.c_str(),
                    mixed_calls.count(name) ? mixed_calls.at(name) : 0, c);
    for (const auto& [name, c] : mixed_calls)
      if (!k.calls.count(name)) std::printf("  %-28s %4d -> %4d\n", name.c_str(), c, 0);
  }
  k.rows_ex = false;
}

// ---- the typed reductions over rows (has_sum_rows_ex: bias and LayerNorm gradients)

/// ops::sum_rows (both modes, beta 0 and 1) and ops::sum_rows_sharded (accumulate or not) of a
/// bf16 / f16 x [5, 24] into an f32 out and into an x-dtype out on `backend`: the outs' bytes.
std::vector<std::vector<std::uint8_t>> run_row_sums(DType dt, const std::string& backend) {
  const Tensor x = input({5, 24}, dt, 11, backend);
  const std::vector<std::int64_t> bounds = {0, 2, 2, 5};  // an empty shard among them
  std::vector<std::vector<std::uint8_t>> bytes;
  for (DType ot : {DType::f32, dt}) {
    for (Determinism mode : {Determinism::fast, Determinism::bitwise})
      for (float beta : {0.0f, 1.0f}) {
        Tensor out = input({24}, ot, 12, backend);
        ops::sum_rows(x, out, beta, mode);
        bytes.push_back(tensor_bytes(out));
      }
    for (bool acc : {false, true}) {
      Tensor out = input({24}, ot, 13, backend);
      ops::sum_rows_sharded(x, out, bounds, acc);
      bytes.push_back(tensor_bytes(out));
    }
  }
  return bytes;
}

// The dispatch rule: with has_sum_rows_ex false (the simulator's answer) the row sums of bf16 /
// f16 tensors take MixedOp's casts and no typed kernel runs; with it true each is one
// sum_rows_ex / sum_rows_sharded_ex launch and no cast, with the same bytes; an out of the other
// half dtype keeps MixedOp.
TEST_F(RowsEx, OpsCallTheTypedRowSumsOnlyWhereHasSumRowsExSaysSo) {
  RowsProbeKernels& k = probe();
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const auto sim = run_row_sums(dt, "sim");
    k.sums_ex = false;
    k.reset();
    const auto mixed = run_row_sums(dt, kRowsProbe);
    EXPECT_EQ(k.calls["sum_rows_ex"] + k.calls["sum_rows_sharded_ex"], 0);
    EXPECT_EQ(k.calls["sum_rows"], 8);
    EXPECT_EQ(k.calls["sum_rows_sharded"], 4);
    EXPECT_GT(k.calls["cast"], 0);
    k.sums_ex = true;
    k.reset();
    const auto typed = run_row_sums(dt, kRowsProbe);
    EXPECT_EQ(k.calls["sum_rows_ex"], 8);
    EXPECT_EQ(k.calls["sum_rows_sharded_ex"], 4);
    EXPECT_EQ(k.calls["sum_rows"] + k.calls["sum_rows_sharded"], 0);
    EXPECT_EQ(k.calls["cast"], 0);  // no f32 scratch: the tensors were uploaded in dt
    ASSERT_EQ(typed.size(), sim.size());
    for (std::size_t i = 0; i < sim.size(); ++i) {
      EXPECT_EQ(mixed[i], sim[i]) << "result " << i << " (has_sum_rows_ex false)";
      EXPECT_EQ(typed[i], sim[i]) << "result " << i << " (has_sum_rows_ex true)";
    }
    // An out of the other half dtype: MixedOp, as on the simulator.
    k.reset();
    const DType other = dt == DType::bf16 ? DType::f16 : DType::bf16;
    Tensor out = input({24}, other, 14, kRowsProbe);
    ops::sum_rows(input({5, 24}, dt, 11, kRowsProbe), out, 0.0f, Determinism::bitwise);
    EXPECT_EQ(k.calls["sum_rows_ex"], 0);
    EXPECT_EQ(k.calls["sum_rows"], 1);
  }
  k.sums_ex = false;
}

// The typed path's argument checks name the op and the argument (no MixedOp note).
TEST_F(RowsEx, TypedRowSumErrorsNameTheOpAndTheArgument) {
  RowsProbeKernels& k = probe();
  k.sums_ex = true;
  k.reset();
  const Tensor x = input({3, 8}, DType::bf16, 1, kRowsProbe);
  Tensor out7 = input({7}, DType::f32, 2, kRowsProbe);
  expect_invalid([&] { ops::sum_rows(x, out7, 0.0f, Determinism::fast); },
                 "ops::sum_rows: out: expected [cols] = [8] for x of [3, 8], got");
  expect_invalid(
      [&] {
        ops::sum_rows_sharded(x, out7, {0, 3}, false);
      },
      "ops::sum_rows_sharded: out: expected [cols] = [8] for x of [3, 8], got");
  Tensor out8 = input({8}, DType::bf16, 3, kRowsProbe);
  expect_invalid(
      [&] {
        ops::sum_rows_sharded(x, out8, {0, 2}, false);
      },
      "ops::sum_rows_sharded: bounds:");
  Tensor x1 = input({24}, DType::bf16, 4, kRowsProbe);
  expect_invalid([&] { ops::sum_rows(x1, out8, 0.0f, Determinism::fast); },
                 "ops::sum_rows: x: expected a 2-dim tensor [rows, cols], got");
  EXPECT_EQ(k.calls["sum_rows_ex"] + k.calls["sum_rows_sharded_ex"], 0);
  k.sums_ex = false;
}

// A bf16 / f16 GPT step, bitwise (f32 gradients: sum_rows_sharded_ex) and fast (gradients in the
// storage dtype: sum_rows_ex), with the typed row kernels and then the typed row sums too: the
// same loss and gradient bytes, and the bias and LayerNorm gradients cast nothing (casts and
// cast bytes fall; the counts are printed).
TEST_F(RowsEx, TinyGptStepSumsRowsWithoutCasts) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      k.sums_ex = false;
      k.reset();
      const Step rows_only = gpt_step(dt, mode);
      const std::map<std::string, int> before = k.calls;
      const std::int64_t before_bytes = k.cast_bytes;
      k.sums_ex = true;
      k.reset();
      const Step typed = gpt_step(dt, mode);
      EXPECT_EQ(typed.loss, rows_only.loss);
      EXPECT_EQ(typed.grads, rows_only.grads);
      const char* f32_kernel = mode == Determinism::bitwise ? "sum_rows_sharded" : "sum_rows";
      const std::string ex = std::string(f32_kernel) + "_ex";
      EXPECT_GT(before.count(f32_kernel) ? before.at(f32_kernel) : 0, 0);
      EXPECT_EQ(k.calls[ex], before.at(f32_kernel));
      EXPECT_EQ(k.calls[f32_kernel], 0);
      EXPECT_LT(k.calls["cast"], before.at("cast"));
      EXPECT_LT(k.cast_bytes, before_bytes);
      std::printf("%s %s tiny GPT step, row sums typed: %s %d -> %s %d, casts %d -> %d, cast "
                  "bytes %lld -> %lld\n",
                  dtype_name(dt), determinism_name(mode), f32_kernel, before.at(f32_kernel),
                  ex.c_str(), k.calls[ex], before.at("cast"), k.calls["cast"],
                  static_cast<long long>(before_bytes), static_cast<long long>(k.cast_bytes));
    }
  k.sums_ex = false;
  k.rows_ex = false;
}

// ---- the residual gradient's add in the LayerNorm backward (has_layernorm_backward_add)

/// ops::layernorm_backward_add (or, `two_ops`, ops::add(residual, ops::layernorm_backward(..)):
/// the reference) on `dt` tensors [10, 24] of `backend`, the residual with +-inf (and a NaN
/// where `nan`: a GPU's f32 add returns its canonical NaN, not the input's): the bytes of the
/// sum and of dy_xhat.
std::vector<std::vector<std::uint8_t>> run_ln_add(DType dt, const std::string& backend,
                                                  bool two_ops, bool nan = true) {
  const std::int64_t N = 10, C = 24;
  const Device dev(backend, 0);
  const Tensor x = input({N, C}, dt, 21, backend), w = input({C}, dt, 22, backend);
  const Tensor dy = input({N, C}, dt, 23, backend);
  std::vector<float> rv = input({N, C}, DType::f32, 24, "sim").to_vector<float>();
  if (nan) rv[1] = std::nanf("");
  rv[4] = INFINITY;
  rv[7] = -INFINITY;
  const Tensor r = Tensor::from_vector(rv, {N, C}).to(dt).to(dev);
  Tensor mean, rstd, dy_xhat;
  ops::layernorm(x, w, input({C}, dt, 25, backend), 1e-5f, mean, rstd);
  const Tensor out = two_ops ? ops::add(r, ops::layernorm_backward(dy, x, w, mean, rstd, dy_xhat))
                             : ops::layernorm_backward_add(dy, x, w, mean, rstd, r, dy_xhat);
  EXPECT_EQ(out.dtype(), dt);
  return {tensor_bytes(out), tensor_bytes(dy_xhat)};
}

// The dispatch rule: with has_layernorm_backward_add false (the simulator's answer)
// ops::layernorm_backward_add is layernorm_backward(_ex) and then the add (add_any; f32:
// sum_inputs); with it true one layernorm_backward_add launch and no add, with the two ops'
// bytes in f32, bf16 and f16 (the residual's NaN and infinities too). A bf16 / f16 call on a
// backend without its typed row kernels (has_rows_ex false) keeps MixedOp's two ops.
TEST_F(RowsEx, LayerNormBackwardAddFusesOnlyWhereTheBackendSaysSo) {
  RowsProbeKernels& k = probe();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool half = dt != DType::f32;
    const char* add = half ? "add_any" : "sum_inputs";
    const char* ln = half ? "layernorm_backward_ex" : "layernorm_backward";
    const auto ref = run_ln_add(dt, "sim", true);
    EXPECT_EQ(run_ln_add(dt, "sim", false), ref);
    k.rows_ex = true;
    k.ln_add = false;
    k.reset();
    EXPECT_EQ(run_ln_add(dt, kRowsProbe, false), ref);
    EXPECT_EQ(k.count("layernorm_backward_add"), 0);
    EXPECT_EQ(k.count(ln), 1);
    EXPECT_EQ(k.count(add), 1);
    k.ln_add = true;
    k.reset();
    EXPECT_EQ(run_ln_add(dt, kRowsProbe, false), ref);
    EXPECT_EQ(k.count("layernorm_backward_add"), 1);
    EXPECT_EQ(k.count(ln), 0);
    EXPECT_EQ(k.count(add), 0);
    if (half) {  // no typed row kernels: MixedOp's layernorm_backward, then the add
      k.rows_ex = false;
      k.reset();
      EXPECT_EQ(run_ln_add(dt, kRowsProbe, false), ref);
      EXPECT_EQ(k.count("layernorm_backward_add"), 0);
      EXPECT_EQ(k.count("layernorm_backward"), 1);
    }
  }
  k.ln_add = false;
  k.rows_ex = false;
}

// A residual of another shape, dtype or device, or none, is refused naming the call and the
// argument, on the fused path and on the two ops' alike (no kernel runs); so is nn::LayerNorm's
// residual_grad.
TEST_F(RowsEx, LayerNormBackwardAddErrorsNameTheOpAndTheArgument) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  const Tensor x = input({3, 8}, DType::bf16, 1, kRowsProbe),
               w = input({8}, DType::bf16, 2, kRowsProbe);
  const Tensor dy = input({3, 8}, DType::bf16, 3, kRowsProbe);
  Tensor mean, rstd, dxh;
  ops::layernorm(x, w, Tensor(), 1e-5f, mean, rstd);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "two ops");
    k.ln_add = fused;
    k.reset();
    const std::string op = "ops::layernorm_backward_add: ";
    expect_invalid(
        [&] {
          ops::layernorm_backward_add(dy, x, w, mean, rstd,
                                      input({3, 7}, DType::bf16, 4, kRowsProbe), dxh);
        },
        op + "residual: expected [3, 8] (the shape of dy), got");
    expect_invalid(
        [&] {
          ops::layernorm_backward_add(dy, x, w, mean, rstd,
                                      input({3, 8}, DType::f16, 5, kRowsProbe), dxh);
        },
        op + "residual: expected dtype bf16, got");
    expect_invalid(
        [&] {
          ops::layernorm_backward_add(
              dy, x, w, mean, rstd,
              input({3, 8}, DType::bf16, 6, kRowsProbe).to(Device(kRowsProbe, 1)), dxh);
        },
        op + "residual: expected a tensor on " + Device(kRowsProbe, 0).str() +
            " (the device of dy)");
    expect_invalid([&] { ops::layernorm_backward_add(dy, x, w, mean, rstd, Tensor(), dxh); },
                   op + "residual: expected a defined tensor, got an undefined tensor");
    expect_invalid(
        [&] {
          ops::layernorm_backward_add(dy, x, input({7}, DType::bf16, 7, kRowsProbe), mean, rstd,
                                      input({3, 8}, DType::bf16, 8, kRowsProbe), dxh);
        },
        op + "w: expected [C] = [8], got");
    EXPECT_EQ(k.count("layernorm_backward_add") + k.count("layernorm_backward_ex"), 0);
  }
  nn::LayerNorm ln(8, Device(kRowsProbe, 0));
  const Tensor xf = input({2, 3, 8}, DType::f32, 9, kRowsProbe);
  ln.forward(xf);
  expect_invalid(
      [&] {
        ln.backward(xf, input({6, 8}, DType::f32, 10, kRowsProbe));
      },
      ln.str() + ".backward: residual_grad: expected [2, 3, 8] f32 on " +
          Device(kRowsProbe, 0).str() + " (grad_output's shape, dtype and device), got");
  expect_invalid(
      [&] {
        ln.backward(xf, input({2, 3, 8}, DType::bf16, 11, kRowsProbe));
      },
      ln.str() + ".backward: residual_grad: expected [2, 3, 8] f32 on");
  k.ln_add = false;
  k.rows_ex = false;
}

// A tiny GPT step (f32, bf16, f16; bitwise and fast) with each block's two residual-gradient
// adds folded into its LayerNorm backwards: the loss and every gradient keep their bytes; per
// block 2 layernorm_backward_add launches replace 2 LayerNorm backwards and 2 adds (ln_f's
// backward has no residual: it stays).
TEST_F(RowsEx, TinyGptStepFoldsTheResidualAddsIntoTheLayerNormBackward) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  k.sums_ex = true;
  const int n_layer = 2;
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const char* add = dt == DType::f32 ? "sum_inputs" : "add_any";
      const char* ln = dt == DType::f32 ? "layernorm_backward" : "layernorm_backward_ex";
      k.ln_add = false;
      k.reset();
      const Step two_ops = gpt_step(dt, mode);
      const std::map<std::string, int> before = k.calls;
      k.ln_add = true;
      k.reset();
      const Step fused = gpt_step(dt, mode);
      EXPECT_EQ(fused.loss, two_ops.loss);
      EXPECT_EQ(fused.grads, two_ops.grads);
      EXPECT_EQ(k.count("layernorm_backward_add"), 2 * n_layer);
      EXPECT_EQ(before.at(ln), 2 * n_layer + 1);
      EXPECT_EQ(k.count(ln), 1);  // ln_f
      EXPECT_EQ(before.at(add) - k.count(add), 2 * n_layer);
    }
  k.ln_add = false;
  k.sums_ex = false;
  k.rows_ex = false;
}

// ---- the LayerNorm backward with its parameter gradients (has_layernorm_backward_params)

/// Host floats of a tensor of any float dtype.
std::vector<float> host_floats(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }

/// Element-wise |a - b| <= rtol (|b| + scale), scale = the largest |b|: one failure names `what`
/// and the first index.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double scale = 0;
  for (float v : b) scale = std::max(scale, std::fabs(double(v)));
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(double(a[i]) - double(b[i])) <= rtol * (std::fabs(double(b[i])) + scale))) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i] << " (rtol " << rtol
                    << ", scale " << scale << ")";
      return;
    }
}

/// nn::LayerNorm(C) on `backend` in `mode` and `dt`: forward of x [2, N / 2, C], backward with a
/// residual gradient (or none), its gradients first written then accumulated (a second
/// backward): dx of each backward, grad_w and grad_b after each, as host floats.
std::vector<std::vector<float>> run_ln_module(DType dt, const std::string& backend,
                                              Determinism mode, std::int64_t N, std::int64_t C,
                                              bool residual) {
  nn::LayerNorm ln(C, Device(backend, 0));
  ln.to(dt);
  ln.set_determinism(mode);
  const Tensor x = input({2, N / 2, C}, dt, 41, backend);
  const Tensor dy = input({2, N / 2, C}, dt, 42, backend);
  const Tensor r = residual ? input({2, N / 2, C}, dt, 43, backend) : Tensor();
  std::vector<std::vector<float>> out;
  for (int pass = 0; pass < 2; ++pass) {
    ln.forward(x);
    out.push_back(host_floats(ln.backward(dy, r)));
    for (nn::Parameter* p : ln.parameters()) out.push_back(host_floats(p->grad));
  }
  return out;
}

// The dispatch rule: nn::LayerNorm's backward takes layernorm_backward_params (one launch, no
// layernorm_backward(_ex), no row sum, no add) only in fast mode on a backend that has it, with
// or without the residual gradient; in bitwise mode (its row sums follow the micro-shards), or
// where the backend has none (the simulator's answer), today's path and its bits. The fused
// results are within tolerance of today's (dy xhat summed in f32 where today's path rounds it
// into the storage dtype first); the gradient written by the first backward is accumulated by
// the second.
TEST_F(RowsEx, LayerNormBackwardParamsFusesOnlyInFastModeWhereTheBackendSaysSo) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  k.sums_ex = true;
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (bool residual : {false, true})
      for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode) +
                     (residual ? " residual" : ""));
        k.ln_params = false;
        k.reset();
        const auto today = run_ln_module(dt, kRowsProbe, mode, 24, 40, residual);
        EXPECT_EQ(k.count("layernorm_backward_params"), 0);
        EXPECT_EQ(run_ln_module(dt, "sim", mode, 24, 40, residual), today);
        k.ln_params = true;
        k.reset();
        const auto fused = run_ln_module(dt, kRowsProbe, mode, 24, 40, residual);
        const bool taken = mode == Determinism::fast;
        EXPECT_EQ(k.count("layernorm_backward_params"), taken ? 2 : 0);
        const char* ln = dt == DType::f32 ? "layernorm_backward" : "layernorm_backward_ex";
        const int sums = k.count("sum_rows") + k.count("sum_rows_ex") +
                         k.count("sum_rows_sharded") + k.count("sum_rows_sharded_ex");
        if (taken) {
          EXPECT_EQ(k.count(ln) + k.count("layernorm_backward_add"), 0);
          EXPECT_EQ(sums, 0);
          EXPECT_EQ(k.count("add_any") + k.count("sum_inputs"), 0);
          ASSERT_EQ(fused.size(), today.size());
          const double rtol = dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 4e-3;
          for (std::size_t i = 0; i < today.size(); ++i)
            expect_close(fused[i], today[i], rtol, "result " + std::to_string(i));
        } else {
          EXPECT_EQ(fused, today);
          EXPECT_EQ(sums, 4);  // grad_w and grad_b, two backwards
        }
      }
  k.ln_params = false;
  k.sums_ex = false;
  k.rows_ex = false;
}

// ops::layernorm_backward_params refuses bad gradients and residuals naming itself and the
// argument, on the fused path and on today's alike (no kernel runs).
TEST_F(RowsEx, LayerNormBackwardParamsErrorsNameTheOpAndTheArgument) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  const Tensor x = input({3, 8}, DType::bf16, 1, kRowsProbe),
               w = input({8}, DType::bf16, 2, kRowsProbe);
  const Tensor dy = input({3, 8}, DType::bf16, 3, kRowsProbe);
  Tensor mean, rstd;
  ops::layernorm(x, w, Tensor(), 1e-5f, mean, rstd);
  const std::string op = "ops::layernorm_backward_params: ";
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "today's path");
    k.ln_params = fused;
    k.reset();
    Tensor gw = input({8}, DType::bf16, 4, kRowsProbe), gb = input({8}, DType::bf16, 5, kRowsProbe);
    Tensor none;
    auto call = [&](const Tensor& r, Tensor& g_w, Tensor& g_b) {
      ops::layernorm_backward_params(dy, x, w, mean, rstd, r, g_w, true, g_b, false);
    };
    Tensor narrow = input({7}, DType::bf16, 6, kRowsProbe);
    expect_invalid([&] { call(none, narrow, gb); }, op + "grad_w: expected [C] = [8], got");
    Tensor half = input({8}, DType::f16, 7, kRowsProbe);
    expect_invalid([&] { call(none, half, gb); },
                   op + "grad_w: expected dtype f32 or bf16 (dy's), got");
    Tensor f32 = input({8}, DType::f32, 8, kRowsProbe);
    expect_invalid([&] { call(none, gw, f32); },
                   op + "grad_b: expected dtype bf16 (grad_w's), got");
    Tensor elsewhere = input({8}, DType::bf16, 9, kRowsProbe).to(Device(kRowsProbe, 1));
    expect_invalid(
        [&] { call(none, gw, elsewhere); },
        op + "grad_b: expected a tensor on " + Device(kRowsProbe, 0).str() + " (the device of dy)");
    expect_invalid([&] { call(none, none, gb); },
                   op + "grad_w: expected a defined tensor, got an undefined tensor");
    expect_invalid(
        [&] {
          call(input({3, 7}, DType::bf16, 10, kRowsProbe), gw, gb);
        },
        op + "residual: expected [3, 8] (the shape of dy), got");
    Tensor alias = gw;
    expect_invalid([&] { call(none, gw, alias); },
                   op + "grad_b: must not share memory with grad_w");
    expect_invalid(
        [&] {
          ops::layernorm_backward_params(dy, x, input({7}, DType::bf16, 11, kRowsProbe), mean, rstd,
                                         none, gw, false, gb, false);
        },
        op + "w: expected [C] = [8], got");
    EXPECT_EQ(k.count("layernorm_backward_params") + k.count("layernorm_backward_ex"), 0);
  }
  k.ln_params = false;
  k.rows_ex = false;
}

// A tiny GPT fast step (f32, bf16, f16) with every LayerNorm backward taking
// layernorm_backward_params (2 per block and ln_f's): the loss of today's path, each gradient
// within tolerance of it, and 2 n_layer + 1 launches replace as many LayerNorm backwards (or
// residual-add backwards) and as many row sums (the config has no bias: the weights' alone).
TEST_F(RowsEx, TinyGptFastStepTakesTheFusedLayerNormParameterGradients) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  k.sums_ex = true;
  k.ln_add = true;
  const int n_layer = 2;
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    k.ln_params = false;
    k.reset();
    const Step today = gpt_step(dt, Determinism::fast);
    const std::map<std::string, int> before = k.calls;
    k.ln_params = true;
    k.reset();
    const Step fused = gpt_step(dt, Determinism::fast);
    EXPECT_EQ(fused.loss, today.loss);
    EXPECT_EQ(k.count("layernorm_backward_params"), 2 * n_layer + 1);
    EXPECT_EQ(k.count("layernorm_backward_add"), 0);
    EXPECT_EQ(before.at("layernorm_backward_add"), 2 * n_layer);
    const char* ln = dt == DType::f32 ? "layernorm_backward" : "layernorm_backward_ex";
    EXPECT_EQ(k.count(ln), 0);
    const char* sums = dt == DType::f32 ? "sum_rows" : "sum_rows_ex";
    EXPECT_EQ(before.at(sums) - k.count(sums), 2 * n_layer + 1);  // no bias: the weights
    ASSERT_EQ(fused.grads.size(), today.grads.size());
    const double rtol = dt == DType::f32 ? 1e-4 : dt == DType::bf16 ? 3e-2 : 5e-3;
    for (std::size_t i = 0; i < today.grads.size(); ++i) {
      auto floats = [&](const std::vector<std::uint8_t>& b) {
        std::vector<float> f(b.size() / dtype_size(dt));
        for (std::size_t j = 0; j < f.size(); ++j) {
          if (dt == DType::f32) {
            std::memcpy(&f[j], b.data() + 4 * j, 4);
            continue;
          }
          std::uint16_t u;
          std::memcpy(&u, b.data() + 2 * j, 2);
          f[j] = dt == DType::bf16 ? bfloat16{u}.to_float() : float16{u}.to_float();
        }
        return f;
      };
      expect_close(floats(fused.grads[i]), floats(today.grads[i]), rtol,
                   "grad " + std::to_string(i));
    }
  }
  k.ln_params = false;
  k.ln_add = false;
  k.sums_ex = false;
  k.rows_ex = false;
}

// ---- the residual add in the LayerNorm forward (has_layernorm_forward_add)

/// ops::layernorm_add (or, `two_ops`, ops::add(x, branch) and then ops::layernorm: the
/// reference) on `dt` tensors [10, 24] of `backend`, with and without bias, the branch with +-inf
/// and signed zeros (and a NaN where `nan`: a GPU's f32 add returns its canonical NaN, not the
/// input's), x and branch near the dtype's largest value in row 2: the bytes of the residual, y,
/// mean and rstd of each.
std::vector<std::vector<std::uint8_t>> run_ln_fwd_add(DType dt, const std::string& backend,
                                                      bool two_ops, bool nan = true) {
  const std::int64_t N = 10, C = 24;
  const Device dev(backend, 0);
  const float big = dt == DType::f16 ? 65504.0f : dt == DType::bf16 ? 3.3895314e38f : 3.4028235e38f;
  std::vector<float> xv = input({N, C}, DType::f32, 31, "sim").to_vector<float>();
  std::vector<float> bv = input({N, C}, DType::f32, 32, "sim").to_vector<float>();
  if (nan) bv[1] = std::nanf("");
  bv[4] = INFINITY;
  bv[7] = -INFINITY;
  xv[C + 1] = bv[C + 1] = -0.0f;  // -0 + -0 = -0 (row 1 stays finite)
  xv[C + 2] = 0.0f;
  bv[C + 2] = -0.0f;
  xv[2 * C] = big;  // row 2: max + max overflows; max - 1 rounds back to max
  bv[2 * C] = big;
  xv[2 * C + 1] = big;
  bv[2 * C + 1] = -1.0f;
  const Tensor x = Tensor::from_vector(xv, {N, C}).to(dt).to(dev);
  const Tensor br = Tensor::from_vector(bv, {N, C}).to(dt).to(dev);
  const Tensor w = input({C}, dt, 33, backend), b = input({C}, dt, 34, backend);
  std::vector<std::vector<std::uint8_t>> bytes;
  for (bool bias : {true, false}) {
    Tensor residual, mean, rstd;
    const Tensor bb = bias ? b : Tensor();
    Tensor y;
    if (two_ops) {
      residual = ops::add(x, br);
      y = ops::layernorm(residual, w, bb, 1e-5f, mean, rstd);
    } else {
      y = ops::layernorm_add(x, br, w, bb, 1e-5f, residual, mean, rstd);
    }
    EXPECT_EQ(residual.dtype(), dt);
    EXPECT_EQ(y.dtype(), dt);
    for (const Tensor* t : {&residual, &y, &mean, &rstd}) bytes.push_back(tensor_bytes(*t));
  }
  return bytes;
}

// The dispatch rule: with has_layernorm_forward_add false (the simulator's answer)
// ops::layernorm_add is the add (add_any; f32: sum_inputs) and then layernorm_forward(_ex); with
// it true one layernorm_forward_add launch and neither, with the two ops' bytes in f32, bf16 and
// f16 (residual, y, mean, rstd; the branch's NaN, infinities, signed zeros and overflow too). A
// bf16 / f16 call on a backend without its typed row kernels (has_rows_ex false) keeps MixedOp's
// two ops.
TEST_F(RowsEx, LayerNormAddFusesOnlyWhereTheBackendSaysSo) {
  RowsProbeKernels& k = probe();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const bool half = dt != DType::f32;
    const char* add = half ? "add_any" : "sum_inputs";
    const char* ln = half ? "layernorm_forward_ex" : "layernorm_forward";
    const auto ref = run_ln_fwd_add(dt, "sim", true);
    ASSERT_EQ(ref.size(), 8u);
    EXPECT_EQ(run_ln_fwd_add(dt, "sim", false), ref);
    k.rows_ex = true;
    k.ln_fwd_add = false;
    k.reset();
    EXPECT_EQ(run_ln_fwd_add(dt, kRowsProbe, false), ref);
    EXPECT_EQ(k.count("layernorm_forward_add"), 0);
    EXPECT_EQ(k.count(ln), 2);
    EXPECT_EQ(k.count(add), 2);
    k.ln_fwd_add = true;
    k.reset();
    EXPECT_EQ(run_ln_fwd_add(dt, kRowsProbe, false), ref);
    EXPECT_EQ(k.count("layernorm_forward_add"), 2);
    EXPECT_EQ(k.count(ln), 0);
    EXPECT_EQ(k.count(add), 0);
    if (half) {  // no typed row kernels: MixedOp's add, then its layernorm_forward
      k.rows_ex = false;
      k.reset();
      EXPECT_EQ(run_ln_fwd_add(dt, kRowsProbe, false), ref);
      EXPECT_EQ(k.count("layernorm_forward_add"), 0);
      EXPECT_EQ(k.count("layernorm_forward"), 2);
    }
  }
  k.ln_fwd_add = false;
  k.rows_ex = false;
}

// A branch of another shape, dtype or device, or none, a bad w, b or eps, are refused naming
// the call and the argument, on the fused path and on the two ops' alike (no kernel runs); so
// are nn::LayerNorm::forward_add's and nn::Block::forward_residual's branch.
TEST_F(RowsEx, LayerNormAddErrorsNameTheOpAndTheArgument) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  const Tensor x = input({3, 8}, DType::bf16, 1, kRowsProbe),
               w = input({8}, DType::bf16, 2, kRowsProbe);
  const Tensor br = input({3, 8}, DType::bf16, 3, kRowsProbe);
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "two ops");
    k.ln_fwd_add = fused;
    k.reset();
    const std::string op = "ops::layernorm_add: ";
    Tensor r, mean, rstd;
    auto call = [&](const Tensor& branch, const Tensor& ww, const Tensor& bb, float eps) {
      ops::layernorm_add(x, branch, ww, bb, eps, r, mean, rstd);
    };
    expect_invalid(
        [&] {
          call(input({3, 7}, DType::bf16, 4, kRowsProbe), w, Tensor(), 1e-5f);
        },
        op + "branch: expected [3, 8] (the shape of x), got");
    expect_invalid(
        [&] {
          call(input({3, 8}, DType::f16, 5, kRowsProbe), w, Tensor(), 1e-5f);
        },
        op + "branch: expected dtype bf16, got");
    expect_invalid(
        [&] {
          call(input({3, 8}, DType::bf16, 6, kRowsProbe).to(Device(kRowsProbe, 1)), w, Tensor(),
               1e-5f);
        },
        op + "branch: expected a tensor on " + Device(kRowsProbe, 0).str() + " (the device of x)");
    expect_invalid([&] { call(Tensor(), w, Tensor(), 1e-5f); },
                   op + "branch: expected a defined tensor, got an undefined tensor");
    expect_invalid([&] { call(br, input({7}, DType::bf16, 7, kRowsProbe), Tensor(), 1e-5f); },
                   op + "w: expected [C] = [8], got");
    expect_invalid([&] { call(br, w, input({9}, DType::bf16, 8, kRowsProbe), 1e-5f); },
                   op + "b: expected [C] = [8], got");
    expect_invalid([&] { call(br, w, Tensor(), -1.0f); },
                   op + "eps: expected a finite eps >= 0, got -1");
    EXPECT_EQ(
        k.count("layernorm_forward_add") + k.count("layernorm_forward_ex") + k.count("add_any"), 0);
  }
  nn::LayerNorm ln(8, Device(kRowsProbe, 0));
  const Tensor xf = input({2, 3, 8}, DType::f32, 9, kRowsProbe);
  expect_invalid(
      [&] {
        ln.forward_add(xf, input({6, 8}, DType::f32, 10, kRowsProbe));
      },
      ln.str() + ".forward_add: branch: expected [2, 3, 8] f32 on " + Device(kRowsProbe, 0).str() +
          " (the input's shape, dtype and device), got");
  expect_invalid(
      [&] {
        ln.forward_add(xf, input({2, 3, 8}, DType::bf16, 11, kRowsProbe));
      },
      ln.str() + ".forward_add: branch: expected [2, 3, 8] f32 on");
  const nn::GPTConfig cfg{.block_size = 3, .vocab_size = 5, .n_layer = 1, .n_head = 2, .n_embd = 8};
  nn::Block block(cfg, 0, Device(kRowsProbe, 0), 7);
  expect_invalid(
      [&] {
        block.forward_residual({xf, input({2, 3, 7}, DType::f32, 12, kRowsProbe)});
      },
      "Block.forward: branch: expected [2, 3, 8] f32 on " + Device(kRowsProbe, 0).str() +
          " (the input's shape, dtype and device), got");
  expect_invalid(
      [&] {
        block.forward_residual({input({2, 3, 7}, DType::f32, 13, kRowsProbe), xf});
      },
      "Block.forward: input: expected [B, T, 8]");
  k.ln_fwd_add = false;
  k.rows_ex = false;
}

// A tiny GPT step (f32, bf16, f16; bitwise and fast) with every residual add of the forward
// folded into the LayerNorm after it: the loss and every gradient keep their bytes; the
// forward's 2 adds per block become 2 layernorm_forward_add launches per block (ln_2, and the
// next block's ln_1 or ln_f), which replace as many LayerNorm forwards (block 0's ln_1, after
// the embedding, stays). An nn::Block run on its own keeps its output's bytes too (its MLP add
// left to ops::add: one fused launch, one add).
TEST_F(RowsEx, TinyGptStepFoldsTheResidualAddsIntoTheLayerNormForward) {
  RowsProbeKernels& k = probe();
  k.rows_ex = true;
  k.sums_ex = true;
  const int n_layer = 2;
  for (Determinism mode : {Determinism::bitwise, Determinism::fast})
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + determinism_name(mode));
      const char* add = dt == DType::f32 ? "sum_inputs" : "add_any";
      const char* ln = dt == DType::f32 ? "layernorm_forward" : "layernorm_forward_ex";
      k.ln_fwd_add = false;
      k.reset();
      const Step two_ops = gpt_step(dt, mode);
      const std::map<std::string, int> before = k.calls;
      k.ln_fwd_add = true;
      k.reset();
      const Step fused = gpt_step(dt, mode);
      EXPECT_EQ(fused.loss, two_ops.loss);
      EXPECT_EQ(fused.grads, two_ops.grads);
      EXPECT_EQ(k.count("layernorm_forward_add"), 2 * n_layer);
      EXPECT_EQ(before.at(ln), 2 * n_layer + 1);
      EXPECT_EQ(k.count(ln), 1);  // block 0's ln_1
      EXPECT_EQ(before.at(add) - k.count(add), 2 * n_layer);
    }
  // nn::Block alone: the same output bytes, one fused launch (ln_2) and the MLP's add.
  const nn::GPTConfig cfg{
      .block_size = 4, .vocab_size = 5, .n_layer = 1, .n_head = 2, .n_embd = 16};
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    nn::Block block(cfg, 0, Device(kRowsProbe, 0), 11);
    block.to(dt);
    const Tensor x = input({2, 4, 16}, dt, 40, kRowsProbe);
    k.ln_fwd_add = false;
    const auto ref = tensor_bytes(block.forward(x));
    k.ln_fwd_add = true;
    k.reset();
    EXPECT_EQ(tensor_bytes(block.forward(x)), ref);
    EXPECT_EQ(k.count("layernorm_forward_add"), 1);
  }
  k.ln_fwd_add = false;
  k.sums_ex = false;
  k.rows_ex = false;
}

// ---- CUDA (skips without a GPU): the typed kernels give the simulator's bits

using CudaRowsEx = CudaSuite<>;  // kCudaTestDevices

TEST_F(CudaRowsEx, TypedRowOpsEqualTheSimulator) {
  ASSERT_TRUE(get_backend("cuda").kernels().has_rows_ex(DType::bf16, Determinism::bitwise));
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto sim = run_row_ops(dt, "sim"), cuda = run_row_ops(dt, "cuda");
    ASSERT_EQ(cuda.size(), sim.size());
    for (std::size_t i = 0; i < sim.size(); ++i)
      EXPECT_EQ(cuda[i], sim[i]) << dtype_name(dt) << " result " << i;
  }
}

// layernorm_backward_add (f32, bf16, f16): the bits of the simulator's two ops.
TEST_F(CudaRowsEx, LayerNormBackwardAddEqualsTheSimulatorsTwoOps) {
  ASSERT_TRUE(get_backend("cuda").kernels().has_layernorm_backward_add(DType::bf16));
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const auto sim = run_ln_add(dt, "sim", true, false),
               cuda = run_ln_add(dt, "cuda", false, false);
    ASSERT_EQ(cuda.size(), sim.size());
    for (std::size_t i = 0; i < sim.size(); ++i)
      EXPECT_EQ(cuda[i], sim[i]) << dtype_name(dt) << " result " << i;
  }
}

// layernorm_backward_params (fast mode, f32 / bf16 / f16; Note [CUDA LayerNorm parameter
// gradients]) through nn::LayerNorm: GPT-2 B 8's [8192, 768] (512 chunks in 32 groups) and a
// ragged [38, 129], with and without the residual gradient, the gradients written then
// accumulated: within tolerance of the simulator's path (the backward, the add, the two row
// sums), and the same bytes when run again (the tickets only elect who adds).
TEST_F(CudaRowsEx, LayerNormBackwardParamsWithinToleranceOfTheSimulatorAndRepeats) {
  ASSERT_TRUE(
      get_backend("cuda").kernels().has_layernorm_backward_params(DType::bf16, Determinism::fast));
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape& shape : {Shape{8192, 768}, Shape{38, 129}})
      for (bool residual : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(shape[0]) +
                     (residual ? " residual" : ""));
        const auto sim = run_ln_module(dt, "sim", Determinism::fast, shape[0], shape[1], residual);
        const auto cuda =
            run_ln_module(dt, "cuda", Determinism::fast, shape[0], shape[1], residual);
        EXPECT_EQ(run_ln_module(dt, "cuda", Determinism::fast, shape[0], shape[1], residual), cuda);
        ASSERT_EQ(cuda.size(), sim.size());
        const double rtol = dt == DType::f32 ? 1e-4 : dt == DType::bf16 ? 2e-2 : 4e-3;
        for (std::size_t i = 0; i < sim.size(); ++i)
          expect_close(cuda[i], sim[i], rtol, "result " + std::to_string(i));
      }
}

// layernorm_forward_add (f32, bf16, f16; with and without bias): the bits of the simulator's
// two ops (ops::add, then ops::layernorm).
TEST_F(CudaRowsEx, LayerNormForwardAddEqualsTheSimulatorsTwoOps) {
  ASSERT_TRUE(get_backend("cuda").kernels().has_layernorm_forward_add(DType::bf16));
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const auto sim = run_ln_fwd_add(dt, "sim", true, false),
               cuda = run_ln_fwd_add(dt, "cuda", false, false);
    ASSERT_EQ(cuda.size(), sim.size());
    for (std::size_t i = 0; i < sim.size(); ++i)
      EXPECT_EQ(cuda[i], sim[i]) << dtype_name(dt) << " result " << i;
  }
}

/// The f32 bitwise reductions CUDA runs in parallel (Note [CUDA row sums]): sum_rows over 3000
/// rows and over 600,000 columns (past the grid's 16384 blocks of 32), sum_rows_sharded over 8
/// and 100 shards (the host tree), sum over 7000 elements (staged tiles), sum_squares over 600
/// blocks (block_tree_over), sum_sharded over GPT-2 B 8's loss shards (8 of 64 with 1024
/// tokens), 64 shards of 256 and 100 shards (Note [CUDA sharded sum]): each result's bytes.
std::vector<std::vector<std::uint8_t>> run_f32_reductions(const std::string& backend) {
  std::vector<std::vector<std::uint8_t>> bytes;
  const Tensor x = input({3000, 40}, DType::f32, 21, backend);
  Tensor out = input({40}, DType::f32, 22, backend);
  ops::sum_rows(x, out, 0.5f, Determinism::bitwise);
  bytes.push_back(tensor_bytes(out));
  const Tensor wide = input({2, 600000}, DType::f32, 23, backend);
  Tensor wide_out = input({600000}, DType::f32, 24, backend);
  ops::sum_rows(wide, wide_out, 0.0f, Determinism::bitwise);
  bytes.push_back(tensor_bytes(wide_out));
  for (std::int64_t S : {8, 100}) {
    std::vector<std::int64_t> bounds;
    for (std::int64_t i = 0; i <= S; ++i) bounds.push_back(i * 3000 / S);
    ops::sum_rows_sharded(x, out, bounds, /*accumulate=*/true);
    bytes.push_back(tensor_bytes(out));
  }
  bytes.push_back(
      tensor_bytes(ops::sum(input({7000}, DType::f32, 25, backend), 0.37f, Determinism::bitwise)));
  bytes.push_back(tensor_bytes(
      ops::sum_squares(input({600 * 4096 - 5}, DType::f32, 26, backend), Determinism::bitwise)));
  std::vector<std::int64_t> gpt2 = micro_shard_bounds(8, 64);
  for (std::int64_t& b : gpt2) b *= 1024;
  const std::vector<std::int64_t> shards[] = {gpt2, micro_shard_bounds(16384, 64),
                                              micro_shard_bounds(20000, 100)};
  for (std::size_t i = 0; i < std::size(shards); ++i)
    bytes.push_back(tensor_bytes(ops::sum_sharded(
        input({shards[i].back()}, DType::f32, 27 + i, backend), shards[i], 1.0f / 8192)));
  return bytes;
}

/// Fast sum_rows on CUDA (Note [CUDA row sums]): GPT-2 B 8's [8192, 768] bias gradient in f32
/// and bf16 (43 row chunks, their partials added in chunk order by the last block of each 32
/// columns, in the same launch) and [513, 33] (a last chunk of one row), beta 0 and 1, into an
/// out of x's dtype: within the emulator's tolerance (tools/cuda_emu/test_emu_reduce.cpp) of a
/// double reference, and the same bytes when run again on the stream (the atomic ticket only
/// elects the finishing block, and the second call finds the ticket counters reset to zero).
TEST_F(CudaRowsEx, FastRowSumsOverRowChunksAreWithinToleranceAndRepeat) {
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& shape : {Shape{8192, 768}, Shape{513, 33}})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + std::to_string(shape[0]) + " beta " +
                     std::to_string(beta));
        const std::int64_t rows = shape[0], cols = shape[1];
        const Tensor x = input(shape, dt, 31, "cuda");
        const Tensor out0 = input({cols}, dt, 32, "cuda");
        Tensor a = out0.clone(), b = out0.clone();
        ops::sum_rows(x, a, beta, Determinism::fast);
        ops::sum_rows(x, b, beta, Determinism::fast);
        EXPECT_EQ(tensor_bytes(a), tensor_bytes(b));
        const std::vector<float> xv = x.to(Device::cpu()).to(DType::f32).to_vector<float>();
        const std::vector<float> ov = out0.to(Device::cpu()).to(DType::f32).to_vector<float>();
        const std::vector<float> got = a.to(Device::cpu()).to(DType::f32).to_vector<float>();
        const double u = dt == DType::bf16 ? 0x1p-8 : 0x1p-24;
        int bad = 0;
        for (std::int64_t c = 0; c < cols; ++c) {
          double ref = double(beta) * ov[c], mag = std::fabs(ref);
          for (std::int64_t r = 0; r < rows; ++r) {
            ref += xv[r * cols + c];
            mag += std::fabs(xv[r * cols + c]);
          }
          const double tol = 2.0 * u * std::fabs(ref) + double(rows + 2) * 0x1p-24 * mag;
          if (!(std::fabs(got[c] - ref) <= tol) && bad++ < 3)
            ADD_FAILURE() << "column " << c << ": " << got[c] << " vs " << ref << " (tol " << tol
                          << ")";
        }
        EXPECT_EQ(bad, 0);
      }
}

TEST_F(CudaRowsEx, BitwiseReductionsEqualTheSimulator) {
  const auto sim = run_f32_reductions("sim"), cuda = run_f32_reductions("cuda");
  ASSERT_EQ(cuda.size(), sim.size());
  for (std::size_t i = 0; i < sim.size(); ++i) EXPECT_EQ(cuda[i], sim[i]) << "result " << i;
}

TEST_F(CudaRowsEx, TypedRowSumsEqualTheSimulator) {
  ASSERT_TRUE(
      get_backend("cuda").kernels().has_sum_rows_ex(DType::bf16, DType::f32, Determinism::bitwise));
  for (DType dt : {DType::bf16, DType::f16}) {
    const auto sim = run_row_sums(dt, "sim"), cuda = run_row_sums(dt, "cuda");
    ASSERT_EQ(cuda.size(), sim.size());
    // Fast-mode results (the first two of each out dtype's six) may differ in order: skipped.
    for (std::size_t i = 0; i < sim.size(); ++i) {
      if (i % 6 >= 2) {
        EXPECT_EQ(cuda[i], sim[i]) << dtype_name(dt) << " result " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ditto
