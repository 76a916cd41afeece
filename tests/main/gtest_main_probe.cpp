// Cases for the ctests GtestMain.* (tests/CMakeLists.txt): gtest_main.cpp's exit status for a
// run whose selected cases all skipped, some skipped, or one failed (Note [Grouped gtest ctests]).
#include <gtest/gtest.h>

TEST(Probe, Skips) { GTEST_SKIP() << "probe: skipped on purpose"; }
TEST(Probe, Passes) { EXPECT_EQ(1 + 1, 2); }
TEST(Probe, Fails) { EXPECT_EQ(1 + 1, 3) << "probe: fails on purpose"; }
