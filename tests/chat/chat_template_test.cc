// Conversations rendered for training: every assistant turn is located in the rendered text, its
// end-of-turn text included, on each template family; roles a template refuses or drops are
// errors naming the message.
#include "chat/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace engine::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

ChatTemplate Load(const std::string& file) {
  std::ifstream in(fs::path(ENGINE_CHAT_TEMPLATE_FIXTURES) / file);
  std::stringstream text;
  text << in.rdbuf();
  StatusOr<ChatTemplate> t =
      ChatTemplate::Parse(text.str(), file, {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

ordered_json Conversation(const std::string& name) {
  std::ifstream in(fs::path(ENGINE_CHAT_TEMPLATE_FIXTURES) / "conversations.json");
  return ordered_json::parse(in)[name];
}

ChatRenderOptions OptionsFor(const ordered_json& conversation) {
  ChatRenderOptions options;
  options.variables["date_string"] = "26 Jul 2024";
  if (conversation.contains("tools")) options.variables["tools"] = conversation["tools"];
  return options;
}

struct SpanCase {
  std::string template_file;
  std::string conversation;
  std::vector<std::pair<size_t, std::string>> spans;  // message index, span text
};

class AssistantSpansTest : public ::testing::TestWithParam<SpanCase> {};

TEST_P(AssistantSpansTest, EachAssistantTurnIsLocatedWithItsEndOfTurnText) {
  const SpanCase& c = GetParam();
  ChatTemplate t = Load(c.template_file);
  ordered_json conversation = Conversation(c.conversation);
  ChatRenderOptions options = OptionsFor(conversation);
  StatusOr<RenderedConversation> rendered = t.RenderForTraining(conversation["messages"], options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().message();
  // The text is the conversation as rendered without a generation prompt.
  EXPECT_EQ(rendered->text, *t.Render(conversation["messages"], options));
  std::vector<std::pair<size_t, std::string>> spans;
  for (const AssistantSpan& span : rendered->assistant_spans) {
    spans.emplace_back(span.message_index,
                       rendered->text.substr(span.begin, span.end - span.begin));
  }
  EXPECT_EQ(spans, c.spans);
}

const std::string kHello = "I'm doing great. How can I help you today?";
const std::string kJoke =
    "Why did the scarecrow win an award? Because he was outstanding in his field.";

INSTANTIATE_TEST_SUITE_P(
    Families, AssistantSpansTest,
    ::testing::Values(
        SpanCase{"chatml.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<|im_end|>\n"}, {3, kJoke + "<|im_end|>\n"}}},
        SpanCase{"Qwen2-7B-Instruct.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<|im_end|>\n"}, {3, kJoke + "<|im_end|>\n"}}},
        SpanCase{"Qwen2.5-7B-Instruct.jinja",
                 "tool_call",
                 {{2,
                   "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": "
                   "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n"
                   "</tool_call><|im_end|>\n"},
                  {4, "It is 22 °C in Paris.<|im_end|>\n"}}},
        // Qwen3 shows thinking only after the last user message: the earlier turn's span has
        // none, the last one has its (empty) think block.
        SpanCase{"Qwen3-0.6B.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<|im_end|>\n"},
                  {3, "<think>\n\n</think>\n\n" + kJoke + "<|im_end|>\n"}}},
        SpanCase{
            "Qwen3-0.6B.jinja",
            "reasoning",
            {{1, "4<|im_end|>\n"}, {3, "<think>\nThree plus three.\n</think>\n\n6<|im_end|>\n"}}},
        SpanCase{
            "SmolLM2-1.7B-Instruct.jinja", "system_only_first_turn", {{2, "Blue.<|im_end|>\n"}}},
        // SmolLM3 marks its turns with {% generation %}: the spans are what the blocks render.
        SpanCase{"SmolLM3-3B.jinja",
                 "no_system_ends_with_assistant",
                 {{1, "<|im_start|>assistant\n" + kHello + "<|im_end|>\n"},
                  {3, "<|im_start|>assistant\n" + kJoke + "<|im_end|>\n"}}},
        SpanCase{"Meta-Llama-3-8B-Instruct.jinja",
                 "system_multi_turn",
                 {{2, "The capital of France is Paris.<|eot_id|>"}}},
        SpanCase{"Llama-3.1-8B-Instruct.jinja",
                 "tool_call",
                 {{2,
                   "{\"name\": \"get_current_temperature\", \"parameters\": {\"location\": "
                   "\"Paris, France\", \"unit\": \"celsius\"}}<|eot_id|>"},
                  {4, "It is 22 °C in Paris.<|eot_id|>"}}},
        SpanCase{"Llama-3.2-11B-Vision-Instruct.jinja",
                 "multimodal_parts",
                 {{1, "A cat on a sofa.<|eot_id|>"}}},
        SpanCase{"Llama-2-7b-chat-hf.jinja",
                 "no_system_ends_with_assistant",
                 {{1, " " + kHello + " </s>"}, {3, " " + kJoke + " </s>"}}},
        SpanCase{"Mistral-7B-Instruct-v0.1.jinja", "system_only_first_turn", {{2, " Blue.</s>"}}},
        SpanCase{"Mistral-7B-Instruct-v0.2.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "</s>"}, {3, kJoke + "</s>"}}},
        SpanCase{"Mistral-7B-Instruct-v0.3.jinja",
                 "no_system_ends_with_assistant",
                 {{1, " " + kHello + " </s>"}, {3, " " + kJoke + " </s>"}}},
        SpanCase{"gemma-2-2b-it.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<end_of_turn>\n"}, {3, kJoke + "<end_of_turn>\n"}}},
        // Phi-3 ends the whole conversation with eos: inside the last span only.
        SpanCase{"Phi-3.5-mini-instruct.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<|end|>\n"}, {3, kJoke + "<|end|>\n</s>"}}},
        SpanCase{"zephyr-7b-beta.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "</s>\n"}, {3, kJoke + "</s>\n"}}},
        SpanCase{"DeepSeek-R1.jinja",
                 "no_system_ends_with_assistant",
                 {{1, kHello + "<｜end▁of▁sentence｜>"}, {3, kJoke + "<｜end▁of▁sentence｜>"}}}),
    [](const ::testing::TestParamInfo<SpanCase>& info) {
      std::string name = info.param.template_file + "_" + info.param.conversation;
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

TEST(ChatTemplateTest, ARoleTheTemplateRefusesIsItsErrorAtTheMessage) {
  ChatTemplate mistral = Load("Mistral-7B-Instruct-v0.2.jinja");
  StatusOr<std::string> rendered = mistral.Render(Conversation("consecutive_users")["messages"]);
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(),
            "Mistral-7B-Instruct-v0.2.jinja:1:125: the template raised an error: Conversation "
            "roles must alternate user/assistant/user/assistant/... (at messages[1], role "
            "'user')");

  ChatTemplate gemma = Load("gemma-2-2b-it.jinja");
  rendered = gemma.Render(Conversation("system_multi_turn")["messages"]);
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(),
            "gemma-2-2b-it.jinja:1:74: the template raised an error: System role not supported");
}

TEST(ChatTemplateTest, AMessageTheTemplateDropsIsAnErrorForTraining) {
  // Phi-3.5 renders system, user and assistant messages only.
  ordered_json messages = {{{"role", "user"}, {"content", "Weather?"}},
                           {{"role", "tool"}, {"content", "22 C"}},
                           {{"role", "assistant"}, {"content", "Warm."}}};
  ChatTemplate phi = Load("Phi-3.5-mini-instruct.jinja");
  ASSERT_TRUE(phi.Render(messages).ok());
  StatusOr<RenderedConversation> rendered = phi.RenderForTraining(messages);
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(),
            "messages[1] (role 'tool') does not appear in the text the chat template renders: the "
            "template leaves it out of this conversation (a role, or a place in the "
            "conversation, it does not render)");

  // Mistral v0.3 shows the system prompt only when the conversation ends with a user message.
  ChatTemplate mistral = Load("Mistral-7B-Instruct-v0.3.jinja");
  rendered = mistral.RenderForTraining(Conversation("system_only_first_turn")["messages"]);
  ASSERT_FALSE(rendered.ok());
  EXPECT_THAT(rendered.status().message(),
              ::testing::StartsWith("messages[0] (role 'system') does not appear"));
}

TEST(ChatTemplateTest, AConversationThatIsNotAListOfMessagesIsRefused) {
  ChatTemplate chatml = Load("chatml.jinja");
  EXPECT_EQ(chatml.Render(ordered_json::object()).status().message(),
            "messages must be a JSON array");
  EXPECT_EQ(chatml.Render(ordered_json::parse(R"([{"role": "user"}, {"content": "x"}])"))
                .status()
                .message(),
            "messages[1]: 'role' must be a string");
}

TEST(ChatTemplateTest, VariablesOverrideSpecialTokensAndToolsDefaultToNone) {
  StatusOr<ChatTemplate> t = ChatTemplate::Parse(
      "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ enable_thinking }}",
      "inline.jinja", {{"bos_token", "<s>"}});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t->Render(ordered_json::array()), "<s>|True|True|");
  ChatRenderOptions options;
  options.variables = {{"bos_token", "<|begin_of_text|>"}, {"enable_thinking", false}};
  EXPECT_EQ(*t->Render(ordered_json::array(), options), "<|begin_of_text|>|True|True|False");
}

TEST(ChatTemplateTest, StrftimeNowFormatsTheGivenTime) {
  ChatTemplate llama = Load("Llama-3.2-11B-Vision-Instruct.jinja");
  ChatRenderOptions options;
  options.now = [] {
    std::tm t{};
    t.tm_year = 2025 - 1900;
    t.tm_mon = 1;
    t.tm_mday = 3;
    return t;
  };
  StatusOr<std::string> rendered = llama.Render(Conversation("single_user")["messages"], options);
  ASSERT_TRUE(rendered.ok()) << rendered.status().message();
  EXPECT_THAT(*rendered, ::testing::HasSubstr("Today Date: 03 Feb 2025\n"));
}

}  // namespace
}  // namespace engine::chat
