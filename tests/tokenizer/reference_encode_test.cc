// Every tokenizer.json fixture (tests/fixtures/tokenizers: the BPE layouts of Llama 3, Qwen2,
// Mistral and Llama 2 from make_tokenizers.py; the Unigram layouts of T5 and ALBERT, with
// SentencePiece's charsmap, a byte-fallback Unigram and the WordPiece layouts of BERT from
// make_unigram_wordpiece.py) encodes the fortunes and a Unicode stress text to exactly the ids
// Hugging Face's tokenizers library gives (tests/reference/encode_tokenizer.py,
// run in the project's Python environment), with and without special tokens, and decodes them to
// the same text; each text also goes through the normalizer alone to the same string.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/utf8.h"

namespace engine::tokenizer {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = ENGINE_TOKENIZER_FIXTURES;
const fs::path kReference = ENGINE_REFERENCE_DIR;
const std::string kPython = ENGINE_PYTHON;
const fs::path kData = ENGINE_DATA_DIR;

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    lines.push_back(text.substr(begin, end - begin));
  }
  lines.push_back(text.substr(begin));
  return lines;
}

// The first `bytes` of the fortunes, cut at a line end, in a file of its own.
fs::path FortunesSample(size_t bytes) {
  const fs::path path =
      fs::temp_directory_path() / ("engine_fortunes_sample_" + std::to_string(getpid()) + ".txt");
  std::string text = ReadBytes(kData / "fortunes.txt").substr(0, bytes);
  text.resize(text.rfind('\n'));
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

struct Case {
  std::string tokenizer;
  fs::path text_file;
  bool lines;
  bool add_special_tokens;
};

nlohmann::json RunReference(const std::vector<Case>& cases) {
  nlohmann::json request = {{"cases", nlohmann::json::array()}};
  for (const Case& c : cases) {
    request["cases"].push_back({{"tokenizer_file", (kFixtures / c.tokenizer).string()},
                                {"text_file", c.text_file.string()},
                                {"lines", c.lines},
                                {"add_special_tokens", c.add_special_tokens}});
  }
  const fs::path request_file =
      fs::temp_directory_path() / ("engine_tokenizer_cases_" + std::to_string(getpid()) + ".json");
  std::ofstream(request_file) << request.dump();
  const std::string command = "'" + kPython + "' '" +
                              (kReference / "encode_tokenizer.py").string() + "' '" +
                              request_file.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 65536> buffer;
  for (size_t n; (n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0;)
    output.append(buffer.data(), n);
  const int status = pclose(pipe);
  fs::remove(request_file);
  if (status != 0) return nullptr;
  return nlohmann::json::parse(output, nullptr, false);
}

TEST(TokenizerReferenceTest, FixturesEncodeAndDecodeAsHuggingFaceTokenizers) {
  const fs::path fortunes = FortunesSample(300'000);
  const fs::path stress = kFixtures / "stress.txt";
  std::vector<Case> cases;
  for (const char* name : {"llama3_bpe.json", "qwen2_bpe.json", "mistral_bpe.json",
                           "llama2_bpe.json", "t5_unigram.json", "albert_unigram.json",
                           "unigram_bytes.json", "bert_wordpiece.json", "wordpiece_cased.json"}) {
    for (bool special : {false, true}) {
      cases.push_back({name, fortunes, true, special});
      cases.push_back({name, stress, true, special});
      cases.push_back({name, stress, false, special});
    }
  }
  const nlohmann::json results = RunReference(cases);
  // Where the tokenizers library is missing, its ImportError is on the test's standard error.
  ASSERT_TRUE(results.is_array()) << "the reference encoder failed: scripts/setup.sh makes the "
                                     "project's Python environment (.venv)";
  ASSERT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.tokenizer + " on " + c.text_file.filename().string() +
                 (c.lines ? " (by line)" : " (whole)") +
                 (c.add_special_tokens ? " with special tokens" : ""));
    ASSERT_FALSE(results[i].contains("error")) << results[i]["error"];
    auto tokenizer = HfTokenizer::FromFile(kFixtures / c.tokenizer);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
    const std::string text = ReadBytes(c.text_file);
    const std::vector<std::string> texts = c.lines ? Lines(text) : std::vector<std::string>{text};
    ASSERT_EQ(texts.size(), results[i]["ids"].size());
    int mismatches = 0;
    for (size_t t = 0; t < texts.size() && mismatches < 3; ++t) {
      const std::string normalized = (*tokenizer)->Normalize(texts[t]);
      if (normalized != results[i]["normalized"][t].get<std::string>()) {
        ++mismatches;
        ADD_FAILURE() << "text " << t << ": '" << texts[t] << "'\n normalized by us: '"
                      << normalized << "'\n by the reference: '"
                      << results[i]["normalized"][t].get<std::string>() << "'";
        continue;
      }
      const std::vector<int64_t> ids = (*tokenizer)->Encode(texts[t], c.add_special_tokens);
      const auto expected = results[i]["ids"][t].get<std::vector<int64_t>>();
      if (ids != expected) {
        ++mismatches;
        ADD_FAILURE() << "text " << t << ": '" << texts[t]
                      << "'\n ours: " << testing::PrintToString(ids)
                      << "\n reference: " << testing::PrintToString(expected);
        continue;
      }
      EXPECT_EQ((*tokenizer)->Decode(ids, /*skip_special_tokens=*/true),
                results[i]["decoded"][t].get<std::string>())
          << "text " << t;
    }
  }
  fs::remove(fortunes);
}

}  // namespace
}  // namespace engine::tokenizer
