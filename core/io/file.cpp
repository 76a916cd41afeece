// io::read_file and io::write_file_atomic (Note [Atomic write] in core/io/file.h), on POSIX
// open/write/fsync/rename.
#include "core/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "core/base/error.h"

namespace ditto::io {

namespace {

std::function<void(const std::string&, std::size_t, std::size_t)>& write_hook() {
  static std::function<void(const std::string&, std::size_t, std::size_t)> hook;
  return hook;
}

[[noreturn]] void fail(const char* call, const char* what, const std::string& path, int err) {
  throw Error(detail::cat(call, ": ", what, " '", path, "': ", std::strerror(err)));
}

// Write all of [data, data + n) to fd, retrying short writes and EINTR. Returns 0 or an errno.
int write_all(int fd, const char* data, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

std::string parent_dir(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

const char* file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "an unknown file type";
  }
}

std::string size_name(std::uint64_t bytes) {
  if (bytes != 0 && bytes % (std::uint64_t{1} << 30) == 0) return detail::cat(bytes >> 30, " GiB");
  if (bytes != 0 && bytes % (std::uint64_t{1} << 20) == 0) return detail::cat(bytes >> 20, " MiB");
  return detail::cat(bytes, " bytes");
}

InputFile::InputFile(const std::string& path, std::uint64_t max_bytes, const char* call)
    : path_(path), call_(call), max_(max_bytes) {
  // O_NONBLOCK: opening a FIFO without a writer (or a device) must not hang before it is refused.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) fail(call, "cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(call, "cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(detail::cat(call, ": '", path, "' is ", file_type_name(st.st_mode),
                            ", expected a regular file"));
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > max_bytes) {
    ::close(fd_);
    throw Error(detail::cat(call, ": '", path, "' has ", size_, " bytes, more than the maximum of ",
                            size_name(max_bytes)));
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read(std::string& out, std::uint64_t n) {
  char chunk[1 << 16];
  while (n > 0) {
    const ssize_t r =
        ::read(fd_, chunk, static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof chunk)));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(call_, "error while reading", path_, errno);
    }
    if (r == 0)
      throw Error(detail::cat(call_, ": '", path_, "' ended after ", at_, " bytes, expected ",
                              at_ + n, " (did it shrink while being read?)"));
    out.append(chunk, static_cast<std::size_t>(r));
    at_ += static_cast<std::uint64_t>(r);
    n -= static_cast<std::uint64_t>(r);
  }
}

void InputFile::read_rest(std::string& out) {
  if (size_ > at_) out.reserve(out.size() + static_cast<std::size_t>(size_ - at_));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd_, chunk, sizeof chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(call_, "error while reading", path_, errno);
    }
    if (r == 0) return;
    at_ += static_cast<std::uint64_t>(r);
    if (at_ > max_)
      throw Error(detail::cat(call_, ": '", path_, "' has grown past the maximum of ",
                              size_name(max_), " while being read"));
    out.append(chunk, static_cast<std::size_t>(r));
  }
}

std::string read_file(const std::string& path, std::uint64_t max_bytes, const char* call) {
  InputFile in(path, max_bytes, call);
  std::string out;
  in.read_rest(out);
  return out;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("io::fsync_dir", "cannot open directory", dir, errno);
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    fail("io::fsync_dir", "cannot fsync directory", dir, err);
  }
  ::close(fd);
}

std::string resolve_links(const std::string& path, const char* call) {
  std::string p = path;
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(static_cast<std::size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) fail(call, "cannot read symbolic link", p, errno);
    target.resize(static_cast<std::size_t>(n));
    // A relative target is taken from the link's directory ("a/l" -> "t": "a/t"; "l": "t").
    const std::size_t slash = p.find_last_of('/');
    if (target.empty() || target[0] == '/' || slash == std::string::npos)
      p = target;
    else
      p = p.substr(0, slash + 1) + target;
  }
  fail(call, "cannot resolve symbolic link", path, ELOOP);
}

namespace {

// A write of 0 bytes to fd: 0 or the errno a real write would fail with (/dev/full: ENOSPC).
int probe_write(int fd) {
  char none = 0;
  return ::write(fd, &none, 0) < 0 ? errno : 0;
}

// Write straight through to an existing character device or FIFO (no temporary, no rename).
void write_through(const std::string& path, std::string_view bytes, const char* call) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(call, "cannot open", path, errno);
  if (int err = write_all(fd, bytes.data(), bytes.size())) {
    ::close(fd);
    fail(call, "cannot write", path, err);
  }
  if (::close(fd) != 0) fail(call, "cannot close", path, errno);
}

}  // namespace

int fd_alias(const std::string& path) {
  if (path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::size_t n = std::strlen(prefix);
    if (path.size() <= n || path.compare(0, n, prefix) != 0 || path.size() > n + 9) continue;
    int fd = 0;
    for (std::size_t i = n; i < path.size(); ++i) {
      if (path[i] < '0' || path[i] > '9') return -1;
      fd = fd * 10 + (path[i] - '0');
    }
    return fd;
  }
  return -1;
}

bool check_in_place_output(const std::string& path, const char* call) {
  if (const int fd = fd_alias(path); fd >= 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) fail(call, "cannot write", path, errno);
    if ((flags & O_ACCMODE) == O_RDONLY) fail(call, "cannot write", path, EBADF);
    if (int err = probe_write(fd)) fail(call, "cannot write", path, err);
    return true;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return false;
  if (S_ISFIFO(st.st_mode)) {
    if (::access(path.c_str(), W_OK) != 0) fail(call, "cannot write", path, errno);
    return true;
  }
  if (!S_ISCHR(st.st_mode))
    throw Error(detail::cat(call, ": cannot write '", path, "': it is ", file_type_name(st.st_mode),
                            ", expected a regular file, a character device or a FIFO"));
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(call, "cannot open", path, errno);
  const int err = probe_write(fd);
  ::close(fd);
  if (err) fail(call, "cannot write", path, err);
  return true;
}

int open_output_fd(const std::string& path, const char* call, bool append) {
  const int alias = fd_alias(path);
  const int fd = alias >= 0
                     ? ::fcntl(alias, F_DUPFD_CLOEXEC, 3)
                     : ::open(path.c_str(),
                              O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(
        detail::cat(call, ": cannot open '", path, "' for writing: ", std::strerror(errno)));
  if (int err = probe_write(fd)) {
    ::close(fd);
    fail(call, "cannot write", path, err);
  }
  return fd;
}

void write_fd(int fd, std::string_view bytes, const std::string& path, const char* call,
              bool flush_stdio) {
  if (flush_stdio) {
    std::fflush(stdout);
    std::fflush(stderr);
  }
  if (int err = write_all(fd, bytes.data(), bytes.size())) fail(call, "cannot write", path, err);
}

std::string temp_template(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "." + base + ".tmp.XXXXXX";
}

int open_temp_beside(const std::string& path, std::string& tmp) noexcept {
  // mkstemp(3)'s scheme with open(2)'s mode: 0644 less the umask, as the file it replaces
  // would have been created (mkstemp's is 0600). Six characters of 62: a name taken (another
  // writer's, a crash's leftover, anything a user put there) is skipped, never opened.
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{[]() noexcept {
    std::uint64_t seed =
        (static_cast<std::uint64_t>(::getpid()) << 32) ^
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      seed ^= std::random_device{}();
    } catch (...) {  // no entropy source: the pid and the clock (O_EXCL keeps it safe)
    }
    return seed;
  }()};
  tmp = temp_template(path);
  for (int attempt = 0; attempt < 100; ++attempt) {
    for (std::size_t i = tmp.size() - 6; i < tmp.size(); ++i) tmp[i] = kChars[rng() % 62];
    // O_EXCL | O_NOFOLLOW: an existing file or symbolic link of that name makes the open fail
    // (EEXIST) rather than redirect the write; it is left as it is.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}

std::pair<int, std::string> open_temp_beside(const std::string& path, const char* call) {
  std::string tmp;
  const int fd = open_temp_beside(path, tmp);
  if (fd < 0)
    throw Error(detail::cat(call, ": cannot create '", temp_template(path),
                            "' (the temporary file for '", path, "'): ", std::strerror(-fd)));
  return {fd, tmp};
}

namespace {

// The temporaries being written now, for remove_live_temporaries (a signal handler): a slot's
// name is written before it is marked live and unmarked before the slot is reused, so the handler
// reads a whole name or none. Names past the slot size, or past 64 at once, are not listed.
constexpr std::size_t kLiveSlots = 64, kLiveName = 4096;
struct LiveSlot {
  std::atomic<int> state{0};  // 0 free, 1 being filled or emptied, 2 live
  char name[kLiveName];
};
LiveSlot g_live[kLiveSlots];

// Lists `tmp` while it lives (the RAII of replace_file's temporary).
class LiveTemporary {
 public:
  explicit LiveTemporary(const std::string& tmp) noexcept {
    if (tmp.size() >= kLiveName) return;
    for (LiveSlot& s : g_live) {
      int free = 0;
      if (!s.state.compare_exchange_strong(free, 1, std::memory_order_acquire)) continue;
      std::memcpy(s.name, tmp.c_str(), tmp.size() + 1);
      s.state.store(2, std::memory_order_release);
      slot_ = &s;
      return;
    }
  }
  ~LiveTemporary() {
    if (slot_) slot_->state.store(0, std::memory_order_release);
  }
  LiveTemporary(const LiveTemporary&) = delete;
  LiveTemporary& operator=(const LiveTemporary&) = delete;

 private:
  LiveSlot* slot_ = nullptr;
};

// Steps 1-4 of Note [Atomic write] on `path` itself: a temporary file of its own
// (open_temp_beside) written, fsynced and renamed over `path` (rename(2) replaces the name
// `path`, a symbolic link there included, never the file a link points at). `given` is the name
// the caller was given (for the write hook).
void replace_file(const std::string& path, const std::string& given, std::string_view bytes,
                  const char* call) {
  std::pair<int, std::string> opened = open_temp_beside(path, call);
  const int fd = opened.first;
  const std::string tmp = std::move(opened.second);
  const LiveTemporary live(tmp);  // a signal that exits at once removes it
  // From here on, any failure removes the temporary file (this call's own, no other writer's)
  // and leaves `path` as it was.
  auto abandon = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(call, what, tmp, err);
  };
  const std::size_t half = bytes.size() / 2;
  if (int err = write_all(fd, bytes.data(), half)) abandon("cannot write", err);
  if (write_hook()) {
    try {
      write_hook()(given, half, bytes.size());
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (int err = write_all(fd, bytes.data() + half, bytes.size() - half))
    abandon("cannot write", err);
  if (::fsync(fd) != 0) abandon("cannot fsync", errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail(call, "cannot close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(
        detail::cat(call, ": cannot rename '", tmp, "' to '", path, "': ", std::strerror(err)));
  }
  fsync_dir(parent_dir(path));
}

}  // namespace

void write_file_atomic(const std::string& given, std::string_view bytes) {
  const char* call = "io::write_file_atomic";
  // A descriptor's name (/dev/stdout): written to the descriptor in place (Note [Atomic write]).
  if (const int fd = fd_alias(given); fd >= 0) return write_fd(fd, bytes, given, call);
  const std::string path = resolve_links(given, call);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) return write_through(path, bytes, call);
    throw Error(detail::cat(
        call, ": cannot write '", given, "': ", path == given ? "it" : "'" + path + "'", " is ",
        file_type_name(st.st_mode), ", expected a regular file, a character device or a FIFO"));
  }
  replace_file(path, given, bytes, call);
}

void write_file_replace(const std::string& path, std::string_view bytes) {
  const char* call = "io::write_file_replace";
  struct stat st {};  // lstat: a symbolic link is replaced; a directory, a device... refused
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
    throw Error(detail::cat(call, ": cannot write '", path, "': it is ", file_type_name(st.st_mode),
                            ", expected a regular file (or none: it is created)"));
  replace_file(path, path, bytes, call);
}

void set_write_hook_for_testing(
    std::function<void(const std::string&, std::size_t, std::size_t)> hook) {
  write_hook() = std::move(hook);
}

void remove_live_temporaries() noexcept {
  for (LiveSlot& s : g_live)
    if (s.state.load(std::memory_order_acquire) == 2) ::unlink(s.name);
}

}  // namespace ditto::io
