// `engine preview`: a chat stage's first examples as the model sees them, in JSON and as text with
// the loss-carrying tokens marked, and its command-line errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;
using testing::RunEngine;

std::string ChatPipeline(const std::string& eval_fraction = "0") {
  const std::string fixtures = std::string(testing::kSourceDir) + "/tests/fixtures/";
  return R"(name: "preview"
output_dir: "out"
stage {
  name: "sft"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 16 num_hidden_layers: 1 num_attention_heads: 2 } } }
  data { plugin: "chat" options { [type.googleapis.com/engine.plugins.ChatOptions] {
    path: ")" +
         fixtures + R"(chat_data/conversations.jsonl"
    eval_fraction: )" +
         eval_fraction + R"(
    tokenizer { kind: HF_JSON path: ")" +
         fixtures + R"(tokenizers/qwen2_bpe.json"
                config: ")" +
         fixtures + R"(chat_data/tokenizer_config.json" } } } }
  optimizer { learning_rate: 0.001 }
  schedule { max_steps: 1 batch_size: 2 }
}
)";
}

TEST(PreviewTest, PrintsExamplesWithTheirLossMask) {
  testing::TempDir tmp;
  const auto pipeline = tmp.Write("p.pbtxt", ChatPipeline());
  auto json = RunEngine({"preview", pipeline.string(), "-n", "2", "--format=json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto parsed = nlohmann::json::parse(json.out);
  EXPECT_EQ(parsed["stage"], "sft");
  ASSERT_EQ(parsed["examples"].size(), 2u);
  for (const auto& example : parsed["examples"]) {
    ASSERT_EQ(example["input_ids"].size(), example["loss_mask"].size());
    EXPECT_THAT(example["text"].get<std::string>(), HasSubstr("<|im_start|>assistant\n"));
    int loss = 0;
    for (int l : example["loss_mask"]) loss += l;
    EXPECT_GT(loss, 0);
    EXPECT_LT(loss, static_cast<int>(example["loss_mask"].size()));
  }
  auto text = RunEngine({"preview", pipeline.string(), "-n", "1"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("carry loss (between [[ and ]])"));
  EXPECT_THAT(text.out, HasSubstr("<|im_start|>assistant\n[["));
  EXPECT_THAT(text.out, HasSubstr("<|im_end|>\n]]"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "out"));  // nothing written
}

TEST(PreviewTest, AnImagesTokensShowAsOneCountedPad) {
  const std::string pipeline = std::string(testing::kSourceDir) + "/pipelines/qwen2_vl_r3.pbtxt";
  auto r = RunEngine({"preview", pipeline, "--stage=llm", "-n", "1"}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::HasSubstr(
                         "<|vision_start|><|image_pad|>\u00d74<|vision_end|>What digit is this?"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("46 tokens, 4 carry loss"));
}

TEST(PreviewTest, BadCommandLinesAndStagesAreErrors) {
  testing::TempDir tmp;
  const auto pipeline = tmp.Write("p.pbtxt", ChatPipeline());
  auto no_stage = RunEngine({"preview", pipeline.string(), "--stage=nope"});
  EXPECT_EQ(no_stage.exit_code, 1);
  EXPECT_THAT(no_stage.err, HasSubstr("no stage 'nope'"));
  auto bad_n = RunEngine({"preview", pipeline.string(), "-n", "zero"});
  EXPECT_EQ(bad_n.exit_code, 2);
  EXPECT_THAT(bad_n.err, HasSubstr("-n must be a positive number"));
  EXPECT_EQ(RunEngine({"preview"}).exit_code, 2);
  auto bad_split = RunEngine({"preview", pipeline.string(), "--split=test"});
  EXPECT_EQ(bad_split.exit_code, 2);
  EXPECT_THAT(bad_split.err, HasSubstr("--split must be train or eval, not 'test'"));
  auto no_eval = RunEngine({"preview", pipeline.string(), "--split=eval"});
  EXPECT_EQ(no_eval.exit_code, 1);
  EXPECT_THAT(no_eval.err, HasSubstr("has no eval examples"));
}

// What another library needs to evaluate on the same examples as the stage.
TEST(PreviewTest, TheEvalSplitIsTheConversationsTheTrainingSplitLeftOut) {
  testing::TempDir tmp;
  const auto pipeline = tmp.Write("p.pbtxt", ChatPipeline("0.5"));
  const auto all = tmp.Write("all.pbtxt", ChatPipeline("0"));
  auto train = RunEngine({"preview", pipeline.string(), "-n", "6", "--format=json"});
  auto eval = RunEngine({"preview", pipeline.string(), "-n", "6", "--split=eval", "--format=json"});
  auto every = RunEngine({"preview", all.string(), "-n", "6", "--format=json"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  ASSERT_EQ(every.exit_code, 0) << every.err;
  const auto train_json = nlohmann::json::parse(train.out);
  const auto eval_json = nlohmann::json::parse(eval.out);
  EXPECT_EQ(train_json["split"], "train");
  EXPECT_EQ(eval_json["split"], "eval");
  // Five conversations have an assistant turn: 3 (2.5 rounded) held out.
  ASSERT_EQ(train_json["examples"].size(), 2u);
  ASSERT_EQ(eval_json["examples"].size(), 3u);
  std::multiset<std::vector<int64_t>> split, whole;
  for (const auto* list : {&train_json["examples"], &eval_json["examples"]}) {
    for (const auto& example : *list)
      split.insert(example["input_ids"].get<std::vector<int64_t>>());
  }
  const auto every_json = nlohmann::json::parse(every.out);
  for (const auto& example : every_json["examples"]) {
    whole.insert(example["input_ids"].get<std::vector<int64_t>>());
  }
  EXPECT_EQ(split, whole);
}

}  // namespace
}  // namespace engine
