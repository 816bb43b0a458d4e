// A 4-bit checkpoint that transformers + bitsandbytes saved (a hub's "-bnb-4bit" directory) as a
// stage's `pretrained` base, proven by those libraries themselves (the project's .venv,
// tests/reference/export_interop.py): bitsandbytes quantizes a llama base on the CPU, with and
// without double-quantized scales, and saves it.
//   - A stage that reads it with the nf4 quantizer (block size 64, scales in f32) and learns
//     nothing holds the weights bitsandbytes dequantizes to, bit for bit (its hf export), and its
//     logits are transformers' 4-bit model's within 1e-4 (f32 matmuls summed in another order).
//   - A quant_state that disagrees with its tensors, another 4-bit type, and another quantization
//     method are refused at `engine check`, naming the tensor or key.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/safetensors.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr double kBnb4LogitTolerance = 1e-4;

// A stage on `base` with nf4 on the decoder's linear layers, in f32. (No adapter: one merged into
// the hf export would move the weights by learning_rate.)
std::string Bnb4Stage(const std::string& name, const fs::path& base,
                      const std::string& extra = "") {
  return "stage { name: \"" + name + R"(" precision { plugin: "fp32" }
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    pretrained: ")" +
         base.string() + R"(" } } }
  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] {
    target_modules: "model.layers.*" double_quant: false } } }
  optimizer { learning_rate: 1e-30 }
  schedule { max_steps: 1 batch_size: 2 }
  )" + testing::ChatFixtureData("0.4") +
         extra + "\n}\n";
}

class Bnb4ImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    results_ = new nlohmann::json();
    error_ = new std::string();
    for (const std::vector<std::string>& command :
         {std::vector<std::string>{"bases", (tmp_->path() / "bases").string(), "960"},
          {"bnb4_source", Source("plain").string(), Base().string()},
          {"bnb4_source", Source("double").string(), Base().string(), "double"}}) {
      std::vector<std::string> argv = {testing::kPython, testing::kExportInteropScript};
      argv.insert(argv.end(), command.begin(), command.end());
      const auto made = testing::RunCommand(argv);
      if (made.exit_code != 0) {
        *error_ = "export_interop.py " + command[0] +
                  " failed (scripts/setup.sh makes .venv): " + made.err;
        return;
      }
    }
    const fs::path pipeline = tmp_->Write("bnb4.pbtxt", "name: \"bnb4\"\noutput_dir: \"out\"\n" +
                                                            Bnb4Stage("plain", Source("plain")) +
                                                            Bnb4Stage("double", Source("double")));
    const auto run = testing::RunEngine({"run", pipeline.string()});
    if (run.exit_code != 0) {
      *error_ = "engine run failed: " + run.err;
      return;
    }
    nlohmann::json cases = nlohmann::json::array();
    for (const std::string stage : {"plain", "double"}) {
      const fs::path logits = tmp_->path() / (stage + "_logits.safetensors");
      const fs::path hf = tmp_->path() / "export" / stage;
      for (const std::vector<std::string>& command :
           {std::vector<std::string>{"eval", pipeline.string(), "--stage=" + stage,
                                     "--logits=" + logits.string(), "--examples=4"},
            {"export", pipeline.string() + ":" + stage, "--to=" + hf.string(), "--format=hf"}}) {
        const auto done = testing::RunEngine(command);
        if (done.exit_code != 0) {
          *error_ = "engine " + command[0] + " " + stage + ": " + done.err;
          return;
        }
      }
      cases.push_back({{"name", stage},
                       {"bnb4_source", Source(stage).string()},
                       {"logits", logits.string()},
                       {"hf", hf.string()}});
    }
    const fs::path request = tmp_->Write("cases.json", nlohmann::json{{"cases", cases}}.dump());
    const auto checked = testing::RunCommand(
        {testing::kPython, testing::kExportInteropScript, "check", request.string()});
    if (checked.exit_code != 0) {
      *error_ = "export_interop.py check failed: " + checked.err;
      return;
    }
    *results_ = nlohmann::json::parse(checked.out);
  }
  static void TearDownTestSuite() {
    delete error_;
    delete results_;
    delete tmp_;
  }
  void SetUp() override {
    ASSERT_TRUE(error_->empty()) << *error_;
    ASSERT_EQ(results_->size(), 2u);
  }

  static fs::path Base() { return tmp_->path() / "bases" / "llama"; }
  static fs::path Source(const std::string& kind) { return tmp_->path() / ("bnb4_" + kind); }

  static testing::TempDir* tmp_;
  static nlohmann::json* results_;
  static std::string* error_;
};

testing::TempDir* Bnb4ImportTest::tmp_ = nullptr;
nlohmann::json* Bnb4ImportTest::results_ = nullptr;
std::string* Bnb4ImportTest::error_ = nullptr;

TEST_F(Bnb4ImportTest, AStageOnABitsandbytesDirectoryHoldsItsWeightsAndComputesItsLogits) {
  for (size_t i = 0; i < 2; ++i) {
    const nlohmann::json& result = (*results_)[i];
    SCOPED_TRACE(i == 0 ? "plain scales" : "double-quantized scales");
    ASSERT_FALSE(result.contains("error")) << result["error"];
    EXPECT_EQ(result["bnb4_source_layers"], 14);  // 2 layers x 7 projections
    EXPECT_EQ(result["bnb4_source_weights_vs_hf"].get<double>(), 0.0);
    EXPECT_LE(result["bnb4_source_vs_engine"].get<double>(), kBnb4LogitTolerance);
  }
}

// A copy of the plain 4-bit directory whose tensors `edit` changes.
fs::path Edited(const testing::TempDir& tmp, const fs::path& source, const std::string& name,
                const std::function<void(safetensors::NamedTensors*)>& edit) {
  const fs::path dir = tmp.path() / name;
  fs::copy(source, dir);
  auto file = safetensors::File::Open(dir / "model.safetensors");
  EXPECT_TRUE(file.ok());
  auto all = (*file)->GetAll();
  EXPECT_TRUE(all.ok());
  safetensors::NamedTensors tensors(all->begin(), all->end());
  file->reset();
  edit(&tensors);
  EXPECT_TRUE(safetensors::Write(dir / "model.safetensors", tensors, {{"format", "pt"}}).ok());
  return dir;
}

at::Tensor StateBytes(const std::string& json) {
  const std::vector<uint8_t> bytes(json.begin(), json.end());
  return at::tensor(at::ArrayRef<uint8_t>(bytes), at::TensorOptions(at::kByte));
}

// `engine check` of a stage on `base`: exit 1 and its errors.
std::string Bnb4CheckErrors(const testing::TempDir& tmp, const fs::path& base) {
  const fs::path pipeline =
      tmp.Write("bad.pbtxt", "name: \"bad\"\noutput_dir: \"out\"\n" + Bnb4Stage("s", base));
  const auto checked = testing::RunEngine({"check", pipeline.string()});
  EXPECT_EQ(checked.exit_code, 1) << checked.out;
  return checked.err;
}

TEST_F(Bnb4ImportTest, StatesThatDisagreeWithTheirTensorsAreRefusedByName) {
  testing::TempDir tmp;
  const std::string layer = "model.layers.0.self_attn.q_proj.weight";
  const auto with_state = [&](const std::string& json) {
    return [&, json](safetensors::NamedTensors* tensors) {
      for (auto& [name, tensor] : *tensors) {
        if (name == layer + ".quant_state.bitsandbytes__nf4") tensor = StateBytes(json);
      }
    };
  };
  EXPECT_THAT(Bnb4CheckErrors(tmp, Edited(tmp, Source("plain"), "shape",
                                          with_state(R"({"quant_type": "nf4", "blocksize": 64, )"
                                                     R"("dtype": "float32", "shape": [64, 16]})"))),
              HasSubstr("tensor '" + layer +
                        ".quant_state.bitsandbytes__nf4' has shape [64,16], but the "
                        "model's weight is [64, 64]"));
  EXPECT_THAT(Bnb4CheckErrors(tmp, Edited(tmp, Source("plain"), "fp4",
                                          with_state(R"({"quant_type": "fp4", "blocksize": 64, )"
                                                     R"("dtype": "float32", "shape": [64, 64]})"))),
              HasSubstr("has quant_type \"fp4\"; only bitsandbytes' NF4 4-bit layers are read"));
  EXPECT_THAT(
      Bnb4CheckErrors(tmp, Edited(tmp, Source("plain"), "blocks",
                                  with_state(R"({"quant_type": "nf4", "blocksize": 128, )"
                                             R"("dtype": "float32", "shape": [64, 64]})"))),
      HasSubstr("tensor '" + layer + ".absmax' is f32 [64], but 32 blocks of 128 needs 32"));
  EXPECT_THAT(Bnb4CheckErrors(tmp, Edited(tmp, Source("plain"), "codes",
                                          [&](safetensors::NamedTensors* tensors) {
                                            for (auto& [name, tensor] : *tensors) {
                                              if (name == layer) tensor = tensor.narrow(0, 0, 100);
                                            }
                                          })),
              HasSubstr("tensor '" + layer + "' is u8 [100, 1], but its quant_state's shape"));

  // Another quantization method, named by key.
  const fs::path gptq = tmp.path() / "gptq";
  fs::copy(Source("plain"), gptq);
  nlohmann::json config = nlohmann::json::parse(testing::ReadText(gptq / "config.json"));
  config["quantization_config"]["load_in_4bit"] = false;
  config["quantization_config"]["load_in_8bit"] = true;
  tmp.Write("gptq/config.json", config.dump());
  EXPECT_THAT(Bnb4CheckErrors(tmp, gptq),
              HasSubstr("'quantization_config' has quant_method \"bitsandbytes\", load_in_4bit "
                        "false"));
}

}  // namespace
}  // namespace engine
