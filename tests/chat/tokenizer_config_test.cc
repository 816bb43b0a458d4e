// Chat templates and special tokens read from tokenizer directories as transformers reads them.
#include "chat/tokenizer_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/remove_tree.h"

namespace engine::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

class TokenizerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("engine_tokenizer_config_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    RemoveTree(dir_, ec);
  }
  void Write(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(TokenizerConfigTest, ReadsAStringTemplateAndAddedTokenSpecialTokens) {
  Write("tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false, "normalized": false},
    "eos_token": "</s>", "pad_token": null, "unk_token": {"content": "<unk>"},
    "additional_special_tokens": ["<|im_start|>", {"content": "<|im_end|>"}],
    "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
  })");
  StatusOr<TokenizerChatConfig> config = ReadTokenizerChatConfig(dir_);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->special_tokens.dump(),
            R"({"bos_token":"<s>","eos_token":"</s>","unk_token":"<unk>",)"
            R"("additional_special_tokens":["<|im_start|>","<|im_end|>"]})");
  StatusOr<ChatTemplate> t = config->Load();
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->name(), (dir_ / "tokenizer_config.json").string() + "#chat_template");
  EXPECT_EQ(*t->Render(ordered_json::parse(R"([{"role": "user", "content": "hi"}])")), "<s>hi</s>");
  // The file itself names the same tokenizer.
  ASSERT_TRUE(ReadTokenizerChatConfig(dir_ / "tokenizer_config.json").ok());
}

TEST_F(TokenizerConfigTest, NamedTemplatesAreSelectedAsTransformersSelectsThem) {
  Write("tokenizer_config.json", R"({"chat_template": [
    {"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"},
    {"name": "rag", "template": "documents"}]})");
  StatusOr<TokenizerChatConfig> config = ReadTokenizerChatConfig(dir_);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->Select("", false)->text, "plain");
  EXPECT_EQ(config->Select("", true)->text, "tools");
  EXPECT_EQ(config->Select("rag", false)->text, "documents");
  EXPECT_EQ(config->Select("rag", false)->origin,
            (dir_ / "tokenizer_config.json").string() + "#chat_template[rag]");
  EXPECT_EQ(config->Select("chatml", false).status().message(),
            "no chat template named 'chatml' (the tokenizer has: default, tool_use, rag)");
}

TEST_F(TokenizerConfigTest, ChatTemplateJinjaBesideTheConfigReplacesTheDefault) {
  Write("tokenizer_config.json", R"({"chat_template": "old", "eos_token": "</s>"})");
  Write("chat_template.jinja", "{{ eos_token }}new\n");
  Write("additional_chat_templates/tool_use.jinja", "tools");
  StatusOr<TokenizerChatConfig> config = ReadTokenizerChatConfig(dir_);
  ASSERT_TRUE(config.ok()) << config.status().message();
  EXPECT_EQ(config->Select("", false)->origin, (dir_ / "chat_template.jinja").string());
  EXPECT_EQ(*config->Load()->Render(ordered_json::array()), "</s>new");
  EXPECT_EQ(config->Select("", true)->text, "tools");
}

TEST_F(TokenizerConfigTest, BadConfigsAreErrorsNamingTheFileAndField) {
  const std::string file = (dir_ / "tokenizer_config.json").string();
  Write("tokenizer_config.json", "{not json");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_).status().message(), file + ": not a JSON object");
  Write("tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_).status().message(),
            file +
                ": 'chat_template' must be a string or a list of {\"name\", \"template\"} "
                "objects");
  Write("tokenizer_config.json", R"({"chat_template": [{"name": "default"}]})");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_).status().message(),
            file + ": chat_template[0] must be an object with string 'name' and 'template'");
  Write("tokenizer_config.json", R"({"chat_template": "x", "bos_token": 1})");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_).status().message(),
            file + ": 'bos_token' must be a string or an object with a string 'content'");
  Write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_).status().message(),
            dir_.string() +
                " has no chat template: tokenizer_config.json has no 'chat_template' and there "
                "is no chat_template.jinja");
  EXPECT_EQ(ReadTokenizerChatConfig(dir_ / "missing").status().message(),
            "'" + (dir_ / "missing").string() + "' does not exist");
}

TEST_F(TokenizerConfigTest, ATemplateThatDoesNotParseNamesItsOrigin) {
  Write("tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}\n{{ m | nofilter }}"})");
  StatusOr<TokenizerChatConfig> config = ReadTokenizerChatConfig(dir_);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(
      config->Load().status().message(),
      (dir_ / "tokenizer_config.json").string() + "#chat_template:2:8: no filter named 'nofilter'");
}

}  // namespace
}  // namespace engine::chat
