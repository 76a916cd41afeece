// CudaCommunicator: ditto's collectives (all_reduce, reduce, broadcast, all_gather,
// reduce_scatter, barrier) on CUDA devices, over NCCL where every rank has a GPU of its own and
// over an in-GPU transport where ranks share a GPU; call matching, timeouts and abort as in the
// simulator (backend_sim/sim_communicator.cpp).
//
// Note [CUDA collectives]
// Rendezvous. Every per-rank call publishes (kind, pointers, count, dtype, op, root, the rank's
// stream) in the slot of its rank for collective #k (the rank's k-th call) and nothing is enqueued
// until every rank of #k has arrived; the caller that completes #k checks that the calls match
// (same kind, count, dtype, op, root; else every rank fails #k with the same InvalidArgument, as
// in the simulator, and the communicator stays usable) and then enqueues the whole collective, on
// every rank's stream, from its own thread, under the communicator's mutex (so collectives are
// enqueued in order). A call returns once its collective is enqueued: stream order then holds
// for whatever the caller enqueues next. Hence:
//  - SPMD (one host thread per rank): each call blocks until all ranks arrived, like a CPU
//    barrier; the last one to arrive enqueues for all.
//  - single controller (one thread for all ranks): it must group its calls, as with NCCL
//    (ncclGroupStart/End): core's vector forms do, and so does ditto::group_start/group_end
//    around a loop over the handles. Inside a group a call never blocks; group_end() blocks until
//    the group's collectives are enqueued and rethrows their first error. One thread calling the
//    handles one by one outside a group waits in the first call for ranks it will never issue,
//    and fails with the timeout.
//  - A rank that does not arrive within CommOptions::timeout_ms makes the waiting callers throw
//    ditto::Timeout naming the collective, its ordinal and the missing ranks; the communicator is
//    then aborted (every later call throws BackendError at once), as in the simulator. Since
//    nothing is enqueued before all ranks are there, no GPU ever waits for a missing peer: no
//    hang, on the host or on a device.
//  - A rank's collectives run one after another even when issued on different streams (each
//    waits for the end of the rank's previous one), so the NCCL scratch and the in-GPU slices
//    never race.
// Unlike raw NCCL, SPMD callers thus also get call matching and timeouts; the cost is one host
// rendezvous (a mutex and a condition variable) per collective.
//
// Transport, chosen once per communicator:
//  - NCCL, when the ranks are on distinct physical GPUs (2 or more; NCCL refuses two ranks on one
//    GPU): one ncclComm per rank from ncclCommInitAll over the ranks' GPUs; the completing caller
//    issues every rank's NCCL call inside one ncclGroupStart/End, on the ranks' streams.
//      fast:    ncclAllReduce / ncclReduce / ncclBroadcast / ncclAllGather / ncclReduceScatter
//               with NCCL's own reductions (ncclAvg for avg); barrier = a 1-element all-reduce.
//      bitwise: NCCL only moves data; ditto's kernel (cuda_comm_kernels.cu) adds in the canonical
//               tree over rank index, element by element, which is exactly the simulator's
//               bitwise reduction (Note [Sim collectives]), so the bits agree. Per rank the
//               traffic stays a ring's, (N-1)/N of the buffer each way per phase:
//        all_reduce      split the count into N blocks (q * per, per = ceil(count / N) rounded
//                        up to 64 elements); (1) all-to-all: rank r sends block q of its send to
//                        rank q (ncclSend/ncclRecv in a group) into a scratch [N, per]; (2) rank
//                        r tree-reduces the N copies of block r (its own straight from send) into
//                        block r of its recv; (3) ncclAllGather in place (or, when the blocks are
//                        uneven, send/recv of the reduced blocks) fills the rest of every recv;
//        reduce_scatter  (1) and (2) with blocks of `count` (rank r's recv is block r's result);
//        reduce          (1), (2) into scratch, then every rank sends its block to the root;
//        broadcast, all_gather, barrier: as in fast mode (no arithmetic).
//      avg is the tree sum divided by N (as the simulator and ncclAvg); min, max and prod use the
//      same tree with their op.
//  - in-GPU, when any two ranks share a physical GPU (oversubscription, e.g. 8 ranks on 1 GPU),
//    or for a single rank: every rank lives in this process and reaches the others' memory
//    directly (one GPU, or peer access between GPUs, which the backend enables). The completing
//    caller enqueues, for every rank r, on r's stream:
//      join:  rank 0's stream waits for every rank's stream (events), then every stream waits
//             for rank 0's (the ranks' inputs are ready, and their previous use is over);
//      work:  one kernel computing rank r's share, like the simulator's task (Note [Sim
//             collectives]): all_reduce / reduce reduce element slice r of every send (the
//             canonical tree in both modes: it is as fast as left to right) and write it into
//             every recv (the root's for reduce); broadcast copies slice r of the root's send into
//             every recv; all_gather copies rank r's send into block r of every recv;
//             reduce_scatter reduces block r of every send into rank r's recv. Only rank r's
//             kernel touches slice (block) r, each element read and written by one thread, so
//             in-place calls are race-free;
//      join again: no rank goes on (and reuses its buffers) before every kernel that reads or
//             writes them has finished.
//    Every byte is read once and written once per destination: the copy-bandwidth bound. A
//    barrier is one join; a collective of count 0 enqueues nothing.
//
// CUDA and NCCL failures become BackendError naming the call, the device and the rank
// (DITTO_CUDA_CHECK, DITTO_NCCL_CHECK); a failure while enqueueing aborts the communicator (the
// ranks' streams may hold part of the collective).
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_cuda/nccl_check.h"
#include "core/internal/collective_call.h"
#include "core/runtime/error.h"

namespace ditto::cuda {

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line,
                      const std::string& where) {
  std::string f = file ? file : "?";
  std::size_t at = f.rfind("backend_cuda/");
  if (at != std::string::npos) f = f.substr(at);
  const char* last = ncclGetLastError(nullptr);
  std::string msg = detail::cat(where, ": ", call, " failed at ", f, ":", line, ": ",
                                ncclGetErrorString(result));
  if (last && *last) msg += detail::cat(" (", last, ")");
  throw BackendError(msg);
}

namespace {

using Kind = detail::CollectiveKind;
using detail::uses_op;
using detail::uses_root;
inline const char* kind_name(Kind k) { return detail::collective_name(k); }

/// One rank's call, as published in its slot, with the stream it was made on.
struct Call : detail::CollectiveCall {
  cudaStream_t stream = nullptr;  ///< the rank's stream (of the rank's device)
};

/// Collective #seq while its ranks arrive, and its outcome.
struct Collective {
  Collective(int n, std::uint64_t ordinal)
      : calls(static_cast<std::size_t>(n)), here(static_cast<std::size_t>(n), 0), seq(ordinal) {}
  enum class State : std::uint8_t { waiting, enqueued, failed };
  std::vector<Call> calls;
  std::vector<char> here;  ///< here[r]: rank r has called
  int arrived = 0;
  std::uint64_t seq;
  State state = State::waiting;
  std::exception_ptr error;  ///< when failed: what every rank throws
};

/// Element offset `off` of a buffer of `elem`-byte elements.
const void* at(const void* p, std::int64_t off, std::size_t elem) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(off) * elem;
}
void* at(void* p, std::int64_t off, std::size_t elem) {
  return static_cast<char*>(p) + static_cast<std::size_t>(off) * elem;
}

/// Block length of element slices: ceil(count / n) rounded up to 64 elements, so that every
/// slice of an aligned buffer stays 16-byte aligned (the kernel's vector path).
std::int64_t slice_length(std::int64_t count, int n) {
  const std::int64_t per = (count + n - 1) / n;
  return (per + 63) / 64 * 64;
}

/// ncclGroupStart now, ncclGroupEnd in end() (or, without throwing, when unwinding).
class NcclGroup {
 public:
  explicit NcclGroup(const std::string& where) : where_(where) {
    DITTO_NCCL_CHECK(ncclGroupStart(), where_);
  }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    DITTO_NCCL_CHECK(ncclGroupEnd(), where_);
  }

 private:
  std::string where_;
  bool open_ = true;
};

class CudaCommunicator final : public CommunicatorImpl {
 public:
  CudaCommunicator(CudaBackend& backend, const std::vector<int>& devices,
                   const CommOptions& options);
  ~CudaCommunicator() override { release(); }
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  void all_reduce(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                  DType dtype, ReduceOp op) override {
    submit(rank, s, {Kind::all_reduce, send, recv, count, dtype, op, 0});
  }
  void reduce(int rank, Stream& s, const void* send, void* recv, std::int64_t count, DType dtype,
              ReduceOp op, int root) override {
    submit(rank, s, {Kind::reduce, send, recv, count, dtype, op, root});
  }
  void broadcast(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                 DType dtype, int root) override {
    submit(rank, s, {Kind::broadcast, send, recv, count, dtype, ReduceOp::sum, root});
  }
  void all_gather(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                  DType dtype) override {
    submit(rank, s, {Kind::all_gather, send, recv, count, dtype, ReduceOp::sum, 0});
  }
  void reduce_scatter(int rank, Stream& s, const void* send, void* recv, std::int64_t count,
                      DType dtype, ReduceOp op) override {
    submit(rank, s, {Kind::reduce_scatter, send, recv, count, dtype, op, 0});
  }
  void barrier(int rank, Stream& s) override { submit(rank, s, {}); }

  void group_start() override;
  void group_end() override;
  void abort(int rank, const std::string& reason) noexcept override;

 private:
  enum class Transport : std::uint8_t { nccl, in_gpu };

  struct Rank {
    int device = 0;    ///< logical device (cuda:device)
    int physical = 0;  ///< its GPU
    std::string where;  ///< "cuda:3 (GPU 0), rank 3 of 8" for error messages
    ncclComm_t nccl = nullptr;
    cudaEvent_t ready = nullptr;  ///< in-GPU joins: the rank's stream reached the join
    cudaEvent_t last = nullptr;   ///< end of the rank's latest collective
    cudaStream_t last_stream = nullptr;  ///< where `last` was recorded (null: no collective yet)
    float* barrier_buf = nullptr;  ///< NCCL barrier: one float on the rank's GPU
  };

  /// A grouped call of this thread whose outcome group_end() waits for.
  struct Pending {
    std::shared_ptr<Collective> collective;
    int rank;
  };

  // ---- rendezvous (Note [CUDA collectives]) -----------------------------------------------------
  void submit(int rank, Stream& s, Call call);
  void resolve_locked(Collective& c);
  void await_locked(std::unique_lock<std::mutex>& lk, Collective& c, int rank,
                    std::chrono::steady_clock::time_point deadline, bool grouped);
  std::string find_mismatch(const Collective& c) const;
  void throw_if_aborted_locked(Kind kind) const;
  void abort_locked(std::string reason, bool timeout);
  static std::string label(Kind kind, std::uint64_t seq) {
    return detail::cat(kind_name(kind), " (collective #", seq, " on this communicator)");
  }

  // ---- enqueueing (caller holds mu_) -----------------------------------------------------------
  void enqueue(const Collective& c);
  void after_previous(int r, cudaStream_t s);
  void mark_end(int r, cudaStream_t s);
  void in_gpu_join(const Collective& c);
  void in_gpu_share(const Collective& c, int r);
  void nccl_native(const Collective& c);
  void nccl_bitwise(const Collective& c);

  void release() noexcept;

  const CommOptions options_;
  const int n_;
  Transport transport_ = Transport::in_gpu;
  std::vector<Rank> ranks_;
  cudaEvent_t gate_ = nullptr;  ///< in-GPU joins: on rank 0's GPU

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::uint64_t> seq_;  ///< calls published per rank
  std::map<std::uint64_t, std::shared_ptr<Collective>> open_;  ///< collectives not yet complete
  std::map<std::thread::id, std::vector<Pending>> groups_;     ///< threads inside a group
  bool aborted_ = false;
  bool abort_timeout_ = false;
  bool abort_by_rank_ = false;  // the abort came from a rank's Communicator::abort
  int failed_rank_ = -1;        // that rank (PeerFailure), or -1
  std::string abort_reason_;
};

// ---- construction -------------------------------------------------------------------------------

CudaCommunicator::CudaCommunicator(CudaBackend& backend, const std::vector<int>& devices,
                                   const CommOptions& options)
    : options_(options),
      n_(static_cast<int>(devices.size())),
      ranks_(devices.size()),
      seq_(devices.size(), 0) {
  try {
    std::vector<int> physical(devices.size());
    for (int r = 0; r < n_; ++r) {
      Rank& k = ranks_[static_cast<std::size_t>(r)];
      k.device = devices[static_cast<std::size_t>(r)];
      k.physical = backend.physical_device(k.device);
      k.where = detail::cat(backend.where(k.device), ", rank ", r, " of ", n_);
      physical[static_cast<std::size_t>(r)] = k.physical;
    }
    std::vector<int> distinct = physical;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const bool shared = distinct.size() < physical.size();
    transport_ = (n_ >= 2 && !shared) ? Transport::nccl : Transport::in_gpu;

    if (transport_ == Transport::in_gpu) {
      DITTO_CHECK_T(BackendError, n_ <= kCommMaxPointers, "Communicator::init_all: ", n_,
                    " ranks share GPUs; the in-GPU transport takes at most ", kCommMaxPointers,
                    " ranks");
      for (int a : distinct)
        for (int b : distinct) {
          if (a == b) continue;
          int can = 0;
          DITTO_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b), detail::cat("GPU ", a));
          DITTO_CHECK_T(BackendError, can, "Communicator::init_all: ranks share GPUs, so the "
                        "communicator uses the in-GPU transport, which needs peer access between "
                        "all its GPUs; GPU ", a, " cannot access GPU ", b,
                        " (use one rank per GPU, or only GPUs with peer access)");
        }
    }

    for (Rank& k : ranks_) {
      DeviceGuard g(k.physical);
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&k.ready, cudaEventDisableTiming), k.where);
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&k.last, cudaEventDisableTiming), k.where);
    }
    {
      DeviceGuard g(ranks_[0].physical);
      DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&gate_, cudaEventDisableTiming), ranks_[0].where);
    }

    if (transport_ == Transport::nccl) {
      std::vector<ncclComm_t> comms(static_cast<std::size_t>(n_), nullptr);
      {
        DeviceGuard g(ranks_[0].physical);  // restores the caller's device afterwards
        std::string gpus;
        for (int r = 0; r < n_; ++r) gpus += (r ? ", " : "") + std::to_string(physical[r]);
        DITTO_NCCL_CHECK(ncclCommInitAll(comms.data(), n_, physical.data()),
                         detail::cat("Communicator::init_all (", n_, " ranks on GPUs ", gpus, ")"));
      }
      for (int r = 0; r < n_; ++r) ranks_[static_cast<std::size_t>(r)].nccl = comms[r];
      for (Rank& k : ranks_) {
        DeviceGuard g(k.physical);
        DITTO_CUDA_CHECK(cudaMalloc(&k.barrier_buf, sizeof(float)), k.where);
        DITTO_CUDA_CHECK(cudaMemset(k.barrier_buf, 0, sizeof(float)), k.where);
      }
    }
  } catch (...) {
    release();
    throw;
  }
}

void CudaCommunicator::release() noexcept {
  // Communicators first (they may still run work on the ranks' streams), then events and memory.
  bool any_nccl = false;
  for (const Rank& k : ranks_) any_nccl = any_nccl || k.nccl;
  if (any_nccl) {
    if (aborted_) {
      for (Rank& k : ranks_)
        if (k.nccl) (void)ncclCommAbort(k.nccl);
    } else {  // waits for the communicator's pending work, as nccl-tests does for one thread
      for (Rank& k : ranks_)
        if (k.nccl) (void)ncclCommDestroy(k.nccl);
    }
    for (Rank& k : ranks_) k.nccl = nullptr;
  }
  for (Rank& k : ranks_) {
    if (k.ready) (void)cudaEventDestroy(k.ready);
    if (k.last) (void)cudaEventDestroy(k.last);
    if (k.barrier_buf) (void)cudaFree(k.barrier_buf);
    k.ready = k.last = nullptr;
    k.barrier_buf = nullptr;
  }
  if (gate_) (void)cudaEventDestroy(gate_);
  gate_ = nullptr;
  (void)cudaGetLastError();  // nothing here may leave an error for the next unrelated call
}

// ---- rendezvous ---------------------------------------------------------------------------------

void CudaCommunicator::throw_if_aborted_locked(Kind kind) const {
  if (aborted_)
    throw PeerFailure(detail::cat(kind_name(kind), ": communicator aborted by an earlier error: ",
                                  abort_reason_), failed_rank_);
}

void CudaCommunicator::abort_locked(std::string reason, bool timeout) {
  aborted_ = true;
  abort_timeout_ = timeout;
  abort_reason_ = std::move(reason);
  cv_.notify_all();
}

void CudaCommunicator::submit(int rank, Stream& s, Call call) {
  call.stream = as_cuda(s, kind_name(call.kind)).get();
  std::unique_lock lk(mu_);
  throw_if_aborted_locked(call.kind);
  const auto me = std::this_thread::get_id();
  const std::uint64_t seq = ++seq_[static_cast<std::size_t>(rank)];
  std::shared_ptr<Collective>& slot = open_[seq];
  if (!slot) slot = std::make_shared<Collective>(n_, seq);
  std::shared_ptr<Collective> c = slot;
  c->calls[static_cast<std::size_t>(rank)] = call;
  c->here[static_cast<std::size_t>(rank)] = 1;
  if (++c->arrived == n_) {
    open_.erase(seq);
    resolve_locked(*c);
  }
  auto group = groups_.find(me);
  if (group != groups_.end()) {
    group->second.push_back({c, rank});
    return;
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  await_locked(lk, *c, rank, deadline, false);
}

void CudaCommunicator::resolve_locked(Collective& c) {
  std::string mismatch = find_mismatch(c);
  if (!mismatch.empty()) {
    c.state = Collective::State::failed;
    c.error = std::make_exception_ptr(InvalidArgument(mismatch));
  } else {
    try {
      enqueue(c);
      c.state = Collective::State::enqueued;
    } catch (const std::exception& e) {
      // Part of the collective may be on the ranks' streams: abort (like ncclCommAbort).
      std::string reason = detail::cat(label(c.calls[0].kind, c.seq), ": ", e.what());
      c.state = Collective::State::failed;
      c.error = std::current_exception();
      abort_locked(std::move(reason), false);
    }
  }
  cv_.notify_all();
}

void CudaCommunicator::await_locked(std::unique_lock<std::mutex>& lk, Collective& c, int rank,
                                    std::chrono::steady_clock::time_point deadline, bool grouped) {
  const Kind kind = c.calls[static_cast<std::size_t>(rank)].kind;
  while (c.state == Collective::State::waiting && !aborted_) {
    if (cv_.wait_until(lk, deadline) == std::cv_status::timeout &&
        c.state == Collective::State::waiting && !aborted_) {
      std::vector<int> missing;
      for (int q = 0; q < n_; ++q)
        if (!c.here[static_cast<std::size_t>(q)]) missing.push_back(q);
      std::string who = missing.size() == 1 ? "rank " : "ranks ";
      for (std::size_t i = 0; i < missing.size(); ++i)
        who += (i ? ", " : "") + std::to_string(missing[i]);
      std::string msg = detail::cat(label(kind, c.seq), ": timed out after ", options_.timeout_ms,
                                    " ms waiting for ", who, " (communicator of ", n_,
                                    " ranks; it is now aborted)");
      if (!grouped)
        msg += "; on cuda a call waits until every rank has called, so one thread driving "
               "several ranks must call them inside group_start()/group_end() or use the "
               "single-controller forms";
      abort_locked(msg, true);
      throw Timeout(msg);
    }
  }
  if (c.state == Collective::State::enqueued) return;
  if (c.state == Collective::State::failed) std::rethrow_exception(c.error);
  // Aborted (another rank timed out or failed, or an enqueue failed) while this one waited.
  if (abort_timeout_) throw Timeout(abort_reason_);
  if (abort_by_rank_)
    throw PeerFailure(detail::cat(label(kind, c.seq), ": ", abort_reason_), failed_rank_);
  throw BackendError(abort_reason_);
}

void CudaCommunicator::abort(int rank, const std::string& reason) noexcept {
  try {
    std::lock_guard lk(mu_);
    if (aborted_) return;  // the first reason stays
    abort_locked(detail::cat("rank ", rank, " failed: ", reason), false);
    abort_by_rank_ = true;
    failed_rank_ = rank;
  } catch (...) {  // allocation failure of the message: the flag is what matters
    aborted_ = true;
    cv_.notify_all();
  }
}

void CudaCommunicator::group_start() {
  std::lock_guard lk(mu_);
  groups_[std::this_thread::get_id()];  // present (and empty) while the thread is in a group
}

void CudaCommunicator::group_end() {
  std::unique_lock lk(mu_);
  auto it = groups_.find(std::this_thread::get_id());
  if (it == groups_.end()) return;
  std::vector<Pending> pending = std::move(it->second);
  groups_.erase(it);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  std::exception_ptr first;
  for (Pending& p : pending) {
    try {
      await_locked(lk, *p.collective, p.rank, deadline, true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// Empty when every rank's call matches rank 0's; else the error every rank throws (the
// simulator's wording).
std::string CudaCommunicator::find_mismatch(const Collective& col) const {
  return detail::find_call_mismatch(col.calls, col.seq);
}

// ---- enqueueing ---------------------------------------------------------------------------------

void CudaCommunicator::enqueue(const Collective& c) {
  for (int r = 0; r < n_; ++r) {
    DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
    after_previous(r, c.calls[static_cast<std::size_t>(r)].stream);
  }
  const Call& c0 = c.calls[0];
  if (transport_ == Transport::in_gpu) {
    if (c0.kind == Kind::barrier) {
      in_gpu_join(c);
    } else if (c0.count > 0) {  // no data, no work
      in_gpu_join(c);
      for (int r = 0; r < n_; ++r) {
        DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
        in_gpu_share(c, r);
      }
      in_gpu_join(c);
    }
  } else if (options_.determinism == Determinism::bitwise && uses_op(c0.kind)) {
    nccl_bitwise(c);
  } else {
    nccl_native(c);
  }
  for (int r = 0; r < n_; ++r) {
    DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
    mark_end(r, c.calls[static_cast<std::size_t>(r)].stream);
  }
}

// A rank's collectives run one at a time: on a stream other than its previous collective's, wait
// for that one first (same stream: stream order already does).
void CudaCommunicator::after_previous(int r, cudaStream_t s) {
  Rank& k = ranks_[static_cast<std::size_t>(r)];
  if (k.last_stream && k.last_stream != s)
    DITTO_CUDA_CHECK(cudaStreamWaitEvent(s, k.last, 0), k.where);
}

void CudaCommunicator::mark_end(int r, cudaStream_t s) {
  Rank& k = ranks_[static_cast<std::size_t>(r)];
  DITTO_CUDA_CHECK(cudaEventRecord(k.last, s), k.where);
  k.last_stream = s;
}

// Every rank's stream waits for every other's current end, through rank 0's stream (2N waits
// instead of N^2).
void CudaCommunicator::in_gpu_join(const Collective& c) {
  if (n_ == 1) return;
  auto stream = [&](int r) { return c.calls[static_cast<std::size_t>(r)].stream; };
  for (int r = 1; r < n_; ++r) {
    const Rank& k = ranks_[static_cast<std::size_t>(r)];
    DeviceGuard g(k.physical);
    DITTO_CUDA_CHECK(cudaEventRecord(k.ready, stream(r)), k.where);
  }
  {
    const Rank& k0 = ranks_[0];
    DeviceGuard g(k0.physical);
    for (int r = 1; r < n_; ++r)
      DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream(0), ranks_[static_cast<std::size_t>(r)].ready, 0),
                       k0.where);
    DITTO_CUDA_CHECK(cudaEventRecord(gate_, stream(0)), k0.where);
  }
  for (int r = 1; r < n_; ++r) {
    const Rank& k = ranks_[static_cast<std::size_t>(r)];
    DeviceGuard g(k.physical);
    DITTO_CUDA_CHECK(cudaStreamWaitEvent(stream(r), gate_, 0), k.where);
  }
}

// Rank r's share of an in-GPU collective (Note [CUDA collectives]), on r's stream.
void CudaCommunicator::in_gpu_share(const Collective& col, int r) {
  const Call& c0 = col.calls[0];
  const std::size_t elem = dtype_size(c0.dtype);
  const std::int64_t count = c0.count;
  auto call = [&](int q) -> const Call& { return col.calls[static_cast<std::size_t>(q)]; };
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  std::int64_t len = count;
  ReduceOp op = ReduceOp::sum;  // no arithmetic with one source
  switch (c0.kind) {
    case Kind::all_gather:  // rank r's send into block r of every recv
      srcs.push_back(call(r).send);
      for (int q = 0; q < n_; ++q) dsts.push_back(at(call(q).recv, r * count, elem));
      break;
    case Kind::reduce_scatter:  // block r of every send into rank r's recv
      op = c0.op;
      for (int q = 0; q < n_; ++q) srcs.push_back(at(call(q).send, r * count, elem));
      dsts.push_back(call(r).recv);
      break;
    case Kind::all_reduce:
    case Kind::reduce:
    case Kind::broadcast: {  // element slice r
      const std::int64_t per = slice_length(count, n_);
      const std::int64_t lo = std::min(count, r * per);
      len = std::min(count, lo + per) - lo;
      if (len == 0) return;
      if (c0.kind == Kind::broadcast) {
        srcs.push_back(at(call(c0.root).send, lo, elem));
        for (int q = 0; q < n_; ++q) dsts.push_back(at(call(q).recv, lo, elem));
      } else {
        op = c0.op;
        for (int q = 0; q < n_; ++q) srcs.push_back(at(call(q).send, lo, elem));
        if (c0.kind == Kind::all_reduce)
          for (int q = 0; q < n_; ++q) dsts.push_back(at(call(q).recv, lo, elem));
        else
          dsts.push_back(at(call(c0.root).recv, lo, elem));
      }
      break;
    }
    case Kind::barrier: return;
  }
  if (srcs.size() == 1)  // a copy onto itself is no work (in-place broadcast, all_gather)
    dsts.erase(std::remove(dsts.begin(), dsts.end(), srcs[0]), dsts.end());
  const Rank& k = ranks_[static_cast<std::size_t>(r)];
  DITTO_CUDA_CHECK(launch_comm_reduce(call(r).stream, srcs, dsts, len, c0.dtype, op), k.where);
}

// NCCL's own collectives, one group over all ranks (fast mode; data movement in bitwise mode).
void CudaCommunicator::nccl_native(const Collective& col) {
  const Call& c0 = col.calls[0];
  if (c0.kind != Kind::barrier && c0.count == 0) return;
  const auto count = static_cast<std::size_t>(c0.count);
  const ncclDataType_t type = nccl_type(c0.dtype);
  NcclGroup group(ranks_[0].where);
  for (int r = 0; r < n_; ++r) {
    const Call& c = col.calls[static_cast<std::size_t>(r)];
    const Rank& k = ranks_[static_cast<std::size_t>(r)];
    switch (c0.kind) {
      case Kind::all_reduce:
        DITTO_NCCL_CHECK(ncclAllReduce(c.send, c.recv, count, type, nccl_op(c.op), k.nccl,
                                       c.stream),
                         k.where);
        break;
      case Kind::reduce:  // recv is unused (and null) off the root
        DITTO_NCCL_CHECK(ncclReduce(c.send, c.recv ? c.recv : const_cast<void*>(c.send), count,
                                    type, nccl_op(c.op), c.root, k.nccl, c.stream),
                         k.where);
        break;
      case Kind::broadcast:  // send is unused (and null) off the root
        DITTO_NCCL_CHECK(ncclBroadcast(c.send ? c.send : c.recv, c.recv, count, type, c.root,
                                       k.nccl, c.stream),
                         k.where);
        break;
      case Kind::all_gather:
        DITTO_NCCL_CHECK(ncclAllGather(c.send, c.recv, count, type, k.nccl, c.stream), k.where);
        break;
      case Kind::reduce_scatter:
        DITTO_NCCL_CHECK(ncclReduceScatter(c.send, c.recv, count, type, nccl_op(c.op), k.nccl,
                                           c.stream),
                         k.where);
        break;
      case Kind::barrier:
        DITTO_NCCL_CHECK(ncclAllReduce(k.barrier_buf, k.barrier_buf, 1, ncclFloat32, ncclSum,
                                       k.nccl, c.stream),
                         k.where);
        break;
    }
  }
  group.end();
}

// Bitwise all_reduce, reduce and reduce_scatter over NCCL: NCCL moves the blocks, ditto's kernel
// adds them in the canonical tree (Note [CUDA collectives]).
void CudaCommunicator::nccl_bitwise(const Collective& col) {
  const Call& c0 = col.calls[0];
  const Kind kind = c0.kind;
  const std::int64_t count = c0.count;
  if (count == 0) return;
  const std::size_t elem = dtype_size(c0.dtype);
  const ncclDataType_t type = nccl_type(c0.dtype);
  const int root = c0.root;
  // Block q is elements [q * per, q * per + len(q)) of the buffer being reduced.
  const bool scatter = kind == Kind::reduce_scatter;
  const std::int64_t per = scatter ? count : slice_length(count, n_);
  auto len = [&](int q) -> std::int64_t {
    return scatter ? count : std::max<std::int64_t>(0, std::min(per, count - q * per));
  };
  auto call = [&](int q) -> const Call& { return col.calls[static_cast<std::size_t>(q)]; };
  auto rank = [&](int q) -> Rank& { return ranks_[static_cast<std::size_t>(q)]; };

  // Scratch [N, per] per rank: row q receives rank q's copy of this rank's block. Stream-ordered
  // memory, freed on the same stream after the last use (also when enqueueing fails midway);
  // then the caller's current device is restored.
  int caller_device = 0;
  DITTO_CUDA_CHECK(cudaGetDevice(&caller_device), ranks_[0].where);
  struct Restore {
    int device;
    ~Restore() {
      if (cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
    }
  } restore{caller_device};
  std::vector<void*> scratch(static_cast<std::size_t>(n_), nullptr);
  struct Free {
    const std::vector<Rank>& ranks;
    const Collective& col;
    const std::vector<void*>& scratch;
    ~Free() {
      for (std::size_t r = 0; r < scratch.size(); ++r) {
        if (!scratch[r]) continue;
        if (cudaSetDevice(ranks[r].physical) != cudaSuccess ||
            cudaFreeAsync(scratch[r], col.calls[r].stream) != cudaSuccess)
          (void)cudaGetLastError();
      }
    }
  } free_scratch{ranks_, col, scratch};  // destroyed before `restore`
  const std::size_t scratch_bytes = static_cast<std::size_t>(n_ * per) * elem;
  for (int r = 0; r < n_; ++r) {
    DeviceGuard g(rank(r).physical);
    DITTO_CUDA_CHECK(cudaMallocAsync(&scratch[static_cast<std::size_t>(r)], scratch_bytes,
                                     call(r).stream),
                     rank(r).where);
  }

  // (1) all-to-all: rank r sends its block q to rank q and receives its block r from rank q.
  {
    NcclGroup group(rank(0).where);
    for (int r = 0; r < n_; ++r) {
      const Call& c = call(r);
      const Rank& k = rank(r);
      for (int q = 0; q < n_; ++q) {
        if (q == r) continue;
        if (len(q) > 0)
          DITTO_NCCL_CHECK(ncclSend(at(c.send, q * per, elem), static_cast<std::size_t>(len(q)),
                                    type, q, k.nccl, c.stream),
                           k.where);
        if (len(r) > 0)
          DITTO_NCCL_CHECK(ncclRecv(at(scratch[r], q * per, elem),
                                    static_cast<std::size_t>(len(r)), type, q, k.nccl, c.stream),
                           k.where);
      }
    }
    group.end();
  }

  // (2) rank r reduces the N copies of its block (its own straight from send).
  for (int r = 0; r < n_; ++r) {
    if (len(r) == 0) continue;
    const Call& c = call(r);
    std::vector<const void*> srcs;
    for (int q = 0; q < n_; ++q)
      srcs.push_back(q == r ? at(c.send, r * per, elem) : at(scratch[r], q * per, elem));
    void* dst = nullptr;
    if (kind == Kind::all_reduce)
      dst = at(c.recv, r * per, elem);
    else if (kind == Kind::reduce_scatter)
      dst = c.recv;
    else  // reduce: the root's recv, else the unused row r of the scratch
      dst = r == root ? at(c.recv, r * per, elem) : at(scratch[r], r * per, elem);
    DeviceGuard g(rank(r).physical);
    DITTO_CUDA_CHECK(launch_comm_reduce(c.stream, srcs, {dst}, len(r), c0.dtype, c0.op),
                     rank(r).where);
  }

  // (3) distribute the reduced blocks.
  if (kind == Kind::all_reduce) {
    NcclGroup group(rank(0).where);
    if (per * n_ == count) {  // even blocks: NCCL's in-place all-gather
      for (int r = 0; r < n_; ++r)
        DITTO_NCCL_CHECK(ncclAllGather(at(call(r).recv, r * per, elem), call(r).recv,
                                       static_cast<std::size_t>(per), type, rank(r).nccl,
                                       call(r).stream),
                         rank(r).where);
    } else {
      for (int r = 0; r < n_; ++r)
        for (int q = 0; q < n_; ++q) {
          if (q == r) continue;
          if (len(r) > 0)
            DITTO_NCCL_CHECK(ncclSend(at(call(r).recv, r * per, elem),
                                      static_cast<std::size_t>(len(r)), type, q, rank(r).nccl,
                                      call(r).stream),
                             rank(r).where);
          if (len(q) > 0)
            DITTO_NCCL_CHECK(ncclRecv(at(call(r).recv, q * per, elem),
                                      static_cast<std::size_t>(len(q)), type, q, rank(r).nccl,
                                      call(r).stream),
                             rank(r).where);
        }
    }
    group.end();
  } else if (kind == Kind::reduce) {
    NcclGroup group(rank(0).where);
    for (int q = 0; q < n_; ++q) {
      if (q == root || len(q) == 0) continue;
      DITTO_NCCL_CHECK(ncclSend(at(scratch[q], q * per, elem), static_cast<std::size_t>(len(q)),
                                type, root, rank(q).nccl, call(q).stream),
                       rank(q).where);
      DITTO_NCCL_CHECK(ncclRecv(at(call(root).recv, q * per, elem),
                                static_cast<std::size_t>(len(q)), type, q, rank(root).nccl,
                                call(root).stream),
                       rank(root).where);
    }
    group.end();
  }
}

}  // namespace

std::shared_ptr<CommunicatorImpl> make_cuda_communicator(CudaBackend& backend,
                                                         const std::vector<int>& devices,
                                                         const CommOptions& options) {
  return std::make_shared<CudaCommunicator>(backend, devices, options);
}

}  // namespace ditto::cuda
