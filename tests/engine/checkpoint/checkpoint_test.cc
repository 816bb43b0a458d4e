#include "checkpoint/checkpoint.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "testing/temp_dir.h"

namespace engine {
namespace {

CheckpointContents Contents(uint64_t step) {
  CheckpointContents c;
  c.manifest.set_stage("s");
  c.manifest.set_step(step);
  c.model = {{"w", at::randn({3, 2})}, {"b", at::randn({3}).to(at::kBFloat16)}};
  c.optimizer = {{"w.exp_avg", at::randn({3, 2})}};
  c.optimizer_metadata = {{"step", std::to_string(step)}};
  return c;
}

std::vector<std::string> Listing(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(dir)) {
    names.push_back(item.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// An edit that still parses is found by the manifest's recorded hash; a checkpoint without one
// (an older engine's) is read as it is.
TEST(CheckpointTest, TheManifestIsCheckedAgainstItsRecordedHash) {
  testing::TempDir dir;
  const auto ckpt = dir.path() / "final";
  ASSERT_TRUE(WriteCheckpoint(ckpt, Contents(7)).ok());
  std::string text = testing::ReadText(ckpt / kManifestFile);
  ASSERT_NE(text.find("step: 7\n"), std::string::npos);
  text.replace(text.find("step: 7\n"), 8, "step: 8\n");
  dir.Write("final/manifest.pbtxt", text);
  auto edited = ReadManifest(ckpt);
  ASSERT_FALSE(edited.ok());
  EXPECT_EQ(edited.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(std::string(edited.status().message()),
              ::testing::HasSubstr("manifest.pbtxt' changed after it was written"));
  std::filesystem::remove(ckpt / kManifestHashFile);
  auto older = ReadManifest(ckpt);
  ASSERT_TRUE(older.ok()) << older.status().message();
  EXPECT_EQ(older->step(), 8u);
}

TEST(CheckpointTest, WritesWeightsOptimizerAndManifest) {
  testing::TempDir dir;
  const auto ckpt = dir.path() / "stage" / "final";
  CheckpointContents c = Contents(7);
  at::Tensor w = c.model[0].second;
  ASSERT_TRUE(WriteCheckpoint(ckpt, c).ok());
  EXPECT_EQ(Listing(ckpt),
            (std::vector<std::string>{"manifest.pbtxt", "manifest.xxh3", "model.safetensors",
                                      "optimizer.safetensors"}));
  auto manifest = ReadManifest(ckpt);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  EXPECT_EQ(manifest->format_version(), kSelfContainedFormatVersion);
  EXPECT_EQ(manifest->step(), 7u);
  ASSERT_EQ(manifest->tensor_size(), 2);
  EXPECT_EQ(manifest->tensor(1).name(), "b");
  EXPECT_EQ(manifest->tensor(1).dtype(), "BF16");
  EXPECT_EQ(manifest->tensor(0).shape_size(), 2);
  EXPECT_EQ(manifest->optimizer().state_file(), "optimizer.safetensors");
  auto file = safetensors::File::Open(ckpt / kModelFile);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(at::equal(*(*file)->Get("w"), w));
  EXPECT_EQ((*file)->metadata().at("step"), "7");
}

TEST(CheckpointTest, ReplacingIsAtomicAndLeavesNoTemporaries) {
  testing::TempDir dir;
  const auto ckpt = dir.path() / "final";
  ASSERT_TRUE(WriteCheckpoint(ckpt, Contents(1)).ok());
  ASSERT_TRUE(WriteCheckpoint(ckpt, Contents(2)).ok());
  EXPECT_EQ(ReadManifest(ckpt)->step(), 2u);
  EXPECT_EQ(Listing(dir.path()), std::vector<std::string>{"final"});
}

TEST(CheckpointTest, FailedWriteKeepsThePreviousCheckpoint) {
  testing::TempDir dir;
  const auto ckpt = dir.path() / "final";
  ASSERT_TRUE(WriteCheckpoint(ckpt, Contents(1)).ok());
  CheckpointContents bad = Contents(2);
  bad.model.emplace_back("w", at::randn({1}));  // a duplicate name fails the weights file
  EXPECT_FALSE(WriteCheckpoint(ckpt, bad).ok());
  EXPECT_EQ(ReadManifest(ckpt)->step(), 1u);
  EXPECT_EQ(Listing(dir.path()), std::vector<std::string>{"final"});
}

TEST(CheckpointTest, InterruptedWritesAreNeverReadAndAreCleanedUp) {
  testing::TempDir dir;
  // What a kill in the middle of a write leaves: a hidden temporary with part of the files.
  dir.Write(".final.tmp-123-0/model.safetensors", "partial");
  EXPECT_FALSE(ReadManifest(dir.path() / "final").ok());
  RemoveStaleTemporaries(dir.path());
  EXPECT_TRUE(Listing(dir.path()).empty());
}

TEST(CheckpointTest, TheRanksStagedFilesAreMovedInWithTheirDigestsAndListedInRankOrder) {
  testing::TempDir dir;
  const auto ckpt = dir.path() / "checkpoints/step-00000003";
  const auto staged = RankFilesStagingDir(ckpt);
  EXPECT_EQ(staged, dir.path() / "checkpoints/.step-00000003.tmp-ranks");
  CheckpointContents contents = Contents(3);
  contents.staged_dir = staged;
  for (int rank : {1, 0}) {
    const std::string name = RankFileName(RankFile::kOptimizerState, rank, 2);
    dir.Write("checkpoints/.step-00000003.tmp-ranks/" + name, "rank " + std::to_string(rank));
    auto digest = DigestFile(staged / name, name);
    ASSERT_TRUE(digest.ok());
    contents.staged_files.push_back(*digest);
  }
  EXPECT_EQ(contents.staged_files[1].name(), "optimizer-rank-00000-of-00002.safetensors");
  // Another write beside it clears stale temporaries, but not the ranks' files it is told to keep.
  RemoveStaleTemporaries(ckpt.parent_path(), /*keep=*/staged);
  ASSERT_TRUE(WriteCheckpoint(ckpt, contents).ok());
  EXPECT_FALSE(std::filesystem::exists(staged));
  EXPECT_EQ(testing::ReadText(ckpt / RankFileName(RankFile::kOptimizerState, 1, 2)), "rank 1");
  auto manifest = ReadManifest(ckpt);
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(manifest->format_version(), 3u) << "older engines would resume without the state";
  EXPECT_TRUE(VerifyFileDigests(ckpt, manifest->file()).ok());
  auto files = RankFiles(*manifest, RankFile::kOptimizerState);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(*files, (std::vector<std::string>{"optimizer-rank-00000-of-00002.safetensors",
                                              "optimizer-rank-00001-of-00002.safetensors"}));
  // A rank's file changed or left out of the list is named.
  dir.Write("checkpoints/step-00000003/optimizer-rank-00001-of-00002.safetensors", "rank 9");
  EXPECT_THAT(VerifyFileDigests(ckpt, manifest->file()).message(),
              ::testing::HasSubstr("optimizer-rank-00001-of-00002.safetensors changed since"));
  proto::CheckpointManifest lacking = *manifest;
  lacking.clear_file();
  for (const auto& file : manifest->file()) {
    if (file.name() != RankFileName(RankFile::kOptimizerState, 1, 2)) *lacking.add_file() = file;
  }
  EXPECT_THAT(RankFiles(lacking, RankFile::kOptimizerState).status().message(),
              ::testing::HasSubstr("lacks rank 1's optimizer state, "
                                   "optimizer-rank-00001-of-00002.safetensors"));
  EXPECT_TRUE(RankFiles(proto::CheckpointManifest(), RankFile::kOptimizerState)->empty());
}

TEST(CheckpointTest, ManifestProblemsAreNamed) {
  testing::TempDir dir;
  dir.Write("c/manifest.pbtxt", "format_version: 99\n");
  auto newer = ReadManifest(dir.path() / "c");
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.status().message().find("format version 99"), std::string::npos);
  dir.Write("d/manifest.pbtxt", "this is { not a manifest");
  auto corrupt = ReadManifest(dir.path() / "d");
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.status().message().find("is corrupt"), std::string::npos);
}

}  // namespace
}  // namespace engine
