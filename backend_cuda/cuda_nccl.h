// Internal: what both NCCL communicators (in-process, cuda_communicator.cpp; one rank per
// process, cuda_communicator_mpi.cpp) share: a scoped NCCL group, one rank's native NCCL call of
// a collective, and NcclTransport, the BlockTransport of the bitwise block algorithm over NCCL
// (cuda_bitwise.h) for the ranks this process drives.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_bitwise.h"
#include "backend_cuda/nccl_check.h"
#include "core/backend_api/collective_call.h"

namespace ditto::cuda {

/// ncclGroupStart now, ncclGroupEnd in end() (or, without throwing, when unwinding: keep only
/// NCCL's own enqueue calls inside, whose failure NCCL records so that ncclGroupEnd launches
/// none of the group; make everything else, premul_sum ops included, before the group opens:
/// enqueue_group, cuda_host_logic.h). `nonblocking`: communicators made with blocking = 0
/// (cuda_communicator_mpi.cpp), whose ncclGroupEnd may return ncclInProgress; end() then polls
/// them (nccl_settle).
class NcclGroup {
 public:
  explicit NcclGroup(std::string where, std::vector<ncclComm_t> nonblocking = {});
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end();

 private:
  std::string where_;
  std::vector<ncclComm_t> nonblocking_;
  bool open_ = true;
};

/// After an NCCL call returned `r` on a non-blocking communicator: ncclInProgress polls
/// ncclCommGetAsyncError(comm) until the call is complete (throwing BackendError naming `call`
/// and `where` on an error, Timeout at `timeout_ms`, 0: none); any other error throws at once.
void nccl_settle(ncclComm_t comm, ncclResult_t r, const char* call, const std::string& where,
                 std::int64_t timeout_ms = 0);

/// The NCCL reduction of one call on one communicator: NCCL's built-in op, or for premul_sum one
/// made by ncclRedOpCreatePreMulSum with the rank's scalar converted to the call's dtype
/// (convert<T>, host-immediate: NCCL reads it before returning), destroyed (ncclRedOpDestroy)
/// when this is: keep it until after the ncclGroupEnd of the call's group.
class NcclRedOp {
 public:
  NcclRedOp() = default;
  NcclRedOp(ReduceOp op, double scalar, DType dtype, ncclComm_t comm, const std::string& where);
  ~NcclRedOp();
  NcclRedOp(NcclRedOp&& o) noexcept;
  NcclRedOp& operator=(NcclRedOp&&) = delete;
  NcclRedOp(const NcclRedOp&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  ncclRedOp_t op_ = ncclSum;
  ncclComm_t comm_ = nullptr;  ///< set when op_ was created here (premul_sum)
};

/// Whether the libnccl this process runs has ncclAlltoAll, ncclGather and ncclScatter (NCCL
/// 2.28+), which nccl_native then calls; else it sends and receives per peer (Note [NCCL newer
/// than the library], cuda_nccl.cpp). Decided on the first call, once per process.
bool nccl_has_rooted_calls();

/// The version of the libnccl this process runs (ncclGetVersion, asked once; 0 when it fails).
int nccl_runtime_version();

/// Throws BackendError naming `where`, before anything is enqueued, when NCCL's own reduction of
/// `c` (fast mode's all_reduce, reduce, reduce_scatter) cannot take its dtype with this build's
/// NCCL headers and the loaded library (fp8 needs 2.24: Note [NCCL fp8], cuda_host_logic.h);
/// other calls pass. nccl_op_for checks it too; the communicators call it before enqueueing, so
/// that the refusal leaves the communicator usable.
void check_nccl_dtype(const detail::CollectiveCall& c, const std::string& where);

/// One rank's NCCL call of `c` on `stream`: ncclAllReduce / ncclReduce / ncclBroadcast /
/// ncclAllGather / ncclReduceScatter with NCCL's own reductions (ncclAvg for avg, a PreMulSum op
/// for premul_sum: returned, keep it until the group ends), ncclAlltoAll, ncclGather,
/// ncclScatter (where the loaded NCCL has them, nccl_has_rooted_calls; else the same as ncclSend /
/// ncclRecv per peer), all_to_all_v as one
/// ncclSend / ncclRecv per peer with a non-zero count, send / recv as ncclSend / ncclRecv; barrier
/// = a one-element all-reduce of `barrier_buf` (one float on the rank's GPU). The caller opens an
/// NcclGroup around the calls of one collective (every rank's, where a process drives several;
/// all_to_all_v's sends and receives need it even for one rank).
[[nodiscard]] NcclRedOp nccl_native(const detail::CollectiveCall& c, ncclComm_t comm,
                                    cudaStream_t stream, float* barrier_buf,
                                    const std::string& where);

/// nccl_native in its two parts, for a group over several ranks (enqueue_group): the
/// reduction of `c` on `comm` (made outside the group; may throw, check_nccl_dtype's refusal
/// too), then the NCCL call with it (inside the group; only NCCL's enqueue, whose failure NCCL
/// records in the group). Data movement gives NCCL fp8 as ncclUint8 (nccl_wire_dtype).
[[nodiscard]] NcclRedOp nccl_op_for(const detail::CollectiveCall& c, ncclComm_t comm,
                                    const std::string& where);
void nccl_enqueue(const detail::CollectiveCall& c, const NcclRedOp& op, ncclComm_t comm,
                  cudaStream_t stream, float* barrier_buf, const std::string& where);

/// The bitwise block algorithm's transport over NCCL, for one collective: send/recv for copies,
/// ncclAllGather for all_gather_recv (both typed nccl_move_dtype: fp8 as ncclUint8, so fp8 runs
/// on any NCCL), launch_comm_reduce for reduce (with every source rank's
/// premul_sum scalar); scratch from the backend's
/// allocator (allocate_on the rank's stream: memory_stats counts it), freed on that stream when
/// the transport is destroyed, after the collective's last use.
class NcclTransport final : public BlockTransport {
 public:
  /// A rank this process drives, with its call.
  struct Rank {
    int rank = 0;      ///< in the communicator
    int device = 0;    ///< logical device (the backend's index)
    int physical = 0;  ///< its GPU
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    const void* send = nullptr;
    void* recv = nullptr;
    const std::string* where = nullptr;  ///< how errors name the rank
  };

  /// `scalars`: premul_sum's scalar of every rank of the communicator (n entries), else empty.
  NcclTransport(CudaBackend& backend, int n, std::vector<Rank> ranks, DType dtype, ReduceOp op,
                std::vector<double> scalars = {});
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  bool local(int rank) const override { return index_[static_cast<std::size_t>(rank)] >= 0; }
  void reserve_scratch(std::int64_t elems) override;
  void begin_phase() override;
  void end_phase() override;
  void copy(const BlockRef& from, const BlockRef& to, std::int64_t len) override;
  void all_gather_recv(int rank, std::int64_t per) override;
  void reduce(int rank, const std::vector<BlockRef>& srcs, const BlockRef& dst,
              std::int64_t len) override;

 private:
  const Rank& rank(int r) const { return ranks_[static_cast<std::size_t>(index_[r])]; }
  void* ptr(const BlockRef& b) const;

  CudaBackend& backend_;
  std::vector<Rank> ranks_;
  std::vector<int> index_;      ///< index_[r]: rank r's entry in ranks_, -1 when not local
  std::vector<void*> scratch_;  ///< per entry of ranks_
  std::size_t scratch_bytes_ = 0;
  const DType dtype_;
  const ReduceOp op_;
  const std::vector<double> scalars_;  ///< per rank, for premul_sum
  const std::size_t elem_;
  std::optional<NcclGroup> group_;  ///< the open phase
};

}  // namespace ditto::cuda
