// pipelines/qwen2_vl_r3.pbtxt, the main job, as the README runs it: Qwen2-VL's architecture (a tiny
// random qwen2_vl) learns to name handwritten digits from PNG images in chat form, through the
// seeds' two stages (the vision tower in full with the decoder frozen, then the decoder in NF4
// with LoRA), after the warm-ups that stand in for a pretrained decoder. The plan accounts for the
// images and each tower's tensors; the answers come out right far more often than always giving the
// most common answer, also when `engine generate` is asked about images; the checkpoint and its hf
// export are Qwen2-VL directories.
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
      run.out, std::regex("stage 'llm'[^]*quantizer +nf4 0.2.0: 14 linear layers")));

  const auto eval =
      testing::RunEngine({"eval", pipeline.string(), output_dir, "--stage=llm", "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  const double exact = report["metrics"]["eval/exact_match"];
  const double baseline = report["baselines"]["eval/exact_match"];
  EXPECT_LT(baseline, 0.15);
  // The recipe ends at 0.85 to 0.94 over seeds 1-5 on one thread and two (numerics that differ in
  // the last bits): the floor holds for any of them (docs/staged_runs.md, "The main job").
  EXPECT_GE(exact, 0.85) << eval.out;
  EXPECT_GT(report["metrics"]["eval/eos_accuracy"].get<double>(), 0.9);

  // Talking to the result: the first ten digits (0 to 9, train and eval alike) asked about one by
  // one through the stage's own image processor, kept beside its checkpoint.
  const fs::path final_dir = tmp.path() / "out" / "llm" / "final";
  EXPECT_TRUE(fs::exists(final_dir / "preprocessor_config.json"));
  const char* names[] = {"zero", "one", "two",   "three", "four",
                         "five", "six", "seven", "eight", "nine"};
  const fs::path images = fs::path(testing::kSourceDir) / "data/digit_chat/images";
  std::string lines;
  for (int digit = 0; digit < 10; ++digit) {
    char name[16];
    std::snprintf(name, sizeof(name), "%04d.png", digit);
    lines +=
        nlohmann::json({{"prompt", "What digit is this?"}, {"images", {(images / name).string()}}})
            .dump() +
        "\n";
  }
  const auto prompts = tmp.Write("digits.jsonl", lines);
  const auto generated =
      testing::RunEngine({"generate", pipeline.string(), output_dir, "--format=json",
                          "--batch_size=4", "--input=" + prompts.string()});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const auto outputs = nlohmann::json::parse(generated.out)["outputs"];
  ASSERT_EQ(outputs.size(), 10u);
  int right = 0;
  for (int digit = 0; digit < 10; ++digit) {
    EXPECT_EQ(outputs[digit]["finish_reason"], "stop") << outputs[digit];
    right += outputs[digit]["text"] == names[digit] ? 1 : 0;
  }
  EXPECT_GE(right, 5) << generated.out;  // chance: 1 in 10 each

  // A plain --prompt with --image, and an image the processor cannot take.
  const auto one = testing::RunEngine({"generate", pipeline.string(), output_dir,
                                       "--image=" + (images / "0007.png").string(),
                                       "--prompt=What digit is this?"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_THAT(one.out, HasSubstr("seven"));
  const auto text = tmp.Write("not_an_image.png", "text");
  const auto bad = testing::RunEngine({"generate", pipeline.string(), output_dir,
                                       "--image=" + text.string(), "--prompt=What digit?"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.err, HasSubstr("--prompt 1: image '" + text.string() +
                                 "' is neither a PNG nor a JPEG file"));

  // Exported as a dense Hugging Face directory (adapters merged), it is a Qwen2-VL directory with
  // its image processor, and talks about images too.
  const fs::path exported = tmp.path() / "hf";
  const auto exporting = testing::RunEngine(
      {"export", pipeline.string(), output_dir, "--to=" + exported.string(), "--format=hf"});
  ASSERT_EQ(exporting.exit_code, 0) << exporting.err;
  EXPECT_EQ(testing::ReadText(exported / "preprocessor_config.json"),
            testing::ReadText(fs::path(testing::kSourceDir) /
                              "pipelines/qwen2_vl_tiny/preprocessor_config.json"));
  const auto from_export = testing::RunEngine({"generate", exported.string(), "--format=json",
                                               "--image=" + (images / "0007.png").string(),
                                               "--prompt=What digit is this?"});
  ASSERT_EQ(from_export.exit_code, 0) << from_export.err;
  EXPECT_EQ(nlohmann::json::parse(from_export.out)["outputs"][0]["finish_reason"], "stop");

  const auto config = nlohmann::json::parse(
      testing::ReadText(tmp.path() / "out" / "llm" / "final" / "config.json"));
  EXPECT_EQ(config["model_type"], "qwen2_vl");
  EXPECT_EQ(config["vision_config"]["embed_dim"], 64);
  EXPECT_EQ(config["rope_scaling"]["mrope_section"], nlohmann::json({4, 6, 6}));
}

// pipelines/qwen2_5_vl_r3.pbtxt: the same recipe and data on Qwen2.5-VL's architecture (windowed
// vision attention, RMSNorm and a gated MLP in the tower): the answers come out right far more
// often than the most common answer, and the checkpoint and its hf export are Qwen2.5-VL
// directories that `engine generate` reads by their model_type.
TEST(Qwen25VlRecipeTest, R3NamesTheDigitsInTheImages) {
  const fs::path pipeline = fs::path(testing::kSourceDir) / "pipelines/qwen2_5_vl_r3.pbtxt";
  testing::TempDir tmp;
  const std::string output_dir = "--output_dir=" + (tmp.path() / "out").string();
  const auto run = testing::RunEngine({"run", pipeline.string(), output_dir});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("model       qwen2_5_vl 0.1.0: 447,296 parameters"));
  const auto eval =
      testing::RunEngine({"eval", pipeline.string(), output_dir, "--stage=llm", "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  EXPECT_LT(report["baselines"]["eval/exact_match"].get<double>(), 0.15);
  // 0.87 measured with seed 5 on 2 threads; the floor is qwen2_vl_r3's.
  EXPECT_GT(report["metrics"]["eval/exact_match"].get<double>(), 0.45) << eval.out;

  const auto config = nlohmann::json::parse(
      testing::ReadText(tmp.path() / "out" / "llm" / "final" / "config.json"));
  EXPECT_EQ(config["model_type"], "qwen2_5_vl");
  EXPECT_EQ(config["vision_config"]["window_size"], 28);
  const fs::path exported = tmp.path() / "hf";
  const auto exporting = testing::RunEngine(
      {"export", pipeline.string(), output_dir, "--to=" + exported.string(), "--format=hf"});
  ASSERT_EQ(exporting.exit_code, 0) << exporting.err;
  const fs::path seven = fs::path(testing::kSourceDir) / "data/digit_chat/images/0007.png";
  const auto from_export = testing::RunEngine(
      {"generate", exported.string(), "--image=" + seven.string(), "--prompt=What digit is this?"});
  ASSERT_EQ(from_export.exit_code, 0) << from_export.err;
  EXPECT_THAT(from_export.out, HasSubstr("seven"));
}

// pipelines/qwen3_vl_r3.pbtxt: the same recipe and data on Qwen3-VL's architecture (learned
// positions, a DeepStack merger feeding the first decoder layer, a Qwen3 decoder with interleaved
// rotary bands): the answers come out right far more often than the most common answer, and the
// checkpoint and its hf export are Qwen3-VL directories (transformers 5's layout) that `engine
// generate` reads by their model_type.
TEST(Qwen3VlRecipeTest, R3NamesTheDigitsInTheImages) {
  const fs::path pipeline = fs::path(testing::kSourceDir) / "pipelines/qwen3_vl_r3.pbtxt";
  testing::TempDir tmp;
  const std::string output_dir = "--output_dir=" + (tmp.path() / "out").string();
  const auto run = testing::RunEngine({"run", pipeline.string(), output_dir});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  // transformers' Qwen3VLForConditionalGeneration of this config has 783,296 parameters.
  EXPECT_THAT(run.out, HasSubstr("model       qwen3_vl 0.1.0: 783,296 parameters"));
  const auto eval =
      testing::RunEngine({"eval", pipeline.string(), output_dir, "--stage=llm", "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  EXPECT_LT(report["baselines"]["eval/exact_match"].get<double>(), 0.15);
  // The floor is qwen2_vl_r3's.
  EXPECT_GT(report["metrics"]["eval/exact_match"].get<double>(), 0.45) << eval.out;

  const auto config = nlohmann::json::parse(
      testing::ReadText(tmp.path() / "out" / "llm" / "final" / "config.json"));
  EXPECT_EQ(config["model_type"], "qwen3_vl");
  EXPECT_EQ(config["text_config"]["rope_parameters"]["mrope_interleaved"], true);
  EXPECT_EQ(config["vision_config"]["deepstack_visual_indexes"], nlohmann::json({0}));
  const fs::path exported = tmp.path() / "hf";
  const auto exporting = testing::RunEngine(
      {"export", pipeline.string(), output_dir, "--to=" + exported.string(), "--format=hf"});
  ASSERT_EQ(exporting.exit_code, 0) << exporting.err;
  const fs::path seven = fs::path(testing::kSourceDir) / "data/digit_chat/images/0007.png";
  const auto from_export = testing::RunEngine(
      {"generate", exported.string(), "--image=" + seven.string(), "--prompt=What digit is this?"});
  ASSERT_EQ(from_export.exit_code, 0) << from_export.err;
  EXPECT_THAT(from_export.out, HasSubstr("seven"));
}

}  // namespace
}  // namespace engine
