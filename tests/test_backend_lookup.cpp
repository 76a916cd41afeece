// get_backend()'s per-thread cache (Note [Backend lookup cache] in core/runtime/backend.cpp): after
// init_backend() replaces an instance, every thread (also one that looked the old instance up
// just before) gets the new one, and Device::backend() follows; a tensor of the old instance stays
// readable, but ops on it, and every call of a communicator (and so of a DataParallel or DDP)
// made on the old instance, refuse at once (Note [Communicators of a replaced backend]).
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/nn/sequential.h"
#include "core/optim/sgd.h"
#include "core/parallel/data_parallel.h"
#include "core/parallel/distributed_data_parallel.h"
#include "core/runtime/backend.h"
#include "core/runtime/ops.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

TEST(BackendLookup, EveryThreadSeesTheInstanceThatInitBackendMadeLast) {
  BackendOptions o;
  o.device_count = 3;
  Backend& first = init_backend("sim", o);
  EXPECT_EQ(&get_backend("sim"), &first);
  EXPECT_EQ(get_backend("sim").device_count(), 3);

  std::atomic<int> phase{0};
  std::atomic<int> seen_before{0}, seen_after{0};
  std::thread worker([&] {
    seen_before = get_backend("sim").device_count();  // caches the first instance
    phase = 1;
    while (phase.load() != 2) std::this_thread::yield();
    seen_after = Device("sim", 0).backend().device_count();
  });
  while (phase.load() != 1) std::this_thread::yield();
  o.device_count = 5;
  Backend& second = init_backend("sim", o);
  phase = 2;
  worker.join();
  EXPECT_EQ(seen_before.load(), 3);
  EXPECT_EQ(seen_after.load(), 5);
  EXPECT_EQ(&get_backend("sim"), &second);
  EXPECT_EQ(Device("sim", 4).backend().device_count(), 5);
  EXPECT_THROW(Device("sim", 5).backend(), InvalidArgument);
  EXPECT_THROW(get_backend("no-such-backend"), InvalidArgument);
  o.device_count = 8;
  init_backend("sim", o);  // leave the default count for later suites in this process
}

// A tensor made before init_backend replaced its instance (Trainer::fit does, with its run's
// device count) could not be read when its device index no longer existed ("device sim:3: index
// out of range"): as a torch tensor stays readable while it lives, copies to and from it run on
// the instance that owns its memory (Note [Tensors of a replaced backend], tensor.cpp).
TEST(BackendLookup, ATensorOfAReplacedInstanceStaysReadableAndWritable) {
  BackendOptions o;
  o.device_count = 4;
  init_backend("sim", o);
  const Tensor t3 = Tensor::full({2, 4}, 3.0f, Device("sim", 3));
  const Tensor t1 = Tensor::full({8}, 1.0f, Device("sim", 1));
  o.device_count = 2;
  init_backend("sim", o);
  EXPECT_EQ(t3.to_vector<float>(), std::vector<float>(8, 3.0f));
  EXPECT_EQ(t3.to(Device::cpu()).to_vector<float>(), std::vector<float>(8, 3.0f));
  const Tensor on1 = t3.to(Device("sim", 1));  // old instance -> the live one
  EXPECT_EQ(on1.device(), Device("sim", 1));
  EXPECT_EQ(on1.to_vector<float>(), std::vector<float>(8, 3.0f));
  EXPECT_EQ(t1.to(Device("sim", 0)).to_vector<float>(), std::vector<float>(8, 1.0f));
  Tensor w = t3;  // written from the host and from the live instance
  w.copy_(Tensor::full({2, 4}, 5.0f, Device::cpu()));
  EXPECT_EQ(t3.to_vector<float>(), std::vector<float>(8, 5.0f));
  w.copy_(Tensor::full({2, 4}, 6.0f, Device("sim", 0)));
  EXPECT_EQ(t3.to_vector<float>(), std::vector<float>(8, 6.0f));
  o.device_count = 8;
  init_backend("sim", o);
}

// The message of a call refused on an object of a replaced instance names the call and says why.
void expect_refused_as_reinitialised(const std::function<void()>& call, const std::string& name) {
  try {
    call();
    ADD_FAILURE() << name << ": returned, expected InvalidArgument (backend re-initialised)";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(name), std::string::npos) << what;
    EXPECT_NE(what.find("re-initialised"), std::string::npos) << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": threw " << e.what() << ", expected InvalidArgument";
  }
}

// tester3 (issue 29): a single-controller all_reduce on handles made before init_backend shrank
// the simulator to 2 devices enqueued ranks 0 and 1 on the new instance's streams, then failed
// for rank 2 ("index out of range"); ranks 0 and 1 timed out in the next, unrelated copy on
// sim:0. The checks compared devices by name, which still matched. Now the handles refuse first.
TEST(BackendLookup, ACommunicatorOfAReplacedInstanceIsRefusedBeforeAnyRankIsEnqueued) {
  test::init_sim(4);
  const std::vector<Device> d = devices("sim", 4);
  CommOptions co;
  co.timeout_ms = 2000;
  std::vector<Communicator> comms = Communicator::init_all(d, co);
  std::vector<Tensor> t;
  for (int r = 0; r < 4; ++r) t.push_back(Tensor::full({3}, float(r + 1), d[r]));
  test::init_sim(2);
  expect_refused_as_reinitialised([&] { all_reduce(comms, t); }, "all_reduce");
  // Nothing was enqueued: unrelated copies on the new instance run, no timeout surfaces there.
  for (int k = 0; k < 2; ++k)
    EXPECT_EQ(Tensor::full({2}, 5.f, Device("sim", k)).to(Device("sim", 1 - k)).to_vector<float>(),
              std::vector<float>(2, 5.f));
  for (int r = 0; r < 4; ++r)  // readable (their own instance), untouched
    EXPECT_EQ(t[r].to_vector<float>(), std::vector<float>(3, float(r + 1))) << "rank " << r;
  test::init_sim(8);
}

// Every call of a handle of a replaced instance refuses, per rank and single-controller, also
// when the new instance has as many devices (the names still resolve: before, the old
// communicator ran on the new instance's streams, unordered with the old instance's work).
TEST(BackendLookup, EveryCallOfACommunicatorOfAReplacedInstanceIsRefused) {
  test::init_sim(4);
  const std::vector<Device> d = devices("sim", 4);
  CommOptions co;
  co.timeout_ms = 2000;
  std::vector<Communicator> comms = Communicator::init_all(d, co);
  std::vector<Tensor> t, big;
  for (int r = 0; r < 4; ++r) {
    t.push_back(Tensor::full({4}, 1.f, d[r]));
    big.push_back(Tensor::full({16}, 1.f, d[r]));
  }
  test::init_sim(4);
  Communicator& c = comms[1];
  const std::vector<std::pair<std::string, std::function<void()>>> per_rank = {
      {"Communicator::all_reduce", [&] { c.all_reduce(t[1]); }},
      {"Communicator::all_reduce", [&] { c.all_reduce(t[1], t[1], PreMulSum{0.5}); }},
      {"Communicator::reduce", [&] { c.reduce(t[1], t[1], ReduceOp::sum, 0); }},
      {"Communicator::reduce", [&] { c.reduce(t[1], t[1], PreMulSum{0.5}, 0); }},
      {"Communicator::broadcast", [&] { c.broadcast(t[1], 0); }},
      {"Communicator::all_gather", [&] { c.all_gather(t[1], big[1]); }},
      {"Communicator::reduce_scatter", [&] { c.reduce_scatter(big[1], t[1]); }},
      {"Communicator::reduce_scatter", [&] { c.reduce_scatter(big[1], t[1], PreMulSum{2}); }},
      {"Communicator::barrier", [&] { c.barrier(); }},
      {"Communicator::all_to_all", [&] { c.all_to_all(big[1], big[2]); }},
      {"Communicator::all_to_all_v",
       [&] {
         c.all_to_all_v(t[1], {1, 1, 1, 1}, t[1], {1, 1, 1, 1});
       }},
      {"Communicator::gather", [&] { c.gather(t[1], big[1], 1); }},
      {"Communicator::scatter", [&] { c.scatter(big[1], t[1], 1); }},
      {"Communicator::send", [&] { c.send(t[1], 0); }},
      {"Communicator::recv", [&] { c.recv(t[1], 0); }},
      {"Communicator::stream", [&] { c.stream(); }},
  };
  for (const auto& [name, call] : per_rank) expect_refused_as_reinitialised(call, name);
  const std::vector<std::pair<std::string, std::function<void()>>> single = {
      {"all_reduce", [&] { all_reduce(comms, t); }},
      {"broadcast", [&] { broadcast(comms, t, 0); }},
      {"all_gather", [&] { all_gather(comms, t, big); }},
      {"reduce_scatter", [&] { reduce_scatter(comms, big, t); }},
      {"reduce", [&] { reduce(comms, t, t, ReduceOp::max, 2); }},
      {"all_to_all", [&] { all_to_all(comms, big, big); }},
      {"gather", [&] { gather(comms, t, big, 0); }},
      {"scatter", [&] { scatter(comms, big, t, 0); }},
      {"synchronize", [&] { synchronize(comms); }},
  };
  for (const auto& [name, call] : single) expect_refused_as_reinitialised(call, name);
  // New handles on the live instance work.
  std::vector<Communicator> fresh = Communicator::init_all(devices("sim", 4), co);
  std::vector<Tensor> u;
  for (int r = 0; r < 4; ++r) u.push_back(Tensor::full({4}, float(r), Device("sim", r)));
  all_reduce(fresh, u);
  synchronize(fresh);
  for (const Tensor& x : u) EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 6.f));
  test::init_sim(8);
}

// ops on a tensor of a replaced instance ran on the live instance, unordered with the old
// instance's pending work on it: a + b read b before the old instance's fill of it had run (a
// wrong sum, no error, with 2^26 elements). They refuse now, naming the op; copies still run.
TEST(BackendLookup, OpsOnATensorOfAReplacedInstanceAreRefusedAndItsCopiesRun) {
  test::init_sim(2);
  Tensor a = Tensor::full({4}, 1.f, Device("sim", 1));
  Tensor b = Tensor::full({4}, 2.f, Device("sim", 1));
  Tensor m;
  test::init_sim(2);
  expect_refused_as_reinitialised([&] { ops::add(a, b); }, "ops::add: a");
  const Tensor live = Tensor::full({4}, 2.f, Device("sim", 1));
  expect_refused_as_reinitialised([&] { ops::add(live, b); }, "ops::add: b");
  expect_refused_as_reinitialised([&] { a.to(DType::f16); }, "Tensor::to");
  expect_refused_as_reinitialised(
      [&] { ops::sgd_step_(a, live, m, 0.1f, 0.f, 0.f, 0.f, false, true); }, "ops::sgd_step_");
  // clone() copies it to the live instance, where ops run.
  EXPECT_EQ(ops::add(a.clone(), b.clone()).to_vector<float>(), std::vector<float>(4, 3.f));
  test::init_sim(8);
}

// Tensors of a replaced instance given to the collectives of a live communicator (tester hB, 9):
// comm::reduce_add refused them, the communicator ran them on the live instance's streams. One
// rule now: every collective refuses them with the ops' message, naming the call and argument;
// the single-controller forms before any rank is enqueued (the fresh tensors stay untouched).
TEST(BackendLookup, CollectivesOfALiveCommunicatorRefuseTensorsOfAReplacedInstance) {
  test::init_sim(2);
  const Tensor stale0 = Tensor::full({4}, 1.f, Device("sim", 0));
  const Tensor stale1 = Tensor::full({4}, 5.f, Device("sim", 1));
  test::init_sim(2);
  CommOptions co;
  co.timeout_ms = 2000;
  std::vector<Communicator> comms = Communicator::init_all(devices("sim", 2), co);
  const std::string why =
      "[4] f32 on sim:1 was made on an instance of backend sim that init_backend has since "
      "re-initialised; only its copies run (to_vector, to, copy_): t.clone() copies it to the "
      "live instance";
  // The single-controller form: nothing is enqueued, rank 0's tensor keeps its value.
  Tensor fresh0 = Tensor::full({4}, 1.f, Device("sim", 0));
  std::vector<Tensor> t = {fresh0, stale1};
  test::expect_invalid([&] { all_reduce(comms, t); }, "Communicator::all_reduce: send: " + why);
  EXPECT_EQ(fresh0.to_vector<float>(), std::vector<float>(4, 1.f));
  std::vector<Tensor> both = {stale0, stale1},
                      out = {Tensor::zeros({8}, DType::f32, Device("sim", 0)),
                             Tensor::zeros({8}, DType::f32, Device("sim", 1))};
  test::expect_invalid([&] { all_gather(comms, both, out); },
                       "Communicator::all_gather: send: [4] f32 on sim:0 was made on an instance "
                       "of backend sim that init_backend has since re-initialised");
  // A live send with a stale recv, per rank (this refusal aborts the communicator).
  Tensor live1 = Tensor::full({4}, 2.f, Device("sim", 1));
  Tensor stale_recv = stale1;
  test::expect_invalid([&] { comms[1].all_reduce(live1, stale_recv); },
                       "Communicator::all_reduce: recv: " + why);
  // Their clones, on the live instance, run.
  std::vector<Communicator> fresh = Communicator::init_all(devices("sim", 2), co);
  std::vector<Tensor> clones = {stale0.clone(), stale1.clone()};
  all_reduce(fresh, clones);
  synchronize(fresh);
  for (const Tensor& x : clones) EXPECT_EQ(x.to_vector<float>(), std::vector<float>(4, 6.f));
  test::init_sim(8);
}

// An optimizer, a DataParallel and a DistributedDataParallel built before the re-init: their
// step / forward refuse at once (the parameters' op, the communicator) instead of running on the
// old instance's tensors (DataParallel returned an output; SGD updated the parameters) or
// timing out (DDP's ranks 0 and 1 waited for the collective ranks 2 and 3 never joined).
TEST(BackendLookup, ModelsOptimizersAndDataParallelOfAReplacedInstanceAreRefused) {
  test::init_sim(4);
  const std::vector<Device> d = devices("sim", 4);
  auto model = nn::mlp({8, 16, 4}, d[0], 0);
  optim::SGD sgd(model->parameters(), {.lr = 0.1f});
  for (nn::Parameter* p : model->parameters())
    p->grad = Tensor::full(p->data.shape(), 1.f, p->data.device());
  parallel::DataParallel dp(*model, d);
  CommOptions co;
  co.timeout_ms = 2000;
  std::vector<Communicator> comms = Communicator::init_all(d, co);
  std::vector<std::unique_ptr<nn::Module>> replicas;
  std::vector<std::unique_ptr<parallel::DistributedDataParallel>> ddp(4);
  for (int r = 0; r < 4; ++r) replicas.push_back(nn::mlp({8, 16, 4}, d[r], 0));
  {
    std::vector<std::thread> ranks;
    for (int r = 0; r < 4; ++r)
      ranks.emplace_back([&, r] {
        ddp[r] = std::make_unique<parallel::DistributedDataParallel>(*replicas[r], comms[r]);
      });
    for (auto& th : ranks) th.join();
  }
  const std::vector<float> before = model->parameters()[0]->data.to_vector<float>();
  test::init_sim(4);
  expect_refused_as_reinitialised([&] { sgd.step(); }, "sgd_step_");
  EXPECT_EQ(model->parameters()[0]->data.to_vector<float>(), before);
  expect_refused_as_reinitialised(
      [&] {
        dp.forward(Tensor::full({8, 8}, 0.5f, Device::cpu()));
      },
      "DataParallel.forward: parameter '");
  std::vector<std::string> errors(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      try {
        Tensor y = ddp[r]->forward(Tensor::full({2, 8}, 0.5f, Device("sim", r)));
        ddp[r]->backward(Tensor::full(y.shape(), 1.f, y.device()));
        errors[r] = "returned";
      } catch (const InvalidArgument& e) {
        errors[r] = e.what();
      } catch (const std::exception& e) {
        errors[r] = std::string("not an InvalidArgument: ") + e.what();
      }
    });
  for (auto& th : ranks) th.join();
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(errors[r].find("re-initialised"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  ddp.clear();
  test::init_sim(8);
}

// With fewer devices, DataParallel's forward scattered the input to sim:0 and sim:1 before its
// allocation on sim:2 failed ("allocate: device sim:2 out of range"), saying nothing of the
// re-init; it now refuses first, naming the parameter.
TEST(BackendLookup, ADataParallelOfAReplacedInstanceWithFewerDevicesIsRefusedFirst) {
  test::init_sim(4);
  auto model = nn::mlp({8, 4}, Device("sim", 0), 0);
  parallel::DataParallel dp(*model, devices("sim", 4));
  test::init_sim(2);
  expect_refused_as_reinitialised(
      [&] {
        dp.forward(Tensor::full({8, 8}, 0.5f, Device::cpu()));
      },
      "DataParallel.forward: parameter '");
  test::init_sim(8);
}

}  // namespace
}  // namespace ditto
