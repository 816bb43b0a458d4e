// The test binaries' main (tests/testing/gtest_main.cc), by its exit status, which is what ctest
// reads (cmake/list_test_suites.cmake: SKIP_RETURN_CODE 77): skipped only when every test of the
// filter skipped; failed whenever one failed, even when none passed.
#include <gtest/gtest.h>

#include "testing/subprocess.h"

namespace engine {
namespace {

int ExitStatusWith(const std::string& filter) {
  return testing::RunCommand({ENGINE_GTEST_MAIN_PROBE, "--gtest_filter=" + filter}).exit_code;
}

TEST(GtestMainTest, ExitStatusSaysPassedSkippedOrFailed) {
  EXPECT_EQ(ExitStatusWith("Probe.Passes"), 0);
  EXPECT_EQ(ExitStatusWith("Probe.Passes:Probe.Skips"), 0);
  EXPECT_EQ(ExitStatusWith("Probe.Skips"), 77);
  EXPECT_EQ(ExitStatusWith("Probe.Fails"), 1);
  EXPECT_EQ(ExitStatusWith("Probe.Skips:Probe.Fails"), 1);
}

}  // namespace
}  // namespace engine
