// GPU tests of the CUDA backend's defects found by reading before its first GPU run (issue 28):
// each one fails without its fix on a GPU, where the CPU cannot show it (their decisions are
// checked on any machine in test_cuda_host_logic.cpp). Without a usable GPU every test reports
// SKIPPED with the reason; tools/gpu-check-tests.txt lists them for the GPU check, which runs
// them first. Needs a build with the CUDA backend (it reaches backend_cuda/ directly). At the end,
// CudaNcclOneRank: review 3's coverage test of the NCCL path, which no run on one GPU reaches.
#if defined(DITTO_TEST_CUDA_BUILT)
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_bitwise.h"
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_nccl.h"
#include "backend_cuda/cuda_stream.h"
#include "core/backend_api/collective_call.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/dtype.h"
#include "core/runtime/ops.h"
#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;

using CudaFixes = CudaSuite<>;  // kCudaTestDevices

cuda::CudaBackend& cuda_backend() { return cuda::as_cuda_backend(get_backend("cuda"), "test"); }

// all_reduce(t, t, premul_sum 0.5) on a one-rank communicator: t * 0.5 (before the fix the
// in-GPU transport dropped the only destination as a copy onto itself and t stayed unchanged);
// in-place avg, reduce and reduce_scatter alike, each against the simulator's bits.
TEST_F(CudaFixes, OneRankInPlacePremulSumAndAvgWriteTheResult) {
  auto run = [](const char* backend) {
    std::vector<std::vector<std::uint8_t>> out;
    auto comms = Communicator::init_all(devices(backend, 1));
    const std::vector<float> v = {1.0f, -3.0f, 0.75f, 1e-3f, 7.0f};
    auto fresh = [&] { return Tensor::from_vector(v, {5}).to(comms[0].device()); };
    Tensor a = fresh();
    comms[0].all_reduce(a, a, PreMulSum{0.5});
    Tensor b = fresh();
    comms[0].reduce(b, b, PreMulSum{0.5}, 0);
    Tensor c = fresh();
    comms[0].reduce_scatter(c, c, PreMulSum{-2.0});
    Tensor d = fresh();
    comms[0].all_reduce(d, d, ReduceOp::avg);
    synchronize(comms);
    for (const Tensor* t : {&a, &b, &c, &d}) out.push_back(nan_canonical_bytes(*t));
    return out;
  };
  const auto cuda = run("cuda"), sim = run("sim");
  EXPECT_EQ(cuda, sim);
  std::vector<float> a(5);
  std::memcpy(a.data(), cuda[0].data(), sizeof(float) * 5);
  EXPECT_EQ(a, (std::vector<float>{0.5f, -1.5f, 0.375f, 0.5e-3f, 3.5f}));
}

// Casts of NaN between f64 and f32 / f16 / bf16 / fp8 keep sign and payload as x86 (the
// simulator) does (Note [CUDA NaN casts]); before the fix the GPU's cvt gave the canonical NaN.
TEST_F(CudaFixes, NanCastsKeepSignAndPayloadLikeTheSimulator) {
  const std::vector<std::uint64_t> nans = {0x7ff8000000000000ull, 0xfff8000000000123ull,
                                           0x7ff4000020000000ull, 0xfff0123456789abcull,
                                           0x7ffabcdef0000000ull, 0xfff0000000000001ull};
  auto cast_all = [&](const char* backend) {
    std::vector<std::vector<std::uint8_t>> out;
    Tensor h = Tensor::empty({static_cast<std::int64_t>(nans.size())}, DType::f64, Device::cpu());
    std::memcpy(h.data_ptr(), nans.data(), nans.size() * 8);
    Tensor x = h.to(Device(backend, 0));
    for (DType to : {DType::f32, DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2}) {
      Tensor y = x.to(to);
      out.push_back(tensor_bytes(y));
      out.push_back(tensor_bytes(y.to(DType::f64)));  // and back: f32 / small -> f64
    }
    return out;
  };
  const auto cuda = cast_all("cuda"), sim = cast_all("sim");
  ASSERT_EQ(cuda.size(), sim.size());
  for (std::size_t i = 0; i < cuda.size(); ++i) EXPECT_EQ(cuda[i], sim[i]) << "cast #" << i;
  std::uint32_t f;  // f64 0xfff8000000000123 -> f32: sign and top payload bits kept
  std::memcpy(&f, cuda[0].data() + 4, 4);
  EXPECT_EQ(f, 0xffc00000u);
  std::memcpy(&f, cuda[0].data() + 12, 4);  // 0xfff0123456789abc: signalling, quieted
  EXPECT_EQ(f, 0xffc091a2u);
}

// One cuBLAS handle per stream, with its own workspace: two host threads running fast-mode
// GEMMs on two streams of one device each get their own handle (before: one handle per device,
// re-targeted with cublasSetStream by each call, so one thread's GEMM could run on the other's
// stream), and both results are right.
TEST_F(CudaFixes, CublasHandlePerStreamForThreadsSharingADevice) {
  Backend& b = get_backend("cuda");
  auto s1 = b.create_stream(0), s2 = b.create_stream(0);
  cuda::CudaStream& c1 = cuda::as_cuda(*s1, "test");
  cuda::CudaStream& c2 = cuda::as_cuda(*s2, "test");
  EXPECT_NE(c1.cublas(), c2.cublas());
  EXPECT_EQ(c1.cublas(), c1.cublas());
  const std::int64_t n = 256;
  // A = all 1, B = k on row k: every element of C = sum_k k * 1 = n (n - 1) / 2, exact in f32.
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), bm(static_cast<std::size_t>(n * n));
  for (std::int64_t k = 0; k < n; ++k)
    for (std::int64_t j = 0; j < n; ++j) bm[static_cast<std::size_t>(k * n + j)] = float(k);
  Tensor A = Tensor::from_vector(a, {n, n}).to(Device("cuda", 0));
  Tensor B = Tensor::from_vector(bm, {n, n}).to(Device("cuda", 0));
  Tensor C1 = Tensor::zeros({n, n}, DType::f32, Device("cuda", 0));
  Tensor C2 = Tensor::zeros({n, n}, DType::f32, Device("cuda", 0));
  // The zero fills ran on the default stream; s1 and s2 (non-blocking streams) do not wait for
  // it: a fill still running when a GEMM wrote C would leave zeros in C.
  b.default_stream(0).synchronize();
  auto gemms = [&](Stream& s, Tensor& C, float alpha) {
    for (int i = 0; i < 50; ++i)
      b.kernels().gemm(s, false, false, n, n, n, alpha, static_cast<const float*>(A.data_ptr()), n,
                       static_cast<const float*>(B.data_ptr()), n, 0.0f,
                       static_cast<float*>(C.data_ptr()), n, Determinism::fast);
    s.synchronize();
  };
  std::thread t1([&] { gemms(*s1, C1, 1.0f); });
  std::thread t2([&] { gemms(*s2, C2, 2.0f); });
  t1.join();
  t2.join();
  const float sum = float(n * (n - 1) / 2);
  for (float x : C1.to(Device::cpu()).to_vector<float>()) ASSERT_EQ(x, sum);
  for (float x : C2.to(Device::cpu()).to_vector<float>()) ASSERT_EQ(x, 2 * sum);
}

// memory_stats().peak counts only allocations that succeeded: a request that fits the capacity
// but that CUDA cannot grant (the whole GPU's memory: the context holds some) leaves it as it
// was (before, the peak was raised before CUDA was asked).
// A PyTorch wheel's NCCL older than the headers ditto was built with (2.27 under 2.28's): its
// ncclAlltoAll / ncclGather / ncclScatter were hard references, an undefined symbol at load. Now
// they are looked up in the loaded library (Note [NCCL newer than the library], cuda_nccl.cpp):
// found exactly where it is 2.28 or later. Needs no GPU (ncclGetVersion and dlsym only), so it
// runs in every ctest of a CUDA build; on the GPU machine it says which NCCL PyTorch brought.
TEST(CudaNcclRuntime, RootedCallsAreFoundExactlyWhereTheLoadedNcclHasThem) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  const bool native = cuda::nccl_has_rooted_calls();
  std::printf("note: the loaded NCCL is %d (headers: %d): all_to_all / gather / scatter %s\n",
              version, NCCL_VERSION_CODE,
              native ? "call ncclAlltoAll / ncclGather / ncclScatter"
                     : "send and receive per peer (ncclSend / ncclRecv)");
  EXPECT_EQ(native, version >= cuda::nccl_version_code(2, 28, 0)) << "NCCL " << version;
}

// Review: CudaCommunicator held a plain CudaBackend&: a program that re-created the backend
// (init_backend("cuda", ...)) or dropped it before its communicators left them pointing at a
// destroyed backend (the bitwise NCCL path allocates its scratch from it). The communicator now
// holds the backend while it lives, as a Buffer does.
TEST_F(CudaFixes, CommunicatorKeepsItsBackendAlive) {
  BackendOptions o;
  o.device_count = 2;
  auto be = std::make_shared<cuda::CudaBackend>(o);
  const std::weak_ptr<cuda::CudaBackend> weak = be;
  std::shared_ptr<CommunicatorImpl> comm = be->create_communicator({0, 1}, CommOptions{});
  be.reset();
  EXPECT_FALSE(weak.expired()) << "the communicator does not hold its backend";
  comm.reset();
  EXPECT_TRUE(weak.expired()) << "the backend outlived its last communicator";
  // A backend no shared_ptr owns (on the stack) has nothing to hold: still a communicator.
  cuda::CudaBackend local(o);
  EXPECT_EQ(local.keep_alive(), nullptr);
  EXPECT_NE(local.create_communicator({0, 1}, CommOptions{}), nullptr);
}

TEST_F(CudaFixes, PeakIgnoresAnAllocationThatFailed) {
  Backend& b = get_backend("cuda");
  b.default_stream(0).synchronize();
  const MemoryStats before = b.memory_stats(0);
  const std::size_t ask = before.capacity - before.in_use;
  EXPECT_THROW((void)b.allocate(0, ask), OutOfMemory);
  const MemoryStats after = b.memory_stats(0);
  EXPECT_EQ(after.peak, before.peak);
  EXPECT_EQ(after.in_use, before.in_use);
}

// Each logical device has its own pool with a finite release threshold (before: every logical
// device of a GPU used the GPU's default pool, which kept every freed byte), and memory freed on
// another logical device of the same GPU is reclaimed when an allocation fails: every stream of
// the GPU is synchronised and every pool on it trimmed (before: only the allocating stream).
// Runs on any number of GPUs (review 3 of issue 29: it skipped unless every logical device was on
// one GPU, a skip the GPU check fails): cuda:0 and the next logical device on cuda:0's GPU (the
// suite's 8 logical devices put one there on up to 7 GPUs; on more, a backend of its own with
// one logical device more than the GPUs).
TEST_F(CudaFixes, PoolPerLogicalDeviceAndOutOfMemoryReclaimsTheWholeGpu) {
  std::unique_ptr<cuda::CudaBackend> own;  // only with 8 GPUs or more
  cuda::CudaBackend* b = &cuda_backend();
  if (b->device_count() <= b->physical_count()) {
    BackendOptions o;
    o.device_count = b->physical_count() + 1;
    own = std::make_unique<cuda::CudaBackend>(o);
    b = own.get();
  }
  const int gpu = b->physical_device(0);
  int other = -1, sharing = 0;
  for (int i = 0; i < b->device_count(); ++i) {
    if (b->physical_device(i) != gpu) continue;
    ++sharing;
    if (i > 0 && other < 0) other = i;
  }
  ASSERT_GT(other, 0) << "no second logical device on GPU " << gpu;
  cudaMemPool_t p0 = b->memory_pool(0), p1 = b->memory_pool(other);
  ASSERT_NE(p0, nullptr);
  EXPECT_NE(p0, p1);
  std::uint64_t keep = 0;
  ASSERT_EQ(cudaMemPoolGetAttribute(p0, cudaMemPoolAttrReleaseThreshold, &keep), cudaSuccess);
  const std::size_t total = b->properties(0).total_memory;
  EXPECT_EQ(keep, cuda::pool_release_threshold(total, sharing));
  // 60% of the GPU on the other logical device, freed (stream-ordered, not yet synchronised: its
  // pool keeps it), then 60% on cuda:0: only a reclaim across the GPU's pools can grant it.
  const std::size_t big = total / 10 * 6;
  void* p = b->allocate(other, big);
  b->deallocate(other, p, big);
  void* q = nullptr;
  EXPECT_NO_THROW(q = b->allocate(0, big));
  if (q) b->deallocate(0, q, big);
  b->default_stream(0).synchronize();
  b->default_stream(other).synchronize();
}

// A strided host-to-device copy made on a side stream (a StreamGuard) stages through a device
// buffer: its free is ordered after the side stream's copy (before: freed on the default stream
// while the side stream could still read it). The values arrive intact, and a later allocation
// on the default stream does not overwrite them.
TEST_F(CudaFixes, StridedHostCopyOnASideStreamKeepsItsStagingBufferUntilRead) {
  Backend& b = get_backend("cuda");
  auto side = b.create_stream(0);
  const std::int64_t rows = 512, cols = 1024;
  std::vector<float> src(static_cast<std::size_t>(rows * cols * 2));
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = float(i % 65536);
  Tensor host = Tensor::from_vector(src, {rows, cols * 2});
  Tensor dev = Tensor::zeros({rows, cols}, DType::f32, Device("cuda", 0));
  {
    StreamGuard g(*side);
    // Every other half row of host into dev: rows of cols floats, host pitch 2 * cols.
    detail::copy_block(dev, 0, cols * 4, host, 0, cols * 8, cols * 4, rows);
  }
  Tensor scribble = Tensor::full({rows, cols}, -1.0f, Device("cuda", 0));  // default stream
  side->synchronize();
  std::vector<float> got = dev.to(Device::cpu()).to_vector<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(got[static_cast<std::size_t>(r * cols + c)],
                src[static_cast<std::size_t>(r * cols * 2 + c)])
          << r << ", " << c;
}

// A host wait on a stream of a GPU with a watched communicator (Note [Waiting on NCCL work])
// ends when the watch reports an asynchronous NCCL error, or a collective past its timeout,
// aborting it, instead of blocking in cudaStreamSynchronize for ever. A host function that
// blocks until released stands in for NCCL kernels waiting for a peer that failed.
struct FakeWatch final : cuda::StreamWatch {
  std::atomic<bool> error{false};
  std::atomic<std::int64_t> pending_ms{-1};
  std::atomic<int> aborts{0};
  Report poll() override { return {error.load(), pending_ms.load(), 1000, "fake communicator"}; }
  void abort(const std::string&) noexcept override { ++aborts; }
};

TEST_F(CudaFixes, WatchedWaitEndsOnAnAsyncNcclErrorOrATimeout) {
  Backend& b = get_backend("cuda");
  cuda::CudaBackend& cb = cuda_backend();
  auto s = b.create_stream(0);
  cuda::CudaStream& cs = cuda::as_cuda(*s, "test");
  auto watch = std::make_shared<FakeWatch>();
  cuda::add_stream_watch(cb.physical_device(0), watch);
  static std::atomic<bool> release{false};
  auto block = [&] {
    release = false;
    ASSERT_EQ(cudaLaunchHostFunc(
                  cs.get(),
                  [](void*) {
                    while (!release.load()) std::this_thread::yield();
                  },
                  nullptr),
              cudaSuccess);
  };
  block();
  watch->error = true;
  EXPECT_THROW(s->synchronize(), BackendError);
  EXPECT_EQ(watch->aborts.load(), 1);
  watch->error = false;
  watch->pending_ms = 5000;  // past the watch's 1000 ms
  EXPECT_THROW(s->synchronize(), Timeout);
  EXPECT_EQ(watch->aborts.load(), 2);
  watch->pending_ms = -1;
  release = true;
  s->synchronize();  // done: returns
  cuda::remove_stream_watch(cb.physical_device(0), watch.get());
}

// A watched wait polls cudaStreamQuery, which answers cudaErrorNotReady while the stream works.
// Were that kept as the thread's last error, the next kernel launch's check (Launch::check:
// cudaGetLastError) would fail an unrelated op with "device not ready" (in the GPU check's one
// ditto_tests process, the first launch of the test after WatchedWait...). Review 2 of issue 29:
// the CPU cannot show whether CUDA keeps it (PyTorch clears the error after such a query; Paddle
// checks that none is left), so wait_for_gpu and CudaEvent::query clear it, as PyTorch does; this
// test shows none is left. The host function holds the stream 50 ms, so the wait polls.
TEST_F(CudaFixes, WatchedWaitLeavesNoNotReadyErrorForTheNextLaunchCheck) {
  Backend& b = get_backend("cuda");
  cuda::CudaBackend& cb = cuda_backend();
  auto s = b.create_stream(0);
  cuda::CudaStream& cs = cuda::as_cuda(*s, "test");
  auto watch = std::make_shared<FakeWatch>();
  cuda::add_stream_watch(cb.physical_device(0), watch);
  ASSERT_EQ(cudaLaunchHostFunc(
                cs.get(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
                nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaStreamQuery(cs.get()), cudaErrorNotReady);  // what the wait's first poll sees
  (void)cudaGetLastError();  // this query's, if any: only the wait's is in question
  s->synchronize();
  cuda::remove_stream_watch(cb.physical_device(0), watch.get());
  const cudaError_t left = cudaPeekAtLastError();
  EXPECT_EQ(left, cudaSuccess) << cudaGetErrorName(left);
  Tensor t = Tensor::zeros({1000}, DType::f32, Device("cuda", 0));
  EXPECT_NO_THROW(ops::fill_(t, 2.0));  // a kernel launch, checked with cudaGetLastError
  EXPECT_EQ(t.to(Device::cpu()).to_vector<float>(), std::vector<float>(1000, 2.0f));
  (void)cudaGetLastError();  // nothing left for the next test either way
}

// ---- review 3 of issue 29: the NCCL path on one GPU ---------------------------------------------
// The in-process communicator's NCCL path on a machine with one GPU. Ranks that share a GPU take
// the in-GPU transport (Note [CUDA collectives]), so on the one-GPU machine the GPU check runs on,
// no communicator ever reaches nccl_enqueue, NcclRedOp, the NCCL functions found with dlsym (Note
// [NCCL newer than the library]) or NcclTransport. NCCL does take a communicator of one rank: this
// test drives those functions through one (ncclCommInitAll over GPU 0) for every collective kind,
// dtype and op, as CudaCommunicator::run and nccl_bitwise call them. With one rank every result is
// its input (sum, prod, min, max, avg) or its input times the premul_sum scalar, chosen so that the
// product is exact (0.5 on floats of magnitude 1/32 .. 4, 3 on small integers): the expected bytes
// are exact in both paths, NCCL's (fast) and the block algorithm's (bitwise). What one rank cannot
// show: the sends and receives between ranks and the per-rank counts of the rooted calls (two
// GPUs: CudaCommTest.BitwiseNcclScratchIsCountedByTheDevicesMemoryStats and the MPI tests).
// tools/gpu-check-tests.txt lists it.

using CudaNcclOneRank = CudaSuite<>;  // kCudaTestDevices

constexpr const char* kOneRankWhere = "CudaNcclOneRank";

bool nccl_test_is_float(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16 ||
         t == DType::f8_e4m3 || t == DType::f8_e5m2;
}

bool nccl_test_is_signed(DType t) {
  return nccl_test_is_float(t) || t == DType::i8 || t == DType::i32 || t == DType::i64;
}

/// n values of `dt` as f32 (each exact in `dt`): floats of magnitude 1/32 .. 4, both signs (0.5
/// times one stays a normal number of every float type, fp8 included, so it is exact); integers
/// in [-40, 40] (unsigned: [0, 40]), so that 3 times one fits every integer type.
std::vector<float> nccl_test_values(DType dt, std::int64_t n, std::uint64_t salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const float u = uniform(17, stream_id(kStreamSynthetic, 1300 + salt), i, 0.0f, 1.0f);
    float x = nccl_test_is_float(dt) ? 0.03125f + 3.96875f * u : std::floor(40.0f * u);
    if (nccl_test_is_signed(dt) && i % 2 == 1) x = -x;
    v[static_cast<std::size_t>(i)] = x;
  }
  // Rounded to the dtype and back: the values the buffers hold.
  return Tensor::from_vector(v, {n}).to(dt).to(DType::f32).to_vector<float>();
}

std::vector<std::uint8_t> nccl_test_bytes(const std::vector<float>& v, DType dt) {
  return tensor_bytes(Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(dt));
}

/// A communicator of one rank on GPU `physical` (ncclCommInitAll over one device).
struct OneRankNccl {
  ncclComm_t comm = nullptr;
  explicit OneRankNccl(int physical) {
    cuda::DeviceGuard g(physical);
    DITTO_NCCL_CHECK(ncclCommInitAll(&comm, 1, &physical), kOneRankWhere);
  }
  ~OneRankNccl() {
    if (comm) (void)ncclCommDestroy(comm);
  }
  OneRankNccl(const OneRankNccl&) = delete;
  OneRankNccl& operator=(const OneRankNccl&) = delete;
};

class NcclOneRankRun {
 public:
  NcclOneRankRun()
      : backend_(cuda::as_cuda_backend(get_backend("cuda"), kOneRankWhere)),
        dev_("cuda", 0),
        stream_(cuda::as_cuda(backend_.default_stream(0), kOneRankWhere).get()),
        nccl_(backend_.physical_device(0)),
        barrier_(Tensor::zeros({1}, DType::f32, dev_)) {}

  /// A cuda:0 tensor of `dt` holding `v`.
  Tensor upload(const std::vector<float>& v, DType dt) const {
    return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(dt).to(dev_);
  }
  Tensor zeros(std::int64_t n, DType dt) const { return Tensor::zeros({n}, dt, dev_); }

  /// The calls of one collective, as CudaCommunicator::run issues NCCL's own collectives (fast
  /// mode; bitwise mode for the kinds without arithmetic): each call's op made before the group
  /// opens, every call enqueued in one ncclGroupStart / End, then a wait.
  void native(const std::vector<detail::CollectiveCall>& calls) {
    cuda::DeviceGuard g(backend_.physical_device(0));
    std::vector<cuda::NcclRedOp> ops;
    for (const auto& c : calls) ops.push_back(cuda::nccl_op_for(c, nccl_.comm, kOneRankWhere));
    cuda::NcclGroup group(kOneRankWhere);
    for (std::size_t i = 0; i < calls.size(); ++i)
      cuda::nccl_enqueue(calls[i], ops[i], nccl_.comm, stream_,
                         static_cast<float*>(barrier_.data_ptr()), kOneRankWhere);
    group.end();
    backend_.default_stream(0).synchronize();
  }

  /// One bitwise all_reduce / reduce / reduce_scatter through the block algorithm over
  /// NcclTransport, as CudaCommunicator::nccl_bitwise runs it, then a wait.
  void bitwise(const detail::CollectiveCall& c) {
    cuda::DeviceGuard g(backend_.physical_device(0));
    const std::string where = kOneRankWhere;
    {
      cuda::NcclTransport t(
          backend_, 1,
          {{0, 0, backend_.physical_device(0), nccl_.comm, stream_, c.send, c.recv, &where}},
          c.dtype, c.op, {c.scalar});
      cuda::bitwise_collective(t, c, 1);
    }
    backend_.default_stream(0).synchronize();
  }

 private:
  cuda::CudaBackend& backend_;
  Device dev_;
  cudaStream_t stream_;
  OneRankNccl nccl_;
  Tensor barrier_;
};

// Every collective kind, dtype and op of the NCCL path on a one-rank communicator (see the
// file's comment): all_reduce (out of place and in place), reduce and reduce_scatter with sum,
// prod, min, max, avg and premul_sum, both through NCCL's own calls (fast) and the bitwise block
// algorithm over NcclTransport (counts 200 and 256: the reduced block then copied, or NCCL's
// in-place all-gather); broadcast, all_gather, all_to_all, gather, scatter (NCCL 2.28's calls
// where the loaded library has them, else one send / recv per peer: the test prints which),
// all_to_all_v with displacements, send / recv to itself in one group, and the barrier. fp8
// moves as ncclUint8 on any NCCL; NCCL's own fp8 reductions need NCCL 2.24 (Note [NCCL fp8]):
// before, ditto refuses them with a BackendError naming 2.24, and the test checks that refusal
// (the bitwise block algorithm's fp8 reductions and every fp8 data movement still run).
TEST_F(CudaNcclOneRank, EveryKindDtypeAndOpOfTheNcclPath) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  const bool fp8_ok = version >= cuda::nccl_version_code(2, 24, 0);
  std::printf(
      "note: NCCL %d: all_to_all / gather / scatter %s; fp8 %s\n", version,
      cuda::nccl_has_rooted_calls() ? "call ncclAlltoAll / ncclGather / ncclScatter"
                                    : "send and receive per peer",
      fp8_ok ? "reduced by NCCL" : "moved as bytes, NCCL's reductions refused (before 2.24)");
  NcclOneRankRun run;
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const bool fp8 = dt == DType::f8_e4m3 || dt == DType::f8_e5m2;
    const double scalar = nccl_test_is_float(dt) ? 0.5 : 3.0;
    // The reductions: one rank's result is its input, or input * scalar for premul_sum.
    for (std::int64_t count : {200, 256}) {
      const std::vector<float> x = nccl_test_values(dt, count, 1);
      std::vector<float> scaled = x;
      for (float& e : scaled) e *= static_cast<float>(scalar);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max,
                          ReduceOp::avg, ReduceOp::premul_sum}) {
        SCOPED_TRACE(std::string(reduce_op_name(op)) + ", count " + std::to_string(count));
        const std::vector<std::uint8_t> want =
            nccl_test_bytes(op == ReduceOp::premul_sum ? scaled : x, dt);
        for (detail::CollectiveKind kind :
             {detail::CollectiveKind::all_reduce, detail::CollectiveKind::reduce,
              detail::CollectiveKind::reduce_scatter})
          for (bool bitwise : {false, true})
            for (bool in_place : {false, true}) {
              if (in_place && kind != detail::CollectiveKind::all_reduce) continue;
              SCOPED_TRACE(std::string(detail::collective_name(kind)) +
                           (bitwise ? " bitwise" : " native") + (in_place ? " in place" : ""));
              Tensor send = run.upload(x, dt);
              Tensor recv = in_place ? send : run.zeros(count, dt);
              const detail::CollectiveCall c = detail::call_record(
                  kind, send.data_ptr(), recv.data_ptr(), count, dt, op, 0, scalar);
              if (fp8 && !fp8_ok && !bitwise) {  // refused before NCCL is asked
                try {
                  run.native({c});
                  ADD_FAILURE() << "NCCL " << version << " reduced fp8";
                } catch (const BackendError& e) {
                  EXPECT_NE(std::string(e.what()).find("2.24"), std::string::npos) << e.what();
                }
                continue;
              }
              if (bitwise)
                run.bitwise(c);
              else
                run.native({c});
              EXPECT_EQ(tensor_bytes(recv), want);
            }
      }
    }
    // The kinds that move data: the input's bytes.
    const std::int64_t count = 200;
    const std::vector<float> x = nccl_test_values(dt, count, 2);
    const std::vector<std::uint8_t> want = nccl_test_bytes(x, dt);
    for (detail::CollectiveKind kind :
         {detail::CollectiveKind::broadcast, detail::CollectiveKind::all_gather,
          detail::CollectiveKind::all_to_all, detail::CollectiveKind::gather,
          detail::CollectiveKind::scatter}) {
      SCOPED_TRACE(detail::collective_name(kind));
      const Tensor send = run.upload(x, dt);
      Tensor recv = run.zeros(count, dt);
      run.native({detail::call_record(kind, send.data_ptr(), recv.data_ptr(), count, dt)});
      EXPECT_EQ(tensor_bytes(recv), want);
    }
    {  // all_to_all_v: elements [3, 3 + 190) of send into [5, 5 + 190) of recv, the rest kept
      SCOPED_TRACE("all_to_all_v");
      const Tensor send = run.upload(x, dt);
      Tensor recv = run.zeros(count, dt);
      detail::CollectiveCall c = detail::call_record(detail::CollectiveKind::all_to_all_v,
                                                     send.data_ptr(), recv.data_ptr(), 0, dt);
      c.send_counts = {190};
      c.send_displs = {3};
      c.recv_counts = {190};
      c.recv_displs = {5};
      run.native({c});
      std::vector<float> moved(static_cast<std::size_t>(count), 0.0f);
      for (std::size_t i = 0; i < 190; ++i) moved[5 + i] = x[3 + i];
      EXPECT_EQ(tensor_bytes(recv), nccl_test_bytes(moved, dt));
    }
    {  // send / recv to itself, both halves in one group (NCCL's rule for a self send)
      SCOPED_TRACE("send / recv to itself");
      const Tensor send = run.upload(x, dt);
      Tensor recv = run.zeros(count, dt);
      detail::CollectiveCall s =
          detail::call_record(detail::CollectiveKind::send, send.data_ptr(), nullptr, count, dt);
      detail::CollectiveCall r =
          detail::call_record(detail::CollectiveKind::recv, nullptr, recv.data_ptr(), count, dt);
      s.peer = r.peer = 0;
      run.native({s, r});
      EXPECT_EQ(tensor_bytes(recv), want);
    }
  }
  run.native({detail::CollectiveCall{}});  // the barrier: a one-float all_reduce
}

}  // namespace
}  // namespace ditto
#endif  // DITTO_TEST_CUDA_BUILT
