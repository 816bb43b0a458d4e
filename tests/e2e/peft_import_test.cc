// A LoRA adapter trained with PEFT, continued in the engine (`lora { peft_adapter: DIR }`), proven
// by PEFT itself (the project's .venv, tests/reference/export_interop.py): PEFT 0.21 makes the
// adapter on a llama base that transformers saved, with what users set (use_rslora, a rank_pattern
// and an alpha_pattern, dropout) and random A and B, as if trained.
//   - A stage that loads it and learns nothing (learning rate 1e-30: no f32 weight moves) holds
//     PEFT's tensors bit for bit, and its logits (`engine eval --logits`) are PEFT's model's on the
//     same inputs within 1e-4 (f32 sums in another order; the adapters move them by far more).
//   - A stage that trains it moves the adapters; its peft export keeps the ranks, alphas and
//     rsLoRA scale, so PEFT loads it without a warning and computes the hf export's logits.
//   - An adapter PEFT saved with modules_to_save and bias "all" (on a qwen2 base, whose q, k and v
//     projections have biases) brings the saved module's weights and the biases: a stage that
//     learns nothing holds them bit for bit and computes PEFT's logits; one that trains moves them,
//     and its peft export names them as PEFT does, so PEFT loads it without a warning.
//   - Adapters the lora plugin would compute otherwise than PEFT are refused at `engine check`,
//     naming the key or tensor.
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

constexpr double kPeftLogitTolerance = 1e-4;

// A stage on the llama base whose lora options are `lora` (inside LoraOptions).
std::string PeftStage(const std::string& name, const fs::path& base, const std::string& lora,
                      const std::string& extra) {
  return "stage { name: \"" + name + R"(" precision { plugin: "fp32" }
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    pretrained: ")" +
         base.string() +
         R"(" } } }
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] { )" +
         lora + " } } }\n  " + testing::ChatFixtureData("0.4") + extra + "\n}\n";
}

std::string PeftAdapter(const fs::path& dir) { return "peft_adapter: \"" + dir.string() + "\""; }

std::map<std::string, at::Tensor> ReadAll(const fs::path& file) {
  std::map<std::string, at::Tensor> tensors;
  auto opened = safetensors::File::Open(file);
  EXPECT_TRUE(opened.ok()) << opened.status().message();
  if (!opened.ok()) return tensors;
  auto all = (*opened)->GetAll();
  EXPECT_TRUE(all.ok()) << all.status().message();
  if (all.ok()) tensors.insert(all->begin(), all->end());
  return tensors;
}

class PeftImportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    results_ = new nlohmann::json();
    error_ = new std::string();
    for (const std::vector<std::string>& command :
         {std::vector<std::string>{"bases", (tmp_->path() / "bases").string(), "960"},
          {"peft_adapter", Source().string(), Base().string()},
          {"peft_adapter", Saved().string(), BiasedBase().string(), "saved"}}) {
      std::vector<std::string> argv = {testing::kPython, testing::kExportInteropScript};
      argv.insert(argv.end(), command.begin(), command.end());
      const auto made = testing::RunCommand(argv);
      if (made.exit_code != 0) {
        *error_ = "export_interop.py " + command[0] +
                  " failed (scripts/setup.sh makes .venv): " + made.err;
        return;
      }
    }
    const fs::path pipeline = Pipeline();
    const auto run = testing::RunEngine({"run", pipeline.string()});
    if (run.exit_code != 0) {
      *error_ = "engine run failed: " + run.err;
      return;
    }
    const fs::path logits = tmp_->path() / "loaded_logits.safetensors";
    const fs::path saved_logits = tmp_->path() / "saved_loaded_logits.safetensors";
    for (const std::vector<std::string>& command :
         {std::vector<std::string>{"eval", pipeline.string(), "--stage=loaded",
                                   "--logits=" + logits.string(), "--examples=4"},
          {"export", pipeline.string() + ":continued", "--to=" + Export("hf").string(),
           "--format=hf"},
          {"export", pipeline.string() + ":continued", "--to=" + Export("peft").string(),
           "--format=peft"},
          {"eval", pipeline.string(), "--stage=saved_loaded", "--logits=" + saved_logits.string(),
           "--examples=4"},
          {"export", pipeline.string() + ":saved_continued", "--to=" + Export("saved_hf").string(),
           "--format=hf"},
          {"export", pipeline.string() + ":saved_continued",
           "--to=" + Export("saved_peft").string(), "--format=peft"}}) {
      const auto done = testing::RunEngine(command);
      if (done.exit_code != 0) {
        *error_ = "engine " + command[0] + " " + command[2] + ": " + done.err;
        return;
      }
    }
    const nlohmann::json cases = {
        {{"name", "loaded"},
         {"base", Base().string()},
         {"peft_source", Source().string()},
         {"logits", logits.string()}},
        {{"name", "continued"},
         {"base", Base().string()},
         {"hf", Export("hf").string()},
         {"peft", Export("peft").string()},
         {"prompt", "A fortune:"},
         {"max_new_tokens", 1},
         {"texts", {"What is a fortune?", "Say hi, again, in two words."}}},
        {{"name", "saved_loaded"},
         {"base", BiasedBase().string()},
         {"peft_source", Saved().string()},
         {"logits", saved_logits.string()}},
        {{"name", "saved_continued"},
         {"base", BiasedBase().string()},
         {"hf", Export("saved_hf").string()},
         {"peft", Export("saved_peft").string()},
         {"prompt", "A fortune:"},
         {"max_new_tokens", 1},
         {"texts", {"What is a fortune?", "Say hi, again, in two words."}}}};
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
    ASSERT_EQ(results_->size(), 4u);
  }

  static fs::path Base() { return tmp_->path() / "bases" / "llama"; }
  static fs::path Source() { return tmp_->path() / "peft_source"; }
  // PEFT's adapter with saved modules and biases, on a base whose layers have biases.
  static fs::path Saved() { return tmp_->path() / "peft_saved"; }
  static fs::path BiasedBase() { return tmp_->path() / "bases" / "qwen2"; }
  static fs::path Export(const std::string& format) { return tmp_->path() / "export" / format; }
  static fs::path Out() { return tmp_->path() / "out"; }
  // "loaded" learns nothing from PEFT's adapter; "continued" trains it.
  static fs::path Pipeline() {
    return tmp_->Write(
        "peft.pbtxt",
        "name: \"peft\"\noutput_dir: \"out\"\n" +
            PeftStage(
                "loaded", Base(), PeftAdapter(Source()),
                "optimizer { learning_rate: 1e-30 }\n  schedule { max_steps: 1 batch_size: 2 }") +
            PeftStage(
                "continued", Base(), PeftAdapter(Source()) + " r: 4 use_rslora: true",
                "optimizer { learning_rate: 0.05 }\n  schedule { max_steps: 3 batch_size: 2 }") +
            PeftStage(
                "saved_loaded", BiasedBase(), PeftAdapter(Saved()),
                "optimizer { learning_rate: 1e-30 }\n  schedule { max_steps: 1 batch_size: 2 }") +
            PeftStage(
                "saved_continued", BiasedBase(), PeftAdapter(Saved()),
                "optimizer { learning_rate: 0.05 }\n  schedule { max_steps: 3 batch_size: 2 }") +
            PeftStage("saved_child", BiasedBase(), PeftAdapter(Saved()),
                      "from_stage: \"saved_continued\"\n  optimizer { learning_rate: 1e-30 }\n"
                      "  schedule { max_steps: 1 batch_size: 2 }"));
  }
  static const nlohmann::json& Result(size_t index) {
    const nlohmann::json& result = (*results_)[index];
    EXPECT_FALSE(result.contains("error")) << result["error"];
    return result;
  }

  static testing::TempDir* tmp_;
  static nlohmann::json* results_;
  static std::string* error_;
};

testing::TempDir* PeftImportTest::tmp_ = nullptr;
nlohmann::json* PeftImportTest::results_ = nullptr;
std::string* PeftImportTest::error_ = nullptr;

TEST_F(PeftImportTest, AStageStartsFromPeftsAdaptersAndComputesWhatPeftComputes) {
  const auto source = ReadAll(Source() / "adapter_model.safetensors");
  const auto loaded = ReadAll(Out() / "loaded" / "final" / "adapter_model.safetensors");
  ASSERT_EQ(source.size(), 28u);  // 2 layers x 7 projections x (A, B)
  ASSERT_EQ(loaded.size(), source.size());
  for (const auto& [name, tensor] : source) {
    ASSERT_EQ(loaded.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(loaded.at(name).to(at::kFloat), tensor.to(at::kFloat))) << name;
  }
  // The patterns gave these layers their own ranks.
  EXPECT_EQ(loaded.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").size(0), 2);
  EXPECT_EQ(loaded.at("base_model.model.model.layers.1.mlp.down_proj.lora_A.weight").size(0), 6);
  EXPECT_EQ(loaded.at("base_model.model.model.layers.0.mlp.down_proj.lora_A.weight").size(0), 4);
  // PEFT takes the first pattern that matches, in the file's order: "k_proj" comes before
  // "layers.1.self_attn.k_proj" (5), which therefore never applies.
  EXPECT_EQ(loaded.at("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight").size(0), 3);

  const nlohmann::json& result = Result(0);
  if (result.contains("error")) return;
  EXPECT_LE(result["peft_vs_engine"].get<double>(), kPeftLogitTolerance);
  EXPECT_GT(result["adapters_effect"].get<double>(), 100 * kPeftLogitTolerance);
}

TEST_F(PeftImportTest, ContinuedAdaptersExportWithTheirRanksAndScalesAndPeftReadsThem) {
  const auto source = ReadAll(Source() / "adapter_model.safetensors");
  const auto continued = ReadAll(Export("peft") / "adapter_model.safetensors");
  double moved = 0;
  for (const auto& [name, tensor] : source) {
    ASSERT_EQ(continued.count(name), 1u) << name;
    moved = std::max(moved, (continued.at(name) - tensor).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-3);
  const auto config =
      nlohmann::json::parse(testing::ReadText(Export("peft") / "adapter_config.json"));
  EXPECT_EQ(config["use_rslora"], true);
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["rank_pattern"], (nlohmann::json{{"k_proj", 3},
                                                    {"layers.1.mlp.down_proj", 6},
                                                    {"layers.1.self_attn.k_proj", 5},
                                                    {"self_attn.q_proj", 2}}));
  EXPECT_EQ(config["alpha_pattern"], (nlohmann::json{{"v_proj", 3.0}}));

  const nlohmann::json& result = Result(1);
  if (result.contains("error")) return;
  EXPECT_TRUE(result["hf_missing"].empty()) << result["hf_missing"];
  EXPECT_TRUE(result["peft_warnings"].empty()) << result["peft_warnings"];
  EXPECT_EQ(result["peft_loaded_keys"], result["peft_adapter_keys"]);
  EXPECT_LE(result["peft_vs_hf"].get<double>(), kPeftLogitTolerance);
  EXPECT_GT(result["hf_vs_base"].get<double>(), 100 * kPeftLogitTolerance);
}

TEST_F(PeftImportTest, SavedModulesAndBiasesLoadTrainAndExportAsPeftSavesThem) {
  const auto source = ReadAll(Saved() / "adapter_model.safetensors");
  const std::vector<std::string> saved = {
      "base_model.model.model.norm.weight",
      "base_model.model.model.layers.0.self_attn.q_proj.base_layer.bias",
      "base_model.model.model.layers.1.self_attn.k_proj.bias"};
  for (const std::string& name : saved) ASSERT_EQ(source.count(name), 1u) << name;

  // Loaded bit for bit (the stage learned nothing) and kept under PEFT's names.
  const auto loaded = ReadAll(Out() / "saved_loaded" / "final" / "adapter_model.safetensors");
  EXPECT_EQ(loaded.size(), source.size());
  for (const auto& [name, tensor] : source) {
    ASSERT_EQ(loaded.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(loaded.at(name).to(at::kFloat), tensor.to(at::kFloat))) << name;
  }
  const nlohmann::json& computed = Result(2);
  if (!computed.contains("error")) {
    EXPECT_LE(computed["peft_vs_engine"].get<double>(), kPeftLogitTolerance);
    EXPECT_GT(computed["adapters_effect"].get<double>(), 100 * kPeftLogitTolerance);
  }

  // Trained: the saved tensors moved, and the export names them as PEFT saved them.
  const auto continued = ReadAll(Export("saved_peft") / "adapter_model.safetensors");
  EXPECT_EQ(continued.size(), source.size());
  for (const std::string& name : saved) {
    ASSERT_EQ(continued.count(name), 1u) << name;
    EXPECT_GT((continued.at(name) - source.at(name)).abs().max().item<double>(), 1e-4) << name;
  }
  // A stage that starts from that one and loads the adapter again takes the adapter's saved
  // tensors, not its parent's (which trained them further).
  const auto child = ReadAll(Out() / "saved_child" / "final" / "adapter_model.safetensors");
  for (const std::string& name : saved) {
    ASSERT_EQ(child.count(name), 1u) << name;
    EXPECT_TRUE(at::equal(child.at(name).to(at::kFloat), source.at(name).to(at::kFloat))) << name;
  }
  const auto config =
      nlohmann::json::parse(testing::ReadText(Export("saved_peft") / "adapter_config.json"));
  EXPECT_EQ(config["bias"], "all");
  EXPECT_EQ(config["modules_to_save"], nlohmann::json({"model.norm"}));
  const nlohmann::json& exported = Result(3);
  if (exported.contains("error")) return;
  EXPECT_TRUE(exported["hf_missing"].empty()) << exported["hf_missing"];
  EXPECT_TRUE(exported["peft_warnings"].empty()) << exported["peft_warnings"];
  EXPECT_EQ(exported["peft_loaded_keys"], exported["peft_adapter_keys"]);
  EXPECT_LE(exported["peft_vs_hf"].get<double>(), kPeftLogitTolerance);
}

// `engine check` of a stage loading `dir` (with `more` lora options): exit 1 and its errors.
std::string PeftCheckErrors(const testing::TempDir& tmp, const fs::path& base, const fs::path& dir,
                            const std::string& more = "") {
  const fs::path pipeline =
      tmp.Write("bad.pbtxt", "name: \"bad\"\noutput_dir: \"out\"\n" +
                                 PeftStage("s", base, PeftAdapter(dir) + " " + more,
                                           "schedule { max_steps: 1 batch_size: 2 }"));
  const auto checked = testing::RunEngine({"check", pipeline.string()});
  EXPECT_EQ(checked.exit_code, 1) << checked.out;
  return checked.err;
}

// A copy of PEFT's adapter with `config` merged into its adapter_config.json.
fs::path Altered(const testing::TempDir& tmp, const fs::path& source, const std::string& name,
                 const nlohmann::json& config) {
  const fs::path dir = tmp.path() / name;
  fs::create_directories(dir);
  fs::copy_file(source / "adapter_model.safetensors", dir / "adapter_model.safetensors");
  nlohmann::json json = nlohmann::json::parse(testing::ReadText(source / "adapter_config.json"));
  json.merge_patch(config);
  tmp.Write(name + "/adapter_config.json", json.dump());
  return dir;
}

TEST_F(PeftImportTest, AdaptersComputedOtherwiseThanPeftAreRefusedByKeyOrTensor) {
  testing::TempDir tmp;
  int cases = 0;
  for (const auto& [config, message] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"use_dora", true}}, "'use_dora' (true) asks for DoRA's magnitude vectors"},
           {{{"modules_to_save", {"lm_head"}}},
            "modules_to_save names 'lm_head', but " + (tmp.path() / "case2").string() +
                "/adapter_model.safetensors holds no tensor of such a module"},
           {{{"bias", "some"}}, "'bias' is \"some\"; PEFT's are \"none\", \"all\" and"},
           {{{"peft_type", "IA3"}}, "'peft_type' is \"IA3\""},
           {{{"init_lora_weights", "pissa_niter_4"}},
            "'init_lora_weights' is \"pissa_niter_4\", which changes the base weights"},
           {{{"use_future_trick", 1}}, "'use_future_trick' (1) is not a LoraConfig key"},
           {{{"rank_pattern", {{"q_proj", 3}}}},
            "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is f32 [2, "
            "64]; the layer (64x64) with rank 3"}}) {
    SCOPED_TRACE(config.dump());
    const fs::path dir = Altered(tmp, Source(), "case" + std::to_string(++cases), config);
    const std::string errors = PeftCheckErrors(tmp, Base(), dir);
    EXPECT_THAT(errors, HasSubstr(message));
    EXPECT_THAT(errors, HasSubstr("adapter_config.json"));
  }
  // A tensor that is not a linear layer's LoRA weight.
  const fs::path extra = Altered(tmp, Source(), "extra", nlohmann::json::object());
  auto tensors = ReadAll(extra / "adapter_model.safetensors");
  safetensors::NamedTensors written(tensors.begin(), tensors.end());
  written.emplace_back("base_model.model.model.embed_tokens.lora_embedding_A", at::zeros({4, 960}));
  ASSERT_TRUE(safetensors::Write(extra / "adapter_model.safetensors", written).ok());
  EXPECT_THAT(PeftCheckErrors(tmp, Base(), extra),
              HasSubstr("tensor 'base_model.model.model.embed_tokens.lora_embedding_A' is not a "
                        "LoRA weight of a linear layer"));
  // A bias the model does not have (llama's layers have none), saved with bias "all".
  const fs::path biased = Altered(tmp, Source(), "biased", {{"bias", "all"}});
  written.pop_back();
  written.emplace_back("base_model.model.model.layers.0.mlp.up_proj.base_layer.bias",
                       at::zeros({64}));
  ASSERT_TRUE(safetensors::Write(biased / "adapter_model.safetensors", written).ok());
  EXPECT_THAT(PeftCheckErrors(tmp, Base(), biased),
              HasSubstr("its files hold tensor 'model.layers.0.mlp.up_proj.bias', which names no "
                        "trainable tensor of the model"));
  written.pop_back();
  written.emplace_back("base_model.model.model.embed_tokens.lora_embedding_A", at::zeros({4, 960}));
  // A layer the model does not have.
  const fs::path foreign = Altered(tmp, Source(), "foreign", nlohmann::json::object());
  written.pop_back();
  written.emplace_back("base_model.model.model.layers.7.mlp.up_proj.lora_A.weight",
                       at::zeros({4, 32}));
  written.emplace_back("base_model.model.model.layers.7.mlp.up_proj.lora_B.weight",
                       at::zeros({64, 4}));
  ASSERT_TRUE(safetensors::Write(foreign / "adapter_model.safetensors", written).ok());
  EXPECT_THAT(PeftCheckErrors(tmp, Base(), foreign),
              HasSubstr("peft_adapter pattern 'model.layers.7.mlp.up_proj' matches no linear "
                        "layer"));
  // Settings that come from the adapter, and a directory that is not one.
  EXPECT_THAT(PeftCheckErrors(tmp, Base(), Source(), "r: 16"),
              HasSubstr("r is 16, but " + (Source() / "adapter_config.json").string() +
                        " has 4; leave r out to take the adapter's"));
  EXPECT_THAT(PeftCheckErrors(tmp, Base(), Source(), "target_modules: \"q_proj\""),
              HasSubstr("target_modules: comes from peft_adapter's adapter_model.safetensors"));
  EXPECT_THAT(
      PeftCheckErrors(tmp, Base(), tmp.path() / "nowhere"),
      HasSubstr("peft_adapter names a directory PEFT's save_pretrained wrote: cannot open '" +
                (tmp.path() / "nowhere" / "adapter_config.json").string() + "'"));
}

}  // namespace
}  // namespace engine
