// Point-to-point calls (Communicator::send / recv) of the in-process CUDA communicator
// (cuda_communicator.h).
//
// Note [CUDA point-to-point]
// send and recv are matched on the host, per ordered pair of ranks by position, with
// core/backend_api/p2p_match.h (Note [Point-to-point matching]), like the simulator: nothing is
// enqueued before both sides of a pair have been posted, so no GPU ever waits for a send or recv
// that never comes (raw NCCL would hang the stream). The caller that completes a pair checks it
// (same count and dtype, else both sides fail with the same InvalidArgument and the communicator
// stays usable) and enqueues the transfer, under the communicator's mutex:
//  - NCCL transport: the sender's ncclSend and the receiver's ncclRecv, on their streams, in one
//    ncclGroupStart/End (both comms are driven from this thread, so NCCL needs the group);
//  - in-GPU transport: the receiver's stream waits for the sender's (an event), the comm kernel
//    copies the bytes on the receiver's stream (peer access), and the sender's stream waits for
//    the copy's end (NCCL's send, too, completes only once the data has left the buffer).
// Each pair is enqueued as one unit, in match order on every stream, so the earliest unfinished
// pair always has both ends at the head of their streams: any set of matched pairs completes (a
// ring, an exchange in both directions, a send to itself), whatever order the calls were made
// in. A transfer waits for the end of its ranks' previous collective or transfer (as collectives
// do), and the next one waits for it.
// Posting: outside a group a call is posted at once and returns when its pair is enqueued; inside
// group_start()/group_end() the calls are posted together at group_end, which returns when all
// are enqueued (after the group's collectives). So one thread driving several ranks must group
// its sends and recvs (as with NCCL), and so must SPMD threads whose calls form a cycle (a ring in
// which every rank sends first times out without a group, where NCCL would hang; with a group, or
// with even ranks sending first and odd ranks receiving first, it completes). A call whose
// partner is not posted within CommOptions::timeout_ms fails with ditto::Timeout
// (p2p_timeout_reason: both ranks named) and aborts the communicator; an abort (a failed rank,
// another timeout) fails the waiting calls at once, naming the cause.
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_cuda/cuda_communicator.h"
#include "backend_cuda/cuda_nccl.h"
#include "core/base/error.h"

namespace ditto::cuda {

using Cause = detail::AbortState::Cause;

std::shared_ptr<CudaCommunicator::P2PTicket> CudaCommunicator::post_p2p_locked(int rank,
                                                                               const Call& c) {
  auto t = std::make_shared<P2PTicket>();
  t->kind = c.kind;
  t->deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  P2PCall pc;
  static_cast<Call&>(pc) = c;
  pc.rank = rank;
  pc.ticket = t;
  auto posted = p2p_.post(rank, std::move(pc));
  t->pair = posted.pair;
  t->seq = posted.seq;
  if (!posted.match) return t;
  auto& m = *posted.match;
  auto finish = [&](P2PTicket::State state, std::exception_ptr error) {
    for (P2PTicket* side : {m.send.ticket.get(), m.recv.ticket.get()}) {
      side->state = state;
      side->error = error;
    }
  };
  if (!m.mismatch.empty()) {
    finish(P2PTicket::State::failed, std::make_exception_ptr(InvalidArgument(m.mismatch)));
  } else {
    try {
      run_p2p(m.send, m.recv);
      finish(P2PTicket::State::done, nullptr);
    } catch (const std::exception& e) {
      // Part of the transfer may be on the streams: abort (like ncclCommAbort).
      finish(P2PTicket::State::failed, std::current_exception());
      abort_locked(Cause::error, detail::cat(detail::p2p_label(m.pair, m.seq), ": ", e.what()));
    }
  }
  cv_.notify_all();
  return t;
}

void CudaCommunicator::await_p2p_locked(std::unique_lock<std::mutex>& lk, P2PTicket& t,
                                        bool grouped) {
  const detail::AbortState& state = rv_.abort_state();
  while (t.state == P2PTicket::State::waiting && !state.aborted()) {
    if (cv_.wait_until(lk, t.deadline) == std::cv_status::timeout &&
        t.state == P2PTicket::State::waiting && !state.aborted()) {
      std::string msg = detail::p2p_timeout_reason(t.kind, t.pair, t.seq, options_.timeout_ms);
      if (!grouped)
        msg += "; on cuda a send or recv waits until its partner is posted, so one thread "
               "driving several ranks must issue them inside group_start()/group_end()";
      abort_locked(Cause::timeout, msg);
      throw Timeout(msg);
    }
  }
  if (t.state == P2PTicket::State::done) return;
  if (t.state == P2PTicket::State::failed) std::rethrow_exception(t.error);
  std::rethrow_exception(state.error_for(detail::p2p_call_label(t.kind, t.pair, t.seq)));
}

void CudaCommunicator::run_p2p(const P2PCall& send, const P2PCall& recv) {
  if (send.count == 0) return;  // no data, no work
  const int a = send.rank, b = recv.rank;
  const Rank& ka = ranks_[static_cast<std::size_t>(a)];
  const Rank& kb = ranks_[static_cast<std::size_t>(b)];
  {
    DeviceGuard g(ka.physical);
    after_previous(a, send.stream);
  }
  {
    DeviceGuard g(kb.physical);
    after_previous(b, recv.stream);
  }
  if (transport_ == Transport::nccl) {
    NcclGroup group(ka.where);
    (void)nccl_native(send, ka.nccl, send.stream, ka.barrier_buf, ka.where);
    (void)nccl_native(recv, kb.nccl, recv.stream, kb.barrier_buf, kb.where);
    group.end();
  } else if (send.stream == recv.stream) {  // a send to itself on one stream: stream order
    DeviceGuard g(kb.physical);
    if (send.send != recv.recv)
      DITTO_CUDA_CHECK(launch_comm_reduce(recv.stream, {send.send}, {recv.recv}, send.count,
                                          send.dtype, ReduceOp::sum),
                       kb.where);
  } else {
    cudaEvent_t sent = nullptr, copied = nullptr;
    try {
      {
        DeviceGuard g(ka.physical);
        DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), ka.where);
        DITTO_CUDA_CHECK(cudaEventRecord(sent, send.stream), ka.where);
      }
      {
        DeviceGuard g(kb.physical);
        DITTO_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), kb.where);
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(recv.stream, sent, 0), kb.where);
        DITTO_CUDA_CHECK(launch_comm_reduce(recv.stream, {send.send}, {recv.recv}, send.count,
                                            send.dtype, ReduceOp::sum),
                         kb.where);
        DITTO_CUDA_CHECK(cudaEventRecord(copied, recv.stream), kb.where);
      }
      {
        DeviceGuard g(ka.physical);
        DITTO_CUDA_CHECK(cudaStreamWaitEvent(send.stream, copied, 0), ka.where);
      }
    } catch (...) {
      if (sent) (void)cudaEventDestroy(sent);
      if (copied) (void)cudaEventDestroy(copied);
      throw;
    }
    // Destroying a recorded event is fine: its resources go once the streams are past it.
    (void)cudaEventDestroy(sent);
    (void)cudaEventDestroy(copied);
  }
  {
    DeviceGuard g(ka.physical);
    mark_end(a, send.stream);
  }
  {
    DeviceGuard g(kb.physical);
    mark_end(b, recv.stream);
  }
}

}  // namespace ditto::cuda
