// The shared rendezvous of the communicators (Note [Rendezvous], core/backend_api/rendezvous.h):
// the messages of timeouts, aborts and failed ranks, and the abort state.
#include "core/backend_api/rendezvous.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/base/error.h"

namespace ditto::detail {

std::string collective_label(CollectiveKind kind, std::uint64_t seq) {
  return cat(collective_name(kind), " (collective #", seq, " on this communicator)");
}

std::string ranks_str(const std::vector<int>& ranks) {
  std::string who = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) who += (i ? ", " : "") + std::to_string(ranks[i]);
  return who;
}

std::string timeout_reason(const std::string& label, std::int64_t timeout_ms,
                           const std::vector<int>& missing, int n, const char* in) {
  return cat(label, ": timed out after ", timeout_ms, " ms waiting for ", ranks_str(missing),
             " (communicator of ", n, " ranks", in, "; it is now aborted)");
}

std::int64_t comm_warn_after_ms() {
  constexpr std::int64_t kDefault = 10000;
  const char* v = std::getenv("DITTO_COMM_WARN_AFTER_MS");
  if (v == nullptr || *v == '\0') return kDefault;
  std::int64_t ms = 0;
  const char* end = v + std::strlen(v);
  auto [ptr, ec] = std::from_chars(v, end, ms);
  return ec == std::errc() && ptr == end && ms >= 0 ? ms : kDefault;
}

std::string slow_warning(const std::string& label, std::int64_t waited_ms, const std::string& what,
                         std::int64_t timeout_ms) {
  const std::string waited =
      waited_ms % 1000 == 0 ? cat(waited_ms / 1000, " s") : cat(waited_ms, " ms");
  return cat("ditto: warning: ", label, ": waited ", waited, " ", what,
             "; it fails with a timeout after ", timeout_ms, " ms");
}

std::string wait_warning(const std::string& label, std::int64_t waited_ms,
                         const std::vector<int>& missing, int n, std::int64_t timeout_ms,
                         const char* in) {
  return slow_warning(label, waited_ms,
                      cat("for ", ranks_str(missing), " (communicator of ", n, " ranks", in, ")"),
                      timeout_ms);
}

void print_warning(const std::string& line) noexcept {
  try {
    const std::string text = line + "\n";
    std::size_t at = 0;
    while (at < text.size()) {
      const ssize_t w = ::write(2, text.data() + at, text.size() - at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return;
      at += static_cast<std::size_t>(w);
    }
  } catch (...) {  // the message could not be built: a warning is not worth an exception
  }
}

std::exception_ptr peer_failure(const std::string& message, int failed_rank) {
  return std::make_exception_ptr(PeerFailure(message, failed_rank));
}

bool AbortState::abort(Cause cause, std::string reason, int failed_rank) noexcept {
  if (aborted_) return false;  // the first reason stays
  aborted_ = true;
  cause_ = cause;
  failed_rank_ = failed_rank;
  reason_ = std::move(reason);
  return true;
}

bool AbortState::rank_failed(int rank, const std::string& reason) noexcept {
  if (aborted_) return false;
  try {
    return abort(Cause::peer, cat("rank ", rank, " failed: ", reason), rank);
  } catch (...) {  // allocation failure of the message
    aborted_ = true;
    return true;
  }
}

void AbortState::throw_if_aborted(CollectiveKind kind) const {
  if (!aborted_) return;
  std::string msg =
      cat(collective_name(kind), ": communicator aborted by an earlier error: ", reason_);
  // Caused by an earlier error, on this rank or another: a PeerFailure either way (failed_rank
  // -1 when no rank is known), so that a launcher looking for the root error passes over it.
  std::rethrow_exception(peer_failure(msg, failed_rank_));
}

std::exception_ptr AbortState::error_for(const std::string& label) const {
  if (cause_ == Cause::timeout) return std::make_exception_ptr(Timeout(reason_));
  std::string msg = cause_ == Cause::peer ? cat(label, ": ", reason_) : reason_;
  if (failed_rank_ >= 0) return peer_failure(msg, failed_rank_);
  return std::make_exception_ptr(BackendError(msg));
}

}  // namespace ditto::detail
