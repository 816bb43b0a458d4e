#include <ATen/ops/equal.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include "engine/data.h"
#include "plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using testing::BuiltinPlugin;
using ::testing::HasSubstr;
using testing::Options;

const DataLoaderPlugin& Digits() {
  return BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "digits");
}

StatusOr<std::unique_ptr<Dataset>> OpenDigits(const std::string& options, uint64_t seed = 0,
                                              const std::filesystem::path& base = "/") {
  return Digits().Open(*Options(Digits(), options), DataContext{base, seed});
}

std::string RealPath() { return "path: \"" + testing::DigitsDataPath().string() + "\""; }

TEST(DigitsTest, ReadsAllImagesAndSplitsThem) {
  auto data = OpenDigits(RealPath());
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->size(Split::kTrain), 1438);
  EXPECT_EQ((*data)->size(Split::kEval), 359);
  EXPECT_EQ((*data)->spec().ToString(), "features f32[64], labels i64[] (10 classes)");
  EXPECT_THAT((*data)->description(), HasSubstr("1,797 images 8x8 (scaled to 0..1)"));
  auto batch = (*data)->GetBatch(Split::kTrain, {0, 5, 1437});
  ASSERT_TRUE(batch.ok());
  const at::Tensor& features = batch->at("features");
  const at::Tensor& labels = batch->at("labels");
  EXPECT_EQ(features.sizes(), at::IntArrayRef({3, 64}));
  EXPECT_EQ(features.scalar_type(), at::kFloat);
  EXPECT_EQ(labels.scalar_type(), at::kLong);
  EXPECT_GE(features.min().item<float>(), 0.0f);
  EXPECT_LE(features.max().item<float>(), 1.0f);
  EXPECT_GE(labels.min().item<int64_t>(), 0);
  EXPECT_LE(labels.max().item<int64_t>(), 9);
}

TEST(DigitsTest, TheFirstImageIsAZero) {
  // The first row of digits.csv.gz: 0,0,5,13,9,1,0,0, ... label 0. With eval_fraction 0 and no
  // normalisation the values come back as stored (the order is still shuffled, so find it).
  auto data = OpenDigits(RealPath() + " eval_fraction: 0 normalize: false");
  ASSERT_TRUE(data.ok());
  EXPECT_EQ((*data)->size(Split::kEval), 0);
  std::vector<int64_t> all((*data)->size(Split::kTrain));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  auto batch = (*data)->GetBatch(Split::kTrain, all);
  ASSERT_TRUE(batch.ok());
  const at::Tensor features = batch->at("features");
  bool found = false;
  for (int64_t i = 0; i < features.size(0) && !found; ++i) {
    const float* row = features[i].data_ptr<float>();
    found = row[2] == 5 && row[3] == 13 && row[4] == 9 && row[5] == 1 && row[10] == 13 &&
            batch->at("labels")[i].item<int64_t>() == 0;
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(features.max().item<float>(), 16.0f);
}

TEST(DigitsTest, SplitIsFixedBySeed) {
  auto a = OpenDigits(RealPath(), 1), b = OpenDigits(RealPath(), 1), c = OpenDigits(RealPath(), 2);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto first = [](const std::unique_ptr<Dataset>& d) {
    return d->GetBatch(Split::kEval, {0, 1, 2, 3, 4, 5, 6, 7})->at("features");
  };
  EXPECT_TRUE(at::equal(first(*a), first(*b)));
  EXPECT_FALSE(at::equal(first(*a), first(*c)));
  EXPECT_EQ((*a)->identity(), (*b)->identity());
  EXPECT_NE((*a)->identity(), (*c)->identity());
}

TEST(DigitsTest, RelativePathsResolveAgainstThePipeline) {
  auto data = OpenDigits("path: \"digits.csv.gz\"", 0, testing::DigitsDataPath().parent_path());
  EXPECT_TRUE(data.ok()) << data.status().message();
}

TEST(DigitsTest, BadFilesNameTheLine) {
  testing::TempDir dir;
  const std::string row =
      "0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,"
      "8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,"
      "10,0,0,0,";
  auto error = [&](const std::string& content) {
    auto path = dir.Write("d.csv", content);
    auto data = OpenDigits("path: \"" + path.string() + "\"");
    return data.ok() ? std::string("(opened)") : data.status().message();
  };
  EXPECT_EQ(error(row + "0\n" + row + "0\n"), "(opened)");
  EXPECT_THAT(error(row + "0\n" + row + "\n"), HasSubstr("d.csv:2: value 65 is ''"));
  EXPECT_THAT(error(row + "0\n0,1,2\n"), HasSubstr("d.csv:2: 3 values; 65 expected"));
  EXPECT_THAT(error(row + "0,4\n"), HasSubstr("d.csv:1: more than 65 values"));
  EXPECT_THAT(error(row + "x\n"), HasSubstr("d.csv:1: value 65 is 'x'"));
  EXPECT_THAT(error("17" + row.substr(1) + "0\n"), HasSubstr("d.csv:1: pixel 1 is 17"));
  EXPECT_THAT(error(row + "10\n"), HasSubstr("d.csv:1: label 10 is outside 0..9"));
  EXPECT_THAT(error(""), HasSubstr("holds no images"));
  EXPECT_THAT(error("\n\n"), HasSubstr("holds no images"));
  EXPECT_THAT(OpenDigits("path: \"/nonexistent/digits.csv.gz\"").status().message(),
              HasSubstr("cannot open '/nonexistent/digits.csv.gz'"));
}

TEST(DigitsTest, TruncatedGzipIsDataLoss) {
  testing::TempDir dir;
  std::string bytes = testing::ReadText(testing::DigitsDataPath());
  auto path = dir.Write("cut.csv.gz", bytes.substr(0, bytes.size() / 2));
  auto data = OpenDigits("path: \"" + path.string() + "\"");
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("cut.csv.gz"));
}

TEST(DigitsTest, OptionValidation) {
  OptionErrors errors;
  Digits().ValidateOptions(*Options(Digits(), "path: \"x\" eval_fraction: 1"), &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "eval_fraction");
  EXPECT_EQ(errors.entries()[0].message, "must be in [0, 1) (got 1)");
}

TEST(DigitsTest, BatchIndicesAreChecked) {
  auto data = OpenDigits(RealPath());
  ASSERT_TRUE(data.ok());
  auto bad = (*data)->GetBatch(Split::kEval, {359});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("example 359 is outside the eval split"));
}

}  // namespace
}  // namespace engine
