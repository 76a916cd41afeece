// The case table of the backend-ops suite (tests/test_backend_ops.cpp): what a case body sees
// (OpRun: devices, mode, seeded inputs, the outputs it records with their double reference and
// error bound) and a registry through which other files add cases (test_backend_ops_gpt.cpp),
// so that every op runs through one table on every backend.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/numerics/determinism.h"
#include "core/numerics/random.h"
#include "core/runtime/device.h"
#include "core/runtime/tensor.h"

namespace ditto::test::backend_ops {

using Vec = std::vector<double>;

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

// One output of a case: the values the backend computed (f32 or i64, as doubles: exact), the
// double reference, the magnitude each element's error bound scales with, and the bound's factor.
struct Output {
  std::string name;
  Vec got, want, scale;
  double rtol = 0;  // |got - want| <= rtol * scale (+ 1e-37 for underflow); 0: exact
};

// What a case body sees: the devices it runs on, the mode, seeded inputs, and where its outputs go.
class OpRun {
 public:
  OpRun(std::string backend, Determinism mode, std::uint64_t seed)
      : dev(backend, 0), dev1(backend, 1), mode(mode), seed_(seed) {}

  const Device dev;   // where the op runs
  const Device dev1;  // a second device of the same backend (copies between devices)
  const Determinism mode;

  // n values in [-1, 1) scaled by 100, 1 and 0.01 in turn (the order of a sum shows in its
  // bits), from Philox keyed by the case's seed and the draw's index: the same on every backend.
  std::vector<float> values(std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    const std::uint64_t stream = stream_id(kStreamSynthetic, 4000 + draws_++);
    for (std::int64_t i = 0; i < n; ++i)
      v[static_cast<std::size_t>(i)] = (i % 3 == 0 ? 100.0f : i % 3 == 1 ? 1.0f : 0.01f) *
                                       uniform(seed_, stream, static_cast<std::uint64_t>(i), -1, 1);
    return v;
  }
  Tensor upload(const std::vector<float>& v, const Shape& s) const {
    return Tensor::from_vector(v, s, dev);
  }

  // Records output `name`: `got` computed on the backend, `want` and `scale` as in Output.
  void check(const std::string& name, const Tensor& got, Vec want, Vec scale, double rtol) {
    Output o{name, {}, std::move(want), std::move(scale), rtol};
    if (got.dtype() == DType::f32)
      for (float x : got.to_vector<float>()) o.got.push_back(x);
    else
      for (std::int64_t x : got.to_vector<std::int64_t>()) o.got.push_back(static_cast<double>(x));
    if (o.scale.empty()) o.scale.assign(o.want.size(), 0.0);
    outputs.push_back(std::move(o));
  }
  // An output whose result is exact (copies, fills, relu): the same value as `want`.
  void check_exact(const std::string& name, const Tensor& got, const std::vector<float>& want) {
    check(name, got, Vec(want.begin(), want.end()), {}, 0.0);
  }

  std::vector<Output> outputs;

 private:
  std::uint64_t seed_;
  int draws_ = 0;
};

struct OpCase {
  std::string name;  // [A-Za-z0-9_]
  std::function<void(OpRun&)> body;
};

inline Vec abs_of(const std::vector<float>& v) {
  Vec a;
  for (float x : v) a.push_back(std::fabs(x));
  return a;
}

/// Cases added by other files (RegisterOpCases at static initialisation); the table appends
/// them after its own. gtest evaluates the table's parameters after static initialisation.
inline std::vector<OpCase>& registered_op_cases() {
  static std::vector<OpCase> cases;
  return cases;
}

struct RegisterOpCases {
  explicit RegisterOpCases(std::vector<OpCase> cases) {
    for (OpCase& c : cases) registered_op_cases().push_back(std::move(c));
  }
};

}  // namespace ditto::test::backend_ops
