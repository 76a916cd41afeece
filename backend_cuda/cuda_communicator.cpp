// CudaCommunicator: ditto's collectives (all_reduce, reduce, broadcast, all_gather,
// reduce_scatter, all_to_all, all_to_all_v, gather, scatter, barrier; every dtype and op) and
// point-to-point calls (cuda_communicator_p2p.cpp) on CUDA devices, over NCCL where every rank
// has a GPU of its own and over an in-GPU transport where ranks share a GPU; call matching,
// timeouts and abort as in the simulator (backend_sim/sim_communicator.cpp).
//
// Note [CUDA collectives]
// Rendezvous (Note [Rendezvous], core/backend_api/rendezvous.h). Every per-rank call publishes
// (kind, pointers, count, dtype, op, root, the rank's stream) in the slot of its rank for
// collective #k (the rank's k-th call) and nothing is enqueued until every rank of #k has arrived;
// the caller that completes #k checks that the calls match (same kind, count, dtype, op, root; else
// every rank fails #k with the same InvalidArgument, as in the simulator, and the communicator
// stays usable) and then enqueues the whole collective, on every rank's stream, from its own
// thread, under the communicator's mutex (so collectives are enqueued in order). A call returns
// once its collective is enqueued: stream order then holds for whatever the caller enqueues next.
// Hence:
//  - SPMD (one host thread per rank): each call blocks until all ranks arrived, like a CPU
//    barrier; the last one to arrive enqueues for all.
//  - single controller (one thread for all ranks): it must group its calls, as with NCCL
//    (ncclGroupStart/End): core's vector forms do, and so does ditto::group_start/group_end
//    around a loop over the handles. Inside a group a call never blocks; group_end() blocks until
//    the group's collectives are enqueued and rethrows their first error. One thread calling the
//    handles one by one outside a group waits in the first call for ranks it will never issue,
//    and fails with the timeout.
//  - A rank that does not arrive within CommOptions::timeout_ms of the first rank's call to #k
//    makes the waiting callers throw
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
//               with NCCL's own reductions (ncclAvg for avg, ncclRedOpCreatePreMulSum for
//               premul_sum), ncclAlltoAll, ncclGather, ncclScatter, all_to_all_v as ncclSend /
//               ncclRecv per peer; barrier = a 1-element all-reduce. NCCL reduces in the element
//               type and rounds at every hop (a ring adds one rank per step, so f16 / bf16 / fp8
//               round to the type at each step); its ncclAvg on floats is PreMulSum by 1/N in the
//               type (for f16, 1/N itself rounded to half) and on integers FuncSumPostDiv (the
//               wrapped sum, then C's truncating division by N: ditto's rule, Note [Reductions
//               over ranks]); its PreMulSum multiplies in the type (half2 for f16). So fast
//               f16 / bf16 / fp8 results differ from bitwise ones (and from the simulator's fast
//               mode, which accumulates in f32); integer results are exact in both modes.
//               NCCL's min / max (fminf / fmaxf) return the non-NaN operand where ditto's keep
//               the NaN (Note [Reductions over ranks]): fast mode only.
//               (NCCL's source: hostToDevRedOp in src/enqueue.cc maps ncclAvg to
//               ncclDevSumPostDiv with nRanks for the integer types and to ncclDevPreMulSum with
//               1.0/nRanks converted to the type, __float2half for f16, for the floats;
//               src/device/reduce_kernel.h: FuncSumPostDiv's postOp is T(x/n), and
//               FuncPreMulSum<half> holds its scalar as half2 on sm_53+.)
//               fp8 reductions need NCCL 2.24 (headers and library): before, every rank's
//               call fails with the same BackendError and nothing is enqueued (Note [NCCL
//               fp8], cuda_host_logic.h); fp8 data movement goes as ncclUint8 on any NCCL.
//      bitwise: NCCL only moves data and ditto's kernel reduces (reduce_math.h: Acc, the
//               canonical tree, one rounding; each rank's premul_sum scalar): the block
//               algorithm of Note [CUDA bitwise collectives] (cuda_bitwise.cpp) over
//               NcclTransport (cuda_nccl.h), driving every rank from the completing caller;
//               broadcast, all_gather, barrier: as in fast mode (no arithmetic).
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
//      all_to_all, all_to_all_v, gather and scatter are copies in the same frame: rank r's
//      kernel copies what rank r sends (scatter: what it receives), so again every element of a
//      recv is written by one kernel.
//    Every byte is read once and written once per destination: the copy-bandwidth bound. A
//    barrier is one join; a collective of count 0 enqueues nothing.
//
// CUDA and NCCL failures become BackendError naming the call, the device and the rank
// (DITTO_CUDA_CHECK, DITTO_NCCL_CHECK); a failure while enqueueing aborts the communicator (the
// ranks' streams may hold part of the collective).
#include "backend_cuda/cuda_communicator.h"

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
#include "backend_cuda/cuda_bitwise.h"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_cuda/cuda_host_logic.h"
#include "backend_cuda/cuda_nccl.h"
#include "core/backend_api/collective_call.h"
#include "core/backend_api/rendezvous.h"
#include "core/base/error.h"

namespace ditto::cuda {

using Cause = detail::AbortState::Cause;
using detail::uses_op;
namespace {
inline const char* kind_name(Kind k) { return detail::collective_name(k); }
}  // namespace

// ---- construction -------------------------------------------------------------------------------

CudaCommunicator::CudaCommunicator(CudaBackend& backend, const std::vector<int>& devices,
                                   const CommOptions& options)
    : keep_backend_(backend.keep_alive()),
      backend_(backend),
      options_(options),
      n_(static_cast<int>(devices.size())),
      ranks_(devices.size()),
      rv_(n_, options.timeout_ms),
      p2p_(n_) {
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
          DITTO_CHECK_T(BackendError, can,
                        "Communicator::init_all: ranks share GPUs, so the "
                        "communicator uses the in-GPU transport, which needs peer access between "
                        "all its GPUs; GPU ",
                        a, " cannot access GPU ", b,
                        " (use one rank per GPU, or only GPUs with peer access)");
          // Enabled when the backend started; a pair whose cudaDeviceEnablePeerAccess failed
          // then is tried again here (its kernels would fault on the peer's memory without it).
          DITTO_CHECK_T(BackendError, ensure_peer_access(a, b),
                        "Communicator::init_all: ranks share GPUs, so the communicator uses the "
                        "in-GPU transport, which needs peer access between all its GPUs; "
                        "cudaDeviceEnablePeerAccess from GPU ",
                        a, " to GPU ", b,
                        " failed although the hardware allows it (use one rank per GPU)");
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
    if (rv_.abort_state().aborted()) {
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

void CudaCommunicator::abort_locked(Cause cause, std::string reason) {
  rv_.abort_state().abort(cause, std::move(reason));
  cv_.notify_all();
}

void CudaCommunicator::enqueue(int rank, Stream& s, const detail::CollectiveCall& call) {
  Call c{call, as_cuda(s, kind_name(call.kind)).get()};
  std::unique_lock lk(mu_);
  rv_.abort_state().throw_if_aborted(call.kind);
  auto group = groups_.find(std::this_thread::get_id());
  if (detail::is_p2p(call.kind)) {  // Note [CUDA point-to-point]
    if (group != groups_.end()) {
      group->second.p2p.emplace_back(rank, std::move(c));
      return;
    }
    std::shared_ptr<P2PTicket> t = post_p2p_locked(rank, c);
    await_p2p_locked(lk, *t, false);
    return;
  }
  std::shared_ptr<Round> round = rv_.enter(rank);
  if (rv_.arrive(*round, rank, c)) resolve_locked(*round);
  if (group != groups_.end()) {
    group->second.pending.push_back({round, rank});
    return;
  }
  await_locked(lk, *round, rank, false);
}

void CudaCommunicator::resolve_locked(Round& round) {
  std::string mismatch = rv_.mismatch(round);
  std::exception_ptr refused;  // NCCL cannot take the call (fp8 reductions before NCCL 2.24)
  if (mismatch.empty() && transport_ == Transport::nccl &&
      options_.determinism == Determinism::fast) {
    try {
      check_nccl_dtype(round.calls[0], ranks_[0].where);
    } catch (const BackendError&) {
      refused = std::current_exception();
    }
  }
  if (!mismatch.empty() || refused) {  // nothing enqueued: every rank fails, the comm goes on
    round.state = Round::State::failed;
    round.error = refused ? refused : std::make_exception_ptr(InvalidArgument(mismatch));
  } else {
    try {
      run(round);
      round.state = Round::State::done;
    } catch (const std::exception& e) {
      // Part of the collective may be on the ranks' streams: abort, and free the NCCL kernels
      // of whatever did reach a GPU at once (ncclCommAbort), not at the communicator's end.
      std::string reason =
          detail::cat(detail::collective_label(round.calls[0].kind, round.seq), ": ", e.what());
      round.state = Round::State::failed;
      round.error = std::current_exception();
      abort_locked(Cause::error, std::move(reason));
      abort_nccl_locked();
    }
  }
  cv_.notify_all();
}

// Waits until round's collective is enqueued, failed, or the communicator aborted; at the
// round's deadline (Note [Rendezvous]) aborts with Timeout.
void CudaCommunicator::await_locked(std::unique_lock<std::mutex>& lk, Round& round, int rank,
                                    bool grouped) {
  const Kind kind = round.calls[static_cast<std::size_t>(rank)].kind;
  const detail::AbortState& state = rv_.abort_state();
  while (round.state == Round::State::waiting && !state.aborted()) {
    const auto due =
        rv_.next_due(round);  // the warning's time first (Note [Slow collective warning])
    if (cv_.wait_until(lk, due) == std::cv_status::timeout && due < round.deadline) {
      rv_.warn_if_due(round, kind);
      continue;
    }
    if (std::chrono::steady_clock::now() >= round.deadline &&
        round.state == Round::State::waiting && !state.aborted()) {
      rv_.warn_if_due(round, kind);  // not printed yet when the wake came late
      std::string msg = rv_.timeout_reason(round, kind);
      if (!grouped)
        msg += "; on cuda a call waits until every rank has called, so one thread driving "
               "several ranks must call them inside group_start()/group_end() or use the "
               "single-controller forms";
      abort_locked(Cause::timeout, msg);
      throw Timeout(msg);
    }
  }
  if (round.state == Round::State::done) return;
  if (round.state == Round::State::failed) std::rethrow_exception(round.error);
  // Aborted (another rank timed out or failed, or an enqueue failed) while this one waited.
  std::rethrow_exception(state.error_for(detail::collective_label(kind, round.seq)));
}

void CudaCommunicator::abort(int rank, const std::string& reason) noexcept {
  std::lock_guard lk(mu_);
  if (rv_.abort_state().rank_failed(rank, reason)) cv_.notify_all();  // else the first stays
  abort_nccl_locked();
}

void CudaCommunicator::abort_nccl_locked() noexcept {
  for (Rank& k : ranks_)
    if (k.nccl) {
      (void)ncclCommAbort(k.nccl);
      k.nccl = nullptr;
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
  Group group = std::move(it->second);
  groups_.erase(it);
  std::exception_ptr first;
  // The group's sends and recvs are posted together (so a ring in one group matches), then
  // everything the group issued is waited for.
  std::vector<std::shared_ptr<P2PTicket>> tickets;
  for (auto& [rank, c] : group.p2p) {
    try {
      rv_.abort_state().throw_if_aborted(c.kind);
      tickets.push_back(post_p2p_locked(rank, c));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  for (Pending& p : group.pending) {
    try {
      await_locked(lk, *p.round, p.rank, true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  for (auto& t : tickets) {
    try {
      await_p2p_locked(lk, *t, true);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---- enqueueing ---------------------------------------------------------------------------------

void CudaCommunicator::run(const Round& round) {
  for (int r = 0; r < n_; ++r) {
    DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
    after_previous(r, round.calls[static_cast<std::size_t>(r)].stream);
  }
  const Call& c0 = round.calls[0];
  // all_to_all_v has count 0 (its counts are per peer); every other collective of count 0 moves
  // no data: no work.
  const bool work = c0.kind == Kind::all_to_all_v || c0.count > 0;
  if (transport_ == Transport::in_gpu) {
    if (c0.kind == Kind::barrier) {
      in_gpu_join(round);
    } else if (work) {
      in_gpu_join(round);
      for (int r = 0; r < n_; ++r) {
        DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
        in_gpu_share(round, r);
      }
      in_gpu_join(round);
    }
  } else if (c0.kind != Kind::barrier && !work) {
    // no data, no work
  } else if (options_.determinism == Determinism::bitwise && uses_op(c0.kind)) {
    nccl_bitwise(round);
  } else {  // NCCL's own collectives, one group over all ranks
    // Every rank's premul_sum op is made before the group opens (enqueue_group): a failure for
    // rank r > 0 then enqueues no rank, instead of launching ranks 0..r-1 alone.
    auto rank = [&](int r) -> const Rank& { return ranks_[static_cast<std::size_t>(r)]; };
    auto call = [&](int r) -> const Call& { return round.calls[static_cast<std::size_t>(r)]; };
    const std::vector<NcclRedOp> ops = enqueue_group<NcclRedOp>(  // destroyed after the end
        n_, [&](int r) { return nccl_op_for(call(r), rank(r).nccl, rank(r).where); },
        [&] { DITTO_NCCL_CHECK(ncclGroupStart(), ranks_[0].where); },
        [&](int r, const NcclRedOp& op) {
          nccl_enqueue(call(r), op, rank(r).nccl, call(r).stream, rank(r).barrier_buf,
                       rank(r).where);
        },
        [&] { DITTO_NCCL_CHECK(ncclGroupEnd(), ranks_[0].where); }, [] { (void)ncclGroupEnd(); });
  }
  for (int r = 0; r < n_; ++r) {
    DeviceGuard g(ranks_[static_cast<std::size_t>(r)].physical);
    mark_end(r, round.calls[static_cast<std::size_t>(r)].stream);
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
void CudaCommunicator::in_gpu_join(const Round& c) {
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
void CudaCommunicator::in_gpu_share(const Round& col, int r) {
  const Call& c0 = col.calls[0];
  const std::size_t elem = dtype_size(c0.dtype);
  const std::int64_t count = c0.count;
  auto call = [&](int q) -> const Call& { return col.calls[static_cast<std::size_t>(q)]; };
  const Rank& k = ranks_[static_cast<std::size_t>(r)];
  const cudaStream_t stream = call(r).stream;
  // A copy of len elements (the comm kernel with one source); onto itself it is no work.
  auto copy = [&](const void* from, void* to, std::int64_t len) {
    if (from == to || len == 0) return;
    DITTO_CUDA_CHECK(launch_comm_reduce(stream, {from}, {to}, len, c0.dtype, ReduceOp::sum),
                     k.where);
  };
  std::vector<const void*> srcs;
  std::vector<void*> dsts;
  std::vector<double> scalars;  // premul_sum: every source rank's scalar
  std::int64_t len = count;
  ReduceOp op = ReduceOp::sum;  // no arithmetic with one source
  switch (c0.kind) {
    case Kind::all_gather:  // rank r's send into block r of every recv
      srcs.push_back(call(r).send);
      for (int q = 0; q < n_; ++q) dsts.push_back(at(call(q).recv, r * count, elem));
      break;
    case Kind::reduce_scatter:  // block r of every send into rank r's recv
      op = c0.op;
      for (int q = 0; q < n_; ++q) {
        srcs.push_back(at(call(q).send, r * count, elem));
        scalars.push_back(call(q).scalar);
      }
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
        for (int q = 0; q < n_; ++q) {
          srcs.push_back(at(call(q).send, lo, elem));
          scalars.push_back(call(q).scalar);
        }
        if (c0.kind == Kind::all_reduce)
          for (int q = 0; q < n_; ++q) dsts.push_back(at(call(q).recv, lo, elem));
        else
          dsts.push_back(at(call(c0.root).recv, lo, elem));
      }
      break;
    }
    // Pure data movement: rank r copies what it sends (or, for scatter, what it receives).
    case Kind::all_to_all:  // block q of r's send into block r of q's recv
      for (int q = 0; q < n_; ++q)
        copy(at(call(r).send, q * count, elem), at(call(q).recv, r * count, elem), count);
      return;
    case Kind::all_to_all_v:  // send_counts[q] of r's send to q, where q expects them from r
      for (int q = 0; q < n_; ++q) {
        const auto qi = static_cast<std::size_t>(q), ri = static_cast<std::size_t>(r);
        copy(at(call(r).send, call(r).send_displs[qi], elem),
             at(call(q).recv, call(q).recv_displs[ri], elem), call(r).send_counts[qi]);
      }
      return;
    case Kind::gather:  // r's send into block r of the root's recv
      copy(call(r).send, at(call(c0.root).recv, r * count, elem), count);
      return;
    case Kind::scatter:  // block r of the root's send into r's recv
      copy(at(call(c0.root).send, r * count, elem), call(r).recv, count);
      return;
    case Kind::barrier:
    case Kind::send:
    case Kind::recv:  // point-to-point never reaches a round (run_p2p)
      return;
  }
  // A copy onto itself is no work (in-place broadcast, all_gather, sum on one rank); avg and
  // premul_sum on one rank are not copies and still write their destination.
  dsts = comm_destinations(srcs, std::move(dsts), op);
  DITTO_CUDA_CHECK(launch_comm_reduce(stream, srcs, dsts, len, c0.dtype, op,
                                      scalars.empty() ? nullptr : scalars.data()),
                   k.where);
}

// NCCL's own collectives, one group over all ranks (fast mode; data movement in bitwise mode).

// Bitwise all_reduce, reduce and reduce_scatter: the block algorithm (Note [CUDA bitwise
// collectives]) with every rank driven from here.
void CudaCommunicator::nccl_bitwise(const Round& round) {
  std::vector<NcclTransport::Rank> local;
  for (int r = 0; r < n_; ++r) {
    const Rank& k = ranks_[static_cast<std::size_t>(r)];
    const Call& c = round.calls[static_cast<std::size_t>(r)];
    local.push_back({r, k.device, k.physical, k.nccl, c.stream, c.send, c.recv, &k.where});
  }
  std::vector<double> scalars;
  for (const Call& c : round.calls) scalars.push_back(c.scalar);
  NcclTransport transport(backend_, n_, std::move(local), round.calls[0].dtype, round.calls[0].op,
                          std::move(scalars));
  bitwise_collective(transport, round.calls[0], n_);
}

std::shared_ptr<CommunicatorImpl> make_cuda_communicator(CudaBackend& backend,
                                                         const std::vector<int>& devices,
                                                         const CommOptions& options) {
  return std::make_shared<CudaCommunicator>(backend, devices, options);
}

}  // namespace ditto::cuda
