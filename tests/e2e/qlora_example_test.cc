// The README's worked example, examples/qlora_two_stage.pbtxt, as a user runs it: on a Hugging Face
// model directory (here a small one the test trains first, laid out as the hub lays them out), both
// stages quantize every decoder layer to NF4 with LoRA on top, the second starts from the first's
// 4-bit base and adapters, and `engine generate` answers from the result. Only the step counts and
// the paths change.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/safetensors.h"
#include "testing/hub_model.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

void ReplaceAll(std::string& text, const std::string& from, const std::string& to) {
  ASSERT_NE(text.find(from), std::string::npos) << "the example no longer holds '" << from << "'";
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

TEST(QloraExampleTest, TheTwoStageExampleTrainsFourBitLayersWithAdaptersAndGenerates) {
  testing::TempDir tmp;
  const fs::path model = testing::MakeHubModel(tmp);
  std::string example =
      testing::ReadText(fs::path(testing::kSourceDir) / "examples/qlora_two_stage.pbtxt");
  ReplaceAll(example, "max_steps: 400", "max_steps: 3");
  ReplaceAll(example, "max_steps: 300", "max_steps: 3");
  ReplaceAll(example, "warmup_steps: 20", "warmup_steps: 1");
  ReplaceAll(example, "eval_every_steps: 200", "eval_every_steps: 3");
  ReplaceAll(example, "eval_every_steps: 300", "eval_every_steps: 3");
  ReplaceAll(example, "\"../data/", "\"" + std::string(testing::kDataDir) + "/");
  fs::create_directories(tmp.path() / "examples");
  const fs::path pipeline = tmp.Write("examples/qlora_two_stage.pbtxt", example);

  const auto check = testing::RunEngine({"check", pipeline.string()});
  ASSERT_EQ(check.exit_code, 0) << check.err;
  // 2 layers x 7 projections, in both stages; the embedding and norms stay dense.
  EXPECT_THAT(check.out, HasSubstr("quantizer   nf4 0.2.0: 14 linear layers"));
  EXPECT_THAT(check.out, HasSubstr("adapter     lora 0.1.0: 14 linear layers"));
  // No tokenizer in the data options: the model directory's own, with its chat template.
  EXPECT_THAT(check.out, HasSubstr("(tokenizer.json " + (model / "tokenizer.json").string()));
  EXPECT_THAT(check.out, HasSubstr("template " + (model / "tokenizer_config.json").string() +
                                   "#chat_template"));

  const auto run = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("pipeline 'qlora_two_stage' finished: 2 stages"));
  const fs::path out = tmp.path() / "runs/qlora_two_stage";
  // Both stages write slim checkpoints: the adapters they train, once, in the PEFT file, over the
  // 4-bit base both build from the model directory, which the manifests name by its files' content
  // hashes.
  EXPECT_THAT(check.out, HasSubstr("holds only what it changes; the frozen base is rebuilt from " +
                                   model.string()));
  for (const char* stage : {"domain", "chat"}) {
    auto weights = safetensors::File::Open(out / stage / "final/model.safetensors");
    ASSERT_TRUE(weights.ok()) << weights.status().message();
    EXPECT_TRUE((*weights)->tensors().empty()) << stage;
    const std::string manifest = testing::ReadText(out / stage / "final/manifest.pbtxt");
    EXPECT_THAT(manifest, HasSubstr("pretrained: \"" + model.string() + "\""));
    EXPECT_THAT(manifest, HasSubstr("name: \"model.layers.0.mlp.down_proj.weight\"\n    dtype: "
                                    "\"U8\""));
    EXPECT_THAT(manifest,
                HasSubstr("adapter_file_tensor: \"model.layers.0.mlp.down_proj.lora_B.weight\""));
  }
  auto domain_adapters = safetensors::File::Open(out / "domain/final/adapter_model.safetensors");
  auto chat_adapters = safetensors::File::Open(out / "chat/final/adapter_model.safetensors");
  ASSERT_TRUE(domain_adapters.ok() && chat_adapters.ok());
  const std::string lora_b = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight";
  auto domain_b = (*domain_adapters)->Get(lora_b);
  auto chat_b = (*chat_adapters)->Get(lora_b);
  ASSERT_TRUE(domain_b.ok() && chat_b.ok());
  EXPECT_GT(domain_b->abs().max().item<float>(), 0.0f);
  EXPECT_FALSE(chat_b->equal(*domain_b));

  const auto generated = testing::RunEngine({"generate", pipeline.string() + ":chat",
                                             "--prompt=Finish this fortune: A diva who",
                                             "--max_new_tokens=4", "--format=json"});
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  const auto json = nlohmann::json::parse(generated.out);
  ASSERT_EQ(json["outputs"].size(), 1u);
  EXPECT_FALSE(json["outputs"][0]["ids"].empty());
  EXPECT_THAT(json["outputs"][0]["prompt_text"].get<std::string>(),
              HasSubstr("<|start_header_id|>user<|end_header_id|>"));
}

}  // namespace
}  // namespace engine
