// Cross-backend suite for the CUDA backend (DESIGN.md, "Tests"): memory and copies, NCCL
// collectives for 1, 2, 4 and 8 logical devices (oversubscribed on fewer GPUs) against the host,
// and DataParallel training with the simulator's parameter bits. Without a usable GPU (or in a
// build without the backend) every test reports SKIPPED with the reason. Every op against the
// simulator (bit for bit in bitwise mode, within tolerance in fast mode) is in the backend-ops
// table, tests/test_backend_ops.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/data/data_loader.h"
#include "core/data/dataset.h"
#include "core/nn/loss.h"
#include "core/nn/sequential.h"
#include "core/numerics/random.h"
#include "core/optim/adam.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

constexpr int kLogicalDevices = kCudaTestDevices;

// cuda and the simulator (the reference) with kLogicalDevices devices each.
using CudaTest = CudaSuite<kLogicalDevices>;

// ---- helpers ----------------------------------------------------------------------------------

Device cuda_dev(int i = 0) { return Device("cuda", i); }
Device sim_dev(int i = 0) { return Device("sim", i); }

/// n values in [-1, 1) scaled by 100, 1 or 0.01 by position, so the order of a sum shows in
/// its bits.
std::vector<float> mixed_salted(std::int64_t n, std::uint64_t salt, bool magnitudes = true) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    float s = !magnitudes ? 1.0f : (i % 3 == 0 ? 100.0f : (i % 3 == 1 ? 1.0f : 0.01f));
    v[i] = s * uniform(11, stream_id(kStreamSynthetic, 900 + salt), i, -1, 1);
  }
  return v;
}

// ---- memory, copies, streams ------------------------------------------------------------------

TEST_F(CudaTest, MemoryCopiesStreamsAndEvents) {
  Backend& b = get_backend("cuda");
  ASSERT_EQ(b.device_count(), kLogicalDevices);
  EXPECT_FALSE(b.properties(0).name.empty());
  EXPECT_GT(b.properties(0).total_memory, 0u);

  // Host -> device -> device (another logical device, maybe another GPU) -> host.
  std::vector<float> host = mixed_salted(1000, 1);
  Tensor a = Tensor::from_vector(host, {10, 100}, cuda_dev(0));
  Tensor c = a.to(cuda_dev(kLogicalDevices - 1)).to(cuda_dev(1));
  EXPECT_EQ(c.to_vector<float>(), host);
  EXPECT_EQ(a.narrow(3, 4).to_vector<float>(),
            std::vector<float>(host.begin() + 300, host.begin() + 700));

  // Strided copy: rows 0..4 of a 5 x 7 block with pitches 9 (source) and 8 (destination).
  const std::size_t f = sizeof(float);
  std::vector<float> src(5 * 9);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  Stream& s = b.default_stream(0);
  void* ds = b.allocate(0, src.size() * f);
  void* dd = b.allocate(0, 5 * 8 * f);
  b.copy_from_host(s, ds, src.data(), src.size() * f);
  b.copy_2d(s, dd, 8 * f, ds, 9 * f, 7 * f, 5);
  std::vector<float> got(5 * 8, -1.0f);
  b.copy_to_host(s, got.data(), dd, got.size() * f);
  for (int r = 0; r < 5; ++r)
    for (int k = 0; k < 7; ++k) EXPECT_EQ(got[r * 8 + k], src[r * 9 + k]) << r << "," << k;

  // Accounting, zero-byte allocations, out of memory.
  MemoryStats m = b.memory_stats(0);
  EXPECT_GE(m.in_use, (src.size() + 40) * f);
  EXPECT_GE(m.peak, m.in_use);
  void* z1 = b.allocate(0, 0);
  void* z2 = b.allocate(0, 0);
  EXPECT_NE(z1, nullptr);
  EXPECT_NE(z1, z2);
  EXPECT_EQ(b.memory_stats(0).in_use, m.in_use);
  b.deallocate(0, z1, 0);
  b.deallocate(0, z2, 0);
  b.deallocate(0, ds, src.size() * f);
  b.deallocate(0, dd, 5 * 8 * f);
  EXPECT_EQ(b.memory_stats(0).in_use, m.in_use - (src.size() + 40) * f);
  expect_error<OutOfMemory>([&] { b.allocate(0, m.capacity + 1); },
                            "cuda:0 (GPU 0): out of memory: tried to allocate");

  // Streams and events order work across devices.
  auto s2 = b.create_stream(1);
  auto ev = b.create_event(0);
  EXPECT_TRUE(ev->query());  // never recorded
  b.default_stream(0).record(*ev);
  s2->wait(*ev);
  ev->synchronize();
  EXPECT_TRUE(ev->query());
  s2->synchronize();

  // Another backend's stream is refused by name.
  std::vector<float> one(1);
  expect_error<InvalidArgument>(
      [&] { b.copy_to_host(get_backend("sim").default_stream(0), one.data(), a.data_ptr(), 4); },
      "copy_to_host: expected a stream of the cuda backend");
}

TEST_F(CudaTest, KernelScratchIsCountedByTheDevicesMemoryStats) {
  // sum_inputs over more inputs than one launch takes (8) keeps the right subtree of the
  // canonical tree in scratch memory (Note [Canonical tree]): it comes from the backend's
  // allocator, so the device's peak sees it, and it is given back.
  Backend& b = get_backend("cuda");
  const std::int64_t numel = 1 << 18;
  std::vector<Tensor> in;
  for (int k = 0; k < 9; ++k)
    in.push_back(Tensor::from_vector(mixed_salted(numel, 40 + k), {numel}, cuda_dev(0)));
  Tensor out = Tensor::from_vector(std::vector<float>(numel, 0.0f), {numel}, cuda_dev(0));
  std::vector<const float*> ptrs;
  for (const Tensor& t : in) ptrs.push_back(static_cast<const float*>(t.data_ptr()));
  Stream& s = b.default_stream(0);
  s.synchronize();
  b.reset_peak_memory(0);
  const std::size_t before = b.memory_stats(0).in_use;
  b.kernels().sum_inputs(s, ptrs.data(), 9, static_cast<float*>(out.data_ptr()), numel,
                         Determinism::bitwise);
  s.synchronize();
  // The split of 9 inputs is 8 + 1: one scratch of numel floats for the right subtree.
  EXPECT_GE(b.memory_stats(0).peak, before + static_cast<std::size_t>(numel) * sizeof(float));
  EXPECT_EQ(b.memory_stats(0).in_use, before);
  // And the sum is the simulator's, bit for bit.
  Backend& sim = get_backend("sim");
  std::vector<Tensor> sim_in;
  std::vector<const float*> sim_ptrs;
  for (const Tensor& t : in) {
    sim_in.push_back(t.to(sim_dev(0)));
    sim_ptrs.push_back(static_cast<const float*>(sim_in.back().data_ptr()));
  }
  Tensor want = Tensor::from_vector(std::vector<float>(numel, 0.0f), {numel}, sim_dev(0));
  sim.kernels().sum_inputs(sim.default_stream(0), sim_ptrs.data(), 9,
                           static_cast<float*>(want.data_ptr()), numel, Determinism::bitwise);
  sim.default_stream(0).synchronize();
  EXPECT_EQ(out.to_vector<float>(), want.to_vector<float>());
}

// ---- collectives ------------------------------------------------------------------------------

TEST_F(CudaTest, CollectivesOn1_2_4_8DevicesMatchTheHost) {
  const std::int64_t count = 1001;
  // Multiples of 0.5 with |x| <= 2.5: sums, products and averages over up to 8 ranks are exact,
  // so the host reference does not depend on the order.
  auto val = [](int r, std::int64_t i) {
    int k = static_cast<int>((r * 7 + i * 3 + 1) % 10) - 5;
    return static_cast<float>(k >= 0 ? k + 1 : k) * 0.5f;
  };
  auto input = [&](int r, std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[i] = val(r, i % count);
    return v;
  };
  for (Determinism mode : {Determinism::fast, Determinism::bitwise}) {
    for (int n : {1, 2, 4, 8}) {
      SCOPED_TRACE(detail::cat(determinism_name(mode), ", ", n, " ranks"));
      CommOptions o;
      o.determinism = mode;
      auto comms = Communicator::init_all(devices("cuda", n), o);
      for (ReduceOp op :
           {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
        SCOPED_TRACE(reduce_op_name(op));
        std::vector<float> want(count);
        for (std::int64_t i = 0; i < count; ++i) {
          float acc = val(0, i);
          for (int r = 1; r < n; ++r) {
            float v = val(r, i);
            acc = op == ReduceOp::prod  ? acc * v
                  : op == ReduceOp::min ? std::min(acc, v)
                  : op == ReduceOp::max ? std::max(acc, v)
                                        : acc + v;
          }
          want[i] = op == ReduceOp::avg ? acc / n : acc;
        }
        std::vector<Tensor> send, recv, rs_send, rs_recv;
        for (int r = 0; r < n; ++r) {
          send.push_back(Tensor::from_vector(input(r, count), {count}, comms[r].device()));
          recv.push_back(Tensor::zeros({count}, DType::f32, comms[r].device()));
          rs_send.push_back(
              Tensor::from_vector(input(r, n * count), {n * count}, comms[r].device()));
          rs_recv.push_back(Tensor::zeros({count}, DType::f32, comms[r].device()));
        }
        all_reduce(comms, send, recv, op);
        reduce_scatter(comms, rs_send, rs_recv, op);
        synchronize(comms);
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(recv[r].to_vector<float>(), want) << "all_reduce rank " << r;
          ASSERT_EQ(rs_recv[r].to_vector<float>(), want) << "reduce_scatter rank " << r;
        }
      }
      // broadcast from the last rank, all_gather, reduce to rank 0, barrier.
      std::vector<Tensor> bc, ag_send, ag_recv, red_send, red_recv;
      for (int r = 0; r < n; ++r) {
        bc.push_back(Tensor::from_vector(input(r, count), {count}, comms[r].device()));
        ag_send.push_back(Tensor::from_vector(input(r, count), {count}, comms[r].device()));
        ag_recv.push_back(Tensor::zeros({n, count}, DType::f32, comms[r].device()));
        red_send.push_back(Tensor::from_vector(input(r, count), {count}, comms[r].device()));
        red_recv.push_back(Tensor::zeros({count}, DType::f32, comms[r].device()));
      }
      broadcast(comms, bc, n - 1);
      all_gather(comms, ag_send, ag_recv);
      reduce(comms, red_send, red_recv, ReduceOp::max, 0);
      synchronize(comms);
      std::vector<float> gathered;
      for (int r = 0; r < n; ++r) {
        auto v = input(r, count);
        gathered.insert(gathered.end(), v.begin(), v.end());
      }
      std::vector<float> mx(count);
      for (std::int64_t i = 0; i < count; ++i) {
        mx[i] = val(0, i);
        for (int r = 1; r < n; ++r) mx[i] = std::max(mx[i], val(r, i));
      }
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(bc[r].to_vector<float>(), input(n - 1, count)) << "broadcast rank " << r;
        ASSERT_EQ(ag_recv[r].to_vector<float>(), gathered) << "all_gather rank " << r;
      }
      ASSERT_EQ(red_recv[0].to_vector<float>(), mx) << "reduce";

      // SPMD: one host thread per rank, as DDP drives NCCL: all_reduce, barrier, synchronize.
      std::vector<Tensor> t;
      for (int r = 0; r < n; ++r)
        t.push_back(Tensor::from_vector(input(r, count), {count}, comms[r].device()));
      std::vector<std::string> errors(n);
      std::vector<std::thread> threads;
      for (int r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          try {
            comms[r].all_reduce(t[r]);
            comms[r].barrier();
            comms[r].stream().synchronize();
          } catch (const std::exception& e) {
            errors[r] = e.what();
          }
        });
      for (auto& th : threads) th.join();
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(errors[r], "") << "rank " << r;
        auto got = t[r].to_vector<float>();
        for (std::int64_t i = 0; i < count; ++i) {
          float want = val(0, i);
          for (int q = 1; q < n; ++q) want += val(q, i);
          ASSERT_EQ(got[i], want) << "SPMD all_reduce rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST_F(CudaTest, BitwiseAllReduceEqualsTheSimulatorsBits) {
  const std::int64_t count = 4099;
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(detail::cat(n, " ranks"));
    std::vector<std::vector<std::uint32_t>> result;
    for (const char* backend : {"sim", "cuda"}) {
      CommOptions o;
      o.determinism = Determinism::bitwise;
      auto comms = Communicator::init_all(devices(backend, n), o);
      std::vector<Tensor> t;
      for (int r = 0; r < n; ++r)
        t.push_back(Tensor::from_vector(mixed_salted(count, 100 + r), {count}, comms[r].device()));
      all_reduce(comms, t);
      synchronize(comms);
      for (int r = 1; r < n; ++r) ASSERT_EQ(bits(t[r]), bits(t[0])) << backend << " rank " << r;
      result.push_back(bits(t[0]));
    }
    EXPECT_EQ(result[0], result[1]);
  }
}

// ---- DataParallel training --------------------------------------------------------------------

/// Trains an MLP 12-32-16-5 for 2 epochs on synthetic data with DataParallel over `n` devices of
/// `backend` in bitwise mode; returns the bits of every parameter.
std::vector<std::uint32_t> train(const std::string& backend, int n, bool mse_adam) {
  const std::int64_t rows = 200, feat = 12, classes = 5;
  data::Dataset ds =
      test::synthetic_classes(rows, feat, classes, /*seed=*/5, /*sub=*/920, /*shift=*/0.5f);
  std::vector<Device> devs = devices(backend, n);
  auto model = nn::mlp({feat, 32, 16, classes}, devs[0], 17);
  parallel::DataParallelOptions o;
  o.determinism = Determinism::bitwise;
  parallel::DataParallel dp(*model, devs, o);
  std::unique_ptr<nn::Loss> loss;
  std::unique_ptr<optim::Optimizer> opt;
  if (mse_adam) {
    loss = std::make_unique<nn::MSELoss>();
    optim::AdamOptions ao;
    ao.lr = 0.01;
    opt = std::make_unique<optim::Adam>(model->parameters(), ao);
  } else {
    loss = std::make_unique<nn::CrossEntropyLoss>();
    optim::SGDOptions so;
    so.lr = 0.05f;
    so.momentum = 0.9f;
    so.nesterov = true;
    so.weight_decay = 0.001f;
    opt = std::make_unique<optim::SGD>(model->parameters(), so);
  }
  loss->set_determinism(Determinism::bitwise);
  data::DataLoader loader(ds, 48, /*shuffle=*/true, /*seed=*/3);
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);
    for (data::Batch b : loader) {
      Tensor out = dp.forward(b.x);
      Tensor target;
      if (mse_adam) {
        std::vector<float> hot(b.y.numel() * classes, 0.0f);
        auto y = b.y.to_vector<std::int64_t>();
        for (std::size_t r = 0; r < y.size(); ++r) hot[r * classes + y[r]] = 1.0f;
        target = Tensor::from_vector(hot, {b.y.numel(), classes}, out.device());
      } else {
        target = b.y.to(out.device());
      }
      loss->forward(out, target);
      opt->zero_grad(true);
      dp.backward(loss->backward());
      opt->step();
    }
  }
  std::vector<std::uint32_t> all;
  for (float x : parameter_values(*model)) all.push_back(bits(x));
  return all;
}

TEST_F(CudaTest, BitwiseDataParallelTrainingEqualsTheSimulatorsParameterBits) {
  for (bool mse_adam : {false, true}) {
    SCOPED_TRACE(mse_adam ? "mse + adam" : "cross-entropy + sgd");
    std::vector<std::uint32_t> ref = train("sim", 1, mse_adam);
    ASSERT_FALSE(ref.empty());
    for (int n : {1, kLogicalDevices}) {
      std::vector<std::uint32_t> got = train("cuda", n, mse_adam);
      ASSERT_EQ(got.size(), ref.size());
      std::size_t differ = 0;
      for (std::size_t i = 0; i < ref.size(); ++i) differ += got[i] != ref[i];
      EXPECT_EQ(differ, 0u) << n << " cuda devices: " << differ << " of " << ref.size()
                            << " parameters differ from the simulator's";
    }
  }
}

}  // namespace
}  // namespace ditto
