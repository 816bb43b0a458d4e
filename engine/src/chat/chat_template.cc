#include "chat/chat_template.h"

#include <unordered_map>

namespace engine::chat {

using jinja::Value;
using jinja::ValueDict;

StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, std::string name,
                                           nlohmann::ordered_json special_tokens) {
  ENGINE_ASSIGN_OR_RETURN(jinja::Template parsed, jinja::Template::Parse(source, std::move(name)));
  ChatTemplate t;
  t.template_ = std::move(parsed);
  t.special_tokens_ =
      special_tokens.is_object() ? std::move(special_tokens) : nlohmann::ordered_json::object();
  return t;
}

Status ValidateConversation(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return InvalidArgumentError("messages must be a JSON array");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) return InvalidArgumentError(where + " must be a JSON object");
    auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      return InvalidArgumentError(where + ": 'role' must be a string");
    }
  }
  return Status::Ok();
}

StatusOr<jinja::RenderOutput> ChatTemplate::RenderOutput(const nlohmann::ordered_json& messages,
                                                         const ChatRenderOptions& options) const {
  ENGINE_RETURN_IF_ERROR(ValidateConversation(messages));
  Value conversation = Value::FromJson(messages);
  // Each message dict is shared by every list that holds it (messages[1:] too), so its identity
  // names it in errors.
  std::unordered_map<const void*, size_t> message_index;
  for (size_t i = 0; i < conversation.as_list().size(); ++i) {
    message_index[conversation.as_list()[i].identity()] = i;
  }
  ValueDict variables = {
      {"messages", conversation},
      {"tools", Value::None()},
      {"documents", Value::None()},
      {"add_generation_prompt", Value::Bool(options.add_generation_prompt)},
  };
  auto set = [&variables](const std::string& key, Value value) {
    for (auto& [k, v] : variables) {
      if (k == key) {
        v = std::move(value);
        return;
      }
    }
    variables.emplace_back(key, std::move(value));
  };
  for (const auto& [key, value] : special_tokens_.items()) set(key, Value::FromJson(value));
  if (options.variables.is_object()) {
    for (const auto& [key, value] : options.variables.items()) set(key, Value::FromJson(value));
  }
  jinja::RenderHooks hooks;
  hooks.now = options.now;
  hooks.describe_loop_item = [&message_index,
                              &messages](const Value& item) -> std::optional<std::string> {
    auto found = message_index.find(item.identity());
    if (item.identity() == nullptr || found == message_index.end()) return std::nullopt;
    return "messages[" + std::to_string(found->second) + "], role '" +
           messages[found->second]["role"].get<std::string>() + "'";
  };
  return template_.Render(std::move(variables), hooks);
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                           const ChatRenderOptions& options) const {
  ENGINE_ASSIGN_OR_RETURN(jinja::RenderOutput output, RenderOutput(messages, options));
  return std::move(output.text);
}

}  // namespace engine::chat
