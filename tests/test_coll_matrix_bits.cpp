// The f16 / bf16 bitwise rule of Note [Reductions over ranks] (the canonical tree accumulates in
// f32 and rounds once), shown on data whose sum depends on the order:
//  - SameBitsForAnyPowerOfTwoSplit: 8 leaves per element, held as 8 ranks x 1 (an f16 all_reduce),
//    1 device x 8 inputs (comm::reduce_add), and N = 1, 2, 4, 8 ranks x 8 / N leaves reduced as
//    DDP does (each rank's leaves exactly in f32 through the bitwise reduce_add: its subtree; the
//    N-rank f32 bitwise all_reduce; one rounding to f16): the same bits every way, and the
//    reference's (tests/test_coll_matrix_ref.h);
//  - SameBitsForAnySplitOfExactPartials: f16 all_reduce itself at 8, 4, 2 ranks over leaves whose
//    pair / quad partial sums are exact f16 values (so N ranks hold the 8 leaves' partials; one
//    rank cannot: that case is the reduce_add above);
//  - LeftToRightDiffers: on the same inputs a left-to-right sum (rounding to the dtype per step,
//    as a ring that rounds per hop does; and also in f32 rounding once) gives other bits for
//    many elements: the tests above can fail;
//  - EverySmallFloatCodeThroughEveryOp: every f16 / bf16 / fp8 code reduced with itself and with
//    its mirror over 2 ranks, every op, both modes (conversions at every boundary);
//  - IntegersAreExactInAnyOrder: for every integer dtype and op, fast == bitwise and a permutation
//    of the ranks' data gives the same bits.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/communicator.h"
#include "core/runtime/backend.h"
#include "test_coll_matrix_ref.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using Bits = std::vector<std::uint64_t>;

constexpr int kLeaves = 8;
constexpr std::int64_t kCount = 512;

std::vector<float> values_f32(DType t, const Bits& v) {
  std::vector<float> f;
  for (auto b : v) f.push_back(static_cast<float>(ref::value(t, b)));
  return f;
}
/// How many elements of a and b differ in their bits.
std::size_t differing(const Bits& a, const Bits& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}
std::string first_difference(DType t, const Bits& got, const Bits& want) {
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return detail::cat(differing(got, want), " of ", got.size(), " differ; first [", i,
                         "] got ", ref::show(t, got[i]), " expected ", ref::show(t, want[i]));
  return "same bits";
}

/// Leaf j of element i: a big value (+-2^big) or a small one (+-[1, 2) times 2^small). The bigs cancel in some orders and not in others, and the smalls
/// are below half an f32 ulp of the bigs, so the order of the f32 accumulation shows after the
/// rounding to f16 / bf16.
std::uint64_t order_sensitive_leaf(DType t, int j, std::int64_t i) {
  const std::uint64_t h = ref::hash(71, static_cast<std::uint64_t>(t), j, i);
  const int big = t == DType::f16 ? 12 : 100, small = t == DType::f16 ? -12 : 60;
  const double sign = (h >> 3) & 1 ? -1.0 : 1.0;
  if (h & 1) return ref::round_to(t, sign * std::ldexp(1.0, big));
  const double m = 1.0 + static_cast<double>((h >> 8) & 0x3ff) / 1024.0;
  return ref::round_to(t, sign * std::ldexp(m, small + static_cast<int>((h >> 20) % 3)));
}

/// leaves[j][i] for j < 8.
std::vector<Bits> leaves_of(DType t, std::uint64_t (*leaf)(DType, int, std::int64_t)) {
  std::vector<Bits> L(kLeaves, Bits(kCount));
  for (int j = 0; j < kLeaves; ++j)
    for (std::int64_t i = 0; i < kCount; ++i) L[j][i] = leaf(t, j, i);
  return L;
}

/// The reference: f16 / bf16 of the f32 canonical tree over the 8 leaves.
Bits reference_sum(DType t, const std::vector<Bits>& L) {
  Bits out;
  Bits leaf(kLeaves);
  const std::vector<double> no_scalars(kLeaves, 1.0);
  for (std::int64_t i = 0; i < kCount; ++i) {
    for (int j = 0; j < kLeaves; ++j) leaf[j] = L[j][i];
    out.push_back(ref::reduce(t, ref::Op::sum, leaf, no_scalars));
  }
  return out;
}

/// Left to right over the leaves; per_step: rounding to t after every add, else in f32 and once.
Bits left_to_right(DType t, const std::vector<Bits>& L, bool per_step) {
  Bits out;
  for (std::int64_t i = 0; i < kCount; ++i) {
    float acc = static_cast<float>(ref::value(t, L[0][i]));
    for (int j = 1; j < kLeaves; ++j) {
      acc += static_cast<float>(ref::value(t, L[j][i]));
      if (per_step) acc = static_cast<float>(ref::value(t, ref::round_to(t, acc)));
    }
    out.push_back(ref::round_to(t, acc));
  }
  return out;
}

class HalfBitwise : public ::testing::TestWithParam<DType> {
 protected:
  static void SetUpTestSuite() { init_sim(8); }
  static CommOptions bitwise() {
    CommOptions o;
    o.determinism = Determinism::bitwise;
    o.timeout_ms = 20000;
    return o;
  }
};

/// The bitwise sum all_reduce over held.size() ranks of held[r] (the simulator's): every rank's
/// result.
std::vector<Bits> all_reduce_bits(DType t, const std::vector<Bits>& held) {
  CommOptions o;
  o.determinism = Determinism::bitwise;
  o.timeout_ms = 20000;
  const int n = static_cast<int>(held.size());
  auto comms = Communicator::init_all(devices("sim", n), o);
  std::vector<Tensor> x;
  for (int r = 0; r < n; ++r) x.push_back(ref::make(t, held[r], comms[r].device()));
  all_reduce(comms, x);
  synchronize(comms);
  std::vector<Bits> out;
  for (const Tensor& v : x) out.push_back(ref::read(v));
  return out;
}

TEST_P(HalfBitwise, SameBitsForAnyPowerOfTwoSplit) {
  const DType t = GetParam();
  const std::vector<Bits> L = leaves_of(t, order_sensitive_leaf);
  const Bits want = reference_sum(t, L);

  // 8 ranks x 1 leaf: the dtype's own all_reduce.
  {
    const std::vector<Bits> results = all_reduce_bits(t, L);
    for (int r = 0; r < kLeaves; ++r) {
      const Bits& got = results[r];
      EXPECT_EQ(got, want) << dtype_name(t) << " all_reduce, 8 ranks, rank " << r << ": "
                           << first_difference(t, got, want);
    }
  }
  // 1 device x 8 inputs: torch.cuda.comm.reduce_add on the dtype.
  {
    std::vector<Tensor> in;
    for (int j = 0; j < kLeaves; ++j) in.push_back(ref::make(t, L[j], Device("sim", j)));
    try {
      const Bits got =
          ref::read(comm::reduce_add(in, Device("sim", 0), Determinism::bitwise));
      EXPECT_EQ(got, want) << dtype_name(t) << " reduce_add of 8 inputs: "
                           << first_difference(t, got, want);
    } catch (const std::exception& e) {
      ADD_FAILURE() << dtype_name(t) << " reduce_add of 8 inputs threw: " << e.what();
    }
  }
  // N ranks x 8 / N leaves: each rank's leaves exactly in f32, its subtree by the bitwise
  // reduce_add, the N-rank f32 bitwise all_reduce, one rounding.
  for (int n : {1, 2, 4, 8}) {
    auto comms = Communicator::init_all(devices("sim", n), bitwise());
    const int per = kLeaves / n;
    std::vector<Tensor> partial;
    for (int r = 0; r < n; ++r) {
      std::vector<Tensor> mine;
      for (int j = r * per; j < (r + 1) * per; ++j)
        mine.push_back(Tensor::from_vector(values_f32(t, L[j]), {kCount}, comms[r].device()));
      partial.push_back(comm::reduce_add(mine, comms[r].device(), Determinism::bitwise));
    }
    all_reduce(comms, partial);
    synchronize(comms);
    for (int r = 0; r < n; ++r) {
      Bits got;
      for (float f : partial[r].to_vector<float>()) got.push_back(ref::round_to(t, f));
      EXPECT_EQ(got, want) << dtype_name(t) << " " << n << " ranks x " << per
                           << " leaves, rank " << r << ": " << first_difference(t, got, want);
    }
  }
}

/// Leaves x0 x0 x0 x0 x1 x1 x1 x1 with |x0| in [2^10, 2^12) and x1 between a third and the whole
/// of an f16 ulp of 4 x0 (bf16: scaled): the pair (2 x) and quad (4 x) sums are exact, so N = 8, 4,
/// 2 ranks can hold the partials of the same 8 leaves; the one rounding of 4 x0 + 4 x1 keeps what
/// per-step rounding drops.
std::uint64_t exact_partials_leaf(DType t, int j, std::int64_t i) {
  const std::uint64_t h = ref::hash(83, static_cast<std::uint64_t>(t), j / 4, i);
  const int mant = ref::info(t).mant;
  const double sign = h & 1 ? -1.0 : 1.0;
  const int e0 = 10 + static_cast<int>((h >> 1) % 2);
  const double x0 = sign * std::ldexp(1.0 + static_cast<double>((h >> 8) & 0xff) / 256.0, e0);
  if (j < 4) return ref::round_to(t, x0);
  const double ulp4 = std::ldexp(1.0, e0 + 2 - mant);  // ulp of 4 x0 (upper bound)
  const double frac = 0.34 + 0.6 * static_cast<double>((h >> 20) & 0xff) / 256.0;
  return ref::round_to(t, ((h >> 30) & 1 ? -1.0 : 1.0) * frac * ulp4);
}

TEST_P(HalfBitwise, SameBitsForAnySplitOfExactPartials) {
  const DType t = GetParam();
  const std::vector<Bits> L = leaves_of(t, exact_partials_leaf);
  const Bits want = reference_sum(t, L);
  for (int n : {8, 4, 2}) {
    const int per = kLeaves / n;
    // Rank r's value: the exact sum of leaves [r * per, (r + 1) * per) (all equal: per * leaf).
    std::vector<Bits> held(n, Bits(kCount));
    for (int r = 0; r < n; ++r)
      for (std::int64_t i = 0; i < kCount; ++i) {
        const double v = per * ref::value(t, L[r * per][i]);
        held[r][i] = ref::round_to(t, v);
        ASSERT_EQ(ref::value(t, held[r][i]), v) << "partial not exact (test data)";
      }
    const std::vector<Bits> results = all_reduce_bits(t, held);
    for (int r = 0; r < n; ++r) {
      const Bits& got = results[r];
      EXPECT_EQ(got, want) << dtype_name(t) << " all_reduce over " << n << " ranks of "
                           << per << "-leaf partials, rank " << r << ": "
                           << first_difference(t, got, want);
    }
  }
  // And per-step rounding loses the smalls here.
  EXPECT_GT(differing(left_to_right(t, L, true), want), kCount / 4);
}

TEST_P(HalfBitwise, LeftToRightDiffers) {
  const DType t = GetParam();
  const std::vector<Bits> L = leaves_of(t, order_sensitive_leaf);
  const Bits got = all_reduce_bits(t, L)[0];
  const std::size_t per_step = differing(left_to_right(t, L, true), got);
  const std::size_t once = differing(left_to_right(t, L, false), got);
  std::printf("[matrix] %s: left-to-right differs from the bitwise all_reduce in %zu (per-step "
              "rounding) and %zu (f32, one rounding) of %lld elements\n",
              dtype_name(t), per_step, once, static_cast<long long>(kCount));
  EXPECT_GT(per_step, static_cast<std::size_t>(kCount / 16));
  EXPECT_GT(once, static_cast<std::size_t>(kCount / 16));
  // The reference itself is not left to right either (so the bits checks above can fail).
  EXPECT_GT(differing(left_to_right(t, L, false), reference_sum(t, L)),
            static_cast<std::size_t>(kCount / 16));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfBitwise, ::testing::Values(DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(dtype_name(info.param));
                         });

// Every code of the small float types through a 2-rank reduction, for every op: rank 0 holds
// code i, rank 1 code i again (doubling: ties, overflow to inf / NaN, subnormals) or the code
// 2^bits - 1 - i (opposite signs, NaN and inf against finite values, inf - inf). With two ranks
// every order is the same, so both modes must give the reference's bits; a NaN may be any NaN
// (which operand's payload an IEEE add keeps is the hardware's), and in fast mode min / max of +0
// and -0 may be either zero.
TEST(CollMatrixCodes, EverySmallFloatCodeThroughEveryOp) {
  init_sim(8);
  for (DType t : {DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2}) {
    const std::int64_t codes = std::int64_t(1) << ref::info(t).bits;
    for (bool mirrored : {false, true}) {
      std::vector<Bits> in(2, Bits(static_cast<std::size_t>(codes)));
      for (std::int64_t i = 0; i < codes; ++i) {
        in[0][i] = static_cast<std::uint64_t>(i);
        in[1][i] = static_cast<std::uint64_t>(mirrored ? codes - 1 - i : i);
      }
      for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
        CommOptions o;
        o.determinism = mode;
        auto comms = Communicator::init_all(devices("sim", 2), o);
        for (ref::Op op : ref::kAllOps) {
          const std::vector<double> scalars = {ref::scalar(t, 0), ref::scalar(t, 1)};
          std::vector<Tensor> x = {ref::make(t, in[0], comms[0].device()),
                                   ref::make(t, in[1], comms[1].device())};
          std::vector<Tensor> y = {Tensor::empty({codes}, t, comms[0].device()),
                                   Tensor::empty({codes}, t, comms[1].device())};
          if (op == ref::Op::premul_sum)
            all_reduce(comms, x, y, {PreMulSum{scalars[0]}, PreMulSum{scalars[1]}});
          else
            all_reduce(comms, x, y, static_cast<ReduceOp>(static_cast<int>(op)));
          synchronize(comms);
          const Bits got = ref::read(y[1]);
          std::size_t bad = 0;
          std::string first;
          for (std::int64_t i = 0; i < codes; ++i) {
            const std::uint64_t want = ref::reduce(t, op, {in[0][i], in[1][i]}, scalars);
            const double g = ref::value(t, got[i]), w = ref::value(t, want);
            const bool ok = got[i] == want || (std::isnan(g) && std::isnan(w)) ||
                            (mode == Determinism::fast && g == 0 && w == 0 &&
                             (op == ref::Op::min || op == ref::Op::max));
            if (!ok && bad++ == 0)
              first = detail::cat("code ", i, " and ", in[1][i], ": got ", ref::show(t, got[i]),
                                  " expected ", ref::show(t, want));
          }
          EXPECT_EQ(bad, 0u) << dtype_name(t) << " " << ref::op_name(op) << " "
                             << determinism_name(mode) << (mirrored ? " mirrored" : " doubled")
                             << ": " << bad << " of " << codes << " differ; first " << first;
        }
      }
    }
  }
}

// Integers wrap, and wrapping addition and multiplication are associative and commutative:
// every order gives the same bits, so fast == bitwise, and the ranks' data permuted (rank r
// holding rank 7 - r's) changes nothing.
TEST(CollMatrixIntegers, ExactInAnyOrder) {
  init_sim(8);
  constexpr int n = 8;
  constexpr std::int64_t count = 41;
  for (DType t : kAllDTypes) {
    if (ref::info(t).floating) continue;
    for (ref::Op op : ref::kAllOps) {
      if (op == ref::Op::premul_sum) continue;  // the scalar belongs to a rank: not permutable
      std::vector<Bits> results;
      for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
        for (bool reversed : {false, true}) {
          CommOptions o;
          o.determinism = mode;
          auto comms = Communicator::init_all(devices("sim", n), o);
          std::vector<Tensor> x;
          for (int r = 0; r < n; ++r) {
            Bits in(count);
            for (std::int64_t i = 0; i < count; ++i)
              in[i] = ref::input(t, op, reversed ? n - 1 - r : r, i);
            x.push_back(ref::make(t, in, comms[r].device()));
          }
          try {
            all_reduce(comms, x, static_cast<ReduceOp>(static_cast<int>(op)));
            synchronize(comms);
            results.push_back(ref::read(x[0]));
          } catch (const std::exception& e) {
            ADD_FAILURE() << dtype_name(t) << " " << ref::op_name(op) << " threw: " << e.what();
            results.push_back({});
          }
        }
      }
      for (std::size_t k = 1; k < results.size(); ++k)
        EXPECT_EQ(results[k], results[0]) << dtype_name(t) << " " << ref::op_name(op)
                                          << ": variant " << k << " (bitwise/fast x permuted)";
    }
  }
}

}  // namespace
}  // namespace ditto
