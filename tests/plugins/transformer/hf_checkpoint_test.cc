// Reading Hugging Face-layout model directories: the round trip, stored dtypes, shards, and the
// errors that name the tensor.
#include "hf_checkpoint.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <vector>

#include "engine/safetensors.h"
#include "llama_modules.h"
#include "testing/temp_dir.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

LlamaConfig TinyCheckpointConfig() {
  LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 32;
  return c;
}

class CheckpointLm : public torch::nn::Module {
 public:
  explicit CheckpointLm(const LlamaConfig& c) : lm(*this, c) {}
  CausalLm lm;
};

void WriteFile(const std::filesystem::path& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

safetensors::NamedTensors State(torch::nn::Module& module) {
  safetensors::NamedTensors out;
  for (const auto& p : module.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// Writes `module` as a model directory: config.json and model.safetensors.
void Save(torch::nn::Module& module, const LlamaConfig& config, const std::filesystem::path& dir,
          const std::string& dtype = "float32") {
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", config.ToJson(dtype).dump());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", State(module)).ok());
}

std::unique_ptr<CheckpointLm> Load(const std::filesystem::path& dir, Status* status) {
  auto json = ReadConfigJson(dir);
  if (!json.ok()) {
    *status = json.status();
    return nullptr;
  }
  auto config = ConfigFromJson(*json, "config.json");
  if (!config.ok()) {
    *status = config.status();
    return nullptr;
  }
  auto model = std::make_unique<CheckpointLm>(*config);
  std::set<std::string> optional;
  if (config->tie_word_embeddings) optional.insert("lm_head.weight");
  *status = LoadWeights(dir, *model, optional);
  return model;
}

TEST(HfCheckpointTest, RoundTripGivesIdenticalTensorsAndLogits) {
  testing::TempDir tmp;
  at::manual_seed(1);
  CheckpointLm original(TinyCheckpointConfig());
  InitializeWeights(original, 0.5);
  Save(original, TinyCheckpointConfig(), tmp.path() / "m");
  Status status;
  auto loaded = Load(tmp.path() / "m", &status);
  ASSERT_TRUE(status.ok()) << status.message();
  auto a = original.named_parameters();
  auto b = loaded->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) {
    ASSERT_NE(b.find(p.key()), nullptr) << p.key();
    EXPECT_TRUE(at::equal(p.value(), b[p.key()])) << p.key();
  }
  const at::Tensor ids = at::randint(0, 11, {2, 5}, at::kLong);
  auto logits = [&](CheckpointLm& m) {
    return m.lm.Logits(m.lm.model->forward(m.lm.model->Embed(ids), 0, nullptr));
  };
  EXPECT_TRUE(at::equal(logits(original), logits(*loaded)));
}

TEST(HfCheckpointTest, KeepsTheStoredDtype) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  original.to(at::kBFloat16);
  Save(original, TinyCheckpointConfig(), tmp.path() / "m", "bfloat16");
  Status status;
  auto loaded = Load(tmp.path() / "m", &status);
  ASSERT_TRUE(status.ok()) << status.message();
  for (const auto& p : loaded->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), at::kBFloat16) << p.key();
  }
}

TEST(HfCheckpointTest, ReadsShardsThroughTheIndex) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  InitializeWeights(original, 0.5);
  const auto dir = tmp.path() / "sharded";
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  auto state = State(original);
  const size_t half = state.size() / 2;
  safetensors::NamedTensors first(state.begin(), state.begin() + half);
  safetensors::NamedTensors second(state.begin() + half, state.end());
  ASSERT_TRUE(safetensors::Write(dir / "model-00001-of-00002.safetensors", first).ok());
  ASSERT_TRUE(safetensors::Write(dir / "model-00002-of-00002.safetensors", second).ok());
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : first)
    index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (const auto& [name, t] : second)
    index["weight_map"][name] = "model-00002-of-00002.safetensors";
  WriteFile(dir / "model.safetensors.index.json", index.dump());
  Status status;
  auto loaded = Load(dir, &status);
  ASSERT_TRUE(status.ok()) << status.message();
  for (const auto& p : original.named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), loaded->named_parameters()[p.key()])) << p.key();
  }
}

TEST(HfCheckpointTest, MissingTensorIsNamed) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  auto state = State(original);
  state.erase(std::remove_if(state.begin(), state.end(),
                             [](const auto& e) { return e.first == "model.norm.weight"; }),
              state.end());
  const auto dir = tmp.path() / "m";
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", state).ok());
  Status status;
  Load(dir, &status);
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("has no tensor 'model.norm.weight'"));
}

TEST(HfCheckpointTest, ShapeMismatchNamesTheTensorAndBothShapes) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  auto state = State(original);
  for (auto& [name, t] : state) {
    if (name == "model.layers.0.mlp.up_proj.weight") t = at::zeros({13, 8});
  }
  const auto dir = tmp.path() / "m";
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", state).ok());
  Status status;
  Load(dir, &status);
  EXPECT_THAT(status.message(),
              HasSubstr("tensor 'model.layers.0.mlp.up_proj.weight' has shape [13,8] but the "
                        "model expects [12,8]"));
}

TEST(HfCheckpointTest, AnIntegerTensorWhereTheModelHasWeightsIsRefusedByName) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  auto state = State(original);
  for (auto& [name, t] : state) {
    if (name == "model.norm.weight") t = at::ones({8}, at::kInt);
  }
  const auto dir = tmp.path() / "m";
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", state).ok());
  Status status;
  Load(dir, &status);
  EXPECT_THAT(status.message(), HasSubstr("tensor 'model.norm.weight' is stored as Int, but the "
                                          "model's is a floating-point tensor"));
}

TEST(HfCheckpointTest, TheLinearHookSeesEachLayerOnceWithItsWeightInPlace) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  const auto dir = tmp.path() / "m";
  Save(original, TinyCheckpointConfig(), dir, "bfloat16");
  std::map<std::string, at::Tensor> stored;
  for (const auto& [name, t] : State(original)) stored[name] = t.detach().clone();
  CheckpointLm loaded(TinyCheckpointConfig());
  std::vector<std::string> seen;
  ModelContext context;
  context.linear_loaded = [&](const std::string& name, LinearImpl& layer) -> Status {
    seen.push_back(name);
    EXPECT_TRUE(layer.weight.equal(stored.at(name + ".weight"))) << name;
    return Status::Ok();
  };
  const Status status = LoadWeights(dir, loaded, {}, &context);
  ASSERT_TRUE(status.ok()) << status.message();
  std::vector<std::string> linears;
  for (const auto& [name, layer] : NamedLinears(loaded)) linears.push_back(name);
  std::sort(seen.begin(), seen.end());
  std::sort(linears.begin(), linears.end());
  EXPECT_EQ(seen, linears);
  EXPECT_EQ(seen.size(), 8u);  // q, k, v, o, gate, up, down and lm_head

  // An error from the hook is the load's.
  CheckpointLm again(TinyCheckpointConfig());
  ModelContext failing;
  failing.linear_loaded = [](const std::string& name, LinearImpl&) {
    return InvalidArgumentError("no room for " + name);
  };
  const Status refused = LoadWeights(dir, again, {}, &failing);
  EXPECT_THAT(refused.message(), HasSubstr("no room for "));
}

TEST(HfCheckpointTest, ALoadTheHostCannotHoldIsRefusedBeforeItStartsCountingQuantizedLayers) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  const auto dir = tmp.path() / "m";
  Save(original, TinyCheckpointConfig(), dir);
  int64_t dense = 0, linear = 0;
  for (const auto& [name, t] : State(original)) {
    dense += t.numel() * 4;
    if (name.find("_proj.") != std::string::npos) linear += t.numel();
  }
  struct Available {
    explicit Available(int64_t bytes) {
      setenv("ENGINE_AVAILABLE_MEMORY", std::to_string(bytes).c_str(), 1);
    }
    ~Available() { unsetenv("ENGINE_AVAILABLE_MEMORY"); }
  };
  {
    // Less than the f32 tensors need: refused, naming the directory and both figures.
    Available available(dense - 1);
    CheckpointLm model(TinyCheckpointConfig());
    const Status status = LoadWeights(dir, model, {}, nullptr);
    EXPECT_THAT(status.message(), HasSubstr("'" + dir.string() + "': loading it needs about 1 MB"));
    EXPECT_THAT(status.message(), HasSubstr("and this machine has 1 MB available"));
  }
  {
    // Enough once the projections are counted at 4 bits.
    Available available(dense - linear * 4 + linear);
    CheckpointLm model(TinyCheckpointConfig());
    ModelContext context;
    context.quantizes = [](const std::string& name) {
      return name.find("_proj") != std::string::npos;
    };
    EXPECT_TRUE(LoadWeights(dir, model, {}, &context).ok());
    CheckpointLm dense_model(TinyCheckpointConfig());
    EXPECT_FALSE(LoadWeights(dir, dense_model, {}, nullptr).ok());
  }
}

TEST(HfCheckpointTest, UnknownTensorAndBadFilesAreErrors) {
  testing::TempDir tmp;
  CheckpointLm original(TinyCheckpointConfig());
  auto state = State(original);
  state.emplace_back("model.layers.7.mlp.up_proj.weight", at::zeros({2}));
  const auto dir = tmp.path() / "m";
  std::filesystem::create_directories(dir);
  WriteFile(dir / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", state).ok());
  Status status;
  Load(dir, &status);
  EXPECT_THAT(status.message(), HasSubstr("holds tensor 'model.layers.7.mlp.up_proj.weight', "
                                          "which this model does not have"));

  WriteFile(dir / "config.json", "{\"hidden_size\": 8,");
  Load(dir, &status);
  EXPECT_THAT(status.message(), HasSubstr("config.json' is not valid JSON"));

  const auto empty = tmp.path() / "empty";
  std::filesystem::create_directories(empty);
  WriteFile(empty / "config.json", TinyCheckpointConfig().ToJson("float32").dump());
  Load(empty, &status);
  EXPECT_THAT(status.message(),
              HasSubstr("holds neither model.safetensors nor model.safetensors.index.json"));
}

}  // namespace
}  // namespace engine::transformer
