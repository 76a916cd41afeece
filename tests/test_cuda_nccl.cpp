// GPU test of the in-process communicator's NCCL path on a machine with one GPU (review 3 of
// issue 29's GPU check). Ranks that share a GPU take the in-GPU transport (Note [CUDA
// collectives]), so on the one-GPU machine the GPU check runs on, no communicator ever reaches
// nccl_enqueue, NcclRedOp, the NCCL functions found with dlsym (Note [NCCL newer than the
// library]) or NcclTransport. NCCL does take a communicator of one rank: this test drives those
// functions through one (ncclCommInitAll over GPU 0) for every collective kind, dtype and op,
// as CudaCommunicator::run and nccl_bitwise call them. With one rank every result is its input
// (sum, prod, min, max, avg) or its input times the premul_sum scalar, chosen so that the product
// is exact (0.5 on floats of magnitude 1/32 .. 4, 3 on small integers): the expected bytes are
// exact in both paths, NCCL's (fast) and the block algorithm's (bitwise). What one rank cannot
// show: the sends and receives between ranks and the per-rank counts of the rooted calls (two
// GPUs: CudaCommTest.BitwiseNcclScratchIsCountedByTheDevicesMemoryStats and the MPI tests).
// Without a usable GPU the test reports SKIPPED with the reason; tools/gpu-check-tests.txt lists
// it. Needs a build with the CUDA backend (it reaches backend_cuda/ directly).
#if defined(DITTO_TEST_CUDA_BUILT)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_bitwise.h"
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_nccl.h"
#include "backend_cuda/cuda_stream.h"
#include "core/backend_api/collective_call.h"
#include "core/base/error.h"
#include "core/numerics/random.h"
#include "core/runtime/backend.h"
#include "core/runtime/dtype.h"
#include "core/runtime/tensor.h"
#include "test_util.h"

namespace ditto {
namespace {

using namespace ditto::test;
using Kind = detail::CollectiveKind;

using CudaNcclOneRank = CudaSuite<>;  // kCudaTestDevices

constexpr const char* kWhere = "CudaNcclOneRank";

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
    DITTO_NCCL_CHECK(ncclCommInitAll(&comm, 1, &physical), kWhere);
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
      : backend_(cuda::as_cuda_backend(get_backend("cuda"), kWhere)),
        dev_("cuda", 0),
        stream_(cuda::as_cuda(backend_.default_stream(0), kWhere).get()),
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
    for (const auto& c : calls) ops.push_back(cuda::nccl_op_for(c, nccl_.comm, kWhere));
    cuda::NcclGroup group(kWhere);
    for (std::size_t i = 0; i < calls.size(); ++i)
      cuda::nccl_enqueue(calls[i], ops[i], nccl_.comm, stream_,
                         static_cast<float*>(barrier_.data_ptr()), kWhere);
    group.end();
    backend_.default_stream(0).synchronize();
  }

  /// One bitwise all_reduce / reduce / reduce_scatter through the block algorithm over
  /// NcclTransport, as CudaCommunicator::nccl_bitwise runs it, then a wait.
  void bitwise(const detail::CollectiveCall& c) {
    cuda::DeviceGuard g(backend_.physical_device(0));
    const std::string where = kWhere;
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
// needs NCCL 2.24 at run time: before, NCCL refuses it, and the test checks that refusal.
TEST_F(CudaNcclOneRank, EveryKindDtypeAndOpOfTheNcclPath) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  const bool fp8_ok = version >= cuda::nccl_version_code(2, 24, 0);
  std::printf("note: NCCL %d: all_to_all / gather / scatter %s; fp8 %s\n", version,
              cuda::nccl_has_rooted_calls() ? "call ncclAlltoAll / ncclGather / ncclScatter"
                                            : "send and receive per peer",
              fp8_ok ? "taken" : "refused (before 2.24)");
  NcclOneRankRun run;
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(dtype_name(dt));
    const bool fp8 = dt == DType::f8_e4m3 || dt == DType::f8_e5m2;
    if (fp8 && !fp8_ok) {
      const std::vector<float> x = nccl_test_values(dt, 200, 0);
      const Tensor send = run.upload(x, dt);
      Tensor recv = run.zeros(200, dt);
      EXPECT_THROW(run.native({detail::call_record(Kind::all_reduce, send.data_ptr(),
                                                   recv.data_ptr(), 200, dt)}),
                   BackendError);
      continue;
    }
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
        for (Kind kind : {Kind::all_reduce, Kind::reduce, Kind::reduce_scatter})
          for (bool bitwise : {false, true})
            for (bool in_place : {false, true}) {
              if (in_place && kind != Kind::all_reduce) continue;
              SCOPED_TRACE(std::string(detail::collective_name(kind)) +
                           (bitwise ? " bitwise" : " native") + (in_place ? " in place" : ""));
              Tensor send = run.upload(x, dt);
              Tensor recv = in_place ? send : run.zeros(count, dt);
              const detail::CollectiveCall c = detail::call_record(
                  kind, send.data_ptr(), recv.data_ptr(), count, dt, op, 0, scalar);
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
    for (Kind kind :
         {Kind::broadcast, Kind::all_gather, Kind::all_to_all, Kind::gather, Kind::scatter}) {
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
      detail::CollectiveCall c =
          detail::call_record(Kind::all_to_all_v, send.data_ptr(), recv.data_ptr(), 0, dt);
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
          detail::call_record(Kind::send, send.data_ptr(), nullptr, count, dt);
      detail::CollectiveCall r =
          detail::call_record(Kind::recv, nullptr, recv.data_ptr(), count, dt);
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
