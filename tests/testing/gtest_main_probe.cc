// A test binary for GtestMainTest (tests/engine/gtest_main_test.cc) to run with one filter at a
// time, never run by ctest itself: one test passes, one skips itself, one fails.
#include <gtest/gtest.h>

TEST(Probe, Passes) { SUCCEED(); }
TEST(Probe, Skips) { GTEST_SKIP() << "as a test without its GPU does"; }
TEST(Probe, Fails) { FAIL() << "as a broken test does"; }
