// The typed multi-tensor kernels (Kernels::adam_step_multi_ex, sum_squares_multi_ex:
// backend_cuda/cuda_multi_tensor.cu through emu.h; Note [Typed optimizer step] in
// core/optim/master_weights.h) against the path they replace, all on the simulator's kernels:
// each gradient cast to f32 (Kernels::cast), the clip's scale_multi of those copies, the f32
// adam_step_multi (per-tensor adam_step and scale), each updated master cast into the model's
// weight. Bit for bit: gradients bf16, f16 and f32; model weights bf16, f16 and none; ragged
// tensor sizes (0, 1, across the 8192-element chunk), more tensors than one launch's table (300 >
// 256), AdamW's decay on alternate tensors, per-tensor bias corrections, amsgrad, the gradient
// scale on and off, NaN and +-inf gradients and a NaN scale (a clip of a non-finite norm). The
// sums of squares: bitwise equal to sum_squares_multi on the f32 casts; fast within 1e-5
// relative of a double-precision reference.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/numerics/float_formats.h"
#include "emu_check.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

// v as stored in t (f32, bf16, f16; bf16 / f16 rounded to nearest even).
Bytes stored(DType t, const V& v) {
  Bytes b(v.size() * dtype_size(t) + 1);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    } else {
      const std::uint16_t u =
          t == DType::bf16 ? bfloat16::from(v[i]).bits : float16::from(v[i]).bits;
      std::memcpy(b.data() + 2 * i, &u, 2);
    }
  }
  return b;
}

std::vector<i64> ragged(unsigned seed, int count) {
  std::mt19937 gen(seed);
  std::vector<i64> s;
  for (int i = 0; i < count; ++i) s.push_back(std::uniform_int_distribution<i64>(0, 40)(gen));
  return s;
}

// mixed() with NaN, +inf and -inf in a few places when `specials`.
V grads(std::size_t n, unsigned seed, bool specials) {
  V v = mixed(n, seed);
  if (specials && n > 40) {
    v[3] = std::nanf("");
    v[17] = INFINITY;
    v[n - 2] = -INFINITY;
  }
  return v;
}

struct Case {
  DType grad, model;  // model f32: no model weight written
  bool scale, amsgrad, specials;
  float grad_scale;
};

void check_adam_ex(const std::vector<i64>& sizes, const Case& c, unsigned& seed) {
  const Packed pk(sizes);
  const std::size_t N = static_cast<std::size_t>(std::max<i64>(pk.total, 1));
  const bool has_model = c.model != DType::f32;
  char ctx[160];
  std::snprintf(ctx, sizeof ctx, "tensors %zu grad %s model %s scale %d (%g) amsgrad %d nan %d",
                sizes.size(), dtype_name(c.grad), has_model ? dtype_name(c.model) : "none",
                int(c.scale), double(c.grad_scale), int(c.amsgrad), int(c.specials));
  const V p0 = mixed(N, seed++), m0 = mixed(N, seed++);
  V v0 = mixed(N, seed++), vmax0 = mixed(N, seed++);
  for (float& x : v0) x = std::fabs(x);
  for (float& x : vmax0) x = std::fabs(x);
  const Bytes g = stored(c.grad, grads(N, seed++, c.specials));
  const Bytes model0 = stored(has_model ? c.model : DType::bf16, mixed(N, seed++));
  const double lr = 6e-4, wd = c.amsgrad ? 0.01 : 0.0;
  auto tensor = [&](std::size_t i, float* p, float* m, float* v, float* vmax) {
    Kernels::AdamTensor t;
    t.param = p + pk.at[i];
    t.exp_avg = m + pk.at[i];
    t.exp_avg_sq = v + pk.at[i];
    t.max_exp_avg_sq = c.amsgrad ? vmax + pk.at[i] : nullptr;
    t.n = sizes[i];
    const int step = 1 + static_cast<int>(i % 3);  // per-tensor step counts
    t.bias_correction1 = 1.0 - std::pow(0.9, step);
    t.bias_correction2 = 1.0 - std::pow(0.95, step);
    t.decay = i % 2 == 0;
    t.decay_scale = static_cast<float>(1.0 - lr * 0.1);
    return t;
  };
  const std::size_t gsz = dtype_size(c.grad), msz = dtype_size(c.model);
  // The simulator: cast, scale_multi, adam_step_multi, cast.
  V p1 = p0, m1 = m0, v1 = v0, vmax1 = vmax0;
  Bytes model1 = model0;
  {
    V gf(N);
    simk->cast(*sims, g.data(), c.grad, gf.data(), DType::f32, pk.total);
    if (c.scale) {
      std::vector<float*> xs;
      for (i64 a : pk.at) xs.push_back(gf.data() + a);
      simk->scale_multi(*sims, xs, pk.n, c.grad_scale);
    }
    std::vector<Kernels::AdamTensor> ts;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Kernels::AdamTensor t = tensor(i, p1.data(), m1.data(), v1.data(), vmax1.data());
      t.grad = gf.data() + pk.at[i];
      ts.push_back(t);
    }
    simk->adam_step_multi(*sims, ts, lr, 0.9, 0.95, 1e-8, wd, c.amsgrad);
    if (has_model)
      for (std::size_t i = 0; i < sizes.size(); ++i)
        simk->cast(*sims, p1.data() + pk.at[i], DType::f32, model1.data() + msz * pk.at[i], c.model,
                   sizes[i]);
    sims->synchronize();
  }
  // The emulated CUDA kernel: one adam_step_multi_ex.
  V p2 = p0, m2 = m0, v2 = v0, vmax2 = vmax0;
  Bytes model2 = model0;
  try {
    std::vector<Kernels::AdamTensorEx> ts;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      Kernels::AdamTensorEx e(tensor(i, p2.data(), m2.data(), v2.data(), vmax2.data()));
      e.grad = g.data() + gsz * pk.at[i];
      e.grad_type = c.grad;
      if (has_model) {
        e.model = model2.data() + msz * pk.at[i];
        e.model_type = c.model;
      }
      ts.push_back(e);
    }
    cudak->adam_step_multi_ex(cudas, ts, lr, 0.9, 0.95, 1e-8, wd, c.amsgrad, c.scale, c.grad_scale);
  } catch (const std::exception& e) {
    ++checks;
    ++failures;
    std::printf("FAIL adam_step_multi_ex %s: %s\n", ctx, e.what());
    return;
  }
  check("adam_step_multi_ex param", p1, p2, ctx);
  check("adam_step_multi_ex exp_avg", m1, m2, ctx);
  check("adam_step_multi_ex exp_avg_sq", v1, v2, ctx);
  if (c.amsgrad) check("adam_step_multi_ex max_exp_avg_sq", vmax1, vmax2, ctx);
  check("adam_step_multi_ex model", model1, model2, ctx);
}

void check_squares_ex(const std::vector<i64>& sizes, unsigned& seed) {
  const Packed pk(sizes);
  const std::size_t N = static_cast<std::size_t>(std::max<i64>(pk.total, 1));
  for (DType t : {DType::bf16, DType::f16}) {
    for (bool specials : {false, true}) {
      const Bytes x = stored(t, grads(N, seed++, specials));
      const std::size_t sz = dtype_size(t);
      char ctx[96];
      std::snprintf(ctx, sizeof ctx, "tensors %zu %s nan %d", sizes.size(), dtype_name(t),
                    int(specials));
      V xf(N);
      simk->cast(*sims, x.data(), t, xf.data(), DType::f32, pk.total);
      std::vector<const float*> fs;
      std::vector<const void*> xs;
      std::vector<DType> types;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        fs.push_back(xf.data() + pk.at[i]);
        xs.push_back(x.data() + sz * pk.at[i]);
        types.push_back(t);
      }
      V want(sizes.size(), 7.0f), got(sizes.size(), 7.0f);
      simk->sum_squares_multi(*sims, fs, pk.n, want.data(), Determinism::bitwise);
      sims->synchronize();
      try {
        cudak->sum_squares_multi_ex(cudas, xs, types, pk.n, got.data(), Determinism::bitwise);
      } catch (const std::exception& e) {
        ++checks;
        ++failures;
        std::printf("FAIL sum_squares_multi_ex %s: %s\n", ctx, e.what());
        continue;
      }
      check("sum_squares_multi_ex bitwise", want, got, ctx);
      if (specials) continue;
      // Fast: within 1e-5 relative of the double sum of the widened elements.
      V fast(sizes.size(), 7.0f);
      cudak->sum_squares_multi_ex(cudas, xs, types, pk.n, fast.data(), Determinism::fast);
      ++checks;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        double ref = 0.0;
        for (i64 j = 0; j < sizes[i]; ++j) ref += double(fs[i][j]) * double(fs[i][j]);
        if (!(std::fabs(fast[i] - ref) <= 1e-5 * ref + 1e-30)) {
          ++failures;
          std::printf("FAIL sum_squares_multi_ex fast %s tensor %zu: %.9g vs %.9g\n", ctx, i,
                      double(fast[i]), ref);
          break;
        }
      }
    }
  }
  // Mixed dtypes in one call (f32 tensors among bf16 ones): tensor i in dtype i % 3.
  const DType kinds[3] = {DType::f32, DType::bf16, DType::f16};
  std::vector<Bytes> held;
  std::vector<const void*> xs;
  std::vector<DType> types;
  std::vector<V> fs_held;
  std::vector<const float*> fs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const DType t = kinds[i % 3];
    held.push_back(stored(t, mixed(static_cast<std::size_t>(sizes[i]) + 1, seed++)));
    V f(static_cast<std::size_t>(sizes[i]) + 1);
    simk->cast(*sims, held.back().data(), t, f.data(), DType::f32, sizes[i]);
    fs_held.push_back(std::move(f));
    types.push_back(t);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    xs.push_back(held[i].data());
    fs.push_back(fs_held[i].data());
  }
  V want(sizes.size(), 7.0f), got(sizes.size(), 7.0f);
  simk->sum_squares_multi(*sims, fs, sizes, want.data(), Determinism::bitwise);
  sims->synchronize();
  cudak->sum_squares_multi_ex(cudas, xs, types, sizes, got.data(), Determinism::bitwise);
  check("sum_squares_multi_ex bitwise mixed dtypes", want, got,
        "tensors " + std::to_string(sizes.size()));
}

}  // namespace

constexpr std::size_t kManyTensors = 256;  // one launch's table (kMultiCap)

void check_typed_multi_tensor(unsigned& seed) {
  const std::vector<std::vector<i64>> lists = {
      {5}, {0, 1, 8193, 3, 0, 20000, 4096}, ragged(seed++, 300)};  // 300 > one table
  for (const auto& sizes : lists) {
    const bool big = sizes.size() > 1;
    // 300 tensors are 300 chunks, 256 emulated threads each: three cases keep the run short.
    const bool many = sizes.size() > kManyTensors;
    int ci = 0;
    for (const Case& c : std::vector<Case>{
             {DType::bf16, DType::bf16, true, false, false, 0.37f},
             {DType::bf16, DType::bf16, false, true, big, 1.0f},
             {DType::f16, DType::f16, true, false, big, 0.37f},
             {DType::f32, DType::bf16, true, false, false, 0.37f},  // bitwise mode: f32 grads
             {DType::f32, DType::f16, false, false, false, 1.0f},
             {DType::bf16, DType::f32, true, false, false, 0.5f},          // no model weight
             {DType::bf16, DType::bf16, true, false, big, std::nanf("")},  // non-finite norm
             {DType::f16, DType::bf16, true, false, false, 0.0f}})
      if (!many || ci++ % 3 == 0) check_adam_ex(sizes, c, seed);
    check_squares_ex(sizes, seed);
  }
  // The capability: f32, bf16 and f16, nothing else.
  ++checks;
  if (!cudak->has_multi_tensor_ex(DType::bf16) || !cudak->has_multi_tensor_ex(DType::f16) ||
      !cudak->has_multi_tensor_ex(DType::f32) || cudak->has_multi_tensor_ex(DType::i64) ||
      simk->has_multi_tensor_ex(DType::bf16)) {
    ++failures;
    std::printf("FAIL has_multi_tensor_ex: expected cuda f32 / bf16 / f16 only, the sim none\n");
  }
}
