#include "core/glob.h"

#include <gtest/gtest.h>

namespace engine {
namespace {

TEST(GlobTest, StarCrossesDots) {
  EXPECT_TRUE(GlobMatch("visual.*", "visual.blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(GlobMatch("*.bias", "layers.0.bias"));
  EXPECT_TRUE(GlobMatch("*", "anything.at.all"));
  EXPECT_TRUE(GlobMatch("model.layers.*.mlp.*", "model.layers.11.mlp.up_proj.weight"));
  EXPECT_FALSE(GlobMatch("visual.*", "model.visual.x"));
  EXPECT_FALSE(GlobMatch("*.bias", "layers.0.weight"));
}

TEST(GlobTest, WholeNameMustMatch) {
  EXPECT_TRUE(GlobMatch("head.weight", "head.weight"));
  EXPECT_FALSE(GlobMatch("head", "head.weight"));
  EXPECT_FALSE(GlobMatch("head.weight", "head"));
  EXPECT_TRUE(GlobMatch("", ""));
  EXPECT_FALSE(GlobMatch("", "x"));
}

TEST(GlobTest, QuestionMarkAndClasses) {
  EXPECT_TRUE(GlobMatch("layers.?.weight", "layers.3.weight"));
  EXPECT_FALSE(GlobMatch("layers.?.weight", "layers.10.weight"));
  EXPECT_TRUE(GlobMatch("layers.[0-2].*", "layers.1.bias"));
  EXPECT_FALSE(GlobMatch("layers.[0-2].*", "layers.3.bias"));
  EXPECT_TRUE(GlobMatch("layers.[!0].*", "layers.5.bias"));
  EXPECT_FALSE(GlobMatch("layers.[!0].*", "layers.0.bias"));
  EXPECT_TRUE(GlobMatch("[ab]x", "bx"));
}

TEST(GlobTest, BacktracksAcrossSeveralStars) {
  EXPECT_TRUE(GlobMatch("*a*b*c", "xxaxxbxxbxxc"));
  EXPECT_FALSE(GlobMatch("*a*b*c", "xxaxxbxxbxx"));
  EXPECT_TRUE(GlobMatch("**", ""));
}

TEST(GlobTest, SyntaxErrors) {
  EXPECT_EQ(GlobSyntaxError("visual.*"), "");
  EXPECT_NE(GlobSyntaxError(""), "");
  EXPECT_NE(GlobSyntaxError("layers.[0-2"), "");
}

}  // namespace
}  // namespace engine
