// The CUDA communicators' reduce kernel (backend_cuda/cuda_comm_kernels.cu, launch_comm_reduce)
// run on the CPU through emu.h, for every dtype x op (sum, prod, min, max, avg, premul_sum with a
// scalar per rank) at 1..8 sources (the compile-time trees) and 13 and 33 (the run-time tree),
// 16-byte aligned (vector loads, with a tail) and misaligned (one element per load), compared bit
// for bit with the simulator's bitwise reduction over ranks (sim::reduce_over_ranks, what its
// collectives compute) and with a host evaluation of Note [Reductions over ranks] written here
// (the canonical tree over the source index on reduce_math.h's accumulators, rounded once), so a
// departure of either backend from the Note shows. It also checks that one source without
// arithmetic is a copy of the bits (a signalling f16 NaN stays signalling) and that the f16 / bf16
// result is NOT what a sum rounding to f16 at every step gives, on an input where the two differ
// (so the comparison can fail). Float inputs include NaNs of both signs and +-inf (inf - inf,
// 0 * inf, NaN through every op); a NaN result equals any NaN (Note [NaN bits],
// core/runtime/nan_bits.h: x86 and the GPU, and two compilers, make different NaNs), a copy's
// NaN keeps its bits. Pass: the summary line "<n> checks, 0 failures" and exit status 0
// (ctest CudaEmu.CommKernels); it also counts the comparisons that differed in NaN bits only.
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_sim/sim_comm_kernels.h"
#include "core/numerics/determinism.h"
#include "core/numerics/reduce_math.h"
#include "core/runtime/dtype.h"
#include "core/runtime/nan_bits.h"
#include "emu.h"

using namespace ditto;
using i64 = std::int64_t;

namespace {

int failures = 0, checks = 0;

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                             ReduceOp::max, ReduceOp::avg,  ReduceOp::premul_sum};

/// The host reduction of element i: the canonical tree over sources [lo, hi) (Note [Canonical
/// tree]) on the accumulators.
template <typename T>
rmath::Acc<T> tree(const std::vector<const T*>& srcs, i64 i, int lo, int hi, rmath::Op op,
                   const std::vector<double>& scalars) {
  if (hi - lo == 1)
    return rmath::load_scaled(srcs[lo][i], op, rmath::scalar_as_acc<T>(scalars[lo]));
  const int mid = static_cast<int>(tree_mid(lo, hi));
  return rmath::combine(tree(srcs, i, lo, mid, op, scalars), tree(srcs, i, mid, hi, op, scalars),
                        op);
}

/// Values of T for the inputs: floats over a wide range with signed zeros, now and then a NaN of
/// either sign (one with a payload) and +-inf; integers over the whole range (sums and products
/// wrap).
template <typename T>
T draw(std::mt19937& gen) {
  std::uniform_int_distribution<int> pick(0, 31);
  const int p = pick(gen);
  if constexpr (std::is_integral_v<T>) {
    std::uniform_int_distribution<std::uint64_t> any;
    if (p < 8) return static_cast<T>(static_cast<int>(p) - 4);  // small values, negatives too
    return static_cast<T>(any(gen));
  } else {
    std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
    std::uniform_int_distribution<int> e(-6, 6);
    float v = p == 0 ? 0.0f : p == 1 ? -0.0f : mant(gen) * std::pow(2.0f, float(e(gen)));
    if (p == 2) v = std::numeric_limits<float>::quiet_NaN();
    if (p == 3) v = std::bit_cast<float>(0xffc00123u);  // negative, with a payload
    if (p == 4 || p == 5) v = (p == 4 ? 1 : -1) * std::numeric_limits<float>::infinity();
    return convert<T>(v);
  }
}

template <typename T>
bool same(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
std::string bits(const T& x) {
  std::uint64_t u = 0;
  std::memcpy(&u, &x, sizeof(T));
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(u));
  return buf;
}

int nan_bit_diffs = 0;  // results equal only as NaNs (Note [NaN bits])
const bool print_nan_bits = std::getenv("DITTO_EMU_BITS") != nullptr;  // as emu_check.h's

/// Equal bits, or (float T, `arithmetic`: not a copy) two NaNs of any bits (Note [NaN bits]);
/// DITTO_EMU_BITS set: such a pair printed, "NANBITS <what> <a> <b>".
template <typename T>
bool same_value(const T& a, const T& b, bool arithmetic, const std::string& what) {
  if (same(a, b)) return true;
  const DType t = dtype_of<T>();
  if (!arithmetic || !is_nan_bits(t, &a) || !is_nan_bits(t, &b)) return false;
  ++nan_bit_diffs;
  if (print_nan_bits)
    std::printf("NANBITS %s %s %s\n", what.c_str(), bits(a).c_str(), bits(b).c_str());
  return true;
}

/// One launch: n sources of len elements (at element `offset` of 16-byte aligned storage), two
/// destinations; compares both with the host reduction.
template <typename T>
void check_case(DType dt, ReduceOp op, int n, i64 len, i64 offset, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n),
                                 std::vector<T>(static_cast<std::size_t>(len + offset + 16)));
  std::vector<const void*> srcs;
  std::vector<const T*> host;
  std::vector<double> scalars;
  std::uniform_int_distribution<int> small(-3, 3);
  for (int q = 0; q < n; ++q) {
    for (T& x : in[q]) x = draw<T>(gen);
    srcs.push_back(in[q].data() + offset);
    host.push_back(in[q].data() + offset);
    scalars.push_back(std::is_integral_v<T> ? double(small(gen)) : 0.375 * small(gen) - 0.1);
  }
  std::vector<std::vector<T>> out(2, std::vector<T>(static_cast<std::size_t>(len + offset + 16)));
  std::vector<void*> dsts = {out[0].data() + offset, out[1].data() + offset};
  const cudaError_t rc =
      cuda_emu::launch_comm_reduce(nullptr, srcs, dsts, len, dt, op, scalars.data());
  ++checks;
  const std::string ctx = std::string(dtype_name(dt)) + " " + reduce_op_name(op) + " n " +
                          std::to_string(n) + " len " + std::to_string(len) + " offset " +
                          std::to_string(offset);
  if (rc != 0) {
    ++failures;
    std::printf("FAIL %s: launch returned %d\n", ctx.c_str(), rc);
    return;
  }
  std::vector<T> sim(static_cast<std::size_t>(len));
  sim::reduce_over_ranks(srcs, sim.data(), len, dt, op, Determinism::bitwise, scalars.data());
  if (print_nan_bits) {  // the simulator's bytes, raw and with canonical NaNs (two builds diffed)
    auto fnv = [&](bool canonical) {
      std::vector<T> v = sim;
      if (canonical) canonicalize_nans(dt, v.data(), len);
      unsigned long long h = 1469598103934665603ull;
      const auto* b = reinterpret_cast<const unsigned char*>(v.data());
      for (std::size_t k = 0; k < v.size() * sizeof(T); ++k) h = (h ^ b[k]) * 1099511628211ull;
      return h;
    };
    std::printf("BITS comm %s sim=%016llx canonical=%016llx\n", ctx.c_str(), fnv(false), fnv(true));
  }
  const auto rop = static_cast<rmath::Op>(op);
  const bool copy = n == 1 && op != ReduceOp::avg && op != ReduceOp::premul_sum;
  for (i64 i = 0; i < len; ++i) {
    const T want = copy ? host[0][i] : rmath::finish<T>(tree(host, i, 0, n, rop, scalars), rop, n);
    const T from_sim = sim[static_cast<std::size_t>(i)];
    if (!same_value(from_sim, want, !copy, ctx + " host/sim")) {
      ++failures;
      std::printf("FAIL %s at %lld: host %s sim %s\n", ctx.c_str(), static_cast<long long>(i),
                  bits(want).c_str(), bits(from_sim).c_str());
      return;
    }
    for (int d = 0; d < 2; ++d) {
      const T got = static_cast<const T*>(dsts[static_cast<std::size_t>(d)])[i];
      if (!same_value(got, from_sim, !copy, ctx + " sim/cuda")) {
        ++failures;
        std::printf("FAIL %s dst %d at %lld: sim %s cuda %s\n", ctx.c_str(), d,
                    static_cast<long long>(i), bits(from_sim).c_str(), bits(got).c_str());
        return;
      }
    }
  }
  // Nothing outside [0, len) was written.
  for (int d = 0; d < 2; ++d)
    for (i64 i = 0; i < offset; ++i)
      if (!same(out[d][static_cast<std::size_t>(i)], T{})) {
        ++failures;
        std::printf("FAIL %s: wrote before the destination\n", ctx.c_str());
        return;
      }
}

/// f16 / bf16: 8 ranks whose sum rounded once differs from a left-to-right sum rounded to the
/// type at every step (what a naive kernel or a ring rounding per hop gives).
template <typename T>
void check_round_once(DType dt) {
  // 1 + 7 x (half an ulp of 1): each per-step add rounds back to 1 (ties to even), the f32 sum
  // keeps them and rounds once to 1 + 4 ulp (f16: 1 + 2^-8 after the tie; bf16 likewise).
  const float ulp = std::is_same_v<T, float16> ? std::ldexp(1.0f, -10) : std::ldexp(1.0f, -7);
  std::vector<T> x(8, T::from(ulp / 2));
  x[0] = T::from(1.0f);
  std::vector<const void*> srcs;
  for (const T& v : x) srcs.push_back(&v);
  T out{};
  std::vector<void*> dsts = {&out};
  cuda_emu::launch_comm_reduce(nullptr, srcs, dsts, 1, dt, ReduceOp::sum);
  float step = x[0].to_float();
  for (int q = 1; q < 8; ++q) step = T::from(step + x[q].to_float()).to_float();
  ++checks;
  const float once = T::from(1.0f + 7 * (ulp / 2)).to_float();
  if (out.to_float() != once || out.to_float() == step) {
    ++failures;
    std::printf("FAIL round once %s: got %g, rounded once %g, per step %g\n", dtype_name(dt),
                double(out.to_float()), double(once), double(step));
  }
}

}  // namespace

int main() {
  unsigned seed = 1;
  for (DType dt : kAllDTypes)
    visit_dtype(dt, [&](auto x) {
      using T = decltype(x);
      for (ReduceOp op : kOps)
        for (int n : {1, 2, 3, 4, 5, 6, 7, 8, 13, 33})
          for (i64 offset : {i64(0), i64(1)})
            if (offset == 0 || n == 1 || n == 3 || n == 8)  // misaligned: the run-time tree
              check_case<T>(dt, op, n, 16 / i64(sizeof(T)) * 5 + 3, offset, seed++);
    });
  // A copy moves the bits: a signalling f16 NaN stays as it is (a conversion would quieten it).
  {
    float16 snan{0x7C01}, out{};
    std::vector<const void*> srcs = {&snan};
    std::vector<void*> dsts = {&out};
    cuda_emu::launch_comm_reduce(nullptr, srcs, dsts, 1, DType::f16, ReduceOp::max);
    ++checks;
    if (out.bits != 0x7C01) {
      ++failures;
      std::printf("FAIL copy f16 sNaN: got 0x%x\n", unsigned(out.bits));
    }
  }
  check_round_once<float16>(DType::f16);
  check_round_once<bfloat16>(DType::bf16);
  std::printf("%d checks, %d failures, %d results equal as NaN only (Note [NaN bits])\n", checks,
              failures, nan_bit_diffs);
  return failures ? 1 : 0;
}
