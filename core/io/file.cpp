// io::read_file and io::write_file_atomic (Note [Atomic write] in core/io/file.h), on POSIX
// open/write/fsync/rename.
#include "core/io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "core/runtime/error.h"

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

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("io::read_file", "cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("io::read_file", "cannot stat", path, err);
  }
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, chunk, sizeof chunk);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      fail("io::read_file", "error while reading", path, err);
    }
    if (r == 0) break;
    out.append(chunk, static_cast<std::size_t>(r));
  }
  ::close(fd);
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

void write_file_atomic(const std::string& path, std::string_view bytes) {
  const char* call = "io::write_file_atomic";
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(call, "cannot create", tmp, errno);
  // From here on, any failure removes the temporary file and leaves `path` as it was.
  auto abandon = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(call, what, tmp, err);
  };
  const std::size_t half = bytes.size() / 2;
  if (int err = write_all(fd, bytes.data(), half)) abandon("cannot write", err);
  if (write_hook()) {
    try {
      write_hook()(path, half, bytes.size());
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
    throw Error(detail::cat(call, ": cannot rename '", tmp, "' to '", path,
                            "': ", std::strerror(err)));
  }
  fsync_dir(parent_dir(path));
}

void set_write_hook_for_testing(
    std::function<void(const std::string&, std::size_t, std::size_t)> hook) {
  write_hook() = std::move(hook);
}

}  // namespace ditto::io
