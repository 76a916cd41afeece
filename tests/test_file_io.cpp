// io::write_file_atomic on links, FIFOs and directories (Note [Atomic write]) and the bounded
// readers of Note [Bounded reads] (core/io/file.h): read_file, read_csv, load_safetensors,
// read_checkpoint's trainer.json, JSON device profiles. Devices are never written: a FIFO stands
// in for /dev/null (the tests run as root in CI, where a wrong rename would replace /dev/null).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "backend_sim/profiles.h"
#include "core/checkpoint/checkpoint.h"
#include "core/data/csv.h"
#include "core/io/file.h"
#include "core/io/safetensors.h"
#include "core/train/metrics.h"
#include "temp_files.h"
#include "test_util.h"

namespace ditto {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

std::string fileio_dir(const std::string& name) { return test::fresh_dir("fileio", name); }

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A sparse file of `size` bytes (no disk space, no memory).
void sparse(const std::string& path, std::uint64_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
  ::close(fd);
}

// After `path` is made a sparse file of `size` bytes, read() throws E "<who>: '<path>' has
// <too_big>", too_big "<size> bytes, more than the maximum of <maximum>".
template <typename E>
void expect_too_big(const std::string& path, std::uint64_t size, const std::string& who,
                    const std::string& too_big, const std::function<void()>& read) {
  sparse(path, size);
  expect_error<E>(read, who + ": '" + path + "' has " + too_big);
}

TEST(FileIo, AtomicWriteThroughASymlinkReplacesTheTargetAndKeepsTheLink) {
  const std::string dir = fileio_dir("link");
  fs::create_directories(dir + "/real");
  write(dir + "/real/trace.json", "old");
  fs::create_symlink("real/trace.json", dir + "/link.json");    // relative, as `ln -s` makes
  fs::create_symlink(dir + "/link.json", dir + "/link2.json");  // a link to the link
  io::write_file_atomic(dir + "/link2.json", "new");
  EXPECT_TRUE(fs::is_symlink(dir + "/link2.json"));
  EXPECT_TRUE(fs::is_symlink(dir + "/link.json"));
  EXPECT_EQ(fs::read_symlink(dir + "/link.json").string(), "real/trace.json");
  EXPECT_EQ(io::read_file(dir + "/real/trace.json"), "new");
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  EXPECT_TRUE(test::temp_leftovers(dir + "/real").empty());
  // A dangling link creates its target, as `echo > link` does.
  fs::create_symlink("made.json", dir + "/dangling.json");
  io::write_file_atomic(dir + "/dangling.json", "made");
  EXPECT_TRUE(fs::is_symlink(dir + "/dangling.json"));
  EXPECT_EQ(io::read_file(dir + "/made.json"), "made");
  fs::remove_all(dir);
}

// What a file with another hard link gets (docs/cli.md, Note [Atomic write]): a file written
// whole (--export, --trace: write_file_atomic) is replaced, so the other name keeps the old
// contents, where torch.save's open(path, "wb") would rewrite the one file both names share; a
// file written line by line (--metrics-jsonl: JsonLinesWriter, opened with O_TRUNC, as
// open(path, "w")) is written through, so both names see the new lines. A symbolic link is
// followed by both (the link stays, its target gets the contents).
TEST(FileIo, AHardLinkIsReplacedByAnAtomicWriteAndWrittenThroughByJsonLines) {
  const std::string dir = fileio_dir("hard_link");
  write(dir + "/model.bin", "old");
  ASSERT_EQ(::link((dir + "/model.bin").c_str(), (dir + "/other.bin").c_str()), 0);
  io::write_file_atomic(dir + "/model.bin", "new");
  EXPECT_EQ(io::read_file(dir + "/model.bin"), "new");
  EXPECT_EQ(io::read_file(dir + "/other.bin"), "old");  // a file of its own now
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat((dir + "/model.bin").c_str(), &a), 0);
  ASSERT_EQ(::stat((dir + "/other.bin").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  EXPECT_EQ(b.st_nlink, 1u);

  write(dir + "/m.jsonl", "old line\n");
  ASSERT_EQ(::link((dir + "/m.jsonl").c_str(), (dir + "/other.jsonl").c_str()), 0);
  fs::create_symlink("m.jsonl", dir + "/link.jsonl");
  {
    train::JsonLinesWriter w(dir + "/link.jsonl");
    w.write(train::StepMetrics{});
  }
  EXPECT_TRUE(fs::is_symlink(dir + "/link.jsonl"));
  const std::string lines = io::read_file(dir + "/m.jsonl");
  EXPECT_NE(lines.find("\"event\":\"iter\""), std::string::npos) << lines;
  EXPECT_EQ(lines.find("old line"), std::string::npos) << lines;  // truncated, then written
  EXPECT_EQ(io::read_file(dir + "/other.jsonl"), lines);          // the same file
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

TEST(FileIo, AtomicWriteToAFifoWritesStraightThroughAndKeepsTheFifo) {
  const std::string dir = fileio_dir("fifo");
  const std::string fifo = dir + "/out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  // Our own reader end first (O_RDWR never blocks), so that the writer's open does not block.
  const int rd = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_GE(rd, 0);
  io::write_file_atomic(fifo, "through the fifo");
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "replaced by " << io::file_type_name(st.st_mode);
  char buf[64] = {};
  const ssize_t n = ::read(rd, buf, sizeof buf);
  ::close(rd);
  EXPECT_EQ(std::string(buf, n > 0 ? static_cast<std::size_t>(n) : 0), "through the fifo");
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

TEST(FileIo, AtomicWriteRefusesADirectoryNamingIt) {
  const std::string dir = fileio_dir("dir");
  fs::create_directories(dir + "/d");
  expect_error<Error>([&] { io::write_file_atomic(dir + "/d", "x"); },
                      "io::write_file_atomic: cannot write '" + dir +
                          "/d': it is a directory, expected a regular file, a character device "
                          "or a FIFO");
  fs::create_symlink("d", dir + "/to_d");
  expect_error<Error>([&] { io::write_file_atomic(dir + "/to_d", "x"); },
                      "cannot write '" + dir + "/to_d': '" + dir + "/d' is a directory");
  EXPECT_TRUE(fs::is_directory(dir + "/d"));
  EXPECT_TRUE(fs::is_empty(dir + "/d"));
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

TEST(FileIo, WriteErrorGivesTheOsReason) {
  expect_error<Error>(
      [&] { io::write_file_atomic("/nonexistent-dir/x/f.json", "x"); },
      "io::write_file_atomic: cannot create '/nonexistent-dir/x/.f.json.tmp.XXXXXX' "
      "(the temporary file for '/nonexistent-dir/x/f.json'): No such file or "
      "directory");
}

// Two writers of one file at once (tester4: two runs given the same --export FILE): each writes
// a temporary of its own, so both succeed and the file holds the whole bytes of the one whose
// rename came last. With one fixed name "FILE.tmp" the second writer removed the first's
// temporary, and the first failed ("cannot rename 'FILE.tmp' to 'FILE': No such file or
// directory") or renamed the second's bytes into place. Here the second write runs, whole,
// while the first is halfway (the write hook), then the first finishes: the first renames last.
TEST(FileIo, TwoWritersOfOneFileEachRenameTheirOwnWholeFile) {
  const std::string dir = fileio_dir("two_writers");
  const std::string path = dir + "/same.bin";
  const std::string first(100000, 'a'), second(120000, 'b');
  bool inner_done = false;
  std::string inner_error;
  io::set_write_hook_for_testing([&](const std::string&, std::size_t, std::size_t) {
    if (inner_done) return;
    inner_done = true;  // once: the nested write calls the hook too
    try {
      io::write_file_atomic(path, second);
      EXPECT_TRUE(io::read_file(path) == second);  // the second writer's report is true now
    } catch (const std::exception& e) {
      inner_error = e.what();
    }
  });
  std::string outer_error;
  try {
    io::write_file_atomic(path, first);
  } catch (const std::exception& e) {
    outer_error = e.what();
  }
  io::set_write_hook_for_testing({});
  EXPECT_TRUE(inner_done);
  EXPECT_EQ(inner_error, "");
  EXPECT_EQ(outer_error, "");
  std::string got = io::read_file(path);
  EXPECT_TRUE(got == first) << got.size() << " bytes";  // the rename that came last
  EXPECT_TRUE(test::temp_leftovers(dir).empty());

  // The same through write_file_replace (checkpoint files, DIR/latest).
  inner_done = false;
  io::set_write_hook_for_testing([&](const std::string&, std::size_t, std::size_t) {
    if (inner_done) return;
    inner_done = true;
    try {
      io::write_file_replace(path, second);
    } catch (const std::exception& e) {
      inner_error = e.what();
    }
  });
  try {
    io::write_file_replace(path, first + "2");
  } catch (const std::exception& e) {
    outer_error = e.what();
  }
  io::set_write_hook_for_testing({});
  EXPECT_EQ(inner_error, "");
  EXPECT_EQ(outer_error, "");
  got = io::read_file(path);
  EXPECT_TRUE(got == first + "2") << got.size() << " bytes";
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

// Two threads writing one file many times: every write succeeds and the file always holds one
// writer's whole bytes (never a mix, never another size); no temporary is left.
TEST(FileIo, ConcurrentWritersNeverFailNorMix) {
  const std::string dir = fileio_dir("concurrent_writers");
  const std::string path = dir + "/same.bin";
  const std::string bytes[2] = {std::string(50000, 'x'), std::string(70000, 'y')};
  std::vector<std::string> errors(2);
  test::run_threads(2, [&](int t) {
    for (int i = 0; i < 200; ++i) {
      try {
        io::write_file_atomic(path, bytes[t]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
        return;
      }
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  const std::string got = io::read_file(path);
  EXPECT_TRUE(got == bytes[0] || got == bytes[1]) << got.size() << " bytes";
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

// A file of the user's named like a temporary (tester4: --export FILE removed the user's own
// FILE.tmp) and a symbolic link there are left as they are; a failed write removes only its own
// temporary file.
TEST(FileIo, AWriteTouchesNoFileButItsOwnTemporary) {
  const std::string dir = fileio_dir("own_temporary");
  const std::string path = dir + "/model.bin";
  write(path + ".tmp", "the user's notes\n");
  write(dir + "/decoy", "precious\n");
  fs::create_symlink(dir + "/decoy", dir + "/.model.bin.tmp");
  io::write_file_atomic(path, "model");
  io::write_file_replace(path, "model2");
  io::check_replaceable_output(path, "--export llmc");
  EXPECT_EQ(io::read_file(path), "model2");
  EXPECT_EQ(io::read_file(path + ".tmp"), "the user's notes\n");
  EXPECT_EQ(io::read_file(dir + "/decoy"), "precious\n");
  EXPECT_TRUE(fs::is_symlink(dir + "/.model.bin.tmp"));
  EXPECT_TRUE(test::temp_leftovers(dir).empty());

  // A write that fails halfway (the hook throws, as a full disk would) removes its temporary.
  io::set_write_hook_for_testing(
      [](const std::string&, std::size_t, std::size_t) { throw Error("disk full (test)"); });
  expect_error<Error>([&] { io::write_file_atomic(path, "never"); }, "disk full (test)");
  expect_error<Error>([&] { io::write_file_replace(path, "never"); }, "disk full (test)");
  io::set_write_hook_for_testing({});
  EXPECT_EQ(io::read_file(path), "model2");
  EXPECT_EQ(io::read_file(path + ".tmp"), "the user's notes\n");
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  fs::remove_all(dir);
}

// A signal handler that exits at once (ditto-train's second Ctrl-C) calls
// remove_live_temporaries: the temporary of a write it interrupts is removed (tester5: a second
// Ctrl-C during --export left a 113 MB .big.bin.tmp.XXXXXX), the file it replaces is untouched,
// and temporaries of writes that finished are not listed.
TEST(FileIo, RemoveLiveTemporariesRemovesTheTemporaryOfAnInterruptedWrite) {
  const std::string dir = fileio_dir("live_temporaries");
  const std::string path = dir + "/model.bin";
  io::write_file_atomic(path, "old");
  io::write_file_replace(dir + "/done.bin", "finished");  // listed while it lived only
  std::vector<std::string> during, after;
  io::set_write_hook_for_testing([&](const std::string&, std::size_t, std::size_t) {
    during = test::temp_leftovers(dir);
    io::remove_live_temporaries();  // as the handler does, then it would _exit
    after = test::temp_leftovers(dir);
  });
  // The write goes on after the hook here (a handler would have exited): its rename finds no
  // temporary and fails, leaving the old file.
  expect_error<Error>([&] { io::write_file_atomic(path, "new model"); }, "cannot rename");
  io::set_write_hook_for_testing({});
  EXPECT_EQ(during.size(), 1u);
  EXPECT_TRUE(after.empty());
  EXPECT_EQ(io::read_file(path), "old");
  EXPECT_EQ(io::read_file(dir + "/done.bin"), "finished");
  EXPECT_TRUE(test::temp_leftovers(dir).empty());
  io::remove_live_temporaries();  // nothing live: nothing removed
  EXPECT_EQ(io::read_file(dir + "/done.bin"), "finished");
  fs::remove_all(dir);
}

// /dev/full (writes fail with ENOSPC) is opened in place by JsonLinesWriter (never renamed), so
// this test cannot replace it; a write of 0 bytes is tried when it opens (issue 31: the failure
// came at the first record, and ditto-train's --trace /dev/full after the whole run).
TEST(FileIo, JsonLinesWriteErrorGivesTheOsReasonAtOpen) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  expect_error<InvalidArgument>([&] { train::JsonLinesWriter w("/dev/full"); },
                                "JsonLinesWriter: path: cannot write '/dev/full': No space left "
                                "on device");
  expect_error<Error>([&] { io::check_in_place_output("/dev/full", "--trace"); },
                      "--trace: cannot write '/dev/full': No space left on device");
  struct stat st {};
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// A resumed run's JSON lines continue the file (append; tester: --metrics-jsonl was emptied by
// the resume, the first part's records lost), after a resume record; a stopped run ends with a
// stopped record (a reader could not tell a stop from a crash). A fresh writer still truncates.
TEST(FileIo, JsonLinesAppendAfterAResumeAndRecordAStop) {
  const std::string dir = fileio_dir("jsonl_resume");
  const std::string path = dir + "/m.jsonl";
  {
    train::JsonLinesWriter w(path);
    w.write_stopped("SIGTERM", 7, dir + "/ck/step-00000007");
    w.write_stopped("SIGUSR1", 8, "");
  }
  {
    train::JsonLinesWriter w(path, true);
    w.write_resume(dir + "/ck", 7);
  }
  EXPECT_EQ(io::read_file(path),
            "{\"checkpoint\":\"" + dir +
                "/ck/step-00000007\",\"event\":\"stopped\",\"signal\":\"SIGTERM\",\"step\":7}\n"
                "{\"event\":\"stopped\",\"signal\":\"SIGUSR1\",\"step\":8}\n"
                "{\"event\":\"resume\",\"from\":\"" +
                dir + "/ck\",\"step\":7}\n");
  { train::JsonLinesWriter w(path); }
  EXPECT_EQ(io::read_file(path), "");
  fs::remove_all(dir);
}

// Names of open descriptors (/dev/stdout, /dev/fd/N) are written to the descriptor in place:
// through a pipe (the rename went to "/proc/self/fd/pipe:[...].tmp"), and appended to what a
// redirected file already holds (a rename replaced it).
TEST(FileIo, DescriptorNamesAreWrittenInPlace) {
  EXPECT_EQ(io::fd_alias("/dev/stdout"), 1);
  EXPECT_EQ(io::fd_alias("/dev/stderr"), 2);
  EXPECT_EQ(io::fd_alias("/dev/fd/7"), 7);
  EXPECT_EQ(io::fd_alias("/proc/self/fd/12"), 12);
  EXPECT_EQ(io::fd_alias("/dev/fd/x"), -1);
  EXPECT_EQ(io::fd_alias("/tmp/stdout"), -1);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const std::string name = "/dev/fd/" + std::to_string(p[1]);
  EXPECT_TRUE(io::check_in_place_output(name, "x"));
  io::write_file_atomic(name, "first\n");
  {
    train::JsonLinesWriter w("/proc/self/fd/" + std::to_string(p[1]));  // dups the descriptor
    w.write(train::EpochMetrics{});
  }
  ::close(p[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  ::close(p[0]);
  EXPECT_EQ(got.rfind("first\n{", 0), 0u) << got;
  EXPECT_EQ(got.back(), '\n');
  EXPECT_NE(got.find("\"event\":\"epoch\""), std::string::npos) << got;
  // A regular file, missing or not, is not written in place; a closed descriptor is refused.
  const std::string dir = fileio_dir("inplace");
  EXPECT_FALSE(io::check_in_place_output(dir + "/new.json", "x"));
  expect_error<Error>([&] { io::check_in_place_output("/dev/fd/999", "--trace"); },
                      "--trace: cannot write '/dev/fd/999': Bad file descriptor");
}

TEST(FileIo, ReadFileRefusesWhatIsNotARegularFileAndPastItsMaximum) {
  const std::string dir = fileio_dir("read");
  expect_error<Error>([&] { io::read_file("/dev/zero"); },
                      "io::read_file: '/dev/zero' is a character device, expected a regular file");
  const std::string fifo = dir + "/in.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  // No writer: a blocking open would hang here.
  expect_error<Error>([&] { io::read_file(fifo, 100, "x"); },
                      "x: '" + fifo + "' is a FIFO, expected a regular file");
  expect_error<Error>([&] { io::read_file(dir, 100, "x"); },
                      "x: '" + dir + "' is a directory, expected a regular file");
  write(dir + "/small", "0123456789");
  EXPECT_EQ(io::read_file(dir + "/small", 10), "0123456789");
  expect_error<Error>([&] { io::read_file(dir + "/small", 9, "x"); },
                      "x: '" + dir + "/small' has 10 bytes, more than the maximum of 9 bytes");
  fs::create_symlink("small", dir + "/link");
  EXPECT_EQ(io::read_file(dir + "/link", 10), "0123456789");  // links to a file are followed
  EXPECT_EQ(io::size_name(io::kMaxDataBytes), "4 GiB");
  EXPECT_EQ(io::size_name(io::kMaxJsonBytes), "16 MiB");
  fs::remove_all(dir);
}

TEST(FileIo, ReadCsvRefusesADeviceAndAFileOverFourGiB) {
  const std::string dir = fileio_dir("csv");
  expect_error<ParseError>([&] { data::read_csv("/dev/zero"); },
                           "read_csv: '/dev/zero' is a character device, expected a regular file");
  expect_too_big<ParseError>(dir + "/big.csv", io::kMaxDataBytes + 1, "read_csv",
                             "4294967297 bytes, more than the maximum of 4 GiB",
                             [&] { data::read_csv(dir + "/big.csv"); });
  fs::remove_all(dir);
}

TEST(FileIo, JsonProfileRefusesAFifoAndAFileOverSixteenMiB) {
  const std::string dir = fileio_dir("profile");
  const std::string fifo = dir + "/p.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  expect_error<InvalidArgument>(
      [&] { sim::device_profile(fifo); },
      "device_profile: '" + fifo + "' is a FIFO, expected a regular file");
  expect_too_big<InvalidArgument>(dir + "/big.json", io::kMaxJsonBytes + 1, "device_profile",
                                  "16777217 bytes, more than the maximum of 16 MiB",
                                  [&] { sim::device_profile(dir + "/big.json"); });
  fs::remove_all(dir);
}

// A safetensors file from a raw header text and buffer.
std::string raw_safetensors(const std::string& header, const std::string& buffer) {
  std::string out;
  const std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  return out + header + buffer;
}

TEST(FileIo, LoadSafetensorsChecksTheSizeAgainstTheHeaderBeforeReadingTheBuffer) {
  const std::string dir = fileio_dir("st");
  expect_error<ParseError>([&] { io::load_safetensors("/dev/zero"); },
                           "io::load_safetensors: '/dev/zero' is a character device, expected a "
                           "regular file");
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  write(dir + "/ok.safetensors", raw_safetensors(header, std::string(4, '\0')));
  EXPECT_EQ(io::load_safetensors(dir + "/ok.safetensors").tensors.size(), 1u);
  // The same header, then 256 MiB of (sparse) zeros: refused before the buffer is read.
  write(dir + "/big.safetensors", raw_safetensors(header, ""));
  const std::uint64_t buffer = std::uint64_t{256} << 20;
  ASSERT_EQ(::truncate((dir + "/big.safetensors").c_str(),
                       static_cast<off_t>(8 + header.size() + buffer)),
            0);
  expect_error<ParseError>([&] { io::load_safetensors(dir + "/big.safetensors"); },
                           dir + "/big.safetensors: buffer: the header's data_offsets end at byte "
                                 "4, but the buffer after the header has 268435456 bytes");
  // A header length over the format's maximum: refused before anything else is read.
  std::string len(8, '\0');
  const std::uint64_t n = io::kMaxSafetensorsHeaderBytes + 1;
  for (int b = 0; b < 8; ++b)
    len[static_cast<std::size_t>(b)] = static_cast<char>((n >> (8 * b)) & 0xff);
  write(dir + "/hdr.safetensors", len + "{}");
  expect_error<ParseError>([&] { io::load_safetensors(dir + "/hdr.safetensors"); },
                           "header length: 100000001 bytes, expected at most 100000000");
  fs::remove_all(dir);
}

TEST(FileIo, ReadCheckpointRefusesATrainerJsonOverSixteenMiB) {
  const std::string dir = fileio_dir("ckpt");
  fs::create_directories(dir + "/step-00000001");
  expect_too_big<ParseError>(dir + "/step-00000001/trainer.json", io::kMaxJsonBytes + 1,
                             "read_checkpoint", "16777217 bytes, more than the maximum of 16 MiB",
                             [&] { read_checkpoint(dir + "/step-00000001"); });
  fs::remove_all(dir);
}

// A second process writing the same checkpoint directory is refused, naming the lock and the
// process; the lock is released when that process ends.
TEST(FileIo, CheckpointDirLockRefusesASecondProcessNamingIt) {
  const std::string dir = fileio_dir("lock");
  const std::string lock = dir + "/lock";
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only async-signal-safe calls: the parent may have threads
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    char pid[16];
    int n = 0;
    for (pid_t p = ::getpid(); p > 0; p /= 10) pid[n++] = static_cast<char>('0' + p % 10);
    for (int i = 0; i < n / 2; ++i) std::swap(pid[i], pid[n - 1 - i]);
    pid[n++] = '\n';
    const bool ok = fd >= 0 && ::flock(fd, LOCK_EX) == 0 && ::write(fd, pid, n) == n;
    char c = ok ? 'y' : 'n';
    (void)!::write(to_parent[1], &c, 1);
    (void)!::read(to_child[0], &c, 1);  // until the parent has tried
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  expect_error<Error>([&] { lock_checkpoint_dir(dir); },
                      "checkpoint: checkpoint directory '" + dir + "' is in use: its lock '" +
                          lock + "' is held by process " + std::to_string(child) +
                          " (another run writing the same directory)");
  (void)!::write(to_child[1], &c, 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  for (int fd : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(fd);
  lock_checkpoint_dir(dir);  // released with its process
  lock_checkpoint_dir(dir);  // again in this process: a no-op
  EXPECT_EQ(io::read_file(lock), std::to_string(::getpid()) + "\n");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ditto
