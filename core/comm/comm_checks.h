// Internal to core/comm: the argument checks every Communicator method shares (NCCL's argcheck),
// defined in communicator.cpp and used by the collectives of communicator_exchange.cpp, and the
// one way a single-controller form issues its loop over the ranks (as one group).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/backend_api/collective_call.h"
#include "core/base/error.h"
#include "core/comm/communicator.h"

namespace ditto::detail {

/// "sim:0 (rank 0 of 2)".
std::string rank_str(const Communicator& c);

/// `t` (argument `arg` of Communicator::<call>) is defined and on c's device; any dtype.
void check_comm_tensor(const Communicator& c, const char* call, const char* arg, const Tensor& t);
/// recv has send's dtype.
void check_same_dtype(const char* call, const Tensor& send, const Tensor& recv);
/// 0 <= root < c.size().
void check_root(const Communicator& c, const char* call, int root);
/// Runs `checks`, the argument checks of a per-rank call (Communicator::<call> on one rank's
/// handle); a refusal (InvalidArgument) also aborts the communicator (Communicator::abort, when
/// it has other ranks) before it is thrown, since this rank's call never comes and the other
/// ranks would wait for it until their timeout; they fail at once instead (PeerFailure), naming
/// this rank and the refusal. Every per-rank method's checks run here (Note [Per-rank refusals
/// abort]); the single-controller forms check every rank before issuing any, so their refusals
/// abort nothing.
template <typename F>
void check_or_abort(const Communicator& c, const F& checks) {
  try {
    checks();
  } catch (const InvalidArgument& e) {
    if (c.size() > 1) c.abort(e.what());
    throw;
  }
}
/// Whether this thread is inside a group_start() / group_end() (ncclGroupStart / ncclGroupEnd).
bool thread_in_group();
/// Inside a group of this thread: refuses (InvalidArgument) a send or recv (`call`) of `t` on
/// c's rank whose bytes overlap an earlier recv of that rank in the group, or, for a recv, an
/// earlier send; else records it (to / from `peer`) until the outermost group_end. Outside a
/// group: nothing (Note [Overlapping point-to-point buffers in a group], communicator.cpp).
void check_p2p_in_group(const Communicator& c, const char* call, const Tensor& t, int peer);
/// A reduction op: one of the enumerators; premul_sum only with its scalar (`scalar` non-null,
/// from a PreMulSum overload), which for an integer dtype must be an integer the dtype holds.
void check_op(const char* call, DType dtype, ReduceOp op, const double* scalar);

/// `comms` are one communicator's init_all handles in rank order; each named vector has one
/// entry per rank (`what` names the entries in the message, e.g. "tensors").
void check_group(const char* call, const std::vector<Communicator>& comms,
                 std::initializer_list<std::pair<const char*, std::size_t>> vectors,
                 const char* what = "tensors");

/// The call record of a rooted collective on a rank (`is_root` on the root): the root's own side
/// is null off the root (send of broadcast and scatter, recv of reduce and gather), and count
/// and dtype are those of the side every rank holds (recv, resp. send).
CollectiveCall rooted_call(CollectiveKind kind, bool is_root, const Tensor& send,
                           const Tensor& recv, ReduceOp op, int root, double scalar = 1.0);

/// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte (empty ranges
/// share none).
bool ranges_overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes);

/// Whether `part` shares no byte with `whole`, or is exactly its block `block` (its elements
/// [block * part.numel(), (block + 1) * part.numel())): NCCL's in-place layouts (block 0 of a
/// same-sized buffer is the buffer itself). The overlap rule of every collective's check.
bool disjoint_or_block(const Tensor& whole, const Tensor& part, std::int64_t block);

/// Runs `issue` (per-rank calls) as one group of this thread (group_start / group_end); when
/// `issue` throws, the group is still ended and the first error is the one rethrown.
template <typename F>
void grouped(F&& issue) {
  group_start();
  try {
    issue();
  } catch (...) {
    try {
      group_end();
    } catch (...) {  // the first error is the one to report
    }
    throw;
  }
  group_end();
}

/// The single-controller form of a collective over `comms` (one init_all's handles, rank order):
/// check(i) for every rank first (a refusal issues nothing), then issue(i) for every rank as one
/// group (grouped).
template <typename Check, typename Issue>
void each_rank(std::vector<Communicator>& comms, const Check& check, const Issue& issue) {
  for (std::size_t i = 0; i < comms.size(); ++i) check(i);
  grouped([&] {
    for (std::size_t i = 0; i < comms.size(); ++i) issue(i);
  });
}

/// check_group(call, comms, vectors), then each_rank(comms, check, issue).
template <typename Check, typename Issue>
void single_controller(const char* call, std::vector<Communicator>& comms,
                       std::initializer_list<std::pair<const char*, std::size_t>> vectors,
                       const Check& check, const Issue& issue) {
  check_group(call, comms, vectors);
  each_rank(comms, check, issue);
}

/// The single-controller forms of a collective over one send and one recv tensor per rank, by the
/// template the seven of them share (communicator.cpp, communicator_exchange.cpp):
///   void name(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
///             std::vector<Tensor>& recv, <EXTRA_PARAMS>)
/// checks the vectors (check_group), then every rank's check_<name>(comm, send, recv,
/// <EXTRA_ARGS>) before any rank's comm.name(send, recv, <EXTRA_ARGS>) (single_controller).
/// EXTRA_PARAMS and EXTRA_ARGS are parenthesised, each item after a comma: (, ReduceOp op, int
/// root) and (, op, root); () for none.
#define DITTO_SEND_RECV_GROUP_FORM(name, EXTRA_PARAMS, EXTRA_ARGS)                                 \
  void name(std::vector<Communicator>& comms, const std::vector<Tensor>& send,                     \
            std::vector<Tensor>& recv DITTO_UNPAREN EXTRA_PARAMS) {                                \
    ::ditto::detail::single_controller(                                                            \
        #name, comms, {{"send", send.size()}, {"recv", recv.size()}},                              \
        [&](std::size_t i) { check_##name(comms[i], send[i], recv[i] DITTO_UNPAREN EXTRA_ARGS); }, \
        [&](std::size_t i) { comms[i].name(send[i], recv[i] DITTO_UNPAREN EXTRA_ARGS); });         \
  }
#define DITTO_UNPAREN(...) __VA_ARGS__

}  // namespace ditto::detail
