// `engine export` as a user runs it: a QLoRA stage exported as a dense Hugging Face directory holds
// each layer's 4-bit base dequantized plus alpha/r * B A and loads again as a model directory; as
// PEFT adapters it holds the trained adapters with the full names of their layers and the base
// named; a full fine-tune's final checkpoint re-exports in another dtype; and every refusal
// (peft without adapters, a directory in the way, a bad flag) leaves nothing behind.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ExportCliTest : public ::testing::Test {
 protected:
  // A dense stage, then a QLoRA stage on it (nf4 on every decoder layer, LoRA r 4, alpha 8);
  // down_proj has 544 NF4 blocks. Both in f32 on any CPU (`auto` would pick bf16-mixed where the
  // CPU has bf16 instructions).
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    const fs::path fixtures = fs::path(testing::kSourceDir) / "tests/fixtures";
    const std::string data = R"(
  data { plugin: "chat" options { [type.googleapis.com/engine.plugins.ChatOptions] {
    path: ")" + (fixtures / "chat_data/conversations.jsonl").string() +
                             R"(" eval_fraction: 0.4
    tokenizer { kind: HF_JSON path: ")" +
                             (fixtures / "tokenizers/qwen2_bpe.json").string() + R"("
                config: ")" + (fixtures / "chat_data/tokenizer_config.json").string() +
                             R"(" } } } }
  precision { plugin: "fp32" }
  optimizer { learning_rate: 0.01 }
  schedule { max_steps: 2 batch_size: 2 }
)";
    const std::string model = R"(
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 64 intermediate_size: 544 num_hidden_layers: 1 num_attention_heads: 4 } } })";
    pipeline_ = new fs::path(tmp_->Write("p.pbtxt", R"(name: "export"
output_dir: "out"
stage { name: "full")" + model + data + R"(}
stage { name: "qlora" from_stage: "full")" + model + R"(
  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] {
    target_modules: "model.layers.*" } } }
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] {
    r: 4 lora_alpha: 8 target_modules: "model.layers.*" } } })" +
                                                        data + "}\n"));
    run_ = new testing::CommandResult(testing::RunEngine({"run", pipeline_->string()}));
  }
  static void TearDownTestSuite() {
    delete run_;
    delete pipeline_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_EQ(run_->exit_code, 0) << run_->err; }

  static testing::CommandResult Export(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"export"};
    args.insert(args.end(), flags.begin(), flags.end());
    return testing::RunEngine(args);
  }
  static at::Tensor Read(const fs::path& file, const std::string& name) {
    auto opened = safetensors::File::Open(file);
    EXPECT_TRUE(opened.ok()) << file;
    if (!opened.ok()) return {};
    auto tensor = (*opened)->Get(name);
    EXPECT_TRUE(tensor.ok()) << name << " in " << file;
    return tensor.ok() ? tensor->clone() : at::Tensor();
  }

  static testing::TempDir* tmp_;
  static fs::path* pipeline_;
  static testing::CommandResult* run_;
};

testing::TempDir* ExportCliTest::tmp_ = nullptr;
fs::path* ExportCliTest::pipeline_ = nullptr;
testing::CommandResult* ExportCliTest::run_ = nullptr;

TEST_F(ExportCliTest, AQloraStageExportsAsADenseModelWithItsAdaptersMerged) {
  const fs::path to = tmp_->path() / "hf";
  const auto exported =
      Export({pipeline_->string() + ":qlora", "--to=" + to.string(), "--format=hf"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  auto file = safetensors::File::Open(to / "model.safetensors");
  ASSERT_TRUE(file.ok());
  for (const auto& info : (*file)->tensors()) {
    EXPECT_THAT(info.name, ::testing::Not(HasSubstr("lora_"))) << info.name;
    EXPECT_THAT(info.name, ::testing::Not(HasSubstr("absmax"))) << info.name;
    EXPECT_EQ(info.dtype, at::kFloat) << info.name;
  }
  // W = dequantize(nf4(W_full)) + alpha/r * B A: taking the adapters' product away leaves the
  // 4-bit rounding of the dense stage's weight, close to it and not equal.
  const fs::path qlora = tmp_->path() / "out/qlora/final";
  for (const std::string layer :
       {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"}) {
    const at::Tensor merged = Read(to / "model.safetensors", layer + ".weight");
    const at::Tensor a =
        Read(qlora / "adapter_model.safetensors", "base_model.model." + layer + ".lora_A.weight");
    const at::Tensor b =
        Read(qlora / "adapter_model.safetensors", "base_model.model." + layer + ".lora_B.weight");
    const at::Tensor dense =
        Read(tmp_->path() / "out/full/final/model.safetensors", layer + ".weight");
    ASSERT_TRUE(merged.defined() && a.defined() && b.defined() && dense.defined());
    const at::Tensor delta = at::matmul(b.to(at::kFloat), a.to(at::kFloat)) * (8.0 / 4.0);
    EXPECT_GT(delta.abs().max().item<float>(), 0.0f) << layer << ": the adapters never trained";
    const at::Tensor base = merged - delta;
    const float rounding = (base - dense).abs().max().item<float>();
    EXPECT_GT(rounding, 0.0f) << layer;
    EXPECT_LT(rounding, 0.2f * dense.abs().max().item<float>()) << layer;
  }
  const auto config = nlohmann::json::parse(testing::ReadText(to / "config.json"));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_TRUE(fs::exists(to / "generation_config.json"));
  EXPECT_TRUE(fs::exists(to / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(to / "adapter_model.safetensors"));
  // It is a model directory: generate from it.
  const auto generated =
      testing::RunEngine({"generate", to.string(), "--prompt=Hello", "--max_new_tokens=3"});
  EXPECT_EQ(generated.exit_code, 0) << generated.err;
}

TEST_F(ExportCliTest, PeftExportHoldsTheTrainedAdaptersTheirFullLayerNamesAndTheBase) {
  const fs::path to = tmp_->path() / "peft";
  const fs::path base = tmp_->path() / "out/full/final";
  const auto exported = Export({pipeline_->string() + ":qlora", "--to=" + to.string(),
                                "--format=peft", "--base=" + base.string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const auto config = nlohmann::json::parse(testing::ReadText(to / "adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["base_model_name_or_path"], base.string());
  EXPECT_EQ(config["target_modules"].size(), 7u);
  EXPECT_THAT(config["target_modules"].get<std::vector<std::string>>(),
              ::testing::Contains("model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(config["modules_to_save"].is_null());
  auto exported_file = safetensors::File::Open(to / "adapter_model.safetensors");
  ASSERT_TRUE(exported_file.ok());
  EXPECT_EQ((*exported_file)->tensors().size(), 14u);  // 7 layers x (A, B)
  const std::string b = "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight";
  EXPECT_TRUE(Read(to / "adapter_model.safetensors", b)
                  .equal(Read(tmp_->path() / "out/qlora/final/adapter_model.safetensors", b)));
  EXPECT_FALSE(fs::exists(to / "model.safetensors"));
  // Without --base, the base is the dense stage the adapters' stage started from, in the stage's
  // own checkpoint too.
  const auto own = nlohmann::json::parse(
      testing::ReadText(tmp_->path() / "out/qlora/final/adapter_config.json"));
  EXPECT_EQ(own["base_model_name_or_path"], base.string());
}

// bitsandbytes' dequantization of one layer as its default backend computes it: the high nibble
// first, each code's NF4 value times its block's absmax.
at::Tensor DequantizeLikeBitsandbytes(const at::Tensor& packed, const at::Tensor& absmax,
                                      const at::Tensor& quant_map, int64_t block_size, int64_t rows,
                                      int64_t cols) {
  const at::Tensor bytes = packed.reshape({-1}).to(at::kLong);
  const at::Tensor codes =
      at::stack({at::floor_divide(bytes, 16), at::remainder(bytes, 16)}, 1).reshape({-1});
  const at::Tensor values = quant_map.index_select(0, codes).narrow(0, 0, rows * cols);
  const int64_t blocks = absmax.numel();
  return (at::constant_pad_nd(values, {0, blocks * block_size - rows * cols}, 0)
              .view({blocks, block_size}) *
          absmax.unsqueeze(1))
      .reshape({-1})
      .narrow(0, 0, rows * cols)
      .view({rows, cols});
}

TEST_F(ExportCliTest, Bnb4ExportHoldsTheStagesFourBitWeightsInBitsandbytesSerialization) {
  const fs::path to = tmp_->path() / "bnb4";
  const auto exported = Export(
      {pipeline_->string() + ":qlora", "--to=" + to.string(), "--format=bnb4", "--dtype=bfloat16"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const fs::path file = to / "model.safetensors";
  const std::string layer = "model.layers.0.mlp.down_proj";
  const at::Tensor packed = Read(file, layer + ".weight");
  const at::Tensor absmax = Read(file, layer + ".weight.absmax");
  const at::Tensor quant_map = Read(file, layer + ".weight.quant_map");
  const at::Tensor state_bytes = Read(file, layer + ".weight.quant_state.bitsandbytes__nf4");
  ASSERT_TRUE(packed.defined() && absmax.defined() && quant_map.defined() && state_bytes.defined());
  const auto state = nlohmann::json::parse(std::string(
      reinterpret_cast<const char*>(state_bytes.data_ptr<uint8_t>()), state_bytes.numel()));
  EXPECT_EQ(state["quant_type"], "nf4");
  EXPECT_EQ(state["blocksize"], 64);
  EXPECT_EQ(state["dtype"], "bfloat16");
  const int64_t rows = state["shape"][0], cols = state["shape"][1];
  EXPECT_EQ(packed.scalar_type(), at::kByte);
  EXPECT_EQ(packed.sizes(), (std::vector<int64_t>{(rows * cols + 1) / 2, 1}));
  EXPECT_EQ(absmax.scalar_type(), at::kFloat);
  EXPECT_EQ(absmax.numel(), (rows * cols + 63) / 64);
  EXPECT_EQ(quant_map.numel(), 16);
  // Dequantized as bitsandbytes does, it is the stage's own 4-bit weight: the dense export's
  // weight with the adapters' product taken away (both in f32, so within f32 rounding; a merge
  // computed under the stage's bf16 autocast would be 5e-4 off).
  const fs::path hf = tmp_->path() / "hf_for_bnb4";
  ASSERT_EQ(
      Export({pipeline_->string() + ":qlora", "--to=" + hf.string(), "--format=hf"}).exit_code, 0);
  const fs::path qlora = tmp_->path() / "out/qlora/final/adapter_model.safetensors";
  const at::Tensor base = Read(hf / "model.safetensors", layer + ".weight") -
                          at::matmul(Read(qlora, "base_model.model." + layer + ".lora_B.weight"),
                                     Read(qlora, "base_model.model." + layer + ".lora_A.weight")) *
                              2.0;
  EXPECT_TRUE(at::allclose(DequantizeLikeBitsandbytes(packed, absmax, quant_map, 64, rows, cols),
                           base, 1e-6, 1e-6));
  // Everything else in bf16, no adapter, transformers' quantization_config.
  EXPECT_EQ(Read(file, "model.embed_tokens.weight").scalar_type(), at::kBFloat16);
  auto opened = safetensors::File::Open(file);
  ASSERT_TRUE(opened.ok());
  for (const auto& info : (*opened)->tensors()) {
    EXPECT_THAT(info.name, ::testing::Not(HasSubstr("lora_")));
  }
  const auto config = nlohmann::json::parse(testing::ReadText(to / "config.json"));
  const auto& q = config["quantization_config"];
  EXPECT_EQ(q["quant_method"], "bitsandbytes");
  EXPECT_EQ(q["load_in_4bit"], true);
  EXPECT_EQ(q["bnb_4bit_quant_type"], "nf4");
  // The stage computes in f32, and so did its 4-bit layers (nf4 leaves compute_dtype to it).
  EXPECT_EQ(q["bnb_4bit_compute_dtype"], "float32");
  EXPECT_EQ(q["llm_int8_skip_modules"], nlohmann::json({"lm_head"}));
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
}

TEST_F(ExportCliTest, DoubleQuantizedScalesAreBitsandbytesNestedStateWithinAPercent) {
  const fs::path plain = tmp_->path() / "bnb4_plain";
  const fs::path nested = tmp_->path() / "bnb4_double";
  ASSERT_EQ(
      Export({pipeline_->string() + ":qlora", "--to=" + plain.string(), "--format=bnb4"}).exit_code,
      0);
  const auto exported = Export({pipeline_->string() + ":qlora", "--to=" + nested.string(),
                                "--format=bnb4", "--double_quant"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const fs::path file = nested / "model.safetensors";
  const std::string layer = "model.layers.0.mlp.down_proj.weight";
  const at::Tensor scales = Read(plain / "model.safetensors", layer + ".absmax");
  const at::Tensor codes = Read(file, layer + ".absmax");
  const at::Tensor nested_absmax = Read(file, layer + ".nested_absmax");
  const at::Tensor map = Read(file, layer + ".nested_quant_map");
  const at::Tensor state_bytes = Read(file, layer + ".quant_state.bitsandbytes__nf4");
  ASSERT_TRUE(codes.defined() && nested_absmax.defined() && map.defined());
  const int64_t blocks = scales.numel();
  EXPECT_EQ(codes.scalar_type(), at::kByte);
  EXPECT_EQ(codes.numel(), blocks);
  EXPECT_EQ(nested_absmax.scalar_type(), at::kFloat);
  // down_proj's 64 x 544 weights: two whole blocks of 256 scales and a part block.
  ASSERT_EQ(blocks, 544);
  EXPECT_EQ(nested_absmax.numel(), 3);
  // The dynamic map: 256 sorted values from -0.99297 to 1 with 0 among them.
  ASSERT_EQ(map.numel(), 256);
  EXPECT_TRUE(map.equal(std::get<0>(map.sort())));
  EXPECT_EQ(map[255].item<float>(), 1.0f);
  EXPECT_NEAR(map[0].item<float>(), -0.99296875, 1e-6);
  EXPECT_EQ(map.eq(0).sum().item<int64_t>(), 1);
  const auto state = nlohmann::json::parse(std::string(
      reinterpret_cast<const char*>(state_bytes.data_ptr<uint8_t>()), state_bytes.numel()));
  EXPECT_EQ(state["nested_blocksize"], 256);
  EXPECT_EQ(state["nested_dtype"], "float32");
  const double offset = state["nested_offset"].get<double>();
  EXPECT_NEAR(offset, scales.mean().item<double>(), 1e-7);
  // Dequantized as bitsandbytes does (code value x its block's absmax, plus the offset), each scale
  // is within half a step of the map (0.0071 of its block's largest deviation) of the exact one.
  const at::Tensor block_absmax = nested_absmax.repeat_interleave(256).narrow(0, 0, blocks);
  const at::Tensor restored = map.index_select(0, codes.to(at::kLong)) * block_absmax + offset;
  EXPECT_TRUE((restored - scales).abs().le(block_absmax * 0.0071 + 1e-7).all().item<bool>());
  EXPECT_GT((restored - scales).abs().max().item<double>(), 0);  // rounded, not copied
  // The 4-bit codes are the plain export's.
  EXPECT_TRUE(Read(file, layer).equal(Read(plain / "model.safetensors", layer)));
  const auto config = nlohmann::json::parse(testing::ReadText(nested / "config.json"));
  EXPECT_EQ(config["quantization_config"]["bnb_4bit_use_double_quant"], true);
  EXPECT_EQ(nlohmann::json::parse(testing::ReadText(
                plain / "config.json"))["quantization_config"]["bnb_4bit_use_double_quant"],
            false);

  const auto refused =
      Export({pipeline_->string() + ":qlora", "--to=" + (tmp_->path() / "hf_double").string(),
              "--format=hf", "--double_quant"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("--double_quant is for --format=bnb4"));
}

TEST_F(ExportCliTest, AFullFineTunesCheckpointReexportsInBf16) {
  const fs::path to = tmp_->path() / "bf16";
  const fs::path final_dir = tmp_->path() / "out/full/final";
  const auto exported =
      Export({final_dir.string(), "--to=" + to.string(), "--format=hf", "--dtype=bfloat16"});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  const std::string name = "model.layers.0.mlp.gate_proj.weight";
  const at::Tensor bf16 = Read(to / "model.safetensors", name);
  ASSERT_TRUE(bf16.defined());
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(bf16.equal(Read(final_dir / "model.safetensors", name).to(at::kBFloat16)));
  EXPECT_EQ(nlohmann::json::parse(testing::ReadText(to / "config.json"))["torch_dtype"],
            "bfloat16");
  EXPECT_FALSE(fs::exists(to / "manifest.pbtxt"));
  EXPECT_FALSE(fs::exists(to / "optimizer.safetensors"));
}

TEST_F(ExportCliTest, WhatCannotBeExportedIsRefusedAndNothingIsWritten) {
  const fs::path to = tmp_->path() / "refused";
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  const std::string full = pipeline_->string() + ":full";
  const std::vector<Case> cases = {
      {{full, "--to=" + to.string(), "--format=peft"},
       1,
       "stage 'full' trains no adapters, so it has no PEFT adapter files"},
      {{(tmp_->path() / "out/full/final").string(), "--to=" + to.string(), "--format=peft"},
       1,
       "holds no adapters: export --format=peft from a stage"},
      {{(tmp_->path() / "out/qlora/final").string(), "--to=" + to.string(), "--format=hf"},
       1,
       "`engine export PIPELINE.pbtxt:qlora --checkpoint "},
      {{full, "--to=" + to.string(), "--format=gguf"},
       2,
       "--format must be hf, peft or bnb4, not 'gguf'"},
      {{full, "--to=" + to.string(), "--format=bnb4"},
       1,
       "the model has no NF4 layer: a bnb4 export holds a 4-bit base"},
      {{full, "--format=hf"}, 2, "--to=DIR is required"},
      {{full, "--to=" + to.string(), "--format=hf", "--dtype=int8"}, 2, "--dtype must be"},
      {{full, "--to=" + to.string(), "--format=peft", "--dtype=bf16"}, 2, "--dtype is for"},
  };
  for (const Case& c : cases) {
    const auto result = Export(c.args);
    EXPECT_EQ(result.exit_code, c.exit_code) << c.args[0] << " " << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.message));
    EXPECT_FALSE(fs::exists(to)) << c.message;
  }
  // A directory in the way is never mixed with.
  fs::create_directories(to);
  tmp_->Write("refused/keep.txt", "mine");
  const auto busy = Export({full, "--to=" + to.string(), "--format=hf"});
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_THAT(busy.err, HasSubstr("exists and is not an empty directory"));
  EXPECT_EQ(testing::ReadText(to / "keep.txt"), "mine");
  EXPECT_FALSE(fs::exists(to / "model.safetensors"));
  // A symlink in the way is refused, not replaced, before any work.
  fs::create_directories(tmp_->path() / "elsewhere");
  fs::create_symlink(tmp_->path() / "elsewhere", tmp_->path() / "linked");
  const auto linked = Export({full, "--to=" + (tmp_->path() / "linked").string(), "--format=hf"});
  EXPECT_EQ(linked.exit_code, 1);
  EXPECT_THAT(linked.err, HasSubstr("linked' is a symlink (to '" +
                                    (tmp_->path() / "elsewhere").string() + "')"));
  EXPECT_TRUE(fs::is_symlink(tmp_->path() / "linked"));
  EXPECT_TRUE(fs::is_empty(tmp_->path() / "elsewhere"));
  // A place nothing can be written in is refused before the model is built: a directory without
  // write permission, or for root (who may write anywhere else) a process's /proc directory.
  fs::path locked = "/proc/1";
  if (::geteuid() != 0) {
    locked = tmp_->path() / "locked";
    fs::create_directories(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
  }
  const auto read_only = Export({full, "--to=" + (locked / "export").string(), "--format=hf"});
  EXPECT_EQ(read_only.exit_code, 1);
  EXPECT_THAT(read_only.err, HasSubstr("--to '" + (locked / "export").string() +
                                       "': cannot write in '" + locked.string() + "'"));
  if (::geteuid() != 0) fs::permissions(locked, fs::perms::owner_all);
  // No hidden temporaries are left beside it.
  for (const auto& item : fs::directory_iterator(tmp_->path())) {
    EXPECT_THAT(item.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
  }
}

}  // namespace
}  // namespace engine
