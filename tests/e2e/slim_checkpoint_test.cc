// Slim checkpoints as a user meets them: a QLoRA stage on a Hugging Face model directory, and a
// stage that starts from it, write only the adapters they train, with the 4-bit base named by the
// directory's content hashes. Training the same pipeline with self-contained checkpoints gives the
// same tensors bit for bit (the child rebuilt its parent's base exactly), a slim stage killed
// mid-way resumes to the same end, and a base that changed since is named before anything uses it:
// `engine eval` refuses, `engine run` trains the stage again, and the slim directory is no model
// directory for `engine export`. A base moved elsewhere is found by its content (--base_path,
// $ENGINE_BASE_PATH), and every command reads the stage on it as before.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/safetensors.h"
#include "testing/hub_model.h"
#include "testing/pipelines.h"
#include "testing/same_file.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class SlimCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    models_ = new testing::TempDir();
    model_ = new fs::path(testing::MakeHubModel(*models_));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete models_;
  }

  // "domain" (nf4 + LoRA on the model directory, a checkpoint every 2 steps) and "chat" starting
  // from it; `domain_extra` and `chat_extra` go into the stages.
  static std::string Pipeline(const std::string& header = "", const std::string& domain_extra = "",
                              const std::string& chat_extra = "") {
    const std::string model = R"(
  model { plugin: "llama" options { [type.googleapis.com/engine.transformer.LlamaOptions] {
    pretrained: ")" + model_->string() +
                              R"(" } } })";
    const std::string rest = R"(
  adapter { plugin: "lora" options { [type.googleapis.com/engine.plugins.LoraOptions] {
    r: 4 lora_alpha: 8 target_modules: "model.layers.*" } } }
  data { plugin: "text" options { [type.googleapis.com/engine.plugins.TextOptions] {
    path: ")" + testing::FortunesDataPath().string() +
                             R"(" document_separator: "%"
    sequence_length: 32 max_documents: 200 eval_fraction: 0.1 } } }
  optimizer { learning_rate: 0.01 }
)";
    return "name: \"slim\"\noutput_dir: \"out\"\nplugin_path: \"" +
           std::string(testing::kTestPluginDir) + "/signal_callback\"\n" + header +
           "stage { name: \"domain\"" + model + kNf4 + rest +
           "  schedule { max_steps: 5 batch_size: 4 checkpoint_every_steps: 2 }\n" + domain_extra +
           "}\nstage { name: \"chat\" from_stage: \"domain\"" + model + kNf4 + rest +
           "  schedule { max_steps: 3 batch_size: 4 }\n" + chat_extra + "}\n";
  }

  // Pipeline() on the model directory `model` instead of the shared one.
  static std::string PipelineOn(const fs::path& model) {
    std::string text = Pipeline();
    for (size_t at = text.find(model_->string()); at != std::string::npos;
         at = text.find(model_->string(), at + 1)) {
      text.replace(at, model_->string().size(), model.string());
    }
    return text;
  }

  static constexpr const char* kNf4 = R"(
  quantizer { plugin: "nf4" options { [type.googleapis.com/engine.plugins.Nf4Options] {
    target_modules: "model.layers.*" } } })";

  static testing::TempDir* models_;
  static fs::path* model_;
};

uintmax_t DirectoryBytes(const fs::path& dir) {
  uintmax_t bytes = 0;
  for (const auto& file : fs::directory_iterator(dir)) bytes += file.file_size();
  return bytes;
}

// Writes the weights of `from` to `to` (which may be the same file) with model.norm.weight doubled:
// the same names and sizes, other contents. Whether it could.
bool WriteWithNormDoubled(const fs::path& from, const fs::path& to) {
  safetensors::NamedTensors tensors;
  {
    auto file = safetensors::File::Open(from);
    if (!file.ok()) return false;
    auto all = (*file)->GetAll();
    if (!all.ok()) return false;
    for (auto& [name, tensor] : *all) {
      // Cloned, so that nothing maps `from` once it is rewritten.
      tensors.emplace_back(name,
                           name == "model.norm.weight" ? tensor.clone().mul_(2) : tensor.clone());
    }
  }
  return safetensors::Write(to, tensors, {{"format", "pt"}}).ok();
}

testing::TempDir* SlimCheckpointTest::models_ = nullptr;
fs::path* SlimCheckpointTest::model_ = nullptr;

TEST_F(SlimCheckpointTest, SlimAndSelfContainedCheckpointsTrainTheSameTensors) {
  testing::TempDir slim_dir, whole_dir;
  const fs::path slim = slim_dir.Write("p.pbtxt", Pipeline());
  const fs::path whole =
      whole_dir.Write("p.pbtxt", Pipeline("", "  checkpoint { self_contained: true }\n"));

  const auto slim_check = testing::RunEngine({"check", slim.string()});
  ASSERT_EQ(slim_check.exit_code, 0) << slim_check.err;
  EXPECT_THAT(slim_check.out, HasSubstr("holds only what it changes; the frozen base is rebuilt "
                                        "from " +
                                        model_->string()));
  const auto whole_check = testing::RunEngine({"check", whole.string()});
  ASSERT_EQ(whole_check.exit_code, 0) << whole_check.err;
  EXPECT_THAT(whole_check.out, HasSubstr("holds every tensor: checkpoint.self_contained is set"));
  EXPECT_THAT(whole_check.out,
              HasSubstr("holds every tensor: it starts from stage 'domain', whose checkpoints "
                        "hold every tensor"));

  for (const fs::path& pipeline : {slim, whole}) {
    const auto run = testing::RunEngine({"run", pipeline.string()});
    ASSERT_EQ(run.exit_code, 0) << run.err;
  }
  for (const char* stage : {"domain", "chat"}) {
    const fs::path slim_final = slim_dir.path() / "out" / stage / "final";
    const fs::path whole_final = whole_dir.path() / "out" / stage / "final";
    // Only the adapters train (2 layers x 7 projections x A, B), and the slim checkpoint stores
    // them once, in the PEFT file: bit for bit the self-contained run's.
    auto slim_weights = safetensors::File::Open(slim_final / "model.safetensors");
    auto whole_weights = safetensors::File::Open(whole_final / "model.safetensors");
    auto adapters = safetensors::File::Open(slim_final / "adapter_model.safetensors");
    ASSERT_TRUE(slim_weights.ok() && whole_weights.ok() && adapters.ok());
    EXPECT_TRUE((*slim_weights)->tensors().empty()) << stage;
    ASSERT_EQ((*adapters)->tensors().size(), 28u) << stage;
    testing::ExpectSameSafetensors(whole_final / "adapter_model.safetensors",
                                   slim_final / "adapter_model.safetensors");
    for (const auto& info : (*adapters)->tensors()) {
      const std::string name = info.name.substr(std::string("base_model.model.").size());
      auto whole_tensor = (*whole_weights)->Get(name);
      ASSERT_TRUE(whole_tensor.ok()) << name;
      EXPECT_TRUE((*adapters)->Get(info.name)->equal(*whole_tensor)) << stage << " " << name;
    }
    EXPECT_LT(DirectoryBytes(slim_final) * 4, DirectoryBytes(whole_final)) << stage;
    const std::string manifest = testing::ReadText(slim_final / "manifest.pbtxt");
    // Version 2: an engine that reads only self-contained checkpoints refuses it by its version.
    EXPECT_THAT(manifest, HasSubstr("format_version: 2\n"));
    EXPECT_THAT(testing::ReadText(whole_final / "manifest.pbtxt"),
                HasSubstr("format_version: 1\n"));
    EXPECT_THAT(manifest, HasSubstr("frozen_base {\n  pretrained: \"" + model_->string() + "\""));
    EXPECT_THAT(manifest, HasSubstr("name: \"model.safetensors\""));
    EXPECT_THAT(manifest, HasSubstr("recipe: \"model: llama@"));
    EXPECT_THAT(manifest, HasSubstr("quantizer: nf4@"));
    // The 4-bit codes and the dense embedding are the base's.
    EXPECT_THAT(manifest, HasSubstr("name: \"model.layers.1.self_attn.q_proj.weight\"\n    dtype: "
                                    "\"U8\""));
    EXPECT_THAT(manifest, HasSubstr("name: \"model.embed_tokens.weight\"\n    dtype: \"F32\""));
    EXPECT_THAT(manifest,
                HasSubstr("adapter_file_tensor: \"model.layers.1.mlp.up_proj.lora_A.weight\""));
    EXPECT_THAT(testing::ReadText(whole_final / "manifest.pbtxt"), Not(HasSubstr("frozen_base")));
  }

  // The slim stage evaluates and exports as the self-contained one does.
  const auto slim_eval =
      testing::RunEngine({"eval", slim.string(), "--stage=chat", "--format=json"});
  const auto whole_eval =
      testing::RunEngine({"eval", whole.string(), "--stage=chat", "--format=json"});
  ASSERT_EQ(slim_eval.exit_code, 0) << slim_eval.err;
  ASSERT_EQ(whole_eval.exit_code, 0) << whole_eval.err;
  EXPECT_EQ(nlohmann::json::parse(slim_eval.out)["metrics"],
            nlohmann::json::parse(whole_eval.out)["metrics"]);
  for (const auto& [pipeline, dir] :
       {std::pair{slim, slim_dir.path()}, {whole, whole_dir.path()}}) {
    const auto exported = testing::RunEngine(
        {"export", pipeline.string() + ":chat", "--to=" + (dir / "hf").string(), "--format=hf"});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
  }
  testing::ExpectSameSafetensors(whole_dir.path() / "hf/model.safetensors",
                                 slim_dir.path() / "hf/model.safetensors");
}

TEST_F(SlimCheckpointTest, AKilledSlimStageResumesToTheUninterruptedEnd) {
  testing::TempDir reference, killed;
  const fs::path reference_pipeline = reference.Write("p.pbtxt", Pipeline());
  ASSERT_EQ(testing::RunEngine({"run", reference_pipeline.string()}).exit_code, 0);

  const fs::path pipeline =
      killed.Write("p.pbtxt", Pipeline(testing::SignalAt("domain", 3, "KILL")));
  const auto first = testing::RunEngine({"run", pipeline.string()});
  ASSERT_NE(first.exit_code, 0);
  ASSERT_TRUE(fs::exists(killed.path() / "out/domain/checkpoints/step-00000002/manifest.pbtxt"));
  // The periodic checkpoint is slim too.
  EXPECT_THAT(
      testing::ReadText(killed.path() / "out/domain/checkpoints/step-00000002/manifest.pbtxt"),
      HasSubstr("frozen_base {"));
  const fs::path resumable = killed.Write("p.pbtxt", Pipeline());
  const auto second = testing::RunEngine({"run", resumable.string()});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_THAT(second.out + second.err, HasSubstr("step-00000002"));
  for (const char* stage : {"domain", "chat"}) {
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      testing::ExpectSameSafetensors(reference.path() / "out" / stage / "final" / file,
                                     killed.path() / "out" / stage / "final" / file);
    }
  }
}

TEST_F(SlimCheckpointTest, ABaseThatChangedSinceIsNamedAndItsStageTrainsAgain) {
  testing::TempDir tmp;
  const fs::path model = tmp.path() / "model";
  fs::copy(*model_, model);
  const fs::path pipeline = tmp.Write("p.pbtxt", PipelineOn(model));
  ASSERT_EQ(testing::RunEngine({"run", pipeline.string()}).exit_code, 0);

  // The slim directory is not a model directory.
  const auto exported = testing::RunEngine({"export", (tmp.path() / "out/domain/final").string(),
                                            "--to=" + (tmp.path() / "hf").string(), "--format=hf"});
  EXPECT_NE(exported.exit_code, 0);
  EXPECT_THAT(exported.err,
              HasSubstr("holds only what it changed over the base in '" + model.string() + "'"));
  EXPECT_THAT(exported.err, HasSubstr("PIPELINE.pbtxt:domain"));
  EXPECT_FALSE(fs::exists(tmp.path() / "hf"));

  // One weight of the base changes in place (same size).
  ASSERT_TRUE(WriteWithNormDoubled(model / "model.safetensors", model / "model.safetensors"));
  const auto eval = testing::RunEngine({"eval", pipeline.string(), "--stage=chat"});
  EXPECT_NE(eval.exit_code, 0);
  EXPECT_THAT(eval.err, HasSubstr("the frozen base it was trained on changed (`engine run` "
                                  "trains the stage again): " +
                                  (model / "model.safetensors").string()));

  const auto generated = testing::RunEngine(
      {"generate", pipeline.string() + ":chat", "--prompt=A diva who", "--max_new_tokens=2"});
  EXPECT_NE(generated.exit_code, 0);
  EXPECT_THAT(generated.err, HasSubstr((model / "model.safetensors").string()));
  EXPECT_THAT(generated.err, HasSubstr("`engine run`"));

  const auto rerun = testing::RunEngine({"run", pipeline.string()});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.err;
  EXPECT_THAT(rerun.out + rerun.err, HasSubstr((model / "model.safetensors").string()));
  const auto after = testing::RunEngine({"eval", pipeline.string(), "--stage=chat"});
  EXPECT_EQ(after.exit_code, 0) << after.err;
}

TEST_F(SlimCheckpointTest, ABaseMovedElsewhereIsFoundByItsContentAndEveryCommandReadsItAsBefore) {
  testing::TempDir tmp;
  const fs::path model = tmp.path() / "model";
  fs::copy(*model_, model);
  const fs::path pipeline = tmp.Write("p.pbtxt", PipelineOn(model));
  ASSERT_EQ(testing::RunEngine({"run", pipeline.string()}).exit_code, 0);
  const std::vector<std::string> eval = {"eval", pipeline.string(), "--stage=chat",
                                         "--format=json"};
  const std::vector<std::string> generate = {"generate", pipeline.string() + ":chat",
                                             "--prompt=A diva who", "--max_new_tokens=4", "--raw"};
  const auto evaluated = testing::RunEngine(eval);
  ASSERT_EQ(evaluated.exit_code, 0) << evaluated.err;
  const auto generated = testing::RunEngine(generate);
  ASSERT_EQ(generated.exit_code, 0) << generated.err;
  auto manifest = ReadManifest(tmp.path() / "out/chat/final");
  ASSERT_TRUE(manifest.ok());
  std::string weights_hash;
  for (const auto& file : manifest->frozen_base().file()) {
    if (file.name() == "model.safetensors") weights_hash = file.xxh3();
  }
  ASSERT_FALSE(weights_hash.empty());

  // The base moves two levels down a shelf, behind a directory of the same file names and sizes
  // whose weights differ (found first in name order, so the search must compare contents).
  const fs::path shelf = tmp.path() / "shelf";
  const fs::path moved = shelf / "hub/tiny";
  fs::create_directories(shelf / "hub");
  fs::rename(model, moved);
  fs::copy(moved, shelf / "hub/a_lookalike");
  ASSERT_TRUE(WriteWithNormDoubled(moved / "model.safetensors",
                                   shelf / "hub/a_lookalike/model.safetensors"));

  // Not found: the error names the stage, the weights' hash and where it looked.
  const auto lost = testing::RunEngine(eval);
  EXPECT_EQ(lost.exit_code, 1);
  EXPECT_THAT(lost.err, HasSubstr("stage 'chat': its slim checkpoint's base is not in '" +
                                  model.string() + "'"));
  EXPECT_THAT(lost.err, HasSubstr("model.safetensors (xxh3 " + weights_hash));
  EXPECT_THAT(lost.err, HasSubstr("--base_path"));
  const auto lost_elsewhere = testing::RunEngine(
      {"eval", pipeline.string(), "--stage=chat", "--base_path=" + (tmp.path() / "out").string()});
  EXPECT_EQ(lost_elsewhere.exit_code, 1);
  EXPECT_THAT(lost_elsewhere.err, HasSubstr("looked in '" + (tmp.path() / "out").string() + "'"));

  // Found by --base_path: the same metrics, the same reply, the same export.
  std::vector<std::string> eval_found = eval;
  eval_found.push_back("--base_path=" + shelf.string());
  const auto found = testing::RunEngine(eval_found);
  ASSERT_EQ(found.exit_code, 0) << found.err;
  EXPECT_EQ(found.out, evaluated.out);
  EXPECT_THAT(found.err, HasSubstr("stage 'domain': its base is no longer in '" + model.string() +
                                   "'; found by its content in '" + moved.string() + "'"));
  std::vector<std::string> generate_found = generate;
  generate_found.push_back("--base_path=" + shelf.string());
  const auto regenerated = testing::RunEngine(generate_found);
  ASSERT_EQ(regenerated.exit_code, 0) << regenerated.err;
  EXPECT_EQ(regenerated.out, generated.out);
  const auto exported =
      testing::RunEngine({"export", pipeline.string() + ":chat", "--format=hf",
                          "--to=" + (tmp.path() / "hf").string(), "--base_path=" + shelf.string()});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(fs::exists(tmp.path() / "hf/model.safetensors"));

  // $ENGINE_BASE_PATH: `engine run` finds both stages up to date on the moved base.
  const auto rerun =
      testing::RunEngine({"run", pipeline.string()}, "", {{"ENGINE_BASE_PATH", shelf.string()}});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.err;
  EXPECT_THAT(rerun.out, HasSubstr("stage 'domain': up to date"));
  EXPECT_THAT(rerun.out, HasSubstr("stage 'chat': up to date"));

  // A pipeline that now names another base is the user's choice: its stages train again on it, even
  // with the old base on the search path. (The other base is the lookalike saved as one shard with
  // an index, so that it lacks the recorded file names, as a base that is gone does.)
  const fs::path sharded = tmp.path() / "sharded";
  fs::copy(shelf / "hub/a_lookalike", sharded);
  fs::rename(sharded / "model.safetensors", sharded / "model-00001-of-00001.safetensors");
  {
    auto file = safetensors::File::Open(sharded / "model-00001-of-00001.safetensors");
    ASSERT_TRUE(file.ok());
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    for (const auto& info : (*file)->tensors()) {
      index["weight_map"][info.name] = "model-00001-of-00001.safetensors";
    }
    tmp.Write("sharded/model.safetensors.index.json", index.dump());
  }
  tmp.Write("p.pbtxt", PipelineOn(sharded));
  const auto renamed =
      testing::RunEngine({"run", pipeline.string()}, "", {{"ENGINE_BASE_PATH", shelf.string()}});
  ASSERT_EQ(renamed.exit_code, 0) << renamed.err;
  EXPECT_THAT(renamed.err, Not(HasSubstr("found by its content")));
  EXPECT_THAT(renamed.out, HasSubstr("stage 'domain': 5 steps"));
}

TEST_F(SlimCheckpointTest, AParentWhoseChildBuildsAnotherBaseKeepsEveryTensor) {
  testing::TempDir tmp;
  const fs::path pipeline = tmp.Write("p.pbtxt", Pipeline("", "", "  seed: 11\n"));
  const auto check = testing::RunEngine({"check", pipeline.string()});
  ASSERT_EQ(check.exit_code, 0) << check.err;
  EXPECT_THAT(check.out,
              HasSubstr("holds every tensor: stage 'chat' builds its base another way (its "
                        "model, quantizer, precision or seed differ), so it starts from the "
                        "whole model"));
  EXPECT_THAT(check.out, Not(HasSubstr("holds only what it changes")));
}

}  // namespace
}  // namespace engine
