// pipelines/chat_sft.pbtxt as the README runs it: a Llama-family model learns the fortunes, then
// is fine-tuned on conversations built from them ("Finish this fortune: ..."). Its evaluation
// shows what it learned (perplexity on the answers far below the unigram baseline) and that it
// learned to stop (eos_accuracy: the end-of-turn token predicted where each answer ends), and its
// generated answers are sentences that end at the end-of-turn token, not at the token limit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

TEST(ChatSftExampleTest, TheModelLearnsTheAnswersAndStopsAtTheEndOfTurn) {
  const fs::path pipeline = fs::path(testing::kSourceDir) / "pipelines/chat_sft.pbtxt";
  testing::TempDir tmp;
  const std::string output_dir = "--output_dir=" + (tmp.path() / "out").string();
  const auto run = testing::RunEngine({"run", pipeline.string(), output_dir});
  ASSERT_EQ(run.exit_code, 0) << run.err;

  const auto eval =
      testing::RunEngine({"eval", pipeline.string(), output_dir, "--stage=sft", "--format=json"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const auto report = nlohmann::json::parse(eval.out);
  const double perplexity = report["metrics"]["eval/perplexity"];
  const double baseline = report["baselines"]["eval/perplexity"];
  EXPECT_LT(perplexity, baseline / 4);
  EXPECT_GT(report["metrics"]["eval/eos_accuracy"].get<double>(), 0.8);

  const auto generated = testing::RunEngine(
      {"generate", pipeline.string(), output_dir, "--prompt=Finish this fortune: A diva who",
       "--prompt=Finish this fortune: Love is", "--prompt=Finish this fortune: The best way to",
       "--prompt=Finish this fortune: Never trust a", "--prompt=Finish this fortune: Time flies",
       "--max_new_tokens=64", "--format=json"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const auto outputs = nlohmann::json::parse(generated.out)["outputs"];
  ASSERT_EQ(outputs.size(), 5u);
  int stopped = 0, sentences = 0;
  for (const auto& output : outputs) {
    const std::string text = output["text"];
    stopped += output["finish_reason"] == "stop" ? 1 : 0;
    sentences += !text.empty() && std::string(".!?").find(text.back()) != std::string::npos;
  }
  EXPECT_GE(stopped, 4) << generated.out;
  EXPECT_GE(sentences, 4) << generated.out;
}

}  // namespace
}  // namespace engine
