// The main of every test binary ctest runs: GoogleTest's, and one exit status more. A run in which
// no selected test passed and none failed (each skipped itself with GTEST_SKIP: no CUDA device
// here, no Python reference) exits with kAllSkipped, which ctest reports as Skipped
// (SKIP_RETURN_CODE, cmake/list_test_suites.cmake). A run with a failure exits 1 and is reported
// Failed, even when no test passed: matching GoogleTest's "[  PASSED  ] 0 tests." instead said
// Skipped for a suite whose every test failed.
#include <gtest/gtest.h>

namespace {
constexpr int kAllSkipped = 77;  // cmake/list_test_suites.cmake's SKIP_RETURN_CODE
}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int status = RUN_ALL_TESTS();
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  if (status == 0 && run.successful_test_count() == 0 && run.failed_test_count() == 0) {
    return kAllSkipped;
  }
  return status;
}
