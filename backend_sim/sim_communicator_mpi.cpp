// The simulator's communicator with one rank per process (Communicator::init_rank under mpirun):
// each process holds its rank's virtual device and the ranks exchange data through MPI.
// Compiled only with DITTO_WITH_MPI.
//
// Note [Sim collectives over MPI]
// Each rank's call enqueues ONE task on the given stream (as in Note [Sim collectives]); the task,
// on the stream's worker thread,
//   1. exchanges the ranks' calls and checks that they match (MpiLink::start: the in-process
//      simulator's mismatch error, thrown by every rank; Timeout naming the ranks whose call did
//      not come, Note [Timeouts over MPI]);
//   2. moves the data with nonblocking MPI calls, polled until done or the deadline:
//      fast (MPI's own reductions, in MPI's order and with its NaN handling for min and max;
//      avg = sum / N, as ncclAvg):
//        all_reduce MPI_Iallreduce, reduce MPI_Ireduce, reduce_scatter MPI_Ireduce_scatter_block;
//      bitwise (MPI only moves data; the adds are ditto's, in the canonical tree over rank index,
//      so the bits are those of the in-process simulator, reduce_over_ranks):
//        all_reduce      the count is cut into N blocks of per = ceil(count / N) elements;
//                        (1) MPI_Ialltoallv: rank r receives block r of every rank's send, in
//                        rank order; (2) it reduces them in the tree into block r of its recv;
//                        (3) MPI_Iallgatherv in place fills the other blocks of every recv.
//                        Per rank each phase moves (N-1)/N of the buffer each way: a ring's
//                        traffic (as NCCL's ring all-reduce), not a gather of everything;
//        reduce          (1), (2) into a scratch block, then MPI_Igatherv of the blocks to root;
//        reduce_scatter  (1) with blocks of `count` (block q of every send goes to rank q) and
//                        (2) straight into recv;
//      either mode: broadcast MPI_Ibcast, all_gather MPI_Iallgather, barrier MPI_Ibarrier.
// A rank's collectives must run one at a time (one stream per rank, or ordered streams); a
// collective that starts while the rank's previous one still runs fails with BackendError saying
// so (the other ranks then time out). MPI counts are ints: a collective moving more than 2^31 - 1 elements in one message
// fails on every rank with InvalidArgument (after the calls matched, so the ranks stay in step).
#include <atomic>
#include <climits>
#include <cstring>

#include "backend_sim/sim_backend.h"
#include "backend_sim/sim_reduce.h"
#include "core/internal/mpi_transport.h"

namespace ditto::sim {
namespace {

using detail::CollectiveCall;
using Kind = detail::CollectiveKind;
using detail::mpi::MpiLink;
using detail::mpi::mpi_type;

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::prod: return MPI_PROD;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  return MPI_SUM;
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

class SimMpiCommunicator final : public CommunicatorImpl,
                                 public std::enable_shared_from_this<SimMpiCommunicator> {
 public:
  SimMpiCommunicator(MPI_Comm comm, const CommOptions& options)
      : link_(comm, options, "sim communicator") {}

  void enqueue(int, Stream& s, const CollectiveCall& call) override {
    SimStream& ss = as_sim(s, detail::collective_name(call.kind));
    link_.throw_if_aborted(call.kind);
    ss.enqueue([self = shared_from_this(), call] { self->run(call); });
  }
  void abort(int, const std::string& reason) noexcept override { link_.abort_by_rank(reason); }

 private:
  // The task body (Note [Sim collectives over MPI]).
  void run(const CollectiveCall& call) {
    if (in_flight_.exchange(true))
      throw BackendError(detail::cat(
          detail::collective_name(call.kind), ": ", link_.where(),
          " started a collective while its previous one was still running (on another stream); "
          "a rank's collectives must run one at a time"));
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag = false; }
    } done{in_flight_};
    std::uint64_t seq = 0;
    link_.start(call, seq);  // throws on mismatch / timeout / abort
    const int n = link_.size();
    const std::int64_t moved = call.kind == Kind::all_gather || call.kind == Kind::reduce_scatter
                                   ? call.count * n
                                   : call.count;
    DITTO_CHECK(moved <= INT_MAX, MpiLink::label(call.kind, seq), ": count: at most ", INT_MAX,
                " elements move in one MPI message, got ", moved,
                " (split the tensor into several collectives)");
    if (call.kind != Kind::barrier && call.count == 0) return;
    if (call.dtype == DType::f32)
      work<float>(call, seq);
    else
      work<std::int64_t>(call, seq);
  }

  template <typename T>
  void work(const CollectiveCall& c, std::uint64_t seq) {
    const MPI_Comm comm = link_.comm();
    const int n = link_.size(), r = link_.rank();
    const std::string& where = link_.where();
    const MPI_Datatype type = mpi_type(c.dtype);
    const int count = static_cast<int>(c.count);
    const std::size_t bytes = static_cast<std::size_t>(c.count) * sizeof(T);
    const bool bitwise = link_.options().determinism == Determinism::bitwise;
    const T* send = static_cast<const T*>(c.send);
    T* recv = static_cast<T*>(c.recv);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    auto wait = [&](std::shared_ptr<void> keep = {}) { link_.wait(reqs, c.kind, seq, std::move(keep)); };
    auto divide_avg = [&](T* p, std::int64_t len) {
      if constexpr (std::is_same_v<T, float>)
        if (c.op == ReduceOp::avg)
          for (std::int64_t i = 0; i < len; ++i) p[i] = p[i] / static_cast<float>(n);
    };

    switch (c.kind) {
      case Kind::all_reduce:
      case Kind::reduce:
        if (!bitwise) {
          const bool root = c.kind == Kind::all_reduce || r == c.root;
          const void* in = root && send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
          if (c.kind == Kind::all_reduce)
            DITTO_MPI_CHECK(MPI_Iallreduce(in, recv, count, type, mpi_op(c.op), comm, &reqs[0]),
                            where);
          else
            DITTO_MPI_CHECK(MPI_Ireduce(in, recv, count, type, mpi_op(c.op), c.root, comm,
                                        &reqs[0]),
                            where);
          wait();
          if (root) divide_avg(recv, c.count);
        } else {
          bitwise_reduce<T>(c, seq);
        }
        break;
      case Kind::reduce_scatter:
        if (!bitwise) {
          // MPI forbids send and recv to overlap; a recv inside send needs a copy of send.
          std::shared_ptr<std::vector<T>> copy;
          const T* in = send;
          if (overlaps(send, bytes * static_cast<std::size_t>(n), recv, bytes)) {
            copy = std::make_shared<std::vector<T>>(send, send + c.count * n);
            in = copy->data();
          }
          DITTO_MPI_CHECK(MPI_Ireduce_scatter_block(in, recv, count, type, mpi_op(c.op), comm,
                                                    &reqs[0]),
                          where);
          wait(copy);
          divide_avg(recv, c.count);
        } else {
          bitwise_reduce<T>(c, seq);
        }
        break;
      case Kind::broadcast:
        if (r == c.root && send != recv) std::memcpy(recv, send, bytes);
        DITTO_MPI_CHECK(MPI_Ibcast(recv, count, type, c.root, comm, &reqs[0]), where);
        wait();
        break;
      case Kind::all_gather: {
        const T* in = send;
        std::shared_ptr<std::vector<T>> copy;
        if (send == recv + static_cast<std::int64_t>(r) * c.count) {
          in = nullptr;  // in place
        } else if (overlaps(send, bytes, recv, bytes * static_cast<std::size_t>(n))) {
          copy = std::make_shared<std::vector<T>>(send, send + c.count);
          in = copy->data();
        }
        DITTO_MPI_CHECK(MPI_Iallgather(in ? static_cast<const void*>(in) : MPI_IN_PLACE, count,
                                       type, recv, count, type, comm, &reqs[0]),
                        where);
        wait(copy);
        break;
      }
      case Kind::barrier:
        DITTO_MPI_CHECK(MPI_Ibarrier(comm, &reqs[0]), where);
        wait();
        break;
    }
  }

  // Bitwise all_reduce, reduce and reduce_scatter (Note [Sim collectives over MPI]).
  template <typename T>
  void bitwise_reduce(const CollectiveCall& c, std::uint64_t seq) {
    const MPI_Comm comm = link_.comm();
    const int n = link_.size(), r = link_.rank();
    const std::string& where = link_.where();
    const MPI_Datatype type = mpi_type(c.dtype);
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
    auto scratch = std::make_shared<std::vector<T>>(static_cast<std::size_t>(n) * mine);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DITTO_MPI_CHECK(MPI_Ialltoallv(c.send, send_counts.data(), send_displs.data(), type,
                                   scratch->data(), recv_counts.data(), recv_displs.data(), type,
                                   comm, &reqs[0]),
                    where);
    link_.wait(reqs, c.kind, seq, scratch);
    // (2) the canonical tree over the rows (rank order).
    std::vector<const void*> rows(static_cast<std::size_t>(n));
    for (int q = 0; q < n; ++q) rows[q] = scratch->data() + static_cast<std::size_t>(q) * mine;
    const Determinism mode = Determinism::bitwise;
    T* recv = static_cast<T*>(c.recv);
    if (c.kind == Kind::reduce_scatter) {
      reduce_over_ranks(rows, recv, mine, c.dtype, c.op, mode);
      return;
    }
    if (c.kind == Kind::all_reduce) {
      // (3) every rank's block into every recv.
      if (mine > 0) reduce_over_ranks(rows, recv + r * per, mine, c.dtype, c.op, mode);
      DITTO_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, recv, send_counts.data(),
                                      send_displs.data(), type, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq);
      return;
    }
    // reduce: the blocks to the root.
    if (r == c.root) {
      if (mine > 0) reduce_over_ranks(rows, recv + r * per, mine, c.dtype, c.op, mode);
      DITTO_MPI_CHECK(MPI_Igatherv(MPI_IN_PLACE, 0, type, recv, send_counts.data(),
                                   send_displs.data(), type, c.root, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq);
    } else {
      auto block = std::make_shared<std::vector<T>>(static_cast<std::size_t>(mine));
      if (mine > 0) reduce_over_ranks(rows, block->data(), mine, c.dtype, c.op, mode);
      DITTO_MPI_CHECK(MPI_Igatherv(block->data(), mine, type, nullptr, nullptr, nullptr, type,
                                   c.root, comm, &reqs[0]),
                      where);
      link_.wait(reqs, c.kind, seq, block);
    }
  }

  MpiLink link_;
  std::atomic<bool> in_flight_{false};
};

}  // namespace

/// The simulator's communicator over MPI: its ProcessCommunicatorFactory (registered with "sim").
std::shared_ptr<CommunicatorImpl> make_sim_mpi_communicator(detail::ProcessLink& link, Backend&,
                                                            int, const CommOptions& options) {
  return std::make_shared<SimMpiCommunicator>(link.comm, options);
}

}  // namespace ditto::sim
