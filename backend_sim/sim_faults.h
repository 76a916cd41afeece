// Fault injection for the simulator: a device that fails at a training step, an allocation that
// fails like a CUDA out-of-memory, a rank that never joins a collective. Each ends in a clear
// error, never a hang. Set on a SimBackend with set_faults(); ditto-train takes them as
// `--fault SPEC` (repeatable) and `--comm-timeout-ms`.
//
// Spec syntax (one fault per spec, fields in any order, indices 0-based):
//   fail:device=D,step=S            device D fails when training step S begins
//                                   (Backend::begin_step(s) with s >= S); from then on every
//                                   kernel, copy, allocation and collective on it throws
//                                   BackendError "sim:D: device failed (injected fault ...)", and
//                                   streams that wait on its events fail with the same reason.
//   alloc:device=D,after=N          the allocation after the first N on device D (the (N+1)-th,
//                                   counted from set_faults) throws OutOfMemory like cudaMalloc.
//   skip-collective:rank=R,index=K  rank R never joins collective #K+1 (its K-th, 0-based) of
//                                   each communicator created after set_faults: the other ranks
//                                   (and R's own stream) fail with ditto::Timeout naming rank R
//                                   and the collective after the communicator's timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ditto::sim {

struct Fault {
  enum class Kind : std::uint8_t { fail_device, fail_alloc, skip_collective };
  Kind kind = Kind::fail_device;
  int device = -1;          ///< fail_device, fail_alloc
  int rank = -1;            ///< skip_collective
  std::int64_t step = 0;    ///< fail_device
  std::int64_t after = 0;   ///< fail_alloc
  std::int64_t index = 0;   ///< skip_collective
  std::string spec;         ///< the spec as written, quoted in error messages
};

struct FaultConfig {
  std::vector<Fault> faults;
  /// When set: the timeout (ms, > 0) of every communicator created afterwards on the backend,
  /// instead of its CommOptions::timeout_ms (so a skipped collective fails fast).
  std::optional<std::int64_t> comm_timeout_ms;
};

/// The faults of one set_faults() call and which of them have fired, shared by the backend and
/// the communicators created while it was current.
struct FaultState {
  explicit FaultState(FaultConfig c) : config(std::move(c)), fired(config.faults.size()) {}
  const FaultConfig config;
  std::vector<std::atomic<bool>> fired;  ///< fired[i]: config.faults[i] took effect
};

/// Parses one spec (syntax above). Throws InvalidArgument naming `flag` (e.g. "--fault"), the
/// spec and the bad part, e.g. "--fault 'fail:device=x,step=5': device: expected an integer
/// >= 0, got 'x'".
Fault parse_fault(const std::string& spec, const std::string& flag = "--fault");

}  // namespace ditto::sim
