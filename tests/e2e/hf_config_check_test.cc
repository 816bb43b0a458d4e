// `engine check` on a `pretrained` directory whose config.json asks for math the engine does not
// compute: refused before anything runs, at the model's line, naming the file, the key and its
// value (never loaded as something else); and a checkpoint the machine cannot hold, with what it
// needs and what there is.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A pipeline whose model is `pretrained: "model"`, a copy of the tiny llama fixture with
// config.json changed by `edit`.
fs::path PipelineWithConfig(const testing::TempDir& tmp,
                            const std::function<void(nlohmann::json&)>& edit) {
  const fs::path fixture = fs::path(testing::kSourceDir) / "tests/fixtures/hf/llama";
  const fs::path model = tmp.path() / "model";
  fs::create_directories(model);
  fs::copy_file(fixture / "model.safetensors", model / "model.safetensors");
  nlohmann::json config = nlohmann::json::parse(std::ifstream(fixture / "config.json"));
  edit(config);
  std::ofstream(model / "config.json") << config.dump(2);
  tmp.Write("docs.txt", "one document\n\nanother document\n\na third one\n");
  return tmp.Write("p.pbtxt", R"(name: "hf"
stage {
  name: "sft"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    pretrained: "model" } } }
  data { plugin: "text" options { [type.googleapis.com/engine.plugins.TextOptions] {
    path: "docs.txt" sequence_length: 8 eval_fraction: 0.34 } } }
  optimizer { learning_rate: 0.001 }
  schedule { max_steps: 1 batch_size: 1 }
}
)");
}

struct Refusal {
  std::string what;
  std::function<void(nlohmann::json&)> edit;
  std::string message;
};

TEST(HfConfigCheckTest, ConfigKeysWithOtherMathAreRefusedByKeyAndValue) {
  const std::vector<Refusal> refusals = {
      {"yarn rope, transformers 4 spelling",
       [](nlohmann::json& c) {
         c.erase("rope_parameters");
         c["rope_theta"] = 10000.0;
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "rope_scaling.rope_type 'yarn' is not supported by this engine (supported: default, linear, "
       "dynamic, llama3)"},
      {"transformers 5 spelling with yarn",
       [](nlohmann::json& c) {
         c.erase("rope_theta");
         c.erase("rope_scaling");
         c["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
       },
       "'yarn' is not supported by this engine"},
      {"an activation", [](nlohmann::json& c) { c["hidden_act"] = "swish_beta"; },
       "'swish_beta' is not supported by this engine (supported: silu, gelu, gelu_pytorch_tanh, "
       "relu)"},
      {"an unknown key", [](nlohmann::json& c) { c["logit_softcapping"] = 30.0; },
       "'logit_softcapping' (30.0) is not implemented by this engine's llama loader"},
      {"a sliding window on llama", [](nlohmann::json& c) { c["sliding_window"] = 16; },
       "sliding_window"},
      {"attention dropout", [](nlohmann::json& c) { c["attention_dropout"] = 0.1; },
       "attention_dropout"},
      {"another family", [](nlohmann::json& c) { c["model_type"] = "gemma"; }, "'gemma'"},
  };
  for (const Refusal& refusal : refusals) {
    testing::TempDir tmp;
    const fs::path pipeline = PipelineWithConfig(tmp, refusal.edit);
    const auto check = testing::RunEngine({"check", pipeline.string()});
    EXPECT_EQ(check.exit_code, 1) << refusal.what;
    EXPECT_THAT(check.err, HasSubstr("p.pbtxt:4:")) << refusal.what;
    EXPECT_THAT(check.err, HasSubstr((tmp.path() / "model/config.json").string())) << refusal.what;
    EXPECT_THAT(check.err, HasSubstr(refusal.message)) << refusal.what;
    // Nothing was written.
    EXPECT_FALSE(fs::exists(tmp.path() / "runs")) << refusal.what;
  }
}

TEST(HfConfigCheckTest, ACheckpointTooBigForTheMachineIsRefusedByCheckWithWhatItNeeds) {
  testing::TempDir tmp;
  // The fixture with the byte tokenizer's 259 ids, so that the pipeline is valid otherwise.
  const fs::path pipeline =
      PipelineWithConfig(tmp, [](nlohmann::json& config) { config["vocab_size"] = 259; });
  auto fixture = safetensors::File::Open(tmp.path() / "model/model.safetensors");
  ASSERT_TRUE(fixture.ok());
  auto tensors = (*fixture)->GetAll();
  ASSERT_TRUE(tensors.ok());
  safetensors::NamedTensors widened;
  for (const auto& [name, tensor] : *tensors) {
    const bool vocab = name == "model.embed_tokens.weight" || name == "lm_head.weight";
    widened.emplace_back(name, vocab ? at::zeros({259, tensor.size(1)}) : tensor.clone());
  }
  fixture->reset();
  ASSERT_TRUE(safetensors::Write(tmp.path() / "model/model.safetensors", widened).ok());
  setenv("ENGINE_AVAILABLE_MEMORY", "50000", 1);
  const auto result = testing::RunEngine({"check", pipeline.string()});
  unsetenv("ENGINE_AVAILABLE_MEMORY");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("p.pbtxt:4:"));
  EXPECT_THAT(result.err,
              HasSubstr("'" + (tmp.path() / "model").string() + "': loading it needs about 1 MB"));
  EXPECT_THAT(result.err, HasSubstr("this machine has 1 MB available"));
  // With room, the same pipeline is fine.
  EXPECT_EQ(testing::RunEngine({"check", pipeline.string()}).exit_code, 0);
}

}  // namespace
}  // namespace engine
