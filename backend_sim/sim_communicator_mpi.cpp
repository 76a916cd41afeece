// The simulator's communicator with one rank per process (Communicator::init_rank under mpirun):
// each process holds its rank's virtual device and the ranks exchange data through MPI.
// Compiled only with DITTO_WITH_MPI.
//
// Note [Sim collectives over MPI]
// Each rank's call enqueues ONE task on the given stream (as in Note [Sim collectives]); the task,
// on the stream's worker thread,
//   1. exchanges the ranks' calls and checks that they match (MpiLink::start: the in-process
//      simulator's mismatch error, thrown by every rank; Timeout naming the ranks whose call did
//      not come, Note [Timeouts over MPI]); the calls carry dtype, op and each rank's premul_sum
//      scalar, and all_to_all_v's count vectors follow in a second exchange so that every rank
//      cross-checks them (find_call_mismatch);
//   2. moves the data with nonblocking MPI calls, polled until done or the deadline, in elements
//      of mpi_type(dtype) (f16 / bf16 / fp8 move as unsigned integers of their size):
//      native reductions, in fast mode for the dtypes MPI computes (f32, f64, the integers) and
//      ops sum, prod, min, max, and avg on f32 / f64 (MPI's own reductions, in MPI's order and with
//      its NaN handling for min and max; avg = sum / N, as ncclAvg):
//        all_reduce MPI_Iallreduce, reduce MPI_Ireduce, reduce_scatter MPI_Ireduce_scatter_block;
//      tree reductions, for bitwise mode and for everything else (f16 / bf16 / fp8, premul_sum
//      with every rank's scalar, avg on integers: NCCL's truncating FuncSumPostDiv): MPI only
//      moves data; the arithmetic is sim::reduce_over_ranks (Note [Reductions over ranks]) in the
//      communicator's mode, so the bits are those of the in-process simulator:
//        all_reduce      the count is cut into N blocks of per = ceil(count / N) elements;
//                        (1) MPI_Ialltoallv: rank r receives block r of every rank's send, in
//                        rank order; (2) it reduces them into block r of its recv;
//                        (3) MPI_Iallgatherv in place fills the other blocks of every recv.
//                        Per rank each phase moves (N-1)/N of the buffer each way: a ring's
//                        traffic (as NCCL's ring all-reduce), not a gather of everything;
//        reduce          (1), (2) into a scratch block, then MPI_Igatherv of the blocks to root;
//        reduce_scatter  (1) with blocks of `count` (block q of every send goes to rank q) and
//                        (2) straight into recv;
//      either mode: broadcast MPI_Ibcast, all_gather MPI_Iallgather, all_to_all MPI_Ialltoall,
//      all_to_all_v MPI_Ialltoallv, gather MPI_Igather, scatter MPI_Iscatter (in place on the
//      root as MPI_IN_PLACE), barrier MPI_Ibarrier;
//   send / recv are not collectives: a rank's calls between group_start and group_end (of the
//      thread that issues them) form one batch, enqueued as one task at group_end on the stream
//      of the batch's first call (outside a group, a batch of one); the task matches the batch with
//      the peers and moves its data (MpiLink::match_p2p / move_p2p, Note [Point-to-point over
//      MPI]): a mismatched send and its recv both fail with InvalidArgument, a call whose partner
//      does not come fails with Timeout naming both ranks.
// A rank's collectives must run one at a time (one stream per rank, or ordered streams); a
// collective that starts while the rank's previous one still runs fails with BackendError saying
// so (the other ranks then time out). MPI counts are ints: a collective moving more than 2^31 - 1
// elements in one message fails on every rank with InvalidArgument (after the calls matched, so
// the ranks stay in step).
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_comm_kernels.h"
#include "core/backend_api/mpi_transport.h"

namespace ditto::sim {
namespace {

using detail::CollectiveCall;
using Kind = detail::CollectiveKind;
using detail::mpi::mpi_type;
using detail::mpi::MpiLink;
using detail::mpi::P2POp;

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::premul_sum: break;
  }
  return MPI_OP_NULL;
}

/// Whether a fast-mode reduction runs as MPI's own (Note [Sim collectives over MPI]).
bool native_reduction(const CollectiveCall& c) {
  if (!detail::mpi::mpi_reduces(c.dtype) || c.op == ReduceOp::premul_sum) return false;
  return c.op != ReduceOp::avg || c.dtype == DType::f32 || c.dtype == DType::f64;
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

/// The elements one MPI message of the collective moves at most (checked against INT_MAX).
std::int64_t largest_message(const CollectiveCall& c, int n) {
  switch (c.kind) {
    case Kind::all_gather:
    case Kind::reduce_scatter:
    case Kind::all_to_all:
    case Kind::gather:
    case Kind::scatter: return c.count * n;
    case Kind::all_to_all_v: {
      std::int64_t most = 0;
      for (const auto* v : {&c.send_counts, &c.send_displs, &c.recv_counts, &c.recv_displs})
        for (std::int64_t x : *v) most = std::max(most, x);
      return most;
    }
    default: return c.count;
  }
}

std::vector<int> as_ints(const std::vector<std::int64_t>& v) {
  return std::vector<int>(v.begin(), v.end());  // each <= INT_MAX (largest_message)
}

class SimMpiCommunicator final : public CommunicatorImpl,
                                 public std::enable_shared_from_this<SimMpiCommunicator> {
 public:
  SimMpiCommunicator(MPI_Comm comm, const CommOptions& options)
      : link_(comm, options, "sim communicator") {}

  void enqueue(int, Stream& s, const CollectiveCall& call) override {
    SimStream& ss = as_sim(s, detail::collective_name(call.kind));
    link_.throw_if_aborted(call.kind);
    if (detail::is_p2p(call.kind)) {
      P2POp op;
      op.kind = call.kind;
      op.peer = call.peer;
      op.count = call.count;
      op.dtype = call.dtype;
      op.data = call.kind == Kind::send ? const_cast<void*>(call.send) : call.recv;
      {
        std::lock_guard lk(groups_mu_);
        auto it = groups_.find(std::this_thread::get_id());
        if (it != groups_.end()) {  // inside this thread's group: joins its batch
          if (!it->second.stream) it->second.stream = &ss;
          it->second.ops.push_back(std::move(op));
          return;
        }
      }
      enqueue_batch(ss, {std::move(op)});
      return;
    }
    // Note [MPI work at finalize]: dist::finalize waits for it.
    ss.enqueue([self = shared_from_this(), call,
                work = std::make_shared<detail::mpi::QueuedWork>()] { self->run(call); });
  }
  void group_start() override {
    std::lock_guard lk(groups_mu_);
    groups_[std::this_thread::get_id()];
  }
  void group_end() override {
    Batch batch;
    {
      std::lock_guard lk(groups_mu_);
      auto it = groups_.find(std::this_thread::get_id());
      if (it == groups_.end()) return;
      batch = std::move(it->second);
      groups_.erase(it);
    }
    if (!batch.ops.empty()) enqueue_batch(*batch.stream, std::move(batch.ops));
  }
  void abort(int, const std::string& reason) noexcept override { link_.abort_by_rank(reason); }

 private:
  /// A thread's point-to-point calls between group_start and group_end.
  struct Batch {
    SimStream* stream = nullptr;
    std::vector<P2POp> ops;
  };

  /// Marks the rank's one collective (or batch) in flight; BackendError when one already is.
  struct InFlight {
    std::atomic<bool>& flag;
    InFlight(std::atomic<bool>& f, Kind kind, const MpiLink& link) : flag(f) {
      if (flag.exchange(true))
        throw BackendError(detail::cat(
            detail::collective_name(kind), ": ", link.where(),
            " started a collective while its previous one was still running (on another "
            "stream); a rank's collectives must run one at a time"));
    }
    ~InFlight() { flag = false; }
  };

  void enqueue_batch(SimStream& ss, std::vector<P2POp> ops) {
    auto shared = std::make_shared<std::vector<P2POp>>(std::move(ops));
    ss.enqueue([self = shared_from_this(), shared,
                work = std::make_shared<detail::mpi::QueuedWork>()] { self->run_p2p(shared); });
  }

  // A batch of send / recv calls (Note [Point-to-point over MPI]).
  void run_p2p(const std::shared_ptr<std::vector<P2POp>>& ops) {
    InFlight guard(in_flight_, ops->front().kind, link_);
    link_.match_p2p(*ops);
    link_.move_p2p(*ops, ops);
    for (const P2POp& op : *ops)
      if (!op.mismatch.empty()) throw InvalidArgument(op.mismatch);
  }

  // The task body of a collective (Note [Sim collectives over MPI]).
  void run(const CollectiveCall& call) {
    InFlight guard(in_flight_, call.kind, link_);
    std::uint64_t seq = 0;
    const std::vector<CollectiveCall> calls = link_.start(call, seq);  // throws on mismatch etc.
    const std::int64_t moved = largest_message(call, link_.size());
    DITTO_CHECK(moved <= INT_MAX, MpiLink::label(call.kind, seq), ": count: at most ", INT_MAX,
                " elements move in one MPI message, got ", moved,
                " (split the tensor into several collectives)");
    if (call.kind != Kind::barrier && call.kind != Kind::all_to_all_v && call.count == 0) return;
    work(call, calls, seq);
  }

  void work(const CollectiveCall& c, const std::vector<CollectiveCall>& calls, std::uint64_t seq) {
    const MPI_Comm comm = link_.comm();
    const int n = link_.size(), r = link_.rank();
    const std::string& where = link_.where();
    const MPI_Datatype type = mpi_type(c.dtype);
    const int count = static_cast<int>(c.count);
    const std::size_t esize = dtype_size(c.dtype);
    const std::size_t bytes = static_cast<std::size_t>(c.count) * esize;
    const bool bitwise = link_.options().determinism == Determinism::bitwise;
    const char* send = static_cast<const char*>(c.send);
    char* recv = static_cast<char*>(c.recv);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    auto wait = [&](std::shared_ptr<void> keep = {}) {
      link_.wait(reqs, c.kind, seq, std::move(keep));
    };
    // A copy of `len` bytes of send when recv's `recv_len` bytes overlap them (MPI forbids it).
    auto unaliased = [&](const char* in, std::size_t len, std::size_t recv_len,
                         std::shared_ptr<std::vector<char>>& copy) -> const char* {
      if (!overlaps(in, len, recv, recv_len)) return in;
      copy = std::make_shared<std::vector<char>>(in, in + len);
      return copy->data();
    };
    auto divide_avg = [&](char* p, std::int64_t len) {
      if (c.op != ReduceOp::avg) return;
      if (c.dtype == DType::f32)
        for (float* f = reinterpret_cast<float*>(p); f < reinterpret_cast<float*>(p) + len; ++f)
          *f = *f / static_cast<float>(n);
      else if (c.dtype == DType::f64)
        for (double* f = reinterpret_cast<double*>(p); f < reinterpret_cast<double*>(p) + len; ++f)
          *f = *f / static_cast<double>(n);
    };
    const bool native = !bitwise && native_reduction(c);
    std::shared_ptr<std::vector<char>> copy;

    switch (c.kind) {
      case Kind::all_reduce:
      case Kind::reduce:
        if (native) {
          const bool root = c.kind == Kind::all_reduce || r == c.root;
          const void* in = root && send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
          if (c.kind == Kind::all_reduce)
            DITTO_MPI_CHECK(MPI_Iallreduce(in, recv, count, type, mpi_op(c.op), comm, &reqs[0]),
                            where);
          else
            DITTO_MPI_CHECK(
                MPI_Ireduce(in, recv, count, type, mpi_op(c.op), c.root, comm, &reqs[0]), where);
          wait();
          if (root) divide_avg(recv, c.count);
        } else {
          tree_reduce(c, calls, seq);
        }
        break;
      case Kind::reduce_scatter:
        if (native) {
          const char* in = unaliased(send, bytes * static_cast<std::size_t>(n), bytes, copy);
          DITTO_MPI_CHECK(
              MPI_Ireduce_scatter_block(in, recv, count, type, mpi_op(c.op), comm, &reqs[0]),
              where);
          wait(copy);
          divide_avg(recv, c.count);
        } else {
          tree_reduce(c, calls, seq);
        }
        break;
      case Kind::broadcast:
        if (r == c.root && send != recv) std::memcpy(recv, send, bytes);
        DITTO_MPI_CHECK(MPI_Ibcast(recv, count, type, c.root, comm, &reqs[0]), where);
        wait();
        break;
      case Kind::all_gather: {
        const bool in_place = send == recv + static_cast<std::size_t>(r) * bytes;
        const char* in = in_place ? nullptr : unaliased(send, bytes, bytes * n, copy);
        DITTO_MPI_CHECK(MPI_Iallgather(in ? static_cast<const void*>(in) : MPI_IN_PLACE, count,
                                       type, recv, count, type, comm, &reqs[0]),
                        where);
        wait(copy);
        break;
      }
      case Kind::all_to_all:  // core refuses overlapping send and recv
        DITTO_MPI_CHECK(MPI_Ialltoall(send, count, type, recv, count, type, comm, &reqs[0]), where);
        wait();
        break;
      case Kind::all_to_all_v: {
        auto v = std::make_shared<std::vector<std::vector<int>>>(
            std::vector<std::vector<int>>{as_ints(c.send_counts), as_ints(c.send_displs),
                                          as_ints(c.recv_counts), as_ints(c.recv_displs)});
        DITTO_MPI_CHECK(MPI_Ialltoallv(send, (*v)[0].data(), (*v)[1].data(), type, recv,
                                       (*v)[2].data(), (*v)[3].data(), type, comm, &reqs[0]),
                        where);
        wait(v);
        break;
      }
      case Kind::gather: {
        const bool root = r == c.root;
        const char* in = send;
        if (root && send == recv + static_cast<std::size_t>(r) * bytes)
          in = nullptr;  // in place
        else if (root)
          in = unaliased(send, bytes, bytes * n, copy);
        DITTO_MPI_CHECK(MPI_Igather(in ? static_cast<const void*>(in) : MPI_IN_PLACE, count, type,
                                    root ? recv : nullptr, count, type, c.root, comm, &reqs[0]),
                        where);
        wait(copy);
        break;
      }
      case Kind::scatter: {
        const bool root = r == c.root;
        const char* in = root ? send : nullptr;
        void* out = recv;
        if (root && recv == send + static_cast<std::size_t>(r) * bytes)
          out = MPI_IN_PLACE;
        else if (root)
          in = unaliased(send, bytes * n, bytes, copy);
        DITTO_MPI_CHECK(MPI_Iscatter(in, count, type, out, count, type, c.root, comm, &reqs[0]),
                        where);
        wait(copy);
        break;
      }
      case Kind::barrier:
        DITTO_MPI_CHECK(MPI_Ibarrier(comm, &reqs[0]), where);
        wait();
        break;
      case Kind::send:
      case Kind::recv:
        throw InternalError(detail::cat(MpiLink::label(c.kind, seq),
                                        ": a point-to-point call reached the collective path"));
    }
  }

  // all_reduce, reduce and reduce_scatter with ditto's arithmetic (Note [Sim collectives over
  // MPI]): bitwise mode, and the reductions MPI cannot compute.
  void tree_reduce(const CollectiveCall& c, const std::vector<CollectiveCall>& calls,
                   std::uint64_t seq) {
    const MPI_Comm comm = link_.comm();
    const int n = link_.size(), r = link_.rank();
    const std::string& where = link_.where();
    const MPI_Datatype type = mpi_type(c.dtype);
    const std::size_t esize = dtype_size(c.dtype);
    const std::int64_t count = c.count;
    const bool scatter = c.kind == Kind::reduce_scatter;
    // Block q: elements [q * per, q * per + len(q)) of the buffer being reduced.
    const std::int64_t per = scatter ? count : (count + n - 1) / n;
    auto len = [&](int q) -> int {
      return static_cast<int>(scatter ? count
                                      : std::max<std::int64_t>(0, std::min(per, count - q * per)));
    };
    const int mine = len(r);
    std::vector<int> send_counts(static_cast<std::size_t>(n)), send_displs(send_counts.size());
    std::vector<int> recv_counts(send_counts.size()), recv_displs(send_counts.size());
    for (int q = 0; q < n; ++q) {
      send_counts[q] = len(q);
      send_displs[q] = static_cast<int>(q * per);
      recv_counts[q] = mine;
      recv_displs[q] = q * mine;
    }
    // (1) row q of scratch = block r of rank q's send. The scratch outlives an aborted wait.
    auto scratch = std::make_shared<std::vector<char>>(static_cast<std::size_t>(n) * mine * esize);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DITTO_MPI_CHECK(
        MPI_Ialltoallv(c.send, send_counts.data(), send_displs.data(), type, scratch->data(),
                       recv_counts.data(), recv_displs.data(), type, comm, &reqs[0]),
        where);
    link_.wait(reqs, c.kind, seq, scratch);
    // (2) the reduction over the rows (rank order), with every rank's premul_sum scalar.
    std::vector<const void*> rows(static_cast<std::size_t>(n));
    std::vector<double> scalars(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) {
      rows[q] = scratch->data() + static_cast<std::size_t>(q) * mine * esize;
      scalars[q] = calls[static_cast<std::size_t>(q)].scalar;
    }
    const Determinism mode = link_.options().determinism;
    char* recv = static_cast<char*>(c.recv);
    auto reduce_into = [&](void* out) {
      if (mine > 0) reduce_over_ranks(rows, out, mine, c.dtype, c.op, mode, scalars.data());
    };
    if (c.kind == Kind::reduce_scatter) {
      reduce_into(recv);
      return;
    }
    char* my_block = recv ? recv + static_cast<std::size_t>(r * per) * esize : nullptr;
    if (c.kind == Kind::all_reduce) {
      // (3) every rank's block into every recv.
      reduce_into(my_block);
      DITTO_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, recv, send_counts.data(),
                                      send_displs.data(), type, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq);
      return;
    }
    // reduce: the blocks to the root.
    if (r == c.root) {
      reduce_into(my_block);
      DITTO_MPI_CHECK(MPI_Igatherv(MPI_IN_PLACE, 0, type, recv, send_counts.data(),
                                   send_displs.data(), type, c.root, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq);
    } else {
      auto block = std::make_shared<std::vector<char>>(static_cast<std::size_t>(mine) * esize);
      reduce_into(block->data());
      DITTO_MPI_CHECK(MPI_Igatherv(block->data(), mine, type, nullptr, nullptr, nullptr, type,
                                   c.root, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq, block);
    }
  }

  MpiLink link_;
  std::atomic<bool> in_flight_{false};
  std::mutex groups_mu_;
  std::unordered_map<std::thread::id, Batch> groups_;  ///< open groups, by issuing thread
};

}  // namespace

/// The simulator's communicator over MPI: its ProcessCommunicatorFactory (registered with "sim").
std::shared_ptr<CommunicatorImpl> make_sim_mpi_communicator(detail::ProcessLink& link, Backend&,
                                                            int, const CommOptions& options) {
  return std::make_shared<SimMpiCommunicator>(link.comm, options);
}

}  // namespace ditto::sim
