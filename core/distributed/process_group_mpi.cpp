// The MPI process group (dist::init / finalize, Communicator::init_rank's bootstrap): MPI_Init,
// the ranks' agreement on their devices and the communicator each rank's backend builds over its
// own MPI communicator. Compiled only with DITTO_WITH_MPI; the MPI plumbing those communicators
// share (MpiLink, Note [Point-to-point over MPI]) is mpi_transport_mpi.cpp.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

#include "core/backend_api/mpi_transport.h"
#include "core/backend_api/process_group.h"
#include "core/backend_api/rendezvous.h"
#include "core/runtime/backend_init.h"

namespace ditto {

namespace {

using detail::mpi::Clock;

// While it lives, a thread that prints one warning if it lives longer than
// detail::comm_warn_after_ms() (Note [Slow collective warning]): MPI_Init_thread waits for every
// process of the job, and a process that left without calling it (e.g. `ditto-train --version`
// on the other side of an MPMD ':') makes it wait forever, silently. No thread, no warning.
class InitWatch {
 public:
  InitWatch() {
    const std::int64_t ms = detail::comm_warn_after_ms();
    if (ms <= 0) return;
    try {
      thread_ = std::thread([this, ms] {
        std::unique_lock lk(mu_);
        if (cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return done_; })) return;
        detail::print_warning(detail::cat(
            "ditto: warning: dist::init: MPI_Init_thread has waited ", ms,
            " ms for the job's "
            "other processes: it waits for every process of the job, so one that exited without "
            "calling MPI_Init (e.g. `ditto-train --version` or another program on the other "
            "side of an MPMD ':') makes it wait forever"));
      });
    } catch (const std::system_error&) {
    }
  }
  ~InitWatch() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  InitWatch(const InitWatch&) = delete;
  InitWatch& operator=(const InitWatch&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

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
      int rc = MPI_SUCCESS;
      {
        InitWatch watch;  // Note [Slow collective warning]: MPI_Init waits for every process
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
      }
      DITTO_MPI_CHECK(rc, "dist::init");
      owns_ = true;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      if (owns_) MPI_Finalize();
      throw BackendError(detail::cat("dist::init: MPI provides thread level ", provided,
                                     ", ditto needs MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
                                     "): each rank's stream worker calls MPI on its own thread"));
    }
    // Errors come back as return codes (DITTO_MPI_CHECK), never abort the job.
    DITTO_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "dist::init");
    DITTO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "dist::init");
    DITTO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_), "dist::init");
    // The processes that share this node's memory (torch.distributed's LOCAL_RANK without the
    // launcher's environment variable): ordered by world rank.
    MPI_Comm node = MPI_COMM_NULL;
    DITTO_MPI_CHECK(
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
        "dist::init");
    const int rank_rc = MPI_Comm_rank(node, &local_rank_);
    const int size_rc = MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);
    DITTO_MPI_CHECK(rank_rc, "dist::init");
    DITTO_MPI_CHECK(size_rc, "dist::init");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  std::shared_ptr<CommunicatorImpl> create_communicator(Backend& backend, int index,
                                                        const CommOptions& options,
                                                        std::vector<Device>& devices) override {
    const std::string where = detail::cat("Communicator::init_rank (rank ", rank_, " of ", size_,
                                          ", ", backend.name(), ":", index, ")");
    const Clock::time_point deadline = detail::comm_deadline<Clock>(options.timeout_ms);
    auto timed_out = [&](const char* step) {
      Timeout t(detail::cat(where, ": timed out after ", options.timeout_ms,
                            " ms waiting for the other processes to call init_rank (", step, ")"));
      detail::mpi::note_job_failure(t.what());  // its requests stay pending
      return t;
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
    // And every rank's determinism: ranks of different modes move different messages (one
    // rank's bitwise tree against another's fast ring crashed inside MPI), so they must not meet
    // in one communicator.
    struct WireDevice {
      char type[16];
      std::int32_t index;
      std::int32_t determinism;
    };
    WireDevice mine{};
    std::strncpy(mine.type, backend.name().c_str(), sizeof mine.type - 1);
    mine.index = index;
    mine.determinism = static_cast<std::int32_t>(options.determinism);
    auto all = std::make_shared<std::vector<WireDevice>>(static_cast<std::size_t>(size_));
    DITTO_MPI_CHECK(MPI_Iallgather(&mine, sizeof mine, MPI_BYTE, all->data(), sizeof mine, MPI_BYTE,
                                   comm, reqs.data()),
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
    for (int q = 0; q < size_; ++q) {
      const auto d = static_cast<Determinism>((*all)[static_cast<std::size_t>(q)].determinism);
      DITTO_CHECK(d == options.determinism, "Communicator::init_rank: options.determinism: rank ",
                  q, " uses ", determinism_name(d), ", rank ", rank_, " uses ",
                  determinism_name(options.determinism), " (every rank must use the same)");
    }

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

  // One fixed-size record per process first (nothing in it depends on the process's settings,
  // so processes that disagree on them still meet here safely); the texts only when the records
  // differ. Buffers on the heap and leaked after a timeout (Note [Timeouts over MPI]).
  std::vector<std::string> all_gather_text(const std::string& text,
                                           std::int64_t timeout_ms) override {
    const std::string where =
        detail::cat("dist::all_gather_text (rank ", rank_, " of ", size_, ", MPI)");
    std::vector<std::string> out(static_cast<std::size_t>(size_), text);
    if (size_ == 1) return out;
    struct Record {
      std::uint64_t magic, hash, size;
    };
    constexpr std::uint64_t kMagic = 0x646974746f636667ull;  // "dittocfg"
    std::uint64_t hash = 0xcbf29ce484222325ull;              // FNV-1a
    for (unsigned char ch : text) hash = (hash ^ ch) * 0x100000001b3ull;
    const Clock::time_point deadline = detail::comm_deadline<Clock>(timeout_ms);
    auto timed_out = [&](const char* step) {
      Timeout t(detail::cat(where, ": timed out after ", timeout_ms,
                            " ms waiting for the other processes (", step, ")"));
      detail::mpi::note_job_failure(t.what());  // its requests stay pending
      return t;
    };
    auto mine = std::make_shared<Record>(Record{kMagic, hash, text.size()});
    auto all = std::make_shared<std::vector<Record>>(static_cast<std::size_t>(size_));
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    DITTO_MPI_CHECK(MPI_Iallgather(mine.get(), sizeof(Record), MPI_BYTE, all->data(),
                                   sizeof(Record), MPI_BYTE, MPI_COMM_WORLD, reqs.data()),
                    where);
    if (!detail::mpi::wait_until(reqs, deadline, where)) {
      new std::shared_ptr<Record>(mine);  // leaked on purpose: the request may still use them
      new std::shared_ptr<std::vector<Record>>(all);
      throw timed_out("the exchange of the settings' hashes");
    }
    bool same = true;
    for (const Record& r : *all)
      same = same && r.magic == kMagic && r.hash == hash && r.size == text.size();
    if (same) return out;
    std::vector<int> counts(static_cast<std::size_t>(size_)), displs(counts.size());
    std::size_t total = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      const Record& r = (*all)[q];
      DITTO_CHECK_T(BackendError, r.magic == kMagic && r.size <= (std::size_t(1) << 20), where,
                    ": rank ", q, " sent a record of another exchange (a different program?)");
      counts[q] = static_cast<int>(r.size);
      displs[q] = static_cast<int>(total);
      total += r.size;
    }
    auto texts = std::make_shared<std::string>(total, '\0');
    auto send = std::make_shared<std::string>(text);
    DITTO_MPI_CHECK(
        MPI_Iallgatherv(send->data(), static_cast<int>(send->size()), MPI_BYTE, texts->data(),
                        counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD, reqs.data()),
        where);
    if (!detail::mpi::wait_until(reqs, deadline, where)) {
      new std::shared_ptr<std::string>(texts);  // leaked on purpose, as above
      new std::shared_ptr<std::string>(send);
      throw timed_out("the exchange of the settings");
    }
    for (std::size_t q = 0; q < counts.size(); ++q)
      out[q] =
          texts->substr(static_cast<std::size_t>(displs[q]), static_cast<std::size_t>(counts[q]));
    return out;
  }

  void finalize() override {
    detail::mpi::wait_for_queued_work();  // Note [MPI work at finalize]
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  std::string failure() const override { return detail::mpi::job_failure(); }

  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; should it, the process ends all the same
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool owns_ = false;
};

}  // namespace

std::unique_ptr<detail::ProcessGroup> make_mpi_process_group(int* argc, char*** argv) {
  return std::make_unique<MpiProcessGroup>(argc, argv);
}

}  // namespace ditto
