// Every dtype through Tensor and the dtype-generic ops on the simulator: creation (zeros, full),
// host round trips for each host type, copies between any two devices (bytes unchanged),
// conversion with Tensor::to(dtype) equal to convert<To> on the host for every pair, fill_, add,
// scale_ and reduce_inputs, the argument errors, and fp8 e4m3 / e5m2 conversion against a
// brute-force reference (the nearest of the 256 decoded values, ties to the even code, the
// overflow rule of Note [Small float conversions]). At the end, CudaDtypes: the dtype-generic ops
// on the CUDA backend against the simulator's bytes (GPU only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/comm/comm.h"
#include "core/comm/communicator.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using DtypeTest = test::SimSuite<4>;

using Bytes = std::vector<std::uint8_t>;

// Doubles with the conversions' hard cases (ties, subnormals, overflow, signed zeros, inf, NaN,
// integer extremes) and some random magnitudes.
std::vector<double> hard_values() {
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           1.5,
                           2.5,
                           -2.5,
                           65504.0,
                           65520.0,
                           65536.0,
                           448.0,
                           464.0,
                           57344.0,
                           61440.0,
                           3.0e38,
                           3.5e38,
                           6e-8,
                           2.98e-8,
                           1e-40,
                           1.0009765625,
                           1.00048828125,
                           1.001953125,
                           1.00390625,
                           127.0,
                           128.0,
                           255.0,
                           256.0,
                           -128.0,
                           -129.0,
                           2147483647.0,
                           2147483648.0,
                           -2147483649.0,
                           4294967296.0,
                           9.3e18,
                           1.9e19,
                           -9.3e18,
                           0.999999,
                           1e300,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()};
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-30, 40);
  for (int i = 0; i < 150; ++i) v.push_back(mant(gen) * std::ldexp(1.0, e(gen)));
  return v;
}

// A host tensor of dtype t holding convert<T>(v[i]).
Tensor host_tensor(DType t, const std::vector<double>& v) {
  Tensor h = Tensor::empty({static_cast<std::int64_t>(v.size())}, t, Device::cpu());
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(h.data_ptr());
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = convert<T>(v[i]);
  });
  return h;
}

// Found by a newcomer: enum values outside their enumeration were an InternalError from
// dtype_size (DType(12)) or silently accepted (Determinism(7)); fill_(u8, 3.0f) picked the
// f32-only overload and refused the tensor.
TEST_F(DtypeTest, EnumValuesOutsideTheirEnumerationAreInvalidArguments) {
  const auto bad = static_cast<DType>(12);
  EXPECT_THROW_MSG(Tensor::zeros({2}, bad, Device::cpu()), InvalidArgument,
                   "Tensor::empty: dtype: expected one of f32, i64, f64, f16, bf16, i8, u8, i32, "
                   "u32, u64, f8_e4m3, f8_e5m2, got DType value 12");
  Tensor x = Tensor::zeros({2}, DType::f32, Device("sim", 0));
  EXPECT_THROW_MSG(ops::cast(x, bad), InvalidArgument, "ops::cast: dtype: expected one of f32");
  EXPECT_THROW_MSG(x.to(bad), InvalidArgument, "Tensor::to: dtype: expected one of f32");
  CommOptions o;
  o.determinism = static_cast<Determinism>(7);
  EXPECT_THROW_MSG(Communicator::init_all({Device("sim", 0)}, o), InvalidArgument,
                   "Communicator::init_all: options.determinism: expected Determinism::fast or "
                   "Determinism::bitwise, got value 7");
  EXPECT_THROW_MSG(comm::reduce_add({x}, {}, static_cast<Determinism>(9)), InvalidArgument,
                   "comm::reduce_add: mode: expected Determinism::fast or Determinism::bitwise, "
                   "got value 9");
  Tensor u = Tensor::zeros({3}, DType::u8, Device("sim", 0));
  ops::fill_(u, 3.0f);
  EXPECT_EQ(u.to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{3, 3, 3}));
}

TEST_F(DtypeTest, ZerosAndFullEveryDtypeOnHostAndDevice) {
  for (DType t : kAllDTypes)
    for (const Device& d : {Device::cpu(), Device("sim", 1)}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " on " + d.str());
      Tensor z = Tensor::zeros({3, 5}, t, d);
      EXPECT_EQ(z.dtype(), t);
      EXPECT_EQ(tensor_bytes(z), Bytes(15 * dtype_size(t), 0));
      Tensor f = Tensor::full({7}, -2.75, t, d);
      Bytes want;
      visit_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        const T x = convert<T>(-2.75);
        for (int i = 0; i < 7; ++i) {
          const auto* p = reinterpret_cast<const std::uint8_t*>(&x);
          want.insert(want.end(), p, p + sizeof(T));
        }
      });
      EXPECT_EQ(tensor_bytes(f), want);
    }
  // Real values: -2.75 truncates to -2 (i8), wraps nothing, saturates 300 to 255 (u8).
  EXPECT_EQ(Tensor::full({2}, -2.75, DType::i8, Device("sim", 0)).to_vector<std::int8_t>(),
            (std::vector<std::int8_t>{-2, -2}));
  EXPECT_EQ(Tensor::full({1}, 300.0, DType::u8, Device("sim", 0)).item<std::uint8_t>(), 255);
  EXPECT_EQ(Tensor::full({1}, 1.0 / 3.0, DType::bf16, Device("sim", 0)).item<bfloat16>().bits,
            0x3EABu);  // torch.tensor(1/3, dtype=torch.bfloat16).view(torch.int16) == 0x3eab
  EXPECT_EQ(Tensor::full({1}, 0.1, DType::f16, Device("sim", 0)).item<float16>().bits, 0x2E66u);
  // The f32 overload is unchanged: the same bits as full(shape, float, device).
  EXPECT_EQ(bits(Tensor::full({3}, 0.1, DType::f32, Device("sim", 0))),
            bits(Tensor::full({3}, 0.1f, Device("sim", 0))));
}

template <typename T>
void round_trip(const Device& d, const std::vector<T>& v) {
  Tensor t = Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}, d);
  EXPECT_EQ(t.dtype(), dtype_of<T>());
  EXPECT_EQ(t.device(), d);
  const std::vector<T> back = t.to_vector<T>();
  ASSERT_EQ(back.size(), v.size());
  EXPECT_EQ(std::memcmp(back.data(), v.data(), v.size() * sizeof(T)), 0)
      << dtype_name(dtype_of<T>());
}

TEST_F(DtypeTest, FromVectorToVectorRoundTripEveryHostType) {
  for (const Device& d : {Device::cpu(), Device("sim", 2)}) {
    round_trip<float>(d, {1.5f, -0.0f, 3e38f});
    round_trip<std::int64_t>(d, {std::numeric_limits<std::int64_t>::min(), -1, 7});
    round_trip<double>(d, {0.1, -1e300, 5e-324});
    round_trip<float16>(d, {float16{0x7C00}, float16{0x0001}, float16{0x7E01}});
    round_trip<bfloat16>(d, {bfloat16{0xFF80}, bfloat16{0x3F80}, bfloat16{0x0001}});
    round_trip<std::int8_t>(d, {-128, 127, 0});
    round_trip<std::uint8_t>(d, {0, 255, 17});
    round_trip<std::int32_t>(d, {std::numeric_limits<std::int32_t>::min(), 5, -5});
    round_trip<std::uint32_t>(d, {0xFFFFFFFFu, 0u, 123u});
    round_trip<std::uint64_t>(d, {~std::uint64_t(0), 0u, 1u});
    round_trip<float8_e4m3>(d, {float8_e4m3{0x7E}, float8_e4m3{0x7F}, float8_e4m3{0x81}});
    round_trip<float8_e5m2>(d, {float8_e5m2{0x7C}, float8_e5m2{0x7B}, float8_e5m2{0x01}});
  }
  Tensor t = Tensor::from_vector(std::vector<std::int32_t>{1, 2}, {2}, Device("sim", 0));
  EXPECT_THROW_MSG(t.to_vector<float>(), InvalidArgument,
                   "Tensor::to_vector: tensor is i32, asked for f32");
  EXPECT_THROW_MSG(t.item<std::int32_t>(), InvalidArgument,
                   "Tensor::item: expected a one-element i32 tensor, got [2] i32 on sim:0");
  EXPECT_THROW_MSG(Tensor::from_vector(std::vector<bfloat16>(3), {2}), InvalidArgument,
                   "Tensor::from_vector: expected 2 values for shape [2], got 3");
  EXPECT_EQ(Tensor::zeros({2, 3}, DType::bf16, Device("sim", 3)).str(), "[2, 3] bf16 on sim:3");
  EXPECT_EQ(Tensor::zeros({1}, DType::f8_e4m3, Device::cpu()).str(), "[1] f8_e4m3 on cpu");
}

TEST_F(DtypeTest, CopiesBetweenAnyTwoDevicesKeepTheBytes) {
  const std::vector<double> v = hard_values();
  const std::vector<Device> devs = {Device::cpu(), Device("sim", 0), Device("sim", 3)};
  for (DType t : kAllDTypes) {
    const Tensor h = host_tensor(t, v);
    const Bytes want = tensor_bytes(h);
    for (const Device& a : devs)
      for (const Device& b : devs) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + a.str() + " -> " + b.str());
        Tensor src = h.to(a);
        Tensor dst = src.to(b);
        EXPECT_EQ(dst.dtype(), t);
        EXPECT_EQ(tensor_bytes(dst), want);
        Tensor into = Tensor::zeros({static_cast<std::int64_t>(v.size())}, t, b);
        into.copy_(src);
        EXPECT_EQ(tensor_bytes(into), want);
        // A narrowed view travels as its own bytes.
        Tensor part = src.narrow(3, 5).to(b);
        EXPECT_EQ(tensor_bytes(part),
                  Bytes(want.begin() + 3 * dtype_size(t), want.begin() + 8 * dtype_size(t)));
      }
  }
  Tensor a = Tensor::zeros({2}, DType::f16, Device("sim", 0));
  EXPECT_THROW_MSG(a.copy_(Tensor::zeros({2}, DType::bf16, Device("sim", 1))), InvalidArgument,
                   "Tensor::copy_: expected src [2] f16, got [2] bf16 on sim:1");
}

TEST_F(DtypeTest, ToDtypeEqualsConvertOnTheHostForEveryPair) {
  const std::vector<double> v = hard_values();
  for (DType from : kAllDTypes) {
    const Tensor h = host_tensor(from, v);
    const Tensor dev = h.to(Device("sim", 1));
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      Bytes want(v.size() * dtype_size(to));
      visit_dtype(from, [&](auto ftag) {
        using F = decltype(ftag);
        visit_dtype(to, [&](auto ttag) {
          using T = decltype(ttag);
          for (std::size_t i = 0; i < v.size(); ++i) {
            const T y = convert<T>(static_cast<const F*>(h.data_ptr())[i]);
            std::memcpy(want.data() + i * sizeof(T), &y, sizeof(T));
          }
        });
      });
      Tensor on_host = h.to(to), on_dev = dev.to(to), cast = ops::cast(dev, to);
      EXPECT_EQ(on_dev.device(), Device("sim", 1));
      EXPECT_EQ(on_dev.dtype(), to);
      EXPECT_EQ(tensor_bytes(on_host), want);
      EXPECT_EQ(tensor_bytes(on_dev), want);
      EXPECT_EQ(tensor_bytes(cast), want);
      EXPECT_EQ(tensor_bytes(dev.to(Device("sim", 2), to)), want);
      if (from == to) {
        EXPECT_EQ(on_dev.data_ptr(), dev.data_ptr());  // torch: .to(same dtype) is self
      }
    }
  }
  // A few values by hand (torch 1.13 agrees): RNE ties, saturation, NaN -> 0, wrap.
  const Device d("sim", 0);
  auto f32 = [&](std::vector<float> x) {
    return Tensor::from_vector(x, {std::int64_t(x.size())}, d);
  };
  EXPECT_EQ(f32({2.5f, -2.5f, 1e10f, NAN}).to(DType::i32).to_vector<std::int32_t>(),
            (std::vector<std::int32_t>{2, -2, std::numeric_limits<std::int32_t>::max(), 0}));
  EXPECT_EQ(f32({1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f}).to(DType::f16).to_vector<float16>(),
            (std::vector<float16>{{0x3C00}, {0x3C02}}));  // ties to even
  EXPECT_EQ(Tensor::from_vector(std::vector<std::int32_t>{300, -1}, {2}, d)
                .to(DType::u8)
                .to_vector<std::uint8_t>(),
            (std::vector<std::uint8_t>{44, 255}));  // int -> int wraps
}

TEST_F(DtypeTest, FillAddScaleOnEveryDtype) {
  const Device d("sim", 1);
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    Tensor x = Tensor::zeros({5}, t, d);
    ops::fill_(x, 3.0);
    EXPECT_EQ(tensor_bytes(x), tensor_bytes(Tensor::full({5}, 3.0, t, Device::cpu())));
    Tensor y = ops::add_any(x, x);
    EXPECT_EQ(tensor_bytes(y), tensor_bytes(Tensor::full({5}, 6.0, t, Device::cpu())));
    const double alpha = is_signed(t) ? -2.0 : 2.0;  // unsigned: alpha must be representable
    ops::scale_any_(y, alpha);
    EXPECT_EQ(tensor_bytes(y), tensor_bytes(Tensor::full({5}, 6.0 * alpha, t, Device::cpu())));
  }
  // f16: 2048 + 1 rounds to even (2048), computed in f32 and rounded once.
  Tensor a = Tensor::full({1}, 2048.0, DType::f16, d), b = Tensor::full({1}, 1.0, DType::f16, d);
  EXPECT_EQ(ops::add_any(a, b).item<float16>().bits, 0x6800u);
  EXPECT_EQ(ops::add_any(a, ops::add_any(b, b)).item<float16>().bits, 0x6801u);  // 2050
  // Integers wrap; f32 keeps today's bits (the f32 fill_).
  Tensor i8 = Tensor::full({1}, 100.0, DType::i8, d);
  EXPECT_EQ(ops::add_any(i8, i8).item<std::int8_t>(), -56);
  Tensor f = Tensor::zeros({3}, DType::f32, d), g = Tensor::zeros({3}, DType::f32, d);
  ops::fill_(f, 0.1);
  ops::fill_(g, 0.1f);
  EXPECT_EQ(bits(f), bits(g));
  // Errors.
  Tensor i = Tensor::zeros({2}, DType::i32, d);
  EXPECT_THROW_MSG(ops::scale_any_(i, 0.5), InvalidArgument,
                   "ops::scale_any_: alpha: expected an integer value representable in i32 "
                   "(x is [2] i32 on sim:1), got 0.5");
  EXPECT_THROW_MSG(ops::scale_any_(i, 1e10), InvalidArgument, "representable in i32");
  Tensor u = Tensor::zeros({2}, DType::u8, d);
  EXPECT_THROW_MSG(ops::scale_any_(u, -1.0), InvalidArgument, "representable in u8");
  // Wrapping multiply: 100 * 3 = 300 = 44 mod 256.
  Tensor w = Tensor::full({1}, 100.0, DType::u8, d);
  ops::scale_any_(w, 3.0);
  EXPECT_EQ(w.item<std::uint8_t>(), 44);
  EXPECT_THROW_MSG(ops::add_any(i, Tensor::zeros({2}, DType::u32, d)), InvalidArgument,
                   "ops::add_any: b: expected dtype i32, got [2] u32 on sim:1");
  EXPECT_THROW_MSG(ops::add_any(i, Tensor::zeros({3}, DType::i32, d)), InvalidArgument,
                   "ops::add_any: b: expected [2] (the shape of a), got [3] i32 on sim:1");
  Tensor host = Tensor::zeros({2}, DType::bf16, Device::cpu());
  EXPECT_THROW_MSG(
      ops::fill_(host, 1.0), InvalidArgument,
      "ops::fill_: x: expected a tensor on a device (sim or cuda), got [2] bf16 on cpu");
}

TEST_F(DtypeTest, ReduceInputsEveryOpOnIntegersAndTheErrors) {
  const Device d("sim", 0);
  auto i32 = [&](std::vector<std::int32_t> v) { return Tensor::from_vector(v, {3}, d); };
  std::vector<Tensor> in = {i32({7, -7, std::numeric_limits<std::int32_t>::max()}), i32({-2, 2, 1}),
                            i32({4, 5, 0})};
  const std::vector<std::vector<std::int32_t>> want = {
      {9, 0, std::numeric_limits<std::int32_t>::min()},       // sum wraps
      {-56, -70, 0},                                          // prod
      {-2, -7, 0},                                            // min
      {7, 5, std::numeric_limits<std::int32_t>::max()},       // max
      {3, 0, std::numeric_limits<std::int32_t>::min() / 3}};  // avg: wrapped sum / 3, truncated
  for (int op = 0; op <= 4; ++op)
    for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
      Tensor out = Tensor::zeros({3}, DType::i32, d);
      ops::reduce_inputs(in, out, op, mode);
      EXPECT_EQ(out.to_vector<std::int32_t>(), want[static_cast<std::size_t>(op)]) << "op " << op;
    }
  Tensor out = Tensor::zeros({3}, DType::i32, d);
  EXPECT_THROW_MSG(ops::reduce_inputs(in, out, 5, Determinism::fast), InvalidArgument,
                   "ops::reduce_inputs: op: expected sum, prod, min, max or avg (0..4), got 5");
  EXPECT_THROW_MSG(ops::reduce_inputs({}, out, 0, Determinism::fast), InvalidArgument,
                   "ops::reduce_inputs: inputs: expected at least one tensor, got none");
  std::vector<Tensor> mixed = {in[0], Tensor::zeros({3}, DType::u32, d)};
  EXPECT_THROW_MSG(ops::reduce_inputs(mixed, out, 0, Determinism::fast), InvalidArgument,
                   "ops::reduce_inputs: inputs[1]: expected dtype i32, got [3] u32 on sim:0");
}

// ---- fp8 against a brute-force reference
// ---------------------------------------------------------

struct Fp8Spec {
  int e, m;
  bool inf;  // e5m2: IEEE-like (inf, NaNs); e4m3fn: no inf, NaN = S.1111.111
};

// The value of `code`, decoded from the format's definition (not float_formats.h); NaN for NaN.
double fp8_decode(const Fp8Spec& f, unsigned code) {
  const int bias = (1 << (f.e - 1)) - 1;
  const unsigned sign = code >> 7, field = (code >> f.m) & ((1u << f.e) - 1),
                 mant = code & ((1u << f.m) - 1);
  double v;
  if (f.inf && field == (1u << f.e) - 1)
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::nan("");
  else if (!f.inf && (code & 0x7F) == 0x7F)
    v = std::nan("");
  else if (field == 0)
    v = std::ldexp(double(mant), 1 - bias - f.m);
  else
    v = std::ldexp(1.0 + double(mant) / (1 << f.m), int(field) - bias);
  return sign ? -v : v;
}

// The nearest code to x (ties to the even code), past the largest finite value the overflow
// code (inf for e5m2, NaN for e4m3fn) when x rounds beyond it, as an unbounded format would.
unsigned fp8_reference(const Fp8Spec& f, float x) {
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isnan(x)) return 0xFFu;  // compared as "is NaN"
  const double a = std::fabs(double(x));
  const unsigned overflow = f.inf ? (((1u << f.e) - 1) << f.m) : 0x7Fu;
  if (std::isinf(x)) return sign | overflow;
  // Candidates: every non-negative finite code, and the next value of an unbounded format
  // (max + one quantum) standing for the overflow code.
  unsigned best = 0;
  double best_d = a;
  unsigned max_code = 0;
  for (unsigned c = 0; c < 0x80; ++c) {
    const double v = fp8_decode(f, c);
    if (!std::isfinite(v)) continue;
    max_code = c;
    const double d = std::fabs(a - v);
    if (d < best_d || (d == best_d && (c & 1u) == 0)) best = c, best_d = d;
  }
  const double maxv = fp8_decode(f, max_code);
  const double next = maxv + (maxv - fp8_decode(f, max_code - 1));
  const double d = std::fabs(a - next);
  // The overflow code's "mantissa" is even for e5m2 (inf = 1.0 x 2^16) and odd for e4m3fn.
  if (a > next || d < best_d || (d == best_d && f.inf)) return sign | overflow;
  return sign | best;
}

template <typename T>
void check_fp8_exhaustive(const Fp8Spec& f) {
  // Every decoded value, the midpoints of neighbours, one f32 ulp either side of those, f32
  // subnormals, huge values, and random floats over the range.
  std::vector<float> xs = {0.0f,  -0.0f,  1e-45f,   -1e-45f,   1e-39f,
                           3e38f, -3e38f, INFINITY, -INFINITY, NAN};
  std::vector<double> vals;
  for (unsigned c = 0; c < 0x80; ++c)
    if (std::isfinite(fp8_decode(f, c))) vals.push_back(fp8_decode(f, c));
  vals.push_back(vals.back() + (vals.back() - vals[vals.size() - 2]));
  for (std::size_t i = 0; i < vals.size(); ++i) {
    for (double s : {1.0, -1.0}) {
      xs.push_back(float(s * vals[i]));
      if (i + 1 < vals.size()) {
        const float mid = float(s * (vals[i] + vals[i + 1]) / 2);
        xs.push_back(mid);
        xs.push_back(std::nextafter(mid, INFINITY));
        xs.push_back(std::nextafter(mid, -INFINITY));
      }
    }
  }
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-22, 18);
  for (int i = 0; i < 2000; ++i) xs.push_back(std::ldexp(mant(gen), e(gen)));
  Tensor t = Tensor::from_vector(xs, {std::int64_t(xs.size())}, Device("sim", 0));
  const std::vector<T> got = t.to(dtype_of<T>()).template to_vector<T>();
  int bad = 0;
  for (std::size_t i = 0; i < xs.size() && bad < 5; ++i) {
    const unsigned want = fp8_reference(f, xs[i]);
    const bool ok = want == 0xFFu ? std::isnan(fp8_decode(f, got[i].bits)) : got[i].bits == want;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << dtype_name(dtype_of<T>()) << " of " << xs[i] << " (" << std::hexfloat
                    << xs[i] << std::defaultfloat << "): got 0x" << std::hex
                    << unsigned(got[i].bits) << ", want 0x" << want << std::dec;
    }
  }
  // And back: small -> f32 is exact for every code.
  std::vector<T> codes(256);
  for (unsigned c = 0; c < 256; ++c) codes[c].bits = static_cast<std::uint8_t>(c);
  const std::vector<float> back = Tensor::from_vector(codes, {256}, Device("sim", 1))
                                      .to(DType::f32)
                                      .template to_vector<float>();
  for (unsigned c = 0; c < 256; ++c) {
    const double v = fp8_decode(f, c);
    if (std::isnan(v))
      EXPECT_TRUE(std::isnan(back[c])) << c;
    else
      EXPECT_EQ(double(back[c]), v) << "code " << c;
  }
}

TEST_F(DtypeTest, Fp8ConversionsMatchABruteForceReference) {
  check_fp8_exhaustive<float8_e4m3>({4, 3, false});
  check_fp8_exhaustive<float8_e5m2>({5, 2, true});
  // The rule's edges by hand: e4m3 464 ties to 448, past it NaN; e5m2 61440 ties to inf.
  const Device d("sim", 0);
  Tensor x = Tensor::from_vector(std::vector<float>{464.0f, 465.0f, 61440.0f, 61439.0f}, {4}, d);
  const auto e4 = x.to(DType::f8_e4m3).to_vector<float8_e4m3>();
  EXPECT_EQ(e4[0].bits, 0x7Eu);
  EXPECT_EQ(e4[1].bits, 0x7Fu);
  const auto e5 = x.to(DType::f8_e5m2).to_vector<float8_e5m2>();
  EXPECT_EQ(e5[2].bits, 0x7Cu);
  EXPECT_EQ(e5[3].bits, 0x7Bu);
}

// ---- the same on the CUDA backend (review 3 of issue 29's GPU check) ---------------------------
// The CUDA backend's dtype-generic kernels (CudaDtypeKernels, cuda_kernels_dtype.cu), which the
// check's training runs reach only for f32, bf16 and f16 (casts between those, zero fills, the
// bf16 reduce of DataParallel's gradients): every pair of the 12 dtypes through Kernels::cast
// (Tensor::to and ops::cast), fill_bits, add_any and scale_any on every dtype, and reduce_inputs
// with every op on every dtype, all on hard_values(): the simulator's bytes (the same per-element
// functions, dtype_math.h and reduce_math.h; bitwise mode for the floating reductions, both modes
// for the integer ones, which are exact), a NaN matching any NaN (a GPU's arithmetic gives its
// canonical NaN). Without a usable GPU the test reports SKIPPED with the reason;
// tools/gpu-check-tests.txt lists it.

using CudaDtypes = CudaSuite<>;  // kCudaTestDevices

// Success when `got` and `want` (one dtype, any devices) hold the same bytes, except that a NaN
// matches any NaN of a floating dtype: a GPU's arithmetic returns its canonical NaN (and a
// conversion may keep it), whose bits the host's need not have (CudaFixes.NanCasts* checks the
// casts' NaN bits where they are defined).
::testing::AssertionResult cuda_dtype_same(const Tensor& got, const Tensor& want) {
  const std::vector<std::uint8_t> gb = tensor_bytes(got), wb = tensor_bytes(want);
  if (gb.size() != wb.size())
    return ::testing::AssertionFailure() << gb.size() << " bytes vs " << wb.size();
  const std::size_t es = dtype_size(got.dtype());
  const std::vector<double> gv = got.to(Device::cpu()).to(DType::f64).to_vector<double>(),
                            wv = want.to(Device::cpu()).to(DType::f64).to_vector<double>();
  std::size_t differ = 0, first = 0;
  for (std::size_t e = 0; e < gv.size(); ++e) {
    if (std::equal(gb.begin() + e * es, gb.begin() + (e + 1) * es, wb.begin() + e * es)) continue;
    if (is_floating(got.dtype()) && std::isnan(gv[e]) && std::isnan(wv[e])) continue;
    if (differ++ == 0) first = e;
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << gv.size() << " elements differ; first at " << first << ": "
         << gv[first] << " vs " << wv[first];
}

TEST_F(CudaDtypes, CastFillAddScaleAndReduceInputsOfEveryDtypeEqualTheSimulator) {
  const std::vector<double> v = hard_values();
  const Device cuda("cuda", 1), sim("sim", 1);
  for (DType from : kAllDTypes) {
    const Tensor h = host_tensor(from, v);
    const Tensor on_cuda = h.to(cuda), on_sim = h.to(sim);
    for (DType to : kAllDTypes) {
      SCOPED_TRACE(std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to));
      const Tensor want = on_sim.to(to);
      EXPECT_TRUE(cuda_dtype_same(on_cuda.to(to), want));
      EXPECT_TRUE(cuda_dtype_same(ops::cast(on_cuda, to), want));
    }
  }
  for (DType t : kAllDTypes) {
    SCOPED_TRACE(dtype_name(t));
    auto run = [&](const Device& d) {
      std::vector<Tensor> out;              // host copies
      Tensor x = Tensor::zeros({5}, t, d);  // fill_bits
      out.push_back(x.to(Device::cpu()));
      ops::fill_(x, 3.0);
      out.push_back(x.to(Device::cpu()));
      Tensor a = host_tensor(t, v).to(d);
      Tensor y = ops::add_any(a, a);  // the hard values doubled: overflow, wrap, NaN
      out.push_back(y.to(Device::cpu()));
      ops::scale_any_(y, is_signed(t) ? -3.0 : 3.0);
      out.push_back(y.to(Device::cpu()));
      // reduce_inputs of three inputs (the hard values rotated), every op; the floating types in
      // bitwise mode (the canonical tree), the integers in both modes (exact).
      const std::int64_t n = static_cast<std::int64_t>(v.size());
      std::vector<Tensor> in;
      for (std::int64_t k = 0; k < 3; ++k) {
        std::vector<double> r(v.size());
        for (std::size_t i = 0; i < v.size(); ++i)
          r[i] = v[(i + static_cast<std::size_t>(k) * 7) % v.size()];
        in.push_back(host_tensor(t, r).to(d));
      }
      for (int op = 0; op <= 4; ++op)
        for (Determinism mode : {Determinism::bitwise, Determinism::fast}) {
          if (mode == Determinism::fast && is_floating(t)) continue;
          Tensor o = Tensor::zeros({n}, t, d);
          ops::reduce_inputs(in, o, op, mode);
          out.push_back(o.to(Device::cpu()));
        }
      return out;
    };
    const std::vector<Tensor> want = run(sim), got = run(cuda);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(cuda_dtype_same(got[k], want[k])) << "output " << k;
  }
}

}  // namespace
}  // namespace ditto
