// get_backend()'s per-thread cache (Note [Backend lookup cache] in core/runtime/backend.cpp): after
// init_backend() replaces an instance, every thread (also one that looked the old instance up
// just before) gets the new one, and Device::backend() follows.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "core/base/error.h"
#include "core/runtime/backend.h"

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

}  // namespace
}  // namespace ditto
