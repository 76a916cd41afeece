// parallel::DistributedDataParallel with bf16 / f16 parameters (Note [DDP gradient dtype]): the
// bucket dtype follows the grad dtype rule (fast: the parameter's, bitwise: f32), models of mixed
// dtypes get a bucket sequence per dtype as torch's compute_bucket_assignment_by_size, the
// all_reduce sums in the bucket's dtype (averaging too), and grads a module allocated in another
// dtype are converted into their slot. A module that writes rank-dependent gradients stands in
// for a layer, so the exact sums are known.
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/comm/communicator.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using parallel::DistributedDataParallel;
using parallel::DistributedDataParallelOptions;

/// A layer whose backward sets parameter i's grad to (rank + 1) * (i + 1) * [1, 2, ..., n] in
/// `grad_dtype` (none: the parameter's dtype): sums small integers, exact in bf16 and f16.
class GradWriter : public nn::Module {
 public:
  GradWriter(std::vector<std::pair<std::int64_t, DType>> params, const Device& d, int rank,
             std::optional<DType> grad_dtype)
      : rank_(rank), grad_dtype_(grad_dtype) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto p = std::make_unique<nn::Parameter>();
      // 'p' then the index; "p" + std::to_string(i) trips GCC 12's -Wrestrict false positive
      // (PR105329).
      p->name = std::to_string(i);
      p->name.insert(p->name.begin(), 'p');
      p->data = Tensor::zeros({params[i].first}, params[i].second, d);
      params_.push_back(std::move(p));
    }
  }
  std::string name() const override { return "GradWriter"; }
  Tensor forward(const Tensor& x) override { return x; }
  Tensor backward(const Tensor&) override {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter& p = *params_[i];
      std::vector<float> v(static_cast<std::size_t>(p.data.numel()));
      for (std::size_t j = 0; j < v.size(); ++j)
        v[j] = static_cast<float>((rank_ + 1) * (i + 1) * (j + 1));
      p.grad = Tensor::from_vector(v, {p.data.numel()}, p.data.device())
                   .to(grad_dtype_.value_or(p.data.dtype()));
    }
    return Tensor();
  }
  std::vector<nn::Parameter*> parameters() override {
    std::vector<nn::Parameter*> out;
    for (auto& p : params_) out.push_back(p.get());
    return out;
  }
  std::unique_ptr<nn::Module> clone() const override { return nullptr; }

 private:
  int rank_;
  std::optional<DType> grad_dtype_;
  std::vector<std::unique_ptr<nn::Parameter>> params_;
};

void run_ranks(int world, Determinism mode, const std::function<void(int, Communicator&)>& fn) {
  test::init_sim(8);
  test::run_ranks_ok(world, mode, fn);
}

/// sum over ranks r < world of (r + 1) * (i + 1) * (j + 1), divided by `div`.
std::vector<float> expected(int world, std::size_t i, std::int64_t n, float div = 1) {
  std::vector<float> v;
  for (std::int64_t j = 0; j < n; ++j)
    v.push_back(static_cast<float>(world * (world + 1) / 2 * (i + 1) * (j + 1)) / div);
  return v;
}

TEST(DdpDtype, FastModeReducesEachDtypeInItsOwnBuckets) {
  const int world = 4;
  // Reverse order: p3 bf16 (8 B), p2 f32 (16 B, closes the f32 bucket at the 16 B first cap),
  // p1 bf16 (the bf16 bucket reaches 16 B), p0 f32 (left open, then flushed): torch's keyed
  // assignment gives [[2], [3, 1], [0]].
  const std::vector<std::pair<std::int64_t, DType>> shapes{
      {4, DType::f32}, {4, DType::bf16}, {4, DType::f32}, {4, DType::bf16}};
  run_ranks(world, Determinism::fast, [&](int r, Communicator& comm) {
    GradWriter m(shapes, comm.device(), r, std::nullopt);
    DistributedDataParallelOptions o;
    o.first_bucket_cap_mb = o.bucket_cap_mb = 16.0 / (1024.0 * 1024.0);
    o.average_gradients = false;
    DistributedDataParallel ddp(m, comm, o);
    ASSERT_EQ(ddp.bucket_indices(), (std::vector<std::vector<std::size_t>>{{2}, {3, 1}, {0}}));
    EXPECT_EQ(ddp.bucket_dtype(0), DType::f32);
    EXPECT_EQ(ddp.bucket_dtype(1), DType::bf16);
    EXPECT_EQ(ddp.bucket_dtype(2), DType::f32);
    ddp.forward(Tensor::zeros({1}, DType::f32, comm.device()));
    ddp.backward(Tensor::zeros({1}, DType::f32, comm.device()));
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const nn::Parameter& p = *m.parameters()[i];
      EXPECT_EQ(p.grad.dtype(), shapes[i].second) << p.name;
      EXPECT_EQ(p.grad.to(DType::f32).to_vector<float>(), expected(world, i, 4)) << p.name;
    }
  });
}

TEST(DdpDtype, F16AndBf16AverageInTheirDtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    const int world = 2;
    run_ranks(world, Determinism::fast, [&](int r, Communicator& comm) {
      GradWriter m({{6, dt}, {3, dt}}, comm.device(), r, std::nullopt);
      DistributedDataParallel ddp(m, comm, {});  // average_gradients = true
      ASSERT_EQ(ddp.bucket_indices().size(), 1u);
      EXPECT_EQ(ddp.bucket_dtype(0), dt);
      ddp.forward(Tensor::zeros({1}, DType::f32, comm.device()));
      ddp.backward(Tensor::zeros({1}, DType::f32, comm.device()));
      for (std::size_t i = 0; i < 2; ++i) {
        const nn::Parameter& p = *m.parameters()[i];
        EXPECT_EQ(p.grad.dtype(), dt);
        EXPECT_EQ(p.grad.to(DType::f32).to_vector<float>(),
                  expected(world, i, p.data.numel(), 2.0f))
            << dtype_name(dt) << " " << p.name;
      }
    });
  }
}

TEST(DdpDtype, BitwiseModeReducesLowPrecisionParametersInF32) {
  // The module's grads come in f32 (the rule) or in bf16 (converted into the f32 slot): either
  // way the reduced grad is f32 and exact.
  for (DType grads : {DType::f32, DType::bf16}) {
    const int world = 4;
    run_ranks(world, Determinism::bitwise, [&](int r, Communicator& comm) {
      GradWriter m({{5, DType::bf16}, {3, DType::f16}, {2, DType::f32}}, comm.device(), r, grads);
      DistributedDataParallelOptions o;
      o.average_gradients = false;
      DistributedDataParallel ddp(m, comm, o);
      ASSERT_EQ(ddp.bucket_indices().size(), 1u);
      EXPECT_EQ(ddp.bucket_dtype(0), DType::f32);
      EXPECT_EQ(ddp.grad_dtype_of(*m.parameters()[0]), DType::f32);
      ddp.forward(Tensor::zeros({1}, DType::f32, comm.device()));
      ddp.backward(Tensor::zeros({1}, DType::f32, comm.device()));
      for (std::size_t i = 0; i < 3; ++i) {
        const nn::Parameter& p = *m.parameters()[i];
        EXPECT_EQ(p.grad.dtype(), DType::f32);
        EXPECT_EQ(p.grad.to_vector<float>(), expected(world, i, p.data.numel()));
      }
    });
  }
}

TEST(DdpDtype, ParametersOfOtherDtypesAreRefused) {
  test::init_sim(8);
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", 1), {});
  GradWriter m({{2, DType::i32}}, comms[0].device(), 0, std::nullopt);
  test::expect_error<InvalidArgument>([&] { DistributedDataParallel ddp(m, comms[0], {}); },
                                      "parameter 0 ('p0'): expected dtype f32, bf16 or f16, got");
}

}  // namespace
}  // namespace ditto
