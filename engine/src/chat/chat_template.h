// A model's chat template: conversations rendered exactly as transformers'
// `tokenizer.apply_chat_template(messages, tokenize=False, ...)` renders them, and, for training,
// where each assistant turn lies in that text.
//
// A conversation is a JSON array of message objects as users and the OpenAI/TRL formats write
// them: {"role": "user", "content": "..."}; `content` may be a string, null, or a list of parts
// ({"type": "text", "text": ...}, {"type": "image"}, ...); other keys (tool_calls,
// reasoning_content, name, ...) pass through to the template untouched.
//
// The template sees what transformers gives it: messages, tools and documents (None unless
// given), add_generation_prompt, the tokenizer's special tokens (bos_token, eos_token, ...), then
// any extra variables (enable_thinking, date_string, ...), which override special tokens.
//
// Failure: a template that does not parse is refused by Parse; a render error names the
// template, line and column, and for errors inside the loop over messages the message
// ("NAME:1:211: the template raised an error: Conversation roles must alternate ... (at
// messages[1], role 'system')").
//
// Thread safety: a ChatTemplate is immutable; render from any number of threads.
#pragma once

#include <ctime>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"
#include "jinja/template.h"

namespace engine::chat {

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  // Template variables beyond messages and add_generation_prompt: special tokens, tools,
  // documents, enable_thinking, ... A key set here wins over the template's special tokens.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  // The local time strftime_now() sees; the system clock when unset.
  std::function<std::tm()> now;
};

// One assistant turn in a rendered conversation: [begin, end) byte offsets of the text the model
// should learn to produce, the end-of-turn text (<|im_end|>, <|eot_id|>, </s>, ...) included.
struct AssistantSpan {
  size_t message_index;
  size_t begin;
  size_t end;
};

struct RenderedConversation {
  std::string text;
  std::vector<AssistantSpan> assistant_spans;
};

class ChatTemplate {
 public:
  // `name` names the template in errors (a file, or "DIR/tokenizer_config.json#chat_template").
  // `special_tokens` is a JSON object of the tokenizer's special tokens as strings.
  static StatusOr<ChatTemplate> Parse(
      std::string_view source, std::string name,
      nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());

  // The conversation as the template renders it.
  StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                               const ChatRenderOptions& options = {}) const;

  // The conversation rendered without a generation prompt, with every assistant message's span
  // (see assistant_spans.h for how they are found). Fails, naming the message, when a message
  // does not appear in the rendering (a role the template drops) or when a span cannot be
  // located exactly.
  StatusOr<RenderedConversation> RenderForTraining(const nlohmann::ordered_json& messages,
                                                   const ChatRenderOptions& options = {}) const;

  const std::string& name() const { return template_.name(); }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  const jinja::Template& jinja_template() const { return template_; }

  // The raw render: text and {% generation %} spans.
  StatusOr<jinja::RenderOutput> RenderOutput(const nlohmann::ordered_json& messages,
                                             const ChatRenderOptions& options) const;

 private:
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;
};

// Checks that `messages` is a conversation: an array of objects each with a string "role".
// Errors name the message: "messages[2]: 'role' must be a string".
Status ValidateConversation(const nlohmann::ordered_json& messages);

}  // namespace engine::chat
