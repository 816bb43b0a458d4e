#include "conversation_formats.h"

#include <map>

#include "data_line.h"
#include "engine/image_tokens.h"

namespace engine::plugins {
namespace {

using nlohmann::ordered_json;

ordered_json Message(const std::string& role, const ordered_json& content) {
  return ordered_json{{"role", role}, {"content", content}};
}

// ShareGPT's speakers as chat roles.
const std::map<std::string, std::string>& ShareGptRoles() {
  static const auto* roles = new std::map<std::string, std::string>{
      {"human", "user"},        {"user", "user"},
      {"gpt", "assistant"},     {"assistant", "assistant"},
      {"chatgpt", "assistant"}, {"model", "assistant"},
      {"bing", "assistant"},    {"system", "system"},
      {"tool", "tool"},         {"function_call", "assistant"},
      {"observation", "tool"}};
  return *roles;
}

Status LineError(const std::string& where, const std::string& problem) {
  return DataLossError(where + ": " + problem);
}

StatusOr<ordered_json> FromMessages(const ordered_json& list, const std::string& where) {
  if (!list.is_array()) return LineError(where, "'messages' must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const ordered_json& message = list[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) return LineError(where, at + " must be an object");
    if (!message.contains("role") || !message["role"].is_string()) {
      return LineError(where, at + " has no string 'role'");
    }
    if (!message.contains("content")) return LineError(where, at + " has no 'content'");
  }
  return list;
}

StatusOr<ordered_json> FromShareGpt(const ordered_json& json, const std::string& where) {
  const ordered_json& turns = json["conversations"];
  if (!turns.is_array()) return LineError(where, "'conversations' must be a list");
  ordered_json messages = ordered_json::array();
  if (json.contains("system") && json["system"].is_string() &&
      !json["system"].get<std::string>().empty()) {
    messages.push_back(Message("system", json["system"]));
  }
  for (size_t i = 0; i < turns.size(); ++i) {
    const ordered_json& turn = turns[i];
    const std::string at = "conversations[" + std::to_string(i) + "]";
    if (!turn.is_object() || !turn.contains("from") || !turn["from"].is_string() ||
        !turn.contains("value")) {
      return LineError(where, at + " must be {\"from\": ..., \"value\": ...}");
    }
    const std::string from = turn["from"].get<std::string>();
    const auto role = ShareGptRoles().find(from);
    if (role == ShareGptRoles().end()) {
      return LineError(where, at + ": unknown speaker '" + from +
                                  "' (known: human, user, gpt, assistant, chatgpt, model, system, "
                                  "tool, function_call, observation)");
    }
    messages.push_back(Message(role->second, turn["value"]));
  }
  return messages;
}

StatusOr<ordered_json> FromAlpaca(const ordered_json& json, const std::string& where) {
  for (const char* key : {"instruction", "output"}) {
    if (!json[key].is_string())
      return LineError(where, std::string("'") + key + "' must be a string");
  }
  std::string prompt = json["instruction"].get<std::string>();
  if (json.contains("input") && !json["input"].is_null()) {
    if (!json["input"].is_string()) return LineError(where, "'input' must be a string");
    const std::string input = json["input"].get<std::string>();
    if (!input.empty()) prompt += "\n\n" + input;
  }
  ordered_json messages = ordered_json::array();
  if (json.contains("system") && json["system"].is_string() &&
      !json["system"].get<std::string>().empty()) {
    messages.push_back(Message("system", json["system"]));
  }
  messages.push_back(Message("user", prompt));
  messages.push_back(Message("assistant", json["output"]));
  return messages;
}

// "images": [...] or "image": "..." / [...].
Status ReadImagePaths(const ordered_json& json, const std::string& where,
                      std::vector<std::string>* images) {
  for (const char* key : {"images", "image"}) {
    auto it = json.find(key);
    if (it == json.end() || it->is_null()) continue;
    if (!images->empty()) return LineError(where, "names images under both 'images' and 'image'");
    const ordered_json list = it->is_array() ? *it : ordered_json::array({*it});
    for (const ordered_json& image : list) {
      if (!image.is_string() || image.get<std::string>().empty()) {
        return LineError(where, std::string("'") + key + "' must hold image paths (strings), not " +
                                    image.dump());
      }
      images->push_back(image.get<std::string>());
    }
  }
  return Status::Ok();
}

// A {"type": "video"} content part is refused: videos are named by "videos" and shown at <video>.
Status RefuseVideoParts(const ordered_json& messages, const std::string& where) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& content =
        messages[i].contains("content") ? messages[i]["content"] : ordered_json();
    if (!content.is_array()) continue;
    for (const ordered_json& part : content) {
      if (part.is_object() && (part.value("type", "") == "video" || part.contains("video"))) {
        return LineError(where, "messages[" + std::to_string(i) +
                                    "] holds a video content part; name videos in \"videos\" "
                                    "and show them where the text says <video>");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view ConversationFormatName(ConversationFormat format) {
  switch (format) {
    case ConversationFormat::kMessages:
      return "messages";
    case ConversationFormat::kShareGpt:
      return "sharegpt";
    case ConversationFormat::kAlpaca:
      return "alpaca";
  }
  return "?";
}

StatusOr<ParsedConversation> ParseConversationLine(std::string_view line,
                                                   const std::string& where) {
  ENGINE_ASSIGN_OR_RETURN(ordered_json json, ParseDataLine<ordered_json>(line, where));
  ParsedConversation parsed;
  if (json.contains("messages")) {
    parsed.format = ConversationFormat::kMessages;
    ENGINE_ASSIGN_OR_RETURN(parsed.messages, FromMessages(json["messages"], where));
  } else if (json.contains("conversations")) {
    parsed.format = ConversationFormat::kShareGpt;
    ENGINE_ASSIGN_OR_RETURN(parsed.messages, FromShareGpt(json, where));
  } else if (json.contains("instruction") && json.contains("output")) {
    parsed.format = ConversationFormat::kAlpaca;
    ENGINE_ASSIGN_OR_RETURN(parsed.messages, FromAlpaca(json, where));
  } else {
    return LineError(where,
                     "holds no conversation: expected \"messages\" (OpenAI/TRL), "
                     "\"conversations\" (ShareGPT) or \"instruction\" and \"output\" "
                     "(alpaca)");
  }
  ENGINE_RETURN_IF_ERROR(RefuseVideoParts(parsed.messages, where));
  ENGINE_RETURN_IF_ERROR(ReadImagePaths(json, where, &parsed.images));
  StatusOr<std::vector<std::vector<std::string>>> videos = LineVideos(json);
  if (!videos.ok()) return LineError(where, videos.status().message());
  parsed.videos = std::move(*videos);
  return parsed;
}

bool HasAssistantTurn(const nlohmann::ordered_json& messages) {
  for (const auto& message : messages) {
    if (message.value("role", "") == "assistant") return true;
  }
  return false;
}

}  // namespace engine::plugins
