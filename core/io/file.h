// io: whole-file reads with a size bound (Note [Bounded reads]) and crash-safe file writes (Note
// [Atomic write]), for checkpoints and any other file ditto reads or writes on a user's behalf.
//
// Note [Atomic write]
// write_file_atomic(path, bytes) writes `path` so that, whatever happens to the process (an
// exception, SIGKILL, a power cut after fsync), `path` holds either its previous contents or all
// of the new bytes, never a part:
//   1. create a temporary file of its own in the same directory (same file system, so rename is
//      atomic): ".<name>.tmp.XXXXXX", mkstemp(3)'s scheme (six random characters, O_CREAT |
//      O_EXCL | O_NOFOLLOW, another name tried while one exists), mode 0644 less the umask,
//   2. write every byte, fsync, close,
//   3. rename(temporary, path): atomic replacement (POSIX rename(2)),
//   4. fsync the directory, so that the rename itself is on disk.
// Every error after step 1 removes that temporary file and leaves `path` untouched; no other file
// is ever removed (a user's own "<path>.tmp", another writer's temporary, a link). Two writers of
// one `path` at once (two runs given the same --export FILE) each write their own temporary and
// each rename succeeds: `path` ends up holding the whole file of the writer whose rename came
// last, never a mix, and each writer's report ("exported FILE") was true when it was made (it
// renamed its complete file into place; a later rename replaced it, as a later run's would). A
// crash between 1 and 3 leaves a stray ".<name>.tmp.XXXXXX" and the old `path` untouched (it is
// not removed later: it could be another running writer's). This is what torch.save does not do
// (it writes in place), and what e.g. Orbax and DeepSpeed's checkpoint engines do. What `path` is
// decides how it is written, so that it behaves like torch.save / open(path, "wb"), which write
// through whatever the name refers to, and never replaces what is not a plain file:
//   - missing or a regular file: steps 1-4 on `path`; a file with other hard links is replaced,
//     not written through (the rename gives `path` a new file; the other names keep the old
//     contents), where open(path, "wb") would truncate and rewrite the one file all its names
//     share: the price of never leaving a half-written file;
//   - a symbolic link (to a link, ...): resolved to its final target first (resolve_links), and
//     steps 1-4 done on the target (its temporary next to it, renamed over it), so the link stays
//     a link and now points at the new contents; a dangling link creates its target, as
//     `echo > link` and open(link, "wb") do, in the target's directory, which must exist (the
//     start checks, check_replaceable_output, probe that directory, not the link's);
//   - a name of an open descriptor (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N):
//     written to that descriptor in place, after stdout and stderr are flushed, whatever it is
//     (a pipe, a terminal, or a file the shell redirected it to: `> out.txt` then keeps every
//     line printed before and after, where a rename would replace the file and lose them);
//   - a character device (/dev/null, a terminal) or a FIFO: written straight through, no
//     temporary, no rename, no fsync (there is no old content to keep; a FIFO blocks until a
//     reader opens it, as it would for any writer);
//   - anything else (a directory, a block device, a socket): refused with a ditto::Error naming
//     the path and what it is, and left untouched.
//
// Note [Bounded reads]
// Every file ditto reads is read by read_file (or InputFile) with a maximum size, so that a wrong
// name (`--data /dev/zero`, a FIFO, a 100 GB file) fails at once with a clear error rather than
// filling memory. The file must be a regular file (symbolic links to one are followed), of at most
// `max_bytes` bytes; otherwise ditto::Error names the path and its type, or its size and the
// maximum. The maxima, each checked before anything is allocated:
//   kMaxDataBytes        4 GiB   --data files: CSV (data::read_csv), text (train::TextDataSource)
//   kMaxJsonBytes       16 MiB   JSON: trainer.json of a checkpoint, device profiles (--profile)
//   kMaxSafetensorsHeaderBytes   100,000,000 bytes: a safetensors header (the reference
//                                implementation's MAX_HEADER_SIZE); the file's size must equal
//                                what the header's data_offsets describe before its tensor bytes
//                                are read (io::load_safetensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ditto::io {

/// The maxima of Note [Bounded reads].
inline constexpr std::uint64_t kMaxDataBytes = std::uint64_t{4} << 30;   // 4 GiB
inline constexpr std::uint64_t kMaxJsonBytes = std::uint64_t{16} << 20;  // 16 MiB
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// "a regular file", "a directory", "a character device", "a block device", "a FIFO", "a
/// socket", "a symbolic link" or "an unknown file type": what a stat(2) st_mode says.
const char* file_type_name(unsigned mode);

/// "4 GiB", "16 MiB", "100000000 bytes": a maximum of Note [Bounded reads] for messages.
std::string size_name(std::uint64_t bytes);

/// A regular file open for reading, of at most a maximum size (Note [Bounded reads]). Opening
/// does not block on a FIFO or a device (it is refused before any read).
class InputFile {
 public:
  /// Open `path`. `call` starts every message. Throws ditto::Error: "<call>: cannot open 'p':
  /// <OS reason>", "<call>: 'p' is a character device, expected a regular file", "<call>: 'p' has
  /// N bytes, more than the maximum of 4 GiB".
  InputFile(const std::string& path, std::uint64_t max_bytes, const char* call);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// The file's size when it was opened.
  std::uint64_t size() const { return size_; }
  /// The open file descriptor (e.g. for mmap(2)); owned by this object.
  int fd() const { return fd_; }
  /// Append the next `n` bytes to `out`. Throws ditto::Error naming the path and the OS reason,
  /// or that the file ended early (it shrank while being read).
  void read(std::string& out, std::uint64_t n);
  /// Append the rest of the file to `out`, at most up to the maximum. Throws ditto::Error on a
  /// read error or when the file has grown past the maximum.
  void read_rest(std::string& out);

 private:
  std::string path_;
  const char* call_;
  std::uint64_t max_, size_ = 0, at_ = 0;
  int fd_ = -1;
};

/// Whole contents of a regular file of at most `max_bytes` bytes (Note [Bounded reads]; blocks).
/// Throws ditto::Error naming the file and the OS error ("io::read_file: cannot open 'x': No such
/// file or directory"), what it is when it is not a regular file, or its size and the maximum.
std::string read_file(const std::string& path, std::uint64_t max_bytes = kMaxDataBytes,
                      const char* call = "io::read_file");

/// Replace `path` with `bytes` atomically (Note [Atomic write]); a symbolic link is written
/// through (its target replaced), a character device or FIFO written straight through. Blocks
/// until the data and the rename are on disk (fsync). Throws ditto::Error naming the file, the
/// step that failed and the OS error ("io::write_file_atomic: cannot write 'dir/.p.tmp.Ab3xY9': No
/// space left on device"), or naming the path and what it is for a directory, block device or
/// socket ("... 'd' is a directory, expected a regular file, a character device or a FIFO"); on
/// error its own temporary file is removed and `path` is unchanged.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// Write `path` atomically as steps 1-4 of Note [Atomic write] do, for a file ditto owns in a
/// directory it owns (a checkpoint's files, DIR/latest): `path` itself is replaced, whatever it
/// is: a symbolic link there is replaced by the new file, never followed, so that a link planted
/// in a checkpoint directory cannot make ditto overwrite the file it points at. The temporary
/// is open_temp_beside's (Note [Atomic write]).
/// Anything else already at `path` (a directory, a device, a FIFO) is refused, left untouched.
/// Throws ditto::Error as write_file_atomic does ("io::write_file_replace: cannot write 'p': it
/// is a directory, expected a regular file ...", "io::write_file_replace: cannot create ...").
void write_file_replace(const std::string& path, std::string_view bytes);

/// The file a chain of symbolic links `path` ends at, as write_file_atomic writes it (Note
/// [Atomic write]): while the final component is a link, it is replaced by the link's target
/// (a relative target taken from the link's directory); the directories on the way are left as
/// they are. `path` itself when it is no link (missing, a file, a dangling link's target). Throws
/// ditto::Error "<call>: cannot resolve symbolic link 'p': Too many levels of symbolic links"
/// after 40 links (a loop), or "<call>: cannot read symbolic link 'p': <reason>".
std::string resolve_links(const std::string& path, const char* call);

/// "dir/.name.tmp.XXXXXX" for "dir/name": the pattern of open_temp_beside's names (for messages
/// and for tests that look for leftovers).
std::string temp_template(const std::string& path);

/// Step 1 of Note [Atomic write]: creates a new empty file of a name no one else uses, beside
/// `path` (temp_template's X's replaced by random characters; O_CREAT | O_EXCL | O_NOFOLLOW,
/// mode 0644 less the umask), and returns its descriptor (open for writing, close-on-exec) and
/// its name. The caller removes it (or renames it) and closes the descriptor. Throws
/// ditto::Error "<call>: cannot create 'dir/.name.tmp.XXXXXX' (the temporary file for
/// 'dir/name'): <reason>".
std::pair<int, std::string> open_temp_beside(const std::string& path, const char* call);

/// open_temp_beside without the exception: the descriptor (its name in `tmp`), or -errno.
int open_temp_beside(const std::string& path, std::string& tmp) noexcept;

/// Removes the temporary file of every atomic write of this process that is between its create
/// and its rename now (write_file_atomic's, write_file_replace's; up to 64 at once, the rest are
/// left as a crash leaves them). Async-signal-safe (unlink(2) only): a signal handler that exits
/// at once calls it, so a write it interrupts leaves no temporary behind (ditto-train's second
/// Ctrl-C, Note [Graceful stop]). The writes themselves are not undone: the file they were
/// replacing stays as it was.
void remove_live_temporaries() noexcept;

/// The descriptor a name stands for: 1 for /dev/stdout, 2 for /dev/stderr, N for /dev/fd/N and
/// /proc/self/fd/N; -1 for any other name (these are written in place, Note [Atomic write]).
int fd_alias(const std::string& path);

/// Checks, before a long run, that an output `path` written in place (Note [Atomic write]) can
/// be written; true when `path` is such a file: a descriptor's name (open for writing, and a
/// write of 0 bytes to it succeeds), a character device (opened, and a write of 0 bytes
/// succeeds: /dev/full fails with "No space left on device") or a FIFO (writable by this
/// process; not opened, which would block until a reader comes). False for a regular file, a
/// missing one or a link to one, which the caller checks as a file replaced by rename. Throws
/// ditto::Error "<call>: cannot write '<path>': <reason>" or, for a directory, block device or
/// socket, naming what it is.
bool check_in_place_output(const std::string& path, const char* call);

/// A descriptor to write `path` line by line (JSON lines): a descriptor's name is dup'ed (written
/// in place, sharing its offset), anything else opened O_WRONLY | O_CREAT | O_TRUNC (a FIFO
/// blocks until a reader opens it). A write of 0 bytes is tried at once, so that /dev/full fails
/// here. Throws ditto::Error "<call>: cannot open '<path>' for writing: <reason>" (or "cannot
/// write '<path>': <reason>"). `append`: O_APPEND instead of O_TRUNC (a resumed run's records go
/// after its first part's).
int open_output_fd(const std::string& path, const char* call, bool append = false);

/// Write every byte of `bytes` to `fd` (retrying short writes and EINTR); for a descriptor that
/// may share its destination with stdout (`flush_stdio`), stdout and stderr are flushed first,
/// so that a line never lands in the middle of a printed one. Throws ditto::Error "<call>:
/// cannot write '<path>': <reason>".
void write_fd(int fd, std::string_view bytes, const std::string& path, const char* call,
              bool flush_stdio = true);

/// The same file by any spelling ("a/../b", relative or absolute, a symbolic link on the way),
/// existing or not: the weakly canonical absolute path, else `path` lexically normalised.
std::string same_file_key(const std::string& path);

/// A path and the name a program gives it in messages ({"--trace", "t.json"}).
using NamedPath = std::pair<std::string, std::string>;

/// Refuses, before a run starts, an output that would overwrite an input or another output
/// (a typo in a command line): each of `outputs` in order must be a file other than those of
/// `inputs` (every file the run reads: each of a list or glob, the validation files, the weights
/// it starts from) and of the outputs before it, and outside every directory of `dirs` (where
/// the run reads or writes its own files: a checkpoint directory, the one it resumes from). Two
/// paths that both exist are the same file when their st_dev and st_ino are (a symbolic or hard
/// link, "./x" and "x"); otherwise when the same_file_key of what each reaches through its
/// symbolic links is (resolve_links: a dangling link is its target, which a write creates, as
/// write_file_atomic resolves it; "/dev/stdout" itself). An output that exists as a
/// regular file must be one the process may write without changing its mode (root, whom the
/// permission bits do not stop, needs a w bit), as it is replaced or truncated. Entries with an
/// empty path are skipped. Throws InvalidArgument "OUT: expected a file other than IN 'q', got
/// 'p', which it would overwrite", "OUT: expected a file outside the DIR directory 'd', got
/// 'p'" or "OUT: expected a file it may replace, got 'p': Permission denied / read-only: remove
/// it or chmod u+w", OUT, IN and DIR the entries' names.
void check_outputs_are_not_inputs(const std::vector<NamedPath>& outputs,
                                  const std::vector<NamedPath>& inputs,
                                  const std::vector<NamedPath>& dirs);

/// Checks, before a long run, that a file the run will replace at its end by write_file_atomic
/// (a temporary file, then a rename) can be, probing exactly what that write will do: a symbolic
/// link is resolved first (resolve_links), and its final target must be a regular file or none
/// (a FIFO is refused, with a reader or not, and without opening it, so the check never blocks:
/// a file written into a pipe can end half-way; a directory cannot be replaced), an existing one
/// writable (a read-only one is refused rather than replaced behind its mode), and the target's
/// directory must exist and take new files (a temporary file of open_temp_beside's is created
/// beside the target and removed; no other file is touched). Throws InvalidArgument naming
/// `what` ("what: expected a regular file (or none: it is created), got 'p', a directory",
/// "what: expected a file in an existing directory, got 'p' (no directory 'd')", "... got 'l'
/// (a symbolic link to 't'; no directory 'd')", ...).
void check_replaceable_output(const std::string& path, const std::string& what);

// Note [Lost output]: a program whose results go to stdout must not exit 0 with every line lost
// when stdout cannot be written (`> /dev/full`, a closed descriptor `>&-`, a full disk). As
// coreutils' close_stdout: at exit stdout is flushed and closed, and an error on it (now or on an
// earlier write) prints "PROG: error: cannot write the results to stdout: <reason>" on stderr and
// exits 1. A descriptor 0, 1 or 2 closed at the start is first taken by /dev/null opened
// read-only (occupy_closed_std_fds), so that no file the program opens (a checkpoint's) becomes
// "stdout" and gets the result lines, and writes to it fail with EBADF as on the closed one.

/// Opens /dev/null read-only on each of descriptors 0, 1 and 2 that is closed (Note [Lost
/// output]). Call it first in main().
void occupy_closed_std_fds();

/// Flushes and closes stdout; returns `rc`, or 1 (when `rc` is 0) after printing "PROG: error:
/// cannot write the results to stdout: <reason>" on stderr when stdout had an error (Note [Lost
/// output]). Call it last: return close_stdout(run(...), "prog").
int close_stdout(int rc, const char* prog);

/// fsync a directory (makes renames and creations in it durable). Throws ditto::Error.
void fsync_dir(const std::string& dir);

/// Test-only hook: when set, write_file_atomic calls it once per file after writing the first
/// half of the bytes (before fsync and rename), with the final path, bytes written and total.
/// A test makes it throw (or SIGKILL the process) to simulate a crash in the middle of a write.
/// Not thread-safe: set it only while no write is in flight. An empty function unsets it.
void set_write_hook_for_testing(
    std::function<void(const std::string& path, std::size_t written, std::size_t total)> hook);

}  // namespace ditto::io
