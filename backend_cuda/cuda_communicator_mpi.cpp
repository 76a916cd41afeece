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
//
// One GPU per rank: NCCL refuses two ranks of one communicator on one GPU, and processes cannot
// share the in-GPU transport (each holds its own memory). So before NCCL is asked, the ranks
// exchange their GPUs' identities (host name and GPU UUID, MPI_Iallgather under the timeout) and
// every rank refuses a shared GPU with the same BackendError naming the two ways that work
// (check_one_rank_per_gpu, cuda_host_logic.h): `mpirun -np 2 ditto-train --backend cuda` on a
// one-GPU machine ends there, not in ncclCommInitRank's "Duplicate GPU detected".
//
// Failures and hangs: the NCCL communicator is non-blocking (ncclCommInitRankConfig with
// blocking = 0), so its initialisation is polled (ncclCommGetAsyncError) under
// CommOptions::timeout_ms and aborted (ncclCommAbort) at the deadline instead of waiting for a
// rank that never comes; calls that return ncclInProgress are polled the same way
// (nccl_settle). Communicator::abort and every enqueue failure call ncclCommAbort at once (the
// kernels this rank enqueued no longer wait for peers). A StreamWatch registered for the rank's
// GPU makes host waits on its streams poll ncclCommGetAsyncError and time out a collective
// unfinished after timeout_ms (Note [Waiting on NCCL work], cuda_stream.h), so a rank whose
// peer failed after the sends were enqueued fails with an error instead of spinning in
// cudaStreamSynchronize for ever.
#include <nccl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
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
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_nccl.h"
#include "core/backend_api/mpi_transport.h"

namespace ditto::cuda {
namespace {

using detail::CollectiveCall;
using Kind = detail::CollectiveKind;
using detail::mpi::MpiLink;

/// A GPU's identity across processes: "host/GPU-<uuid>" (fixed size for MPI_Allgather).
using GpuId = std::array<char, 256>;

GpuId gpu_identity(int physical, const std::string& where) {
  cudaDeviceProp prop{};
  DITTO_CUDA_CHECK(cudaGetDeviceProperties(&prop, physical), where);
  char host[128] = {};
  (void)gethostname(host, sizeof host - 1);
  std::string id = std::string(host) + "/GPU-";
  static const char* hex = "0123456789abcdef";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
    id += hex[b >> 4];
    id += hex[b & 15];
  }
  GpuId out{};
  std::strncpy(out.data(), id.c_str(), out.size() - 1);
  return out;
}

class CudaMpiCommunicator final : public CommunicatorImpl {
 public:
  CudaMpiCommunicator(MPI_Comm comm, CudaBackend& backend, int device, const CommOptions& options)
      : keep_backend_(backend.keep_alive()),
        link_(comm, options, "cuda communicator"),
        backend_(backend),
        device_(device),
        physical_(backend.physical_device(device)) {
    where_ =
        detail::cat(backend.where(device), ", rank ", link_.rank(), " of ", link_.size(), " (MPI)");
    try {
      const auto deadline =
          detail::mpi::Clock::now() + std::chrono::milliseconds(options.timeout_ms);
      check_gpus(deadline);
      // Rank 0 draws the unique id; MPI carries it to the others (on the heap: after a timeout
      // the pending broadcast may still write it).
      auto id = std::make_shared<ncclUniqueId>();
      if (link_.rank() == 0) DITTO_NCCL_CHECK(ncclGetUniqueId(id.get()), where_);
      std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
      DITTO_MPI_CHECK(
          MPI_Ibcast(id.get(), sizeof(ncclUniqueId), MPI_BYTE, 0, link_.comm(), &reqs[0]), where_);
      if (!detail::mpi::wait_until(reqs, deadline, where_)) {
        link_.abort_by_rank("timed out in Communicator::init_rank");
        new std::shared_ptr<ncclUniqueId>(id);  // leaked on purpose (Note [Timeouts over MPI])
        throw Timeout(detail::cat("Communicator::init_rank (", where_, "): timed out after ",
                                  options.timeout_ms,
                                  " ms waiting for rank 0's NCCL unique id (MPI_Ibcast)"));
      }
      DeviceGuard g(physical_);
      // Non-blocking, so that a rank that never joins costs a Timeout, not a hang.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      const ncclResult_t r =
          ncclCommInitRankConfig(&comm, link_.size(), *id, link_.rank(), &config);
      nccl_ = comm;
      const std::string call = detail::cat("Communicator::init_rank (", where_, ")");
      try {
        nccl_settle(comm, r, "ncclCommInitRankConfig", call,
                    std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  deadline - detail::mpi::Clock::now())
                                                  .count()));
      } catch (const std::exception& e) {
        link_.abort_by_rank(e.what());
        throw;
      }
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming), where_);
      DITTO_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)), where_);
      DITTO_CUDA_CHECK(cudaMemset(barrier_buf_, 0, sizeof(float)), where_);
      watch_ = std::make_shared<Watch>(this);
      add_stream_watch(physical_, watch_);
    } catch (...) {
      release();
      throw;
    }
  }

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
    // Every rank has the same call: each refuses what NCCL cannot take (fp8 reductions before
    // NCCL 2.24) alike, before anything is enqueued, and the communicator goes on.
    if (link_.options().determinism == Determinism::fast) check_nccl_dtype(call, where_);
    try {
      std::lock_guard nl(nccl_mu_);  // abort() from another thread waits for the enqueue
      link_.throw_if_aborted(call.kind);
      DeviceGuard g(physical_);
      if (last_stream_ && last_stream_ != stream)
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, 0), where_);
      if (link_.options().determinism == Determinism::bitwise && detail::uses_op(call.kind)) {
        std::vector<double> scalars;
        for (const CollectiveCall& c : calls) scalars.push_back(c.scalar);
        NcclTransport t(
            backend_, link_.size(),
            {{link_.rank(), device_, physical_, nccl_, stream, call.send, call.recv, &where_}},
            call.dtype, call.op, std::move(scalars));
        bitwise_collective(t, call, link_.size());
      } else {  // a group: all_to_all_v is several ncclSend / ncclRecv
        // The premul_sum op is made before the group opens (enqueue_group).
        const std::vector<NcclRedOp> ops = enqueue_group<NcclRedOp>(
            1, [&](int) { return nccl_op_for(call, nccl_, where_); },
            [&] { DITTO_NCCL_CHECK(ncclGroupStart(), where_); },
            [&](int, const NcclRedOp& op) {
              nccl_enqueue(call, op, nccl_, stream, barrier_buf_, where_);
            },
            [&] { nccl_settle(nccl_, ncclGroupEnd(), "ncclGroupEnd()", where_); },
            [] { (void)ncclGroupEnd(); });
      }
      DITTO_CUDA_CHECK(cudaEventRecord(last_, stream), where_);
      last_stream_ = stream;
      enqueued_at_ms_.store(now_ms());
    } catch (const std::exception& e) {
      // Part of the collective may be enqueued: the communicator cannot go on (ncclCommAbort).
      abort_all(detail::cat(MpiLink::label(call.kind, seq), ": ", e.what()));
      throw;
    }
  }

  void abort(int, const std::string& reason) noexcept override { abort_all(reason); }

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
      std::lock_guard nl(nccl_mu_);  // abort() from another thread waits for the enqueue
      link_.throw_if_aborted(Kind::send);
      DeviceGuard g(physical_);
      for (const P2P& p : batch)
        if (last_stream_ && last_stream_ != p.stream)
          DITTO_CUDA_CHECK(cudaStreamWaitEvent(p.stream, last_, 0), where_);
      NcclGroup group(where_, {nccl_});
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
      enqueued_at_ms_.store(now_ms());
    } catch (const std::exception& e) {
      abort_all(detail::cat("send/recv: ", e.what()));
      throw;
    }
  }

  /// The StreamWatch of this rank's GPU (Note [Waiting on NCCL work]): outlives the
  /// communicator's NCCL state only as an empty shell (owner null after release()).
  class Watch final : public StreamWatch {
   public:
    explicit Watch(CudaMpiCommunicator* owner) : owner_(owner) {}
    Report poll() override {
      std::lock_guard lk(mu_);
      return owner_ ? owner_->poll_watch() : Report{};
    }
    void abort(const std::string& reason) noexcept override {
      std::lock_guard lk(mu_);
      if (owner_) owner_->abort_all(reason);
    }
    void detach() {
      std::lock_guard lk(mu_);
      owner_ = nullptr;
    }

   private:
    std::mutex mu_;
    CudaMpiCommunicator* owner_;
  };

  static std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  /// One poll of the watch: NCCL's asynchronous error, and how long the latest collective (or
  /// send/recv batch) has been unfinished.
  StreamWatch::Report poll_watch() {
    StreamWatch::Report r;
    r.what = where_;
    r.timeout_ms = link_.options().timeout_ms;
    std::unique_lock lk(nccl_mu_, std::try_to_lock);
    if (!lk.owns_lock() || !nccl_) return r;  // enqueueing now: poll again later
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(nccl_, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress)) {
      r.error = true;
      const char* last = ncclGetLastError(nccl_);
      r.what =
          detail::cat(where_, ": NCCL reported an asynchronous error: ", ncclGetErrorString(state),
                      last && *last ? " (" : "", last ? last : "", last && *last ? ")" : "");
      return r;
    }
    const std::int64_t since = enqueued_at_ms_.load();
    if (since >= 0 && last_) {
      const cudaError_t q = cudaEventQuery(last_);
      if (q == cudaErrorNotReady)
        r.pending_ms = now_ms() - since;
      else
        (void)cudaGetLastError();
    }
    return r;
  }

  /// Marks the link failed (the other ranks fail at their next call) and aborts the NCCL
  /// communicator at once (ncclCommAbort: this rank's NCCL kernels stop waiting for peers).
  void abort_all(const std::string& reason) noexcept {
    link_.abort_by_rank(reason);
    std::lock_guard lk(nccl_mu_);
    if (nccl_) {
      DeviceGuard g(physical_, std::nothrow);
      (void)ncclCommAbort(nccl_);
      nccl_ = nullptr;
    }
  }

  /// Every rank's GPU identity; refuses two ranks on one GPU (check_one_rank_per_gpu).
  void check_gpus(detail::mpi::Clock::time_point deadline) {
    const GpuId mine = gpu_identity(physical_, where_);
    auto all = std::make_shared<std::vector<GpuId>>(static_cast<std::size_t>(link_.size()));
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DITTO_MPI_CHECK(
        MPI_Iallgather(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, all->data(),
                       static_cast<int>(mine.size()), MPI_CHAR, link_.comm(), &reqs[0]),
        where_);
    if (!detail::mpi::wait_until(reqs, deadline, where_)) {
      link_.abort_by_rank("timed out in Communicator::init_rank");
      new std::shared_ptr<std::vector<GpuId>>(all);  // leaked on purpose: the request may write
      throw Timeout(detail::cat("Communicator::init_rank (", where_, "): timed out after ",
                                link_.options().timeout_ms,
                                " ms exchanging the ranks' GPUs (MPI_Iallgather)"));
    }
    std::vector<std::string> ids, names;
    for (int r = 0; r < link_.size(); ++r) {
      std::string id(all->at(static_cast<std::size_t>(r)).data());
      const std::size_t slash = id.find('/');
      names.push_back(detail::cat("GPU ", id.substr(slash == std::string::npos ? 0 : slash + 1),
                                  " on host ", id.substr(0, slash)));
      ids.push_back(std::move(id));
    }
    check_one_rank_per_gpu(ids, names);
  }

  void release() noexcept {
    if (watch_) {
      remove_stream_watch(physical_, watch_.get());
      watch_->detach();
      watch_.reset();
    }
    {
      std::lock_guard lk(nccl_mu_);
      if (nccl_) {
        DeviceGuard g(physical_, std::nothrow);
        // Destroy waits for pending work; after a failure the work may never finish: abort.
        // Non-blocking: finalize (flushes the work), polled under the timeout, then destroy.
        bool clean = !link_.aborted();
        if (clean) {
          try {
            nccl_settle(nccl_, ncclCommFinalize(nccl_), "ncclCommFinalize", where_,
                        link_.options().timeout_ms);
          } catch (...) {
            clean = false;
          }
        }
        (void)(clean ? ncclCommDestroy(nccl_) : ncclCommAbort(nccl_));
        nccl_ = nullptr;
      }
    }
    if (last_) (void)cudaEventDestroy(last_);
    if (barrier_buf_) (void)cudaFree(barrier_buf_);
    last_ = nullptr;
    barrier_buf_ = nullptr;
    (void)cudaGetLastError();
  }

  /// The backend when a shared_ptr owns it (CudaBackend::keep_alive): alive until after this.
  const std::shared_ptr<CudaBackend> keep_backend_;
  MpiLink link_;
  CudaBackend& backend_;
  int device_ = 0;
  int physical_ = 0;
  std::string where_;
  std::mutex mu_;
  /// Guards nccl_ between the enqueueing thread, abort() from any thread and the watch (the
  /// enqueueing thread reads it under mu_; abort_all nulls it after ncclCommAbort).
  std::mutex nccl_mu_;
  ncclComm_t nccl_ = nullptr;
  std::shared_ptr<Watch> watch_;
  std::atomic<std::int64_t> enqueued_at_ms_{-1};  ///< when the latest work was enqueued
  cudaEvent_t last_ = nullptr;                    ///< end of this rank's latest collective
  cudaStream_t last_stream_ = nullptr;            ///< where last_ was recorded
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
