// Communicator: a group of ranks, one device each, with NCCL's collectives.
//
// Like NCCL, each rank has its own handle (Communicator::init_all mirrors ncclCommInitAll) and
// every collective is enqueued on the current stream of the rank's device and returns at once.
// Two ways to drive it:
//  - single-controller: one host thread calls the collective on every rank's handle in turn (or
//    the free functions below that take one tensor per rank), then synchronises;
//  - SPMD: one host thread per rank, each calling the collective on its own handle (as DDP does);
//    the ranks may also be processes under mpirun, one handle each (init_rank, ncclCommInitRank).
// As with NCCL, a backend may hold a per-rank call until every rank has called (cuda does, see
// Note [CUDA collectives]), so one thread driving several ranks issues their calls as a group:
// the single-controller forms do, or group_start() / group_end() around a loop over the handles.
// All ranks must call the same collectives in the same order with matching op, count, dtype and
// root; the backends check this and fail every rank with an error when they differ. A rank
// that never arrives makes the others fail with ditto::Timeout after CommOptions::timeout_ms.
// Two communicators over the same devices used at once (from different threads) need their own
// streams (StreamGuard): on one device's default stream, a rank's collective of one queues
// behind the other's, which waits for ranks that wait in turn, a deadlock that ends in that
// Timeout, as two NCCL communicators sharing streams would hang.
//
// Errors: InvalidArgument (before enqueueing) for tensors on the wrong device, wrong dtype or
// sizes, or made on an instance of the backend that init_backend has since re-initialised (as
// every op refuses them: only their copies run), roots and peers out of range, and for every
// call (stream() too) on a handle whose backend was re-initialised since it was made
// (init_backend of the same name: its devices and streams are another instance's; make new
// handles); the single-controller forms refuse such handles before any rank's work is enqueued.
// A per-rank call refused for its arguments (a communicator of several ranks, backend live) also
// aborts the communicator (abort()) before throwing, so the other ranks fail at once with a
// PeerFailure naming this rank and the refusal instead of waiting for its call until their
// timeout (NCCL would leave them hanging); the handles stay failed. The single-controller forms
// check every rank before issuing any, so their refusals abort nothing. Errors raised while
// running are rethrown by the stream's synchronize() (sim), or by the call itself or group_end()
// (cuda, which matches the ranks' calls on the host before enqueueing anything).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/runtime/collective_types.h"
#include "core/runtime/stream.h"
#include "core/runtime/tensor.h"

namespace ditto {

/// ncclRedOpCreatePreMulSum with a host-immediate scalar (ncclScalarHostImmediate): the result is
/// sum over ranks r of scalar_r * x_r, each rank passing its own scalar (they may differ, e.g.
/// 1 / world_size for DDP's gradient averaging or per-rank weights). Floating dtypes multiply in
/// the accumulator (f32 for f32 / f16 / bf16 / fp8, f64 for f64); integer dtypes need an integral
/// scalar representable in the dtype (else InvalidArgument) and multiply with wrap-around.
struct PreMulSum {
  double scalar = 1.0;
};

class Communicator;
namespace detail {
struct CollectiveCall;  // core/backend_api/collective_call.h (internal: backends only)
/// Throws InvalidArgument "<where>: ..." when the backend instance `c` was made on is no longer
/// the live one (Note [Communicators of a replaced backend], communicator.cpp).
void check_comm_live(const Communicator& c, const char* where);
}  // namespace detail

/// Backend-side shared state of one communicator (all ranks). Core validates arguments and
/// records each call as a detail::CollectiveCall (kind, pointers, count, dtype, op, root); the
/// backend implements the data movement behind ONE entry point, so a new collective is an enum
/// value, its validation in core and a case in each backend's executor (as NCCL funnels every
/// public call into one ncclInfo and one enqueue path).
class CommunicatorImpl {
 public:
  virtual ~CommunicatorImpl() = default;

  /// Rank `rank`'s call of the next collective, enqueued on `stream` (a stream of that rank's
  /// device). Arguments are valid (core checked them); for all_gather recv holds size() * count
  /// elements (rank r's send lands at r * count), for reduce_scatter send does (rank r receives
  /// the reduction of block r); recv is null off the root for reduce, send off the root for
  /// broadcast. all_to_all: send and recv hold size() * count elements (block q of send goes to
  /// rank q, block r of recv comes from rank r); all_to_all_v: count is 0 and the call's
  /// send/recv counts and displacements give the blocks; gather: the root's recv holds
  /// size() * count (null off the root); scatter: the root's send does (null off the root).
  /// op premul_sum comes with each rank's call.scalar. The ranks' calls are matched by their
  /// ordinal on this communicator (core/backend_api/rendezvous.h), except send / recv
  /// (detail::is_p2p, with call.peer), which are matched per pair of ranks by position
  /// (core/backend_api/p2p_match.h).
  virtual void enqueue(int rank, Stream& stream, const detail::CollectiveCall& call) = 0;

  /// Group hooks (ncclGroupStart / ncclGroupEnd). Core calls group_start() before this thread's
  /// first per-rank call inside a group (ditto::group_start(), and the single-controller forms
  /// below, which group their loop over the ranks) and group_end() when the thread's outermost
  /// group ends. A backend whose per-rank call blocks until every rank has arrived (cuda) must
  /// not block between the two: it collects the calls and may block in group_end(), which
  /// throws the first error of the grouped calls. Default: nothing (the simulator never blocks).
  virtual void group_start() {}
  virtual void group_end() {}

  /// ncclCommAbort on behalf of `rank`, which failed for `reason`: the communicator is marked
  /// failed, so the ranks waiting in a collective for `rank`, and every later call, fail at once
  /// (BackendError naming the collective, then "rank <rank> failed: <reason>") instead of at the
  /// timeout. The first abort's reason is kept. Must not throw. Default: nothing (the other ranks
  /// then fail by timeout).
  virtual void abort(int rank, const std::string& reason) noexcept {
    (void)rank;
    (void)reason;
  }
};

class Communicator {
 public:
  /// One handle per device, rank i on devices[i] (ncclCommInitAll). Devices must be non-empty,
  /// distinct, of one non-cpu backend, and in range. Throws InvalidArgument otherwise.
  static std::vector<Communicator> init_all(const std::vector<Device>& devices,
                                            const CommOptions& options = {});

  /// This process's handle of a communicator whose ranks are the processes of the job, one rank
  /// per process (ncclCommInitRank; the processes come from mpirun,
  /// core/distributed/distributed.h). Collective: every process calls it, with its own rank and
  /// local device, in the same order as its other init_rank calls. `local_device` is this rank's
  /// device, a device of this process (sim: e.g. its one virtual device sim:0); world_size must be
  /// dist::world_size() and rank dist::rank(). Data moves over MPI (sim; Note [Sim collectives over
  /// MPI]) or over NCCL with the unique id sent by MPI (cuda). Collectives, call matching, timeouts
  /// and abort behave as with init_all; the single-controller forms (one thread for all ranks) do
  /// not apply. devices() has world_size entries: devices()[rank()] == device() is the local
  /// device, the others name the device each other rank uses in its own process, for messages only
  /// (not addressable here; they may print alike, e.g. every rank's "sim:0"). Throws BackendError
  /// when dist::init() was not called (or MPI support is not built) or the backend has no
  /// multi-process transport; InvalidArgument for a cpu or out-of-range device, or a world_size /
  /// rank other than the process group's; Timeout when a process does not join within
  /// options.timeout_ms.
  static Communicator init_rank(const Device& local_device, int world_size, int rank,
                                const CommOptions& options = {});

  /// True for a handle from init_rank (the other ranks are other processes).
  bool multiprocess() const { return multiprocess_; }

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(devices_->size()); }
  const Device& device() const { return (*devices_)[static_cast<std::size_t>(rank_)]; }
  const std::vector<Device>& devices() const { return *devices_; }
  const CommOptions& options() const { return options_; }

  // Every collective takes tensors of any DType (core/runtime/dtype.h) and every op on every
  // dtype (NCCL refuses none of them; avg on integers truncates, Note [Reductions over ranks]).
  // send and recv of one call have the same dtype; all ranks pass the same dtype and count.

  /// ncclAllReduce: recv = op over ranks of send (same numel and dtype; recv may be send).
  void all_reduce(const Tensor& send, Tensor& recv, ReduceOp op = ReduceOp::sum);
  /// In-place form: tensor = op over ranks of tensor.
  void all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::sum);
  /// all_reduce with ncclRedOpCreatePreMulSum(scalar): recv = sum over ranks of scalar_r * send_r.
  void all_reduce(const Tensor& send, Tensor& recv, PreMulSum op);
  /// ncclReduce: on `root`, recv = op over ranks of send; recv is ignored (may be undefined) on
  /// other ranks.
  void reduce(const Tensor& send, Tensor& recv, ReduceOp op, int root);
  void reduce(const Tensor& send, Tensor& recv, PreMulSum op, int root);
  /// ncclBroadcast: recv = root's send on every rank (send ignored off root; may be undefined).
  void broadcast(const Tensor& send, Tensor& recv, int root);
  /// In-place broadcast of `tensor` from root.
  void broadcast(Tensor& tensor, int root);
  /// ncclAllGather: recv ([size * n] elements, e.g. shape [size, ...] or [size * d0, ...]) gets
  /// every rank's send (n elements) in rank order.
  void all_gather(const Tensor& send, Tensor& recv);
  /// ncclReduceScatter: send has size * n elements; recv (n elements) = op over ranks of block
  /// rank() of send.
  void reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op = ReduceOp::sum);
  void reduce_scatter(const Tensor& send, Tensor& recv, PreMulSum op);
  /// Returns (on the stream) once every rank has reached the barrier.
  void barrier();

  /// ncclAlltoAll (torch.distributed.all_to_all_single with equal splits): send and recv hold
  /// size() * n elements; block q (elements [q * n, (q + 1) * n)) of send goes to rank q, where
  /// it lands in block rank() of recv. recv must not overlap send (NCCL has no in-place form).
  void all_to_all(const Tensor& send, Tensor& recv);
  /// MPI_Alltoallv (torch's all_to_all_single with input/output split sizes): rank() sends
  /// send_counts[q] elements starting at element send_displs[q] of send to rank q, and receives
  /// recv_counts[q] elements from rank q at element recv_displs[q] of recv. Each vector has size()
  /// entries, counts >= 0, every block inside its tensor; rank r's send_counts[q] must equal
  /// rank q's recv_counts[r] (checked across ranks when they meet: every rank fails with an
  /// InvalidArgument naming both ranks and the two counts). Blocks of recv must not overlap each
  /// other or send.
  void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts,
                    const std::vector<std::int64_t>& send_displs, Tensor& recv,
                    const std::vector<std::int64_t>& recv_counts,
                    const std::vector<std::int64_t>& recv_displs);
  /// all_to_all_v with packed blocks: displacements are the exclusive prefix sums of the counts
  /// (torch's split sizes), and send / recv must hold exactly the sums of the counts.
  void all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts, Tensor& recv,
                    const std::vector<std::int64_t>& recv_counts);
  /// ncclGather (torch.distributed.gather): the root's recv (size() * n elements) gets every
  /// rank's send (n elements) in rank order; recv is ignored (may be undefined) off the root.
  void gather(const Tensor& send, Tensor& recv, int root);
  /// ncclScatter (torch.distributed.scatter): rank q's recv (n elements) gets block q of the
  /// root's send (size() * n elements); send is ignored (may be undefined) off the root.
  void scatter(const Tensor& send, Tensor& recv, int root);

  /// ncclSend: sends `tensor` (all its elements) to rank `peer` (0 <= peer < size(); itself only
  /// inside a group holding the matching recv: outside one, InvalidArgument, where NCCL would wait
  /// forever for a recv issued after the send), matched with peer's recv from rank() of the same
  /// position: the k-th send from a to b pairs with the k-th recv on b from a, and they must have
  /// the same dtype and count (else both fail with an InvalidArgument naming the two ranks, the
  /// counts and dtypes). A send whose recv is not posted within CommOptions::timeout_ms fails with
  /// ditto::Timeout naming both ranks (and so does the recv of a send that never comes).
  /// Point-to-point calls do not take part in the ordinal matching of collectives. Several sends
  /// and recvs between group_start() and group_end() run together (a ring exchange, all_to_all by
  /// hand, a pipeline stage's forward and backward), as with ncclGroupStart / ncclGroupEnd; outside
  /// a group each call is its own group. On backends whose calls wait for their peers (cuda), one
  /// thread driving several ranks must group them. The calls of a group run in no defined order,
  /// so within one group (up to this thread's outermost group_end) a rank's recv must not overlap
  /// the bytes of another send or recv of that rank on this communicator, nor a send those of a
  /// recv: InvalidArgument naming both (an in-place ring shift, send(t, r + 1) and recv(t, r - 1)
  /// in one group, raced; NCCL leaves it undefined). Sends of one buffer to several peers, and
  /// calls in different groups, are fine (Note [Overlapping point-to-point buffers in a group]).
  void send(const Tensor& tensor, int peer);
  /// ncclRecv: receives into `tensor` from rank `peer` (see send()).
  void recv(Tensor& tensor, int peer);

  /// The stream collectives of this rank are enqueued on (current stream of device()). Throws
  /// InvalidArgument when the backend this handle was made on was re-initialised since.
  Stream& stream() const;

  /// ncclCommAbort, called by this rank when it fails (e.g. throws mid-step, as
  /// DistributedDataParallel does for its rank): every rank's collective that waits for this
  /// rank, is queued, or is called later fails at once with BackendError
  /// "<collective> (collective #n on this communicator): rank <rank()> failed: <reason>" rather
  /// than a Timeout after CommOptions::timeout_ms. The communicator stays failed (make a new one
  /// to go on). The first abort's reason is kept; never throws. A per-rank call refused for its
  /// arguments calls it itself (see Errors above).
  void abort(const std::string& reason) const noexcept;

 private:
  Communicator(std::shared_ptr<Backend> backend, std::uint64_t generation,
               std::shared_ptr<CommunicatorImpl> impl,
               std::shared_ptr<const std::vector<Device>> devices, int rank, CommOptions options)
      : backend_(std::move(backend)),
        generation_(generation),
        impl_(std::move(impl)),
        devices_(std::move(devices)),
        rank_(rank),
        options_(options) {}
  friend void detail::check_comm_live(const Communicator& c, const char* where);
  void check_tensor(const char* call, const char* arg, const Tensor& t) const;
  /// Inside a group of this thread: tells the backend (CommunicatorImpl::group_start) once.
  void join_group() const;
  /// Joins the thread's group, then hands the call to the backend (CommunicatorImpl::enqueue).
  void submit(const detail::CollectiveCall& call);

  /// The backend instance the handle was made on, held (as a Buffer holds its own) so that it
  /// stays the one compared with the live instance, and the registry's generation after it was
  /// looked up (Note [Communicators of a replaced backend]).
  std::shared_ptr<Backend> backend_;
  std::uint64_t generation_ = 0;
  std::shared_ptr<CommunicatorImpl> impl_;
  std::shared_ptr<const std::vector<Device>> devices_;
  int rank_ = 0;
  CommOptions options_;
  bool multiprocess_ = false;
};

/// ncclGroupStart: per-rank collectives this thread issues until the matching group_end() are
/// collected and launched together, so one thread may drive several ranks through their handles
/// (`for r: comms[r].all_reduce(...)`) on backends whose per-rank call otherwise waits for the
/// other ranks (cuda; the simulator needs no group but accepts one). Groups nest; only the
/// outermost group_end() launches. Inside a group, do not wait on the ranks' streams.
void group_start();
/// ncclGroupEnd: ends this thread's group; at the outermost level returns once every grouped
/// collective is enqueued on its rank's stream (blocking until the other ranks of those
/// collectives arrived, Timeout after CommOptions::timeout_ms) and rethrows the first error of
/// the grouped calls (e.g. InvalidArgument for ranks whose calls do not match). Throws
/// InvalidArgument without a matching group_start().
void group_end();

/// Single-controller forms: one tensor per rank, all from this thread, issued as one group
/// (group_start / group_end); each rank's work is enqueued on its device's current stream.
/// `comms` are one communicator's handles in rank order (as init_all returns them); sizes of the
/// vectors must equal comms.size(). Every rank's arguments are checked before any rank's work is
/// enqueued (InvalidArgument), the handles first (one communicator's, rank order, its backend not
/// re-initialised since init_all).
void all_reduce(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                std::vector<Tensor>& recv, ReduceOp op = ReduceOp::sum);
void all_reduce(std::vector<Communicator>& comms, std::vector<Tensor>& tensors,
                ReduceOp op = ReduceOp::sum);
void broadcast(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, int root);
void all_gather(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                std::vector<Tensor>& recv);
void reduce_scatter(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                    std::vector<Tensor>& recv, ReduceOp op = ReduceOp::sum);
void reduce(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
            std::vector<Tensor>& recv, ReduceOp op, int root);
/// premul_sum forms: scalars[r] is rank r's scalar (comms.size() entries).
void all_reduce(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                std::vector<Tensor>& recv, const std::vector<PreMulSum>& ops);
void reduce_scatter(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                    std::vector<Tensor>& recv, const std::vector<PreMulSum>& ops);
void all_to_all(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                std::vector<Tensor>& recv);
/// send_counts[r] / recv_counts[r]: rank r's count vectors (packed blocks, as the per-rank form).
void all_to_all_v(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                  const std::vector<std::vector<std::int64_t>>& send_counts,
                  std::vector<Tensor>& recv,
                  const std::vector<std::vector<std::int64_t>>& recv_counts);
void gather(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
            std::vector<Tensor>& recv, int root);
void scatter(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
             std::vector<Tensor>& recv, int root);
/// Synchronise every rank's stream (rethrows the first error). Throws InvalidArgument, waiting for
/// none, when the handles' backend was re-initialised since init_all.
void synchronize(std::vector<Communicator>& comms);

}  // namespace ditto
