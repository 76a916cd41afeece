// NCCL pieces shared by the CUDA communicators (cuda_nccl.h): the NCCL error check, scoped
// groups, one rank's native call, and the bitwise block algorithm's NCCL transport.
#include "backend_cuda/cuda_nccl.h"

#include <dlfcn.h>

#include <chrono>
#include <thread>
#include <utility>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_comm_kernels.h"
#include "backend_cuda/cuda_host_logic.h"
#include "core/base/error.h"
#include "core/numerics/float_formats.h"

namespace ditto::cuda {

// Note [NCCL newer than the library]
// ncclAlltoAll, ncclGather and ncclScatter are NCCL 2.28's. ditto is built against whatever
// nccl.h the build finds (2.28 in CI), but on a GPU machine libnccl.so.2 is the one on
// LD_LIBRARY_PATH, often a PyTorch wheel's (docs/cuda.md, tools/gpu-check.sh), which may be
// older: a direct call would be an undefined symbol there, failing the program at load (or at the
// first call, with lazy binding), although ncclSend / ncclRecv do the same work. So ditto never
// references the three by name: the first all_to_all / gather / scatter looks them up (dlsym) in
// the libnccl that defines the ncclGetVersion ditto calls, and asks it its version;
// nccl_rooted_path (cuda_host_logic.h) then picks NCCL's calls, or one ncclSend / ncclRecv per peer
// in a group when the library lacks them (older headers: always). Decided once per process,
// silently. A libnccl linked statically (no dynamic symbols) takes the ncclSend / ncclRecv path.
// Every other NCCL function ditto calls is older than 2.19 (ncclCommInitRankConfig and
// ncclCommFinalize 2.14, ncclGetLastError 2.13, ncclRedOpCreatePreMulSum 2.11); fp8 moves as
// ncclUint8 on any NCCL, and only NCCL's own fp8 reductions need 2.24 (Note [NCCL fp8],
// cuda_host_logic.h: check_nccl_dtype refuses them before, naming the versions).

namespace {

using NcclAllToAllFn = ncclResult_t (*)(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t,
                                        cudaStream_t);
using NcclRootedFn = ncclResult_t (*)(const void*, void*, std::size_t, ncclDataType_t, int,
                                      ncclComm_t, cudaStream_t);

/// NCCL 2.28's calls in the library this process runs (Note [NCCL newer than the library]):
/// all three, or all null.
struct NcclRootedCalls {
  NcclAllToAllFn all_to_all = nullptr;
  NcclRootedFn gather = nullptr;
  NcclRootedFn scatter = nullptr;
};

/// `name` in the shared object that defines the ncclGetVersion this code calls (else, when that
/// object cannot be named, in the process's global scope), or nullptr.
void* nccl_symbol(const char* name) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) != 0 && info.dli_fname) {
    if (void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
      void* p = dlsym(lib, name);
      dlclose(lib);  // drops the reference RTLD_NOLOAD took; the library stays loaded
      return p;
    }
  }
  return dlsym(RTLD_DEFAULT, name);
}

const NcclRootedCalls& nccl_rooted_calls() {
  static const NcclRootedCalls calls = [] {
    NcclRootedCalls c;
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess) version = 0;
    void* a = nccl_symbol("ncclAlltoAll");
    void* g = nccl_symbol("ncclGather");
    void* s = nccl_symbol("ncclScatter");
    if (nccl_rooted_path(version, a && g && s) == NcclRootedPath::native) {
      c.all_to_all = reinterpret_cast<NcclAllToAllFn>(a);
      c.gather = reinterpret_cast<NcclRootedFn>(g);
      c.scatter = reinterpret_cast<NcclRootedFn>(s);
    }
    return c;
  }();
  return calls;
}

}  // namespace

bool nccl_has_rooted_calls() { return nccl_rooted_calls().all_to_all != nullptr; }

int nccl_runtime_version() {
  static const int version = [] {
    int v = 0;
    return ncclGetVersion(&v) == ncclSuccess ? v : 0;
  }();
  return version;
}

void check_nccl_dtype(const detail::CollectiveCall& c, const std::string& where) {
  check_nccl_reduction_dtype(c.kind, c.dtype, NCCL_VERSION_CODE, nccl_runtime_version(), where);
}

void throw_nccl_error(ncclResult_t result, const char* call, const char* file, int line,
                      const std::string& where) {
  std::string f = file ? file : "?";
  std::size_t at = f.rfind("backend_cuda/");
  if (at != std::string::npos) f = f.substr(at);
  const char* last = ncclGetLastError(nullptr);
  std::string msg =
      detail::cat(where, ": ", call, " failed at ", f, ":", line, ": ", ncclGetErrorString(result));
  if (last && *last) msg += detail::cat(" (", last, ")");
  throw BackendError(msg);
}

NcclGroup::NcclGroup(std::string where, std::vector<ncclComm_t> nonblocking)
    : where_(std::move(where)), nonblocking_(std::move(nonblocking)) {
  DITTO_NCCL_CHECK(ncclGroupStart(), where_);
}

NcclGroup::~NcclGroup() {
  if (open_) (void)ncclGroupEnd();
}

void NcclGroup::end() {
  open_ = false;
  const ncclResult_t r = ncclGroupEnd();
  if (r == ncclInProgress && !nonblocking_.empty()) {
    for (ncclComm_t c : nonblocking_) nccl_settle(c, r, "ncclGroupEnd()", where_);
    return;
  }
  DITTO_NCCL_CHECK(r, where_);
}

void nccl_settle(ncclComm_t comm, ncclResult_t r, const char* call, const std::string& where,
                 std::int64_t timeout_ms) {
  const auto start = std::chrono::steady_clock::now();
  while (r == ncclInProgress) {
    if (timeout_ms > 0 &&
        std::chrono::steady_clock::now() - start > std::chrono::milliseconds(timeout_ms))
      throw Timeout(detail::cat(where, ": ", call, " did not complete within ", timeout_ms,
                                " ms (ncclCommGetAsyncError still ncclInProgress)"));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) throw_nccl_error(r, call, __FILE__, __LINE__, where);
}

NcclRedOp::NcclRedOp(ReduceOp op, double scalar, DType dtype, ncclComm_t comm,
                     const std::string& where)
    : op_(nccl_op(op)) {
  if (op != ReduceOp::premul_sum) return;
  visit_dtype(dtype, [&](auto x) {
    using T = decltype(x);
    T value = convert<T>(scalar);  // integers: core checked it is integral and representable
    // A non-blocking communicator (cuda_communicator_mpi.cpp) may answer ncclInProgress.
    nccl_settle(
        comm,
        ncclRedOpCreatePreMulSum(&op_, &value, nccl_type(dtype), ncclScalarHostImmediate, comm),
        "ncclRedOpCreatePreMulSum", where);
  });
  comm_ = comm;
}

NcclRedOp::NcclRedOp(NcclRedOp&& o) noexcept : op_(o.op_), comm_(o.comm_) { o.comm_ = nullptr; }

NcclRedOp::~NcclRedOp() {
  if (comm_) (void)ncclRedOpDestroy(op_, comm_);
}

NcclRedOp nccl_op_for(const detail::CollectiveCall& c, ncclComm_t comm, const std::string& where) {
  check_nccl_dtype(c, where);  // before NCCL is asked (ncclRedOpCreatePreMulSum of fp8 too)
  return NcclRedOp(detail::uses_op(c.kind) ? c.op : ReduceOp::sum, c.scalar, c.dtype, comm, where);
}

NcclRedOp nccl_native(const detail::CollectiveCall& c, ncclComm_t comm, cudaStream_t stream,
                      float* barrier_buf, const std::string& where) {
  NcclRedOp op = nccl_op_for(c, comm, where);
  nccl_enqueue(c, op, comm, stream, barrier_buf, where);
  return op;
}

void nccl_enqueue(const detail::CollectiveCall& c, const NcclRedOp& op, ncclComm_t comm,
                  cudaStream_t stream, float* barrier_buf, const std::string& where) {
  using Kind = detail::CollectiveKind;
  const auto count = static_cast<std::size_t>(c.count);
  // fp8 data movement as ncclUint8 (Note [NCCL fp8]); the reductions keep the type.
  const ncclDataType_t type = nccl_type(nccl_wire_dtype(c.kind, c.dtype));
  const std::size_t elem = dtype_size(c.dtype);
  // Buffers NCCL ignores off the root are null there (recv of reduce and gather, send of
  // broadcast and scatter); NCCL's argument checks get the other one.
  void* send = const_cast<void*>(c.send);
  void* recv = c.recv;
  void* const root_recv = recv ? recv : send;
  void* const root_send = send ? send : recv;
  switch (c.kind) {
    case Kind::all_reduce:
      DITTO_NCCL_CHECK(ncclAllReduce(send, recv, count, type, op.get(), comm, stream), where);
      break;
    case Kind::reduce:
      DITTO_NCCL_CHECK(ncclReduce(send, root_recv, count, type, op.get(), c.root, comm, stream),
                       where);
      break;
    case Kind::broadcast:
      DITTO_NCCL_CHECK(ncclBroadcast(root_send, recv, count, type, c.root, comm, stream), where);
      break;
    case Kind::all_gather:
      DITTO_NCCL_CHECK(ncclAllGather(send, recv, count, type, comm, stream), where);
      break;
    case Kind::reduce_scatter:
      DITTO_NCCL_CHECK(ncclReduceScatter(send, recv, count, type, op.get(), comm, stream), where);
      break;
    case Kind::all_to_all:
    case Kind::gather:
    case Kind::scatter: {
      // NCCL's own calls where the loaded library has them (Note [NCCL newer than the library])
      const NcclRootedCalls& native = nccl_rooted_calls();
      if (native.all_to_all && c.kind == Kind::all_to_all) {
        DITTO_NCCL_CHECK(native.all_to_all(send, recv, count, type, comm, stream), where);
        break;
      }
      if (native.gather && c.kind == Kind::gather) {
        DITTO_NCCL_CHECK(native.gather(send, root_recv, count, type, c.root, comm, stream), where);
        break;
      }
      if (native.scatter && c.kind == Kind::scatter) {
        DITTO_NCCL_CHECK(native.scatter(root_send, recv, count, type, c.root, comm, stream), where);
        break;
      }
      // Else (NCCL before 2.28) the same with ncclSend / ncclRecv per peer.
      int n = 0, me = 0;
      DITTO_NCCL_CHECK(ncclCommCount(comm, &n), where);
      DITTO_NCCL_CHECK(ncclCommUserRank(comm, &me), where);
      const std::size_t block = count * elem;
      for (int q = 0; q < n; ++q) {
        const auto qb = static_cast<std::size_t>(q) * block;
        if (c.kind == Kind::all_to_all || (c.kind == Kind::scatter && me == c.root))
          DITTO_NCCL_CHECK(ncclSend(static_cast<char*>(send) + qb, count, type, q, comm, stream),
                           where);
        if (c.kind == Kind::gather && q == c.root)
          DITTO_NCCL_CHECK(ncclSend(send, count, type, q, comm, stream), where);
        if (c.kind == Kind::all_to_all || (c.kind == Kind::gather && me == c.root))
          DITTO_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + qb, count, type, q, comm, stream),
                           where);
        if (c.kind == Kind::scatter && q == c.root)
          DITTO_NCCL_CHECK(ncclRecv(recv, count, type, q, comm, stream), where);
      }
      break;
    }
    case Kind::all_to_all_v:  // MPI_Alltoallv: one send and one recv per peer with data
      for (std::size_t q = 0; q < c.send_counts.size(); ++q) {
        const int peer = static_cast<int>(q);
        if (c.send_counts[q] > 0)
          DITTO_NCCL_CHECK(
              ncclSend(static_cast<char*>(send) + c.send_displs[q] * elem,
                       static_cast<std::size_t>(c.send_counts[q]), type, peer, comm, stream),
              where);
        if (c.recv_counts[q] > 0)
          DITTO_NCCL_CHECK(
              ncclRecv(static_cast<char*>(recv) + c.recv_displs[q] * elem,
                       static_cast<std::size_t>(c.recv_counts[q]), type, peer, comm, stream),
              where);
      }
      break;
    case Kind::send:
      DITTO_NCCL_CHECK(ncclSend(send, count, type, c.peer, comm, stream), where);
      break;
    case Kind::recv:
      DITTO_NCCL_CHECK(ncclRecv(recv, count, type, c.peer, comm, stream), where);
      break;
    case Kind::barrier:
      DITTO_NCCL_CHECK(
          ncclAllReduce(barrier_buf, barrier_buf, 1, ncclFloat32, ncclSum, comm, stream), where);
      break;
  }
}

// ---- NcclTransport ------------------------------------------------------------------------------

NcclTransport::NcclTransport(CudaBackend& backend, int n, std::vector<Rank> ranks, DType dtype,
                             ReduceOp op, std::vector<double> scalars)
    : backend_(backend),
      ranks_(std::move(ranks)),
      index_(static_cast<std::size_t>(n), -1),
      scratch_(ranks_.size(), nullptr),
      dtype_(dtype),
      op_(op),
      scalars_(std::move(scalars)),
      elem_(dtype_size(dtype)) {
  for (std::size_t i = 0; i < ranks_.size(); ++i)
    index_[static_cast<std::size_t>(ranks_[i].rank)] = static_cast<int>(i);
}

NcclTransport::~NcclTransport() {
  group_.reset();  // a phase cut short by an error: ncclGroupEnd first
  // Stream-ordered frees, after everything the collective enqueued on the ranks' streams.
  for (std::size_t i = 0; i < ranks_.size(); ++i)
    if (scratch_[i])
      backend_.deallocate_on(ranks_[i].device, scratch_[i], scratch_bytes_, ranks_[i].stream);
}

void NcclTransport::reserve_scratch(std::int64_t elems) {
  scratch_bytes_ = static_cast<std::size_t>(elems) * elem_;
  for (std::size_t i = 0; i < ranks_.size(); ++i)
    scratch_[i] = backend_.allocate_on(ranks_[i].device, scratch_bytes_, ranks_[i].stream);
}

void NcclTransport::begin_phase() {
  std::vector<ncclComm_t> comms;
  for (const Rank& k : ranks_) comms.push_back(k.comm);
  group_.emplace(*ranks_[0].where, std::move(comms));
}

void NcclTransport::end_phase() {
  group_->end();
  group_.reset();
}

void* NcclTransport::ptr(const BlockRef& b) const {
  const Rank& k = rank(b.rank);
  const auto off = static_cast<std::size_t>(b.offset) * elem_;
  switch (b.buffer) {
    case Buffer::send: return static_cast<char*>(const_cast<void*>(k.send)) + off;
    case Buffer::recv: return static_cast<char*>(k.recv) + off;
    case Buffer::scratch:
      return static_cast<char*>(scratch_[static_cast<std::size_t>(index_[b.rank])]) + off;
  }
  return nullptr;
}

void NcclTransport::copy(const BlockRef& from, const BlockRef& to, std::int64_t len) {
  const ncclDataType_t type = nccl_type(nccl_move_dtype(dtype_));  // fp8 as bytes: any NCCL
  const auto n = static_cast<std::size_t>(len);
  if (local(from.rank)) {
    const Rank& k = rank(from.rank);
    DITTO_NCCL_CHECK(ncclSend(ptr(from), n, type, to.rank, k.comm, k.stream), *k.where);
  }
  if (local(to.rank)) {
    const Rank& k = rank(to.rank);
    DITTO_NCCL_CHECK(ncclRecv(ptr(to), n, type, from.rank, k.comm, k.stream), *k.where);
  }
}

void NcclTransport::all_gather_recv(int r, std::int64_t per) {
  const Rank& k = rank(r);
  DITTO_NCCL_CHECK(
      ncclAllGather(ptr({r, Buffer::recv, r * per}), k.recv, static_cast<std::size_t>(per),
                    nccl_type(nccl_move_dtype(dtype_)), k.comm, k.stream),
      *k.where);
}

void NcclTransport::reduce(int r, const std::vector<BlockRef>& srcs, const BlockRef& dst,
                           std::int64_t len) {
  const Rank& k = rank(r);
  std::vector<const void*> src_ptrs;
  src_ptrs.reserve(srcs.size());
  for (const BlockRef& b : srcs) src_ptrs.push_back(ptr(b));
  DeviceGuard g(k.physical);
  DITTO_CUDA_CHECK(launch_comm_reduce(k.stream, src_ptrs, {ptr(dst)}, len, dtype_, op_,
                                      scalars_.empty() ? nullptr : scalars_.data()),
                   *k.where);
}

}  // namespace ditto::cuda
