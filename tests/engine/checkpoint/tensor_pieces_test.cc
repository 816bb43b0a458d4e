#include "checkpoint/tensor_pieces.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// A 3x4 tensor (0..11) and a 5-element one, cut as two ranks of a sharded stage cut them: rank 0
// holds w's elements 0-6, rank 1 the rest of w and all of b.
struct TwoRanks {
  testing::TempDir dir;
  at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor b = at::arange(5, at::kDouble);
  std::vector<std::filesystem::path> Write(const PiecesToWrite& zero, const PiecesToWrite& one) {
    const std::vector<std::filesystem::path> files = {dir.path() / "rank0.safetensors",
                                                      dir.path() / "rank1.safetensors"};
    EXPECT_TRUE(WritePieces(files[0], zero).ok());
    EXPECT_TRUE(WritePieces(files[1], one).ok());
    return files;
  }
  PiecesToWrite Zero() const {
    return {{{PieceName("w", 0), w.view({-1}).narrow(0, 0, 7)}}, {{"w", {3, 4}}}};
  }
  PiecesToWrite One() const {
    return {{{PieceName("w", 7), w.view({-1}).narrow(0, 7, 5)}, {PieceName("b", 0), b}},
            {{"w", {3, 4}}, {"b", {5}}}};
  }
};

TEST(TensorPiecesTest, TheRanksPiecesReadBackWholeAndInAnyRun) {
  TwoRanks ranks;
  auto pieces = TensorPieces::Open(ranks.Write(ranks.Zero(), ranks.One()));
  ASSERT_TRUE(pieces.ok()) << pieces.status().message();
  EXPECT_EQ(pieces->names(), (std::vector<std::string>{"b", "w"}));
  EXPECT_EQ(pieces->shape("w"), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(pieces->dtype("b"), at::kDouble);
  EXPECT_TRUE(at::equal(*pieces->Whole("w"), ranks.w));
  EXPECT_TRUE(at::equal(*pieces->Whole("b"), ranks.b));
  // Elements 5-9 of w lie in both files; read into another dtype.
  at::Tensor run = at::zeros({5}, at::kDouble);
  ASSERT_TRUE(pieces->ReadInto("w", 5, run).ok());
  EXPECT_TRUE(at::equal(run, at::arange(5, 10, at::kDouble)));
  auto taken = pieces->TakeWhole([](const std::string& name) { return name == "b"; });
  ASSERT_TRUE(taken.ok());
  ASSERT_EQ(taken->size(), 1u);
  EXPECT_EQ((*taken)[0].first, "b");
  EXPECT_FALSE(pieces->Has("b"));
  EXPECT_TRUE(pieces->Has("w"));
}

TEST(TensorPiecesTest, WholeTensorsAreOnePieceEach) {
  const at::Tensor w = at::arange(6, at::kFloat).reshape({2, 3});
  TensorPieces pieces = TensorPieces::FromWhole({{"w", w}});
  at::Tensor run = at::zeros({2});
  ASSERT_TRUE(pieces.ReadInto("w", 3, run).ok());
  EXPECT_TRUE(at::equal(run, at::arange(3, 5, at::kFloat)));
  TensorPieces again = TensorPieces::FromWhole({{"w", w}});
  EXPECT_THAT(pieces.Merge(std::move(again)).message(), HasSubstr("'w' is stored twice"));
}

TEST(TensorPiecesTest, PiecesThatLeaveAGapOrOverlapAreRefusedNamingTheFile) {
  TwoRanks ranks;
  PiecesToWrite short_one = ranks.One();
  short_one.pieces[0] = {PieceName("w", 8), ranks.w.view({-1}).narrow(0, 8, 4)};
  auto gap = TensorPieces::Open(ranks.Write(ranks.Zero(), short_one));
  ASSERT_FALSE(gap.ok());
  EXPECT_THAT(gap.status().message(), HasSubstr("rank1.safetensors: piece 'w@8' leaves elements "
                                                "7 to 7 of 'w' in no file"));
  PiecesToWrite overlapping = ranks.One();
  overlapping.pieces[0] = {PieceName("w", 6), ranks.w.view({-1}).narrow(0, 6, 6)};
  auto overlap = TensorPieces::Open(ranks.Write(ranks.Zero(), overlapping));
  ASSERT_FALSE(overlap.ok());
  EXPECT_THAT(overlap.status().message(), HasSubstr("piece 'w@6' overlaps another piece"));
  // A rank's file missing altogether: rank 0's elements are in no file.
  auto missing = TensorPieces::Open({ranks.Write(ranks.Zero(), ranks.One())[1]});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(),
              HasSubstr("piece 'w@7' leaves elements 0 to 6 of 'w' in no file"));
}

TEST(TensorPiecesTest, AFileThatIsNotOneOfPiecesIsRefusedNamingTheTensor) {
  testing::TempDir dir;
  const auto plain = dir.path() / "plain.safetensors";
  ASSERT_TRUE(safetensors::Write(plain, {{"w", at::zeros({2})}}).ok());
  auto opened = TensorPieces::Open({plain});
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.status().message(), HasSubstr("plain.safetensors: tensor 'w' is not a piece"));
  const auto shapeless = dir.path() / "shapeless.safetensors";
  ASSERT_TRUE(safetensors::Write(shapeless, {{"w@0", at::zeros({2})}}).ok());
  opened = TensorPieces::Open({shapeless});
  ASSERT_FALSE(opened.ok());
  EXPECT_THAT(opened.status().message(),
              HasSubstr("shapeless.safetensors: the shape of 'w' is missing from its metadata"));
}

}  // namespace
}  // namespace engine
