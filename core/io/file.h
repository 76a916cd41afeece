// io: whole-file reads and crash-safe file writes (Note [Atomic write]), for checkpoints and any
// other file ditto writes on a user's behalf.
//
// Note [Atomic write]
// write_file_atomic(path, bytes) writes `path` so that, whatever happens to the process (an
// exception, SIGKILL, a power cut after fsync), `path` holds either its previous contents or all
// of the new bytes, never a part:
//   1. open "<path>.tmp" in the same directory (same file system, so rename is atomic),
//   2. write every byte, fsync, close,
//   3. rename("<path>.tmp", path): atomic replacement (POSIX rename(2)),
//   4. fsync the directory, so that the rename itself is on disk.
// A crash between 1 and 3 leaves a stray "<path>.tmp" and the old `path` untouched; the next write
// of `path` truncates the stray file. This is what torch.save does not do (it writes in place),
// and what e.g. Orbax and DeepSpeed's checkpoint engines do.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace ditto::io {

/// Whole contents of a file (blocks). Throws ditto::Error naming the file and the OS error
/// ("io::read_file: cannot open 'x': No such file or directory").
std::string read_file(const std::string& path);

/// Replace `path` with `bytes` atomically (Note [Atomic write]). Blocks until the data and the
/// rename are on disk (fsync). Throws ditto::Error naming the file, the step that failed and the
/// OS error; on error the temporary file is removed and `path` is unchanged.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// fsync a directory (makes renames and creations in it durable). Throws ditto::Error.
void fsync_dir(const std::string& dir);

/// Test-only hook: when set, write_file_atomic calls it once per file after writing the first
/// half of the bytes (before fsync and rename), with the final path, bytes written and total.
/// A test makes it throw (or SIGKILL the process) to simulate a crash in the middle of a write.
/// Not thread-safe: set it only while no write is in flight. An empty function unsets it.
void set_write_hook_for_testing(
    std::function<void(const std::string& path, std::size_t written, std::size_t total)> hook);

}  // namespace ditto::io
