// The `chat` data loader: the three JSONL layouts, loss only on assistant tokens (end of turn
// included), truncation and skipping counted in the plan line, errors naming FILE:LINE, and
// right-padded or packed batches whose loss and gradients are the token-weighted mean of their
// examples'.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/data.h"
#include "engine/model.h"
#include "plugins/plugin_test_util.h"
#include "testing/temp_dir.h"
#include "tokenizer/hf_tokenizer.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kChatData = fs::path(testing::kSourceDir) / "tests/fixtures/chat_data";
const fs::path kQwen2 = fs::path(testing::kSourceDir) / "tests/fixtures/tokenizers/qwen2_bpe.json";

const DataLoaderPlugin& ChatPlugin() {
  return testing::BuiltinPlugin<DataLoaderPlugin>(PluginKind::kDataLoader, "chat");
}

// The loader on `jsonl` (a file name in `dir`) with the Qwen2-style fixture tokenizer and
// template, plus `extra` options.
StatusOr<std::unique_ptr<Dataset>> OpenChat(const fs::path& dir, const std::string& jsonl,
                                            const std::string& extra = "eval_fraction: 0") {
  auto message = testing::Options(
      ChatPlugin(), "path: \"" + jsonl + "\" tokenizer { kind: HF_JSON path: \"" + kQwen2.string() +
                        "\" config: \"" + (kChatData / "tokenizer_config.json").string() + "\" } " +
                        extra);
  OptionErrors errors;
  ChatPlugin().ValidateOptions(*message, &errors);
  EXPECT_TRUE(errors.empty());
  return ChatPlugin().Open(*message, DataContext{dir, 1});
}

Batch AllOf(const Dataset& data) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < data.size(Split::kTrain); ++i) indices.push_back(i);
  auto batch = data.GetBatch(Split::kTrain, indices);
  EXPECT_TRUE(batch.ok()) << batch.status().message();
  return *batch;
}

TEST(ChatLoaderTest, ReadsEveryLayoutAndCountsWhatItSkips) {
  auto data = OpenChat(kChatData, "conversations.jsonl");
  ASSERT_TRUE(data.ok()) << data.status().message();
  EXPECT_EQ((*data)->size(Split::kTrain), 5);
  const std::string plan = (*data)->description();
  EXPECT_THAT(plan, HasSubstr("5 conversations (alpaca 2, messages 2, sharegpt 1)"));
  EXPECT_THAT(plan, HasSubstr("dropped: 1 without an assistant turn"));
  EXPECT_THAT(plan, HasSubstr("tokens min/median/max"));
  EXPECT_THAT(plan, HasSubstr("of tokens carry loss"));
  EXPECT_THAT(plan, HasSubstr("959 ids"));  // pad and eos from the tokenizer_config.json
  EXPECT_EQ((*data)->spec().eos_id, 958);
}

TEST(ChatLoaderTest, LossCoversExactlyTheAssistantTurnsWithTheirEndOfTurn) {
  auto data = OpenChat(kChatData, "conversations.jsonl");
  ASSERT_TRUE(data.ok()) << data.status().message();
  auto tokenizer = tokenizer::HfTokenizer::FromFile(kQwen2);
  ASSERT_TRUE(tokenizer.ok());
  const Batch batch = AllOf(**data);
  const at::Tensor labels = batch.at("labels"), ids = batch.at("input_ids");
  const at::Tensor mask = batch.at("attention_mask");
  std::vector<std::string> learned;
  for (int64_t b = 0; b < labels.size(0); ++b) {
    std::vector<int64_t> loss_ids;
    for (int64_t t = 0; t < labels.size(1); ++t) {
      const int64_t label = labels[b][t].item<int64_t>();
      if (label != -100) {
        EXPECT_EQ(label, ids[b][t].item<int64_t>());
        loss_ids.push_back(label);
      }
      if (mask[b][t].item<int64_t>() == 0) {
        EXPECT_EQ(label, -100);
      }
    }
    learned.push_back((*tokenizer)->Decode(loss_ids, /*skip_special_tokens=*/false));
  }
  // The template ends a turn with "<|im_end|>\n"; the span takes both.
  EXPECT_THAT(learned,
              ::testing::UnorderedElementsAre(
                  "A short saying about the future.<|im_end|>\n",
                  "Hi!<|im_end|>\nこんにちは!<|im_end|>\n", "You will learn C++ today.<|im_end|>\n",
                  "is a penny earned.<|im_end|>\n", "1, 2, 3.<|im_end|>\n"));
}

TEST(ChatLoaderTest, SentencePieceStyleTokenizersMarkTheSameTurns) {
  // Mistral's layout: Metaspace, byte fallback, and a decoder that drops the leading space, so
  // the decoded text differs from the rendering by spaces.
  testing::TempDir tmp;
  tmp.Write(
      "c.jsonl",
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}, {"role": "user", "content": "Ünïcode?"}, {"role": "assistant", "content": "Ça va 👍"}]})");
  const fs::path mistral =
      fs::path(testing::kSourceDir) / "tests/fixtures/tokenizers/mistral_bpe.json";
  auto message = testing::Options(
      ChatPlugin(), "path: \"c.jsonl\" eval_fraction: 0 tokenizer { kind: HF_JSON path: \"" +
                        mistral.string() + "\" config: \"" +
                        (kChatData / "mistral_tokenizer_config.json").string() + "\" }");
  auto data = ChatPlugin().Open(*message, DataContext{tmp.path(), 1});
  ASSERT_TRUE(data.ok()) << data.status().message();
  auto tokenizer = tokenizer::HfTokenizer::FromFile(mistral);
  ASSERT_TRUE(tokenizer.ok());
  const Batch batch = AllOf(**data);
  std::vector<int64_t> loss_ids;
  for (int64_t t = 0; t < batch.at("labels").size(1); ++t) {
    const int64_t label = batch.at("labels")[0][t].item<int64_t>();
    if (label != -100) loss_ids.push_back(label);
  }
  EXPECT_EQ((*tokenizer)->Decode(loss_ids, /*skip_special_tokens=*/false),
            "Hello there.</s> Ça va 👍</s>");
  EXPECT_EQ((*data)->spec().eos_id, 2);
}

TEST(ChatLoaderTest, LongExamplesAreTruncatedOrDroppedAndCounted) {
  // The examples have 45 to 79 tokens.
  auto truncated = OpenChat(kChatData, "conversations.jsonl", "eval_fraction: 0 max_length: 60");
  ASSERT_TRUE(truncated.ok()) << truncated.status().message();
  EXPECT_THAT((*truncated)->description(), HasSubstr("1 truncated to max_length 60"));
  EXPECT_EQ(AllOf(**truncated).at("input_ids").size(1), 60);
  auto dropped = OpenChat(kChatData, "conversations.jsonl",
                          "eval_fraction: 0 max_length: 60 truncation: DROP");
  ASSERT_TRUE(dropped.ok()) << dropped.status().message();
  EXPECT_THAT((*dropped)->description(), HasSubstr("dropped: 1 longer than max_length 60"));
  EXPECT_EQ((*dropped)->size(Split::kTrain), 4);
}

// Compares, for every max_length in [8, 80], each example of `jsonl` in `dir` (read with
// `tokenizer`, a tokenizer { ... } block) with the first tokens and loss of the same example read
// whole; returns how many examples it compared.
int64_t CompareCutsWithWholeExamples(const fs::path& dir, const std::string& jsonl,
                                     const std::string& tokenizer) {
  auto open = [&](int max_length) {
    auto message =
        testing::Options(ChatPlugin(), "path: \"" + jsonl + "\" eval_fraction: 0 " + tokenizer +
                                           " max_length: " + std::to_string(max_length));
    return ChatPlugin().Open(*message, DataContext{dir, 1});
  };
  auto whole = open(4096);
  EXPECT_TRUE(whole.ok()) << whole.status().message();
  if (!whole.ok()) return 0;
  const int64_t examples = (*whole)->size(Split::kTrain);
  int64_t compared = 0;
  for (int max_length = 8; max_length <= 80; ++max_length) {
    auto cut = open(max_length);
    // Where examples lost every loss token, none may be left, or rows no longer line up.
    if (!cut.ok()) {
      EXPECT_THAT(cut.status().message(), HasSubstr("gives no examples")) << max_length;
      continue;
    }
    if ((*cut)->size(Split::kTrain) != examples) continue;
    for (int64_t i = 0; i < examples; ++i) {
      const Batch full = *(*whole)->GetBatch(Split::kTrain, {i});
      const Batch kept = *(*cut)->GetBatch(Split::kTrain, {i});
      const int64_t length = kept.at("input_ids").size(1);
      EXPECT_LE(length, max_length);
      for (const char* field : {"input_ids", "labels"}) {
        EXPECT_TRUE(at::equal(kept.at(field), full.at(field).narrow(1, 0, length)))
            << field << " of example " << i << " at max_length " << max_length;
      }
      ++compared;
    }
  }
  return compared;
}

// The text past max_length is not encoded (a line of megabytes costs what max_length tokens
// cost), so each truncated example must still hold the whole conversation's first tokens, with
// their loss as the whole conversation gives it: with byte-level BPE, and with byte fallback
// (Mistral's), whose runs of byte tokens the cut may split anywhere.
TEST(ChatLoaderTest, TruncatedExamplesAreTheWholeConversationsFirstTokensAndLoss) {
  EXPECT_GT(CompareCutsWithWholeExamples(
                kChatData, "conversations.jsonl",
                "tokenizer { kind: HF_JSON path: \"" + kQwen2.string() + "\" config: \"" +
                    (kChatData / "tokenizer_config.json").string() + "\" }"),
            100);
  testing::TempDir tmp;
  std::string lines;
  for (const char* text :
       {"Ça va 👍👍 très bien 東京タワー 🙂🙃", "日本語のテキスト 🎉 and more 🎉🎉🎉",
        "plain words then 🧪🧪🧪🧪 emoji"}) {
    lines += nlohmann::json{{"messages",
                             {{{"role", "user"}, {"content", std::string("Say: ") + text}},
                              {{"role", "assistant"}, {"content", text}}}}}
                 .dump() +
             "\n";
  }
  tmp.Write("emoji.jsonl", lines);
  const fs::path mistral =
      fs::path(testing::kSourceDir) / "tests/fixtures/tokenizers/mistral_bpe.json";
  EXPECT_GT(CompareCutsWithWholeExamples(
                tmp.path(), "emoji.jsonl",
                "tokenizer { kind: HF_JSON path: \"" + mistral.string() + "\" config: \"" +
                    (kChatData / "mistral_tokenizer_config.json").string() + "\" }"),
            40);
}

TEST(ChatLoaderTest, BadLinesAreErrorsNamingFileAndLine) {
  testing::TempDir tmp;
  tmp.Write("broken.jsonl", "{\"messages\": []}\n\n{not json\n");
  EXPECT_THAT(OpenChat(tmp.path(), "broken.jsonl").status().message(),
              HasSubstr("broken.jsonl:3: not valid JSON"));
  tmp.Write("speaker.jsonl", R"({"conversations": [{"from": "robot", "value": "x"}]})");
  EXPECT_THAT(OpenChat(tmp.path(), "speaker.jsonl").status().message(),
              HasSubstr("speaker.jsonl:1: conversations[0]: unknown speaker 'robot'"));
  tmp.Write("other.jsonl", R"({"text": "plain"})");
  EXPECT_THAT(OpenChat(tmp.path(), "other.jsonl").status().message(),
              HasSubstr("other.jsonl:1: holds no conversation"));
  tmp.Write("lonely.jsonl", R"({"messages": [{"role": "user", "content": "hello"}]})");
  EXPECT_THAT(
      OpenChat(tmp.path(), "lonely.jsonl", "skip_without_assistant: false").status().message(),
      HasSubstr("lonely.jsonl:1: the conversation has no assistant turn"));
  EXPECT_THAT(OpenChat(tmp.path(), "lonely.jsonl").status().message(),
              HasSubstr("gives no examples"));
  // A video without a video processor is refused by line, not trained on as text.
  tmp.Write("video.jsonl",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
            "\"assistant\", \"content\": \"b\"}]}\n"
            R"({"messages": [{"role": "user", "content": "<video>What happens?"}, )"
            R"({"role": "assistant", "content": "x"}], "videos": ["clip.mp4"]})");
  EXPECT_THAT(OpenChat(tmp.path(), "video.jsonl").status().message(),
              HasSubstr("video.jsonl:2: the line names videos, but there is no video processor"));
  tmp.Write("video_part.jsonl",
            R"({"messages": [{"role": "user", "content": [{"type": "video", "video": "c.mp4"}, )"
            R"({"type": "text", "text": "What?"}]}, {"role": "assistant", "content": "x"}]})");
  EXPECT_THAT(OpenChat(tmp.path(), "video_part.jsonl").status().message(),
              HasSubstr("video_part.jsonl:1: messages[0] holds a video content part"));
}

TEST(ChatLoaderTest, ARoleTheTemplateRefusesIsAnErrorNamingTheLine) {
  testing::TempDir tmp;
  tmp.Write("tool.jsonl",
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
            "\"assistant\", \"content\": \"b\"}]}\n"
            "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"tool\", "
            "\"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\n");
  const fs::path mistral =
      fs::path(testing::kSourceDir) / "tests/fixtures/tokenizers/mistral_bpe.json";
  auto message = testing::Options(
      ChatPlugin(), "path: \"tool.jsonl\" eval_fraction: 0 tokenizer { kind: HF_JSON path: \"" +
                        mistral.string() + "\" config: \"" +
                        (kChatData / "mistral_tokenizer_config.json").string() + "\" }");
  auto data = ChatPlugin().Open(*message, DataContext{tmp.path(), 1});
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("tool.jsonl:2:"));
  EXPECT_THAT(data.status().message(), HasSubstr("Only user and assistant roles are supported"));
  EXPECT_THAT(data.status().message(), HasSubstr("(at messages[1], role 'tool')"));
}

TEST(ChatLoaderTest, PaddedBatchLossIsTheTokenWeightedMeanOfItsExamples) {
  auto data = OpenChat(kChatData, "conversations.jsonl");
  ASSERT_TRUE(data.ok()) << data.status().message();
  const auto& loader = testing::BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader, "llama");
  auto options =
      testing::Options(loader, "hidden_size: 16 num_hidden_layers: 2 num_attention_heads: 2");
  auto model = loader.Create(*options, ModelContext{&(*data)->spec(), "/", 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto whole = (*model)->Forward(AllOf(**data));
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  double weighted = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < (*data)->size(Split::kTrain); ++i) {
    auto one = (*model)->Forward(*(*data)->GetBatch(Split::kTrain, {i}));
    ASSERT_TRUE(one.ok());
    weighted += one->loss.item<double>() * static_cast<double>(LossCountOf(*one));
    count += LossCountOf(*one);
  }
  EXPECT_EQ(LossCountOf(*whole), count);
  EXPECT_NEAR(whole->loss.item<double>(), weighted / static_cast<double>(count), 1e-5);
}

// The gradients of every parameter, by name, then cleared.
std::map<std::string, at::Tensor> TakeGradients(torch::nn::Module& module) {
  std::map<std::string, at::Tensor> grads;
  for (auto& item : module.named_parameters()) {
    if (!item.value().grad().defined()) continue;
    grads[item.key()] = item.value().grad().clone();
    item.value().mutable_grad().reset();
  }
  return grads;
}

TEST(ChatLoaderTest, PackedRowsGiveTheLossAndGradientsOfTheirConversationsOneByOne) {
  auto packed = OpenChat(kChatData, "conversations.jsonl", "eval_fraction: 0 packing: true");
  auto single = OpenChat(kChatData, "conversations.jsonl", "eval_fraction: 0");
  ASSERT_TRUE(packed.ok() && single.ok()) << packed.status().message();
  ASSERT_LT((*packed)->size(Split::kTrain), (*single)->size(Split::kTrain));
  EXPECT_THAT((*packed)->description(), HasSubstr("train conversations packed into " +
                                                  std::to_string((*packed)->size(Split::kTrain)) +
                                                  " rows of at most 1024 tokens"));
  const Batch rows = AllOf(**packed);
  // The mask numbers each row's conversations.
  EXPECT_GT(rows.at("attention_mask").max().item<int64_t>(), 1);

  const auto& loader = testing::BuiltinPlugin<ModelLoaderPlugin>(PluginKind::kModelLoader, "llama");
  auto options =
      testing::Options(loader, "hidden_size: 16 num_hidden_layers: 2 num_attention_heads: 2");
  auto model = loader.Create(*options, ModelContext{&(*packed)->spec(), "/", 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  torch::nn::Module& module = (*model)->module();

  auto whole = (*model)->Forward(rows);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  whole->loss.backward();
  const auto packed_grads = TakeGradients(module);

  int64_t count = 0;
  std::vector<std::pair<at::Tensor, int64_t>> losses;
  for (int64_t i = 0; i < (*single)->size(Split::kTrain); ++i) {
    auto one = (*model)->Forward(*(*single)->GetBatch(Split::kTrain, {i}));
    ASSERT_TRUE(one.ok());
    losses.emplace_back(one->loss, LossCountOf(*one));
    count += LossCountOf(*one);
  }
  at::Tensor weighted = at::zeros({}, at::kDouble);
  for (const auto& [loss, n] : losses) {
    weighted =
        weighted + loss.to(at::kDouble) * static_cast<double>(n) / static_cast<double>(count);
  }
  weighted.backward();
  const auto single_grads = TakeGradients(module);

  EXPECT_EQ(LossCountOf(*whole), count);
  EXPECT_NEAR(whole->loss.item<double>(), weighted.item<double>(), 1e-5);
  ASSERT_EQ(packed_grads.size(), single_grads.size());
  for (const auto& [name, grad] : packed_grads) {
    // f32 sums in another order: within 1e-4 of the gradient's largest element.
    const double scale = single_grads.at(name).abs().max().item<double>() + 1e-12;
    EXPECT_LT((grad - single_grads.at(name)).abs().max().item<double>() / scale, 1e-4) << name;
  }
}

}  // namespace
}  // namespace engine
