// The parameters the ZeRO tests (tests/test_zero*.cpp) shard: seeded
// values of given shapes, the same on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/nn/module.h"
#include "core/optim/adamw.h"
#include "core/optim/optimizer.h"
#include "core/optim/zero.h"
#include "test_util.h"

namespace ditto::test {

/// Parameters "p0", "p1", ... of the given shapes on `dev` in dtype `dt`: random_values seeded by
/// 100 + their index (so the same on every rank), made in f32 and cast once.
inline std::vector<nn::Parameter> make_params(const std::vector<Shape>& shapes, const Device& dev,
                                              DType dt = DType::f32) {
  std::vector<nn::Parameter> ps;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    std::int64_t n = 1;
    for (std::int64_t d : shapes[i]) n *= d;
    nn::Parameter p;
    p.name = "p";  // appended, not "p" + to_string(i): GCC 12 warned -Wrestrict (a false
    p.name += std::to_string(i);  // positive) on that once test_zero.cpp's inlining changed
    p.data = Tensor::from_vector(
        random_values(static_cast<std::size_t>(n), 100 + static_cast<std::uint32_t>(i)), shapes[i],
        dev);
    if (dt != DType::f32) p.data = p.data.to(dt);
    ps.push_back(std::move(p));
  }
  return ps;
}

/// One thread per rank of a new communicator over sim:0..world-1 (run_ranks_ok).
inline void run_ranks(int world, Determinism mode,
                      const std::function<void(int, Communicator&)>& fn) {
  run_ranks_ok(world, mode, fn);
}

/// Shapes that cross block boundaries (9100, 20000 elements), small slots, 1-dim and 2-dim shapes
/// (AdamW's decay groups).
inline const std::vector<Shape> kShapes{{70, 130}, {130}, {10, 70}, {10}, {3, 5}, {20000}};

/// The bytes of each tensor of an optimizer's state, by name.
inline std::map<std::string, std::vector<std::uint8_t>> tensor_bytes(
    const optim::OptimizerState& s) {
  std::map<std::string, std::vector<std::uint8_t>> m;
  for (const auto& [name, t] : s.tensors) m[name] = tensor_bytes(t);
  return m;
}

/// ZeRO's inner optimizer with nanoGPT's AdamW settings (beta2 0.95, weight decay 0.1 on the
/// dim >= 2 tensors: AdamW's groups), at the learning rate ZeRO passes.
inline optim::ZeroInnerFactory zero_adamw() {
  return [](std::vector<nn::Parameter*> ps, float lr) {
    optim::AdamWOptions o;
    o.lr = lr;
    o.beta2 = 0.95;
    o.weight_decay = 0.1;
    return std::make_unique<optim::AdamW>(std::move(ps), o);
  };
}

/// Pointers to each of ps, in order (what an optimizer takes).
inline std::vector<nn::Parameter*> ptrs(std::vector<nn::Parameter>& ps) {
  std::vector<nn::Parameter*> v;
  for (auto& p : ps) v.push_back(&p);
  return v;
}

}  // namespace ditto::test
