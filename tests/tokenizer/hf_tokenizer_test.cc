// The tokenizer.json implementation on hand-written tokenizers: added-token options, byte
// fallback, ignore_merges, normalizers, the bos template, decoding, and errors that name the file
// and the field.
#include "tokenizer/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "tokenizer/precompiled_charsmap.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A byte-level vocabulary of the letters a-e, space (Ġ) and merges "a b" -> "ab", "ab c" ->
// "abc", plus whatever `extra` adds to the top level.
Json ByteLevelTokenizer(Json extra = Json::object()) {
  Json json = {{"model",
                {{"type", "BPE"},
                 {"vocab",
                  {{"a", 0},
                   {"b", 1},
                   {"c", 2},
                   {"d", 3},
                   {"e", 4},
                   {"\u0120", 5},
                   {"ab", 6},
                   {"abc", 7},
                   {"\u0120a", 8}}},
                 {"merges", Json::array({"a b", Json::array({"ab", "c"}), "\u0120 a"})}}},
               {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
               {"decoder", {{"type", "ByteLevel"}}},
               {"added_tokens", Json::array()}};
  for (auto& [key, value] : extra.items()) json[key] = value;
  return json;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::unique_ptr<HfTokenizer> Load(const Json& json) {
  auto tokenizer = HfTokenizer::FromJson(json.dump(), "test.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return tokenizer.ok() ? std::move(*tokenizer) : nullptr;
}

Json Added(int id, const std::string& content, Json options = Json::object()) {
  Json token = {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  for (auto& [key, value] : options.items()) token[key] = value;
  return token;
}

TEST(HfTokenizerTest, MergesApplyByRankAndDecodeBack) {
  auto tokenizer = Load(ByteLevelTokenizer());
  // In " abd", "a b" (rank 0) merges before "Ġ a" (rank 2) can, and "Ġ ab" is no merge.
  EXPECT_THAT(tokenizer->Encode("abc abd", false), ElementsAre(7, 5, 6, 3));
  EXPECT_THAT(tokenizer->Encode(" ad", false), ElementsAre(8, 3));
  EXPECT_EQ(tokenizer->Decode({7, 5, 6, 3}, true), "abc abd");
}

TEST(HfTokenizerTest, IgnoreMergesTakesAWordInTheVocabularyWhole) {
  Json json = ByteLevelTokenizer();
  json["model"]["vocab"]["bc"] = 9;  // reachable only without merges
  json["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  EXPECT_THAT(Load(json)->Encode("bc", false), ElementsAre(1, 2));
  json["model"]["ignore_merges"] = true;
  EXPECT_THAT(Load(json)->Encode("bc", false), ElementsAre(9));
}

TEST(HfTokenizerTest, AddedTokensSplitFirstWithStripAndSingleWordOptions) {
  Json json = ByteLevelTokenizer(
      {{"added_tokens", Json::array({Added(10, "<x>"), Added(11, "<l>", {{"lstrip", true}}),
                                     Added(12, "<r>", {{"rstrip", true}}),
                                     Added(13, "dd", {{"single_word", true}})})}});
  auto tokenizer = Load(json);
  EXPECT_THAT(tokenizer->Encode("a<x>b", false), ElementsAre(0, 10, 1));
  EXPECT_THAT(tokenizer->Encode("a  <l>b", false), ElementsAre(0, 11, 1));
  EXPECT_THAT(tokenizer->Encode("a<r>  b", false), ElementsAre(0, 12, 1));
  EXPECT_THAT(tokenizer->Encode("a dd", false), ElementsAre(0, 5, 13));
  EXPECT_THAT(tokenizer->Encode("add", false), ElementsAre(0, 3, 3));  // not a word of its own
  EXPECT_EQ(tokenizer->Decode({0, 10, 1}, /*skip_special_tokens=*/false), "a<x>b");
  EXPECT_EQ(tokenizer->Decode({0, 10, 1}, /*skip_special_tokens=*/true), "ab");
}

TEST(HfTokenizerTest, TemplateAddsBosOnlyWithSpecialTokens) {
  Json json = ByteLevelTokenizer(
      {{"added_tokens", Json::array({Added(10, "<s>")})},
       {"post_processor",
        {{"type", "TemplateProcessing"},
         {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {10}}, {"tokens", {"<s>"}}}}}}}}});
  auto tokenizer = Load(json);
  EXPECT_THAT(tokenizer->Encode("a", true), ElementsAre(10, 0));
  EXPECT_THAT(tokenizer->Encode("a", false), ElementsAre(0));
}

TEST(HfTokenizerTest, ByteFallbackSpellsUnknownCharactersAsBytes) {
  Json vocab = {{"<unk>", 0}, {"\u2581", 1}, {"a", 2}, {"\u2581a", 3}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 4 + b;
  }
  Json json = {
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         Json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", {"\u2581 a"}},
        {"unk_token", "<unk>"},
        {"byte_fallback", true}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         Json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}}};
  auto tokenizer = Load(json);
  // "é" is C3 A9.
  const std::vector<int64_t> ids = tokenizer->Encode("a \xC3\xA9", false);
  EXPECT_THAT(ids, ElementsAre(3, 1, 4 + 0xC3, 4 + 0xA9));
  EXPECT_EQ(tokenizer->Decode(ids, true), "a \xC3\xA9");
  // A lone continuation byte decodes to U+FFFD.
  EXPECT_EQ(tokenizer->Decode({4 + 0xA9}, true), "\xEF\xBF\xBD");
}

TEST(HfTokenizerTest, NfcNormalizerComposesBeforeSplitting) {
  Json json = ByteLevelTokenizer({{"normalizer", {{"type", "NFC"}}}});
  auto tokenizer = Load(json);
  // e + combining acute becomes é (C3 A9), whose byte-level characters are not in the
  // vocabulary: no ids, but no decomposed ones either.
  EXPECT_EQ(tokenizer->Encode("e\xCC\x81", false), tokenizer->Encode("\xC3\xA9", false));
}

TEST(HfTokenizerTest, LongWhitespaceRunsSplitAsShortOnes) {
  // Llama 3's whitespace alternatives on a 200,000-space run: the lookahead keeps the last space
  // for the word after it, as on short runs.
  Json json = ByteLevelTokenizer(
      {{"pre_tokenizer",
        {{"type", "Sequence"},
         {"pretokenizers",
          Json::array(
              {{{"type", "Split"},
                {"pattern", {{"Regex", R"(\s+(?!\S)|\s+|[^\s]+)"}}},
                {"behavior", "Isolated"},
                {"invert", false}},
               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}}});
  auto tokenizer = Load(json);
  const std::string spaces(200000, ' ');
  const std::vector<int64_t> ids = tokenizer->Encode(spaces + "a", false);
  ASSERT_EQ(ids.size(), spaces.size() + 1);
  EXPECT_EQ(ids[spaces.size() - 1], 5);  // every space is "Ġ": this vocabulary merges none
  EXPECT_EQ(ids.back(), 0);
}

TEST(HfTokenizerTest, UnsupportedComponentsAreErrorsNamingTheFileFieldAndType) {
  Json json = ByteLevelTokenizer(
      {{"normalizer", {{"type", "Sequence"}, {"normalizers", Json::array({{{"type", "Nmt"}}})}}}});
  auto result = HfTokenizer::FromJson(json.dump(), "dir/tokenizer.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("'dir/tokenizer.json'"));
  EXPECT_THAT(result.status().message(), HasSubstr("normalizer.normalizers[0].type"));
  EXPECT_THAT(result.status().message(), HasSubstr("unsupported normalizer 'Nmt'"));

  json = ByteLevelTokenizer();
  json["model"]["type"] = "WordLevel";
  result = HfTokenizer::FromJson(json.dump(), "t.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(),
              HasSubstr("model.type: unsupported model 'WordLevel' (supported: BPE, Unigram, "
                        "WordPiece)"));

  json = ByteLevelTokenizer({{"pre_tokenizer", {{"type", "UnicodeScripts"}}}});
  result = HfTokenizer::FromJson(json.dump(), "t.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("unsupported pre-tokenizer 'UnicodeScripts'"));
}

Json UnigramTokenizer(Json pieces) {
  return {{"model", {{"type", "Unigram"}, {"unk_id", 0}, {"vocab", std::move(pieces)}}}};
}

TEST(HfTokenizerTest, UnigramTakesThePiecesWhoseScoresSumHighestAndFusesUnknowns) {
  // The example of the tokenizers crate's Unigram::encode documentation.
  auto tokenizer = Load(UnigramTokenizer(Json::array(
      {Json::array({"<unk>", 0.0}), Json::array({"a", 0.0}), Json::array({"b", 0.0}),
       Json::array({"c", 0.0}), Json::array({"d", 0.0}), Json::array({"cd", 1.0}),
       Json::array({"ab", 2.0}), Json::array({"abc", 5.0}), Json::array({"abcd", 10.0})})));
  // abcd | a | cd | xx (two unknown characters, one unk).
  EXPECT_EQ(tokenizer->Encode("abcdacdxx", false), (std::vector<int64_t>{8, 1, 5, 0}));
}

TEST(HfTokenizerTest, UnigramKeepsTheFirstPathFoundOnATie) {
  // "ab" scores exactly "a" + "b": the path found first (the longer piece from the start) stays,
  // as tokenizers keeps it (it encodes "ab" as [3] here).
  auto tokenizer =
      Load(UnigramTokenizer(Json::array({Json::array({"<unk>", 0.0}), Json::array({"a", -1.0}),
                                         Json::array({"b", -1.0}), Json::array({"ab", -2.0})})));
  EXPECT_EQ(tokenizer->Encode("ab", false), (std::vector<int64_t>{3}));
}

std::string Base64(const std::string& bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) group |= static_cast<unsigned char>(bytes[i + 2]);
    text += kAlphabet[(group >> 18) & 63];
    text += kAlphabet[(group >> 12) & 63];
    text += i + 1 < bytes.size() ? kAlphabet[(group >> 6) & 63] : '=';
    text += i + 2 < bytes.size() ? kAlphabet[group & 63] : '=';
  }
  return text;
}

TEST(HfTokenizerTest, MalformedUnigramWordPieceAndCharsmapsAreErrorsNamingTheField) {
  const auto error = [](const Json& json) {
    auto result = HfTokenizer::FromJson(json.dump(), "t.json");
    return result.ok() ? std::string("loaded") : result.status().message();
  };
  Json json = UnigramTokenizer(Json::array({Json::array({"<unk>", 0.0}), Json::array({"a"})}));
  EXPECT_THAT(error(json), HasSubstr("model.vocab[1]: must be [\"piece\", score]"));
  json = UnigramTokenizer(Json::array({Json::array({"a", 0.0})}));
  json["model"].erase("unk_id");
  EXPECT_THAT(error(json), HasSubstr("model.unk_id: is missing"));
  json["model"]["unk_id"] = 3;
  EXPECT_THAT(error(json), HasSubstr("model.unk_id: is not an id of the vocabulary"));

  json = {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}, {"unk_token", "[UNK]"}}}};
  EXPECT_THAT(error(json), HasSubstr("model.unk_token: '[UNK]' is not in the vocabulary"));

  json = UnigramTokenizer(Json::array({Json::array({"<unk>", 0.0})}));
  json["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "not base64!"}};
  EXPECT_THAT(error(json), HasSubstr("normalizer.precompiled_charsmap: is not base64"));
  json["normalizer"]["precompiled_charsmap"] = "/////wAAAAA=";  // a size of 4 GiB, 4 bytes of trie
  EXPECT_THAT(error(json), HasSubstr("normalizer.precompiled_charsmap: says its trie is"));
  // A trie of one unit, then replacements without their final NUL, or one too long to be read.
  json["normalizer"]["precompiled_charsmap"] = Base64(std::string("\4\0\0\0\0\0\0\0ab", 10));
  EXPECT_THAT(error(json), HasSubstr("does not end its replacements with a NUL"));
  json["normalizer"]["precompiled_charsmap"] =
      Base64(std::string("\4\0\0\0\0\0\0\0", 8) + std::string(300, 'x') + '\0');
  EXPECT_THAT(error(json), HasSubstr("holds a replacement of 300 bytes"));

  json = {{"model",
           {{"type", "WordPiece"}, {"vocab", {{"[UNK]", 0}}}, {"max_input_chars_per_word", -1}}}};
  EXPECT_THAT(error(json), HasSubstr("model.max_input_chars_per_word: must not be negative"));
  json = {{"model", {{"type", "WordPiece"}, {"vocab", {{"[UNK]", 0}, {"a", 2000000000}}}}}};
  EXPECT_THAT(error(json), HasSubstr("model.vocab[\"a\"]: id 2000000000 is far past the 2 tokens"));
}

TEST(HfTokenizerTest, ACorruptedCharsmapNeverReadsOutsideItself) {
  // T5's real charsmap (nmt_nfkc) with units of its trie overwritten by seeded random values:
  // offsets, labels and leaf values then point anywhere, and every lookup must stay inside the
  // blob (a read outside would crash or, under a sanitizer, be reported) and give valid UTF-8.
  const Json t5 =
      Json::parse(ReadFile(std::string(ENGINE_TOKENIZER_FIXTURES) + "/t5_unigram.json"));
  const std::optional<std::string> blob =
      DecodeBase64(t5["normalizer"]["precompiled_charsmap"].get<std::string>());
  ASSERT_TRUE(blob.has_value());
  const uint32_t trie_bytes = static_cast<unsigned char>((*blob)[0]) |
                              (static_cast<unsigned char>((*blob)[1]) << 8) |
                              (static_cast<unsigned char>((*blob)[2]) << 16) |
                              (static_cast<uint32_t>(static_cast<unsigned char>((*blob)[3])) << 24);
  std::mt19937 random(7);
  const std::string text = ReadFile(std::string(ENGINE_TOKENIZER_FIXTURES) + "/stress.txt");
  for (int round = 0; round < 20; ++round) {
    std::string corrupted = *blob;
    for (int i = 0; i < 2000; ++i) {
      const size_t unit = 4 + 4 * (random() % (trie_bytes / 4));
      const uint32_t value = random();
      std::memcpy(&corrupted[unit], &value, 4);
    }
    Json json = UnigramTokenizer(Json::array({Json::array({"<unk>", 0.0})}));
    json["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", Base64(corrupted)}};
    auto tokenizer = Load(json);
    const std::string normalized = tokenizer->Normalize(ToValidUtf8(text));
    EXPECT_TRUE(IsValidUtf8(normalized)) << "round " << round;
    EXPECT_LE(normalized.size(), 256 * text.size()) << "round " << round;
  }
}

// Data loaders keep max_length tokens and ask for no more: the encoding stops there, and what it
// gives must be the whole text's first ids, across added tokens, normalizers, pre-tokenizer words
// and each kind of model.
TEST(HfTokenizerTest, AnEncodingStoppedAfterNTokensIsTheWholeTextsFirstN) {
  const std::string fixtures = ENGINE_TOKENIZER_FIXTURES;
  const std::string text = "<|im_start|>user\n" + ReadFile(fixtures + "/stress.txt") +
                           "<|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>";
  for (const char* file : {"qwen2_bpe.json", "llama3_bpe.json", "llama2_bpe.json",
                           "t5_unigram.json", "bert_wordpiece.json", "unigram_bytes.json"}) {
    SCOPED_TRACE(file);
    auto tokenizer = HfTokenizer::FromFile(fixtures + "/" + file);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    const std::vector<int64_t> whole = (*tokenizer)->Encode(text, false);
    ASSERT_GT(whole.size(), 100u);
    for (size_t n = 0; n <= whole.size() + 1; ++n) {
      const std::vector<int64_t> first = (*tokenizer)->Encode(text, false, n);
      ASSERT_EQ(first,
                std::vector<int64_t>(whole.begin(), whole.begin() + std::min(n, whole.size())))
          << "n = " << n;
    }
  }
}

TEST(HfTokenizerTest, MalformedFilesAreErrorsNamingTheFileAndField) {
  auto result = HfTokenizer::FromJson("{\"model\": ", "broken.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("'broken.json' is not valid JSON"));

  Json json = ByteLevelTokenizer();
  json["model"]["merges"] = Json::array({"a zz"});
  result = HfTokenizer::FromJson(json.dump(), "t.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("model.merges[0]"));
  EXPECT_THAT(result.status().message(), HasSubstr("missing from the vocabulary"));

  json = ByteLevelTokenizer();
  json["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  result = HfTokenizer::FromJson(json.dump(), "t.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("pre_tokenizer.pattern"));

  result = HfTokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("/nonexistent/tokenizer.json"));
}

}  // namespace
}  // namespace engine::tokenizer
