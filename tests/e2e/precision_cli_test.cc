// Precision as a user meets it at the command line: the census and the plan in `engine check`, the
// census again when a stage starts, and bad precision input refused at check time with positions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "precision/device_capability.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

std::string StageWith(const std::string& precision) {
  // These tests are about the CPU; on a GPU machine "auto" would pick the GPU.
  return "output_dir: \"out\"\n" + testing::DigitsStage("s", precision +
                                                                 "  schedule { max_steps: 5 }\n"
                                                                 "  parallel { device: \"cpu\" }");
}

testing::CommandResult Check(const testing::TempDir& dir, const std::string& text) {
  auto file = dir.Write("p.pbtxt", text);
  return testing::RunEngine({"check", "p.pbtxt"}, dir.path().string());
}

TEST(PrecisionCliTest, PlanShowsCensusAndGroupsAndRunShowsTheCensusAgain) {
  testing::TempDir dir;
  const std::string text = StageWith(testing::Precision("bf16-true", "keep_fp32: \"head.*\""));
  auto check = Check(dir, text);
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.out, HasSubstr("census      as loaded (cpu "));
  EXPECT_THAT(check.out,
              HasSubstr("layers            trainable            f32          2         8,320"));
  EXPECT_THAT(check.out, HasSubstr("precision   bf16-true; autocast bf16; no loss scaling"));
  EXPECT_THAT(check.out, HasSubstr("as the pipeline asks; casts 2 tensor(s) f32 to bf16"));
  EXPECT_THAT(check.out,
              HasSubstr("trainable                    2         8,320    49.9 KB  bf16    "
                        "bf16    bf16  f32    f32"));
  EXPECT_THAT(check.out,
              HasSubstr("trainable, kept f32          2         1,290     5.2 KB  f32     "
                        "bf16    f32   f32    f32"));
  auto run = testing::RunEngine({"run", "p.pbtxt"}, dir.path().string());
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("stage 's' starts: bf16-true applied (autocast cpu bf16); census "
                                 "now:\n"));
  EXPECT_THAT(run.out,
              HasSubstr("    layers            trainable            bf16         2         8,320"));
  EXPECT_THAT(run.out,
              HasSubstr("    head              trainable, kept f32  f32          2         1,290"));
}

TEST(PrecisionCliTest, BadPrecisionInputIsRefusedWithPositions) {
  testing::TempDir dir;
  struct Case {
    std::string name;
    std::string precision;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"unknown policy", "  precision { plugin: \"bf17-mixed\" }\n",
       "p.pbtxt:6:15: error: stage 's': unknown precision policy plugin 'bf17-mixed'"},
      {"bf16 with loss scaling",
       testing::Precision("bf16-mixed", "loss_scaling { initial_scale: 1024 }"),
       "p.pbtxt:6:100: error: stage 's' precision policy 'bf16-mixed': options.loss_scaling: "
       "bf16-mixed does not scale the loss: bf16 has f32's range"},
      {"keep_fp32 matching nothing", testing::Precision("bf16-true", "keep_fp32: \"norm.*\""),
       "p.pbtxt:6:99: error: stage 's' precision policy 'bf16-true': options.keep_fp32[0]: "
       "pattern 'norm.*' matches no parameter or buffer"},
      {"another policy's dtype", testing::Precision("bf16-mixed", "compute_dtype: \"fp16\""),
       "p.pbtxt:6:100: error: stage 's' precision policy 'bf16-mixed': options.compute_dtype: "
       "bf16-mixed computes in bf16, not f16"},
  };
  for (const Case& c : cases) {
    auto r = Check(dir, StageWith(c.precision));
    EXPECT_EQ(r.exit_code, 1) << c.name;
    EXPECT_THAT(r.err, HasSubstr(c.expected)) << c.name;
  }
}

TEST(PrecisionCliTest, ADtypeTheDeviceCannotComputeIsRefused) {
  if (ProbeDevice("cpu").fp16_autocast) GTEST_SKIP() << "this LibTorch autocasts fp16 on the CPU";
  testing::TempDir dir;
  auto r = Check(dir, StageWith(testing::Precision("fp16-mixed")));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("p.pbtxt:6:3: error: stage 's' precision policy 'fp16-mixed': "
                               "fp16-mixed computes in fp16, but cpu "));
  EXPECT_THAT(r.err, HasSubstr("cannot run fp16 matrix products or fp16 autocast on the CPU"));
}

TEST(PrecisionCliTest, JsonCarriesTheWholePlan) {
  testing::TempDir dir;
  auto file = dir.Write("p.pbtxt", StageWith(testing::Precision("bf16-mixed")));
  auto r = testing::RunEngine({"check", file.string(), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto stage = nlohmann::json::parse(r.out)["plan"]["stages"][0];
  EXPECT_EQ(stage["precision"]["policy"], "bf16-mixed");
  EXPECT_EQ(stage["precision"]["autocast"], "bf16");
  EXPECT_TRUE(stage["precision"]["loss_scaling"].is_null());
  EXPECT_EQ(stage["precision"]["tensors"].size(), 4u);
  EXPECT_EQ(stage["precision"]["tensors"][0]["compute"], "bf16");
  EXPECT_EQ(stage["precision"]["tensors"][0]["master"], "f32");
  EXPECT_EQ(stage["census_summary"].size(), 2u);
  EXPECT_EQ(stage["device_capability"]["device"], "cpu");
  EXPECT_TRUE(stage["device_capability"]["bf16"]);
}

}  // namespace
}  // namespace engine
