// Training on videos as a user does: `engine check` and `engine run` of a stage whose chat data
// names videos (LLaMA-Factory's "videos", each two frames of one of the digits' images, as a list
// of frame files in another directory the pipeline allows), on the tiny Qwen2-VL and Qwen3-VL
// checkpoints of tests/fixtures/hf with their own video processors, conversations packed. The
// plan counts the videos and their fields; the stage trains; its checkpoint and hf export carry the
// video processor, and transformers loading the export computes the engine's positions and logits
// on its eval batch of videos; `engine generate` asks it about a clip given as frame files or as a
// directory; and `engine eval` of its final checkpoint scores the answers far better than the
// plan's baseline (a unigram model of them).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kChatMl[] =
    "{%- for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{%- endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}<|im_start|>assistant\n{% endif %}";

// 40 conversations: a clip of two frames of digit i % 10 (the image and the next one of the
// same digit), "What digit?", its name.
std::string VideoLines(const fs::path& images) {
  const char* names[] = {"zero", "one", "two",   "three", "four",
                         "five", "six", "seven", "eight", "nine"};
  std::string lines;
  for (int i = 0; i < 40; ++i) {
    nlohmann::json frames = nlohmann::json::array();
    for (int frame : {i, i + 10}) {
      char name[16];
      std::snprintf(name, sizeof(name), "%04d.png", frame);
      frames.push_back((images / name).string());
    }
    lines += nlohmann::json{{"messages",
                             {{{"role", "user"}, {"content", "<video>What digit?"}},
                              {{"role", "assistant"}, {"content", names[i % 10]}}}},
                            {"videos", nlohmann::json::array({frames})}}
                 .dump() +
             "\n";
  }
  return lines;
}

class VideoChatRunTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VideoChatRunTest, AStageTrainsOnVideosAndThePlanCountsThem) {
  const std::string family = GetParam();
  const fs::path fixture = fs::path(testing::kSourceDir) / "tests/fixtures/hf" / family;
  const fs::path images = fs::path(testing::kSourceDir) / "data/digit_chat/images";
  testing::TempDir tmp;
  nlohmann::json config =
      nlohmann::json::parse(testing::ReadText(fixture / "tokenizer_config.json"));
  config["chat_template"] = kChatMl;
  config["eos_token"] = "<|im_end|>";
  tmp.Write("tokenizer_config.json", config.dump());
  for (const char* file :
       {"tokenizer.json", "preprocessor_config.json", "video_preprocessor_config.json"}) {
    fs::copy_file(fixture / file, tmp.path() / file);
  }
  tmp.Write("clips.jsonl", VideoLines(images));
  const std::string pipeline_text = R"(name: "videos"
output_dir: "out"
seed: 1
stage {
  name: "clips"
  model {
    plugin: ")" + family + R"("
    options { [type.googleapis.com/engine.transformer.Qwen2VlOptions] { pretrained: ")" +
                                    fixture.string() + R"(" } }
  }
  data {
    plugin: "chat"
    options {
      [type.googleapis.com/engine.plugins.ChatOptions] {
        path: "clips.jsonl"
        max_length: 64
        eval_fraction: 0.2
        packing: true
        tokenizer { kind: HF_JSON path: "tokenizer.json" }
        images { allowed_dirs: ")" + images.string() +
                                    R"(" }
        videos { fps: 2 }
      }
    }
  }
  precision { plugin: "fp32" }
  trainable { include: "*" }
  optimizer { adamw { weight_decay: 0.0 } learning_rate: 0.01 }
  schedule { max_steps: 40 batch_size: 4 }
}
)";
  const fs::path pipeline = tmp.Write("videos.pbtxt", pipeline_text);

  const auto check = testing::RunEngine({"check", pipeline.string()});
  ASSERT_EQ(check.exit_code, 0) << check.out << check.err;
  // Two frames of 64x64 each: one temporal patch of 4x4 patches, 4 tokens.
  EXPECT_THAT(check.out, HasSubstr("40 videos of 80 frames (80 greyscale converted to RGB); video "
                                   "tokens min/median/max 4/4/4"));
  EXPECT_THAT(check.out, HasSubstr("video_grid_thw i64[?,3], second_per_grid_ts f32[?]"));

  const auto run = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  // The checkpoint, and its hf export, carry the video processor beside the image processor.
  const std::string video_processor =
      testing::ReadText(tmp.path() / "video_preprocessor_config.json");
  EXPECT_EQ(testing::ReadText(tmp.path() / "out/clips/final/video_preprocessor_config.json"),
            video_processor);
  const auto exported = testing::RunEngine({"export", pipeline.string() + ":clips", "--format=hf",
                                            "--to=" + (tmp.path() / "hf").string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_EQ(testing::ReadText(tmp.path() / "hf/video_preprocessor_config.json"), video_processor);
  EXPECT_TRUE(fs::exists(tmp.path() / "hf/preprocessor_config.json"));
  // Asking the trained model about clips: the same clip as a list of frames and as a directory of
  // them gives the same reply; a line without a placeholder shows its video first.
  fs::create_directories(tmp.path() / "clip7");
  for (const char* name : {"0007.png", "0017.png"}) {
    fs::copy_file(images / name, tmp.path() / "clip7" / name);
  }
  nlohmann::json as_list = {{"prompt", "<video>What digit?"}, {"videos", nlohmann::json::array()}};
  as_list["videos"].push_back(
      nlohmann::json::array({(images / "0007.png").string(), (images / "0017.png").string()}));
  const auto prompts =
      tmp.Write("prompts.jsonl",
                as_list.dump() + "\n" +
                    nlohmann::json{{"prompt", "What digit?"}, {"video", "clip7"}}.dump() + "\n");
  const auto generated = testing::RunEngine({"generate", pipeline.string(), "--format=json",
                                             "--input=" + prompts.string(), "--max_new_tokens=8"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const auto outputs = nlohmann::json::parse(generated.out)["outputs"];
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0]["text"], outputs[1]["text"]);
  EXPECT_EQ(outputs[0]["prompt_text"], outputs[1]["prompt_text"]);
  EXPECT_EQ(outputs[0]["finish_reason"], "stop");
  // Qwen3-VL's prompt times its one temporal patch (frames 0 and 1 at 2 a second: 0.25 s).
  EXPECT_THAT(
      outputs[0]["prompt_text"].get<std::string>(),
      HasSubstr(family == "qwen3_vl" ? "<|vision_start|><0.2 seconds><|vision_start|><|video_pad|>"
                                       "<|vision_end|><|vision_end|>What digit?"
                                     : "<|vision_start|><|video_pad|><|vision_end|>What digit?"));

  // transformers, loading the hf export, computes the engine's multimodal positions and logits
  // on the stage's eval batch of videos (`engine eval --logits`; f32, 1e-4).
  const fs::path logits = tmp.path() / "logits.safetensors";
  const auto written = testing::RunEngine(
      {"eval", pipeline.string(), "--logits=" + logits.string(), "--examples=4"});
  ASSERT_EQ(written.exit_code, 0) << written.err;
  const fs::path cases =
      tmp.Write("cases.json", nlohmann::json{{"cases",
                                              {{{"name", family},
                                                {"kind", "image_text_logits"},
                                                {"hf", (tmp.path() / "hf").string()},
                                                {"logits", logits.string()}}}}}
                                  .dump());
  const auto checked = testing::RunCommand(
      {testing::kPython, testing::kExportInteropScript, "check", cases.string()});
  ASSERT_EQ(checked.exit_code, 0) << checked.err;
  const auto result = nlohmann::json::parse(checked.out)[0];
  ASSERT_FALSE(result.contains("error")) << result;
  EXPECT_TRUE(result["positions_equal"].get<bool>()) << result;
  EXPECT_LE(result["hf_vs_engine"].get<double>(), 1e-4) << result;

  // A video file is refused naming the line, not decoded.
  const auto film = tmp.Write("film.jsonl", R"({"prompt": "What?", "video": "film.mp4"})"
                                            "\n");
  const auto refused = testing::RunEngine(
      {"generate", pipeline.string(), "--input=" + film.string(), "--max_new_tokens=8"});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr(film.string() + ":1: video '"));
  EXPECT_THAT(refused.err, HasSubstr("is neither a directory of frames nor an image file"));

  const auto eval = testing::RunEngine({"eval", pipeline.string(), "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.out << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  // About 1.0-1.2 after 40 steps; the unigram model of the answers (the plan's baseline
  // perplexity 27.5) scores ln 27.5 = 3.3.
  const double loss = report["metrics"]["eval/loss"].get<double>();
  EXPECT_LT(loss, std::log(report["baselines"]["eval/perplexity"].get<double>()) - 1) << eval.out;
}

INSTANTIATE_TEST_SUITE_P(Families, VideoChatRunTest, ::testing::Values("qwen2_vl", "qwen3_vl"));

}  // namespace
}  // namespace engine
