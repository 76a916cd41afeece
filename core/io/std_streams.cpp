// Note [Lost output] (core/io/file.h): a program's results on stdout are written or reported lost.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/io/file.h"

namespace ditto::io {

void occupy_closed_std_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    const int got = ::open("/dev/null", O_RDONLY);  // the lowest free descriptor: `fd`
    if (got >= 0 && got != fd) ::close(got);
  }
}

int close_stdout(int rc, const char* prog) {
  int err = std::fflush(stdout) != 0 ? errno : 0;
  const bool failed = err != 0 || std::ferror(stdout);
  if (failed && err == 0) {  // an earlier write failed: its reason, from a write of 0 bytes
    char none = 0;
    err = ::write(STDOUT_FILENO, &none, 0) < 0 ? errno : EIO;
  }
  if (std::fclose(stdout) != 0 && !failed) err = errno;
  if (!failed && err == 0) return rc;
  std::fprintf(stderr, "%s: error: cannot write the results to stdout: %s\n", prog,
               std::strerror(err));
  return rc != 0 ? rc : 1;
}

}  // namespace ditto::io
