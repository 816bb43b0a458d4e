// The tokenizer.json implementation on hand-written tokenizers: added-token options, byte
// fallback, ignore_merges, normalizers, the bos template, decoding, and errors that name the file
// and the field.
#include "tokenizer/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

TEST(HfTokenizerTest, AHostileCharsmapNeverReadsOutsideItself) {
  // Trie units whose offsets and labels point anywhere: every lookup is bounds-checked.
  std::string blob = {16, 0, 0, 0};
  for (uint32_t unit : {0xFFFFFFFFu, 0x0000FF61u, 0x7FFFFD62u, 0x12345678u}) {
    for (int i = 0; i < 4; ++i) blob.push_back(static_cast<char>((unit >> (8 * i)) & 0xFF));
  }
  blob += "x\xE2";
  Json json = UnigramTokenizer(Json::array({Json::array({"<unk>", 0.0})}));
  json["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", Base64(blob)}};
  auto result = HfTokenizer::FromJson(json.dump(), "t.json");
  // The replacements ("x" and half a character) are not UTF-8: refused at load.
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(result.status().message(), HasSubstr("replacements that are not UTF-8"));
  blob.pop_back();
  json["normalizer"]["precompiled_charsmap"] = Base64(blob);
  auto tokenizer = Load(json);
  for (const char* text : {"a", "\xFF\xFE", "abc\u00e9\U0001F600", "\x61\x62"}) {
    EXPECT_EQ(tokenizer->Encode(text, false).size(), 1u) << text;  // one fused unknown
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
