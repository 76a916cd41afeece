// ditto::dist: the process group's life cycle (init, finalize) over the built-in transport
// (core/backend_api/process_group.h); MPI itself lives in the *_mpi.cpp files.
#include "core/distributed/distributed.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/backend_api/process_group.h"
#include "core/base/error.h"

namespace ditto::dist {
namespace {

struct State {
  std::mutex mu;
  std::unique_ptr<detail::ProcessGroup> group;
  bool finalized = false;
};

State& state() {
  static State* s = new State();  // never destroyed: communicators may outlive static dtors
  return *s;
}

}  // namespace

bool available() { return detail::builtin_process_group() != nullptr; }

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (const char* v = std::getenv(var); v && *v) return true;
  return false;
}

void check_not_torchrun(const std::string& who) {
  if (launched_by_mpirun()) return;
  std::string seen;
  bool refuse = false;
  for (const char* var : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    const char* v = std::getenv(var);
    if (!v || !*v) continue;
    seen += detail::cat(seen.empty() ? "" : " ", var, "=", v);
    const std::string name(var), value(v);
    const bool size = name == "WORLD_SIZE" || name == "LOCAL_WORLD_SIZE";
    // A size of 1, a rank of 0: torchrun with one process, which runs the whole job anyway. Any
    // other value is refused alike, also one no torchrun writes (tester C, C9: WORLD_SIZE=0 ran
    // while WORLD_SIZE=abc, 02 and " 2" were refused).
    if (value != (size ? "1" : "0")) refuse = true;
  }
  if (!refuse) return;
  throw InvalidArgument(detail::cat(
      who, ": torchrun's variables are set (", seen,
      ") but ditto does not read them: each process would run a whole job of its own. ditto "
      "starts its ranks with mpirun (docs/mpi.md: `mpirun -np N ditto-train --trainer ddp`), or "
      "runs N devices in one process (--devices N); unset these variables to run this process "
      "alone"));
}

void init(int* argc, char*** argv) {
  State& s = state();
  std::lock_guard lk(s.mu);
  if (s.group) return;
  DITTO_CHECK_T(BackendError, !s.finalized,
                "dist::init: MPI was already finalized in this process (dist::finalize); it "
                "cannot be initialized again");
  detail::ProcessGroupFactory factory = detail::builtin_process_group();
  DITTO_CHECK_T(BackendError, factory != nullptr,
                "dist::init: this build of ditto has no MPI support (configure with "
                "-DDITTO_WITH_MPI=ON and an MPI installed, e.g. Debian's libopenmpi-dev)");
  s.group = factory(argc, argv);
}

bool is_initialized() {
  State& s = state();
  std::lock_guard lk(s.mu);
  return s.group != nullptr;
}

namespace {
// The live process group's answer to `get`, or `otherwise` when not initialized.
int group_or(int (detail::ProcessGroup::*get)() const, int otherwise) {
  State& s = state();
  std::lock_guard lk(s.mu);
  return s.group ? (s.group.get()->*get)() : otherwise;
}
}  // namespace

int world_size() { return group_or(&detail::ProcessGroup::size, 1); }
int rank() { return group_or(&detail::ProcessGroup::rank, 0); }
int local_rank() { return group_or(&detail::ProcessGroup::local_rank, 0); }
int local_size() { return group_or(&detail::ProcessGroup::local_size, 1); }

std::vector<std::string> all_gather_text(const std::string& text, std::int64_t timeout_ms) {
  DITTO_CHECK(timeout_ms > 0, "dist::all_gather_text: timeout_ms: expected > 0, got ", timeout_ms);
  constexpr std::size_t kMaxText = std::size_t(1) << 20;
  DITTO_CHECK(text.size() <= kMaxText, "dist::all_gather_text: text: expected at most ", kMaxText,
              " bytes, got ", text.size());
  detail::ProcessGroup* group = nullptr;
  {
    State& s = state();
    std::lock_guard lk(s.mu);
    group = s.group.get();
  }
  if (!group) return {text};
  return group->all_gather_text(text, timeout_ms);
}

void finalize() {
  State& s = state();
  std::lock_guard lk(s.mu);
  if (!s.group) return;
  s.group->finalize();
  s.group.reset();
  s.finalized = true;
}

std::string job_failure() {
  State& s = state();
  std::lock_guard lk(s.mu);
  return s.group ? s.group->failure() : std::string();
}

void abort(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  detail::ProcessGroup* group = nullptr;
  {
    State& s = state();
    std::lock_guard lk(s.mu);
    group = s.group.get();
  }
  if (group) group->abort(status);
  std::exit(status);
}

}  // namespace ditto::dist

namespace ditto::detail {
ProcessGroup* process_group() {
  dist::State& s = dist::state();
  std::lock_guard lk(s.mu);
  return s.group.get();
}
}  // namespace ditto::detail
