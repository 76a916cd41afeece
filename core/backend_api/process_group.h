// Internal: the hook between core (core/distributed/distributed.cpp, Communicator::init_rank) and a
// transport that joins processes (MPI, in the *_mpi.cpp files, compiled only with DITTO_WITH_MPI).
// Core sees only this interface, so neither core's public headers nor any caller include <mpi.h> or
// need an #ifdef: the one place that knows whether MPI was built is builtin_process_group(), in the
// file CMake generates from cmake/builtin_backends.cpp.in, beside the backend list.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/runtime/backend.h"
#include "core/runtime/collective_types.h"

namespace ditto::detail {

/// The processes of the job (MPI_COMM_WORLD).
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// This process's rank among the processes of its node, and their number (the
  /// MPI_COMM_TYPE_SHARED split of MPI_COMM_WORLD).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;

  /// ncclCommInitRank over every process: the shared state of this process's rank of a new
  /// communicator, on device `index` of `backend` (validated by core). Collective: every process
  /// calls it, in the same order. Fills `devices` with every rank's device as that process names
  /// it (devices[rank()] is the local one). Throws BackendError for a backend without a
  /// multi-process transport, Timeout when a process does not join within options.timeout_ms.
  virtual std::shared_ptr<CommunicatorImpl> create_communicator(Backend& backend, int index,
                                                                const CommOptions& options,
                                                                std::vector<Device>& devices) = 0;

  /// dist::all_gather_text: every process's `text`, in rank order, over MPI_COMM_WORLD itself
  /// (no communicator needed). Collective. Throws Timeout naming the missing processes after
  /// timeout_ms.
  virtual std::vector<std::string> all_gather_text(const std::string& text,
                                                   std::int64_t timeout_ms) = 0;

  /// MPI_Finalize.
  virtual void finalize() = 0;

  /// dist::job_failure: why this process should not call finalize(), "" when it may.
  virtual std::string failure() const = 0;

  /// MPI_Abort(MPI_COMM_WORLD, status): ends every process of the job. Does not return.
  [[noreturn]] virtual void abort(int status) = 0;
};

/// Starts the process group (MPI_Init_thread); argc/argv may be null.
using ProcessGroupFactory = std::unique_ptr<ProcessGroup> (*)(int* argc, char*** argv);

/// The built-in transport's factory, or null when none was built (no MPI).
ProcessGroupFactory builtin_process_group();

/// The live process group (between dist::init and dist::finalize), else null.
ProcessGroup* process_group();

}  // namespace ditto::detail
