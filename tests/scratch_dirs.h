// The tests' scratch directories (Note [Test scratch directories]): fresh_dir and scratch_path
// name a path under gtest's TempDir() and register it with the test (or test suite) that asked;
// the listener of tests/main/scratch_cleanup.h, which each test binary's main installs, removes
// it when that test passes or skips and keeps it, naming it once, when the test fails. Only
// gtest and the standard library here: gtest_main_probe, which links no ditto, includes it too.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

namespace ditto::test {

// Note [Test scratch directories]
// A passing test leaves nothing in TempDir() (TEST_TMPDIR, else TMPDIR, else /tmp/): before,
// every ctest run left one ditto_<suite>_<name>_<pid> directory per test that wrote files (2476
// directories, 323 MB, after some 34 runs on one machine). A path is registered with
// the test running when it is named (UnitTest::current_test_info()), or, from a
// SetUpTestSuite, with the test suite (current_test_suite()); ScratchCleanup (scratch_cleanup.h)
// removes it at that test's OnTestEnd when the test did not fail (a skip included), at that
// suite's OnTestSuiteEnd, or at the end of the program for one named outside any suite. A
// failed test's directory is kept and its path printed once, as pytest's tmp_path keeps a
// failed test's, so that the failure can be looked at. The pid in the name keeps the processes
// of a parallel ctest (one a case, or one a group of cases) apart. A binary whose main installs
// no ScratchCleanup keeps the directories: ditto_tests, gtest_main_probe (both
// tests/main/gtest_main.cpp) and ditto_mpi_tests install it. Test ScratchDirs.*
// (tests/scratch_dirs.cmake) checks what a run leaves.

/// One registered path: the test or, when none was running, the test suite that named it.
struct ScratchEntry {
  std::string path;
  const ::testing::TestInfo* test = nullptr;
  const ::testing::TestSuite* suite = nullptr;
};

/// The process's registered paths (never destroyed: a listener may read it during exit).
struct ScratchRegistry {
  std::mutex mu;
  std::vector<ScratchEntry> entries;
};

inline ScratchRegistry& scratch_registry() {
  static ScratchRegistry* r = new ScratchRegistry;
  return *r;
}

/// TempDir()/ditto_<suite>_<name>_<pid>, with nothing there (removed first if it is there),
/// registered with the running test for removal when it passes (Note [Test scratch
/// directories]); for a directory that the code under test creates itself.
inline std::string scratch_path(const std::string& suite, const std::string& name) {
  const std::string leaf = "ditto_" + suite + "_" + name + "_" + std::to_string(::getpid());
  const std::filesystem::path p = std::filesystem::path(::testing::TempDir()) / leaf;
  std::filesystem::remove_all(p);
  const ::testing::UnitTest& u = *::testing::UnitTest::GetInstance();
  ScratchEntry e{p.string(), u.current_test_info(), u.current_test_suite()};
  ScratchRegistry& r = scratch_registry();
  const std::lock_guard<std::mutex> lock(r.mu);
  for (ScratchEntry& old : r.entries)
    if (old.path == e.path) {
      old = e;  // named again: the newest namer's
      return e.path;
    }
  r.entries.push_back(e);
  return e.path;
}

/// scratch_path(suite, name), created: a new, empty directory for a test's files.
inline std::string fresh_dir(const std::string& suite, const std::string& name) {
  const std::string p = scratch_path(suite, name);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace ditto::test
