// The MPI process group (dist::init / finalize, Communicator::init_rank's bootstrap) and the MPI
// plumbing the multi-process communicators share (core/internal/mpi_transport.h). Compiled only with
// DITTO_WITH_MPI.
#include <algorithm>
#include <cstring>
#include <thread>

#include "core/internal/backend_init.h"
#include "core/internal/mpi_transport.h"
#include "core/internal/process_group.h"

namespace ditto {
namespace detail::mpi {

void throw_mpi_error(int rc, const char* call, const char* file, int line,
                     const std::string& where) {
  std::string f = file ? file : "?";
  for (const char* dir : {"core/", "backend_sim/", "backend_cuda/"})
    if (std::size_t at = f.rfind(dir); at != std::string::npos) {
      f = f.substr(at);
      break;
    }
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "error %d", rc);
  throw BackendError(cat(where, ": ", call, " failed at ", f, ":", line, ": ", text));
}

bool wait_until(std::vector<MPI_Request>& reqs, Clock::time_point deadline,
                const std::string& where) {
  std::vector<int> done(reqs.size());
  int polls = 0;
  for (;;) {
    int outcount = 0;
    DITTO_MPI_CHECK(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount,
                                 done.data(), MPI_STATUSES_IGNORE),
                    where);
    if (outcount == MPI_UNDEFINED) return true;  // no active request left
    if (outcount > 0) {
      polls = 0;
      continue;
    }
    if (Clock::now() >= deadline) return false;
    // Back off: a waiting rank must not starve the others of the cores (Note [Timeouts over MPI]).
    ++polls;
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (polls - 63))));
  }
}

MPI_Datatype mpi_type(DType dtype) { return dtype == DType::f32 ? MPI_FLOAT : MPI_INT64_T; }

// ---- MpiLink ------------------------------------------------------------------------------------

namespace {

// One rank's call as sent to the others (trivially copyable; MPI_BYTE), or its abort notice
// (kind == kAbortKind, with the reason).
struct WireCall {
  std::uint64_t seq;
  std::int64_t count;
  std::int32_t kind, dtype, op, root;
  char reason[256];
};
constexpr std::int32_t kAbortKind = 255;

constexpr int kCallTag = 1;

std::string ranks_str(const std::vector<int>& ranks) {
  std::string who = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) who += (i ? ", " : "") + std::to_string(ranks[i]);
  return who;
}

}  // namespace

MpiLink::MpiLink(MPI_Comm comm, const CommOptions& options, std::string what)
    : comm_(comm), options_(options) {
  DITTO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_), what);
  DITTO_MPI_CHECK(MPI_Comm_size(comm_, &size_), what);
  where_ = cat(what, ", rank ", rank_, " of ", size_, " (MPI)");
}

MpiLink::~MpiLink() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // An aborted link may have requests pending on comm_ (Note [Timeouts over MPI]): leave it.
  if (!finalized && !aborted_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::string MpiLink::label(CollectiveKind kind, std::uint64_t seq) {
  return cat(collective_name(kind), " (collective #", seq, " on this communicator)");
}

void MpiLink::throw_if_aborted(CollectiveKind kind) const {
  std::lock_guard lk(mu_);
  if (!aborted_) return;
  throw PeerFailure(
      cat(collective_name(kind), ": communicator aborted by an earlier error: ", abort_reason_),
      failed_rank_);
}

void MpiLink::abort(std::string reason, bool timeout) {
  std::lock_guard lk(mu_);
  aborted_ = true;
  abort_timeout_ = timeout;
  abort_reason_ = std::move(reason);
}

std::vector<CollectiveCall> MpiLink::start(const CollectiveCall& call, std::uint64_t& seq) {
  throw_if_aborted(call.kind);
  int finalized = 0;
  MPI_Finalized(&finalized);
  DITTO_CHECK_T(BackendError, !finalized, collective_name(call.kind),
                ": MPI was finalized (dist::finalize) while this communicator was alive");
  seq = ++seq_;
  const std::string lbl = label(call.kind, seq);
  std::vector<CollectiveCall> calls(static_cast<std::size_t>(size_));
  calls[static_cast<std::size_t>(rank_)] = call;
  if (size_ == 1) return calls;

  // Buffers live on the heap: after a timeout, pending requests may still use them.
  auto mine = std::make_shared<WireCall>(WireCall{seq, call.count, static_cast<int>(call.kind),
                                                  static_cast<int>(call.dtype),
                                                  static_cast<int>(call.op), call.root, {}});
  auto theirs = std::make_shared<std::vector<WireCall>>(static_cast<std::size_t>(size_));
  std::vector<MPI_Request> recvs(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sends(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    DITTO_MPI_CHECK(MPI_Irecv(&(*theirs)[static_cast<std::size_t>(q)], sizeof(WireCall), MPI_BYTE,
                              q, kCallTag, comm_, &recvs[static_cast<std::size_t>(q)]),
                    where_);
    DITTO_MPI_CHECK(MPI_Isend(mine.get(), sizeof(WireCall), MPI_BYTE, q, kCallTag, comm_,
                              &sends[static_cast<std::size_t>(q)]),
                    where_);
  }
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  // Wait for every call, but stop at the first abort notice.
  auto notice = [&]() -> int {
    for (int q = 0; q < size_; ++q)
      if (q != rank_ && recvs[static_cast<std::size_t>(q)] == MPI_REQUEST_NULL &&
          (*theirs)[static_cast<std::size_t>(q)].kind == kAbortKind)
        return q;
    return -1;
  };
  bool arrived = false;
  int failed = -1;
  for (;;) {
    arrived = wait_until(recvs, std::min(deadline, Clock::now() + std::chrono::milliseconds(20)),
                         where_);
    failed = notice();
    if (arrived || failed >= 0 || Clock::now() >= deadline) break;
    std::lock_guard lk(mu_);
    if (aborted_) break;  // this rank failed meanwhile (abort_by_rank from another thread)
  }
  if (!arrived && failed < 0) {
    std::unique_lock lk(mu_);
    if (aborted_) {
      std::string reason = abort_reason_;
      const int failed_rank = failed_rank_;
      orphans_.push_back(mine);
      orphans_.push_back(theirs);
      lk.unlock();
      for (MPI_Request& r : recvs)
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      if (failed_rank >= 0) throw PeerFailure(cat(lbl, ": ", reason), failed_rank);
      throw BackendError(cat(lbl, ": ", reason));
    }
  }
  if (failed >= 0) {
    const WireCall& w = (*theirs)[static_cast<std::size_t>(failed)];
    std::string reason = cat("rank ", failed, " failed: ",
                             std::string(w.reason, strnlen(w.reason, sizeof w.reason)));
    for (MPI_Request& r : recvs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    {
      std::lock_guard lk(mu_);
      orphans_.push_back(mine);
      orphans_.push_back(theirs);
      if (!aborted_) {
        aborted_ = true;
        abort_by_rank_ = true;
        failed_rank_ = failed;
        abort_reason_ = reason;
      }
    }
    throw PeerFailure(cat(lbl, ": ", reason), failed);
  }
  if (!arrived) {
    std::vector<int> missing;
    for (int q = 0; q < size_; ++q)
      if (recvs[static_cast<std::size_t>(q)] != MPI_REQUEST_NULL) missing.push_back(q);
    std::string reason = cat(lbl, ": timed out after ", options_.timeout_ms, " ms waiting for ",
                             ranks_str(missing), " (communicator of ", size_,
                             " ranks in MPI processes; it is now aborted)");
    for (MPI_Request& r : recvs)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    {
      std::lock_guard lk(mu_);
      orphans_.push_back(mine);
      orphans_.push_back(theirs);
    }
    abort(reason, true);
    throw Timeout(reason);
  }
  if (!wait_until(sends, deadline, where_)) {  // everyone's call came, so ours goes out too
    std::string reason = cat(lbl, ": timed out after ", options_.timeout_ms,
                             " ms sending this rank's call to the others (it is now aborted)");
    {
      std::lock_guard lk(mu_);
      orphans_.push_back(mine);
    }
    abort(reason, true);
    throw Timeout(reason);
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const WireCall& w = (*theirs)[static_cast<std::size_t>(q)];
    DITTO_CHECK_T(InternalError, w.seq == seq, lbl, ": rank ", q, " sent the call of collective #",
                  w.seq);
    CollectiveCall& c = calls[static_cast<std::size_t>(q)];
    c.kind = static_cast<CollectiveKind>(w.kind);
    c.count = w.count;
    c.dtype = static_cast<DType>(w.dtype);
    c.op = static_cast<ReduceOp>(w.op);
    c.root = w.root;
  }
  std::string mismatch = find_call_mismatch(calls, seq);
  if (!mismatch.empty()) throw InvalidArgument(mismatch);
  return calls;
}

void MpiLink::abort_by_rank(const std::string& reason) noexcept {
  try {
    std::lock_guard lk(mu_);
    if (aborted_) return;  // the first reason stays
    aborted_ = true;
    abort_by_rank_ = true;
    failed_rank_ = rank_;
    abort_reason_ = cat("rank ", rank_, " failed: ", reason);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized || size_ == 1) return;
    auto notice = std::make_shared<WireCall>();
    std::memset(notice.get(), 0, sizeof(WireCall));
    notice->seq = seq_.load() + 1;
    notice->kind = kAbortKind;
    std::strncpy(notice->reason, reason.c_str(), sizeof notice->reason - 1);
    orphans_.push_back(notice);  // the sends complete whenever the others receive
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(notice.get(), sizeof(WireCall), MPI_BYTE, q, kCallTag, comm_, &req) ==
          MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  } catch (...) {  // allocation failure: the flag is what matters
    aborted_ = true;
  }
}

void MpiLink::wait(std::vector<MPI_Request>& reqs, CollectiveKind kind, std::uint64_t seq,
                   std::shared_ptr<void> keep) {
  const Clock::time_point deadline = detail::comm_deadline<Clock>(options_.timeout_ms);
  if (wait_until(reqs, deadline, where_)) return;
  std::string reason =
      cat(label(kind, seq), ": timed out after ", options_.timeout_ms,
          " ms moving data between the ranks (MPI; a rank stopped in the middle of the "
          "collective; the communicator of ", size_, " ranks is now aborted)");
  {
    std::lock_guard lk(mu_);
    if (keep) orphans_.push_back(std::move(keep));
  }
  abort(reason, true);
  throw Timeout(reason);
}

}  // namespace detail::mpi

// ---- the process group --------------------------------------------------------------------------

namespace {

using detail::mpi::Clock;

class MpiProcessGroup final : public detail::ProcessGroup {
 public:
  MpiProcessGroup(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      int finalized = 0;
      MPI_Finalized(&finalized);
      DITTO_CHECK_T(BackendError, !finalized,
                    "dist::init: MPI was already finalized in this process");
      DITTO_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "dist::init");
      owns_ = true;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      if (owns_) MPI_Finalize();
      throw BackendError(detail::cat(
          "dist::init: MPI provides thread level ", provided, ", ditto needs MPI_THREAD_MULTIPLE (",
          MPI_THREAD_MULTIPLE, "): each rank's stream worker calls MPI on its own thread"));
    }
    // Errors come back as return codes (DITTO_MPI_CHECK), never abort the job.
    DITTO_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "dist::init");
    DITTO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "dist::init");
    DITTO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_), "dist::init");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::shared_ptr<CommunicatorImpl> create_communicator(Backend& backend, int index,
                                                        const CommOptions& options,
                                                        std::vector<Device>& devices) override {
    const std::string where = detail::cat("Communicator::init_rank (rank ", rank_, " of ", size_,
                                          ", ", backend.name(), ":", index, ")");
    const Clock::time_point deadline =
        detail::comm_deadline<Clock>(options.timeout_ms);
    auto timed_out = [&](const char* step) {
      return Timeout(detail::cat(where, ": timed out after ", options.timeout_ms,
                                 " ms waiting for the other processes to call init_rank (", step,
                                 ")"));
    };
    // This communicator's own MPI communicator: its messages never meet another's. On the heap:
    // after a timeout the pending MPI_Comm_idup may still write it.
    auto comm_box = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DITTO_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, comm_box.get(), reqs.data()), where);
    if (!detail::mpi::wait_until(reqs, deadline, where)) {
      new std::shared_ptr<MPI_Comm>(comm_box);  // leaked on purpose (Note [Timeouts over MPI])
      throw timed_out("MPI_Comm_idup");
    }
    MPI_Comm comm = *comm_box;
    struct FreeOnThrow {
      MPI_Comm* comm;
      bool armed = true;
      ~FreeOnThrow() {
        if (armed) MPI_Comm_free(comm);
      }
    } guard{&comm};
    DITTO_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), where);

    // Every rank's device, to name them (and to refuse a mix of backends).
    struct WireDevice {
      char type[16];
      std::int32_t index;
    };
    WireDevice mine{};
    std::strncpy(mine.type, backend.name().c_str(), sizeof mine.type - 1);
    mine.index = index;
    auto all = std::make_shared<std::vector<WireDevice>>(static_cast<std::size_t>(size_));
    DITTO_MPI_CHECK(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all->data(), sizeof mine,
                                   MPI_BYTE, comm, reqs.data()),
                    where);
    if (!detail::mpi::wait_until(reqs, deadline, where)) {
      guard.armed = false;  // the request may still write `all` and use comm: leave both
      new std::shared_ptr<std::vector<WireDevice>>(all);  // leaked on purpose, as above
      throw timed_out("exchange of the ranks' devices");
    }
    devices.clear();
    for (int q = 0; q < size_; ++q) {
      const WireDevice& w = (*all)[static_cast<std::size_t>(q)];
      devices.emplace_back(std::string(w.type, strnlen(w.type, sizeof w.type)), w.index);
    }
    for (int q = 0; q < size_; ++q)
      DITTO_CHECK(devices[static_cast<std::size_t>(q)].type == backend.name(),
                  "Communicator::init_rank: local_device: rank ", q, " uses ",
                  devices[static_cast<std::size_t>(q)].str(), ", rank ", rank_, " uses ",
                  backend.name(), ":", index, " (every rank must use the same backend)");

    // The factories own comm from here (their MpiLink frees it, also when they throw).
    guard.armed = false;
    detail::ProcessCommunicatorFactory make = detail::process_communicator_factory(backend.name());
    if (!make) {
      MPI_Comm_free(&comm);
      throw BackendError(detail::cat("Communicator::init_rank: backend ", backend.name(),
                                     " has no multi-process transport in this build"));
    }
    detail::ProcessLink link{comm};
    std::shared_ptr<CommunicatorImpl> impl = make(link, backend, index, options);
    return impl;
  }

  void finalize() override {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  bool owns_ = false;
};

}  // namespace

std::unique_ptr<detail::ProcessGroup> make_mpi_process_group(int* argc, char*** argv) {
  return std::make_unique<MpiProcessGroup>(argc, argv);
}

}  // namespace ditto
