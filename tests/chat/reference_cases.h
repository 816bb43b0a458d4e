// The cases the chat template tests render: every template under a fixtures directory, with
// every conversation of its conversations.json, with and without a generation prompt, as
// transformers would pass them (messages, tools, documents, add_generation_prompt,
// bos_token/eos_token, date_string fixed so that Llama 3.x does not read the clock).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/chat_template.h"

namespace engine::chat {

struct ReferenceCase {
  std::string template_file;
  std::string conversation;
  nlohmann::ordered_json messages;
  ChatRenderOptions options;
  // Every variable the template sees, as ChatTemplate passes them (for the reference renderer).
  nlohmann::ordered_json variables;

  std::string Describe() const;
};

std::vector<ReferenceCase> ReferenceCases(const std::string& fixtures_dir);

}  // namespace engine::chat
