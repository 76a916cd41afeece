// get_backend()'s per-thread cache (Note [Backend lookup cache] in core/runtime/backend.cpp): after
// init_backend() replaces an instance, every thread (also one that looked the old instance up
// just before) gets the new one, and Device::backend() follows; a tensor of the old instance stays
// readable.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"

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

}  // namespace
}  // namespace ditto
