// The language and vision-language models end to end through `engine run`: the digits VLM learns
// to name digits, a fortunes LM beats its unigram baseline and its checkpoint is a Hugging Face
// model directory that the next pipeline loads, gradient checkpointing does not change training,
// and module selection counts what it trains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "engine/safetensors.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

double Metric(const std::string& out, const std::string& name) {
  std::smatch match;
  if (!std::regex_search(out, match,
                         std::regex("eval on [0-9,]+ examples:.* " + name + " ([0-9.]+)"))) {
    ADD_FAILURE() << "no " << name << " in: " << out;
    return -1;
  }
  return std::stod(match[1]);
}

std::string LmPipeline(const std::string& name, const std::string& model_options,
                       const std::string& extra, const std::string& learning_rate = "0.003") {
  return "name: \"" + name +
         "\"\nseed: 3\nstage {\n  name: \"lm\"\n  model { plugin: \"llama\" options { "
         "[type.googleapis.com/engine.transformer.LlamaOptions] { " +
         model_options +
         " } } }\n  data { plugin: \"text\" options { "
         "[type.googleapis.com/engine.plugins.TextOptions] { path: \"" +
         testing::FortunesDataPath().string() +
         "\" document_separator: \"%\" sequence_length: 64 max_documents: 3000 eval_fraction: "
         "0.05 } } }\n  precision { plugin: \"fp32\" }\n  optimizer { adamw {} learning_rate: " +
         learning_rate + " }\n" + extra + "\n}\n";
}

TEST(TransformerPipelinesTest, DigitsVlmNamesTheDigits) {
  testing::TempDir out;
  const std::string pipeline =
      std::string(testing::kSourceDir) + "/pipelines/digits_vlm_single.pbtxt";
  auto r = testing::RunEngine({"run", pipeline, "--output_dir=" + out.path().string()}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("baseline    eval/exact_match 0.1"));
  EXPECT_GE(Metric(r.out, "exact_match"), 0.8) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(baseline 0.1000)"));
  const auto final_dir = out.path() / "vlm" / "final";
  const auto config = nlohmann::json::parse(testing::ReadText(final_dir / "config.json"));
  EXPECT_EQ(config["vision_config"]["patch_size"], 4);
  EXPECT_EQ(config["text_config"]["model_type"], "llama");
  auto weights = safetensors::File::Open(final_dir / "model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  std::set<std::string> prefixes;
  for (const auto& t : (*weights)->tensors()) prefixes.insert(t.name.substr(0, t.name.find('.')));
  EXPECT_EQ(prefixes, (std::set<std::string>{"lm_head", "model", "projector", "visual"}));
}

TEST(TransformerPipelinesTest, FortunesLmBeatsUnigramAndItsCheckpointLoadsAsPretrained) {
  testing::TempDir tmp;
  const auto first = tmp.Write(
      "lm.pbtxt", LmPipeline("lm", "hidden_size: 64 num_hidden_layers: 1 num_attention_heads: 2",
                             "  schedule { max_steps: 80 batch_size: 16 }"));
  auto r = testing::RunEngine(
      {"run", first.string(), "--output_dir=" + (tmp.path() / "a").string()}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::smatch match;
  ASSERT_TRUE(
      std::regex_search(r.out, match, std::regex("perplexity ([0-9.]+) \\(baseline ([0-9.]+)\\)")))
      << r.out;
  const double perplexity = std::stod(match[1]);
  EXPECT_LT(perplexity, 0.7 * std::stod(match[2])) << r.out;

  const auto saved = tmp.path() / "a" / "lm" / "final";
  const auto config = nlohmann::json::parse(testing::ReadText(saved / "config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["vocab_size"], 259);

  // A second pipeline starts from that directory; its first evaluation matches the saved model's.
  const auto second =
      tmp.Write("more.pbtxt", LmPipeline("more", "pretrained: \"" + saved.string() + "\"",
                                         "  schedule { max_steps: 1 batch_size: 16 }", "1e-12"));
  r = testing::RunEngine({"run", second.string(), "--output_dir=" + (tmp.path() / "b").string()},
                         "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("model.layers"));
  EXPECT_NEAR(Metric(r.out, "perplexity"), perplexity, 1e-3);
}

TEST(TransformerPipelinesTest, GradientCheckpointingTrainsTheSame) {
  testing::TempDir tmp;
  auto run = [&](const std::string& name, bool checkpointing) {
    const auto file = tmp.Write(
        name + ".pbtxt",
        LmPipeline(name,
                   std::string("hidden_size: 32 num_hidden_layers: 2 num_attention_heads: 2 "
                               "gradient_checkpointing: ") +
                       (checkpointing ? "true" : "false"),
                   "  schedule { max_steps: 6 batch_size: 8 }"));
    auto r = testing::RunEngine(
        {"run", file.string(), "--output_dir=" + (tmp.path() / name).string()}, "/");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return Metric(r.out, "loss");
  };
  EXPECT_EQ(run("plain", false), run("checkpointed", true));
}

TEST(TransformerPipelinesTest, ModuleSelectionCountsAndRefusesEmptyPatterns) {
  testing::TempDir tmp;
  const std::string vlm =
      testing::ReadText(std::string(testing::kSourceDir) + "/pipelines/digits_vlm_single.pbtxt");
  auto with_trainable = [&](const std::string& trainable) {
    std::string text =
        std::regex_replace(vlm, std::regex("\\.\\./data/"), std::string(testing::kDataDir) + "/");
    text = std::regex_replace(text, std::regex("  precision \\{"), trainable + "\n  precision {");
    return tmp.Write("p.pbtxt", text);
  };
  auto r = testing::RunEngine(
      {"check",
       with_trainable("  trainable { include: \"visual.*\" include: \"projector.*\" }").string()},
      "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("126,272 trainable in 33 tensors, 468,352 frozen"));
  r = testing::RunEngine(
      {"check", with_trainable("  trainable { include: \"vision.*\" }").string()}, "/");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("trainable.include pattern 'vision.*' matches no parameter"));
}

}  // namespace
}  // namespace engine
