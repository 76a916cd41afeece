// Checks of a run's output paths before it starts (core/io/file.h): no output overwrites an
// input, and a file replaced at the end can be.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/base/error.h"
#include "core/io/file.h"

namespace ditto::io {

std::string same_file_key(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path k = fs::weakly_canonical(fs::absolute(path, ec), ec);
  return ec ? fs::path(path).lexically_normal().string() : k.string();
}

namespace {

/// What a write to `path` (or a read of it) reaches: the final target of its chain of symbolic
/// links, a dangling link's included (resolve_links, as write_file_atomic resolves it: Note
/// [Atomic write]; open(2) creates a dangling link's target too). A descriptor's name
/// (/dev/stdout) is itself; a link that cannot be resolved (a loop) is left as given:
/// check_replaceable_output refuses it, naming why.
std::string link_target(const std::string& path) {
  if (fd_alias(path) >= 0) return path;
  try {
    return resolve_links(path, "io::resolve_links");
  } catch (const Error&) {
    return path;
  }
}

/// Whether `a` and `b` name one file (core/io/file.h's check_outputs_are_not_inputs): by identity
/// where both exist, else by the same_file_key of what each reaches through its links (a
/// dangling link to the other, or to the same missing file, is the same file).
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {};
  struct stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0)
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return same_file_key(link_target(a)) == same_file_key(link_target(b));
}

/// Refuses an existing regular file `path` that this process may not write without changing its
/// mode: root passes access(W_OK) on a read-only file, so for root its mode bits decide.
void check_output_mode(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  const bool writable = ::geteuid() == 0 ? (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) != 0
                                         : ::access(path.c_str(), W_OK) == 0;
  DITTO_CHECK(writable, what, ": expected a file it may replace, got '", path,
              "': Permission "
              "denied / read-only: remove it or chmod u+w");
}

}  // namespace

void check_outputs_are_not_inputs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& inputs,
                                  const std::vector<NamedPath>& dirs) {
  namespace fs = std::filesystem;
  std::vector<NamedPath> others;
  for (const auto& in : inputs)
    if (!in.second.empty()) others.push_back(in);
  for (const auto& [opt, path] : outputs) {
    if (path.empty()) continue;
    const std::string k = same_file_key(link_target(path));  // a dangling link's target's
    for (const auto& [other, other_path] : others)
      DITTO_CHECK(!same_file(path, other_path), opt, ": expected a file other than ", other, " '",
                  other_path, "', got '", path, "', which it would overwrite");
    for (const auto& [dir_opt, dir] : dirs) {
      if (dir.empty()) continue;
      const fs::path rel = fs::path(k).lexically_relative(same_file_key(link_target(dir)));
      DITTO_CHECK(rel.empty() || *rel.begin() == "..", opt, ": expected a file outside the ",
                  dir_opt, " directory '", dir, "', got '", path, "'");
    }
    check_output_mode(path, opt);
    others.emplace_back(opt, path);
  }
}

void check_replaceable_output(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  DITTO_CHECK(!path.empty(), what, ": expected a file name, got ''");
  // What write_file_atomic will write: the final target of a chain of symbolic links (Note
  // [Atomic write]), a dangling link's included (it is created there), so that the directory
  // probed below is the one the write's temporary file goes to, not the link's.
  // (A descriptor's name, /dev/stdout, is written to the descriptor: checked as it is.)
  std::string target = path;
  try {
    if (fd_alias(path) < 0) target = resolve_links(path, "io::resolve_links");
  } catch (const Error& e) {
    throw InvalidArgument(detail::cat(what, ": expected a file or a symbolic link to one, got '",
                                      path, "' (", e.what(), ")"));
  }
  // How messages name the target: "'link' (a symbolic link to 'target'; ...)".
  const std::string via =
      target == path ? std::string() : detail::cat("a symbolic link to '", target, "'; ");
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) {
    // Never opened here: stat(2) does not block on a FIFO, with a reader or without one.
    DITTO_CHECK(S_ISREG(st.st_mode), what,
                ": expected a regular file (or none: it is created), "
                "got '",
                path, "'", target == path ? "" : " (a symbolic link to '" + target + "')", ", ",
                S_ISFIFO(st.st_mode)
                    ? "a FIFO (a named pipe: the file is written whole, to a temporary file "
                      "renamed into place, which a pipe cannot be; a write into a pipe that "
                      "ended half-way would leave its reader a partial file: write a file and "
                      "copy it into the pipe)"
                    : file_type_name(st.st_mode));
    check_output_mode(target, what);
  }
  fs::path dir = fs::path(target).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  DITTO_CHECK(fs::is_directory(dir, ec), what,
              ": expected a file in an existing directory, "
              "got '",
              path, "' (", via, "no directory '", dir.string(), "')");
  DITTO_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, what,
              ": expected a file in a directory "
              "it may write, got '",
              path, "' (", via, "directory '", dir.string(), "': ", std::strerror(errno), ")");
  // What access() cannot tell (root under /proc, a read-only file system): create a temporary
  // file as the write will (one of this call's own, beside the target, Note [Atomic write]),
  // and remove it.
  std::string tmp;
  const int fd = open_temp_beside(target, tmp);
  DITTO_CHECK(fd >= 0, what, ": expected a file in a directory it may write, got '", path, "' (",
              via, "cannot create '", temp_template(target), "': ", std::strerror(-fd), ")");
  ::close(fd);
  ::unlink(tmp.c_str());
}

}  // namespace ditto::io
