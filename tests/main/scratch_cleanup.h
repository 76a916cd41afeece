// ScratchCleanup: the gtest listener that removes the scratch directories of the tests that
// passed and keeps those of the tests that failed (Note [Test scratch directories],
// tests/scratch_dirs.h). A test binary's main installs it before RUN_ALL_TESTS:
//   ::testing::UnitTest::GetInstance()->listeners().Append(new ditto::test::ScratchCleanup);
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "../scratch_dirs.h"

namespace ditto::test {

class ScratchCleanup : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& t) override {
    settle([&](const ScratchEntry& e) { return e.test == &t; }, !t.result()->Failed(),
           std::string("test ") + t.test_suite_name() + "." + t.name());
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& s) override {
    settle([&](const ScratchEntry& e) { return e.test == nullptr && e.suite == &s; }, !s.Failed(),
           std::string("test suite ") + s.name());
  }
  void OnTestProgramEnd(const ::testing::UnitTest& u) override {
    settle([](const ScratchEntry&) { return true; }, !u.Failed(), "test program");
  }

 private:
  // Takes the entries `mine` selects out of the registry; removes their paths when `passed`,
  // else prints each path once, kept for `owner` (its failure is to be looked at there); a path
  // that was named but never created is only forgotten.
  static void settle(const std::function<bool(const ScratchEntry&)>& mine, bool passed,
                     const std::string& owner) {
    std::vector<ScratchEntry> taken;
    {
      ScratchRegistry& r = scratch_registry();
      const std::lock_guard<std::mutex> lock(r.mu);
      std::vector<ScratchEntry> rest;
      for (ScratchEntry& e : r.entries) (mine(e) ? taken : rest).push_back(std::move(e));
      r.entries = std::move(rest);
    }
    for (const ScratchEntry& e : taken) {
      std::error_code ec;
      if (!std::filesystem::exists(std::filesystem::symlink_status(e.path, ec))) continue;
      if (!passed) {
        std::printf("ditto: kept %s, the scratch directory of the failed %s\n", e.path.c_str(),
                    owner.c_str());
        continue;
      }
      std::filesystem::remove_all(e.path, ec);
      if (ec)
        std::printf("ditto: could not remove %s, the scratch directory of the %s: %s\n",
                    e.path.c_str(), owner.c_str(), ec.message().c_str());
    }
    std::fflush(stdout);
  }
};

}  // namespace ditto::test
