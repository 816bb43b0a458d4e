// A chat SFT stage end to end: it trains on conversations and its checkpoints carry the
// tokenizer's files, so the next stage and transformers find them beside the weights.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

TEST(ChatPipelineTest, CheckpointsCarryTheTokenizerFiles) {
  testing::TempDir tmp;
  const fs::path fixtures = fs::path(testing::kSourceDir) / "tests/fixtures";
  const auto pipeline = tmp.Write("p.pbtxt", R"(name: "chat"
output_dir: "out"
stage {
  name: "sft"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 16 num_hidden_layers: 1 num_attention_heads: 2 } } }
  data { plugin: "chat" options { [type.googleapis.com/engine.plugins.ChatOptions] {
    path: ")" + (fixtures / "chat_data/conversations.jsonl").string() +
                                                 R"("
    eval_fraction: 0.4
    tokenizer { kind: HF_JSON path: ")" + (fixtures / "tokenizers/qwen2_bpe.json").string() +
                                                 R"("
                config: ")" + (fixtures / "chat_data/tokenizer_config.json").string() +
                                                 R"(" } } } }
  optimizer { learning_rate: 0.001 }
  schedule { max_steps: 2 batch_size: 2 }
}
)");
  auto run = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const fs::path final_dir = tmp.path() / "out/sft/final";
  EXPECT_TRUE(fs::exists(final_dir / "model.safetensors"));
  EXPECT_EQ(Read(final_dir / "tokenizer.json"), Read(fixtures / "tokenizers/qwen2_bpe.json"));
  EXPECT_EQ(Read(final_dir / "tokenizer_config.json"),
            Read(fixtures / "chat_data/tokenizer_config.json"));
  // config.json's special ids are the tokenizer's: no bos, <|im_end|> and <|endoftext|>.
  const auto config = nlohmann::json::parse(Read(final_dir / "config.json"));
  EXPECT_TRUE(config["bos_token_id"].is_null());
  EXPECT_EQ(config["eos_token_id"], 958);
  EXPECT_EQ(config["pad_token_id"], 956);
  EXPECT_EQ(config["vocab_size"], 959);
}

}  // namespace
}  // namespace engine
