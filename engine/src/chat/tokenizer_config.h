// The chat templates and special tokens of a Hugging Face tokenizer directory, read as
// transformers reads them:
//
//   - tokenizer_config.json's "chat_template": a string (the default template), or a list of
//     {"name": ..., "template": ...} (named templates, "default" and "tool_use" among them);
//   - chat_template.jinja beside it (how newer hub repositories ship the template) replaces the
//     default, and additional_chat_templates/NAME.jinja adds named ones;
//   - the special tokens (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
//     mask_token, additional_special_tokens) as strings or AddedToken objects
//     ({"content": "<s>", "lstrip": false, ...}); null ones are left out, as transformers leaves
//     them out of the template's variables.
//
// Failure: a missing file, JSON that does not parse, a field of the wrong type, or no chat
// template at all is an error naming the file and field.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "engine/status.h"

namespace engine::chat {

struct NamedChatTemplate {
  std::string name;    // "default", "tool_use", ...
  std::string text;    // the Jinja source
  std::string origin;  // where it came from, for errors: "DIR/tokenizer_config.json#chat_template"
};

struct TokenizerChatConfig {
  std::vector<NamedChatTemplate> templates;
  // {"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": [...], ...}
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();

  // The template transformers' apply_chat_template picks: `name` when given; otherwise
  // "tool_use" when the conversation comes with tools and there is one, else "default".
  StatusOr<NamedChatTemplate> Select(const std::string& name, bool with_tools) const;
  // The selected template, parsed, with these special tokens.
  StatusOr<ChatTemplate> Load(const std::string& name = "", bool with_tools = false) const;
};

// `path` is a tokenizer directory or its tokenizer_config.json.
StatusOr<TokenizerChatConfig> ReadTokenizerChatConfig(const std::filesystem::path& path);

}  // namespace engine::chat
