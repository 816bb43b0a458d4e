// What `engine export` writes, read by transformers, PEFT and bitsandbytes themselves (the
// project's .venv, tests/reference/export_interop.py), as a user deploys it: for a LoRA stage and
// a QLoRA stage (NF4 base) on a base checkpoint of each decoder family (llama, mistral, qwen2,
// qwen3; random weights that transformers saved),
//   - the hf export loads with AutoModelForCausalLM with no missing and no unexpected key, and its
//     greedy continuation in transformers is the engine's on the stage, token for token;
//   - the peft export loads without a warning into the base (the LoRA stage's checkpoint, or the
//     QLoRA stage's bnb4 export read by bitsandbytes), with every adapter tensor it holds in the
//     model, and gives the hf export's logits (which the trained adapters moved away from the
//     base's);
//   - the bnb4 export loads through bitsandbytes (its CPU backend), each 4-bit layer dequantizing
//     to the stage's 4-bit weight, and with --double_quant its nested scales load too.
// Tolerances: 1e-4 on f32 logits between PEFT's unmerged adapters and the merged hf export (the
// same sums in another order; an adapter lost or mis-scaled moves them by far more), and between
// the hf export and the engine's own logits on the same eval batch (`engine eval --logits`: the
// stage's adapters unmerged, and for QLoRA its 4-bit weights dequantized per product). 1e-6 between
// bitsandbytes' dequantized weight and the hf export's less alpha / r * B A: the hf export holds
// the stage's dequantized weight plus that product rounded to f32, and taking it away again
// leaves that rounding (one NF4 step is about a tenth of a block's largest weight). 1% of a
// layer's largest weight between the double-quantized scales and the plain ones (8-bit scales).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>

#include "testing/pipelines.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kFamilies = {"llama", "mistral", "qwen2", "qwen3"};
constexpr char kPrompt[] = "A fortune: you will";
constexpr int kNewTokens = 8;
constexpr double kExportLogitTolerance = 1e-4;
// <|im_end|>: the bases' eos_token_id (export_interop.py: vocabulary size 960 - 2) and the
// qwen2_vl fixture's.
constexpr int64_t kBaseEos = 958;
constexpr int64_t kFixtureEos = 261;
constexpr double kFourBitWeightTolerance = 1e-6;
constexpr double kDoubleQuantTolerance = 0.01;
// 2 decoder layers of 7 projections, each with an adapter.
constexpr int kFourBitLayers = 14;

// Of the eval split, for `engine eval --logits` (at most the split).
constexpr char kLogitExamples[] = "--examples=4";

// A LoRA stage and a QLoRA stage per family, in this order.
std::vector<std::string> Stages() {
  std::vector<std::string> stages;
  for (const std::string& family : kFamilies) {
    stages.push_back(family);
    stages.push_back(family + "_qlora");
  }
  return stages;
}

bool IsQlora(const std::string& stage) {
  return stage.size() > 6 && stage.rfind("_qlora") == stage.size() - 6;
}

// export_interop.py check on `cases`: its results, or null with `*error` set.
nlohmann::json RunReference(const testing::TempDir& tmp, const nlohmann::json& cases,
                            std::string* error) {
  const fs::path request = tmp.Write("cases.json", nlohmann::json{{"cases", cases}}.dump());
  const auto checked = testing::RunCommand(
      {testing::kPython, testing::kExportInteropScript, "check", request.string()});
  if (checked.exit_code != 0) {
    *error = "export_interop.py check failed (scripts/setup.sh makes .venv): " + checked.err;
    return nullptr;
  }
  return nlohmann::json::parse(checked.out);
}

// `engine generate` of `source` with `flags` and kNewTokens: its first output, or null with
// `*error` set.
nlohmann::json Generate(const std::string& source, std::vector<std::string> flags,
                        std::string* error) {
  flags.insert(flags.begin(), {"generate", source, "--format=json",
                               "--max_new_tokens=" + std::to_string(kNewTokens)});
  const auto generated = testing::RunEngine(flags);
  if (generated.exit_code != 0) {
    *error = "engine generate " + source + ": " + generated.err;
    return nullptr;
  }
  return nlohmann::json::parse(generated.out)["outputs"][0];
}

// `engine eval --logits` of `stage` in `pipeline` into `file`; false with `*error` set.
bool WriteLogits(const fs::path& pipeline, const std::string& stage, const fs::path& file,
                 std::string* error) {
  const auto written = testing::RunEngine(
      {"eval", pipeline.string(), "--stage=" + stage, "--logits=" + file.string(), kLogitExamples});
  if (written.exit_code != 0) *error = "engine eval --logits of " + stage + ": " + written.err;
  return written.exit_code == 0;
}

// transformers' greedy ids against the engine's: the same tokens, where the engine stopped early
// because it met `eos` (which transformers keeps and the engine leaves out).
void ExpectSameContinuation(const std::vector<int64_t>& ours, std::vector<int64_t> theirs,
                            int64_t eos) {
  ASSERT_FALSE(ours.empty());
  if (ours.size() < static_cast<size_t>(kNewTokens)) {
    ASSERT_GT(theirs.size(), ours.size()) << ::testing::PrintToString(theirs);
    EXPECT_EQ(theirs[ours.size()], eos);
    theirs.resize(ours.size());
  }
  EXPECT_EQ(ours, theirs);
}

// The hf export loaded by transformers: no key missing, none unexpected.
void ExpectEveryKeyLoaded(const nlohmann::json& result) {
  EXPECT_TRUE(result["hf_missing"].empty()) << result["hf_missing"];
  EXPECT_TRUE(result["hf_unexpected"].empty()) << result["hf_unexpected"];
}

// The peft export on its base: every adapter loaded without a warning, the hf export's logits, and
// the adapters trained (without them the logits are another model's).
void ExpectPeftComputesTheHfExport(const nlohmann::json& result) {
  EXPECT_TRUE(result["peft_warnings"].empty()) << result["peft_warnings"];
  EXPECT_FALSE(result["peft_adapter_keys"].empty());
  EXPECT_EQ(result["peft_loaded_keys"], result["peft_adapter_keys"]);
  EXPECT_LE(result["peft_vs_hf"].get<double>(), kExportLogitTolerance);
  EXPECT_GT(result["hf_vs_base"].get<double>(), 100 * kExportLogitTolerance);
}

// Both bnb4 exports read by bitsandbytes: every key, each of the `layers` 4-bit layers the stage's,
// and with --double_quant nested scales close to the plain ones.
void ExpectBnb4ExportsHoldTheStagesWeights(const nlohmann::json& result,
                                           int layers = kFourBitLayers) {
  EXPECT_TRUE(result["bnb4_missing"].empty()) << result["bnb4_missing"];
  EXPECT_TRUE(result["bnb4_unexpected"].empty()) << result["bnb4_unexpected"];
  EXPECT_EQ(result["bnb4_layers"], layers);
  EXPECT_LE(result["bnb4_vs_hf"].get<double>(), kFourBitWeightTolerance);
  EXPECT_EQ(result["bnb4_double_layers"], layers);
  EXPECT_TRUE(result["bnb4_double_nested"].get<bool>());
  EXPECT_LE(result["bnb4_double_vs_bnb4"].get<double>(), kDoubleQuantTolerance);
}

class ExportInteropTest : public ::testing::Test {
 protected:
  // The bases (transformers), one LoRA stage on each (the engine), both exports and the stage's
  // greedy continuation; then transformers and PEFT read the exports.
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    results_ = new nlohmann::json();
    engine_ids_ = new nlohmann::json();
    error_ = new std::string();
    const fs::path reference = testing::kExportInteropScript;
    // qwen2_bpe.json: 956 model tokens and 3 added ones.
    const auto bases = testing::RunCommand(
        {testing::kPython, reference.string(), "bases", (tmp_->path() / "bases").string(), "960"});
    if (bases.exit_code != 0) {
      *error_ = "making the bases failed (scripts/setup.sh makes .venv): " + bases.err;
      return;
    }
    std::string pipeline = "name: \"interop\"\noutput_dir: \"out\"\n";
    for (const std::string& stage : Stages()) {
      const std::string family = stage.substr(0, stage.find('_'));
      const std::string quantizer = IsQlora(stage) ? R"(
  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] {
    target_modules: "model.layers.*" } } })"
                                                   : "";
      pipeline += "stage { name: \"" + stage + R"(" precision { plugin: "fp32" }
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    pretrained: ")" +
                  (tmp_->path() / "bases" / family).string() + R"(" } } })" + quantizer + R"(
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] {
    r: 4 lora_alpha: 8 target_modules: "model.layers.*" } } }
  )" + testing::ChatFixtureData("0.4") +
                  R"(
  optimizer { learning_rate: 0.05 }
  schedule { max_steps: 3 batch_size: 2 }
}
)";
    }
    const fs::path file = tmp_->Write("interop.pbtxt", pipeline);
    const auto run = testing::RunEngine({"run", file.string()});
    if (run.exit_code != 0) {
      *error_ = "engine run failed: " + run.err;
      return;
    }
    nlohmann::json cases = nlohmann::json::array();
    for (const std::string& stage : Stages()) {
      const std::string family = stage.substr(0, stage.find('_'));
      const std::string source = file.string() + ":" + stage;
      std::vector<std::vector<std::string>> exports = {{"hf", "--format=hf"},
                                                       {"peft", "--format=peft"}};
      if (IsQlora(stage)) {
        exports.push_back({"bnb4", "--format=bnb4"});
        exports.push_back({"bnb4_double", "--format=bnb4", "--double_quant"});
      }
      for (const auto& flags : exports) {
        std::vector<std::string> args = {"export", source, "--to=" + Dir(stage, flags[0]).string()};
        args.insert(args.end(), flags.begin() + 1, flags.end());
        const auto exported = testing::RunEngine(args);
        if (exported.exit_code != 0) {
          *error_ = "engine export " + source + " " + flags[1] + ": " + exported.err;
          return;
        }
      }
      const nlohmann::json generated =
          Generate(source, {"--raw", std::string("--prompt=") + kPrompt}, error_);
      if (generated.is_null()) return;
      const fs::path logits = tmp_->path() / "exports" / stage / "logits.safetensors";
      if (!WriteLogits(file, stage, logits, error_)) return;
      (*engine_ids_)[stage] = generated["ids"];
      nlohmann::json c = {
          {"name", stage},
          {"base", (tmp_->path() / "bases" / family).string()},
          {"hf", Dir(stage, "hf").string()},
          {"peft", Dir(stage, "peft").string()},
          {"logits", logits.string()},
          {"prompt", kPrompt},
          {"max_new_tokens", kNewTokens},
          {"texts", {"What is a fortune?", "Say hi, again, in two words.", "A penny saved"}}};
      if (IsQlora(stage)) {
        c["bnb4"] = Dir(stage, "bnb4").string();
        c["bnb4_double"] = Dir(stage, "bnb4_double").string();
      }
      cases.push_back(c);
    }
    *results_ = RunReference(*tmp_, cases, error_);
  }
  static void TearDownTestSuite() {
    delete error_;
    delete engine_ids_;
    delete results_;
    delete tmp_;
  }
  void SetUp() override {
    ASSERT_TRUE(error_->empty()) << *error_;
    ASSERT_EQ(results_->size(), Stages().size());
  }

  static fs::path Dir(const std::string& stage, const std::string& format) {
    return tmp_->path() / "exports" / stage / format;
  }
  // The reference's result for `stage`, with its failure (if any) as a test failure.
  static const nlohmann::json& Result(const std::string& stage) {
    const std::vector<std::string> stages = Stages();
    const size_t index = std::find(stages.begin(), stages.end(), stage) - stages.begin();
    const nlohmann::json& result = (*results_)[index];
    EXPECT_FALSE(result.contains("error")) << stage << ": " << result["error"];
    return result;
  }

  static testing::TempDir* tmp_;
  static nlohmann::json* results_;
  static nlohmann::json* engine_ids_;
  static std::string* error_;
};

testing::TempDir* ExportInteropTest::tmp_ = nullptr;
nlohmann::json* ExportInteropTest::results_ = nullptr;
nlohmann::json* ExportInteropTest::engine_ids_ = nullptr;
std::string* ExportInteropTest::error_ = nullptr;

TEST_F(ExportInteropTest, HfExportsLoadInTransformersWithEveryKeyAndGenerateAsTheStage) {
  for (const std::string& stage : Stages()) {
    SCOPED_TRACE(stage);
    const nlohmann::json& result = Result(stage);
    if (result.contains("error")) continue;
    ExpectEveryKeyLoaded(result);
    ExpectSameContinuation((*engine_ids_)[stage].get<std::vector<int64_t>>(),
                           result["hf_greedy"].get<std::vector<int64_t>>(), kBaseEos);
  }
}

TEST_F(ExportInteropTest, HfExportsComputeTheEnginesLogitsOnTheSameEvalBatch) {
  for (const std::string& stage : Stages()) {
    SCOPED_TRACE(stage);
    const nlohmann::json& result = Result(stage);
    if (result.contains("error")) continue;
    EXPECT_LE(result["hf_vs_engine"].get<double>(), kExportLogitTolerance);
  }
}

TEST_F(ExportInteropTest, PeftExportsLoadEveryAdapterWithoutWarningsAndComputeTheHfExport) {
  for (const std::string& stage : Stages()) {
    SCOPED_TRACE(stage);
    const nlohmann::json& result = Result(stage);
    if (result.contains("error")) continue;
    ExpectPeftComputesTheHfExport(result);
  }
}

TEST_F(ExportInteropTest, Bnb4ExportsLoadInBitsandbytesAsTheStagesFourBitWeights) {
  for (const std::string& stage : Stages()) {
    if (!IsQlora(stage)) continue;
    SCOPED_TRACE(stage);
    const nlohmann::json& result = Result(stage);
    if (result.contains("error")) continue;
    ExpectBnb4ExportsHoldTheStagesWeights(result);
  }
}

// A LoRA stage of each image-text family (qwen2_vl, qwen2_5_vl, qwen3_vl) on its fixture (its
// checkpoint,
// tokenizer and image processor, as transformers 5.17 saved them), trained on image
// conversations: the hf export loads with AutoModelForImageTextToText with no missing and no
// unexpected key, and transformers' greedy continuation of a question about an image, through the
// processor read from the export, is `engine generate --image` on the stage, token for token; the
// peft export, named after transformers 5's modules (model.language_model.*, and model.visual.*
// for the adapter on a vision block), loads every adapter into the base without a warning and
// gives the hf export's logits on that prompt and image (tolerance as above); and on the eval
// split's image conversations, the hf export computes the engine's logits.
class ImageTextExportInteropTest : public ::testing::TestWithParam<std::string> {
 protected:
  // What one family's stage, exports and reference run gave (or the first error).
  struct Case {
    testing::TempDir tmp;
    nlohmann::json engine_ids, result, peft_source_result;
    nlohmann::json qlora_engine_ids, qlora_result;  // the QLoRA stage's
    std::string error;
  };

  // Trains, exports and checks the family once for all its tests.
  static const Case& CaseOf(const std::string& family) {
    std::unique_ptr<Case>& c = (*cases_)[family];
    if (c != nullptr) return *c;
    c = std::make_unique<Case>();
    const fs::path fixture = fs::path(testing::kFixtureDir) / "hf" / family;
    const fs::path peft_source = c->tmp.path() / "peft_source";
    const auto made = testing::RunCommand({testing::kPython, testing::kExportInteropScript,
                                           "peft_adapter", peft_source.string(), fixture.string()});
    if (made.exit_code != 0) {
      c->error = "export_interop.py peft_adapter failed: " + made.err;
      return *c;
    }
    const fs::path file = WritePipeline(family, c->tmp);
    const auto run = testing::RunEngine({"run", file.string()});
    if (run.exit_code != 0) {
      c->error = "engine run failed: " + run.err;
      return *c;
    }
    const std::string source = file.string() + ":vl";
    const fs::path hf = c->tmp.path() / "hf", peft = c->tmp.path() / "peft";
    for (const auto& [to, format] : {std::pair{hf, "hf"}, {peft, "peft"}}) {
      const auto exported = testing::RunEngine(
          {"export", source, "--to=" + to.string(), std::string("--format=") + format});
      if (exported.exit_code != 0) {
        c->error = std::string("engine export --format=") + format + ": " + exported.err;
        return *c;
      }
    }
    const std::string image =
        (fs::path(testing::kFixtureDir) / "hf" / family / "images/chelsea.png").string();
    const nlohmann::json generated =
        Generate(source, {"--image=" + image, "--prompt=Cat?"}, &c->error);
    if (generated.is_null()) return *c;
    c->engine_ids = generated["ids"];
    const std::string qlora = file.string() + ":vq";
    const fs::path exports = c->tmp.path() / "vq";
    for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
             {"hf", "--format=hf"},
             {"peft", "--format=peft"},
             {"bnb4", "--format=bnb4"},
             {"bnb4_double", "--format=bnb4", "--double_quant"}}) {
      std::vector<std::string> args = {"export", qlora, "--to=" + (exports / flags[0]).string()};
      args.insert(args.end(), flags.begin() + 1, flags.end());
      const auto exported = testing::RunEngine(args);
      if (exported.exit_code != 0) {
        c->error = "engine export " + qlora + " " + flags[1] + ": " + exported.err;
        return *c;
      }
    }
    const nlohmann::json qlora_generated =
        Generate(qlora, {"--image=" + image, "--prompt=Cat?"}, &c->error);
    if (qlora_generated.is_null()) return *c;
    c->qlora_engine_ids = qlora_generated["ids"];
    const fs::path logits = c->tmp.path() / "logits.safetensors";
    const fs::path peft_logits = c->tmp.path() / "peft_logits.safetensors";
    const fs::path qlora_logits = exports / "logits.safetensors";
    if (!WriteLogits(file, "vl", logits, &c->error) ||
        !WriteLogits(file, "from_peft", peft_logits, &c->error) ||
        !WriteLogits(file, "vq", qlora_logits, &c->error)) {
      return *c;
    }
    const nlohmann::json results =
        RunReference(c->tmp,
                     {{{"name", family},
                       {"logits", logits.string()},
                       {"hf", hf.string()},
                       {"peft", peft.string()},
                       {"base", fixture.string()},
                       {"image", image},
                       {"prompt_text", generated["prompt_text"]},
                       {"max_new_tokens", kNewTokens}},
                      {{"name", family + " from PEFT"},
                       {"base", fixture.string()},
                       {"peft_source", peft_source.string()},
                       {"logits", peft_logits.string()}},
                      {{"name", family + " QLoRA"},
                       {"logits", qlora_logits.string()},
                       {"hf", (exports / "hf").string()},
                       {"peft", (exports / "peft").string()},
                       {"bnb4", (exports / "bnb4").string()},
                       {"bnb4_double", (exports / "bnb4_double").string()},
                       {"base", fixture.string()},
                       {"image", image},
                       {"prompt_text", qlora_generated["prompt_text"]},
                       {"max_new_tokens", kNewTokens}}},
                     &c->error);
    if (!results.is_null()) {
      c->result = results[0];
      c->peft_source_result = results[1];
      c->qlora_result = results[2];
    }
    return *c;
  }
  // The fixture's tokenizer with a chat template that places each image's tokens, five image
  // conversations over its images, and the pipeline.
  static fs::path WritePipeline(const std::string& family, testing::TempDir& tmp) {
    const fs::path fixture = fs::path(testing::kFixtureDir) / "hf" / family;
    fs::create_directories(tmp.path() / "tokenizer");
    for (const char* file : {"tokenizer.json", "preprocessor_config.json"}) {
      fs::copy_file(fixture / file, tmp.path() / "tokenizer" / file);
    }
    nlohmann::json config =
        nlohmann::json::parse(testing::ReadText(fixture / "tokenizer_config.json"));
    config["eos_token"] = "<|im_end|>";
    config["chat_template"] =
        "{%- for m in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}<|im_start|>"
        "{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}{% else %}"
        "{% for part in m['content'] %}{% if part['type'] == 'image' %}"
        "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}<|im_end|>{%- endfor %}{% if add_generation_prompt %}"
        "{{ '\\n' }}<|im_start|>assistant\n{% endif %}";
    tmp.Write("tokenizer/tokenizer_config.json", config.dump());
    std::string lines;
    for (const auto& [image, question, answer] :
         {std::tuple<const char*, const char*, const char*>{"chelsea.png", "Cat?", "Yes"},
          {"rocket.jpg", "Rocket?", "Yes"},
          {"camera.png", "Cat?", "No"},
          {"logo.png", "Logo?", "Yes"},
          {"chelsea.png", "Dog?", "No"}}) {
      const nlohmann::json line = {
          {"messages",
           {{{"role", "user"}, {"content", std::string("<image>") + question}},
            {{"role", "assistant"}, {"content", answer}}}},
          {"images", {(fixture / "images" / image).string()}}};
      lines += line.dump() + "\n";
    }
    tmp.Write("data.jsonl", lines);
    const auto stage =
        [&](const std::string& name, const std::string& lora, const std::string& training) {
          return "stage { name: \"" + name + R"(" precision { plugin: "fp32" }
  model { plugin: ")" +
                 family +
                 R"(" options { [type.googleapis.com/engine.transformer.Qwen2VlOptions] {
    pretrained: ")" +
                 fixture.string() +
                 R"(" } } }
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] { )" +
                 lora + R"( } } }
  data { plugin: "chat" options { [type.googleapis.com/engine.plugins.ChatOptions] {
    path: ")" + (tmp.path() / "data.jsonl").string() +
                 R"(" eval_fraction: 0.4
    images { allowed_dirs: ")" +
                 (fixture / "images").string() + R"(" }
    tokenizer { kind: HF_JSON path: ")" +
                 (tmp.path() / "tokenizer").string() + R"(" } } } }
  )" + training + "\n}\n";
        };
    // Quantizer patterns match the checkpoint's names: Qwen3-VL's are transformers 5's.
    const std::string decoder =
        family == "qwen3_vl" ? "model.language_model.layers.*" : "model.layers.*";
    // "from_peft" loads PEFT's adapter and learns nothing (no f32 weight moves at 1e-30). "vq"
    // quantizes in blocks of 32, so that each of the fixture's 32-wide rows holds whole blocks:
    // bitsandbytes 0.50's CPU kernel on an AVX-512 CPU dequantizes narrower rows wrongly.
    return tmp.Write(
        "vl.pbtxt",
        "name: \"vl\"\noutput_dir: \"out\"\n" +
            stage("vl",
                  "r: 4 lora_alpha: 8 target_modules: \"" + decoder +
                      "\" "
                      "target_modules: \"model.visual.blocks.0.attn.qkv\"",
                  "optimizer { learning_rate: 0.05 } schedule { max_steps: 3 batch_size: 2 }") +
            stage("from_peft", "peft_adapter: \"" + (tmp.path() / "peft_source").string() + "\"",
                  "optimizer { learning_rate: 1e-30 } schedule { max_steps: 1 batch_size: 2 }") +
            stage("vq", "r: 4 lora_alpha: 8 target_modules: \"" + decoder + "\"",
                  "quantizer { plugin: \"nf4\" options { "
                  "[type.googleapis.com/engine.plugins.Nf4Options] { target_modules: \"" +
                      decoder +
                      "\" block_size: 32 } } }\n  optimizer { learning_rate: 0.05 } schedule { "
                      "max_steps: 3 batch_size: 2 }"));
  }
  static void SetUpTestSuite() { cases_ = new std::map<std::string, std::unique_ptr<Case>>(); }
  static void TearDownTestSuite() { delete cases_; }
  void SetUp() override {
    const Case& c = CaseOf(GetParam());
    ASSERT_TRUE(c.error.empty()) << c.error;
    ASSERT_FALSE(c.result.contains("error")) << c.result["error"];
  }
  const nlohmann::json& result() const { return CaseOf(GetParam()).result; }
  const nlohmann::json& engine_ids() const { return CaseOf(GetParam()).engine_ids; }

  static std::map<std::string, std::unique_ptr<Case>>* cases_;
};

std::map<std::string, std::unique_ptr<ImageTextExportInteropTest::Case>>*
    ImageTextExportInteropTest::cases_ = nullptr;

TEST_P(ImageTextExportInteropTest, HfExportLoadsInTransformersAndAnswersAboutAnImageAsTheStage) {
  ExpectEveryKeyLoaded(result());
  ExpectSameContinuation(engine_ids().get<std::vector<int64_t>>(),
                         result()["hf_greedy"].get<std::vector<int64_t>>(), kFixtureEos);
}

// On the eval split's image conversations: transformers works out the same multimodal positions
// from the image tokens and grids, and the hf export computes the engine's logits.
TEST_P(ImageTextExportInteropTest, HfExportComputesTheEnginesLogitsAndPositionsWithImages) {
  EXPECT_TRUE(result()["positions_equal"].get<bool>());
  EXPECT_LE(result()["hf_vs_engine"].get<double>(), kExportLogitTolerance);
}

// Adapters PEFT made on the family's fixture (on the decoder's and the vision blocks' linear
// layers, named as transformers 5 names the modules, with a rank_pattern, an alpha_pattern and
// use_rslora), loaded by a stage that learns nothing: PEFT's model computes the stage's logits on
// its eval split's image conversations.
TEST_P(ImageTextExportInteropTest, PeftAdaptersOnTransformersFiveModulesLoadAsPeftComputesThem) {
  const nlohmann::json& peft = CaseOf(GetParam()).peft_source_result;
  ASSERT_FALSE(peft.contains("error")) << peft["error"];
  EXPECT_LE(peft["peft_vs_engine"].get<double>(), kExportLogitTolerance);
  EXPECT_GT(peft["adapters_effect"].get<double>(), 100 * kExportLogitTolerance);
}

// A QLoRA stage (NF4 decoder layers): its hf export loads with every key, answers about the image
// as the stage does and computes its logits; its bnb4 exports load through bitsandbytes with
// AutoModelForImageTextToText, each 4-bit layer the stage's; its peft export on the bnb4 base
// computes the hf export.
TEST_P(ImageTextExportInteropTest, QloraExportsLoadThroughBitsandbytesAndComputeTheStage) {
  const Case& c = CaseOf(GetParam());
  const nlohmann::json& result = c.qlora_result;
  ASSERT_FALSE(result.contains("error")) << result["error"];
  ExpectEveryKeyLoaded(result);
  ExpectSameContinuation(c.qlora_engine_ids.get<std::vector<int64_t>>(),
                         result["hf_greedy"].get<std::vector<int64_t>>(), kFixtureEos);
  EXPECT_TRUE(result["positions_equal"].get<bool>());
  EXPECT_LE(result["hf_vs_engine"].get<double>(), kExportLogitTolerance);
  // The qwen3_vl fixture's decoder has 3 layers (DeepStack feeds 2 of them), the others' 2.
  ExpectBnb4ExportsHoldTheStagesWeights(result, GetParam() == "qwen3_vl" ? 21 : kFourBitLayers);
  ExpectPeftComputesTheHfExport(result);
}

TEST_P(ImageTextExportInteropTest, PeftExportLoadsEveryAdapterIntoTransformersFiveModules) {
  ExpectPeftComputesTheHfExport(result());
}

INSTANTIATE_TEST_SUITE_P(Families, ImageTextExportInteropTest,
                         ::testing::Values("qwen2_vl", "qwen2_5_vl", "qwen3_vl"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace engine
