// The typed attention (Kernels::attention_forward_ex / attention_backward_ex,
// backend_cuda/cuda_attention.cu through emu.h) and its tensor-core product (cuda_mma.cuh's
// mma_m16n8k16, emulated by emu.h):
//   - the mma helper against a plain matrix product for random A, B, C (bf16 and f16): pins the
//     fragment layout of Note [mma fragments];
//   - bitwise typed (bf16, f16) = the simulator's MixedOp path bit for bit: qkv and dy widened,
//     the f32 kernels, y and dqkv rounded once; stats equal;
//   - fast typed (FlashAttention-2 on mma for hd 64 and 128; the SIMT fast kernels with typed
//     loads for other head widths) within kTypedTol u of a double-precision reference computed
//     from the same bf16 / f16 inputs (u the format's unit roundoff), stats within rounding of
//     the bitwise stats; T not a multiple of the tile, B nh > 1, with and without dropout.
#include <array>

#include "core/numerics/float_formats.h"
#include "core/numerics/gpt_math.h"
#include "core/numerics/random.h"
#include "emu_attention_ref.h"
#include "emu_check.h"

namespace {

using Bits = std::vector<std::uint16_t>;

template <class E>
Bits to_bits(const V& v) {
  Bits b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = E::from(v[i]).bits;
  return b;
}
template <class E>
V widen(const Bits& b) {
  V v(b.size());
  for (std::size_t i = 0; i < b.size(); ++i) {
    E e;
    e.bits = b[i];
    v[i] = e.to_float();
  }
  return v;
}

V uniform(std::size_t n, unsigned seed, float r) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-r, r);
  V v(n);
  for (float& x : v) x = u(gen);
  return v;
}

template <class E>
constexpr DType dtype_of_e() {
  return std::is_same_v<E, bfloat16> ? DType::bf16 : DType::f16;
}
template <class E>
constexpr const char* name_of_e() {
  return std::is_same_v<E, bfloat16> ? "bf16" : "f16";
}
// The unit roundoff of E: 2^-8 (bf16, 8 significant bits), 2^-11 (f16).
template <class E>
constexpr double unit_roundoff() {
  return std::is_same_v<E, bfloat16> ? 1.0 / 256 : 1.0 / 2048;
}

// ---- the mma helper ----------------------------------------------------------------------------

// One warp: lane L's fragments of A (16x16), B (16x8), C (16x8) by Note [mma fragments], d back
// per lane.
template <class E>
void mma_kernel(const Bits* A, const Bits* B, const V* C, V* D) {
  const unsigned L = threadIdx.x, g = L >> 2, t = L % 4;
  const auto at = [&](int r, int c) { return (*A)[r * 16 + c]; };
  const auto bt = [&](int r, int c) { return (*B)[r * 8 + c]; };
  const auto pk = [](std::uint16_t lo, std::uint16_t hi) {
    return unsigned(lo) | unsigned(hi) << 16;
  };
  const unsigned a[4] = {
      pk(at(g, 2 * t), at(g, 2 * t + 1)), pk(at(g + 8, 2 * t), at(g + 8, 2 * t + 1)),
      pk(at(g, 2 * t + 8), at(g, 2 * t + 9)), pk(at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9))};
  const unsigned b[2] = {pk(bt(2 * t, g), bt(2 * t + 1, g)),
                         pk(bt(2 * t + 8, g), bt(2 * t + 9, g))};
  const float c[4] = {(*C)[g * 8 + 2 * t], (*C)[g * 8 + 2 * t + 1], (*C)[(g + 8) * 8 + 2 * t],
                      (*C)[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_m16n8k16<E>(d, a, b, c);
  (*D)[g * 8 + 2 * t] = d[0];
  (*D)[g * 8 + 2 * t + 1] = d[1];
  (*D)[(g + 8) * 8 + 2 * t] = d[2];
  (*D)[(g + 8) * 8 + 2 * t + 1] = d[3];
}

template <class E>
void check_mma(unsigned& seed) {
  for (int rep = 0; rep < 4; ++rep) {
    const Bits A = to_bits<E>(uniform(16 * 16, seed++, 2.0f)),
               B = to_bits<E>(uniform(16 * 8, seed++, 2.0f));
    const V C = uniform(16 * 8, seed++, 4.0f);
    V D(16 * 8, NAN);
    emu_launch(mma_kernel<E>, dim3(1), dim3(32), &A, &B, &C, &D);
    const V a = widen<E>(A), b = widen<E>(B);
    double worst = 0.0;
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        double ref = C[i * 8 + j];
        for (int k = 0; k < 16; ++k) ref += double(a[i * 16 + k]) * b[k * 8 + j];
        const double e = std::fabs(D[i * 8 + j] - ref) / (1.0 + std::fabs(ref));
        worst = std::isnan(e) ? INFINITY : std::max(worst, e);
      }
    ++checks;
    if (!(worst <= 1e-6)) {
      ++failures;
      std::printf("FAIL mma_m16n8k16 %s rep %d: max |d - A B - C| / (1 + |ref|) = %.3g\n",
                  name_of_e<E>(), rep, worst);
    }
  }
}

// ---- the typed attention -----------------------------------------------------------------------

// max |got - want| / (u (1 + max |want|)): the error in units of the format's roundoff, relative
// to the tensor's scale (an element near 0 of a tensor of O(1) values errs by O(u) absolutely).
double scaled_error(const V& got, const std::vector<double>& want, double u, std::size_t stride = 1,
                    std::size_t n = 0) {
  if (n == 0) n = want.size();
  double scale = 0.0, e = 0.0;
  for (std::size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(want[i]));
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(got[i * stride]) - want[i]) / (u * (1.0 + scale));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

// Fast typed tolerance, in units of u (1 + max |ref|): y, dq, dk, dv.
constexpr double kTypedTol = 4.0;
// Stats of fast typed against the bitwise stats (both f32 from the same inputs): relative.
constexpr double kStatsTol = 1e-5;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (ok) return;
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
}

// want == got bit for bit (the simulator's MixedOp result rounded, the typed kernel's).
void check_bits(const char* what, const Bits& want, const Bits& got, const std::string& ctx) {
  ++checks;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i]) {
      ++failures;
      std::printf("FAIL %s %s at %zu: sim %04x cuda %04x\n", what, ctx.c_str(), i, want[i], got[i]);
      return;
    }
}

// The worst fast typed errors (units of u (1 + max |ref|)) of the backward given the forward's
// output y (D = rowsum(dy * y): 7 products on the tensor cores) and not given it (D recomputed
// in a first pass of the dq kernel: 9), the forward's among them.
struct TypedWorst {
  double with_y = 0.0, without_y = 0.0;
};

template <class E>
void check_typed_shape(unsigned& seed, i64 B, i64 T, i64 C, i64 nh, float p, TypedWorst& worst) {
  const DType dt = dtype_of_e<E>();
  const double u = unit_roundoff<E>();
  const std::uint64_t stream = stream_id(kStreamDropout, (std::uint64_t(6) << 8) | 1);
  const gpt::AttentionDropout drop{p, 4242, stream, 11};
  const std::string ctx =
      std::string(name_of_e<E>()) + " " + dims({B, T, C, nh}) + " p " + std::to_string(p);
  const i64 hd = C / nh;
  Bits qkv = to_bits<E>(uniform(B * T * 3 * C, seed++, 2.0f));
  const Bits dy = to_bits<E>(uniform(B * T * C, seed++, 2.0f));
  // Signed zeros and subnormals of E among the inputs (the kernels' widening of every code).
  for (std::size_t i = 0; i < 6 && i < qkv.size(); ++i)
    qkv[i * 7] = std::array<std::uint16_t, 6>{0x0001, 0x8003, 0x8000, 0x0000, 0x007f, 0x83ff}[i];
  const V qkvf = widen<E>(qkv), dyf = widen<E>(dy);
  const std::size_t rows = std::size_t(B * nh * T);
  expect(cudak->has_attention_ex(dt, hd, Determinism::bitwise) &&
             cudak->has_attention_ex(dt, hd, Determinism::fast),
         "has_attention_ex " + ctx);
  // The simulator's MixedOp path: f32 kernels on the widened inputs, outputs rounded once.
  V sy(B * T * C), sst(rows * 2), sdq(B * T * 3 * C), spd(rows);
  simk->attention_forward(*sims, qkvf.data(), B, T, C, nh, sy.data(), sst.data(), p, drop.seed,
                          stream, drop.index_base, Determinism::bitwise);
  simk->attention_backward(*sims, dyf.data(), qkvf.data(), nullptr, sst.data(), B, T, C, nh,
                           sdq.data(), spd.data(), p, drop.seed, stream, drop.index_base,
                           Determinism::bitwise);
  sims->synchronize();
  for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
    const std::string mctx = std::string(determinism_name(mode)) + " " + ctx;
    Bits y(B * T * C, 0x7fff), dq(B * T * 3 * C, 0x7fff), dq0(B * T * 3 * C, 0x7fff);
    V st(rows * 2, NAN), pd(rows, NAN), pd0(rows, NAN);
    try {
      cudak->attention_forward_ex(cudas, qkv.data(), dt, B, T, C, nh, y.data(), st.data(), p,
                                  drop.seed, stream, drop.index_base, mode);
      // Given y (bitwise ignores it: its bits are the simulator's either way) and, in fast mode,
      // not given it.
      cudak->attention_backward_ex(cudas, dy.data(), qkv.data(), y.data(), dt, st.data(), B, T, C,
                                   nh, dq.data(), pd.data(), p, drop.seed, stream, drop.index_base,
                                   mode);
      if (mode == Determinism::fast)
        cudak->attention_backward_ex(cudas, dy.data(), qkv.data(), nullptr, dt, st.data(), B, T, C,
                                     nh, dq0.data(), pd0.data(), p, drop.seed, stream,
                                     drop.index_base, mode);
    } catch (const std::exception& e) {
      expect(false, "attention_ex " + mctx + ": " + e.what());
      continue;
    }
    if (mode == Determinism::bitwise) {
      check_bits("attention_forward_ex y", to_bits<E>(sy), y, mctx);
      check("attention_forward_ex stats", sst, st, mctx);
      check_bits("attention_backward_ex dqkv", to_bits<E>(sdq), dq, mctx);
      check("attention_backward_ex pd", spd, pd, mctx);
      continue;
    }
    const AttnReference ref = attention_reference(qkvf, dyf, B, T, C, nh, drop);
    const V yf = widen<E>(y);
    for (bool with_y : {true, false}) {
      const V dqf = widen<E>(with_y ? dq : dq0);
      // dqkv by part: dq, dk, dv have their own scales.
      std::vector<double> rq, rk, rv;
      V gq, gk, gv;
      for (i64 r = 0; r < B * T; ++r)
        for (i64 i = 0; i < C; ++i) {
          rq.push_back(ref.dqkv[r * 3 * C + i]), gq.push_back(dqf[r * 3 * C + i]);
          rk.push_back(ref.dqkv[r * 3 * C + C + i]), gk.push_back(dqf[r * 3 * C + C + i]);
          rv.push_back(ref.dqkv[r * 3 * C + 2 * C + i]), gv.push_back(dqf[r * 3 * C + 2 * C + i]);
        }
      const double errs[] = {scaled_error(yf, ref.y, u), scaled_error(gq, rq, u),
                             scaled_error(gk, rk, u), scaled_error(gv, rv, u)};
      const char* names[] = {"y", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i) {
        double& w = with_y ? worst.with_y : worst.without_y;
        w = std::max(w, errs[i]);
        expect(errs[i] <= kTypedTol, "attention_ex fast " + std::string(names[i]) +
                                         (with_y ? " (given y) " : " (D recomputed) ") + mctx +
                                         ": error " + std::to_string(errs[i]) + " u > " +
                                         std::to_string(kTypedTol) + " u");
      }
    }
    double es = 0.0;
    for (std::size_t i = 0; i < rows * 2; ++i) {
      const double d = std::fabs(double(st[i]) - sst[i]) / (1.0 + std::fabs(double(sst[i])));
      es = std::isnan(d) ? INFINITY : std::max(es, d);
    }
    expect(es <= kStatsTol,
           "attention_ex fast stats vs bitwise " + mctx + ": " + std::to_string(es));
  }
}

}  // namespace

// Not in ctest (tens of seconds): the fast typed kernels' error at the heads of GPT-2 124M (hd
// 64, T 1024) and nanoGPT's char model (hd 64, T 256), one (b, h) each, and at hd 128, T 512,
// with attn_dropout 0 and 0.2 (`cuda_emu_test attention-measure`; Note [CUDA attention]).
void measure_typed_attention(unsigned& seed) {
  TypedWorst worst_bf, worst_h;
  for (auto d :
       std::vector<std::array<i64, 4>>{{1, 1024, 64, 1}, {1, 256, 64, 1}, {1, 512, 128, 1}})
    for (float p : {0.0f, 0.2f}) {
      TypedWorst bf, h;
      check_typed_shape<bfloat16>(seed, d[0], d[1], d[2], d[3], p, bf);
      check_typed_shape<float16>(seed, d[0], d[1], d[2], d[3], p, h);
      std::printf("attention_ex fast %s p %.1f: max error given y %.3g u (bf16), %.3g u (f16); "
                  "D recomputed %.3g u (bf16), %.3g u (f16)\n",
                  dims({d[0], d[1], d[2], d[3]}).c_str(), p, bf.with_y, h.with_y, bf.without_y,
                  h.without_y);
      worst_bf.with_y = std::max(worst_bf.with_y, bf.with_y);
      worst_bf.without_y = std::max(worst_bf.without_y, bf.without_y);
      worst_h.with_y = std::max(worst_h.with_y, h.with_y);
      worst_h.without_y = std::max(worst_h.without_y, h.without_y);
    }
  std::printf("worst: given y %.3g u (bf16), %.3g u (f16); D recomputed %.3g u (bf16), %.3g u "
              "(f16)\n",
              worst_bf.with_y, worst_h.with_y, worst_bf.without_y, worst_h.without_y);
}

void check_typed_attention(unsigned& seed) {
  check_mma<bfloat16>(seed);
  check_mma<float16>(seed);
  TypedWorst worst_bf, worst_h;
  for (auto d : std::vector<std::array<i64, 4>>{
           {2, 37, 128, 2},  // hd 64: the mma kernels, T not a multiple of 64, B nh 4
           {1, 70, 256, 2},  // hd 128: the mma kernels, two query tiles
           {2, 9, 48, 2}})   // hd 24: the SIMT kernels with typed loads (fast and bitwise)
    for (float p : {0.0f, 0.2f}) {
      check_typed_shape<bfloat16>(seed, d[0], d[1], d[2], d[3], p, worst_bf);
      check_typed_shape<float16>(seed, d[0], d[1], d[2], d[3], p, worst_h);
    }
  std::printf("attention_ex fast vs double: max error given y %.3g u (bf16, u = 2^-8), %.3g u "
              "(f16, u = 2^-11); D recomputed %.3g u (bf16), %.3g u (f16); tolerance %.3g u "
              "(1 + max |ref|)\n",
              worst_bf.with_y, worst_h.with_y, worst_bf.without_y, worst_h.without_y, kTypedTol);
  expect(!cudak->has_attention_ex(DType::f32, 64, Determinism::fast) &&
             !cudak->has_attention_ex(DType::bf16, 136, Determinism::bitwise),
         "has_attention_ex: f32 or head_dim > 128 not native");
}
