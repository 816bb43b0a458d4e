// ChatTemplate::RenderForTraining: where each assistant turn lies in the rendered conversation.
//
// A template marks its assistant output with {% generation %} blocks, or it does not (most do
// not). With the blocks, the spans are what they rendered, as transformers'
// return_assistant_tokens_mask takes them. Without, a turn is found by rendering prefixes of the
// conversation, as TRL and OpenRLHF do, and checked against the full rendering:
//
//   begin: the end of messages[:k] rendered with the generation prompt (the assistant header),
//          where that rendering is a prefix of the full one (else where the two part);
//   end:   the end of messages[:k+1] rendered without it, where that is a prefix of the full
//          rendering. Templates that render a turn differently when it is the last one (Qwen3
//          shows the thinking of the last turn only; Phi-3 appends eos at the very end) get the
//          end from where the message's content ends in the full rendering, found by changing
//          the content and comparing, plus as much of the text that follows the content in the
//          prefix rendering (the end-of-turn text) as the full rendering also has there, never
//          ending inside a UTF-8 character or a <...> tag.
//
// Either way the end-of-turn text (<|im_end|>, <|eot_id|>, </s>, ...) is inside the span, so a
// model trained on the spans learns to stop. A message whose content does not appear in the
// rendering at all (a role the template silently drops) is an error, as is a turn that cannot
// be located exactly.
#include <algorithm>
#include <optional>

#include "chat/chat_template.h"

namespace engine::chat {
namespace {

using nlohmann::ordered_json;

// A character no template adds or strips (a private-use code point, not whitespace).
constexpr std::string_view kMarker = "\xEE\x80\x80";

size_t CommonPrefix(std::string_view a, std::string_view b) {
  size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Moves a span end found by comparing characters back to a boundary the tokenizer cannot split:
// not inside a UTF-8 sequence, and not inside a tag such as "<|user|>" that merely begins like
// the end-of-turn text ("<|end|>\n</s>" and "<|end|>\n<|user|>" share "<|end|>\n<").
size_t BackToBoundary(std::string_view text, size_t from, size_t end) {
  while (end > from && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  size_t open = text.substr(0, end).rfind('<');
  if (open != std::string_view::npos && open >= from &&
      text.substr(open, end - open).find('>') == std::string_view::npos) {
    end = open;
  }
  return end;
}

bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

std::string Where(const ordered_json& messages, size_t index) {
  return "messages[" + std::to_string(index) + "] (role '" +
         messages[index]["role"].get<std::string>() + "')";
}

// The conversation with kMarker appended to message `index`'s text (its string content, or the
// last text part of a list), or nullopt when it has no text.
std::optional<ordered_json> WithMarker(const ordered_json& messages, size_t index) {
  ordered_json marked = messages;
  ordered_json& content = marked[index]["content"];
  if (content.is_string()) {
    content = content.get<std::string>() + std::string(kMarker);
    return marked;
  }
  if (content.is_array()) {
    for (auto part = content.rbegin(); part != content.rend(); ++part) {
      if (part->is_object() && part->contains("text") && (*part)["text"].is_string()) {
        (*part)["text"] = (*part)["text"].get<std::string>() + std::string(kMarker);
        return marked;
      }
    }
  }
  return std::nullopt;
}

bool HasText(const ordered_json& message) {
  auto content = message.find("content");
  if (content == message.end()) return false;
  if (content->is_string()) return !content->get<std::string>().empty();
  return content->is_array() && WithMarker(ordered_json::array({message}), 0).has_value();
}

// Where the text of message `index` ends in `rendered` (a rendering of `conversation`), found by
// rendering it again with a marker in that message's content.
StatusOr<size_t> ContentEnd(const ChatTemplate& chat, const ordered_json& messages,
                            const ordered_json& conversation, size_t index,
                            const std::string& rendered, const ChatRenderOptions& plain) {
  std::optional<ordered_json> marked = WithMarker(conversation, index);
  if (!marked) {
    return InvalidArgumentError(Where(messages, index) + " has no text content to locate");
  }
  ENGINE_ASSIGN_OR_RETURN(std::string with_marker, chat.Render(*marked, plain));
  size_t at = CommonPrefix(rendered, with_marker);
  if (with_marker != rendered.substr(0, at) + std::string(kMarker) + rendered.substr(at)) {
    return InvalidArgumentError(
        "cannot locate " + Where(messages, index) +
        " in the rendered text: the template changes the content in more than one place");
  }
  return at;
}

// Every message with text must show in the rendering: a template that drops a role would
// otherwise train on a conversation the user did not write.
Status CheckEveryMessageShows(const ChatTemplate& chat, const ordered_json& messages,
                              const std::string& text, const ChatRenderOptions& plain) {
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!HasText(messages[i])) continue;
    std::optional<ordered_json> marked = WithMarker(messages, i);
    ENGINE_ASSIGN_OR_RETURN(std::string with_marker, chat.Render(*marked, plain));
    if (with_marker == text) {
      return InvalidArgumentError(Where(messages, i) +
                                  " does not appear in the text the chat template renders: the "
                                  "template leaves it out of this conversation (a role, or a "
                                  "place in the conversation, it does not render)");
    }
  }
  return Status::Ok();
}

// Assistant message k's span in `text`: from the end of the conversation before it rendered with
// the generation prompt to the end of the conversation through it (or, where a turn renders
// otherwise as the last message, the end found from its content).
StatusOr<std::pair<size_t, size_t>> PrefixSpan(const ChatTemplate& chat,
                                               const ordered_json& messages, size_t k,
                                               const std::string& text,
                                               const ChatRenderOptions& plain,
                                               const ChatRenderOptions& prompted) {
  ordered_json before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(k));
  ordered_json through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(k + 1));
  if (before.is_null()) before = ordered_json::array();
  StatusOr<std::string> prompt = chat.Render(before, prompted);
  if (!prompt.ok()) {
    return prompt.status().WithContext("rendering the messages before " + Where(messages, k));
  }
  ENGINE_ASSIGN_OR_RETURN(std::string turn, chat.Render(through, plain));
  const size_t begin = StartsWith(text, *prompt) ? prompt->size() : CommonPrefix(text, *prompt);
  if (StartsWith(text, turn)) return std::make_pair(begin, turn.size());
  ENGINE_ASSIGN_OR_RETURN(size_t full_content_end,
                          ContentEnd(chat, messages, messages, k, text, plain));
  ENGINE_ASSIGN_OR_RETURN(size_t turn_content_end,
                          ContentEnd(chat, messages, through, k, turn, plain));
  const size_t end = BackToBoundary(
      text, full_content_end,
      full_content_end + CommonPrefix(std::string_view(text).substr(full_content_end),
                                      std::string_view(turn).substr(turn_content_end)));
  if (begin > full_content_end) {
    return InvalidArgumentError("cannot locate " + Where(messages, k) +
                                ": its content ends before the generation prompt does");
  }
  return std::make_pair(begin, end);
}

}  // namespace

StatusOr<RenderedConversation> ChatTemplate::RenderForTraining(
    const ordered_json& messages, const ChatRenderOptions& options) const {
  ChatRenderOptions plain = options;
  plain.add_generation_prompt = false;
  ChatRenderOptions prompted = options;
  prompted.add_generation_prompt = true;
  ENGINE_ASSIGN_OR_RETURN(jinja::RenderOutput full, RenderOutput(messages, plain));
  RenderedConversation result;
  result.text = std::move(full.text);
  ENGINE_RETURN_IF_ERROR(CheckEveryMessageShows(*this, messages, result.text, plain));

  std::vector<size_t> assistants;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] == "assistant") assistants.push_back(i);
  }
  if (jinja_template().has_generation_blocks()) {
    if (full.generation_spans.size() != assistants.size()) {
      return InvalidArgumentError("the chat template's {% generation %} blocks rendered " +
                                  std::to_string(full.generation_spans.size()) + " spans for " +
                                  std::to_string(assistants.size()) + " assistant messages");
    }
    for (size_t k = 0; k < assistants.size(); ++k) {
      result.assistant_spans.push_back(
          {assistants[k], full.generation_spans[k].first, full.generation_spans[k].second});
    }
    return result;
  }
  size_t previous_end = 0;
  for (size_t k : assistants) {
    ENGINE_ASSIGN_OR_RETURN(auto span,
                            PrefixSpan(*this, messages, k, result.text, plain, prompted));
    const auto [begin, end] = span;
    if (begin < previous_end || end <= begin) {
      return InvalidArgumentError("cannot locate " + Where(messages, k) +
                                  " in the rendered text: rendering the conversation up to it "
                                  "does not give a prefix of the whole");
    }
    result.assistant_spans.push_back({k, begin, end});
    previous_end = end;
  }
  return result;
}

}  // namespace engine::chat
