// Communicator: argument checks (once, in core) and dispatch of each collective to the backend's
// CommunicatorImpl on the current stream of the rank's device; the single-controller free
// functions validate every rank before enqueueing any, so a bad argument never leaves the other
// ranks waiting for a partner that will not come, and issue their loop over the ranks as one
// group (group_start / group_end, per thread).
#include "core/comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "core/backend_api/collective_call.h"
#include "core/backend_api/process_group.h"
#include "core/base/error.h"
#include "core/comm/comm_checks.h"
#include "core/distributed/distributed.h"
#include "core/runtime/backend.h"
#include "core/runtime/backend_init.h"
#include "core/runtime/ops_check.h"

namespace ditto {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
    case ReduceOp::premul_sum: return "premul_sum";
  }
  return "unknown";
}

namespace detail {

// Note [Communicators of a replaced backend]
// init_backend re-creates a backend's process-wide instance (Trainer::fit does, for its run's
// device count). A handle made before keeps the old instance's CommunicatorImpl, but its devices
// are names ("sim:2"), which now resolve to the new instance: the index may be out of range
// (init_backend with fewer devices) or name another instance's device, whose streams the old
// communicator would then run on. A single-controller all_reduce enqueued ranks 0 and 1 on the
// new instance's streams and failed at rank 2 ("index out of range"), leaving ranks 0 and 1 to
// time out in later, unrelated work (tester3); with as many devices it ran unordered with the
// old instance's pending work on its tensors. As NCCL refuses a communicator whose context is
// gone, every call of such a handle refuses at once: each per-rank method and stream() check
// first, the single-controller forms check every handle (check_group) before any rank's
// arguments, all with InvalidArgument "<call>: ... re-initialised ...". The handle holds the
// instance it was made on (backend_, as Buffers hold theirs), and the registry's generation read
// after that lookup (generation_): while the generation is unchanged nothing was created or
// replaced, so the check is one integer compare; after any change it compares the held instance
// with the live one (get_backend's per-thread cache).
void check_comm_live(const Communicator& c, const char* where) {
  if (backend_generation() == c.generation_) return;
  const std::string& type = c.device().type;
  if (&get_backend(type) == c.backend_.get()) return;
  throw InvalidArgument(cat(where, ": the handle of rank ", c.rank(), " of ", c.size(), " (",
                            c.device().str(), ") was made on an instance of backend ", type,
                            " that init_backend has since re-initialised: its devices and streams "
                            "are gone; make new handles (Communicator::init_all or init_rank) on "
                            "the live instance"));
}

// Note [Per-rank refusals abort]
// A per-rank call (one rank's handle, SPMD: a thread or a process per rank) refused for its
// arguments never reaches the backend, so the other ranks, which called correctly, would wait in
// that collective for this rank until CommOptions::timeout_ms, then throw a Timeout that does
// not say why (tester hB, 3: rank 1's all_reduce recv of 5 elements for a send of 4). Every
// per-rank method therefore runs its checks through check_or_abort (comm_checks.h): a refusal
// aborts the communicator (Communicator::abort) with its message before the InvalidArgument is
// thrown to this rank, and the others fail at once with a PeerFailure "rank <r> failed:
// <refusal>", as DistributedDataParallel aborts for a rank that throws mid-step. The handle
// stays failed (make new ones to go on). NCCL does not do this: ncclInvalidArgument returns to
// the refusing rank only, and its peers hang in the collective; ditto's design fails fast. Not
// aborted: a handle of a re-initialised backend (check_comm_live: its communicator is gone for
// every rank alike), a communicator of one rank (no one waits), and the single-controller forms,
// which check every rank before issuing any, so a refusal there leaves nothing waiting and the
// communicator usable.

std::string rank_str(const Communicator& c) {
  return cat(c.device().str(), " (rank ", c.rank(), " of ", c.size(), ")");
}

void check_comm_tensor(const Communicator& c, const char* call, const char* arg, const Tensor& t) {
  DITTO_CHECK(t.defined(), "Communicator::", call, ": ", arg, ": expected a tensor on ",
              rank_str(c), ", got an undefined tensor");
  DITTO_CHECK(t.device() == c.device(), "Communicator::", call, ": ", arg,
              ": expected a tensor on ", rank_str(c), ", got ", t.str());
  // Memory of an instance init_backend has since replaced, though the handle is the live one's:
  // refused as every op refuses it (Note [Tensors of a replaced backend], tensor.cpp); it ran on
  // the live instance's streams, unordered with the old one's work (tester hB, 9).
  if (t.buffer() != nullptr && &t.buffer()->backend() != &get_backend(t.device().type))
    ops::internal::check_live(cat("Communicator::", call).c_str(), arg, t);
}

void check_same_dtype(const char* call, const Tensor& send, const Tensor& recv) {
  DITTO_CHECK(send.dtype() == recv.dtype(), "Communicator::", call, ": recv: expected dtype ",
              dtype_name(send.dtype()), " (like send), got ", recv.str());
}

CollectiveCall rooted_call(CollectiveKind kind, bool is_root, const Tensor& send,
                           const Tensor& recv, ReduceOp op, int root, double scalar) {
  const bool root_sends = kind == CollectiveKind::broadcast || kind == CollectiveKind::scatter;
  const Tensor& every = root_sends ? recv : send;  // the side every rank holds
  const void* send_ptr = !root_sends || is_root ? send.data_ptr() : nullptr;
  void* recv_ptr = root_sends || is_root ? recv.data_ptr() : nullptr;
  return call_record(kind, send_ptr, recv_ptr, every.numel(), every.dtype(), op, root, scalar);
}

void check_root(const Communicator& c, const char* call, int root) {
  DITTO_CHECK(root >= 0 && root < c.size(), "Communicator::", call,
              ": root: expected a rank in [0, ", c.size(), "), got ", root);
}

void check_op(const char* call, DType dtype, ReduceOp op, const double* scalar) {
  DITTO_CHECK(static_cast<unsigned>(op) <= static_cast<unsigned>(ReduceOp::premul_sum),
              "Communicator::", call, ": op: expected sum, prod, min, max, avg or premul_sum, got ",
              static_cast<unsigned>(op));
  DITTO_CHECK(op != ReduceOp::premul_sum || scalar != nullptr, "Communicator::", call,
              ": op: premul_sum needs its scalar: pass PreMulSum{scalar}");
  if (scalar == nullptr || !is_integral(dtype)) return;
  // Integer dtypes multiply in the dtype: the scalar must be one of its values.
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      using L = std::numeric_limits<T>;
      const double lo = L::is_signed ? -std::ldexp(1.0, L::digits) : 0.0;
      const double end = std::ldexp(1.0, L::digits);  // max() + 1, exact
      const double s = *scalar;
      DITTO_CHECK(std::trunc(s) == s && s >= lo && s < end, "Communicator::", call,
                  ": op: PreMulSum scalar for dtype ", dtype_name(dtype),
                  ": expected an integer in [", +L::min(), ", ", +L::max(), "], got ", s);
    }
  });
}

void check_group(const char* call, const std::vector<Communicator>& comms,
                 std::initializer_list<std::pair<const char*, std::size_t>> vectors,
                 const char* what) {
  DITTO_CHECK(!comms.empty(), call,
              ": comms: expected the handles of Communicator::init_all, got "
              "an empty list");
  DITTO_CHECK(!comms[0].multiprocess() || comms[0].size() == 1, call,
              ": comms: expected the handles of Communicator::init_all, got a handle of "
              "Communicator::init_rank (its other ranks are other processes: call the per-rank "
              "method on it instead)");
  DITTO_CHECK(static_cast<int>(comms.size()) == comms[0].size(), call, ": comms: expected ",
              comms[0].size(), " handles (one per rank), got ", comms.size());
  for (std::size_t i = 0; i < comms.size(); ++i) {
    DITTO_CHECK(&comms[i].devices() == &comms[0].devices(), call, ": comms[", i,
                "]: expected a handle of the same communicator as comms[0]");
    DITTO_CHECK(comms[i].rank() == static_cast<int>(i), call, ": comms[", i,
                "]: expected the handle of rank ", i, " (handles in rank order), got rank ",
                comms[i].rank());
  }
  // One communicator's handles share its instance: rank 0's answers for all of them.
  check_comm_live(comms[0], call);
  for (const auto& [name, n] : vectors)
    DITTO_CHECK(n == comms.size(), call, ": ", name, ": expected ", comms.size(), " ", what,
                " (one per rank), got ", n);
}

bool ranges_overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

bool disjoint_or_block(const Tensor& whole, const Tensor& part, std::int64_t block) {
  const std::size_t off =
      static_cast<std::size_t>(block * part.numel()) * dtype_size(whole.dtype());
  return static_cast<const char*>(whole.data_ptr()) + off == part.data_ptr() ||
         !ranges_overlap(whole.data_ptr(), whole.nbytes(), part.data_ptr(), part.nbytes());
}

}  // namespace detail

namespace {

using Kind = detail::CollectiveKind;
using detail::call_record;
using detail::check_comm_tensor;
using detail::check_op;
using detail::check_root;
using detail::check_same_dtype;

// send and recv either disjoint or in NCCL's in-place layout: send is block `block` of recv
// (block 0: the same buffer; all_gather: block rank()) or, with recv_in_send, recv is block
// `block` of send (reduce_scatter). A partial overlap made the simulator's slices read values
// another slice had already written (a wrong result, no error; found by a newcomer). The layout
// the message names follows the sizes, not the block: "recv is send" only where both have as
// many elements (all_gather's and reduce_scatter's rank 0 were told "recv is send", a layout
// their sizes cannot have; tester D, D4).
void check_in_place_or_disjoint(const Communicator& c, const char* call, const Tensor& send,
                                const Tensor& recv, std::int64_t block, bool recv_in_send) {
  const bool ok = recv_in_send ? detail::disjoint_or_block(send, recv, block)
                               : detail::disjoint_or_block(recv, send, block);
  DITTO_CHECK(
      ok, "Communicator::", call,
      ": recv: expected a tensor that does not "
      "overlap send, or NCCL's in-place layout (",
      send.numel() == recv.numel()
          ? "recv is send"
          : (recv_in_send ? "recv is block rank() of send" : "send is block rank() of recv"),
      ", rank ", c.rank(), "), got recv ", recv.str(), " partly overlapping send ", send.str());
}

// The checks of the collectives of this file; `scalar` is the PreMulSum overloads' (else null).
void check_all_reduce(const Communicator& c, const Tensor& send, const Tensor& recv, ReduceOp op,
                      const double* scalar = nullptr) {
  check_comm_tensor(c, "all_reduce", "send", send);
  check_comm_tensor(c, "all_reduce", "recv", recv);
  check_same_dtype("all_reduce", send, recv);
  DITTO_CHECK(recv.numel() == send.numel(), "Communicator::all_reduce: recv: expected ",
              send.numel(), " elements (like send ", send.str(), "), got ", recv.str());
  check_in_place_or_disjoint(c, "all_reduce", send, recv, 0, false);
  check_op("all_reduce", send.dtype(), op, scalar);
}

void check_reduce(const Communicator& c, const Tensor& send, const Tensor& recv, ReduceOp op,
                  int root, const double* scalar = nullptr) {
  check_root(c, "reduce", root);
  check_comm_tensor(c, "reduce", "send", send);
  check_op("reduce", send.dtype(), op, scalar);
  if (c.rank() != root) return;  // recv is ignored off root
  check_comm_tensor(c, "reduce", "recv", recv);
  check_same_dtype("reduce", send, recv);
  DITTO_CHECK(recv.numel() == send.numel(), "Communicator::reduce: recv: expected ", send.numel(),
              " elements on the root (like send ", send.str(), "), got ", recv.str());
  check_in_place_or_disjoint(c, "reduce", send, recv, 0, false);
}

void check_broadcast(const Communicator& c, const Tensor& send, const Tensor& recv, int root) {
  check_root(c, "broadcast", root);
  check_comm_tensor(c, "broadcast", "recv", recv);
  if (c.rank() != root) return;  // send is ignored off root
  check_comm_tensor(c, "broadcast", "send", send);
  check_same_dtype("broadcast", send, recv);
  DITTO_CHECK(recv.numel() == send.numel(), "Communicator::broadcast: recv: expected ",
              send.numel(), " elements (like the root's send ", send.str(), "), got ", recv.str());
  check_in_place_or_disjoint(c, "broadcast", send, recv, 0, false);
}

void check_all_gather(const Communicator& c, const Tensor& send, const Tensor& recv) {
  check_comm_tensor(c, "all_gather", "send", send);
  check_comm_tensor(c, "all_gather", "recv", recv);
  check_same_dtype("all_gather", send, recv);
  DITTO_CHECK(recv.numel() == c.size() * send.numel(), "Communicator::all_gather: recv: expected ",
              c.size() * send.numel(), " elements (size ", c.size(), " x send's ", send.numel(),
              "), got ", recv.str());
  check_in_place_or_disjoint(c, "all_gather", send, recv, c.rank(), false);
}

void check_reduce_scatter(const Communicator& c, const Tensor& send, const Tensor& recv,
                          ReduceOp op, const double* scalar = nullptr) {
  check_comm_tensor(c, "reduce_scatter", "send", send);
  check_comm_tensor(c, "reduce_scatter", "recv", recv);
  check_same_dtype("reduce_scatter", send, recv);
  DITTO_CHECK(send.numel() == c.size() * recv.numel(),
              "Communicator::reduce_scatter: send: expected ", c.size() * recv.numel(),
              " elements (size ", c.size(), " x recv's ", recv.numel(), "), got ", send.str());
  check_in_place_or_disjoint(c, "reduce_scatter", send, recv, c.rank(), true);
  check_op("reduce_scatter", send.dtype(), op, scalar);
}

// The CommOptions of init_all / init_rank (`fn`): a timeout in (0, kMaxCommTimeoutMs] ms and a
// known determinism.
void check_options(const char* fn, const CommOptions& options) {
  DITTO_CHECK(options.timeout_ms > 0 && options.timeout_ms <= kMaxCommTimeoutMs, fn,
              ": options.timeout_ms: expected a positive number of milliseconds <= ",
              kMaxCommTimeoutMs, " (2^31, about 24.9 days), got ", options.timeout_ms);
  DITTO_CHECK(is_valid_determinism(options.determinism), fn,
              ": options.determinism: expected Determinism::fast or Determinism::bitwise, got "
              "value ",
              static_cast<int>(options.determinism));
}

// The live instance of backend `type` for a new handle, and the registry's generation: the
// instance, then the generation, then the instance held, so that a re-init in between leaves an
// older generation, which only sends the check to the identity compare (Note [Communicators of
// a replaced backend]).
std::pair<std::shared_ptr<Backend>, std::uint64_t> live_backend(const std::string& type) {
  get_backend(type);
  const std::uint64_t generation = detail::backend_generation();
  return {get_backend_ptr(type), generation};
}

}  // namespace

// ---- init -----------------------------------------------------------------------------------

std::vector<Communicator> Communicator::init_all(const std::vector<Device>& devices,
                                                 const CommOptions& options) {
  DITTO_CHECK(!devices.empty(),
              "Communicator::init_all: devices: expected at least one device, got an empty list");
  check_options("Communicator::init_all", options);
  const std::string& type = devices[0].type;
  std::unordered_map<Device, std::size_t> seen;
  std::vector<int> indices;
  indices.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Device& d = devices[i];
    DITTO_CHECK(!d.is_cpu(), "Communicator::init_all: devices[", i,
                "]: expected a device of a GPU backend (sim, cuda), got cpu (the host has no "
                "communicators)");
    DITTO_CHECK(d.type == type, "Communicator::init_all: devices[", i,
                "]: expected a device of backend ", type, " (like devices[0]), got ", d.str());
    auto [it, fresh] = seen.emplace(d, i);
    DITTO_CHECK(fresh, "Communicator::init_all: devices: expected distinct devices, got ", d.str(),
                " twice (at positions ", it->second, " and ", i, ")");
    indices.push_back(d.index);
  }
  const auto [held, generation] = live_backend(type);
  Backend& backend = *held;
  for (std::size_t i = 0; i < devices.size(); ++i)
    DITTO_CHECK(devices[i].index >= 0 && devices[i].index < backend.device_count(),
                "Communicator::init_all: devices[", i, "]: ", devices[i].str(),
                " is out of range (backend ", type, " has ", backend.device_count(), " devices)");

  std::shared_ptr<CommunicatorImpl> impl = backend.create_communicator(indices, options);
  DITTO_ASSERT(impl);
  auto shared_devices = std::make_shared<const std::vector<Device>>(devices);
  std::vector<Communicator> comms;
  comms.reserve(devices.size());
  for (std::size_t r = 0; r < devices.size(); ++r)
    comms.push_back(
        Communicator(held, generation, impl, shared_devices, static_cast<int>(r), options));
  return comms;
}

Communicator Communicator::init_rank(const Device& local_device, int world_size, int rank,
                                     const CommOptions& options) {
  detail::ProcessGroup* group = detail::process_group();
  DITTO_CHECK_T(BackendError, group != nullptr,
                "Communicator::init_rank: no process group: call dist::init() first (in a program "
                "started by mpirun; core/distributed/distributed.h)",
                dist::available() ? "" : "; this build of ditto has no MPI support");
  DITTO_CHECK(world_size == group->size(), "Communicator::init_rank: world_size: expected ",
              group->size(), " (dist::world_size(), the processes of the job), got ", world_size);
  DITTO_CHECK(rank == group->rank(), "Communicator::init_rank: rank: expected ", group->rank(),
              " (dist::rank(), this process's rank), got ", rank);
  DITTO_CHECK(!local_device.is_cpu(),
              "Communicator::init_rank: local_device: expected a device "
              "of a GPU backend (sim, cuda), got cpu (the host has no communicators)");
  check_options("Communicator::init_rank", options);
  const auto [held, generation] = live_backend(local_device.type);
  Backend& backend = *held;
  DITTO_CHECK(local_device.index >= 0 && local_device.index < backend.device_count(),
              "Communicator::init_rank: local_device: ", local_device.str(),
              " is out of range (backend ", local_device.type, " has ", backend.device_count(),
              " devices)");
  std::vector<Device> devices;
  std::shared_ptr<CommunicatorImpl> impl =
      group->create_communicator(backend, local_device.index, options, devices);
  DITTO_ASSERT(impl && static_cast<int>(devices.size()) == world_size);
  Communicator c(held, generation, impl,
                 std::make_shared<const std::vector<Device>>(std::move(devices)), rank, options);
  c.multiprocess_ = true;
  return c;
}

// ---- groups (ncclGroupStart / ncclGroupEnd) ---------------------------------------------------

namespace {

// Note [Overlapping point-to-point buffers in a group]
// The sends and recvs of a group run together, in no defined order (NCCL: calls within a group
// "can be seen as progressing independently"), so a recv whose bytes overlap another send's or
// recv's of the same rank in the same group races with it: tester D's in-place ring shift
// (send(t, r + 1) and recv(t, r - 1) in one group, every rank) gave another wrong result on
// every run, none correct, and so did a recv overlapping half of the send. NCCL leaves this
// undefined; ditto refuses it, as it refuses the other overlaps it cannot run (all_to_all,
// partial overlaps in the collectives, all_to_all_v's blocks): inside a group of this thread
// (until the outermost group_end), a recv that overlaps an earlier send or recv of the same rank
// of the same communicator, or a send that overlaps an earlier recv, is refused with an
// InvalidArgument naming both (sends of one buffer only read it, and run; so do calls of
// different groups, which run in order). The group keeps, per (communicator, rank), the recvs by
// first byte (disjoint, so one ordered-map lookup finds an overlap) and the union of the sends'
// byte ranges (merged as they come), with the tensors for the message: O(log n) per call, nothing
// outside a group. SPMD ranks (a thread or process each) keep their own calls in their own
// thread's group; a single controller keeps every rank's in its one thread. Only point-to-point
// calls are kept: a collective in the same group as a send or recv over the same memory is not
// checked.
struct P2PCall {
  Tensor tensor;  // held until group_end: its bytes cannot be reused by another call meanwhile
  int peer = 0;
};
struct RankP2P {
  std::map<std::uintptr_t, std::pair<std::uintptr_t, P2PCall>> recvs;  // first -> (end, call)
  std::map<std::uintptr_t, std::uintptr_t> sent;  // the union of the sends: first -> end
  std::vector<P2PCall> sends;                     // to name the one a recv overlaps
};

// This thread's open group: nesting depth, the communicators told about it, in order, and the
// point-to-point calls of each (communicator, rank) (Note [Overlapping point-to-point buffers in
// a group]).
struct ThreadGroup {
  int depth = 0;
  std::vector<std::shared_ptr<CommunicatorImpl>> impls;
  std::map<std::pair<const void*, int>, RankP2P> p2p;
};
thread_local ThreadGroup t_group;

// The entry of the disjoint ranges `m` (first -> end, or first -> (end, ...)) that overlaps
// [first, end), or m.end().
template <typename Map>
typename Map::const_iterator find_overlap(const Map& m, std::uintptr_t first, std::uintptr_t end) {
  auto end_of = [](const auto& entry) {
    if constexpr (std::is_same_v<typename Map::mapped_type, std::uintptr_t>)
      return entry.second;
    else
      return entry.second.first;
  };
  auto it = m.upper_bound(first);
  if (it != m.begin() && end_of(*std::prev(it)) > first) return std::prev(it);
  if (it != m.end() && it->first < end) return it;
  return m.end();
}

// Ends the outermost group: group_end() on every communicator of the group, first error rethrown.
void end_group_impls() {
  std::vector<std::shared_ptr<CommunicatorImpl>> impls = std::move(t_group.impls);
  t_group.impls.clear();
  t_group.p2p.clear();
  std::exception_ptr first;
  for (auto& impl : impls) {
    try {
      impl->group_end();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

bool detail::thread_in_group() { return t_group.depth > 0; }

void detail::check_p2p_in_group(const Communicator& c, const char* call, const Tensor& t,
                                int peer) {
  if (t_group.depth == 0 || t.nbytes() == 0) return;
  const bool is_recv = std::strcmp(call, "recv") == 0;
  RankP2P& mine = t_group.p2p[{&c.devices(), c.rank()}];
  const auto first = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  const std::uintptr_t end = first + t.nbytes();
  const P2PCall* other = nullptr;  // the earlier call t overlaps, if any
  bool other_is_recv = true;
  if (auto it = find_overlap(mine.recvs, first, end); it != mine.recvs.end()) {
    other = &it->second.second;
  } else if (is_recv && find_overlap(mine.sent, first, end) != mine.sent.end()) {
    other_is_recv = false;
    for (const P2PCall& s : mine.sends)
      if (ranges_overlap(s.tensor.data_ptr(), s.tensor.nbytes(), t.data_ptr(), t.nbytes())) {
        other = &s;
        break;
      }
  }
  if (other != nullptr) {
    const auto o_first = reinterpret_cast<std::uintptr_t>(other->tensor.data_ptr());
    const std::uintptr_t shared_first = std::max(first, o_first) - o_first;
    const std::uintptr_t shared_end = std::min(end, o_first + other->tensor.nbytes()) - o_first;
    DITTO_CHECK(false, "Communicator::", call,
                ": tensor: expected a tensor that does not overlap the ",
                other_is_recv ? "recv from" : "send to", " rank ", other->peer,
                " earlier in this group on ", rank_str(c),
                " (the sends and recvs of a group run in no defined order, as NCCL's between "
                "ncclGroupStart and ncclGroupEnd: the two would race), got ",
                t.str(), " sharing bytes [", shared_first, ", ", shared_end, ") of that ",
                other_is_recv ? "recv" : "send", "'s ", other->tensor.str());
  }
  if (is_recv) {
    mine.recvs.emplace(first, std::make_pair(end, P2PCall{t, peer}));
    return;
  }
  mine.sends.push_back(P2PCall{t, peer});
  // Merge [first, end) into the union of the sends.
  std::uintptr_t lo = first, hi = end;
  auto it = mine.sent.upper_bound(lo);
  if (it != mine.sent.begin() && std::prev(it)->second >= lo) --it;
  while (it != mine.sent.end() && it->first <= hi) {
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second);
    it = mine.sent.erase(it);
  }
  mine.sent.emplace(lo, hi);
}

void group_start() { ++t_group.depth; }

void group_end() {
  DITTO_CHECK(t_group.depth > 0,
              "group_end: expected a matching group_start() on this thread, got none open");
  if (--t_group.depth > 0) return;
  end_group_impls();
}

void Communicator::join_group() const {
  if (t_group.depth == 0) return;
  if (std::find(t_group.impls.begin(), t_group.impls.end(), impl_) != t_group.impls.end()) return;
  impl_->group_start();
  t_group.impls.push_back(impl_);
}

// ---- per-rank collectives ---------------------------------------------------------------------

Stream& Communicator::stream() const {
  detail::check_comm_live(*this, "Communicator::stream");
  return current_stream(device());
}

void Communicator::abort(const std::string& reason) const noexcept { impl_->abort(rank_, reason); }

void Communicator::check_tensor(const char* call, const char* arg, const Tensor& t) const {
  check_comm_tensor(*this, call, arg, t);
}

// Every per-rank collective ends here: one call record, one backend entry point.
void Communicator::submit(const detail::CollectiveCall& call) {
  join_group();
  impl_->enqueue(rank_, stream(), call);
}

void Communicator::all_reduce(const Tensor& send, Tensor& recv, ReduceOp op) {
  detail::check_comm_live(*this, "Communicator::all_reduce");
  detail::check_or_abort(*this, [&] { check_all_reduce(*this, send, recv, op); });
  submit(call_record(Kind::all_reduce, send.data_ptr(), recv.data_ptr(), send.numel(), send.dtype(),
                     op));
}

void Communicator::all_reduce(Tensor& tensor, ReduceOp op) { all_reduce(tensor, tensor, op); }

void Communicator::reduce(const Tensor& send, Tensor& recv, ReduceOp op, int root) {
  detail::check_comm_live(*this, "Communicator::reduce");
  detail::check_or_abort(*this, [&] { check_reduce(*this, send, recv, op, root); });
  submit(detail::rooted_call(Kind::reduce, rank_ == root, send, recv, op, root));
}

void Communicator::broadcast(const Tensor& send, Tensor& recv, int root) {
  detail::check_comm_live(*this, "Communicator::broadcast");
  detail::check_or_abort(*this, [&] { check_broadcast(*this, send, recv, root); });
  submit(detail::rooted_call(Kind::broadcast, rank_ == root, send, recv, ReduceOp::sum, root));
}

void Communicator::broadcast(Tensor& tensor, int root) { broadcast(tensor, tensor, root); }

void Communicator::all_gather(const Tensor& send, Tensor& recv) {
  detail::check_comm_live(*this, "Communicator::all_gather");
  detail::check_or_abort(*this, [&] { check_all_gather(*this, send, recv); });
  submit(
      call_record(Kind::all_gather, send.data_ptr(), recv.data_ptr(), send.numel(), send.dtype()));
}

void Communicator::reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op) {
  detail::check_comm_live(*this, "Communicator::reduce_scatter");
  detail::check_or_abort(*this, [&] { check_reduce_scatter(*this, send, recv, op); });
  submit(call_record(Kind::reduce_scatter, send.data_ptr(), recv.data_ptr(), recv.numel(),
                     recv.dtype(), op));
}

void Communicator::barrier() {
  detail::check_comm_live(*this, "Communicator::barrier");
  submit({});
}

// ---- premul_sum (ncclRedOpCreatePreMulSum) ----------------------------------------------------

void Communicator::all_reduce(const Tensor& send, Tensor& recv, PreMulSum op) {
  detail::check_comm_live(*this, "Communicator::all_reduce");
  detail::check_or_abort(
      *this, [&] { check_all_reduce(*this, send, recv, ReduceOp::premul_sum, &op.scalar); });
  submit(call_record(Kind::all_reduce, send.data_ptr(), recv.data_ptr(), send.numel(), send.dtype(),
                     ReduceOp::premul_sum, 0, op.scalar));
}

void Communicator::reduce(const Tensor& send, Tensor& recv, PreMulSum op, int root) {
  detail::check_comm_live(*this, "Communicator::reduce");
  detail::check_or_abort(
      *this, [&] { check_reduce(*this, send, recv, ReduceOp::premul_sum, root, &op.scalar); });
  submit(detail::rooted_call(Kind::reduce, rank_ == root, send, recv, ReduceOp::premul_sum, root,
                             op.scalar));
}

void Communicator::reduce_scatter(const Tensor& send, Tensor& recv, PreMulSum op) {
  detail::check_comm_live(*this, "Communicator::reduce_scatter");
  detail::check_or_abort(
      *this, [&] { check_reduce_scatter(*this, send, recv, ReduceOp::premul_sum, &op.scalar); });
  submit(call_record(Kind::reduce_scatter, send.data_ptr(), recv.data_ptr(), recv.numel(),
                     recv.dtype(), ReduceOp::premul_sum, 0, op.scalar));
}

// ---- single-controller forms ------------------------------------------------------------------

using detail::check_group;
using detail::each_rank;
using detail::single_controller;

DITTO_SEND_RECV_GROUP_FORM(all_reduce, (, ReduceOp op), (, op))
DITTO_SEND_RECV_GROUP_FORM(all_gather, (), ())
DITTO_SEND_RECV_GROUP_FORM(reduce_scatter, (, ReduceOp op), (, op))
DITTO_SEND_RECV_GROUP_FORM(reduce, (, ReduceOp op, int root), (, op, root))

void all_reduce(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, ReduceOp op) {
  all_reduce(comms, tensors, tensors, op);
}

void broadcast(std::vector<Communicator>& comms, std::vector<Tensor>& tensors, int root) {
  single_controller(
      "broadcast", comms, {{"tensors", tensors.size()}},
      [&](std::size_t i) { check_broadcast(comms[i], tensors[i], tensors[i], root); },
      [&](std::size_t i) { comms[i].broadcast(tensors[i], root); });
}

namespace {
// The PreMulSum forms: as DITTO_SEND_RECV_GROUP_FORM's, with ops[i] for rank i.
template <typename Check, typename Issue>
void premul_sum_group(const char* call, std::vector<Communicator>& comms,
                      const std::vector<Tensor>& send, std::vector<Tensor>& recv,
                      const std::vector<PreMulSum>& ops, const Check& check, const Issue& issue) {
  check_group(call, comms, {{"send", send.size()}, {"recv", recv.size()}});
  check_group(call, comms, {{"ops", ops.size()}}, "PreMulSum values");
  each_rank(
      comms,
      [&](std::size_t i) {
        check(comms[i], send[i], recv[i], ReduceOp::premul_sum, &ops[i].scalar);
      },
      [&](std::size_t i) { issue(comms[i], send[i], recv[i], ops[i]); });
}
}  // namespace

void all_reduce(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                std::vector<Tensor>& recv, const std::vector<PreMulSum>& ops) {
  premul_sum_group("all_reduce", comms, send, recv, ops, check_all_reduce,
                   [](Communicator& c, auto&... a) { c.all_reduce(a...); });
}

void reduce_scatter(std::vector<Communicator>& comms, const std::vector<Tensor>& send,
                    std::vector<Tensor>& recv, const std::vector<PreMulSum>& ops) {
  premul_sum_group("reduce_scatter", comms, send, recv, ops, check_reduce_scatter,
                   [](Communicator& c, auto&... a) { c.reduce_scatter(a...); });
}

void synchronize(std::vector<Communicator>& comms) {
  for (const Communicator& c : comms) detail::check_comm_live(c, "synchronize");
  std::exception_ptr first;
  for (auto& c : comms) {
    try {
      c.stream().synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace ditto
