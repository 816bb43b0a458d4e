// The `text` data loader: documents, packing, the document-level split, JSONL, errors, baseline.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/data.h"
#include "plugins/plugin_test_util.h"
#include "testing/temp_dir.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

const DataLoaderPlugin& Text() {
  return testing::BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "text");
}

StatusOr<std::unique_ptr<Dataset>> OpenText(const std::string& options,
                                            const std::filesystem::path& dir, uint64_t seed = 1) {
  auto message = testing::Options(Text(), options);
  return Text().Open(*message, DataContext{dir, seed});
}

// All tokens of a split, window after window.
std::vector<int64_t> Tokens(const Dataset& data, Split split) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < data.size(split); ++i) indices.push_back(i);
  if (indices.empty()) return {};
  auto batch = data.GetBatch(split, indices);
  EXPECT_TRUE(batch.ok()) << batch.status().message();
  const at::Tensor ids = batch->at("input_ids").contiguous();
  EXPECT_TRUE(at::equal(ids, batch->at("labels")));
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

TEST(TextLoaderTest, PacksDocumentsWithBosAndEosIntoWindows) {
  testing::TempDir tmp;
  tmp.Write("f.txt", "ab\n%\ncd\nef\n%\n\n%\nghi\n");
  auto data = OpenText(
      "path: \"f.txt\" document_separator: \"%\" sequence_length: 4 "
      "eval_fraction: 0",
      tmp.path());
  ASSERT_TRUE(data.ok()) << data.status().message();
  // Three documents (the empty one is dropped): 4 + 7 + 5 = 16 tokens -> 4 windows of 4.
  EXPECT_EQ((*data)->size(Split::kTrain), 4);
  EXPECT_EQ((*data)->size(Split::kEval), 0);
  const auto& spec = (*data)->spec();
  ASSERT_NE(spec.Find("input_ids"), nullptr);
  EXPECT_EQ(spec.Find("input_ids")->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(spec.Find("input_ids")->num_classes, 259);
  EXPECT_EQ(spec.eos_id, 258);
  EXPECT_EQ(spec.pad_id, 256);
  const auto tokens = Tokens(**data, Split::kTrain);
  // Every document is bos ... eos; the order is the seed's shuffle.
  std::multiset<std::vector<int64_t>> documents;
  std::vector<int64_t> current;
  for (int64_t t : tokens) {
    current.push_back(t);
    if (t == 258) {
      documents.insert(current);
      current.clear();
    }
  }
  EXPECT_TRUE(documents.count({257, 'a', 'b', 258})) << ::testing::PrintToString(tokens);
  EXPECT_TRUE(documents.count({257, 'c', 'd', '\n', 'e', 'f', 258}));
  EXPECT_TRUE(documents.count({257, 'g', 'h', 'i', 258}));
}

TEST(TextLoaderTest, BlankLinesSeparateDocumentsByDefault) {
  testing::TempDir tmp;
  tmp.Write("f.txt", "one\ntwo\n\n\nthree\n");
  auto data = OpenText("path: \"f.txt\" sequence_length: 2 eval_fraction: 0", tmp.path());
  ASSERT_TRUE(data.ok()) << data.status().message();
  const auto tokens = Tokens(**data, Split::kTrain);
  EXPECT_EQ(std::count(tokens.begin(), tokens.end(), 257), 2);  // two documents
}

TEST(TextLoaderTest, SplitsWholeDocumentsDeterministicallyBySeed) {
  testing::TempDir tmp;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "document number " + std::to_string(i) + "\n%\n";
  tmp.Write("f.txt", text);
  const std::string options =
      "path: \"f.txt\" document_separator: \"%\" sequence_length: 8 eval_fraction: 0.2";
  auto a = OpenText(options, tmp.path(), 5);
  auto b = OpenText(options, tmp.path(), 5);
  auto c = OpenText(options, tmp.path(), 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(Tokens(**a, Split::kEval), Tokens(**b, Split::kEval));
  EXPECT_NE(Tokens(**a, Split::kEval), Tokens(**c, Split::kEval));
  EXPECT_NE((*a)->identity(), (*c)->identity());
  // No document's text appears in both splits.
  auto texts = [](const std::vector<int64_t>& tokens) {
    std::set<std::string> out;
    std::string current;
    for (int64_t t : tokens) {
      if (t == 258) {
        out.insert(current);
        current.clear();
      } else if (t < 256) {
        current.push_back(static_cast<char>(t));
      } else if (t == 257) {
        current.clear();
      }
    }
    return out;  // the first and last may be cut by window edges
  };
  const auto train = texts(Tokens(**a, Split::kTrain));
  const auto eval = texts(Tokens(**a, Split::kEval));
  EXPECT_GT(eval.size(), 20u);
  for (const std::string& doc : eval) {
    if (doc.rfind("document number ", 0) == 0) {
      EXPECT_EQ(train.count(doc), 0u) << doc;
    }
  }
}

TEST(TextLoaderTest, BaselineIsTheUnigramPerplexity) {
  testing::TempDir tmp;
  // Train and eval documents both "aa"; with the seed's split one document is held out.
  tmp.Write("f.txt", "aa\n%\naa\n");
  auto data =
      OpenText("path: \"f.txt\" document_separator: \"%\" sequence_length: 4 eval_fraction: 0.5",
               tmp.path());
  ASSERT_TRUE(data.ok()) << data.status().message();
  // Train counts (add-one over 259 ids): bos 2, a 3, eos 2, others 1; total 259 + 4.
  // Eval predicts positions 1..3 of [bos a a eos]: a, a, eos.
  const double total = 259 + 4;
  const double nll = -(2 * std::log(3 / total) + std::log(2 / total)) / 3;
  auto baselines = (*data)->baselines();
  ASSERT_EQ(baselines.count("perplexity"), 1u);
  EXPECT_NEAR(baselines["perplexity"], std::exp(nll), 1e-9);
}

TEST(TextLoaderTest, ReadsJsonLinesAndNamesTheBadLine) {
  testing::TempDir tmp;
  tmp.Write("d.jsonl", "{\"text\": \"hello\"}\n{\"text\": \"world\", \"id\": 2}\n");
  auto data = OpenText("path: \"d.jsonl\" sequence_length: 3 eval_fraction: 0", tmp.path());
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->size(Split::kTrain), 14 / 3);

  tmp.Write("bad.jsonl", "{\"text\": \"hello\"}\n{\"text\": 3}\n");
  auto bad = OpenText("path: \"bad.jsonl\"", tmp.path());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.jsonl:2: field 'text' is not a string"));
  tmp.Write("broken.jsonl", "{\"text\": \"hello\"}\n\n{\"text\": \"hel\n");
  EXPECT_THAT(OpenText("path: \"broken.jsonl\"", tmp.path()).status().message(),
              HasSubstr("broken.jsonl:3: not valid JSON"));
  tmp.Write("other.jsonl", "{\"body\": \"hello\"}\n");
  EXPECT_THAT(OpenText("path: \"other.jsonl\"", tmp.path()).status().message(),
              HasSubstr("other.jsonl:1: no field 'text'"));
}

TEST(TextLoaderTest, TooLittleTextAndMissingFilesAreClearErrors) {
  testing::TempDir tmp;
  tmp.Write("short.txt", "hi\n");
  EXPECT_THAT(OpenText("path: \"short.txt\" eval_fraction: 0", tmp.path()).status().message(),
              HasSubstr("fewer than 128 tokens, not one window; lower sequence_length"));
  EXPECT_THAT(OpenText("path: \"missing.txt\"", tmp.path()).status().message(),
              HasSubstr("missing.txt"));
  OptionErrors errors;
  Text().ValidateOptions(*testing::Options(Text(), "path: \"x\" sequence_length: 1"), &errors);
  ASSERT_EQ(errors.entries().size(), 1u);
  EXPECT_EQ(errors.entries()[0].field_path, "sequence_length");
}

TEST(TextLoaderTest, ReadsTheFortunes) {
  auto data = OpenText("path: \"" + testing::FortunesDataPath().string() +
                           "\" document_separator: \"%\" sequence_length: 128 eval_fraction: 0.05",
                       "/");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_GT((*data)->size(Split::kTrain), 15000);
  EXPECT_GT((*data)->size(Split::kEval), 500);
  EXPECT_THAT((*data)->description(), HasSubstr("documents"));
  const double baseline = (*data)->baselines().at("perplexity");
  EXPECT_GT(baseline, 15);  // English letters alone: about 20-30
  EXPECT_LT(baseline, 60);
}

TEST(TextLoaderTest, AFileOfRandomBytesIsRefusedWithACount) {
  testing::TempDir tmp;
  std::string bytes(4096, '\0');
  uint32_t state = 12345;
  for (char& c : bytes) {
    state = state * 1664525u + 1013904223u;
    c = static_cast<char>(state >> 24);
  }
  tmp.Write("random.txt", bytes);
  auto data = OpenText("path: \"random.txt\" sequence_length: 4", tmp.path());
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("random.txt' does not look like text: "));
  EXPECT_THAT(data.status().message(), HasSubstr(" of 4,096 bytes are not UTF-8"));
}

TEST(TextLoaderTest, AFewBytesThatAreNotUtf8AreCountedInTheDescription) {
  testing::TempDir tmp;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "a line of plain text number " + std::to_string(i) + "\n%\n";
  text += "caf\xe9\n";  // Latin-1, one byte
  tmp.Write("f.txt", text);
  auto data = OpenText("path: \"f.txt\" document_separator: \"%\" sequence_length: 4", tmp.path());
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_THAT((*data)->description(), HasSubstr("(1 bytes not UTF-8)"));
}

}  // namespace
}  // namespace engine
