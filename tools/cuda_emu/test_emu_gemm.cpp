// The typed GEMM (Kernels::gemm_ex, backend_cuda/cuda_gemm.cu through emu.h) against the
// simulator's path for bf16 / f16 products (Note [Mixed precision]): every operand cast to f32
// (Kernels::cast), the f32 bitwise gemm, the result cast once into C's dtype, and with the bias
// epilogue the add_bias_ that follows (C and bias widened, add_bias, C rounded again), all on the
// simulator's kernels; the emulated CUDA kernel loads A / B in their storage dtype and rounds in
// its epilogue. Bit for bit, for A / B of f32, bf16, f16, C of their dtype or f32, every
// (trans_a, trans_b), sizes that are not multiples of the 128 x 128 x 8 tile, padded leading
// dimensions, beta 0 (C holds NaN: never read) and 1, alpha 1 and not, with and without bias, in
// both modes (fast-mode gemm_ex falls back to the canonical kernel where cuBLASLt cannot run,
// and the emulator has no cuBLASLt). And the typed micro-sharded dW (gemm_tn_sharded_ex) against
// the simulator's MixedOp path of ops::gemm_tn_sharded, bit for bit (check_typed_gemm_sharded).
// And the GELU epilogues' fallback (check_gelu_epilogues), against double.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "core/numerics/micro_shards.h"
#include "core/runtime/dtype.h"
#include "emu_check.h"

namespace {

using Bytes = std::vector<std::uint8_t>;

// n elements of dtype t holding mixed() values rounded to t.
Bytes typed(DType t, std::size_t n, unsigned seed) {
  const V v = mixed(n, seed);
  Bytes b(n * dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    if (t == DType::bf16) {
      const std::uint16_t u = bfloat16::from(v[i]).bits;
      std::memcpy(b.data() + 2 * i, &u, 2);
    } else if (t == DType::f16) {
      const std::uint16_t u = float16::from(v[i]).bits;
      std::memcpy(b.data() + 2 * i, &u, 2);
    } else {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    }
  }
  return b;
}

// The simulator's path (MixedOp in ops::gemm / ops::matmul, then ops::add_bias_).
void sim_reference(const GemmExArgs& g, i64 a_elems, i64 b_elems, i64 c_elems) {
  V af(a_elems), bf(b_elems), cf(c_elems);
  simk->cast(*sims, g.A, g.a_type, af.data(), DType::f32, a_elems);
  simk->cast(*sims, g.B, g.b_type, bf.data(), DType::f32, b_elems);
  simk->cast(*sims, g.C, g.c_type, cf.data(), DType::f32, c_elems);
  simk->gemm(*sims, g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, af.data(), g.lda, bf.data(),
             g.ldb, g.beta, cf.data(), g.ldc, Determinism::bitwise);
  simk->cast(*sims, cf.data(), DType::f32, g.C, g.c_type, c_elems);
  if (g.epilogue == GemmEpilogue::bias) {
    // add_bias_ on the [M, ldc] rows (the padding columns get the bias too: compared only where
    // the kernel writes, below, so they are restored from the input).
    V yf(g.M * g.N), biasf(g.N);
    for (i64 r = 0; r < g.M; ++r)
      simk->cast(*sims, static_cast<std::uint8_t*>(g.C) + r * g.ldc * dtype_size(g.c_type),
                 g.c_type, yf.data() + r * g.N, DType::f32, g.N);
    simk->cast(*sims, g.bias, g.c_type, biasf.data(), DType::f32, g.N);
    simk->add_bias(*sims, yf.data(), biasf.data(), g.M, g.N);
    for (i64 r = 0; r < g.M; ++r)
      simk->cast(*sims, yf.data() + r * g.N, DType::f32,
                 static_cast<std::uint8_t*>(g.C) + r * g.ldc * dtype_size(g.c_type), g.c_type, g.N);
    sims->synchronize();  // the simulator's kernels run asynchronously: before yf dies
  }
  sims->synchronize();
}

// NaN of dtype t in every element of b (a C that must never be read).
void fill_nan(DType t, Bytes& b) {
  const std::size_t n = b.size() / dtype_size(t);
  for (std::size_t i = 0; i < n; ++i) {
    if (t == DType::f32) {
      const float nan = NAN;
      std::memcpy(b.data() + 4 * i, &nan, 4);
    } else {
      const std::uint16_t nan = t == DType::bf16 ? 0x7fc0 : 0x7e00;
      std::memcpy(b.data() + 2 * i, &nan, 2);
    }
  }
}

// The typed sharded dW (Kernels::gemm_tn_sharded_ex) against the simulator's path, MixedOp in
// ops::gemm_tn_sharded: A and B cast to f32, the f32 gemm_tn_sharded into C cast to f32, the
// result cast once into C's dtype (the whole padded C goes through the casts: its padding
// round-trips unchanged, and the kernel must leave it so). Ragged shards (random cuts: empty ones
// among them), leading empty shards, more shards than one launch takes (kShardCap = 64: the
// typed root of the host tree), accumulate on and off (off: C holds NaN, never read), padded row
// strides of A, B and C.
void check_typed_gemm_sharded(unsigned& seed) {
  struct Kind {
    DType ab, c;
  };
  const Kind kinds[] = {{DType::bf16, DType::f32}, {DType::bf16, DType::bf16},
                        {DType::f16, DType::f32},  {DType::f16, DType::f16},
                        {DType::bf16, DType::f16}, {DType::f32, DType::bf16}};
  struct Case {
    i64 rows, S;
    bool random;
  };
  const Case cases[] = {{37, 1, false}, {130, 3, true}, {130, 8, true},
                        {0, 2, false},  {9, 5, false},  {70, 65, true}};
  const i64 M = 130, N = 67;
  int variant = 0;
  for (const Kind& k : kinds)
    for (const Case& z : cases)
      for (bool acc : {false, true}) {
        ++variant;
        const Bounds bounds =
            z.random ? random_bounds(z.rows, z.S, seed++) : micro_shard_bounds(z.rows, z.S);
        const int pad = variant % 3;
        const i64 lda = M + pad, ldb = N + (pad + 1) % 3, ldc = N + pad;
        const i64 a_elems = std::max<i64>(z.rows * lda, 1),
                  b_elems = std::max<i64>(z.rows * ldb, 1);
        const i64 c_elems = M * ldc;
        const Bytes A = typed(k.ab, a_elems, seed++), B = typed(k.ab, b_elems, seed++);
        Bytes C = typed(k.c, c_elems, seed++);
        if (!acc) fill_nan(k.c, C);
        Bytes Cs = C, Ce = C;
        const std::string ctx = std::string(dtype_name(k.ab)) + "->" + dtype_name(k.c) + " rows " +
                                std::to_string(z.rows) + " S " + std::to_string(z.S) +
                                (z.random ? " random" : "") + " pad " + std::to_string(pad) +
                                " acc " + std::to_string(acc);
        try {
          V af(a_elems), bf(b_elems), cf(c_elems);
          simk->cast(*sims, A.data(), k.ab, af.data(), DType::f32, a_elems);
          simk->cast(*sims, B.data(), k.ab, bf.data(), DType::f32, b_elems);
          simk->cast(*sims, Cs.data(), k.c, cf.data(), DType::f32, c_elems);
          simk->gemm_tn_sharded(*sims, M, N, af.data(), lda, bf.data(), ldb, bounds, cf.data(), ldc,
                                acc);
          simk->cast(*sims, cf.data(), DType::f32, Cs.data(), k.c, c_elems);
          sims->synchronize();
          ++checks;
          if (!cudak->has_gemm_tn_sharded_ex(k.ab, k.ab, k.c)) {
            ++failures;
            std::printf("FAIL gemm_tn_sharded_ex %s: has_gemm_tn_sharded_ex false\n", ctx.c_str());
            continue;
          }
          cudak->gemm_tn_sharded_ex(cudas, M, N, A.data(), k.ab, lda, B.data(), k.ab, ldb, bounds,
                                    Ce.data(), k.c, ldc, acc);
        } catch (const std::exception& e) {
          ++failures;
          std::printf("FAIL gemm_tn_sharded_ex %s: %s\n", ctx.c_str(), e.what());
          continue;
        }
        check("gemm_tn_sharded_ex", Cs, Ce, ctx);
      }
  // Mixed A / B dtypes and f64 stay on MixedOp's f32 scratch.
  ++checks;
  if (cudak->has_gemm_tn_sharded_ex(DType::bf16, DType::f32, DType::f32) ||
      cudak->has_gemm_tn_sharded_ex(DType::f16, DType::bf16, DType::f32) ||
      cudak->has_gemm_tn_sharded_ex(DType::bf16, DType::bf16, DType::f64) ||
      cudak->has_gemm_tn_sharded_ex(DType::f64, DType::f64, DType::f64)) {
    ++failures;
    std::printf("FAIL has_gemm_tn_sharded_ex accepts a mixed or f64 product\n");
  }
}

// Stored values of dtype t (uniform in [-1, 1], rounded to t) and their f32 widening.
struct Stored {
  Bytes bytes;
  V values;
};
Stored uniform_stored(DType t, i64 n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Stored m{Bytes(static_cast<std::size_t>(n) * dtype_size(t)), V(static_cast<std::size_t>(n))};
  for (std::size_t i = 0; i < m.values.size(); ++i) {
    float v = u(gen);
    if (t == DType::bf16) {
      const bfloat16 h = bfloat16::from(v);
      std::memcpy(m.bytes.data() + 2 * i, &h.bits, 2);
      v = h.to_float();
    } else if (t == DType::f16) {
      const float16 h = float16::from(v);
      std::memcpy(m.bytes.data() + 2 * i, &h.bits, 2);
      v = h.to_float();
    } else {
      std::memcpy(m.bytes.data() + 4 * i, &v, 4);
    }
    m.values[i] = v;
  }
  return m;
}

float widen_at(DType t, const Bytes& b, i64 i) {
  const auto at = static_cast<std::size_t>(i);
  if (t == DType::f32) {
    float v;
    std::memcpy(&v, b.data() + 4 * at, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, b.data() + 2 * at, 2);
  return t == DType::bf16 ? bfloat16{h}.to_float() : float16{h}.to_float();
}

// gemm_ex's GELU epilogues as the emulated backend runs them (no cuBLASLt: the canonical GEMM,
// then launch_gelu_epilogue): gelu_aux_bias (with a bias and without) leaves in aux the bits of
// the plain GEMM (with its bias) and in C the tanh-form GELU of aux; dgelu leaves in C gelu'(aux)
// times the plain GEMM's product; both against a double reference (of the stored aux and
// product) within C's rounding (half an ulp: 2^-8 bf16, 2^-11 f16; 2^-25 in f16's subnormals)
// and 2e-6 (1 + |aux|) of ditto's f32 GELU (its portable tanh), for f32, bf16, f16, padded row
// strides, aux's other than C's (their padding untouched), in fast mode (has_gemm_gelu_epilogue:
// the probe stub says tanh) and bitwise.
void check_gelu_epilogues(unsigned& seed) {
  auto gelu = [](double x) {
    return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
  };
  auto gelu_grad = [](double x) {
    const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) +
           0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
  };
  struct Size {
    i64 M, N, K, pad;
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    // C's rounding: half an ulp of the value, or of f16's subnormals (2^-25) below 2^-14.
    const double u = t == DType::bf16 ? 0x1p-8 : t == DType::f16 ? 0x1p-11 : 0.0;
    const double sub = t == DType::f16 ? 0x1p-25 : 0.0;
    ++checks;
    if (!cudak->has_gemm_gelu_epilogue(t, Determinism::fast) ||
        cudak->has_gemm_gelu_epilogue(t, Determinism::bitwise)) {
      ++failures;
      std::printf("FAIL has_gemm_gelu_epilogue %s: expected fast only\n", dtype_name(t));
    }
    for (const Size& z : {Size{17, 40, 20, 3}, Size{5, 24, 9, 0}})
      for (int kind = 0; kind < 3; ++kind)
        for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
          const bool backward = kind == 2, bias = kind == 0;
          const std::string ctx = std::string(dtype_name(t)) + " " + std::to_string(z.M) + "x" +
                                  std::to_string(z.N) + "x" + std::to_string(z.K) +
                                  (backward ? " dgelu"
                                   : bias   ? " gelu_aux_bias"
                                            : " gelu_aux") +
                                  (mode == Determinism::fast ? " fast" : " bitwise");
          const i64 ld = z.N + z.pad, la = z.N + 2 * z.pad + 1;  // C's and aux's row strides
          const Stored A = uniform_stored(t, z.M * z.K, seed++);
          const Stored B = uniform_stored(t, z.N * z.K, seed++);
          const Stored Bias = uniform_stored(t, z.N, seed++);
          Stored Aux = uniform_stored(t, z.M * la, seed++);  // dgelu's pre-GELU
          Bytes C = uniform_stored(t, z.M * ld, seed++).bytes, plain = C;
          const Bytes aux_in = Aux.bytes, c_in = C;
          GemmExArgs g;
          g.trans_b = !backward;  // forward x @ w^T; backward gy @ w
          g.M = z.M, g.N = z.N, g.K = z.K;
          g.a_type = g.b_type = g.c_type = t;
          g.A = A.bytes.data(), g.lda = z.K;
          g.B = B.bytes.data(), g.ldb = backward ? z.N : z.K;
          g.ldc = ld;
          g.bias = bias ? Bias.bytes.data() : nullptr;
          g.mode = mode;
          GemmExArgs p = g;  // the plain GEMM: into plain, with the bias where g has one
          p.C = plain.data();
          p.epilogue = bias ? GemmEpilogue::bias : GemmEpilogue::none;
          g.C = C.data();
          g.epilogue = backward ? GemmEpilogue::dgelu : GemmEpilogue::gelu_aux_bias;
          g.aux = Aux.bytes.data(), g.ld_aux = la;
          try {
            cudak->gemm_ex(cudas, p);
            cudak->gemm_ex(cudas, g);
          } catch (const std::exception& e) {
            ++failures;
            std::printf("FAIL gelu epilogue %s: %s\n", ctx.c_str(), e.what());
            continue;
          }
          ++checks;
          int bad = 0;
          for (i64 m = 0; m < z.M && bad == 0; ++m)
            for (i64 n = 0; n < la && bad == 0; ++n) {
              const i64 i = m * ld + n, ia = m * la + n;
              const double a = widen_at(t, Aux.bytes, ia);
              const double c = n < ld ? widen_at(t, C, i) : 0.0;
              if (n >= z.N) {  // padding: untouched
                if ((n < ld && c != widen_at(t, c_in, i)) || a != widen_at(t, aux_in, ia)) {
                  bad = 1;
                  std::printf("FAIL gelu epilogue %s: padding (%lld, %lld) written\n", ctx.c_str(),
                              static_cast<long long>(m), static_cast<long long>(n));
                }
                continue;
              }
              const double prod = widen_at(t, plain, i);
              if (!backward && a != prod) {
                bad = 1;
                std::printf("FAIL gelu epilogue %s: aux (%lld, %lld) %g, the GEMM %g\n",
                            ctx.c_str(), static_cast<long long>(m), static_cast<long long>(n), a,
                            prod);
                continue;
              }
              if (backward && a != widen_at(t, aux_in, ia)) {
                bad = 1;
                std::printf("FAIL gelu epilogue %s: dgelu wrote aux\n", ctx.c_str());
                continue;
              }
              const double want = backward ? gelu_grad(a) * prod : gelu(a);
              const double tol = u * std::fabs(want) + sub +
                                 2e-6 * (1.0 + std::fabs(a)) * (backward ? std::fabs(prod) : 1.0);
              if (!(std::fabs(c - want) <= tol)) {
                bad = 1;
                std::printf("FAIL gelu epilogue %s: C (%lld, %lld) %.9g, double %.9g\n",
                            ctx.c_str(), static_cast<long long>(m), static_cast<long long>(n), c,
                            want);
              }
            }
          failures += bad;
        }
  }
}

}  // namespace

void check_typed_gemm(unsigned& seed) {
  struct Size {
    i64 M, N, K;
    int pad;
  };
  const std::vector<Size> sizes = {
      {1, 1, 1, 0}, {130, 67, 37, 1}, {5, 131, 9, 3}, {129, 3, 0, 0}, {17, 40, 20, 2}};
  const DType kinds[] = {DType::f32, DType::bf16, DType::f16};
  int variant = 0;
  for (DType ab : kinds)
    for (DType ct : {ab, DType::f32}) {
      if (ab == DType::f32 && ct != DType::f32) continue;
      for (const Size& z : sizes)
        for (int t = 0; t < 4; ++t) {
          ++variant;
          GemmExArgs g;
          g.trans_a = t & 1;
          g.trans_b = t & 2;
          g.M = z.M, g.N = z.N, g.K = z.K;
          g.a_type = g.b_type = ab;
          g.c_type = ct;
          g.alpha = variant % 3 == 0 ? 0.75f : 1.0f;
          g.beta = variant % 2 == 0 ? 1.0f : 0.0f;
          const bool bias = (variant / 2) % 2 == 1;
          g.epilogue = bias ? GemmEpilogue::bias : GemmEpilogue::none;
          g.mode = variant % 5 == 0 ? Determinism::fast : Determinism::bitwise;
          const i64 ar = g.trans_a ? z.K : z.M, ac = g.trans_a ? z.M : z.K;
          const i64 br = g.trans_b ? z.N : z.K, bc = g.trans_b ? z.K : z.N;
          g.lda = std::max<i64>(ac + z.pad, 1);
          g.ldb = std::max<i64>(bc + z.pad, 1);
          g.ldc = z.N + z.pad;
          const i64 a_elems = std::max<i64>(ar * g.lda, 1), b_elems = std::max<i64>(br * g.ldb, 1);
          const i64 c_elems = z.M * g.ldc;
          Bytes A = typed(ab, a_elems, seed++), B = typed(ab, b_elems, seed++);
          Bytes C = typed(ct, c_elems, seed++), Bias = typed(ct, z.N, seed++);
          if (g.beta == 0.0f) {  // never read: NaN there would show
            for (i64 i = 0; i < c_elems; ++i) {
              if (ct == DType::f32) {
                const float nan = NAN;
                std::memcpy(C.data() + 4 * i, &nan, 4);
              } else {
                const std::uint16_t nan = 0x7e00;
                std::memcpy(C.data() + 2 * i, &nan, 2);
              }
            }
          }
          Bytes Cs = C, Ce = C;
          const std::string ctx =
              std::string(dtype_name(ab)) + "->" + dtype_name(ct) + " " + std::to_string(z.M) +
              "x" + std::to_string(z.N) + "x" + std::to_string(z.K) + " t" + std::to_string(t) +
              " beta " + std::to_string(g.beta) + " alpha " + std::to_string(g.alpha) +
              (bias ? " bias" : "") + (g.mode == Determinism::fast ? " fast" : " bitwise");
          g.A = A.data();
          g.B = B.data();
          g.bias = Bias.data();
          GemmExArgs gs = g, ge = g;
          gs.C = Cs.data();
          ge.C = Ce.data();
          try {
            sim_reference(gs, a_elems, b_elems, c_elems);
            ++checks;
            if (!cudak->has_gemm_ex(ab, ab, ct, g.mode)) {
              ++failures;
              std::printf("FAIL gemm_ex %s: has_gemm_ex false\n", ctx.c_str());
              continue;
            }
            cudak->gemm_ex(cudas, ge);
          } catch (const std::exception& e) {
            ++failures;
            std::printf("FAIL gemm_ex %s: %s\n", ctx.c_str(), e.what());
            continue;
          }
          // The padding columns of C are the kernel's to leave alone: the reference's bias pass
          // left them as they were too.
          check("gemm_ex", Cs, Ce, ctx);
        }
    }
  // The dtypes gemm_ex does not take natively (the ops keep MixedOp's f32 scratch for them).
  ++checks;
  if (cudak->has_gemm_ex(DType::bf16, DType::f32, DType::bf16, Determinism::fast) ||
      cudak->has_gemm_ex(DType::bf16, DType::bf16, DType::f16, Determinism::bitwise) ||
      cudak->has_gemm_ex(DType::f32, DType::f32, DType::bf16, Determinism::fast) ||
      cudak->has_gemm_ex(DType::f64, DType::f64, DType::f64, Determinism::fast)) {
    ++failures;
    std::printf("FAIL has_gemm_ex accepts a mixed or f64 product\n");
  }
  check_typed_gemm_sharded(seed);
  check_gelu_epilogues(seed);
}
