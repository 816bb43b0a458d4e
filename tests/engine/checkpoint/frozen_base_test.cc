// A frozen base is named by its files' contents, not by where they are: the same files elsewhere
// are the same base, and FindBaseByContent finds them (3 levels down, in name order, not through
// symlinks) or says which hashes it wanted and where it looked.
#include "checkpoint/frozen_base.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr const char* kRecipe =
    R"(model: llama@0.1.0 {engine.transformer.LlamaOptions{pretrained:"DIR";hidden_size:8;}}; seed 0)";

// config.json and model.safetensors under `dir` (their bytes only need to be the same), and the
// base they make.
proto::FrozenBase WriteBase(const testing::TempDir& tmp, const std::string& dir,
                            const std::string& weights = "weights") {
  tmp.Write(dir + "/config.json", "{\"model_type\": \"llama\"}");
  tmp.Write(dir + "/model.safetensors", weights);
  tmp.Write(dir + "/tokenizer.json", "a tokenizer makes no tensor");
  proto::FrozenBase base;
  base.set_pretrained((tmp.path() / dir).string());
  std::string recipe = kRecipe;
  recipe.replace(recipe.find("DIR"), 3, (tmp.path() / dir).string());
  base.set_recipe(recipe);
  for (const char* name : {"config.json", "model.safetensors"}) {
    auto digest = DigestFile(tmp.path() / dir / name, name);
    EXPECT_TRUE(digest.ok());
    *base.add_file() = *digest;
  }
  return base;
}

TEST(FrozenBaseTest, TheSameFilesElsewhereAreTheSameBase) {
  testing::TempDir tmp;
  const proto::FrozenBase recorded = WriteBase(tmp, "then");
  const proto::FrozenBase moved = WriteBase(tmp, "now/somewhere");
  EXPECT_TRUE(CheckSameBase(recorded, moved, "ctx").ok());

  const proto::FrozenBase other = WriteBase(tmp, "other", "other weights");
  const Status differs = CheckSameBase(recorded, other, "ctx");
  EXPECT_THAT(differs.message(), HasSubstr((tmp.path() / "other/model.safetensors").string() +
                                           "' differs (content hash "));
  EXPECT_THAT(differs.message(), HasSubstr("--base_path"));

  proto::FrozenBase rebuilt = moved;
  rebuilt.set_recipe(std::string(kRecipe) + " but with another seed");
  EXPECT_THAT(CheckSameBase(recorded, rebuilt, "ctx").message(),
              HasSubstr("its base was built as ["));
}

TEST(FrozenBaseTest, TheSearchFindsTheFirstDirectoryHoldingTheSameContents) {
  testing::TempDir tmp;
  const proto::FrozenBase recorded = WriteBase(tmp, "then");
  WriteBase(tmp, "shelf/a/same_names_other_bytes", "WEIGHTS");
  WriteBase(tmp, "shelf/b/extra_file");
  tmp.Write("shelf/b/extra_file/model-00002.safetensors", "more");
  WriteBase(tmp, "shelf/c/hub/snapshot");
  WriteBase(tmp, "shelf/d/second_match");
  auto found = FindBaseByContent(recorded, {tmp.path() / "missing", tmp.path() / "shelf"});
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(*found, tmp.path() / "shelf/c/hub/snapshot");
}

TEST(FrozenBaseTest, TheSearchStopsThreeLevelsDownAndNamesWhatItWanted) {
  testing::TempDir tmp;
  const proto::FrozenBase recorded = WriteBase(tmp, "then");
  WriteBase(tmp, "shelf/1/2/3/4");
  fs::create_directories(tmp.path() / "linked");
  fs::create_directory_symlink(tmp.path() / "then", tmp.path() / "linked/to_the_base");
  auto missing = FindBaseByContent(recorded, {tmp.path() / "shelf", tmp.path() / "linked"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  const std::string& message = missing.status().message();
  EXPECT_THAT(message,
              HasSubstr("model.safetensors (xxh3 " + recorded.file(1).xxh3() + ", 7 bytes)"));
  EXPECT_THAT(message, HasSubstr("config.json (xxh3 " + recorded.file(0).xxh3()));
  EXPECT_THAT(message, HasSubstr("looked in '" + (tmp.path() / "shelf").string() + "', '" +
                                 (tmp.path() / "linked").string() + "'"));
  EXPECT_THAT(message, HasSubstr("--base_path=DIR or $ENGINE_BASE_PATH"));

  auto at_depth_three = FindBaseByContent(recorded, {tmp.path() / "shelf/1"});
  ASSERT_TRUE(at_depth_three.ok());
  EXPECT_EQ(*at_depth_three, tmp.path() / "shelf/1/2/3/4");
}

}  // namespace
}  // namespace engine
