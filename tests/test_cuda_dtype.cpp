// GPU test of the CUDA backend's dtype-generic kernels on every dtype (review 3 of issue 29's GPU
// check: CudaDtypeKernels, cuda_kernels_dtype.cu). The training runs of the check reach them only
// for f32, bf16 and f16 (casts between those, zero fills, the bf16 reduce of DataParallel's
// gradients); DtypeTest (test_dtype.cpp) checks every dtype on the simulator only. Here every
// pair of the 12 dtypes through Kernels::cast (Tensor::to and ops::cast), fill_bits, add_any and
// scale_any on every dtype, and reduce_inputs with every op on every dtype, all on the conversions'
// hard values (ties, subnormals, overflow, signed zeros, inf, NaN, integer extremes): the bytes of
// the simulator's (the same per-element functions, dtype_math.h and reduce_math.h; bitwise mode
// for the floating reductions, both modes for the integer ones, which are exact), a NaN matching
// any NaN (a GPU's arithmetic gives its canonical NaN). Without a usable GPU the test reports
// SKIPPED with the reason; tools/gpu-check-tests.txt lists it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/numerics/dtype_math.h"
#include "core/numerics/random.h"
#include "core/runtime/dtype.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaDtypes = CudaSuite<>;  // kCudaTestDevices

// Doubles with the conversions' hard cases (test_dtype.cpp's, and random magnitudes).
std::vector<double> cuda_dtype_hard_values() {
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
  for (std::uint64_t i = 0; i < 150; ++i) {
    const double m = uniform(23, stream_id(kStreamSynthetic, 1400), i, -1.0f, 1.0f);
    const int e = static_cast<int>(i % 71) - 30;
    v.push_back(m * std::ldexp(1.0, e));
  }
  return v;
}

// A host tensor of dtype t holding convert<T>(v[i]).
Tensor cuda_dtype_host_tensor(DType t, const std::vector<double>& v) {
  Tensor h = Tensor::empty({static_cast<std::int64_t>(v.size())}, t, Device::cpu());
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(h.data_ptr());
    for (std::size_t i = 0; i < v.size(); ++i) p[i] = convert<T>(v[i]);
  });
  return h;
}

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
  const std::vector<double> v = cuda_dtype_hard_values();
  const Device cuda("cuda", 1), sim("sim", 1);
  for (DType from : kAllDTypes) {
    const Tensor h = cuda_dtype_host_tensor(from, v);
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
      Tensor a = cuda_dtype_host_tensor(t, v).to(d);
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
        in.push_back(cuda_dtype_host_tensor(t, r).to(d));
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
