// F5: a framework silently wrapped data-parallel replicas and the step count halved. A stage that
// starts from another stage's checkpoint has exactly the steps, batch and world size of the same
// stage started from the original weights, and takes none of them from its parent.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

nlohmann::json PlanOf(const std::filesystem::path& pipeline) {
  auto r = testing::RunEngine({"check", pipeline.string(), "--format=json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r.exit_code == 0 ? nlohmann::json::parse(r.out)["plan"] : nlohmann::json();
}

nlohmann::json StageNamed(const nlohmann::json& plan, const std::string& name) {
  for (const auto& stage : plan["stages"]) {
    if (stage["name"] == name) return stage;
  }
  ADD_FAILURE() << "no stage " << name;
  return {};
}

// For the small VLM's recipes and for Qwen2-VL's.
TEST(F5StagedStepCountTest, TheSecondStageOfR3RunsTheStepsOfR1) {
  const std::filesystem::path pipelines = std::filesystem::path(testing::kSourceDir) / "pipelines";
  for (auto [r1_file, r3_file, steps] :
       {std::tuple{"r1_llm_only.pbtxt", "r3_two_stage.pbtxt", 270},
        std::tuple{"qwen2_vl_r1.pbtxt", "qwen2_vl_r3.pbtxt", 450}}) {
    SCOPED_TRACE(r3_file);
    const auto r1 = StageNamed(PlanOf(pipelines / r1_file), "llm");
    const auto r3 = StageNamed(PlanOf(pipelines / r3_file), "llm");
    EXPECT_EQ(r3["from_stage"], "vision");
    for (const char* key : {"total_steps", "steps_per_epoch", "batch_size", "global_batch",
                            "gradient_accumulation_steps"}) {
      EXPECT_EQ(r3["schedule"][key], r1["schedule"][key]) << key;
    }
    EXPECT_EQ(r3["schedule"]["total_steps"], steps);
    EXPECT_EQ(r3["world_size"], 1);
    EXPECT_EQ(r1["world_size"], 1);
  }
}

TEST(F5StagedStepCountTest, AChildNeverInheritsItsParentsBatchOrSteps) {
  testing::TempDir tmp;
  auto stage = [](const std::string& name, const std::string& extra) {
    return testing::DigitsStage(name, extra);
  };
  const auto file =
      tmp.Write("p.pbtxt", "output_dir: \"out\"\n" +
                               stage("parent",
                                     "  schedule { max_steps: 7 batch_size: 64 "
                                     "gradient_accumulation_steps: 2 }") +
                               stage("child", "  from_stage: \"parent\"") + stage("alone", ""));
  const auto plan = PlanOf(file);
  const auto child = StageNamed(plan, "child");
  const auto alone = StageNamed(plan, "alone");
  EXPECT_EQ(child["schedule"], alone["schedule"]);
  EXPECT_EQ(child["schedule"]["batch_size"], 32);
  EXPECT_EQ(child["schedule"]["steps_per_epoch"], 45);  // 1,438 training images / 32
  EXPECT_EQ(child["world_size"], 1);
}

}  // namespace
}  // namespace engine
