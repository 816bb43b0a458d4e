// The `digits_captions` data loader: images with their names, the loss only on the answer.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/data.h"
#include "plugins/plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

TEST(DigitsCaptionsTest, ImagesWithMaskedCaptions) {
  const auto& plugin =
      testing::BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "digits_captions");
  const std::string path = testing::DigitsDataPath().string();
  auto data = plugin.Open(*testing::Options(plugin, "path: \"" + path + "\""), DataContext{"/", 3});
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->size(Split::kTrain) + (*data)->size(Split::kEval), 1797);
  EXPECT_EQ((*data)->size(Split::kEval), 359);
  const DataSpec& spec = (*data)->spec();
  EXPECT_EQ(spec.Find("pixel_values")->shape, (std::vector<int64_t>{1, 8, 8}));
  // bos "digit:" " seven" eos: 1 + 6 + 6 + 1.
  EXPECT_EQ(spec.Find("input_ids")->shape, (std::vector<int64_t>{14}));
  EXPECT_EQ(spec.eos_id, 258);

  auto batch = (*data)->GetBatch(Split::kEval, {0, 1, 2, 3, 4, 5, 6, 7});
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  const char* names[] = {"zero", "one", "two",   "three", "four",
                         "five", "six", "seven", "eight", "nine"};
  for (int64_t row = 0; row < 8; ++row) {
    const at::Tensor ids = batch->at("input_ids")[row];
    const at::Tensor labels = batch->at("labels")[row];
    const int64_t prompt = batch->at("prompt_length")[row].item<int64_t>();
    EXPECT_EQ(prompt, 7);
    std::string text;
    for (int64_t i = 1; i < prompt; ++i) text.push_back(static_cast<char>(ids[i].item<int64_t>()));
    EXPECT_EQ(text, "digit:");
    std::string answer;
    for (int64_t i = 0; i < ids.size(0); ++i) {
      const int64_t label = labels[i].item<int64_t>();
      if (i < prompt) {
        EXPECT_EQ(label, -100) << "the prompt is not predicted";
      } else if (ids[i].item<int64_t>() == 256) {
        EXPECT_EQ(label, -100) << "padding is not predicted";
      } else {
        EXPECT_EQ(label, ids[i].item<int64_t>());
        if (label < 256) answer.push_back(static_cast<char>(label));
      }
    }
    const int64_t digit = batch->at("digit")[row].item<int64_t>();
    EXPECT_EQ(answer, std::string(" ") + names[digit]);
    // answer_ids: the answer, eos, then -100.
    const at::Tensor expected = batch->at("answer_ids")[row];
    EXPECT_EQ(expected[static_cast<int64_t>(answer.size())].item<int64_t>(), 258);
  }

  // The same split as the `digits` loader with the same seed.
  const auto& digits = testing::BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "digits");
  auto plain =
      digits.Open(*testing::Options(digits, "path: \"" + path + "\""), DataContext{"/", 3});
  ASSERT_TRUE(plain.ok());
  auto plain_batch = (*plain)->GetBatch(Split::kEval, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_TRUE(at::equal(plain_batch->at("labels"), batch->at("digit")));
  EXPECT_TRUE(at::equal(plain_batch->at("features"), batch->at("pixel_values").reshape({8, 64})));
  EXPECT_EQ((*data)->baselines().at("exact_match"), 0.1);
}

}  // namespace
}  // namespace engine
