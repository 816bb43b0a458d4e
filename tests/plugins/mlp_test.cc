#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "plugin_test_util.h"

namespace engine {
namespace {

using testing::BuiltinPlugin;
using ::testing::HasSubstr;
using testing::Options;

const ModelLoaderPlugin& Mlp() {
  return BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader, "mlp");
}

DataSpec DigitsSpec() {
  DataSpec spec;
  spec.fields = {{"features", at::kFloat, {8, 8}, 0}, {"labels", at::kLong, {}, 10}};
  return spec;
}

StatusOr<std::unique_ptr<Model>> CreateMlp(const std::string& options, const DataSpec& spec) {
  return Mlp().Create(*Options(Mlp(), options), ModelContext{&spec, "/", 0});
}

TEST(MlpTest, LayersAreSizedFromTheData) {
  DataSpec spec = DigitsSpec();
  auto model = CreateMlp("hidden_units: 32 hidden_units: 16", spec);
  ASSERT_TRUE(model.ok()) << model.status().message();
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : (*model)->module().named_parameters()) {
    names.push_back(p.key());
    shapes.push_back(p.value().sizes().vec());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight",
                                             "layers.1.bias", "head.weight", "head.bias"}));
  EXPECT_EQ(shapes[0], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes[4], (std::vector<int64_t>{10, 16}));
  auto config = nlohmann::json::parse((*model)->config_json());
  EXPECT_EQ(config["input_dim"], 64);
  EXPECT_EQ(config["num_classes"], 10);
  EXPECT_EQ((*model)->architecture(), "mlp");
}

TEST(MlpTest, DefaultIsOneHiddenLayerOf128) {
  DataSpec spec = DigitsSpec();
  auto model = CreateMlp("", spec);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->module().named_parameters()["layers.0.weight"].size(0), 128);
  EXPECT_EQ((*model)->module().named_parameters().size(), 4u);
}

TEST(MlpTest, ForwardGivesLossAndAccuracy) {
  DataSpec spec = DigitsSpec();
  auto model = CreateMlp("hidden_units: 16 activation: TANH dropout: 0.5", spec);
  ASSERT_TRUE(model.ok());
  (*model)->module().eval();
  Batch batch = {{"features", at::randn({6, 64})},
                 {"labels", at::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 5}, at::kLong)}};
  auto out = (*model)->Forward(batch);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->loss.dim(), 0);
  EXPECT_EQ(LossCountOf(*out), 6);
  // A fresh classifier over 10 classes is close to uniform: loss near log(10).
  EXPECT_NEAR(out->loss.item<double>(), std::log(10.0), 1.0);
  EXPECT_EQ(out->metrics.at("accuracy").count, 6);
  EXPECT_LE(out->metrics.at("accuracy").sum, 6);
  out->loss.backward();
  for (const auto& p : (*model)->module().parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_FALSE((*model)->Forward({{"features", at::randn({2, 64})}}).ok());  // labels missing
}

TEST(MlpTest, RefusesDataItCannotUse) {
  DataSpec text;
  text.fields = {{"tokens", at::kLong, {-1}, 0}};
  auto model = CreateMlp("", text);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(),
              HasSubstr("mlp needs a float field 'features' from the data loader, which "
                        "provides: tokens i64[?]"));
  DataSpec no_classes;
  no_classes.fields = {{"features", at::kFloat, {4}, 0}, {"labels", at::kLong, {}, 0}};
  EXPECT_THAT(CreateMlp("", no_classes).status().message(),
              HasSubstr("integer class-label field 'labels'"));
}

TEST(MlpTest, OptionValidation) {
  OptionErrors errors;
  Mlp().ValidateOptions(*Options(Mlp(), "hidden_units: 4 hidden_units: 0 dropout: -0.5"), &errors);
  ASSERT_EQ(errors.entries().size(), 2u);
  EXPECT_EQ(errors.entries()[0].field_path, "hidden_units[1]");
  EXPECT_EQ(errors.entries()[1].field_path, "dropout");
  EXPECT_EQ(errors.entries()[1].message, "must be in [0, 1) (got -0.5)");
}

}  // namespace
}  // namespace engine
