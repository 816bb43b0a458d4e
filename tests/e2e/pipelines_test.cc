// Every pipeline shipped in pipelines/ passes `engine check`, from any working directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "testing/subprocess.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

TEST(PipelinesTest, EveryShippedPipelinePassesCheck) {
  const std::filesystem::path dir = std::filesystem::path(testing::kSourceDir) / "pipelines";
  int checked = 0;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    if (item.path().extension() != ".pbtxt") continue;
    auto r = testing::RunEngine({"check", item.path().string()}, "/");
    EXPECT_EQ(r.exit_code, 0) << item.path() << "\n" << r.err;
    EXPECT_THAT(r.out, ::testing::HasSubstr("world size 1")) << item.path();
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

}  // namespace
}  // namespace engine
