// Communicator: the collectives that move blocks between ranks without reducing them
// (all_to_all, all_to_all_v, gather, scatter; ncclAlltoAll, MPI_Alltoallv, ncclGather,
// ncclScatter) and the core side of point-to-point send / recv (ncclSend / ncclRecv): argument
// checks, the call record, and their single-controller forms. The rest of the communicator is in
// communicator.cpp (which also defines the shared checks of core/comm/comm_checks.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/backend_api/collective_call.h"
#include "core/base/error.h"
#include "core/comm/comm_checks.h"
#include "core/comm/communicator.h"

namespace ditto {
namespace {

using Kind = detail::CollectiveKind;
using detail::call_record;
using detail::cat;
using detail::check_comm_tensor;
using detail::check_group;
using detail::check_root;
using detail::check_same_dtype;
using detail::each_rank;
using detail::ranges_overlap;
using detail::single_controller;

// The bytes of elements [first, first + count) of t.
const char* element_ptr(const Tensor& t, std::int64_t first) {
  return static_cast<const char*>(t.data_ptr()) +
         static_cast<std::size_t>(first) * dtype_size(t.dtype());
}
std::size_t bytes_of(const Tensor& t, std::int64_t count) {
  return static_cast<std::size_t>(count) * dtype_size(t.dtype());
}

void check_all_to_all(const Communicator& c, const Tensor& send, const Tensor& recv) {
  check_comm_tensor(c, "all_to_all", "send", send);
  check_comm_tensor(c, "all_to_all", "recv", recv);
  check_same_dtype("all_to_all", send, recv);
  DITTO_CHECK(send.numel() % c.size() == 0,
              "Communicator::all_to_all: send: expected a number "
              "of elements divisible by the size ",
              c.size(), " (one equal block per rank), got ", send.str());
  DITTO_CHECK(recv.numel() == send.numel(), "Communicator::all_to_all: recv: expected ",
              send.numel(), " elements (like send ", send.str(), "), got ", recv.str());
  DITTO_CHECK(!ranges_overlap(send.data_ptr(), send.nbytes(), recv.data_ptr(), recv.nbytes()),
              "Communicator::all_to_all: recv: expected a tensor that does not overlap send "
              "(all_to_all has no in-place form, as ncclAlltoAll), got ",
              recv.str(), " overlapping send ", send.str());
}

// One side's counts and displacements: size() entries, counts and displacements >= 0, every
// block inside `t` (`side` is "send" or "recv").
void check_blocks(const Communicator& c, const char* side, const Tensor& t,
                  const std::vector<std::int64_t>& counts,
                  const std::vector<std::int64_t>& displs) {
  const auto n = static_cast<std::size_t>(c.size());
  DITTO_CHECK(counts.size() == n, "Communicator::all_to_all_v: ", side, "_counts: expected ", n,
              " entries (one per rank), got ", counts.size());
  DITTO_CHECK(displs.size() == n, "Communicator::all_to_all_v: ", side, "_displs: expected ", n,
              " entries (one per rank), got ", displs.size());
  for (std::size_t q = 0; q < n; ++q) {
    DITTO_CHECK(counts[q] >= 0, "Communicator::all_to_all_v: ", side, "_counts[", q,
                "]: expected a count >= 0, got ", counts[q]);
    DITTO_CHECK(displs[q] >= 0, "Communicator::all_to_all_v: ", side, "_displs[", q,
                "]: expected a displacement >= 0, got ", displs[q]);
    DITTO_CHECK(displs[q] <= t.numel() && counts[q] <= t.numel() - displs[q],
                "Communicator::all_to_all_v: ", side, "_displs[", q, "], ", side, "_counts[", q,
                "]: expected a block inside ", side, " ", t.str(), ", got ", counts[q],
                " elements at element ", displs[q]);
  }
}

void check_all_to_all_v(const Communicator& c, const Tensor& send,
                        const std::vector<std::int64_t>& send_counts,
                        const std::vector<std::int64_t>& send_displs, const Tensor& recv,
                        const std::vector<std::int64_t>& recv_counts,
                        const std::vector<std::int64_t>& recv_displs) {
  check_comm_tensor(c, "all_to_all_v", "send", send);
  check_comm_tensor(c, "all_to_all_v", "recv", recv);
  check_same_dtype("all_to_all_v", send, recv);
  check_blocks(c, "send", send, send_counts, send_displs);
  check_blocks(c, "recv", recv, recv_counts, recv_displs);
  // The blocks of recv, by start: none may overlap the next one or send.
  std::vector<std::size_t> order;
  for (std::size_t q = 0; q < recv_counts.size(); ++q)
    if (recv_counts[q] > 0) order.push_back(q);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return recv_displs[a] < recv_displs[b] || (recv_displs[a] == recv_displs[b] && a < b);
  });
  auto block = [&](std::size_t q) {
    return cat("[", recv_displs[q], ", ", recv_displs[q] + recv_counts[q], ")");
  };
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t q = order[i];
    if (i + 1 < order.size()) {
      const std::size_t next = order[i + 1];
      DITTO_CHECK(recv_displs[next] >= recv_displs[q] + recv_counts[q],
                  "Communicator::all_to_all_v: recv_displs: the blocks from rank ", q, " (",
                  block(q), ") and rank ", next, " (", block(next), ") overlap in recv");
    }
    DITTO_CHECK(!ranges_overlap(element_ptr(recv, recv_displs[q]), bytes_of(recv, recv_counts[q]),
                                send.data_ptr(), send.nbytes()),
                "Communicator::all_to_all_v: recv: the block from rank ", q, " (elements ",
                block(q), " of ", recv.str(), ") overlaps send ", send.str());
  }
}

// Packed blocks: displacements are the exclusive prefix sums of the counts, whose sum must be
// t's number of elements.
std::vector<std::int64_t> packed_displs(const Communicator& c, const char* side, const Tensor& t,
                                        const std::vector<std::int64_t>& counts) {
  const auto n = static_cast<std::size_t>(c.size());
  DITTO_CHECK(counts.size() == n, "Communicator::all_to_all_v: ", side, "_counts: expected ", n,
              " entries (one per rank), got ", counts.size());
  std::vector<std::int64_t> displs(n);
  std::int64_t sum = 0;  // saturates: it is only compared with numel
  for (std::size_t q = 0; q < n; ++q) {
    DITTO_CHECK(counts[q] >= 0, "Communicator::all_to_all_v: ", side, "_counts[", q,
                "]: expected a count >= 0, got ", counts[q]);
    displs[q] = sum;
    sum = counts[q] > std::numeric_limits<std::int64_t>::max() - sum
              ? std::numeric_limits<std::int64_t>::max()
              : sum + counts[q];
  }
  DITTO_CHECK(sum == t.numel(), "Communicator::all_to_all_v: ", side,
              "_counts: expected counts "
              "that add up to the ",
              t.numel(), " elements of ", side, " ", t.str(), " (packed blocks), got a sum of ",
              sum);
  return displs;
}

// The root's large buffer `whole` (gather's recv, scatter's send: size() * n elements) and its
// block-sized buffer `part` (n elements) either do not overlap or are in place: part is exactly
// block `rank` of whole (as ncclGather and ncclScatter allow).
void check_root_block(const char* call, const char* whole_arg, const Tensor& whole,
                      const char* part_arg, const Tensor& part, int rank) {
  DITTO_CHECK(detail::disjoint_or_block(whole, part, rank), "Communicator::", call, ": ", whole_arg,
              ": expected a tensor that does not overlap ", part_arg,
              " or holds it in place as its block ", rank, " (the root's), got ", whole.str(),
              " overlapping ", part_arg, " ", part.str());
}

// gather's and scatter's checks: every rank's `part` (gather's send, scatter's recv) and, on the
// root only, `whole` (size x part's elements, the dtype of send, and not overlapping part unless
// it holds it in place as the root's block).
void check_rooted(const Communicator& c, const char* call, const Tensor& send, const Tensor& recv,
                  int root, bool whole_is_recv) {
  const char* part_arg = whole_is_recv ? "send" : "recv";
  const char* whole_arg = whole_is_recv ? "recv" : "send";
  const Tensor& part = whole_is_recv ? send : recv;
  const Tensor& whole = whole_is_recv ? recv : send;
  check_root(c, call, root);
  check_comm_tensor(c, call, part_arg, part);
  if (c.rank() != root) return;  // whole is ignored off root
  check_comm_tensor(c, call, whole_arg, whole);
  check_same_dtype(call, send, recv);
  DITTO_CHECK(whole.numel() == c.size() * part.numel(), "Communicator::", call, ": ", whole_arg,
              ": expected ", c.size() * part.numel(), " elements on the root (size ", c.size(),
              " x ", part_arg, "'s ", part.numel(), "), got ", whole.str());
  check_root_block(call, whole_arg, whole, part_arg, part, root);
}

void check_gather(const Communicator& c, const Tensor& send, const Tensor& recv, int root) {
  check_rooted(c, "gather", send, recv, root, /*whole_is_recv=*/true);
}

void check_scatter(const Communicator& c, const Tensor& send, const Tensor& recv, int root) {
  check_rooted(c, "scatter", send, recv, root, /*whole_is_recv=*/false);
}

void check_peer(const Communicator& c, const char* call, const Tensor& t, int peer) {
  check_comm_tensor(c, call, "tensor", t);
  DITTO_CHECK(peer >= 0 && peer < c.size(), "Communicator::", call,
              ": peer: expected a rank in [0, ", c.size(), "), got ", peer);
  // Outside a group each call is its own group, so a send to this rank waits for a recv that can
  // only be issued after it (and a recv for a send): NCCL waits forever there. Refuse at once.
  DITTO_CHECK(peer != c.rank() || detail::thread_in_group(), "Communicator::", call,
              ": peer: rank ", peer, " is this rank (", detail::rank_str(c), "): a ", call,
              std::strcmp(call, "send") == 0 ? " to itself needs its matching recv"
                                             : " from itself needs its matching send",
              " in the same group (group_start() ... group_end(), as ncclGroupStart / "
              "ncclGroupEnd); outside a group it would wait for a call issued after it");
}

}  // namespace

// ---- per-rank calls -----------------------------------------------------------------------------

void Communicator::all_to_all(const Tensor& send, Tensor& recv) {
  detail::check_comm_live(*this, "Communicator::all_to_all");
  detail::check_or_abort(*this, [&] { check_all_to_all(*this, send, recv); });
  submit(call_record(Kind::all_to_all, send.data_ptr(), recv.data_ptr(), send.numel() / size(),
                     send.dtype(), ReduceOp::sum, 0));
}

void Communicator::all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts,
                                const std::vector<std::int64_t>& send_displs, Tensor& recv,
                                const std::vector<std::int64_t>& recv_counts,
                                const std::vector<std::int64_t>& recv_displs) {
  detail::check_comm_live(*this, "Communicator::all_to_all_v");
  detail::check_or_abort(*this, [&] {
    check_all_to_all_v(*this, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  });
  detail::CollectiveCall call = call_record(Kind::all_to_all_v, send.data_ptr(), recv.data_ptr(), 0,
                                            send.dtype(), ReduceOp::sum, 0);
  call.send_counts = send_counts;
  call.send_displs = send_displs;
  call.recv_counts = recv_counts;
  call.recv_displs = recv_displs;
  submit(call);
}

void Communicator::all_to_all_v(const Tensor& send, const std::vector<std::int64_t>& send_counts,
                                Tensor& recv, const std::vector<std::int64_t>& recv_counts) {
  detail::check_comm_live(*this, "Communicator::all_to_all_v");
  std::vector<std::int64_t> send_displs, recv_displs;
  detail::check_or_abort(*this, [&] {
    check_comm_tensor(*this, "all_to_all_v", "send", send);
    check_comm_tensor(*this, "all_to_all_v", "recv", recv);
    send_displs = packed_displs(*this, "send", send, send_counts);
    recv_displs = packed_displs(*this, "recv", recv, recv_counts);
  });
  all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

void Communicator::gather(const Tensor& send, Tensor& recv, int root) {
  detail::check_comm_live(*this, "Communicator::gather");
  detail::check_or_abort(*this, [&] { check_gather(*this, send, recv, root); });
  submit(detail::rooted_call(Kind::gather, rank_ == root, send, recv, ReduceOp::sum, root));
}

void Communicator::scatter(const Tensor& send, Tensor& recv, int root) {
  detail::check_comm_live(*this, "Communicator::scatter");
  detail::check_or_abort(*this, [&] { check_scatter(*this, send, recv, root); });
  submit(detail::rooted_call(Kind::scatter, rank_ == root, send, recv, ReduceOp::sum, root));
}

// Point-to-point: the backend routes kinds send / recv to its own matching (detail::is_p2p).
void Communicator::send(const Tensor& tensor, int peer) {
  detail::check_comm_live(*this, "Communicator::send");
  detail::check_or_abort(*this, [&] {
    check_peer(*this, "send", tensor, peer);
    detail::check_p2p_in_group(*this, "send", tensor, peer);
  });
  detail::CollectiveCall call =
      call_record(Kind::send, tensor.data_ptr(), nullptr, tensor.numel(), tensor.dtype());
  call.peer = peer;
  submit(call);
}

void Communicator::recv(Tensor& tensor, int peer) {
  detail::check_comm_live(*this, "Communicator::recv");
  detail::check_or_abort(*this, [&] {
    check_peer(*this, "recv", tensor, peer);
    detail::check_p2p_in_group(*this, "recv", tensor, peer);
  });
  detail::CollectiveCall call =
      call_record(Kind::recv, nullptr, tensor.data_ptr(), tensor.numel(), tensor.dtype());
  call.peer = peer;
  submit(call);
}

// ---- single-controller forms --------------------------------------------------------------------

DITTO_SEND_RECV_GROUP_FORM(all_to_all, (), ())

void all_to_all_v(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                  const std::vector<std::vector<std::int64_t>>& send_counts,
                  std::vector<Tensor>& recv,
                  const std::vector<std::vector<std::int64_t>>& recv_counts) {
  check_group("all_to_all_v", comms, {{"send", send.size()}, {"recv", recv.size()}});
  check_group("all_to_all_v", comms,
              {{"send_counts", send_counts.size()}, {"recv_counts", recv_counts.size()}},
              "count vectors");
  each_rank(
      comms,
      [&](std::size_t i) {
        check_comm_tensor(comms[i], "all_to_all_v", "send", send[i]);
        check_comm_tensor(comms[i], "all_to_all_v", "recv", recv[i]);
        check_all_to_all_v(comms[i], send[i], send_counts[i],
                           packed_displs(comms[i], "send", send[i], send_counts[i]), recv[i],
                           recv_counts[i],
                           packed_displs(comms[i], "recv", recv[i], recv_counts[i]));
      },
      [&](std::size_t i) {
        comms[i].all_to_all_v(send[i], send_counts[i], recv[i], recv_counts[i]);
      });
}

DITTO_SEND_RECV_GROUP_FORM(gather, (, int root), (, root))

DITTO_SEND_RECV_GROUP_FORM(scatter, (, int root), (, root))

}  // namespace ditto
