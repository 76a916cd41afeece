// Internal: the in-process CUDA communicator (Note [CUDA collectives], cuda_communicator.cpp;
// point-to-point in cuda_communicator_p2p.cpp, Note [CUDA point-to-point]). Declared here so that
// its parts can live in more than one file; nothing outside backend_cuda/ includes it (the
// backend makes one through make_cuda_communicator, cuda_backend.h).
#pragma once

#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "core/backend_api/collective_call.h"
#include "core/backend_api/p2p_match.h"
#include "core/backend_api/rendezvous.h"

namespace ditto::cuda {

using Kind = detail::CollectiveKind;

/// One rank's call, as published in its slot, with the stream it was made on.
struct Call : detail::CollectiveCall {
  cudaStream_t stream = nullptr;  ///< the rank's stream (of the rank's device)
};
using Round = detail::Rendezvous<Call>::Round;

/// Element offset `off` of a buffer of `elem`-byte elements.
inline const void* at(const void* p, std::int64_t off, std::size_t elem) {
  return static_cast<const char*>(p) + static_cast<std::size_t>(off) * elem;
}
inline void* at(void* p, std::int64_t off, std::size_t elem) {
  return static_cast<char*>(p) + static_cast<std::size_t>(off) * elem;
}

class CudaCommunicator final : public CommunicatorImpl {
 public:
  CudaCommunicator(CudaBackend& backend, const std::vector<int>& devices,
                   const CommOptions& options);
  ~CudaCommunicator() override { release(); }
  CudaCommunicator(const CudaCommunicator&) = delete;
  CudaCommunicator& operator=(const CudaCommunicator&) = delete;

  void enqueue(int rank, Stream& s, const detail::CollectiveCall& call) override;
  void group_start() override;
  void group_end() override;
  void abort(int rank, const std::string& reason) noexcept override;

 private:
  enum class Transport : std::uint8_t { nccl, in_gpu };

  struct Rank {
    int device = 0;     ///< logical device (cuda:device)
    int physical = 0;   ///< its GPU
    std::string where;  ///< "cuda:3 (GPU 0), rank 3 of 8" for error messages
    ncclComm_t nccl = nullptr;
    cudaEvent_t ready = nullptr;         ///< in-GPU joins: the rank's stream reached the join
    cudaEvent_t last = nullptr;          ///< end of the rank's latest collective
    cudaStream_t last_stream = nullptr;  ///< where `last` was recorded (null: no collective yet)
    float* barrier_buf = nullptr;        ///< NCCL barrier: one float on the rank's GPU
  };

  /// A grouped call of this thread whose outcome group_end() waits for.
  struct Pending {
    std::shared_ptr<Round> round;
    int rank;
  };

  /// The outcome of one posted send or recv (Note [CUDA point-to-point]).
  struct P2PTicket {
    enum class State : std::uint8_t { waiting, done, failed };
    State state = State::waiting;
    std::exception_ptr error;
    Kind kind = Kind::send;
    detail::P2PPair pair;
    std::uint64_t seq = 0;  ///< position on its pair, from 1
    std::chrono::steady_clock::time_point deadline;
  };
  /// A send or recv as the matcher holds it.
  struct P2PCall : Call {
    int rank = 0;
    std::shared_ptr<P2PTicket> ticket;
  };

  /// What a thread inside a group has issued: collectives (already arrived) and point-to-point
  /// calls (posted at group_end).
  struct Group {
    std::vector<Pending> pending;
    std::vector<std::pair<int, Call>> p2p;
  };

  // ---- rendezvous (Note [CUDA collectives]) -----------------------------------------------------
  void resolve_locked(Round& round);
  void await_locked(std::unique_lock<std::mutex>& lk, Round& round, int rank, bool grouped);
  void abort_locked(detail::AbortState::Cause cause, std::string reason);
  /// ncclCommAbort of every rank's communicator (once aborted, no collective is enqueued
  /// again): frees NCCL kernels waiting for ranks that will not come.
  void abort_nccl_locked() noexcept;

  // ---- enqueueing (caller holds mu_) -----------------------------------------------------------
  void run(const Round& round);
  void after_previous(int r, cudaStream_t s);
  void mark_end(int r, cudaStream_t s);
  void in_gpu_join(const Round& round);
  void in_gpu_share(const Round& round, int r);
  void nccl_bitwise(const Round& round);

  // ---- point-to-point (cuda_communicator_p2p.cpp; caller holds mu_) ---------------------------
  std::shared_ptr<P2PTicket> post_p2p_locked(int rank, const Call& c);
  void run_p2p(const P2PCall& send, const P2PCall& recv);
  void await_p2p_locked(std::unique_lock<std::mutex>& lk, P2PTicket& t, bool grouped);

  void release() noexcept;

  /// The backend when a shared_ptr owns it (CudaBackend::keep_alive): alive until after this.
  const std::shared_ptr<CudaBackend> keep_backend_;
  CudaBackend& backend_;
  const CommOptions options_;
  const int n_;
  Transport transport_ = Transport::in_gpu;
  std::vector<Rank> ranks_;
  cudaEvent_t gate_ = nullptr;  ///< in-GPU joins: on rank 0's GPU

  std::mutex mu_;
  std::condition_variable cv_;
  detail::Rendezvous<Call> rv_;              ///< matching, deadlines, abort state (guarded by mu_)
  std::map<std::thread::id, Group> groups_;  ///< threads inside a group
  detail::P2PMatcher<P2PCall> p2p_;          ///< posted sends and recvs (guarded by mu_)
};

}  // namespace ditto::cuda
