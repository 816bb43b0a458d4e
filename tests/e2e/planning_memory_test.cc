// Planning a pipeline holds no model it does not train. `engine check` of a randomly initialised
// model (sizes in options, or `config:` a config.json) plans it without its dense weights: the
// loader draws only the layers the stage quantizes and hands each to the quantizer at once, so the
// check's peak memory is the 4-bit layers', not the f32 model's (a 7B config plans in 4.5 GB). And
// `engine run` builds each stage's model when the stage trains, `engine eval` only the stage's it
// evaluates, not every stage's while planning; and `engine check` of a pretrained model reads only
// the weights its stage quantizes.
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

std::string LlamaStage(const std::string& name, const std::string& sizes,
                       const std::string& extra) {
  return "stage {\n  name: \"" + name + "\"\n  model { plugin: \"llama\" options { " +
         "[type.googleapis.com/engine.transformer.LlamaOptions] { " + sizes +
         " } } }\n  data { plugin: \"text\" options { "
         "[type.googleapis.com/engine.plugins.TextOptions] { path: \"docs.txt\" sequence_length: 8 "
         "eval_fraction: 0.34 } } }\n" +
         extra +
         "  optimizer { learning_rate: 0.001 }\n  schedule { max_steps: 1 batch_size: 1 }\n}\n";
}

std::string LlamaPipeline(const std::string& sizes) {
  return "name: \"p\"\n" + LlamaStage("s", sizes, kNf4);
}

// A Llama of `layers` decoder layers of width 1024 (heads of 128) with MLPs 4096 wide.
std::string WideLlama(int layers) {
  return "hidden_size: 1024 intermediate_size: 4096 num_hidden_layers: " + std::to_string(layers) +
         " num_attention_heads: 8 num_key_value_heads: 8";
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

// `two`'s peak is within `slack` above `one`'s: the same kind of command, whose work needs no more.
void ExpectPeakWithin(const testing::CommandResult& one, const testing::CommandResult& two,
                      int64_t slack, const std::string& what) {
  ASSERT_EQ(one.exit_code, 0) << what << ": " << one.err;
  ASSERT_EQ(two.exit_code, 0) << what << ": " << two.err;
  EXPECT_LT(two.peak_rss_bytes - one.peak_rss_bytes, slack)
      << what << ": peak " << two.peak_rss_bytes << " B against " << one.peak_rss_bytes << " B";
}

TEST(PlanningMemoryTest, ARandomLlamaIsPlannedWithItsFourBitLayersNotItsDenseWeights) {
  testing::TempDir tmp;
  tmp.Write("docs.txt", "one document\n\nanother document\n\na third one\n");
  const fs::path small = tmp.Write("small.pbtxt", LlamaPipeline("num_hidden_layers: 1"));
  const fs::path wide = tmp.Write("wide.pbtxt", LlamaPipeline(WideLlama(12)));
  const testing::CommandResult small_check = testing::RunEngine({"check", small.string()});
  const testing::CommandResult wide_check = testing::RunEngine({"check", wide.string()});
  const int64_t weights = 12 * LayerWeights(1024);
  EXPECT_EQ(weights, 201326592);
  EXPECT_THAT(wide_check.out, HasSubstr("nf4 0.2.0: 84 linear layers, 201,326,592 weights"));
  ExpectPlannedWithoutTheDenseWeights(small_check, wide_check, weights);
}

TEST(PlanningMemoryTest, ARandomQwen25VlFromItsConfigIsPlannedWithItsFourBitLayersOnly) {
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

// Two stages of a wide random Llama (537 MB of f32 decoder weights each), each training only its
// final norm: `engine run` of both peaks where the run of the first alone does, since it holds one
// stage's model at a time (planning used to build both before the first trained), and `engine
// eval` of the second stage builds only its model.
TEST(PlanningMemoryTest, RunAndEvalHoldOneStagesModelAtATime) {
  testing::TempDir tmp;
  tmp.Write("docs.txt", "one document\n\nanother document\n\na third one\n");
  const std::string extra =
      "  precision { plugin: \"fp32\" }\n  trainable { include: \"model.norm.*\" }\n";
  const std::string first = LlamaStage("first", WideLlama(8), extra);
  const std::string second = LlamaStage("second", WideLlama(8), extra);
  const fs::path one = tmp.Write("one.pbtxt", "name: \"one\"\noutput_dir: \"one\"\n" + first);
  const fs::path two =
      tmp.Write("two.pbtxt", "name: \"two\"\noutput_dir: \"two\"\n" + first + second);
  const int64_t model_bytes = 8 * LayerWeights(1024) * 4;

  const testing::CommandResult run_one = testing::RunEngine({"run", one.string()});
  const testing::CommandResult run_two = testing::RunEngine({"run", two.string()});
  ExpectPeakWithin(run_one, run_two, model_bytes / 2, "run");
  EXPECT_THAT(run_two.out, HasSubstr("stage 'second'"));

  const testing::CommandResult eval_one = testing::RunEngine({"eval", one.string()});
  const testing::CommandResult eval_two =
      testing::RunEngine({"eval", two.string(), "--stage=second"});
  ExpectPeakWithin(eval_one, eval_two, model_bytes / 2, "eval");

  // `engine check` of a stage reading the first stage's checkpoint reads the files' headers only
  // (no layer is quantized here), so it holds what checking the random model does.
  const fs::path from_checkpoint = tmp.Write(
      "pretrained.pbtxt",
      "name: \"p\"\n" +
          LlamaStage("s", "pretrained: \"" + (tmp.path() / "one/first/final").string() + "\"", ""));
  const testing::CommandResult check_one = testing::RunEngine({"check", one.string()});
  const testing::CommandResult check_pretrained =
      testing::RunEngine({"check", from_checkpoint.string()});
  ExpectPeakWithin(check_one, check_pretrained, model_bytes / 3, "check of its checkpoint");
  EXPECT_THAT(check_pretrained.out, HasSubstr("llama"));
}

}  // namespace
}  // namespace engine
