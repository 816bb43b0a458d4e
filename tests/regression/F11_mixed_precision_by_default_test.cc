// F11: users turned mixed precision off to escape these bugs, paying about 2x. Mixed precision is
// the default that works: a stage without `precision` gets `auto`, which picks a mixed policy
// wherever the device computes low precision in hardware, and bf16 training matches f32's accuracy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine/torch_compat.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// The digits stage's accuracy under `precision`; `out`, when given, gets what `engine run` printed.
double RunAccuracy(const testing::TempDir& dir, const std::string& name,
                   const std::string& precision, std::string* out = nullptr) {
  auto file =
      dir.Write(name + ".pbtxt",
                "output_dir: \"" + name + "\"\nseed: 7\n" +
                    testing::DigitsStage("s", precision + "  optimizer { learning_rate: 0.003 }\n"
                                                          "  schedule { epochs: 15 }"));
  auto r = testing::RunEngine({"run", file.string()}, dir.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (out != nullptr) *out = r.out;
  std::smatch match;
  EXPECT_TRUE(std::regex_search(r.out, match, std::regex("accuracy ([0-9.]+)"))) << r.out;
  return match.size() > 1 ? std::stod(match[1]) : 0;
}

TEST(F11MixedPrecisionByDefaultTest, TheDefaultIsAuto) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", testing::DigitsStage("s", ""));
  auto r = testing::RunEngine({"check", file.string(), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto stage = nlohmann::json::parse(r.out)["plan"]["stages"][0];
  EXPECT_EQ(stage["precision"]["requested"], "auto");
  // auto goes mixed exactly when this machine computes bf16 in hardware.
  const bool bf16_hardware = stage["device_capability"]["bf16_fast"];
  EXPECT_EQ(stage["precision"]["policy"], bf16_hardware ? "bf16-mixed" : "fp32");
}

TEST(F11MixedPrecisionByDefaultTest, Bf16MixedMatchesF32WithinOnePoint) {
  testing::TempDir dir;
  const double f32 = RunAccuracy(dir, "f32", testing::Precision("fp32"));
  const double bf16 = RunAccuracy(dir, "bf16", testing::Precision("bf16-mixed"));
  const double bf16_true = RunAccuracy(dir, "bf16true", testing::Precision("bf16-true"));
  EXPECT_GE(f32, 0.9);
  EXPECT_NEAR(bf16, f32, 0.01);
  EXPECT_NEAR(bf16_true, f32, 0.01);
}

// F7 where fp16 is computed in hardware: fp16-mixed scales the loss (f32 masters, overflowed steps
// skipped) and learns what f32 learns. The CPU refuses fp16 products at `engine check`.
TEST(F11MixedPrecisionByDefaultTest, Fp16MixedOnAGpuScalesTheLossAndMatchesF32WithinOnePoint) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  testing::TempDir dir;
  std::string printed;
  const double f32 = RunAccuracy(dir, "f32", testing::Precision("fp32"));
  const double fp16 = RunAccuracy(dir, "fp16", testing::Precision("fp16-mixed"), &printed);
  EXPECT_THAT(printed, HasSubstr("fp16-mixed applied"));
  EXPECT_THAT(printed, HasSubstr(", loss scale "));
  EXPECT_GE(f32, 0.9);
  EXPECT_NEAR(fp16, f32, 0.01);
}

}  // namespace
}  // namespace engine
