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
// One rank per process: a thread drives only its own rank, so collectives inside a group run as
// they come. A rank's collectives run one at a time (a later one on another stream waits for the
// previous one's end event). premul_sum: the bitwise kernel multiplies every rank's block by
// that rank's scalar, taken from the calls MpiLink::start exchanged (the wire call carries it);
// NCCL's PreMulSum op (fast mode) needs only this rank's. all_to_all_v: ncclSend / ncclRecv per
// peer in one group; its cross-rank count check is MpiLink::start's (find_call_mismatch on the
// exchanged calls).
//
// Point-to-point (send / recv) are not collectives: no call exchange, no ordinal. Outside a group
// a call is one ncclSend / ncclRecv on the caller's stream; between group_start() and
// group_end() the thread's sends and recvs are collected and issued at group_end in one
// ncclGroupStart/End (so a ring in one group cannot deadlock). Unlike the in-process
// communicators (Note [CUDA point-to-point]) their count and dtype are NOT checked against the
// peer's and a missing partner is not timed out: as with raw NCCL, a send whose recv never comes
// leaves the stream waiting (ncclCommAbort through Communicator::abort frees it). A checked
// version would exchange a header per call over MPI first.
#include <nccl.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
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
    link_.throw_if_aborted(call.kind);
    if (detail::is_p2p(call.kind)) {
      auto group = groups_.find(std::this_thread::get_id());
      if (group != groups_.end())
        group->second.push_back({call, stream});
      else
        run_p2p({{call, stream}});
      return;
    }
    std::uint64_t seq = 0;
    std::vector<CollectiveCall> calls = link_.start(call, seq);  // blocks until every rank
    // called; throws on mismatch, timeout, abort
    if (call.kind != Kind::barrier && call.kind != Kind::all_to_all_v && call.count == 0) return;
    try {
      DeviceGuard g(physical_);
      if (last_stream_ && last_stream_ != stream)
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0), where_);
      if (link_.options().determinism == Determinism::bitwise && detail::uses_op(call.kind)) {
        std::vector<double> scalars;
        for (const CollectiveCall& c : calls) scalars.push_back(c.scalar);
        NcclTransport t(backend_, link_.size(),
                        {{link_.rank(), device_, physical_, nccl_, stream, call.send, call.recv,
                          &where_}},
                        call.dtype, call.op, std::move(scalars));
        bitwise_collective(t, call, link_.size());
      } else {  // a group: all_to_all_v is several ncclSend / ncclRecv
        NcclGroup group(where_);
        NcclRedOp op = nccl_native(call, nccl_, stream, barrier_buf_, where_);
        group.end();
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

  void group_start() override {
    std::lock_guard lk(mu_);
    groups_[std::this_thread::get_id()];  // present while the thread is in a group
  }
  void group_end() override {
    std::vector<P2P> batch;
    std::lock_guard lk(mu_);
    auto it = groups_.find(std::this_thread::get_id());
    if (it == groups_.end()) return;
    batch = std::move(it->second);
    groups_.erase(it);
    link_.throw_if_aborted(detail::CollectiveKind::send);
    if (!batch.empty()) run_p2p(batch);
  }

 private:
  /// A send or recv, with the stream it was issued on.
  struct P2P {
    CollectiveCall call;
    cudaStream_t stream = nullptr;
  };

  /// The ncclSend / ncclRecv of `batch` in one group; each stream first waits for this rank's
  /// previous collective or transfer, and the last stream's end is the new "previous".
  void run_p2p(const std::vector<P2P>& batch) {
    try {
      DeviceGuard g(physical_);
      for (const P2P& p : batch)
        if (last_stream_ && last_stream_ != p.stream)
          DITTO_CUDA_CHECK(cudaStreamWaitEvent(p.stream, last_, 0), where_);
      NcclGroup group(where_);
      for (const P2P& p : batch)
        if (p.call.count > 0) (void)nccl_native(p.call, nccl_, p.stream, barrier_buf_, where_);
      group.end();
      // Later work on another stream waits for every stream of the batch: join them into the
      // last one.
      const cudaStream_t end = batch.back().stream;
      for (const P2P& p : batch)
        if (p.stream != end) {
          DITTO_CUDA_CHECK(cudaEventRecord(last_, p.stream), where_);
          DITTO_CUDA_CHECK(cudaStreamWaitEvent(end, last_, 0), where_);
        }
      DITTO_CUDA_CHECK(cudaEventRecord(last_, end), where_);
      last_stream_ = end;
    } catch (const std::exception& e) {
      link_.abort_by_rank(detail::cat("send/recv: ", e.what()));
      throw;
    }
  }


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
  std::map<std::thread::id, std::vector<P2P>> groups_;  ///< threads inside a group
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
