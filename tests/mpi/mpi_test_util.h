// Shared by the MPI test files of ditto_mpi_tests (each process runs them as its rank): this
// process's rank and the world's size, its device, and communicator options.
#pragma once

#include <cstdint>

#include "core/comm/communicator.h"
#include "core/distributed/distributed.h"
#include "core/runtime/device.h"

namespace ditto::test::mpi {

inline int world() { return dist::world_size(); }
inline int me() { return dist::rank(); }
/// This process's rank's virtual device (every process has its own sim:0).
inline const Device kLocal("sim", 0);

/// CommOptions of `d` with a timeout (ms) long enough for a loaded machine by default.
inline CommOptions opts(Determinism d, std::int64_t timeout_ms = 60000) {
  CommOptions o;
  o.determinism = d;
  o.timeout_ms = timeout_ms;
  return o;
}

}  // namespace ditto::test::mpi
