// Note [Graceful stop] (graceful_stop.h): the signal handlers, async-signal-safe.
#include "core/train/graceful_stop.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file.h"

namespace ditto::train {

namespace {

std::atomic<int> g_stop{0};
// Cleared by disarm_stop_handlers: the run is over, a first signal is recorded silently.
volatile std::sig_atomic_t g_armed = 1;
// Whether a stop can still come (Note [Graceful stop]): kStepping until
// stop_handlers_last_step; kStopAnnounced when a first signal promised a stop checkpoint then.
// One atomic, so that a signal and stop_handlers_last_step (another thread) agree on which
// came first: a promise made just before the last step is corrected by stop_handlers_last_step.
// kStopDue: the run stops after the step whose checkpoint g_due_checkpoint names, which rank 0
// writes (stop_handlers_stop_due): whether it is on disk, DIR/latest says. kStopWritten: it is
// on disk (stop_handlers_stop_checkpoint_written), whatever came before.
enum : int { kStepping = 0, kStopAnnounced = 1, kLastStep = 2, kStopWritten = 3, kStopDue = 4 };
std::atomic<int> g_phase{kStepping};
static_assert(std::atomic<int>::is_always_lock_free, "used in a signal handler");
// Set by stop_handlers_training_over: the last step is done, no checkpoint is due.
volatile std::sig_atomic_t g_over = 0;
// Set before the handlers are installed; read only by them.
volatile std::sig_atomic_t g_mpirun = 0;  // the ranks are processes under mpirun
char g_prog[256];
char g_latest_path[4096];  // "DIR/latest"
char g_checkpoint_dir[4096];
// A --resume elsewhere than DIR: its directory A and "A/latest", or its one checkpoint
// "A/step-N"; empty otherwise.
char g_resume_dir[4096];
char g_resume_latest[4096];
char g_resume_step[4096];
// "DIR/step-N", the stop checkpoint written: set before g_phase becomes kStopWritten, read only
// once it is.
char g_stop_checkpoint[4096];
// "DIR/step-N" and "step-N", the stop checkpoint due: set before g_phase becomes kStopDue, read
// only once it is.
char g_due_checkpoint[4096];
char g_due_name[64];
// Whether that step's checkpoint was saved before the stop (TrainerCallbacks::on_stop's
// `saved`), and DIR/latest as it was then: whether it named it already, and its identity.
bool g_due_saved = false;
bool g_due_had_name = false;
struct stat g_due_latest {};

// What DIR/latest names, without the trailing newline ("" when it cannot be read); open/read only.
// O_NONBLOCK: a FIFO there would block the handler's open until a writer came, so that the second
// signal, meant to exit at once, hung the process (tester: mkfifo DIR/latest).
// `id`, when given, gets the file's identity (fstat; zeroed when it cannot be opened).
void read_latest(char (&name)[64], const char* path = g_latest_path, struct stat* id = nullptr) {
  ssize_t got = -1;
  const int fd = ::open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (id) *id = {};
  if (fd >= 0) {
    if (id && ::fstat(fd, id) != 0) *id = {};
    got = ::read(fd, name, sizeof name - 1);
    ::close(fd);
  }
  if (got < 0) got = 0;
  name[got] = 0;
  while (got > 0 && (name[got - 1] == '\n' || name[got - 1] == ' ')) name[--got] = 0;
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_mtim.tv_sec == b.st_mtim.tv_sec &&
         a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// Whether the stop checkpoint is on disk: said so (kStopWritten), or DIR/latest names it
// (kStopDue: rank 0, in this process or another, wrote it). Unless the step's checkpoint was
// saved before the stop (g_due_saved), a DIR/latest that already named it then is an older run's
// (--resume DIR/step-M --checkpoint DIR over a run that went past M): it counts once replaced
// (a save renames a new file into place: another inode).
bool stop_checkpoint_on_disk(int phase) {
  if (phase == kStopWritten) return true;
  if (phase != kStopDue) return false;
  char name[64] = {};
  struct stat id {};
  read_latest(name, g_latest_path, &id);
  if (std::strcmp(name, g_due_name) != 0) return false;  // (async-signal-safe since POSIX 2016)
  return g_due_saved || !g_due_had_name || !same_file(id, g_due_latest);
}

// Appends "DIR/step-N" (what DIR/latest names) or "none" with `put` (open/read only). With none
// in DIR, a run that resumed from another directory names the checkpoint there (--resume A
// --checkpoint B: "none" sent the user to start over, A's checkpoint intact; tester).
template <typename Put>
void put_newest(const Put& put) {
  char name[64] = {};
  read_latest(name);
  if (name[0] != 0) {
    put(g_checkpoint_dir);
    put("/");
    put(name);
    return;
  }
  if (g_resume_step[0] != 0) {
    put(g_resume_step);
    put(" (the --resume checkpoint)");
    return;
  }
  if (g_resume_latest[0] != 0) read_latest(name, g_resume_latest);
  if (name[0] != 0) {
    put(g_resume_dir);
    put("/");
    put(name);
    put(" (in the --resume directory)");
  } else {
    put("none");
  }
}

extern "C" void on_stop_signal(int sig) {
  const int saved_errno = errno;  // open() of a missing DIR/latest sets it: the interrupted code's
  struct RestoreErrno {
    int value;
    ~RestoreErrno() { errno = value; }
  } restore_errno{saved_errno};
  char buf[8192];
  std::size_t n = 0;
  auto put = [&](const char* t) {
    while (*t && n < sizeof buf - 1) buf[n++] = *t++;
  };
  const char* name = stop_signal_name(sig);
  put(g_prog);
  const int phase = g_phase.load();
  const bool written = stop_checkpoint_on_disk(phase);
  if (g_stop.exchange(sig) != 0) {
    put(": second ");
    put(name);
    // What the exit leaves undone, as it stands now.
    if (written) {
      put(": exiting at once; the stop checkpoint was written: ");
      put(phase == kStopWritten ? g_stop_checkpoint : g_due_checkpoint);
    } else {
      put(g_over     ? ": exiting at once; training was over"
          : !g_armed ? ": exiting at once; the run was over"
          : phase == kStopAnnounced || phase == kStopDue
              ? ": exiting at once; the stop checkpoint was not written"
              : ": exiting at once, before the run completed");
    }
    put("; newest checkpoint on disk: ");
    put_newest(put);
    put("\n");
    [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, buf, n);
    io::remove_live_temporaries();  // an --export or checkpoint file being written: no leftover
    ::_exit(128 + sig);
  }
  if (!g_armed) return;  // the run is over: no step to finish, no checkpoint to announce
  if (written) {         // under mpirun: another process's signal stopped this one
    put(": ");
    put(name);
    put(" received after the stop checkpoint was written (");
    put(phase == kStopWritten ? g_stop_checkpoint : g_due_checkpoint);
    put("): nothing left to finish or write; exiting as usual (send it again to exit at once)\n");
  } else if (phase == kStopDue) {  // the same, before rank 0's save returned
    put(": ");
    put(name);
    put(" received while the stop checkpoint is written (");
    put(g_due_checkpoint);
    put("): no step left to finish; exiting as usual (send it again to exit at once)\n");
  } else if (g_over) {
    put(": ");
    put(name);
    put(" received after training: no step left to finish, no checkpoint to write (newest on "
        "disk: ");
    put_newest(put);
    put("); finishing the output (final line, sample, exports), then exiting as usual (send it "
        "again to exit at once)\n");
  } else {
    int stepping = kStepping;
    if (g_phase.compare_exchange_strong(stepping, kStopAnnounced)) {
      put(": signal received: finishing the current step and writing a checkpoint (send it "
          "again to exit at once)");
      // mpirun's own SIGINT / SIGTERM (Ctrl-C) SIGKILLs the ranks about a second after
      // forwarding SIGTERM (Open MPI's odls_base_sigkill_timeout): too little for a large
      // model's checkpoint. SIGUSR1 it forwards and leaves the ranks to finish.
      if (g_mpirun && sig != SIGUSR1)
        put("; under mpirun, whose Ctrl-C or SIGTERM kills the ranks about 1 s later, stop a "
            "run with `kill -USR1 <mpirun's pid>` instead, which mpirun forwards to every rank");
      put("\n");
    } else {  // kLastStep: the Trainer checks for no stop any more
      put(": ");
      put(name);
      put(" received with no step left to stop before: no stop checkpoint; "
          "completing the run as usual (final evaluation, checkpoint, line, sample, exports), "
          "then exiting as usual (send it again to exit at once)\n");
    }
  }
  [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, buf, n);
}

}  // namespace

const std::atomic<int>* install_stop_handlers(const std::string& checkpoint_dir,
                                              const std::string& prog, bool under_mpirun,
                                              const std::string& resume_dir) {
  g_mpirun = under_mpirun ? 1 : 0;
  g_resume_dir[0] = g_resume_latest[0] = g_resume_step[0] = 0;
  std::string from = resume_dir;
  while (from.size() > 1 && from.back() == '/') from.pop_back();
  if (!from.empty() && from != checkpoint_dir) {
    if (checkpoint_run_dir(from) != from) {  // one checkpoint, A/step-N
      std::snprintf(g_resume_step, sizeof g_resume_step, "%s", from.c_str());
    } else {
      std::snprintf(g_resume_dir, sizeof g_resume_dir, "%s", from.c_str());
      std::snprintf(g_resume_latest, sizeof g_resume_latest, "%s/latest", from.c_str());
    }
  }
  std::snprintf(g_prog, sizeof g_prog, "%s", prog.c_str());
  std::snprintf(g_checkpoint_dir, sizeof g_checkpoint_dir, "%s", checkpoint_dir.c_str());
  std::snprintf(g_latest_path, sizeof g_latest_path, "%s/latest", checkpoint_dir.c_str());
  g_armed = 1;
  g_over = 0;
  g_phase.store(kStepping);
  g_stop_checkpoint[0] = 0;
  g_due_checkpoint[0] = 0;
  g_due_name[0] = 0;
  g_due_saved = g_due_had_name = false;
  g_due_latest = {};
  g_stop.store(0);  // a new run: no signal yet
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &sa, nullptr);
  }
  return &g_stop;
}

void disarm_stop_handlers() { g_armed = 0; }

void stop_handlers_training_over() { g_over = 1; }

void stop_handlers_stop_due(std::int64_t step, bool saved) {
  // Written before the phase says so (seq_cst store): a handler that reads kStopDue, on any
  // thread, reads the whole path. Once per run: no handler reads them while they are written.
  const int phase = g_phase.load();
  if (phase == kStopDue || phase == kStopWritten) return;
  std::snprintf(g_due_name, sizeof g_due_name, "%s", checkpoint_step_name(step).c_str());
  std::snprintf(g_due_checkpoint, sizeof g_due_checkpoint, "%s/%s", g_checkpoint_dir, g_due_name);
  g_due_saved = saved;
  char name[64] = {};
  read_latest(name, g_latest_path, &g_due_latest);
  g_due_had_name = std::strcmp(name, g_due_name) == 0;
  g_phase.store(kStopDue);
}

void stop_handlers_stop_checkpoint_written(const std::string& path) {
  // Written before the phase says so (seq_cst store): a handler that reads kStopWritten, on any
  // thread, reads the whole path. Once per run: no handler reads it while it is written.
  if (g_phase.load() == kStopWritten) return;
  std::snprintf(g_stop_checkpoint, sizeof g_stop_checkpoint, "%s", path.c_str());
  g_phase.store(kStopWritten);
}

void stop_handlers_last_step() {
  if (g_phase.exchange(kLastStep) != kStopAnnounced || !g_armed) return;
  // A first signal came before the last step and promised a stop checkpoint (before training
  // began, or after the Trainer's last check): the run completes instead. Say so at once.
  char buf[512];
  std::size_t n = 0;
  auto put = [&](const char* t) {
    while (*t && n < sizeof buf - 1) buf[n++] = *t++;
  };
  put(g_prog);
  put(": ");
  put(stop_signal_name(g_stop.load()));
  put(": no step is left to stop before (the next is the run's last), so no stop checkpoint "
      "after all; completing the run as usual (final evaluation, checkpoint, line, sample, exports), then "
      "exiting as usual (send it again to exit at once)\n");
  [[maybe_unused]] const ssize_t w = ::write(STDERR_FILENO, buf, n);
}

int stop_signal() { return g_stop.load(); }

const char* stop_signal_name(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGUSR1 ? "SIGUSR1"
                          : "signal";
}

}  // namespace ditto::train
