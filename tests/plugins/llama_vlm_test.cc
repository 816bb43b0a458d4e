// The `llama` and `vlm` model loaders through the plugin interface: sizes from the data, pretrained
// directories, the image-first layout, generation-based exact match, and option errors.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <fstream>

#include "engine/model.h"
#include "engine/safetensors.h"
#include "plugins/plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

const ModelLoaderPlugin& Loader(const std::string& name) {
  return testing::BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader, name);
}

DataSpec TextSpec(int64_t vocab = 259, int64_t length = 6) {
  DataSpec spec;
  spec.fields = {{"input_ids", at::kLong, {length}, vocab}, {"labels", at::kLong, {length}, vocab}};
  spec.eos_id = vocab - 1;
  spec.pad_id = vocab - 3;
  return spec;
}

DataSpec CaptionSpec() {
  DataSpec spec = TextSpec(259, 6);
  spec.fields.push_back({"pixel_values", at::kFloat, {1, 8, 8}, 0});
  spec.fields.push_back({"answer_ids", at::kLong, {3}, 259});
  spec.fields.push_back({"prompt_length", at::kLong, {}, 0});
  return spec;
}

std::unique_ptr<Model> CreateLlamaVlm(const std::string& name, const std::string& options,
                                      const DataSpec& spec,
                                      const std::filesystem::path& dir = "/") {
  const auto& loader = Loader(name);
  auto message = testing::Options(loader, options);
  OptionErrors errors;
  loader.ValidateOptions(*message, &errors);
  EXPECT_TRUE(errors.empty()) << errors.entries()[0].field_path << ": "
                              << errors.entries()[0].message;
  auto model = loader.Create(*message, ModelContext{&spec, dir, 1});
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

void SaveDirectory(Model& model, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  safetensors::NamedTensors tensors;
  for (const auto& p : model.module().named_parameters()) tensors.emplace_back(p.key(), p.value());
  ASSERT_TRUE(safetensors::Write(dir / "model.safetensors", tensors).ok());
  std::ofstream(dir / "config.json") << model.config_json();
}

// The summed loss of `batch` (loss x loss_count) and the gradient of that sum, flattened.
std::pair<double, at::Tensor> SummedLossAndGradient(Model& model, const Batch& batch) {
  model.module().zero_grad();
  auto out = model.Forward(batch);
  EXPECT_TRUE(out.ok()) << out.status().message();
  EXPECT_GT(LossCountOf(*out), 0);
  const at::Tensor summed = out->loss * static_cast<double>(LossCountOf(*out));
  summed.backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : model.module().parameters()) grads.push_back(p.grad().flatten().clone());
  return {summed.item<double>(), at::cat(grads)};
}

TEST(LlamaLoaderTest, APaddedBatchTrainsAsItsRowsOneByOne) {
  // Row 0 unpadded, row 1 padded on the right, row 2 on the left: the batch's summed loss and its
  // gradient equal those of the rows run alone, unpadded.
  const DataSpec spec = TextSpec(40, 7);
  auto model =
      CreateLlamaVlm("llama", "hidden_size: 16 num_hidden_layers: 2 num_attention_heads: 2", spec);
  ASSERT_NE(model, nullptr);
  const std::vector<std::vector<int64_t>> rows = {
      {5, 9, 2, 7, 7, 3, 1}, {4, 8, 15, 16}, {23, 4, 2}};
  at::Tensor ids = at::full({3, 7}, 0, at::kLong), mask = at::zeros({3, 7}, at::kLong);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t n = static_cast<int64_t>(rows[r].size());
    const int64_t start = r == 2 ? 7 - n : 0;  // left padding for row 2
    ids[r].narrow(0, start, n).copy_(at::tensor(rows[r], at::kLong));
    mask[r].narrow(0, start, n).fill_(1);
  }
  const auto [batch_loss, batch_grad] =
      SummedLossAndGradient(*model, {{"input_ids", ids}, {"attention_mask", mask}});
  double loss = 0;
  at::Tensor grad;
  for (const auto& row : rows) {
    const auto [l, g] =
        SummedLossAndGradient(*model, {{"input_ids", at::tensor(row, at::kLong).view({1, -1})}});
    loss += l;
    grad = grad.defined() ? grad + g : g;
  }
  EXPECT_NEAR(batch_loss, loss, 1e-4 * loss);
  EXPECT_TRUE(at::allclose(batch_grad, grad, 1e-4, 1e-6))
      << (batch_grad - grad).abs().max().item<double>();
}

TEST(LlamaLoaderTest, SizesFromDataAndRoundTripThroughItsOwnDirectory) {
  const DataSpec spec = TextSpec();
  auto model =
      CreateLlamaVlm("llama", "hidden_size: 16 num_hidden_layers: 1 num_attention_heads: 2", spec);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->architecture(), "llama");
  auto params = model->module().named_parameters();
  EXPECT_EQ(params["model.embed_tokens.weight"].sizes(), (std::vector<int64_t>{259, 16}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), (std::vector<int64_t>{259, 16}));
  EXPECT_THAT(model->config_json(), HasSubstr("\"model_type\": \"llama\""));

  testing::TempDir tmp;
  SaveDirectory(*model, tmp.path() / "saved");
  auto loaded = CreateLlamaVlm("llama", "pretrained: \"saved\"", spec, tmp.path());
  ASSERT_NE(loaded, nullptr);
  auto again = loaded->module().named_parameters();
  ASSERT_EQ(again.size(), params.size());
  for (const auto& p : params) EXPECT_TRUE(at::equal(p.value(), again[p.key()])) << p.key();

  model->module().eval();
  loaded->module().eval();
  Batch batch{{"input_ids", at::randint(0, 259, {3, 6}, at::kLong)}};
  batch["labels"] = batch["input_ids"];
  auto a = model->Forward(batch);
  auto b = loaded->Forward(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(a->loss, b->loss));
  EXPECT_EQ(LossCountOf(*a), 3 * 5);
  EXPECT_TRUE(a->metrics.at("perplexity").exp_of_mean);
  EXPECT_NEAR(a->metrics.at("perplexity").value(), std::exp(a->loss.item<double>()), 1e-3);
}

TEST(LlamaLoaderTest, ErrorsNameTheProblem) {
  // The data's tokens do not fit a pretrained model's vocabulary.
  testing::TempDir tmp;
  auto small = CreateLlamaVlm("llama", "hidden_size: 8 num_hidden_layers: 1 num_attention_heads: 2",
                              TextSpec(20));
  SaveDirectory(*small, tmp.path() / "small");
  const auto& loader = Loader("llama");
  const DataSpec spec = TextSpec(259);
  auto model = loader.Create(*testing::Options(loader, "pretrained: \"small\""),
                             ModelContext{&spec, tmp.path(), 1});
  EXPECT_THAT(model.status().message(),
              HasSubstr("the data's 'input_ids' has 259 token ids but the model's vocabulary has "
                        "20"));
  // Sizes next to `pretrained` are refused by name.
  OptionErrors errors;
  loader.ValidateOptions(*testing::Options(loader, "pretrained: \"small\" hidden_size: 64"),
                         &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "hidden_size");
  errors = OptionErrors();
  loader.ValidateOptions(*testing::Options(loader, "hidden_size: 30 num_attention_heads: 4"),
                         &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_THAT(errors.entries()[0].message, HasSubstr("multiple of num_attention_heads"));
  // A missing directory names it.
  auto missing = loader.Create(*testing::Options(loader, "pretrained: \"nowhere\""),
                               ModelContext{&spec, tmp.path(), 1});
  EXPECT_THAT(missing.status().message(), HasSubstr("nowhere/config.json"));
}

TEST(VlmLoaderTest, NamesImageFirstLayoutAndExactMatch) {
  const DataSpec spec = CaptionSpec();
  auto model =
      CreateLlamaVlm("vlm",
                     "vision { patch_size: 4 hidden_size: 16 num_layers: 1 num_heads: 2 } "
                     "decoder { hidden_size: 16 num_hidden_layers: 1 num_attention_heads: 2 }",
                     spec);
  ASSERT_NE(model, nullptr);
  std::set<std::string> prefixes;
  for (const auto& p : model->module().named_parameters()) {
    prefixes.insert(p.key().substr(0, p.key().find('.')));
  }
  EXPECT_EQ(prefixes, (std::set<std::string>{"lm_head", "model", "projector", "visual"}));
  EXPECT_NE(model->module().named_parameters().find("visual.blocks.0.attn.qkv.weight"), nullptr);
  EXPECT_NE(model->module().named_parameters().find("projector.linear_2.weight"), nullptr);

  at::manual_seed(2);
  Batch batch{{"pixel_values", at::rand({4, 1, 8, 8})},
              {"input_ids", at::randint(0, 256, {4, 6}, at::kLong)},
              {"prompt_length", at::full({4}, 3, at::kLong)},
              {"answer_ids", at::randint(0, 256, {4, 3}, at::kLong)}};
  batch["labels"] = batch["input_ids"].clone();
  batch["labels"].narrow(1, 0, 3).fill_(-100);
  model->module().eval();
  auto out = model->Forward(batch);
  ASSERT_TRUE(out.ok()) << out.status().message();
  // Only the labelled text tokens count; image positions never do.
  EXPECT_EQ(LossCountOf(*out), 4 * 3);
  ASSERT_EQ(out->metrics.count("exact_match"), 1u);
  EXPECT_EQ(out->metrics.at("exact_match").count, 4);
  // The image reaches the text: other pixels, another loss.
  Batch other = batch;
  other["pixel_values"] = at::rand({4, 1, 8, 8});
  EXPECT_FALSE(at::equal(model->Forward(other)->loss, out->loss));

  // A whole vlm directory round-trips through `pretrained`.
  testing::TempDir tmp;
  SaveDirectory(*model, tmp.path() / "vlm");
  auto loaded = CreateLlamaVlm("vlm", "pretrained: \"vlm\"", spec, tmp.path());
  ASSERT_NE(loaded, nullptr);
  loaded->module().eval();
  EXPECT_TRUE(at::equal(loaded->Forward(batch)->loss, out->loss));
}

TEST(VlmLoaderTest, DecoderFromALanguageModelDirectory) {
  const DataSpec spec = CaptionSpec();
  auto lm = CreateLlamaVlm("llama", "hidden_size: 16 num_hidden_layers: 1 num_attention_heads: 2",
                           TextSpec(259));
  testing::TempDir tmp;
  SaveDirectory(*lm, tmp.path() / "lm");
  auto vlm = CreateLlamaVlm(
      "vlm", "vision { hidden_size: 16 num_heads: 2 } decoder { pretrained: \"lm\" }", spec,
      tmp.path());
  ASSERT_NE(vlm, nullptr);
  auto from = lm->module().named_parameters();
  auto to = vlm->module().named_parameters();
  for (const auto& p : from) EXPECT_TRUE(at::equal(p.value(), to[p.key()])) << p.key();
}

TEST(VlmLoaderTest, NeedsImages) {
  const auto& loader = Loader("vlm");
  const DataSpec spec = TextSpec();
  auto model = loader.Create(*testing::Options(loader, ""), ModelContext{&spec, "/", 1});
  EXPECT_THAT(model.status().message(), HasSubstr("vlm needs a float field 'pixel_values'"));
}

}  // namespace
}  // namespace engine
