// ditto_tests' main: gtest's, plus one flag for the grouped ctests of the check build
// (Note [Grouped gtest ctests], tests/cmake/gtest_groups.cmake), and the listener that removes
// the scratch directories of the tests that passed (Note [Test scratch directories],
// tests/scratch_dirs.h).
//
//   --ditto_all_skipped_exit_code=N   exit N (ctest's SKIP_RETURN_CODE) when every test the
//                                     filter selected was skipped (GTEST_SKIP) and none failed
//
// A group of several cases runs in one process; ctest can mark a test skipped by its exit code
// or by a regular expression over its output, and the expression (what gtest_discover_tests
// uses for one case per process) would mark a group skipped when any one of its cases skips,
// hiding the others' results. The exit code says skipped only when all were.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "scratch_cleanup.h"

int main(int argc, char** argv) {
  constexpr const char* kFlag = "--ditto_all_skipped_exit_code=";
  int all_skipped_code = -1;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], kFlag, std::strlen(kFlag)) == 0) {
      const char* value = argv[i] + std::strlen(kFlag);
      char* end = nullptr;
      const long code = std::strtol(value, &end, 10);
      if (*value == '\0' || *end != '\0' || code < 1 || code > 255) {
        std::fprintf(stderr, "ditto_tests: %s: expected an exit status in [1, 255], got '%s'\n",
                     kFlag, value);
        return 2;
      }
      all_skipped_code = static_cast<int>(code);
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  argv[argc] = nullptr;
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ditto::test::ScratchCleanup);
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  if (rc == 0 && all_skipped_code > 0 && u.test_to_run_count() > 0 &&
      u.skipped_test_count() == u.test_to_run_count())
    return all_skipped_code;
  return rc;
}
