// The CUDA communicator with one rank per process (Communicator::init_rank under mpirun): NCCL
// moves the data, over a communicator made by ncclCommInitRank with the unique id that rank 0
// draws (ncclGetUniqueId) and MPI broadcasts. Compiled only with CUDA and MPI (DITTO_WITH_MPI).
//
// Note [CUDA collectives over MPI]
// As in-process (Note [CUDA collectives], cuda_communicator.cpp), nothing is enqueued before
// every rank has called: each call first exchanges the ranks' calls over MPI (MpiLink::start,
// Note [Timeouts over MPI]), which blocks the calling thread until every rank arrived, checks
// that the calls match (the simulator's mismatch error on every rank) and times out naming the
// ranks that never came; so no GPU ever waits for a missing peer. Then, on the caller's stream:
//   fast:    ncclAllReduce / ncclReduce / ncclBroadcast / ncclAllGather / ncclReduceScatter
//            (ncclAvg for avg); barrier = a one-element all-reduce;
//   bitwise: NCCL only moves data and ditto's kernel adds in the canonical tree over rank index
//            (launch_comm_reduce), as the in-process NCCL path does: (1) send/recv all-to-all of
//            blocks, (2) rank r tree-reduces block r, (3) all-gather (all_reduce) or gather to the
//            root (reduce); reduce_scatter is (1) and (2). Same bits as the simulator's.
// One rank per process: a thread drives only its own rank, so group_start()/group_end() need do
// nothing (the calls inside a group run as they come). A rank's collectives run one at a time
// (a later one on another stream waits for the previous one's end event).
#include <nccl.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_cuda/nccl_check.h"
#include "core/internal/mpi_transport.h"

namespace ditto::cuda {
namespace {

using detail::CollectiveCall;
using Kind = detail::CollectiveKind;
using detail::mpi::MpiLink;

const void* at(const void* p, std::int64_t off, std::size_t elem) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(off) * elem;
}
void* at(void* p, std::int64_t off, std::size_t elem) {
  return static_cast<char*>(p) + static_cast<std::size_t>(off) * elem;
}

/// ceil(count / n) rounded up to 64 elements (16-byte aligned blocks for the kernel's vector path;
/// as cuda_communicator.cpp).
std::int64_t slice_length(std::int64_t count, int n) {
  const std::int64_t per = (count + n - 1) / n;
  return (per + 63) / 64 * 64;
}

class CudaMpiCommunicator final : public CommunicatorImpl {
 public:
  CudaMpiCommunicator(MPI_Comm comm, CudaBackend& backend, int device, const CommOptions& options)
      : link_(comm, options, "cuda communicator"),
        device_(device),
        physical_(backend.physical_device(device)) {
    where_ = detail::cat(backend.where(device), ", rank ", link_.rank(), " of ", link_.size(),
                         " (MPI)");
    try {
      // Rank 0 draws the unique id; MPI carries it to the others (on the heap: after a timeout
      // the pending broadcast may still write it).
      auto id = std::make_shared<ncclUniqueId>();
      if (link_.rank() == 0) DITTO_NCCL_CHECK(ncclGetUniqueId(id.get()), where_);
      std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
      DITTO_MPI_CHECK(MPI_Ibcast(id.get(), sizeof(ncclUniqueId), MPI_BYTE, 0, link_.comm(),
                                 &reqs[0]),
                      where_);
      const auto deadline = detail::mpi::Clock::now() +
                            std::chrono::milliseconds(options.timeout_ms);
      if (!detail::mpi::wait_until(reqs, deadline, where_)) {
        link_.abort_by_rank("timed out in Communicator::init_rank");
        new std::shared_ptr<ncclUniqueId>(id);  // leaked on purpose (Note [Timeouts over MPI])
        throw Timeout(detail::cat("Communicator::init_rank (", where_, "): timed out after ",
                                  options.timeout_ms,
                                  " ms waiting for rank 0's NCCL unique id (MPI_Ibcast)"));
      }
      DeviceGuard g(physical_);
      DITTO_NCCL_CHECK(ncclCommInitRank(&nccl_, link_.size(), *id, link_.rank()),
                       detail::cat("Communicator::init_rank (", where_, ")"));
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming), where_);
      DITTO_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)), where_);
      DITTO_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)), where_);
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaMpiCommunicator() override { release(); }
  CudaMpiCommunicator(const CudaMpiCommunicator&) = delete;
  CudaMpiCommunicator& operator=(const CudaMpiCommunicator&) = delete;

  void all_reduce(int, Stream& s, const void* send, void* recv, std::int64_t count, DType dtype,
                  ReduceOp op) override {
    submit(s, {Kind::all_reduce, send, recv, count, dtype, op, 0});
  }
  void reduce(int, Stream& s, const void* send, void* recv, std::int64_t count, DType dtype,
              ReduceOp op, int root) override {
    submit(s, {Kind::reduce, send, recv, count, dtype, op, root});
  }
  void broadcast(int, Stream& s, const void* send, void* recv, std::int64_t count, DType dtype,
                 int root) override {
    submit(s, {Kind::broadcast, send, recv, count, dtype, ReduceOp::sum, root});
  }
  void all_gather(int, Stream& s, const void* send, void* recv, std::int64_t count,
                  DType dtype) override {
    submit(s, {Kind::all_gather, send, recv, count, dtype, ReduceOp::sum, 0});
  }
  void reduce_scatter(int, Stream& s, const void* send, void* recv, std::int64_t count,
                      DType dtype, ReduceOp op) override {
    submit(s, {Kind::reduce_scatter, send, recv, count, dtype, op, 0});
  }
  void barrier(int, Stream& s) override { submit(s, {}); }

  void abort(int, const std::string& reason) noexcept override { link_.abort_by_rank(reason); }

 private:
  void submit(Stream& s, const CollectiveCall& call) {
    const cudaStream_t stream = as_cuda(s, detail::collective_name(call.kind)).get();
    std::lock_guard lk(mu_);  // this rank's collectives one at a time
    std::uint64_t seq = 0;
    link_.start(call, seq);  // blocks until every rank called; throws on mismatch, timeout, abort
    if (call.kind != Kind::barrier && call.count == 0) return;
    try {
      DeviceGuard g(physical_);
      if (last_stream_ && last_stream_ != stream)
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0), where_);
      if (link_.options().determinism == Determinism::bitwise && detail::uses_op(call.kind))
        bitwise(call, stream);
      else
        native(call, stream);
      DITTO_CUDA_CHECK(cudaEventRecord(last_, stream), where_);
      last_stream_ = stream;
    } catch (const std::exception& e) {
      // Part of the collective may be enqueued: the communicator cannot go on (ncclCommAbort).
      link_.abort_by_rank(detail::cat(MpiLink::label(call.kind, seq), ": ", e.what()));
      throw;
    }
  }

  void native(const CollectiveCall& c, cudaStream_t stream) {
    const auto count = static_cast<std::size_t>(c.count);
    const ncclDataType_t type = nccl_type(c.dtype);
    switch (c.kind) {
      case Kind::all_reduce:
        DITTO_NCCL_CHECK(ncclAllReduce(c.send, c.recv, count, type, nccl_op(c.op), nccl_, stream),
                         where_);
        break;
      case Kind::reduce:  // recv is unused (and null) off the root
        DITTO_NCCL_CHECK(ncclReduce(c.send, c.recv ? c.recv : const_cast<void*>(c.send), count,
                                    type, nccl_op(c.op), c.root, nccl_, stream),
                         where_);
        break;
      case Kind::broadcast:  // send is unused (and null) off the root
        DITTO_NCCL_CHECK(ncclBroadcast(c.send ? c.send : c.recv, c.recv, count, type, c.root,
                                       nccl_, stream),
                         where_);
        break;
      case Kind::all_gather:
        DITTO_NCCL_CHECK(ncclAllGather(c.send, c.recv, count, type, nccl_, stream), where_);
        break;
      case Kind::reduce_scatter:
        DITTO_NCCL_CHECK(ncclReduceScatter(c.send, c.recv, count, type, nccl_op(c.op), nccl_,
                                           stream),
                         where_);
        break;
      case Kind::barrier:
        DITTO_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, nccl_,
                                       stream),
                         where_);
        break;
    }
  }

  // Bitwise all_reduce, reduce, reduce_scatter (Note [CUDA collectives over MPI]).
  void bitwise(const CollectiveCall& c, cudaStream_t stream) {
    const int n = link_.size(), r = link_.rank();
    const std::size_t elem = dtype_size(c.dtype);
    const ncclDataType_t type = nccl_type(c.dtype);
    const bool scatter = c.kind == Kind::reduce_scatter;
    const std::int64_t count = c.count;
    const std::int64_t per = scatter ? count : slice_length(count, n);
    auto len = [&](int q) -> std::int64_t {
      return scatter ? count : std::max<std::int64_t>(0, std::min(per, count - q * per));
    };
    // Scratch [N, per]: row q receives rank q's copy of this rank's block (stream-ordered).
    void* scratch = nullptr;
    DITTO_CUDA_CHECK(cudaMallocAsync(&scratch, static_cast<std::size_t>(n * per) * elem, stream),
                     where_);
    struct Free {
      void* p;
      cudaStream_t s;
      ~Free() {
        if (cudaFreeAsync(p, s) != cudaSuccess) (void)cudaGetLastError();
      }
    } free_scratch{scratch, stream};

    // (1) all-to-all of the blocks.
    DITTO_NCCL_CHECK(ncclGroupStart(), where_);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      if (len(q) > 0)
        DITTO_NCCL_CHECK(ncclSend(at(c.send, q * per, elem), static_cast<std::size_t>(len(q)),
                                  type, q, nccl_, stream),
                         where_);
      if (len(r) > 0)
        DITTO_NCCL_CHECK(ncclRecv(at(scratch, q * per, elem), static_cast<std::size_t>(len(r)),
                                  type, q, nccl_, stream),
                         where_);
    }
    DITTO_NCCL_CHECK(ncclGroupEnd(), where_);

    // (2) the canonical tree over the N copies of block r (this rank's own straight from send).
    void* dst = nullptr;
    if (c.kind == Kind::all_reduce)
      dst = at(c.recv, r * per, elem);
    else if (scatter)
      dst = c.recv;
    else  // reduce: the root's recv, else the unused row r of the scratch
      dst = r == c.root ? at(c.recv, r * per, elem) : at(scratch, r * per, elem);
    if (len(r) > 0) {
      std::vector<const void*> srcs;
      for (int q = 0; q < n; ++q)
        srcs.push_back(q == r ? at(c.send, r * per, elem) : at(scratch, q * per, elem));
      DITTO_CUDA_CHECK(launch_comm_reduce(stream, srcs, {dst}, len(r), c.dtype, c.op), where_);
    }

    // (3) distribute the reduced blocks.
    if (c.kind == Kind::all_reduce) {
      if (per * n == count) {  // even blocks: NCCL's in-place all-gather
        DITTO_NCCL_CHECK(ncclAllGather(at(c.recv, r * per, elem), c.recv,
                                       static_cast<std::size_t>(per), type, nccl_, stream),
                         where_);
      } else {
        DITTO_NCCL_CHECK(ncclGroupStart(), where_);
        for (int q = 0; q < n; ++q) {
          if (q == r) continue;
          if (len(r) > 0)
            DITTO_NCCL_CHECK(ncclSend(at(c.recv, r * per, elem), static_cast<std::size_t>(len(r)),
                                      type, q, nccl_, stream),
                             where_);
          if (len(q) > 0)
            DITTO_NCCL_CHECK(ncclRecv(at(c.recv, q * per, elem), static_cast<std::size_t>(len(q)),
                                      type, q, nccl_, stream),
                             where_);
        }
        DITTO_NCCL_CHECK(ncclGroupEnd(), where_);
      }
    } else if (c.kind == Kind::reduce) {
      DITTO_NCCL_CHECK(ncclGroupStart(), where_);
      if (r == c.root) {
        for (int q = 0; q < n; ++q)
          if (q != r && len(q) > 0)
            DITTO_NCCL_CHECK(ncclRecv(at(c.recv, q * per, elem), static_cast<std::size_t>(len(q)),
                                      type, q, nccl_, stream),
                             where_);
      } else if (len(r) > 0) {
        DITTO_NCCL_CHECK(ncclSend(dst, static_cast<std::size_t>(len(r)), type, c.root, nccl_,
                                  stream),
                         where_);
      }
      DITTO_NCCL_CHECK(ncclGroupEnd(), where_);
    }
  }

  void release() noexcept {
    if (nccl_) {
      DeviceGuard g(physical_);
      // Destroy waits for pending work; after a failure the work may never finish: abort.
      bool failed = false;
      try {
        link_.throw_if_aborted(Kind::barrier);
      } catch (...) {
        failed = true;
      }
      (void)(failed ? ncclCommAbort(nccl_) : ncclCommDestroy(nccl_));
      nccl_ = nullptr;
    }
    if (last_) (void)cudaEventDestroy(last_);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
    last_ = nullptr;
    barrier_buf_ = nullptr;
    (void)cudaGetLastError();
  }

  MpiLink link_;
  int device_ = 0;
  int physical_ = 0;
  std::string where_;
  std::mutex mu_;
  ncclComm_t nccl_ = nullptr;
  cudaEvent_t last_ = nullptr;           ///< end of this rank's latest collective
  cudaStream_t last_stream_ = nullptr;   ///< where last_ was recorded
  float* barrier_buf_ = nullptr;
};

}  // namespace

/// The CUDA communicator of one rank per process, NCCL with the unique id sent by MPI: the
/// ProcessCommunicatorFactory registered with "cuda".
std::shared_ptr<CommunicatorImpl> make_cuda_mpi_communicator(detail::ProcessLink& link,
                                                             Backend& backend, int device,
                                                             const CommOptions& options) {
  MPI_Comm comm = link.comm;
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  DITTO_CHECK_T(BackendError, cuda != nullptr, "Communicator::init_rank: backend ", backend.name(),
                " is not the CUDA backend");
  return std::make_shared<CudaMpiCommunicator>(comm, *cuda, device, options);
}

}  // namespace ditto::cuda
