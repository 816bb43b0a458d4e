#include "precision/census.h"

#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

namespace engine {
namespace {

TEST(CensusTest, ModuleGroups) {
  EXPECT_EQ(ModuleGroupOf("model.layers.3.mlp.up_proj.weight"), "model.layers");
  EXPECT_EQ(ModuleGroupOf("model.embed_tokens.weight"), "model.embed_tokens");
  EXPECT_EQ(ModuleGroupOf("model.norm.weight"), "model.norm");
  EXPECT_EQ(ModuleGroupOf("visual.blocks.0.attn.qkv.weight"), "visual");
  EXPECT_EQ(ModuleGroupOf("lm_head.weight"), "lm_head");
  EXPECT_EQ(ModuleGroupOf("layers.0.bias"), "layers");
  EXPECT_EQ(ModuleGroupOf("scale"), "scale");
  EXPECT_EQ(ModuleGroupOf("model.scale"), "model");
}

// F1's mechanism: the census reads the tensors, whatever anything claims.
TEST(CensusTest, ReadsTheRealDtypes) {
  torch::nn::Module module;
  module.register_parameter("a", at::ones({4, 2}, at::kBFloat16));
  module.register_parameter("b", at::ones({3}, at::kFloat), /*requires_grad=*/false);
  module.register_buffer("steps", at::ones({1}, at::kLong));
  ParameterCensus census = TakeCensus(module);
  ASSERT_EQ(census.size(), 3u);
  EXPECT_EQ(census[0].name, "a");
  EXPECT_EQ(census[0].dtype, at::kBFloat16);
  EXPECT_EQ(census[0].bytes(), 16);
  EXPECT_TRUE(census[0].trainable);
  EXPECT_FALSE(census[1].trainable);
  EXPECT_TRUE(census[2].is_buffer);
  EXPECT_EQ(census[2].dtype, at::kLong);

  auto rows = SummarizeCensus(census);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].role, "trainable");
  EXPECT_EQ(rows[1].role, "frozen");
  EXPECT_EQ(rows[2].role, "buffer");
  EXPECT_EQ(rows[2].bytes, 8);
}

TEST(CensusTest, RowsSumByGroupRoleAndDtype) {
  ParameterCensus census = {
      {"model.layers.0.w", "model.layers", at::kBFloat16, 10, true, false},
      {"model.layers.1.w", "model.layers", at::kBFloat16, 10, true, false},
      {"model.layers.1.n", "model.layers", at::kFloat, 2, true, false},
      {"lm_head.weight", "lm_head", at::kBFloat16, 5, false, false},
  };
  auto rows = SummarizeCensus(census);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].tensors, 2);
  EXPECT_EQ(rows[0].elements, 20);
  EXPECT_EQ(rows[0].bytes, 40);
  EXPECT_EQ(rows[1].dtype, at::kFloat);
  EXPECT_EQ(rows[2].group, "lm_head");
}

}  // namespace
}  // namespace engine
