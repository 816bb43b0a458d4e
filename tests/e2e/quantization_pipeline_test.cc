// NF4 + LoRA through `engine check` and `engine run`: the plan counts the quantized layers, their
// bits per weight and the adapter parameters; only the adapters train; the checkpoint holds the
// adapters alone in PEFT's layout; a target that matches nothing is refused at its line.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

std::string QloraPipeline(const std::string& quantizer_options, const std::string& lora_options) {
  return "name: \"qlora\"\nseed: 5\nstage {\n  name: \"lm\"\n"
         "  model { plugin: \"llama\" options { [type.googleapis.com/engine.transformer."
         "LlamaOptions] { hidden_size: 64 num_hidden_layers: 2 num_attention_heads: 4 "
         "num_key_value_heads: 2 } } }\n"
         "  quantizer {\n    plugin: \"nf4\"\n    options { [type.googleapis.com/engine.plugins."
         "Nf4Options] { " +
         quantizer_options +
         " } }\n  }\n"
         "  adapter {\n    plugin: \"lora\"\n    options { [type.googleapis.com/engine.plugins."
         "LoraOptions] { " +
         lora_options +
         " } }\n  }\n"
         "  data { plugin: \"text\" options { [type.googleapis.com/engine.plugins.TextOptions] { "
         "path: \"" +
         testing::FortunesDataPath().string() +
         "\" document_separator: \"%\" sequence_length: 32 max_documents: 400 } } }\n"
         "  optimizer { adamw {} learning_rate: 0.01 }\n"
         "  schedule { max_steps: 12 batch_size: 8 }\n}\n";
}

TEST(QuantizationPipelineTest, PlanCountsQuantizedLayersBitsAndAdapters) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt", QloraPipeline("target_modules: \"model.layers.*\"",
                               "r: 4 target_modules: \"q_proj\" target_modules: \"v_proj\""));
  auto r = testing::RunEngine({"check", file.string(), "--format=json"}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto plan = nlohmann::json::parse(r.out);
  const auto& stage = plan["plan"]["stages"][0];
  // 2 layers x 7 projections; lm_head (untied, outside model.layers) stays dense.
  EXPECT_EQ(stage["quantizer"]["layers"], 14);
  EXPECT_EQ(stage["quantizer"]["format"], "nf4");
  const double bits = stage["quantizer"]["bits_per_weight"];
  EXPECT_LE(bits, 4.2);
  EXPECT_GT(bits, 4.1);
  ASSERT_EQ(stage["adapters"].size(), 1u);
  EXPECT_EQ(stage["adapters"][0]["layers"].size(), 4u);
  // q_proj: A 4x64 + B 64x4; v_proj (2 kv heads of 16): A 4x64 + B 32x4; two layers.
  EXPECT_EQ(stage["adapters"][0]["parameters"], 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4));
  EXPECT_EQ(stage["model"]["trainable_parameters"], stage["adapters"][0]["parameters"]);

  auto text = testing::RunEngine({"check", file.string()}, "/");
  EXPECT_THAT(text.out, HasSubstr("quantizer   nf4 0.2.0: 14 linear layers"));
  EXPECT_THAT(text.out, HasSubstr("adapter     lora 0.1.0: 4 linear layers"));
}

// Quantized matmuls follow the stage's compute dtype unless the quantizer's options pin one: an f32
// stage multiplying its 4-bit layers in bf16 would compute what its plan does not say (and, on a
// CPU without bf16 units, 50 times slower).
TEST(QuantizationPipelineTest, QuantizedMatmulsRunInTheStagesComputeDtypeUnlessPinned) {
  struct Case {
    std::string precision, quantizer_options, compute;
  };
  for (const Case& c : std::vector<Case>{
           {"fp32", "", "f32 (the stage's compute dtype; options.compute_dtype pins another)"},
           {"bf16-mixed", "",
            "bf16 (the stage's compute dtype; options.compute_dtype pins another)"},
           {"fp32", "compute_dtype: BF16", "bf16 (options.compute_dtype)"},
       }) {
    testing::TempDir tmp;
    std::string pipeline = QloraPipeline(c.quantizer_options, "r: 4");
    const std::string optimizer = "  optimizer {";
    pipeline.replace(pipeline.find(optimizer), optimizer.size(),
                     "  precision { plugin: \"" + c.precision + "\" }\n" + optimizer);
    const auto file = tmp.Write("p.pbtxt", pipeline);
    auto r = testing::RunEngine({"check", file.string(), "--format=json"}, "/");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["plan"]["stages"][0]["quantizer"]["compute"], c.compute)
        << c.precision << " " << c.quantizer_options;
    auto text = testing::RunEngine({"check", file.string()}, "/");
    EXPECT_THAT(text.out, HasSubstr("frozen; matmuls in " + c.compute));
  }
}

TEST(QuantizationPipelineTest, RunTrainsOnlyTheAdaptersAndSavesThemInPeftLayout) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt", QloraPipeline("", "r: 4 target_modules: \"q_proj\" target_modules: \"o_proj\""));
  auto r = testing::RunEngine({"run", file.string(), "--output_dir=" + tmp.path().string()}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto dir = tmp.path() / "lm" / "final";
  auto adapters = safetensors::File::Open(dir / "adapter_model.safetensors");
  auto model = safetensors::File::Open(dir / "model.safetensors");
  ASSERT_TRUE(adapters.ok() && model.ok());
  ASSERT_EQ((*adapters)->tensors().size(), 8u);  // 2 layers x 2 targets x (A, B)
  for (const auto& info : (*adapters)->tensors()) {
    EXPECT_THAT(info.name, ::testing::StartsWith("base_model.model.model.layers."));
    EXPECT_THAT(info.name, ::testing::ContainsRegex("(q|o)_proj\\.lora_[AB]\\.weight$"));
    // The same values as the full checkpoint's tensor of that name: a faithful copy.
    const std::string inner = info.name.substr(std::string("base_model.model.").size());
    auto a = (*adapters)->Get(info.name);
    auto b = (*model)->Get(inner);
    ASSERT_TRUE(a.ok() && b.ok()) << inner;
    EXPECT_TRUE(at::equal(*a, *b)) << inner;
    if (inner.find("lora_B") != std::string::npos) {
      EXPECT_GT(a->abs().sum().item<float>(), 0) << inner << " never trained";
    }
  }
  // The frozen 4-bit base is stored packed; the adapters' config is PEFT's.
  const safetensors::TensorInfo* packed = (*model)->Find("model.layers.0.mlp.up_proj.weight");
  ASSERT_NE(packed, nullptr);
  EXPECT_EQ(packed->dtype, at::kByte);
  // Its double-quantized scales under bitsandbytes' names for them (nf4 0.2.0: its dynamic map);
  // nf4 0.1.0's linear code had other names, so such a checkpoint cannot be read the new way.
  const safetensors::TensorInfo* codes =
      (*model)->Find("model.layers.0.mlp.up_proj.weight_nested_codes");
  ASSERT_NE(codes, nullptr);
  EXPECT_EQ(codes->dtype, at::kByte);
  EXPECT_NE((*model)->Find("model.layers.0.mlp.up_proj.weight_nested_absmax"), nullptr);
  EXPECT_NE((*model)->Find("model.layers.0.mlp.up_proj.weight_nested_offset"), nullptr);
  EXPECT_EQ((*model)->Find("model.layers.0.mlp.up_proj.weight_absmax_codes"), nullptr);
  const auto config = nlohmann::json::parse(testing::ReadText(dir / "adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  // Full names, so PEFT wraps exactly the layers that trained; nothing else trained; no base.
  EXPECT_EQ(config["target_modules"],
            nlohmann::json({"model.layers.0.self_attn.o_proj", "model.layers.0.self_attn.q_proj",
                            "model.layers.1.self_attn.o_proj", "model.layers.1.self_attn.q_proj"}));
  EXPECT_TRUE(config["modules_to_save"].is_null());
  EXPECT_TRUE(config["base_model_name_or_path"].is_null());
}

TEST(QuantizationPipelineTest, TrainedTensorsBesideTheAdaptersAreSavedAsPeftModulesToSave) {
  testing::TempDir tmp;
  std::string pipeline = QloraPipeline("", "r: 4 target_modules: \"q_proj\"");
  pipeline.insert(pipeline.find("  optimizer"),
                  "  trainable { include: \"*lora_*\" include: \"model.norm.*\" }\n");
  const auto file = tmp.Write("p.pbtxt", pipeline);
  auto r = testing::RunEngine({"run", file.string(), "--output_dir=" + tmp.path().string()}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto dir = tmp.path() / "lm" / "final";
  const auto config = nlohmann::json::parse(testing::ReadText(dir / "adapter_config.json"));
  EXPECT_EQ(config["modules_to_save"], nlohmann::json({"model.norm"}));
  auto adapters = safetensors::File::Open(dir / "adapter_model.safetensors");
  auto model = safetensors::File::Open(dir / "model.safetensors");
  ASSERT_TRUE(adapters.ok() && model.ok());
  auto saved = (*adapters)->Get("base_model.model.model.norm.weight");
  auto trained = (*model)->Get("model.norm.weight");
  ASSERT_TRUE(saved.ok() && trained.ok());
  EXPECT_TRUE(saved->equal(*trained));
  EXPECT_FALSE(trained->equal(at::ones_like(*trained))) << "model.norm.weight never trained";
  EXPECT_EQ((*adapters)->tensors().size(), 4u + 1u);  // 2 layers x (A, B), and the norm

  // A next stage starts from it: the saved module is not taken for an adapter.
  std::string stage = pipeline.substr(pipeline.find("stage {"));
  stage.replace(stage.find("name: \"lm\""), 10, "name: \"next\" from_stage: \"lm\"");
  const auto two = tmp.Write("two.pbtxt", pipeline + stage);
  r = testing::RunEngine({"run", two.string(), "--output_dir=" + tmp.path().string()}, "/");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "next" / "final" / "adapter_config.json"));
}

TEST(QuantizationPipelineTest, TargetsThatMatchNothingAndBadOptionsAreRefusedAtTheirLine) {
  testing::TempDir tmp;
  const auto file = tmp.Write(
      "p.pbtxt", QloraPipeline("target_modules: \"visual.*\"", "r: 4 target_modules: \"q_proj\""));
  auto r = testing::RunEngine({"check", file.string()}, "/");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("p.pbtxt:8:5: error: "));
  EXPECT_THAT(r.err, HasSubstr("stage 'lm' quantizer 'nf4': target_modules pattern 'visual.*' "
                               "matches no linear layer; they are named like "
                               "'model.layers.0.self_attn.q_proj'"));

  const auto bad = tmp.Write("bad.pbtxt", QloraPipeline("block_size: 100", "r: 0"));
  r = testing::RunEngine({"check", bad.string()}, "/");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("block_size: is 100; it must be a power of two"));
  EXPECT_THAT(r.err, HasSubstr("options.r: is 0"));
}

}  // namespace
}  // namespace engine
