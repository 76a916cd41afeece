// optim::MasterWeights on hand-made bf16 / f16 parameters: small updates accumulate in the f32
// masters (a bf16 SGD would lose them), Adam / AdamW over the masters equal the f32 optimizer on
// f32 parameters bit for bit and the model holds their RNE rounding, f32 parameters pass
// through, nanoGPT's groups see the shapes, the state dict resumes bit-exactly, and errors.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <bit>
#include <cmath>
#include <vector>

#include "core/optim/adam.h"
#include "core/optim/adamw.h"
#include "core/optim/master_weights.h"
#include "core/optim/sgd.h"
#include "core/runtime/ops.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class MasterWeightsTest : public SimSuite<2> {
 protected:
  static Device dev() { return Device("sim", 0); }
  static nn::Parameter param(const std::string& name, std::vector<float> v,
                             std::vector<std::int64_t> shape, DType dt) {
    return {name, Tensor::from_vector(v, shape, dev()).to(dt), {}};
  }
  static std::vector<float> f32_of(const Tensor& t) { return t.to(DType::f32).to_vector<float>(); }
  static std::vector<std::uint32_t> bits(const std::vector<float>& v) {
    std::vector<std::uint32_t> b;
    for (float x : v) b.push_back(std::bit_cast<std::uint32_t>(x));
    return b;
  }
  static optim::InnerOptimizerFactory sgd(float lr) {
    return [lr](std::vector<nn::Parameter*> ps) {
      optim::SGDOptions o;
      o.lr = lr;
      o.momentum = 0;
      return std::make_unique<optim::SGD>(std::move(ps), o);
    };
  }
};

TEST_F(MasterWeightsTest, SmallUpdatesAccumulateInTheMaster) {
  // p = 1 in bf16 (ulp 2^-8 below 1), g = 2^-10, lr 1: the master walks 1 - k 2^-10; the model
  // holds its RNE rounding, which a bf16-only SGD (1 - 2^-10 rounds back to 1) never leaves.
  nn::Parameter p = param("w", {1.0f}, {1}, DType::bf16);
  optim::MasterWeights mw({&p}, sgd(1.0f));
  const std::vector<float> model{1.0f, 1.0f, 1.0f - 1.0f / 256, 1.0f - 1.0f / 256};
  for (int k = 1; k <= 4; ++k) {
    p.grad = Tensor::from_vector(std::vector<float>{1.0f / 1024}, {1}, dev()).to(DType::bf16);
    mw.step();
    EXPECT_EQ(p.data.dtype(), DType::bf16);
    EXPECT_EQ(f32_of(p.data)[0], model[static_cast<std::size_t>(k - 1)]) << "step " << k;
    EXPECT_EQ(mw.master_parameters()[0]->data.to_vector<float>()[0], 1.0f - k / 1024.0f);
  }
}

TEST_F(MasterWeightsTest, AdamOverMastersEqualsF32AdamAndTheModelHoldsItsRounding) {
  const std::vector<float> init{0.1f, -0.25f, 3.0f, 1e-3f, -7.5f, 0.3333f};
  for (DType dt : {DType::bf16, DType::f16}) {
    // The low-precision parameter starts at the rounding of init; the f32 reference at the same
    // (upcast) values, with the same (upcast) gradients.
    nn::Parameter p = param("h.0.w", init, {2, 3}, dt);
    nn::Parameter ref{"h.0.w", p.data.to(DType::f32), {}};
    optim::AdamWOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    optim::MasterWeights mw({&p}, [&](std::vector<nn::Parameter*> ps) {
      return std::make_unique<optim::AdamW>(ps, o);
    });
    optim::AdamW adam({&ref}, o);
    EXPECT_EQ(static_cast<optim::AdamW&>(mw.inner()).weight_decay(0), 0.1);  // 2-dim: decayed
    for (int k = 0; k < 5; ++k) {
      std::vector<float> g;
      for (std::size_t i = 0; i < init.size(); ++i) g.push_back(0.01f * static_cast<float>(k + 1) * (i % 2 ? 1.0f : -1.0f) + 0.003f * i);
      p.grad = Tensor::from_vector(g, {2, 3}, dev()).to(dt);
      ref.grad = p.grad.to(DType::f32);
      mw.step();
      adam.step();
      const std::vector<float> master = mw.master_parameters()[0]->data.to_vector<float>();
      EXPECT_EQ(bits(master), bits(ref.data.to_vector<float>())) << dtype_name(dt) << " step " << k;
      EXPECT_EQ(bits(f32_of(p.data)), bits(f32_of(ref.data.to(dt)))) << dtype_name(dt) << " step " << k;
    }
  }
}

TEST_F(MasterWeightsTest, F32ParametersPassThrough) {
  nn::Parameter a = param("a", {1, 2, 3}, {3}, DType::f32);
  nn::Parameter b = param("b", {1, 2, 3}, {3}, DType::f32);
  nn::Parameter c = param("c", {4}, {1}, DType::bf16);  // a mixed model
  optim::MasterWeights mw({&a, &c}, [](std::vector<nn::Parameter*> ps) {
    optim::AdamOptions o;
    o.lr = 0.1;
    return std::make_unique<optim::Adam>(std::move(ps), o);
  });
  optim::AdamOptions o;
  o.lr = 0.1;
  optim::Adam plain({&b}, o);
  EXPECT_EQ(mw.master_parameters()[0]->data.data_ptr(), a.data.data_ptr());  // no copy
  for (int k = 0; k < 3; ++k) {
    a.grad = Tensor::from_vector(std::vector<float>{0.5f, -1.0f, 2.0f}, {3}, dev());
    b.grad = a.grad.clone();
    c.grad = Tensor::from_vector(std::vector<float>{1.0f}, {1}, dev()).to(DType::bf16);
    mw.step();
    plain.step();
    EXPECT_EQ(bits(a.data.to_vector<float>()), bits(b.data.to_vector<float>()));
  }
  EXPECT_EQ(c.data.dtype(), DType::bf16);
  EXPECT_LT(f32_of(c.data)[0], 4.0f);
}

TEST_F(MasterWeightsTest, ParametersWithoutGradAreNotTouched) {
  nn::Parameter p = param("w", {1.5f}, {1}, DType::bf16);
  nn::Parameter q = param("v", {2.5f}, {1}, DType::bf16);
  optim::MasterWeights mw({&p, &q}, sgd(0.5f));
  p.grad = Tensor::from_vector(std::vector<float>{1.0f}, {1}, dev()).to(DType::bf16);
  mw.step();
  EXPECT_EQ(f32_of(p.data)[0], 1.0f);
  EXPECT_EQ(f32_of(q.data)[0], 2.5f);
  EXPECT_FALSE(mw.master_parameters()[1]->grad.defined());
}

TEST_F(MasterWeightsTest, LoadMasterGradsLetsTheCallerScaleThem) {
  // The trainer's order: load, unscale / clip the f32 master grads, step.
  nn::Parameter p = param("w", {1.0f}, {1}, DType::f16);
  optim::MasterWeights mw({&p}, sgd(1.0f));
  p.grad = Tensor::from_vector(std::vector<float>{1024.0f}, {1}, dev()).to(DType::f16);
  mw.load_master_grads();
  ops::scale_(mw.master_parameters()[0]->grad, 1.0f / 4096);
  mw.step();
  EXPECT_EQ(mw.master_parameters()[0]->data.to_vector<float>()[0], 0.75f);
  EXPECT_EQ(f32_of(p.data)[0], 0.75f);
}

TEST_F(MasterWeightsTest, StateDictResumesBitExactly) {
  auto make = [](std::vector<nn::Parameter*> ps) {
    optim::AdamWOptions o;
    o.lr = 0.003;
    return std::make_unique<optim::AdamW>(ps, o);
  };
  auto grad = [&](int k) {
    return Tensor::from_vector(std::vector<float>{0.1f * k, -0.2f, 0.05f * k * k, 1.0f}, {2, 2}, dev())
        .to(DType::bf16);
  };
  nn::Parameter a = param("w", {0.3f, 0.7f, -1.1f, 2.0f}, {2, 2}, DType::bf16);
  optim::MasterWeights ma({&a}, make);
  for (int k = 1; k <= 2; ++k) {
    a.grad = grad(k);
    ma.step();
  }
  const optim::OptimizerState saved = ma.state_dict();
  EXPECT_EQ(saved.type, "AdamW");
  EXPECT_EQ(saved.options.at("master_weights"), "f32");
  // A fresh model holding only the bf16 parameters, resumed from the state.
  nn::Parameter b{"w", a.data.clone(), {}};
  optim::MasterWeights mb({&b}, make);
  mb.load_state_dict(saved);
  for (int k = 3; k <= 5; ++k) {
    a.grad = grad(k);
    b.grad = grad(k);
    ma.step();
    mb.step();
    EXPECT_EQ(bits(ma.master_parameters()[0]->data.to_vector<float>()),
              bits(mb.master_parameters()[0]->data.to_vector<float>()));
    EXPECT_EQ(bits(f32_of(a.data)), bits(f32_of(b.data)));
  }
  // Without the masters a bf16 resume would start from the rounded values: the masters differ.
  nn::Parameter c{"w", a.data.clone(), {}};
  optim::MasterWeights mc({&c}, make);
  EXPECT_NE(bits(mc.master_parameters()[0]->data.to_vector<float>()),
            bits(ma.master_parameters()[0]->data.to_vector<float>()));
}

TEST_F(MasterWeightsTest, AnAttachedGradScalerTravelsInTheState) {
  auto make = [](std::vector<nn::Parameter*> ps) {
    return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{});
  };
  nn::Parameter a = param("w", {1, 2}, {2}, DType::f16);
  optim::MasterWeights ma({&a}, make);
  optim::GradScaler sa;
  ma.attach_grad_scaler(&sa);
  a.grad = Tensor::from_vector(std::vector<float>{1.0f, 65504.0f * 2}, {2}, dev()).to(DType::f16);
  ma.load_master_grads();
  EXPECT_TRUE(sa.unscale_(ma.master_parameters()));  // f16 inf
  sa.update();
  const optim::OptimizerState s = ma.state_dict();
  EXPECT_EQ(s.options.at("grad_scaler.scale"), "32768");
  nn::Parameter b = param("w", {1, 2}, {2}, DType::f16);
  optim::MasterWeights mb({&b}, make);
  optim::GradScaler sb;
  mb.attach_grad_scaler(&sb);
  mb.load_state_dict(s);
  EXPECT_EQ(sb.scale(), 32768.0f);
  EXPECT_EQ(sb.skipped_steps(), 1);
  optim::MasterWeights mc({&b}, make);  // no scaler: an f16 run's state is refused
  expect_error<InvalidArgument>([&] { mc.load_state_dict(s); },
                                "saved with a GradScaler's state (an f16 run), this run has none");
  expect_error<InvalidArgument>([&] { mb.load_state_dict(mc.state_dict()); },
                                "saved without a GradScaler's state");
}

TEST_F(MasterWeightsTest, StateDictErrors) {
  auto make = [](std::vector<nn::Parameter*> ps) {
    return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{});
  };
  nn::Parameter a = param("w", {1, 2}, {2}, DType::bf16);
  optim::MasterWeights mw({&a}, make);
  nn::Parameter f = param("w", {1, 2}, {2}, DType::f32);
  optim::Adam plain({&f}, optim::AdamOptions{});
  expect_error<InvalidArgument>([&] { mw.load_state_dict(plain.state_dict()); },
                                "saved without master weights");
  optim::OptimizerState s = mw.state_dict();
  s.tensors.back().second = Tensor::zeros({3}, DType::f32, Device::cpu());
  expect_error<InvalidArgument>([&] { mw.load_state_dict(s); },
                                "tensor 'master.0': expected [2] f32 (the master of parameter 0 'w')");
  s.tensors.pop_back();
  expect_error<InvalidArgument>([&] { mw.load_state_dict(s); }, "tensor 'master.0' (the master of 'w') is missing");
  s = mw.state_dict();
  s.tensors.emplace_back("master.7", Tensor::zeros({2}, DType::f32, Device::cpu()));
  expect_error<InvalidArgument>([&] { mw.load_state_dict(s); }, "unexpected tensor 'master.7'");
}

TEST_F(MasterWeightsTest, ConstructionErrors) {
  nn::Parameter i{"idx", Tensor::zeros({2}, DType::i32, dev()), {}};
  expect_error<InvalidArgument>([&] { optim::MasterWeights mw({&i}, sgd(0.1f)); },
                                "params[0] ('idx'): expected defined f32 or bf16 or f16 data, got");
  nn::Parameter a = param("w", {1}, {1}, DType::bf16);
  expect_error<InvalidArgument>(
      [&] { optim::MasterWeights mw({&a}, [](std::vector<nn::Parameter*>) { return nullptr; }); },
      "make_inner: returned no optimizer");
  nn::Parameter other = param("x", {1}, {1}, DType::f32);
  expect_error<InvalidArgument>(
      [&] {
        optim::MasterWeights mw({&a}, [&](std::vector<nn::Parameter*>) {
          return std::make_unique<optim::SGD>(std::vector<nn::Parameter*>{&other}, optim::SGDOptions{});
        });
      },
      "make_inner: expected an optimizer over the 1 master parameters");
  // The plain optimizers still refuse bf16 data.
  expect_error<InvalidArgument>([&] { optim::SGD s({&a}, optim::SGDOptions{}); },
                                "expected defined f32 data");
}

// Tensor::to(device, copy = true), torch's .to(device, copy=True): one new tensor, whatever the
// source's device, never this tensor's storage.
TEST_F(MasterWeightsTest, ToWithCopyAlwaysReturnsANewTensorWithTheSameValues) {
  const std::vector<float> v{1.5f, -2.0f, 3.25f};
  Tensor on_dev = Tensor::from_vector(v, {3}, dev());
  Tensor host = on_dev.to(Device::cpu(), /*copy=*/true);
  EXPECT_EQ(host.device(), Device::cpu());
  EXPECT_EQ(host.to_vector<float>(), v);
  Tensor host2 = host.to(Device::cpu(), /*copy=*/true);  // already there: a clone
  EXPECT_NE(host2.data_ptr(), host.data_ptr());
  EXPECT_EQ(host2.to_vector<float>(), v);
  EXPECT_EQ(host.to(Device::cpu(), /*copy=*/false).data_ptr(), host.data_ptr());  // to(device)
  Tensor back = host.to(dev(), /*copy=*/true);
  EXPECT_EQ(back.device(), dev());
  EXPECT_EQ(back.to_vector<float>(), v);
}

// Adam's state_dict of state on a device: a host copy of each moment, made once. It was
// .to(cpu).clone(), a host copy then a copy of that: 64 MiB moments peaked at 3 x 64 MiB of
// new resident memory (one moment kept, one converted, its clone) instead of 2 x 64 MiB.
// ctest runs each test in its own process, so the high-water mark starts at this test's.
TEST_F(MasterWeightsTest, AdamStateDictCopiesEachMomentToTheHostOnce) {
  constexpr std::int64_t kN = std::int64_t(16) << 20;  // 64 MiB of f32 per tensor
  nn::Parameter p{"w", Tensor::zeros({kN}, DType::f32, dev()), {}};
  p.grad = Tensor::full({kN}, 0.5f, dev());
  optim::Adam adam({&p});
  adam.step();
  current_stream(dev()).synchronize();
  auto max_rss_kib = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
  };
  const long before = max_rss_kib();
  {
    const optim::OptimizerState s = adam.state_dict();
    ASSERT_EQ(s.tensors.size(), 3u);  // step, exp_avg, exp_avg_sq
    EXPECT_EQ(s.tensors[1].first, "state.0.exp_avg");
    EXPECT_EQ(s.tensors[2].first, "state.0.exp_avg_sq");
    for (const auto& [key, t] : s.tensors) EXPECT_EQ(t.device(), Device::cpu()) << key;
    EXPECT_EQ(s.tensors[1].second.data<float>()[kN - 1], 0.05f);  // (1 - beta1) g
  }
  const long grew_mib = (max_rss_kib() - before) / 1024;
  EXPECT_LT(grew_mib, 160) << "MiB of resident memory grew (2 moments of 64 MiB kept)";
}

}  // namespace
}  // namespace ditto
