// Shared fixtures of the test suite (tests/*.cpp, tests/mpi/*.cpp): error expectations, the
// simulator fixture, bit-level float comparisons, the exact rank-dependent inputs of the
// collective tests, seeded random values, the check that a backend can start (or the reason
// it cannot, for GTEST_SKIP), and the ranks' errors of run_comm_ranks (tests/train_step.h: the
// training step and a thread per rank, shared with bench/). Everything is in ditto::test; a test
// file says `using namespace ditto::test;` inside its own namespace.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/base/error.h"
#include "core/data/dataset.h"
#include "core/nn/module.h"
#include "core/numerics/determinism.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/nan_bits.h"
#include "core/runtime/tensor.h"
#include "scratch_dirs.h"  // fresh_dir, scratch_path: a test's files, removed when it passes
#include "train_step.h"

/// Expects `stmt` to throw `Exc` whose message contains `part` (a statement, for calls that
/// return void or need no lambda).
#define EXPECT_THROW_MSG(stmt, Exc, part)                                    \
  do {                                                                       \
    try {                                                                    \
      stmt;                                                                  \
      ADD_FAILURE() << "expected " #Exc " from: " #stmt;                     \
    } catch (const Exc& e) {                                                 \
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)         \
          << "message: " << e.what() << "\nexpected to contain: " << (part); \
    } catch (const std::exception& e) {                                      \
      ADD_FAILURE() << "wrong exception type from " #stmt ": " << e.what();  \
    }                                                                        \
  } while (0)

namespace ditto::test {

/// Runs `call` and expects an exception of type E whose message contains `part`; any other
/// exception, or none, is a failure that shows the message. Returns the E's message (empty when
/// none was thrown), for a test that checks more of it.
template <typename E>
std::string expect_error(const std::function<void()>& call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "expected an exception containing: " << part;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << part;
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type, message: " << e.what()
                  << "\nexpected to contain: " << part;
  }
  return "";
}

/// Runs `call` and expects a failed rank's own BackendError, whose message contains `part`: a
/// PeerFailure (another rank's failure seen by this one), any other exception, or none, fails.
inline void expect_own_backend_error(const std::function<void()>& call, const std::string& part) {
  expect_error<BackendError>(
      [&] {
        try {
          call();
        } catch (const PeerFailure& p) {  // a BackendError too: made a wrong type here
          throw std::runtime_error(std::string("expected a rank's own error, got a PeerFailure: ") +
                                   p.what());
        }
      },
      part);
}

/// expect_error<InvalidArgument>.
inline void expect_invalid(const std::function<void()>& call, const std::string& part) {
  expect_error<InvalidArgument>(call, part);
}

/// (Re)starts the process-wide simulator with `devices` virtual devices of `capacity` bytes.
inline Backend& init_sim(int devices, std::size_t capacity = BackendOptions{}.memory_capacity) {
  BackendOptions o;
  o.device_count = devices;
  o.memory_capacity = capacity;
  return init_backend("sim", o);
}

/// A fixture whose suite starts the simulator with Devices devices of Capacity bytes each:
///   using CommTest = test::SimSuite<16, std::size_t(1) << 30>;
template <int Devices, std::size_t Capacity = BackendOptions{}.memory_capacity>
class SimSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { init_sim(Devices, Capacity); }
};

/// Starts backend `name` with exactly `devices` devices (init_backend; cuda oversubscribes a
/// machine with fewer GPUs). Empty, or why it cannot, for GTEST_SKIP: "ditto built without the
/// cuda backend", "cuda backend unavailable: no CUDA device: ...".
inline std::string start_backend(const std::string& name, int devices) {
  const std::vector<std::string> names = registered_backends();
  if (std::find(names.begin(), names.end(), name) == names.end())
    return "ditto built without the " + name + " backend";
  try {
    BackendOptions o;
    o.device_count = devices;
    init_backend(name, o);
  } catch (const std::exception& e) {
    return name + " backend unavailable: " + e.what();
  }
  return "";
}

/// Empty when backend `name` is running (get_backend) with at least `min_devices` devices, after
/// restarting it with that many when it has fewer; else why not, as start_backend says.
inline std::string backend_unavailable(const std::string& name, int min_devices = 1) {
  const std::vector<std::string> names = registered_backends();
  if (std::find(names.begin(), names.end(), name) == names.end())
    return "ditto built without the " + name + " backend";
  try {
    if (get_backend(name).device_count() >= min_devices) return "";
  } catch (const std::exception& e) {
    return name + " backend unavailable: " + e.what();
  }
  return start_backend(name, min_devices);
}

/// The logical devices of the cuda tests (test_cuda*.cpp): one backend for the whole binary.
inline constexpr int kCudaTestDevices = 8;

/// A fixture whose suite starts the cuda backend with Devices logical devices and the simulator,
/// its reference, with as many; where cuda cannot start, every test skips saying why.
template <int Devices = kCudaTestDevices>
class CudaSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_reason() = start_backend("cuda", Devices);
    if (skip_reason().empty()) init_sim(Devices);
  }
  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  }
  static std::string& skip_reason() {
    static std::string reason;
    return reason;
  }
};

/// Device("sim", i): the simulator's device i.
inline Device sim_device(int i) { return Device("sim", i); }

// ---- bits of floats -----------------------------------------------------------------------------

inline std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// The bit patterns of an f32 tensor's elements.
inline std::vector<std::uint32_t> bits(const Tensor& t) {
  std::vector<std::uint32_t> b;
  for (float x : t.to_vector<float>()) b.push_back(bits(x));
  return b;
}

/// Success when `got` and `want` have the same size and the same bits, all NaNs counted as one
/// value (Note [NaN bits] in core/runtime/nan_bits.h: a NaN's sign and payload are the hardware's
/// and the compiler's choice); else the first difference (index, both values and their bits) and
/// how many elements differ. -0 and +0 differ.
inline ::testing::AssertionResult bits_equal(const std::vector<float>& got,
                                             const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  std::size_t differ = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (bits(got[i]) != bits(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i])) &&
        differ++ == 0)
      first = i;
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << got.size() << " elements differ; first at " << first << ": "
         << got[first] << " (0x" << std::hex << bits(got[first]) << ") vs " << want[first] << " (0x"
         << bits(want[first]) << ")" << std::dec;
}

/// The bytes of a tensor of any dtype on any device (copied to the host; blocks), exactly: what
/// a copy or a cast must keep (a NaN's sign and payload included).
inline std::vector<std::uint8_t> tensor_bytes(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  std::vector<std::uint8_t> b(h.nbytes());
  if (!b.empty()) std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

/// tensor_bytes with every NaN as its dtype's canonical NaN (canonicalize_nans): the bytes to
/// compare for the results of arithmetic across backends or builds (Note [NaN bits]).
inline std::vector<std::uint8_t> nan_canonical_bytes(const Tensor& t) {
  std::vector<std::uint8_t> b = tensor_bytes(t);
  canonicalize_nans(t.dtype(), b.data(), t.numel());
  return b;
}

/// Cross-entropy test logits: uniform in [-4, 4) from Philox key `seed`, stream `sub` (element i
/// is draw i), as a `dt` tensor of `shape` on `backend`:0.
inline Tensor xent_logits(const Shape& shape, DType dt, std::uint64_t seed, std::uint64_t sub,
                          const std::string& backend) {
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = uniform(seed, stream_id(kStreamSynthetic, sub), i, -4.0f, 4.0f);
  return Tensor::from_vector(v, shape).to(dt).to(Device(backend, 0));
}

/// n cross-entropy targets (i64) in [0, classes) on `backend`:0: row i's class is
/// (i * stride + 2) % classes, except row 0 (the first class) and row 1 (the last) when n > 1.
inline Tensor xent_targets(std::int64_t n, std::int64_t classes, std::uint64_t stride,
                           const std::string& backend) {
  std::vector<std::int64_t> t(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<std::int64_t>((i * stride + 2) % static_cast<std::uint64_t>(classes));
  if (n > 1) {
    t[0] = 0;
    t[1] = classes - 1;
  }
  return Tensor::from_vector(t, {n}).to(Device(backend, 0));
}

/// Runs f(0) .. f(n - 1) on one std::thread each (SPMD: a thread per rank), joins them all, then
/// rethrows the lowest rank's exception, if any.
inline void run_threads(int n, const std::function<void(int)>& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        f(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Issues per_rank(r) for every rank of `comms` (one init_all's handles), then synchronises them
/// all: from this thread as one group (group_start / group_end: the single controller), or from
/// a thread per rank (SPMD, run_threads), each thread's calls a group of their own when
/// `group_each_thread` (as a rank that both sends and receives must).
inline void issue_ranks(std::vector<Communicator>& comms, bool spmd,
                        const std::function<void(int)>& per_rank, bool group_each_thread = false) {
  const int n = static_cast<int>(comms.size());
  if (!spmd) {
    group_start();
    for (int r = 0; r < n; ++r) per_rank(r);
    group_end();
  } else {
    run_threads(n, [&](int r) {
      if (group_each_thread) group_start();
      per_rank(r);
      if (group_each_thread) group_end();
    });
  }
  synchronize(comms);
}

/// Fails the test once for every rank that threw, with its message ("rank 2 threw: ...").
inline void expect_no_rank_errors(const std::vector<std::exception_ptr>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r)
    if (errors[r]) ADD_FAILURE() << "rank " << r << " threw: " << what_of(errors[r]);
}

/// run_comm_ranks over sim:0..world-1 in `mode` (a rank that throws ends the others' waits
/// within timeout_ms), then expect_no_rank_errors.
inline void run_ranks_ok(int world, Determinism mode,
                         const std::function<void(int, Communicator&)>& fn,
                         std::int64_t timeout_ms = 30000) {
  CommOptions co;
  co.determinism = mode;
  co.timeout_ms = timeout_ms;
  expect_no_rank_errors(run_comm_ranks(world, co, fn));
}

/// True when some element of a and b (same size) differs in its bits.
inline bool any_bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  return !bits_equal(a, b);
}

/// Synthetic classification data on the host: n samples of f features, labels [n] i64 in
/// [0, classes) from philox_u32(seed, stream_id(kStreamSynthetic, sub), i), features [n, f] f32
/// uniform in [-1, 1) from stream sub + 1, plus `shift` on feature j == label (so it is learnable).
inline data::Dataset synthetic_classes(std::int64_t n, std::int64_t f, std::int64_t classes,
                                       std::uint64_t seed, std::uint64_t sub, float shift) {
  std::vector<float> x(static_cast<std::size_t>(n * f));
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = philox_u32(seed, stream_id(kStreamSynthetic, sub), i) % classes;
    for (std::int64_t j = 0; j < f; ++j)
      x[i * f + j] = uniform(seed, stream_id(kStreamSynthetic, sub + 1), i * f + j, -1, 1) +
                     (j == y[i] ? shift : 0.0f);
  }
  data::Dataset d;
  d.features = Tensor::from_vector(x, {n, f});
  d.labels = Tensor::from_vector(y, {n});
  return d;
}

/// Every parameter's values of `module`, in parameters() order, on the host (what a bitwise
/// comparison of two trainings compares).
inline std::vector<float> parameter_values(nn::Module& module) {
  std::vector<float> all;
  for (nn::Parameter* p : module.parameters()) {
    const std::vector<float> v = p->data.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// ---- seeded values ------------------------------------------------------------------------------

/// n values uniform in [lo, hi) from std::mt19937(seed). Defined in tests/main/seeded_values.cpp,
/// which is never compiled at -O0, not even where the other test sources are (Note [Test sources
/// at -O0]): std::uniform_real_distribution's generate_canonical at -O0 calls logl per value.
std::vector<float> random_values(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                 float hi = 1.0f);

/// n values of mixed magnitudes (1e-4 .. 1e4, both signs) from std::mt19937(seed), so that the
/// order of a sum shows in its bits. Defined in tests/main/seeded_values.cpp, as random_values.
std::vector<float> mixed_values(std::size_t n, std::uint32_t seed);

/// A value of rank r, element i of widely different magnitudes (2^-12 .. 2^28, both signs) from a
/// hash salted by `salt`: a sum over ranks in another order than the canonical tree differs in
/// its bits.
inline float mixed_rank_value(int r, std::int64_t i, std::uint32_t salt) {
  std::uint32_t h = static_cast<std::uint32_t>(r * 2654435761u + i * 40503u + salt);
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const int e = static_cast<int>(h % 40) - 12;
  const float m = 1.0f + static_cast<float>((h >> 8) % 1000) / 1000.0f;
  return ((h >> 20) & 1 ? -1.0f : 1.0f) * std::ldexp(m, e);
}

/// The canonical tree (Note [Canonical tree]) over ranks [lo, hi) of value(r, i), in f32.
inline float host_tree(int lo, int hi, std::int64_t i,
                       const std::function<float(int, std::int64_t)>& value) {
  if (hi - lo == 1) return value(lo, i);
  const int mid = static_cast<int>(tree_mid(lo, hi));
  return host_tree(lo, mid, i, value) + host_tree(mid, hi, i, value);
}

// ---- exact rank-dependent inputs of the collective tests ----------------------------------------

/// Small non-zero multiples of 0.5 (|x| <= 2.5) for rank r, element i: sums, products and
/// averages over up to 8 ranks are exact in f32, so a host reference does not depend on the
/// order of the reduction (fast mode may use any).
inline float exact_f32(int r, std::int64_t i) {
  int k = static_cast<int>((r * 7 + i * 3 + 1) % 10) - 5;  // -5..4
  if (k >= 0) ++k;                                         // -5..-1, 1..5
  return static_cast<float>(k) * 0.5f;
}

/// exact_f32 times two plus a large term on every third element, to use all 64 bits.
inline std::int64_t exact_i64(int r, std::int64_t i) {
  return static_cast<std::int64_t>(exact_f32(r, i) * 2.0f) +
         (i % 3 == 0 ? (static_cast<std::int64_t>(r + 1) << 33) : 0);
}

/// exact_f32 or exact_i64 of rank r for elements [offset, offset + count).
template <typename T>
std::vector<T> exact_inputs(int r, std::int64_t count, std::int64_t offset = 0) {
  std::vector<T> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, float>)
      v[static_cast<std::size_t>(i)] = exact_f32(r, offset + i);
    else
      v[static_cast<std::size_t>(i)] = exact_i64(r, offset + i);
  }
  return v;
}

}  // namespace ditto::test
