// `engine check` of a randomly initialised model (sizes in options, or `config:` a config.json)
// plans it without its dense weights: the loader draws only the layers the stage quantizes and
// hands each to the quantizer at once, so the check's peak memory is the 4-bit layers', not the
// f32 model's (a 7B config plans in 4.5 GB). The plan it prints is the one `engine run` makes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kNf4 =
    "  quantizer { plugin: \"nf4\" options { [type.googleapis.com/engine.plugins.Nf4Options] { "
    "target_modules: \"model.layers.*\" } } }\n";

std::string LlamaPipeline(const std::string& sizes) {
  return "name: \"p\"\nstage {\n  name: \"s\"\n  model { plugin: \"llama\" options { "
         "[type.googleapis.com/engine.transformer.LlamaOptions] { " +
         sizes +
         " } } }\n  data { plugin: \"text\" options { "
         "[type.googleapis.com/engine.plugins.TextOptions] { path: \"docs.txt\" sequence_length: 8 "
         "eval_fraction: 0.34 } } }\n" +
         kNf4 +
         "  optimizer { learning_rate: 0.001 }\n  schedule { max_steps: 1 batch_size: 1 }\n}\n";
}

std::string Qwen25VlPipeline(const fs::path& config) {
  const fs::path source = testing::kSourceDir;
  const std::string tokenizer =
      "tokenizer { kind: HF_JSON path: \"" +
      (source / "tests/fixtures/tokenizers/qwen2_vl_bpe.json").string() + "\" config: \"" +
      (source / "pipelines/qwen2_5_vl_tiny/tokenizer_config.json").string() + "\" }";
  return "name: \"p\"\nstage {\n  name: \"s\"\n  model { plugin: \"qwen2_5_vl\" options { "
         "[type.googleapis.com/engine.transformer.Qwen2VlOptions] { config: \"" +
         config.string() +
         "\" } } }\n  data { plugin: \"chat\" options { "
         "[type.googleapis.com/engine.plugins.ChatOptions] { path: \"" +
         (source / "data/digit_chat/digits.jsonl").string() +
         "\" max_length: 64 eval_fraction: 0.2 " + tokenizer + " images { processor: \"" +
         (source / "pipelines/qwen2_5_vl_tiny/preprocessor_config.json").string() + "\" } } } }\n" +
         kNf4 +
         "  optimizer { learning_rate: 0.001 }\n  schedule { max_steps: 1 batch_size: 1 }\n}\n";
}

// The tiny qwen2_5_vl's config.json with a decoder of `layers` layers of width 1024 (32 heads of
// 32, so the tiny mrope_section still fits), whose merger feeds that width.
fs::path WideQwen25VlConfig(const testing::TempDir& tmp, const std::string& name, int layers) {
  nlohmann::json config = nlohmann::json::parse(
      std::ifstream(fs::path(testing::kSourceDir) / "pipelines/qwen2_5_vl_tiny/config.json"));
  config["hidden_size"] = 1024;
  config["intermediate_size"] = 4096;
  config["num_hidden_layers"] = layers;
  config["max_window_layers"] = layers;
  config["num_attention_heads"] = 32;
  config["num_key_value_heads"] = 8;
  config["vision_config"]["out_hidden_size"] = 1024;
  return tmp.Write(name, config.dump(2));
}

// A decoder layer of width 1024 with an MLP 4096 wide: q and o 1024x1024, k and v `kv` x 1024.
constexpr int64_t LayerWeights(int64_t kv) {
  return 2 * 1024 * 1024 + 2 * kv * 1024 + 3 * 1024 * 4096;
}

// Planning the wide model may take its 4-bit layers and a third of its dense f32 weights more than
// planning the small one; holding the dense weights (as a model built for training does) is 1x.
void ExpectPlannedWithoutTheDenseWeights(const testing::CommandResult& small,
                                         const testing::CommandResult& wide, int64_t weights) {
  ASSERT_EQ(small.exit_code, 0) << small.err;
  ASSERT_EQ(wide.exit_code, 0) << wide.err;
  const int64_t dense_bytes = weights * 4;
  EXPECT_LT(wide.peak_rss_bytes - small.peak_rss_bytes, dense_bytes / 3)
      << "peak " << wide.peak_rss_bytes << " B against " << small.peak_rss_bytes
      << " B for the small model; the quantized layers' dense f32 weights are " << dense_bytes
      << " B";
}

TEST(CheckMemoryTest, ARandomLlamaIsPlannedWithItsFourBitLayersNotItsDenseWeights) {
  testing::TempDir tmp;
  tmp.Write("docs.txt", "one document\n\nanother document\n\na third one\n");
  const std::string wide_sizes =
      "hidden_size: 1024 intermediate_size: 4096 num_hidden_layers: 12 num_attention_heads: 8 "
      "num_key_value_heads: 8";
  const fs::path small = tmp.Write("small.pbtxt", LlamaPipeline("num_hidden_layers: 1"));
  const fs::path wide = tmp.Write("wide.pbtxt", LlamaPipeline(wide_sizes));
  const testing::CommandResult small_check = testing::RunEngine({"check", small.string()});
  const testing::CommandResult wide_check = testing::RunEngine({"check", wide.string()});
  const int64_t weights = 12 * LayerWeights(1024);
  EXPECT_EQ(weights, 201326592);
  EXPECT_THAT(wide_check.out, HasSubstr("nf4 0.2.0: 84 linear layers, 201,326,592 weights"));
  ExpectPlannedWithoutTheDenseWeights(small_check, wide_check, weights);
}

TEST(CheckMemoryTest, ARandomQwen25VlFromItsConfigIsPlannedWithItsFourBitLayersOnly) {
  testing::TempDir tmp;
  const fs::path small =
      tmp.Write("small.pbtxt", Qwen25VlPipeline(WideQwen25VlConfig(tmp, "small.json", 1)));
  const fs::path wide =
      tmp.Write("wide.pbtxt", Qwen25VlPipeline(WideQwen25VlConfig(tmp, "wide.json", 12)));
  const testing::CommandResult small_check = testing::RunEngine({"check", small.string()});
  const testing::CommandResult wide_check = testing::RunEngine({"check", wide.string()});
  ExpectPlannedWithoutTheDenseWeights(small_check, wide_check, 11 * LayerWeights(256));
  EXPECT_THAT(wide_check.out, HasSubstr("nf4 0.2.0: 84 linear layers"));
}

}  // namespace
}  // namespace engine
