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

// A model directory as a hub download has it: config.json, model.safetensors, tokenizer.json and
// tokenizer_config.json (with a chat template), from a short run of the chat_sft pipeline's
// first stage.
fs::path MakeHubModel(testing::TempDir& tmp) {
  const fs::path source = testing::kSourceDir;
  const auto pipeline =
      tmp.Write("base.pbtxt", R"(name: "base"
stage {
  name: "lm"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 64 num_hidden_layers: 2 num_attention_heads: 4 num_key_value_heads: 2 } } }
  data { plugin: "text" options { [type.googleapis.com/engine.plugins.TextOptions] {
    path: ")" + testing::FortunesDataPath().string() +
                                  R"(" document_separator: "%"
    sequence_length: 32 max_documents: 200 eval_fraction: 0.1
    tokenizer { kind: HF_JSON path: ")" +
                                  (source / "tests/fixtures/tokenizers/llama3_bpe.json").string() +
                                  R"("
                config: ")" + (source / "pipelines/llama3_chat_tokenizer_config.json").string() +
                                  R"(" } } } }
  optimizer { learning_rate: 0.003 }
  schedule { max_steps: 2 batch_size: 4 }
}
)");
  const auto run = testing::RunEngine(
      {"run", pipeline.string(), "--output_dir=" + (tmp.path() / "base_out").string()});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  const fs::path model = tmp.path() / "models/Llama-3.2-1B-Instruct";
  fs::create_directories(model);
  for (const char* file :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tmp.path() / "base_out/lm/final" / file, model / file);
  }
  return model;
}

TEST(QloraExampleTest, TheTwoStageExampleTrainsFourBitLayersWithAdaptersAndGenerates) {
  testing::TempDir tmp;
  const fs::path model = MakeHubModel(tmp);
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
  EXPECT_THAT(check.out, HasSubstr("quantizer   nf4 0.1.0: 14 linear layers"));
  EXPECT_THAT(check.out, HasSubstr("adapter     lora 0.1.0: 14 linear layers"));
  // No tokenizer in the data options: the model directory's own, with its chat template.
  EXPECT_THAT(check.out, HasSubstr("(tokenizer.json " + (model / "tokenizer.json").string()));
  EXPECT_THAT(check.out, HasSubstr("template " + (model / "tokenizer_config.json").string() +
                                   "#chat_template"));

  const auto run = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("pipeline 'qlora_two_stage' finished: 2 stages"));
  const fs::path out = tmp.path() / "runs/qlora_two_stage";
  // The chat stage kept the domain stage's frozen 4-bit base and trained its adapters on: they
  // are neither the domain stage's nor a fresh start's zero B.
  auto domain = safetensors::File::Open(out / "domain/final/model.safetensors");
  auto chat = safetensors::File::Open(out / "chat/final/model.safetensors");
  ASSERT_TRUE(domain.ok() && chat.ok());
  const std::string base_4bit = "model.layers.0.mlp.down_proj.weight";
  auto domain_base = (*domain)->Get(base_4bit);
  auto chat_base = (*chat)->Get(base_4bit);
  ASSERT_TRUE(domain_base.ok() && chat_base.ok());
  EXPECT_EQ(chat_base->scalar_type(), at::kByte);
  EXPECT_TRUE(chat_base->equal(*domain_base)) << "the frozen 4-bit base changed";
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
