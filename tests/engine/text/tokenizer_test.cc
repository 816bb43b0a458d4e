// Tokenizers: byte-level ids and round trips, and a SentencePiece model trained here with the
// library's trainer (no download), read through the same interface.
#include "engine/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(ByteTokenizerTest, BytesAndSpecialIds) {
  auto tokenizer = MakeTokenizer(proto::TokenizerOptions(), "/");
  ASSERT_TRUE(tokenizer.ok());
  const auto& t = **tokenizer;
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.pad_id(), 256);
  EXPECT_EQ(t.bos_id(), 257);
  EXPECT_EQ(t.eos_id(), 258);
  const std::string text = "sieben \xC3\xA9";  // UTF-8 bytes stay bytes
  const auto ids = t.Encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 's');
  EXPECT_EQ(ids.back(), 0xA9);
  auto with_specials = ids;
  with_specials.insert(with_specials.begin(), 257);
  with_specials.push_back(258);
  with_specials.push_back(256);
  EXPECT_EQ(t.Decode(with_specials), text);
}

TEST(SentencePieceTokenizerTest, TrainedModelRoundTrips) {
  testing::TempDir tmp;
  std::string corpus;
  for (int i = 0; i < 200; ++i) {
    corpus += "the quick brown fox jumps over the lazy dog number " + std::to_string(i) + "\n";
  }
  const auto input = tmp.Write("corpus.txt", corpus);
  const auto prefix = tmp.path() / "sp";
  const std::string flags = "--input=" + input.string() + " --model_prefix=" + prefix.string() +
                            " --vocab_size=60 --model_type=bpe --minloglevel=2";
  const auto trained = testing::RunCommand({testing::kSpmTrainFixture, flags});
  ASSERT_EQ(trained.exit_code, 0) << trained.err;

  proto::TokenizerOptions options;
  options.set_kind(proto::TokenizerOptions::SENTENCEPIECE);
  options.set_model_file("sp.model");  // relative to the base directory
  auto tokenizer = MakeTokenizer(options, tmp.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const auto& t = **tokenizer;
  const auto ids = t.Encode("the lazy fox");
  EXPECT_LT(ids.size(), 12u);  // pieces, not bytes
  for (int64_t id : ids) EXPECT_LT(id, t.vocab_size());
  EXPECT_EQ(t.Decode(ids), "the lazy fox");
  EXPECT_GE(t.eos_id(), 0);
  EXPECT_GE(t.pad_id(), 0);
  EXPECT_GE(t.vocab_size(), 60);
  EXPECT_THAT(t.description(), HasSubstr("SentencePiece"));
  EXPECT_NE(t.identity(), (*MakeTokenizer(proto::TokenizerOptions(), "/"))->identity());
}

TEST(SentencePieceTokenizerTest, BadModelFilesNameTheFile) {
  testing::TempDir tmp;
  tmp.Write("broken.model", "not a sentencepiece model");
  proto::TokenizerOptions options;
  options.set_kind(proto::TokenizerOptions::SENTENCEPIECE);
  options.set_model_file("broken.model");
  auto broken = MakeTokenizer(options, tmp.path());
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr("broken.model"));
  options.set_model_file("missing.model");
  EXPECT_THAT(MakeTokenizer(options, tmp.path()).status().message(), HasSubstr("missing.model"));
}

TEST(HfJsonTokenizerTest, LoadsADirectoryWithItsConfigsSpecialIds) {
  testing::TempDir tmp;
  const std::filesystem::path fixture =
      std::filesystem::path(testing::kSourceDir) / "tests/fixtures/tokenizers/qwen2_bpe.json";
  std::filesystem::copy_file(fixture, tmp.path() / "tokenizer.json");
  tmp.Write(
      "tokenizer_config.json",
      R"({"bos_token": null, "eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}})");
  proto::TokenizerOptions options;
  options.set_kind(proto::TokenizerOptions::HF_JSON);
  options.set_path(".");  // the directory, relative to the base directory
  auto tokenizer = MakeTokenizer(options, tmp.path());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  const auto& t = **tokenizer;
  const std::vector<int64_t> ids = t.Encode("Hello <|im_end|> world");
  // The added token, not its characters.
  EXPECT_NE(std::find(ids.begin(), ids.end(), t.eos_id()), ids.end());
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.pad_id(), t.eos_id() - 2);  // <|endoftext|>, <|im_start|>, <|im_end|>
  EXPECT_EQ(t.vocab_size(), t.eos_id() + 1);
  EXPECT_EQ(t.Decode(ids), "Hello  world");  // special tokens are not text
  EXPECT_THAT(t.description(), HasSubstr("tokenizer.json"));
}

TEST(HfJsonTokenizerTest, ErrorsNameTheFileAndTheToken) {
  testing::TempDir tmp;
  proto::TokenizerOptions options;
  options.set_kind(proto::TokenizerOptions::HF_JSON);
  OptionErrors errors;
  ValidateTokenizerOptions(options, "tokenizer.", &errors);
  EXPECT_FALSE(errors.empty());
  options.set_path("missing.json");
  EXPECT_THAT(MakeTokenizer(options, tmp.path()).status().message(), HasSubstr("missing.json"));
  std::filesystem::copy_file(
      std::filesystem::path(testing::kSourceDir) / "tests/fixtures/tokenizers/llama3_bpe.json",
      tmp.path() / "tokenizer.json");
  tmp.Write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  options.set_path("tokenizer.json");
  auto result = MakeTokenizer(options, tmp.path());
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("tokenizer_config.json"));
  EXPECT_THAT(result.status().message(), HasSubstr("<|nope|>"));
}

}  // namespace
}  // namespace engine
