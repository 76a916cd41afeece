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
//   bitwise: NCCL only moves data and ditto's kernel adds in the canonical tree over rank index:
//            the block algorithm of Note [CUDA bitwise collectives] (cuda_bitwise.cpp) over
//            NcclTransport (cuda_nccl.h), as the in-process NCCL path, with this process driving
//            only its own rank. Same bits as the simulator's.
// One rank per process: a thread drives only its own rank, so group_start()/group_end() need do
// nothing (the calls inside a group run as they come). A rank's collectives run one at a time
// (a later one on another stream waits for the previous one's end event).
#include <nccl.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_bitwise.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_nccl.h"
#include "core/internal/mpi_transport.h"

namespace ditto::cuda {
namespace {

using detail::CollectiveCall;
using Kind = detail::CollectiveKind;
using detail::mpi::MpiLink;

class CudaMpiCommunicator final : public CommunicatorImpl {
 public:
  CudaMpiCommunicator(MPI_Comm comm, CudaBackend& backend, int device, const CommOptions& options)
      : link_(comm, options, "cuda communicator"),
        backend_(backend),
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

  void enqueue(int, Stream& s, const CollectiveCall& call) override {
    const cudaStream_t stream = as_cuda(s, detail::collective_name(call.kind)).get();
    std::lock_guard lk(mu_);  // this rank's collectives one at a time
    std::uint64_t seq = 0;
    link_.start(call, seq);  // blocks until every rank called; throws on mismatch, timeout, abort
    if (call.kind != Kind::barrier && call.count == 0) return;
    try {
      DeviceGuard g(physical_);
      if (last_stream_ && last_stream_ != stream)
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0), where_);
      if (link_.options().determinism == Determinism::bitwise && detail::uses_op(call.kind)) {
        NcclTransport t(backend_, link_.size(),
                        {{link_.rank(), device_, physical_, nccl_, stream, call.send, call.recv,
                          &where_}},
                        call.dtype, call.op);
        bitwise_collective(t, call, link_.size());
      } else {
        nccl_native(call, nccl_, stream, barrier_buf_, where_);
      }
      DITTO_CUDA_CHECK(cudaEventRecord(last_, stream), where_);
      last_stream_ = stream;
    } catch (const std::exception& e) {
      // Part of the collective may be enqueued: the communicator cannot go on (ncclCommAbort).
      link_.abort_by_rank(detail::cat(MpiLink::label(call.kind, seq), ": ", e.what()));
      throw;
    }
  }

  void abort(int, const std::string& reason) noexcept override { link_.abort_by_rank(reason); }

 private:
  void release() noexcept {
    if (nccl_) {
      DeviceGuard g(physical_);
      // Destroy waits for pending work; after a failure the work may never finish: abort.
      (void)(link_.aborted() ? ncclCommAbort(nccl_) : ncclCommDestroy(nccl_));
      nccl_ = nullptr;
    }
    if (last_) (void)cudaEventDestroy(last_);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
    last_ = nullptr;
    barrier_buf_ = nullptr;
    (void)cudaGetLastError();
  }

  MpiLink link_;
  CudaBackend& backend_;
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
