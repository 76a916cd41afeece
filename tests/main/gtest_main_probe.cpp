// Cases for the ctests GtestMain.* (tests/CMakeLists.txt): gtest_main.cpp's exit status for a
// run whose selected cases all skipped, some skipped, or one failed (Note [Grouped gtest ctests]);
// and for ScratchDirs.probe (tests/scratch_dirs.cmake), the ProbeScratch* cases: what its
// listener leaves of their scratch directories (Note [Test scratch directories]).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../scratch_dirs.h"

TEST(Probe, Skips) { GTEST_SKIP() << "probe: skipped on purpose"; }
TEST(Probe, Passes) { EXPECT_EQ(1 + 1, 2); }
TEST(Probe, Fails) { EXPECT_EQ(1 + 1, 3) << "probe: fails on purpose"; }

namespace {

namespace fs = std::filesystem;
using ditto::test::fresh_dir;
using ditto::test::scratch_path;

// A file two levels down in `dir`: what a test leaves in its scratch directory.
void fill(const std::string& dir) {
  fs::create_directories(dir + "/sub");
  std::ofstream(dir + "/sub/file") << "probe\n";
}

// Removed after it (passed).
TEST(ProbeScratch, Passes) {
  const std::string dir = fresh_dir("probe", "passes");
  fill(dir);
  EXPECT_TRUE(fs::is_regular_file(dir + "/sub/file"));
}

// Kept, and its path printed once (failed).
TEST(ProbeScratch, Fails) {
  fill(fresh_dir("probe", "fails"));
  ADD_FAILURE() << "probe: fails on purpose";
}

// Removed (skipped: no failure).
TEST(ProbeScratch, Skips) {
  fill(fresh_dir("probe", "skips"));
  GTEST_SKIP() << "probe: skipped on purpose";
}

// Named twice, created by "the code under test" (here the test itself): removed once.
TEST(ProbeScratch, NamesAPathTwice) {
  const std::string dir = scratch_path("probe", "twice");
  EXPECT_EQ(scratch_path("probe", "twice"), dir);
  fill(dir);
}

// A directory of the suite (SetUpTestSuite): removed after the suite, whose cases passed.
class ProbeScratchSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = fresh_dir("probe", "suite"); }
  static std::string dir_;
};
std::string ProbeScratchSuite::dir_;

TEST_F(ProbeScratchSuite, First) { fill(dir_); }
TEST_F(ProbeScratchSuite, SecondSeesTheFirstsFile) {
  EXPECT_TRUE(fs::is_regular_file(dir_ + "/sub/file"));
}

// A directory of a suite one of whose cases failed: kept after the suite.
class ProbeScratchFailedSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fill(fresh_dir("probe", "failed_suite")); }
};

TEST_F(ProbeScratchFailedSuite, Passes) { EXPECT_EQ(1 + 1, 2); }
TEST_F(ProbeScratchFailedSuite, Fails) { ADD_FAILURE() << "probe: fails on purpose"; }

}  // namespace
