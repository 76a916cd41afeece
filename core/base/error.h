// ditto's exception hierarchy and argument-check macros.
//
// Every error a user can cause (bad shapes, devices out of range, malformed CSV, out of memory,
// a collective that timed out) is thrown as a ditto::Error or a subclass. Messages name the call,
// the argument, what was expected and what came, e.g.
//   "comm::scatter: chunk_sizes: expected entries adding up to 1 (size of dim 0), got 49".
// Library code never aborts: internal invariants use DITTO_ASSERT, which throws InternalError.
#pragma once

#include <algorithm>
#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ditto {

/// Base of every exception ditto throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// Bad argument from the caller: shape, dtype, device, range, count (like c10's ValueError).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// Allocation past a device's capacity (like CUDA's out-of-memory error), or a host allocation
/// that failed; kind() says which memory ran out, so that a caller tells them apart without
/// reading the message (ditto-train's hint of what to change applies to a device's only).
class OutOfMemory : public Error {
 public:
  /// The memory that ran out. device: a device's capacity (a simulated device's, an injected
  /// allocation fault, a dry run's address span; CUDA's cudaErrorMemoryAllocation and cuBLAS's
  /// CUBLAS_STATUS_ALLOC_FAILED, the backend's own capacity check). host: a host allocation
  /// (std::bad_alloc, a backend's host block: the cpu backend's, the simulator's tensor data).
  enum class Kind { device, host };
  OutOfMemory(const std::string& what, Kind kind) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// A backend or driver call failed (CUDA, NCCL, a simulated device fault).
class BackendError : public Error {
 public:
  using Error::Error;
};

/// A collective or barrier failed because another rank failed (Communicator::abort, a failed
/// device, an MPI peer's abort notice): the message names that rank ("<collective>: rank R
/// failed: <reason>", or "<collective>: communicator aborted by an earlier error: ..."), and
/// failed_rank() holds R, or -1 when the communicator does not know which rank caused the abort.
/// A launcher of ranks reports the error of a rank that is not a PeerFailure caused by another
/// rank (the root error), never the echoes (core/train/launcher.h).
class PeerFailure : public BackendError {
 public:
  PeerFailure(const std::string& what, int failed_rank)
      : BackendError(what), failed_rank_(failed_rank) {}
  /// The rank that failed first (0-based), or -1 when unknown.
  int failed_rank() const noexcept { return failed_rank_; }

 private:
  int failed_rank_;
};

/// A collective or wait did not complete in time; the message names the ranks that never arrived.
class Timeout : public Error {
 public:
  using Error::Error;
};

/// Malformed input file (CSV); the message names file, line and column.
class ParseError : public Error {
 public:
  using Error::Error;
};

/// An invariant of ditto itself broke: a bug in ditto, never the caller's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// Levenshtein distance (insertions, deletions, substitutions) between `a` and `b`: the
/// did-you-mean of an error message naming an unknown option or field.
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace detail

}  // namespace ditto

/// Throw `ExcType` with the streamed message parts unless `cond` holds.
#define DITTO_CHECK_T(ExcType, cond, ...)                          \
  do {                                                             \
    if (!(cond)) throw ExcType(::ditto::detail::cat(__VA_ARGS__)); \
  } while (0)

/// User-facing argument check: throws ditto::InvalidArgument.
#define DITTO_CHECK(cond, ...) DITTO_CHECK_T(::ditto::InvalidArgument, cond, __VA_ARGS__)

/// Internal invariant: throws ditto::InternalError naming file and line.
#define DITTO_ASSERT(cond)                                                                   \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::ditto::InternalError(                                                          \
          ::ditto::detail::cat("internal error: ", #cond, " at ", __FILE__, ":", __LINE__)); \
  } while (0)
