// Tests of the simulator backend and the core types it serves: memory accounting and
// out-of-memory errors, streams and events (ordering across devices, errors rethrown by
// synchronize, real overlap between devices), Device parsing, and Tensor copies and views
// between devices and the host.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "backend_sim/sim_backend.h"
#include "core/backend_api/asan.h"
#include "core/base/error.h"
#include "core/runtime/backend.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

class SimBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { init_sim(16); }
};

// Spin until `flag` is set or `timeout` passes; true when set.
bool wait_for_flag(const std::atomic<bool>& flag, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// ---- memory ---------------------------------------------------------------------------------

TEST_F(SimBackendTest, MemoryAccountingFollowsTensors) {
  Backend& b = get_backend("sim");
  EXPECT_EQ(b.device_count(), 16);
  EXPECT_EQ(b.name(), "sim");
  const int d = 13;
  b.default_stream(d).synchronize();
  const MemoryStats before = b.memory_stats(d);
  EXPECT_EQ(before.capacity, BackendOptions{}.memory_capacity);
  EXPECT_EQ(b.properties(d).total_memory, before.capacity);
  {
    Tensor t1 = Tensor::empty({1000}, DType::f32, sim_device(d));
    Tensor t2 = Tensor::empty({10, 10}, DType::i64, sim_device(d));
    MemoryStats during = b.memory_stats(d);
    EXPECT_EQ(during.in_use, before.in_use + 4000 + 800);
    EXPECT_GE(during.peak, during.in_use);
  }
  b.default_stream(d).synchronize();  // frees are stream-ordered
  MemoryStats after = b.memory_stats(d);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_GE(after.peak, before.in_use + 4800);
  b.reset_peak_memory(d);
  EXPECT_EQ(b.memory_stats(d).peak, after.in_use);
  // Other devices are untouched.
  EXPECT_EQ(b.memory_stats(14).in_use, 0u);
}

TEST(SimBackendMemory, OutOfMemoryNamesDeviceRequestUseAndCapacity) {
  BackendOptions o;
  o.device_count = 2;
  o.memory_capacity = 4096;
  init_backend("sim", o);
  {
    Tensor t = Tensor::empty({768}, DType::f32, sim_device(1));  // 3072 bytes in use
    EXPECT_THROW_MSG(Tensor::empty({512}, DType::f32, sim_device(1)), OutOfMemory,
                     "sim:1: out of memory: tried to allocate 2048 bytes; 3072 bytes in use of "
                     "capacity 4096 bytes");
    // The failed request left nothing behind; the remainder still fits.
    EXPECT_EQ(get_backend("sim").memory_stats(1).in_use, 3072u);
    Tensor fits = Tensor::empty({256}, DType::f32, sim_device(1));
    EXPECT_EQ(get_backend("sim").memory_stats(1).in_use, 4096u);
  }
  EXPECT_THROW_MSG(Tensor::empty({2000}, DType::f32, sim_device(0)), OutOfMemory,
                   "sim:0: out of memory");
  // A device's memory, said by its kind (ditto-train matched the message's text to tell it from
  // a host allocation's).
  try {
    Tensor::empty({2000}, DType::f32, sim_device(0));
    ADD_FAILURE() << "no OutOfMemory";
  } catch (const OutOfMemory& e) {
    EXPECT_EQ(e.kind(), OutOfMemory::Kind::device);
  }
  EXPECT_THROW_MSG(Tensor::empty({1}, DType::f32, sim_device(2)), InvalidArgument, "sim:2");
  init_sim(16);  // leave the default instance for the next tests
  EXPECT_EQ(get_backend("sim").device_count(), 16);
}

// Note [Block cache]: a block freed on a device comes back for that device's next allocation of
// the same rounded size, never for another device's, and the counters count live bytes only.
TEST_F(SimBackendTest, AFreedBlockIsReusedByItsDeviceOnlyAndIsNotCountedInUse) {
  Backend& b = get_backend("sim");
  const int d = 11, other = 12;
  b.default_stream(d).synchronize();
  const std::size_t base = b.memory_stats(d).in_use;
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, sim_device(d));  // 4000 bytes: a 4032-byte block
    first = t.data_ptr();
  }
  b.default_stream(d).synchronize();  // the free runs in stream order
  EXPECT_EQ(b.memory_stats(d).in_use, base);
  {
    Tensor on_other = Tensor::empty({1000}, DType::f32, sim_device(other));
    EXPECT_NE(on_other.data_ptr(), first) << "a device took another device's cached block";
    Tensor bigger = Tensor::empty({1009}, DType::f32, sim_device(d));  // 4036 bytes: a 4096 block
    EXPECT_NE(bigger.data_ptr(), first) << "a 4032-byte block for 4036 bytes";
    Tensor again = Tensor::empty({1003}, DType::f32, sim_device(d));  // 4012 bytes: the same block
    EXPECT_EQ(again.data_ptr(), first);
    EXPECT_EQ(b.memory_stats(d).in_use, base + 4036 + 4012);
  }
  b.default_stream(d).synchronize();
  b.default_stream(other).synchronize();
  EXPECT_EQ(b.memory_stats(d).in_use, base);
}

// A cached block is poisoned under ASan, so a use after free is still caught (CI's build).
TEST_F(SimBackendTest, ACachedBlockIsPoisonedUnderAsan) {
#if !DITTO_ASAN
  GTEST_SKIP() << "not an ASan build: nothing poisons memory";
#else
  Backend& b = get_backend("sim");
  const int d = 10;
  void* p = nullptr;
  {
    Tensor t = Tensor::empty({64}, DType::f32, sim_device(d));
    p = t.data_ptr();
    EXPECT_FALSE(__asan_address_is_poisoned(p));
  }
  b.default_stream(d).synchronize();
  EXPECT_TRUE(__asan_address_is_poisoned(p));
  EXPECT_TRUE(__asan_address_is_poisoned(static_cast<char*>(p) + 255));
  Tensor again = Tensor::empty({64}, DType::f32, sim_device(d));
  ASSERT_EQ(again.data_ptr(), p);
  EXPECT_FALSE(__asan_address_is_poisoned(static_cast<char*>(p) + 255));
#endif
}

// ---- streams and events ---------------------------------------------------------------------

TEST_F(SimBackendTest, EventOrdersWorkAcrossDevices) {
  Backend& b = get_backend("sim");
  auto s0 = b.create_stream(0);
  auto s1 = b.create_stream(1);
  auto ev = b.create_event(0);
  EXPECT_TRUE(ev->query());  // never recorded: complete
  std::atomic<bool> release{false};
  std::atomic<int> value{0};
  int seen = -1;
  sim::as_sim(*s0, "test").enqueue([&] {
    wait_for_flag(release, std::chrono::seconds(5));
    value = 42;
  });
  s0->record(*ev);
  s1->wait(*ev);
  sim::as_sim(*s1, "test").enqueue([&] { seen = value.load(); });
  EXPECT_FALSE(ev->query());  // s0 is held by `release`
  release = true;
  s1->synchronize();
  EXPECT_EQ(seen, 42);
  ev->synchronize();
  EXPECT_TRUE(ev->query());
}

TEST_F(SimBackendTest, CrossDeviceCopyIsOrderedAfterProducer) {
  // A slow producer on sim:2, a copy to sim:3: the copy must see the produced values.
  Tensor src = Tensor::zeros({4}, DType::f32, sim_device(2));
  float* p = src.data<float>();
  sim::as_sim(current_stream(sim_device(2)), "test").enqueue([p] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int i = 0; i < 4; ++i) p[i] = float(i + 1);
  });
  Tensor dst = src.to(sim_device(3));
  EXPECT_EQ(dst.device(), sim_device(3));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(SimBackendTest, ErrorInStreamTaskIsRethrownBySynchronize) {
  Stream& s = get_backend("sim").default_stream(4);
  sim::as_sim(s, "test").enqueue([] { throw BackendError("sim:4: injected fault"); });
  EXPECT_THROW_MSG(s.synchronize(), BackendError, "injected fault");
  EXPECT_NO_THROW(s.synchronize());  // reported once, then cleared
  // The stream still runs work in order.
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) sim::as_sim(s, "test").enqueue([&order, i] { order.push_back(i); });
  s.synchronize();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  Tensor t = Tensor::full({3}, 2.5f, sim_device(4));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
}

TEST_F(SimBackendTest, WorkOnTwoDevicesOverlaps) {
  // Each task waits (bounded) for the other to have started: both succeed only if they run at
  // the same time.
  Backend& b = get_backend("sim");
  std::atomic<bool> started0{false}, started1{false};
  std::atomic<bool> saw1{false}, saw0{false};
  sim::as_sim(b.default_stream(5), "test").enqueue([&] {
    started0 = true;
    saw1 = wait_for_flag(started1, std::chrono::seconds(5));
  });
  sim::as_sim(b.default_stream(6), "test").enqueue([&] {
    started1 = true;
    saw0 = wait_for_flag(started0, std::chrono::seconds(5));
  });
  b.default_stream(5).synchronize();
  b.default_stream(6).synchronize();
  EXPECT_TRUE(saw1.load());
  EXPECT_TRUE(saw0.load());
}

TEST_F(SimBackendTest, AsSimRejectsOtherStreams) {
  Stream& host = get_backend("cpu").default_stream(0);
  EXPECT_THROW_MSG(sim::as_sim(host, "gemm"), InvalidArgument,
                   "gemm: stream of device cpu is not a sim stream");
}

// ---- Device ---------------------------------------------------------------------------------

// dtype_size and dtype_name switch over every DType; a value outside the enumeration (a corrupt
// byte) throws instead of passing for i64, as the ternaries they replaced did.
TEST(DType, SizeAndNameOfEveryDTypeAndAnErrorForAnyOtherValue) {
  static_assert(dtype_size(DType::f32) == 4 && dtype_size(DType::i64) == 8);
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::i64), "i64");
  const auto bad = static_cast<DType>(200);
  const char* every = "(expected one of f32, i64, f64, f16, bf16, i8, u8, i32, u32, u64, "
                      "f8_e4m3, f8_e5m2)";
  EXPECT_THROW_MSG(dtype_size(bad), InternalError,
                   std::string("dtype_size: unknown DType value 200 ") + every);
  EXPECT_THROW_MSG(dtype_name(bad), InternalError,
                   std::string("dtype_name: unknown DType value 200 ") + every);
}

TEST(DeviceParse, GoodInputs) {
  Device d = Device::parse("sim:3");
  EXPECT_EQ(d.type, "sim");
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(d.str(), "sim:3");
  EXPECT_EQ(Device::parse("cuda:0"), Device("cuda", 0));
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cpu").str(), "cpu");
  EXPECT_EQ(Device::parse("sim"), Device("sim", 0));
  EXPECT_EQ(Device::parse("sim:1023").index, 1023);
  EXPECT_LT(Device("sim", 1), Device("sim", 2));
  EXPECT_NE(Device("sim", 1), Device("cuda", 1));
}

TEST(DeviceParse, BadInputs) {
  EXPECT_THROW_MSG(Device::parse(""), InvalidArgument, "Device::parse: expected 'type[:index]'");
  EXPECT_THROW_MSG(Device::parse(":1"), InvalidArgument, "got ':1'");
  for (const char* bad : {"sim:", "sim:-1", "sim:x", "sim:1x", "sim: 1"})
    EXPECT_THROW_MSG(Device::parse(bad), InvalidArgument,
                     std::string("expected a non-negative index after ':' in '") + bad + "'");
}

TEST_F(SimBackendTest, DeviceOutOfRange) {
  EXPECT_THROW_MSG(Tensor::empty({4}, DType::f32, sim_device(16)), InvalidArgument,
                   "device sim:16 out of range (sim has 16 devices)");
  EXPECT_THROW_MSG(Device("nope", 0).backend(), InvalidArgument, "unknown backend 'nope'");
  EXPECT_THROW_MSG(devices("sim", 17), InvalidArgument, "expected a count in [1, 16]");
  EXPECT_EQ(devices("sim", 3).back(), sim_device(2));
}

// ---- Tensor ---------------------------------------------------------------------------------

TEST_F(SimBackendTest, TensorRoundTripsAndViews) {
  std::vector<float> v(12);
  for (int i = 0; i < 12; ++i) v[i] = float(i) * 0.5f;
  Tensor t = Tensor::from_vector(v, {4, 3}, sim_device(7));
  EXPECT_EQ(t.str(), "[4, 3] f32 on sim:7");
  EXPECT_EQ(t.to_vector<float>(), v);
  // narrow: rows [1, 3)
  Tensor n = t.narrow(1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 3}));
  EXPECT_EQ(n.to_vector<float>(), std::vector<float>(v.begin() + 3, v.begin() + 9));
  // view shares storage
  Tensor w = t.view({2, -1});
  EXPECT_EQ(w.shape(), (Shape{2, 6}));
  EXPECT_EQ(w.buffer(), t.buffer());
  EXPECT_THROW_MSG(t.view({5, -1}), InvalidArgument,
                   "Tensor::view: cannot view [4, 3] f32 on sim:7");
  EXPECT_THROW_MSG(t.narrow(3, 2), InvalidArgument, "Tensor::narrow: rows [3, 5) out of range");
  // i64 round trip
  std::vector<std::int64_t> labels = {3, -1, 7};
  EXPECT_EQ(Tensor::from_vector(labels, {3}, sim_device(7)).to_vector<std::int64_t>(), labels);
  EXPECT_THROW_MSG(t.to_vector<std::int64_t>(), InvalidArgument,
                   "Tensor::to_vector: tensor is f32, asked for i64");
  EXPECT_THROW_MSG(Tensor::from_vector(v, {5, 3}, sim_device(7)), InvalidArgument,
                   "Tensor::from_vector: expected 15 values for shape [5, 3], got 12");
}

// Regression (UBSan): sizes were multiplied unchecked (signed overflow), a byte count past 2^64
// wrapped to a buffer far too small for the tensor, and narrow's start + length could overflow.
TEST_F(SimBackendTest, TensorSizesThatOverflowAreRejected) {
  const std::int64_t big = std::int64_t(1) << 40;
  // Tensor::empty (and zeros, full, from_vector through it) names itself (tester3: the message
  // named no call).
  EXPECT_THROW_MSG(Tensor::empty({big, big}, DType::f32, sim_device(0)), InvalidArgument,
                   "Tensor::empty: shape: expected at most 9223372036854775807 elements in all, "
                   "got [1099511627776, 1099511627776] (the sizes multiply past that)");
  EXPECT_THROW_MSG(Tensor::empty({-1}, DType::f32, sim_device(0)), InvalidArgument,
                   "Tensor::empty: shape: expected sizes >= 0, got [-1]");
  EXPECT_THROW_MSG(Tensor::zeros({2, -3}, DType::f32, sim_device(0)), InvalidArgument,
                   "Tensor::empty: shape: expected sizes >= 0, got [2, -3]");
  EXPECT_THROW_MSG(shape_numel({3, big, big, 1}), InvalidArgument,
                   "shape [3, 1099511627776, 1099511627776, 1]: expected at most");
  EXPECT_THROW_MSG(shape_numel({big, -1, big}), InvalidArgument,
                   "shape [1099511627776, -1, 1099511627776]: sizes must be non-negative");
  // 2^61 i64 elements: the count fits in int64, the 2^64 bytes do not.
  EXPECT_THROW_MSG(Tensor::empty({std::int64_t(1) << 61}, DType::i64, Device::cpu()),
                   InvalidArgument,
                   "Tensor::empty: shape [2305843009213693952] i64: expected at most "
                   "9223372036854775807 bytes, got 2305843009213693952 elements of 8 bytes");
  EXPECT_THROW_MSG(Tensor::zeros({std::int64_t(1) << 62}, DType::f32, sim_device(0)),
                   InvalidArgument,
                   "Tensor::empty: shape [4611686018427387904] f32: expected at most");
  // A size of 0 makes the product 0, whatever the other sizes.
  EXPECT_EQ(shape_numel({big, big, 0}), 0);
  EXPECT_EQ(Tensor::empty({big, big, 0}, DType::f32, sim_device(0)).numel(), 0);

  Tensor t = Tensor::full({4, 3}, 1.0f, sim_device(0));
  EXPECT_THROW_MSG(t.view({big, big, -1}), InvalidArgument,
                   "Tensor::view: shape [1099511627776, 1099511627776, -1]: expected at most "
                   "9223372036854775807 elements in all");
  EXPECT_THROW_MSG(t.view({big, big}), InvalidArgument,
                   "Tensor::view: shape [1099511627776, "
                   "1099511627776]: expected at most");
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_THROW_MSG(t.narrow(2, max), InvalidArgument,
                   "Tensor::narrow: rows [2, 2 + 9223372036854775807) out of range for [4, 3] f32 "
                   "on sim:0");
  EXPECT_THROW_MSG(
      t.narrow(max, 1), InvalidArgument,
      "Tensor::narrow: rows [9223372036854775807, 9223372036854775807 + 1) out of range");
  EXPECT_EQ(t.narrow(1, 3).numel(), 9);
}

TEST_F(SimBackendTest, CopiesAcrossDevicesAndHost) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6};
  Tensor host = Tensor::from_vector(v, {3, 2});
  EXPECT_TRUE(host.device().is_cpu());
  Tensor a = host.to(sim_device(8));
  Tensor b = a.to(sim_device(9));
  EXPECT_EQ(b.device(), sim_device(9));
  EXPECT_EQ(b.to(Device::cpu()).to_vector<float>(), v);
  EXPECT_EQ(a.to(sim_device(8)).buffer(), a.buffer());  // already there: same storage
  // copy_ into a narrowed view on another device leaves the other rows alone.
  Tensor dst = Tensor::zeros({3, 2}, DType::f32, sim_device(10));
  Tensor rows = dst.narrow(1, 2);
  rows.copy_(a.narrow(0, 2));
  EXPECT_EQ(dst.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4}));
  // host <- device view
  Tensor back = Tensor::zeros({1, 2}, DType::f32, Device::cpu());
  back.copy_(b.narrow(2, 1));
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{5, 6}));
  // clone is independent storage
  Tensor c = a.clone();
  EXPECT_NE(c.buffer(), a.buffer());
  EXPECT_EQ(c.to_vector<float>(), v);
  EXPECT_THROW_MSG(dst.copy_(Tensor::zeros({2, 3}, DType::f32, sim_device(8))), InvalidArgument,
                   "Tensor::copy_: expected src [3, 2] f32, got [2, 3] f32 on sim:8");
  // zero-size tensors copy fine
  Tensor e = Tensor::empty({0, 2}, DType::f32, sim_device(8));
  EXPECT_EQ(e.to(sim_device(9)).numel(), 0);
  EXPECT_TRUE(e.to(Device::cpu()).to_vector<float>().empty());
  // item
  EXPECT_EQ(Tensor::full({}, 3.5f, sim_device(11)).item(), 3.5f);
  EXPECT_THROW_MSG(a.item(), InvalidArgument, "Tensor::item: expected a one-element f32 tensor");
}

// Tester 6, F11: a host allocation that failed said only "sim:0: host out of memory allocating N
// bytes" (the simulator's) or "cpu: out of memory allocating N bytes" (a host tensor's), not that
// simulated devices hold their tensors in this machine's RAM nor that --dry-run holds none.
// Both are std::aligned_alloc's (a null return, no exception), so OutOfMemory Kind::host (not the
// device hint ditto-train gives for Kind::device). Under ASan or TSan their allocators abort on a
// request this size unless allocator_may_return_null=1, which the ctest entry
// SimBackendHostMemory.UnderTheSanitizers sets (tests/CMakeLists.txt); without it, skipped.
#if defined(__SANITIZE_THREAD__)
#define DITTO_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DITTO_TEST_TSAN 1
#endif
#endif
#if DITTO_ASAN || defined(DITTO_TEST_TSAN)
/// Whether the sanitizer's allocator returns null for a failing request (its *SAN_OPTIONS).
bool sanitizer_may_return_null() {
  const char* o = std::getenv(DITTO_ASAN ? "ASAN_OPTIONS" : "TSAN_OPTIONS");
  return o && std::string(o).find("allocator_may_return_null=1") != std::string::npos;
}
#else
bool sanitizer_may_return_null() { return true; }
#endif

/// The OutOfMemory that `f` throws (a failure when it throws none).
template <typename F>
OutOfMemory::Kind oom_kind(const F& f) {
  try {
    f();
  } catch (const OutOfMemory& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no OutOfMemory";
  return OutOfMemory::Kind::device;
}

TEST(SimBackendHostMemory, AFailedHostAllocationNamesTheRamAndDryRun) {
  if (!sanitizer_may_return_null())
    GTEST_SKIP() << "the sanitizer's allocator aborts on a 2^61-byte request without "
                    "allocator_may_return_null=1 (ctest SimBackendHostMemory.UnderTheSanitizers)";
  BackendOptions o;
  o.device_count = 2;
  o.memory_capacity = std::size_t(1) << 62;  // the device fits it; the host cannot
  sim::SimBackend sim(o);
  const std::string m = expect_error<OutOfMemory>(
      [&] { sim.allocate(1, std::size_t(1) << 61); },
      "sim:1: host out of memory allocating 2305843009213693952 bytes (2199023255552.00 MiB): "
      "the simulated devices' memory lives in this machine's RAM (the simulator holds ");
  EXPECT_NE(m.find(" across its 2 devices; this machine has "), std::string::npos) << m;
  EXPECT_NE(m.find(", less under a ulimit): --dry-run predicts a model larger than the machine "
                   "without holding its tensors"),
            std::string::npos)
      << m;
  EXPECT_EQ(oom_kind([&] { sim.allocate(1, std::size_t(1) << 61); }), OutOfMemory::Kind::host);
  EXPECT_EQ(sim.memory_stats(1).in_use, 0u);  // nothing charged for the failed request
  const std::string h = expect_error<OutOfMemory>(
      [&] { get_backend("cpu").allocate(0, std::size_t(1) << 61); },
      "cpu: out of memory allocating 2305843009213693952 bytes (2199023255552.00 MiB): host "
      "tensors live in this machine's RAM (");
  EXPECT_NE(h.find("--dry-run predicts a model larger than the machine"), std::string::npos) << h;
  // A host tensor of that size (Tensor::empty on the CPU): the same.
  EXPECT_EQ(oom_kind([&] { Tensor::empty({std::int64_t(1) << 59}, DType::f32, Device::cpu()); }),
            OutOfMemory::Kind::host);
}

}  // namespace
}  // namespace ditto
