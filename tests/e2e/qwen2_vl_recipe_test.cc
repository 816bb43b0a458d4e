// pipelines/qwen2_vl_r3.pbtxt, the main job, as the README runs it: Qwen2-VL's architecture (a tiny
// random qwen2_vl) learns to name handwritten digits from PNG images in chat form, through the
// seeds' two stages (the vision tower in full with the decoder frozen, then the decoder in NF4
// with LoRA). The plan accounts for the images and each tower's tensors; the answers come out
// right far more often than always giving the most common answer; the checkpoint is a Qwen2-VL
// directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(Qwen2VlRecipeTest, R3NamesTheDigitsInTheImages) {
  const fs::path pipeline = fs::path(testing::kSourceDir) / "pipelines/qwen2_vl_r3.pbtxt";
  testing::TempDir tmp;
  const std::string output_dir = "--output_dir=" + (tmp.path() / "out").string();
  const auto run = testing::RunEngine({"run", pipeline.string(), output_dir});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("1,797 images (1,797 greyscale converted to RGB); image tokens "
                                 "min/median/max 4/4/4"));
  EXPECT_THAT(run.out, HasSubstr("pixel_values f32[?,1176], image_grid_thw i64[?,3]"));
  // Stage `vision` trains the vision tower and freezes the decoder; `llm` the reverse, in 4 bits.
  EXPECT_TRUE(
      std::regex_search(run.out, std::regex("stage 'vision'[^]*census[^]*visual +trainable")));
  EXPECT_TRUE(std::regex_search(
      run.out, std::regex("stage 'llm'[^]*quantizer +nf4 0.1.0: 14 linear layers")));

  const auto eval =
      testing::RunEngine({"eval", pipeline.string(), output_dir, "--stage=llm", "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  const double exact = report["metrics"]["eval/exact_match"];
  const double baseline = report["baselines"]["eval/exact_match"];
  EXPECT_LT(baseline, 0.15);
  EXPECT_GT(exact, 0.6) << eval.out;
  EXPECT_GT(report["metrics"]["eval/eos_accuracy"].get<double>(), 0.9);

  const auto config = nlohmann::json::parse(
      testing::ReadText(tmp.path() / "out" / "llm" / "final" / "config.json"));
  EXPECT_EQ(config["model_type"], "qwen2_vl");
  EXPECT_EQ(config["vision_config"]["embed_dim"], 64);
  EXPECT_EQ(config["rope_scaling"]["mrope_section"], nlohmann::json({4, 6, 6}));
}

}  // namespace
}  // namespace engine
