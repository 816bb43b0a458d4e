// `engine generate` as a user runs it: from a trained stage and from its final checkpoint as a
// model directory, with the chat template, stop ids from generation_config.json, sampling seeds,
// batches that give what each prompt gives alone, and every bad input refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/remove_tree.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GenerateCliTest : public ::testing::Test {
 protected:
  // One chat SFT stage trained for two steps, shared by the tests (training is the slow part).
  static void SetUpTestSuite() {
    tmp_ = new testing::TempDir();
    const fs::path fixtures = fs::path(testing::kSourceDir) / "tests/fixtures";
    pipeline_ = new fs::path(tmp_->Write("p.pbtxt", R"(name: "chat"
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
)"));
    run_ = new testing::CommandResult(testing::RunEngine({"run", pipeline_->string()}));
  }
  static void TearDownTestSuite() {
    delete run_;
    delete pipeline_;
    delete tmp_;
  }
  void SetUp() override { ASSERT_EQ(run_->exit_code, 0) << run_->err; }

  static fs::path FinalDir() { return tmp_->path() / "out/sft/final"; }

  // A copy of the final checkpoint as a plain model directory (no manifest), to edit.
  static fs::path ModelDirCopy(const std::string& name) {
    const fs::path dir = tmp_->path() / name;
    std::error_code removed;
    RemoveTree(dir, removed);
    fs::copy(FinalDir(), dir);
    fs::remove(dir / "manifest.pbtxt");
    return dir;
  }

  // `engine generate SOURCE ARGS... --format=json`, parsed; fails the test on a non-zero exit.
  static nlohmann::json Generate(const std::string& source, std::vector<std::string> args) {
    args.insert(args.begin(), {"generate", source});
    args.push_back("--format=json");
    const auto result = testing::RunEngine(args);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    if (result.exit_code != 0) return nlohmann::json::object();
    return nlohmann::json::parse(result.out);
  }

  static std::vector<int64_t> Ids(const nlohmann::json& out, size_t i) {
    return out["outputs"][i]["ids"].get<std::vector<int64_t>>();
  }

  static testing::TempDir* tmp_;
  static fs::path* pipeline_;
  static testing::CommandResult* run_;
};

testing::TempDir* GenerateCliTest::tmp_ = nullptr;
fs::path* GenerateCliTest::pipeline_ = nullptr;
testing::CommandResult* GenerateCliTest::run_ = nullptr;

TEST_F(GenerateCliTest, PromptsAreRenderedWithTheModelsChatTemplate) {
  const auto out = Generate(pipeline_->string(), {"--prompt=Hello", "--max_new_tokens=3"});
  ASSERT_EQ(out["outputs"].size(), 1u);
  // The fixture's template is ChatML with a default system prompt, as Qwen2's.
  EXPECT_EQ(out["outputs"][0]["prompt_text"],
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Ids(out, 0).size(), 3u);
  EXPECT_EQ(out["outputs"][0]["finish_reason"], "length");
  const auto raw = Generate(pipeline_->string(), {"--prompt=Hello", "--raw", "--max_new_tokens=3"});
  EXPECT_EQ(raw["outputs"][0]["prompt_text"], "Hello");
}

TEST_F(GenerateCliTest, TheStageAndItsFinalDirectoryGiveTheSameReplies) {
  const std::vector<std::string> args = {"--prompt=Hello there", "--prompt=Hi",
                                         "--max_new_tokens=6"};
  const auto from_stage = Generate(pipeline_->string() + ":sft", args);
  const auto from_dir = Generate(FinalDir().string(), args);
  ASSERT_EQ(from_stage["outputs"].size(), 2u);
  EXPECT_EQ(from_stage["outputs"], from_dir["outputs"]);
  EXPECT_THAT(from_stage["source"].get<std::string>(), HasSubstr("stage 'sft'"));
  EXPECT_THAT(from_dir["source"].get<std::string>(), HasSubstr("model directory"));
}

TEST_F(GenerateCliTest, ABatchGivesWhatEachPromptGivesAlone) {
  // The prompts have different lengths, so the shorter one is left-padded in the batch.
  const auto batch =
      Generate(FinalDir().string(), {"--prompt=Hello there, how are you today?", "--prompt=Hi",
                                     "--max_new_tokens=6", "--batch_size=2"});
  const auto first = Generate(FinalDir().string(),
                              {"--prompt=Hello there, how are you today?", "--max_new_tokens=6"});
  const auto second = Generate(FinalDir().string(), {"--prompt=Hi", "--max_new_tokens=6"});
  EXPECT_EQ(Ids(batch, 0), Ids(first, 0));
  EXPECT_EQ(Ids(batch, 1), Ids(second, 0));
}

TEST_F(GenerateCliTest, AnEosIdOfGenerationConfigEndsTheReply) {
  const auto greedy = Generate(FinalDir().string(), {"--prompt=Hello", "--max_new_tokens=4"});
  const std::vector<int64_t> ids = Ids(greedy, 0);
  ASSERT_EQ(ids.size(), 4u);
  const fs::path dir = ModelDirCopy("with_generation_config");
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [5, )" << ids[2] << "]}";
  const auto stopped = Generate(dir.string(), {"--prompt=Hello", "--max_new_tokens=4"});
  EXPECT_EQ(Ids(stopped, 0), std::vector<int64_t>(ids.begin(), ids.begin() + 2));
  EXPECT_EQ(stopped["outputs"][0]["finish_reason"], "stop");
}

TEST_F(GenerateCliTest, SamplingIsReproducibleForOneSeed) {
  const std::vector<std::string> sampled = {"--prompt=Hello", "--max_new_tokens=12",
                                            "--temperature=5"};
  auto with_seed = [&](const std::string& seed) {
    std::vector<std::string> args = sampled;
    args.push_back("--seed=" + seed);
    return Ids(Generate(FinalDir().string(), args), 0);
  };
  EXPECT_EQ(with_seed("7"), with_seed("7"));
  EXPECT_NE(with_seed("7"), with_seed("8"));
  // Keeping only the most likely token is greedy decoding, whatever the temperature.
  const auto top1 = Generate(FinalDir().string(), {"--prompt=Hello", "--max_new_tokens=12",
                                                   "--temperature=5", "--top_k=1"});
  const auto greedy = Generate(FinalDir().string(), {"--prompt=Hello", "--max_new_tokens=12"});
  EXPECT_EQ(Ids(top1, 0), Ids(greedy, 0));
}

TEST_F(GenerateCliTest, InputFileLinesAreConversationsOrPrompts) {
  const fs::path input =
      tmp_->Write("prompts.jsonl",
                  "{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}"
                  "\n\n{\"prompt\": \"Hello\"}\n");
  const auto out =
      Generate(FinalDir().string(), {"--input=" + input.string(), "--max_new_tokens=3"});
  ASSERT_EQ(out["outputs"].size(), 2u);
  EXPECT_EQ(out["outputs"][0]["prompt_text"], out["outputs"][1]["prompt_text"]);
  EXPECT_EQ(Ids(out, 0), Ids(out, 1));
}

TEST_F(GenerateCliTest, BadInputIsRefusedByName) {
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string message;
  };
  const fs::path bad_line = tmp_->Write("bad.jsonl", "{\"prompt\": \"ok\"}\n[1, 2]\n");
  const fs::path no_template = ModelDirCopy("no_template");
  fs::remove(no_template / "tokenizer_config.json");
  const fs::path no_tokenizer = ModelDirCopy("no_tokenizer");
  fs::remove(no_tokenizer / "tokenizer.json");
  const fs::path gpt2 = ModelDirCopy("gpt2");
  {
    std::ifstream in(gpt2 / "config.json");
    std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::regex model_type("\"model_type\": *\"[a-z0-9_]+\"");
    ASSERT_TRUE(std::regex_search(config, model_type));
    std::ofstream(gpt2 / "config.json")
        << std::regex_replace(config, model_type, "\"model_type\": \"gpt2\"");
  }
  const std::string dir = FinalDir().string();
  const std::vector<Case> cases = {
      {{dir, "--prompt=x", "--max_new_tokens=0"}, 2, "--max_new_tokens must be a whole number"},
      {{dir, "--prompt=x", "--top_p=1.5"}, 2, "--top_p must be a number"},
      {{dir, "--prompt=x", "--format=xml"}, 2, "--format must be text or json"},
      {{dir}, 1, "no prompts (give --prompt or --input)"},
      {{dir, "--input=" + bad_line.string()}, 1, bad_line.string() + ":2: expected a JSON object"},
      {{dir, "--prompt=x", "--raw", "--system=s"}, 2, "--system needs the chat template"},
      {{pipeline_->string() + ":nope", "--prompt=x"}, 1, "the pipeline has no stage 'nope'"},
      {{no_template.string(), "--prompt=x"}, 1, "no chat template for"},
      {{no_template.string(), "--prompt=x"}, 1, "give --raw"},
      {{no_tokenizer.string(), "--prompt=x"}, 1, "has no tokenizer.json or tokenizer.model"},
      {{dir, "--prompt=x", "--max_new_tokens=5000"}, 1, "beyond the model's 2048 positions"},
      {{dir, "--prompt=x", "--dtype=f8"}, 1, "--dtype must be auto, float32"},
      {{pipeline_->string(), "--prompt=x", "--dtype=bfloat16"}, 1, "--dtype and --device are for"},
      {{(tmp_->path() / "missing").string(), "--prompt=x"}, 1, "neither a model directory nor"},
      {{gpt2.string(), "--prompt=x"},
       1,
       "no installed model loader reads model_type 'gpt2' (the installed ones read llama, mistral, "
       "qwen2, qwen2_5_vl, qwen2_vl, qwen3, qwen3_vl"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.begin(), "generate");
    const auto result = testing::RunEngine(args);
    EXPECT_EQ(result.exit_code, c.exit_code) << c.args[0] << " " << result.err;
    EXPECT_THAT(result.err, HasSubstr(c.message));
  }
}

TEST_F(GenerateCliTest, AQloraStageGeneratesFromItsFourBitWeightsAndAdapters) {
  const fs::path fixtures = fs::path(testing::kSourceDir) / "tests/fixtures";
  const fs::path pipeline = tmp_->Write("qlora.pbtxt", R"(name: "qlora"
output_dir: "qlora_out"
stage {
  name: "adapt"
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    hidden_size: 64 num_hidden_layers: 1 num_attention_heads: 4 } } }
  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] {
    target_modules: "model.layers.*" } } }
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] {
    r: 4 lora_alpha: 8 target_modules: "model.layers.*" } } }
  data { plugin: "chat" options { [type.googleapis.com/engine.plugins.ChatOptions] {
    path: ")" + (fixtures / "chat_data/conversations.jsonl").string() +
                                                           R"("
    eval_fraction: 0.4
    tokenizer { kind: HF_JSON path: ")" + (fixtures / "tokenizers/qwen2_bpe.json").string() +
                                                           R"("
                config: ")" + (fixtures / "chat_data/tokenizer_config.json").string() +
                                                           R"(" } } } }
  optimizer { learning_rate: 0.01 }
  schedule { max_steps: 2 batch_size: 2 }
}
)");
  const auto run = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = Generate(pipeline.string(), {"--prompt=Hello", "--max_new_tokens=4"});
  EXPECT_EQ(Ids(out, 0).size(), 4u);
  // Its final directory holds adapters on 4-bit weights: not a model directory, and the error
  // says how to generate from it.
  const fs::path final_dir = tmp_->path() / "qlora_out/adapt/final";
  const auto refused = testing::RunEngine({"generate", final_dir.string(), "--prompt=Hello"});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("is a checkpoint of stage 'adapt' with the"));
  EXPECT_THAT(refused.err,
              HasSubstr("engine generate PIPELINE.pbtxt:adapt --checkpoint " + final_dir.string()));
}

TEST_F(GenerateCliTest, ADamagedCheckpointIsRefusedBeforeGenerating) {
  const fs::path dir = tmp_->path() / "damaged";
  std::error_code removed;
  RemoveTree(dir, removed);
  fs::copy(FinalDir(), dir);
  {
    std::fstream file(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.write("\x7f\x7f\x7f\x7f", 4);
  }
  const auto result = testing::RunEngine({"generate", dir.string(), "--prompt=x"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("model.safetensors"));
}

}  // namespace
}  // namespace engine
