#include "chat/tokenizer_config.h"

#include <algorithm>

#include "engine/untrusted_file.h"

namespace engine::chat {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

constexpr const char kConfigFile[] = "tokenizer_config.json";
constexpr const char kTemplateFile[] = "chat_template.jinja";
constexpr const char kAdditionalTemplatesDir[] = "additional_chat_templates";

// A special token's text: a string, or an AddedToken object's "content"; nullopt for null.
StatusOr<std::optional<std::string>> TokenText(const ordered_json& value,
                                               const std::string& where) {
  if (value.is_null()) return std::optional<std::string>();
  if (value.is_string()) return std::optional<std::string>(value.get<std::string>());
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return std::optional<std::string>(value["content"].get<std::string>());
  }
  return InvalidArgumentError(where + " must be a string or an object with a string 'content'");
}

void Put(std::vector<NamedChatTemplate>& templates, NamedChatTemplate t) {
  for (NamedChatTemplate& existing : templates) {
    if (existing.name == t.name) {
      existing = std::move(t);
      return;
    }
  }
  templates.push_back(std::move(t));
}

Status ReadConfigTemplates(const ordered_json& config, const std::string& file,
                           TokenizerChatConfig& out) {
  auto found = config.find("chat_template");
  if (found == config.end() || found->is_null()) return Status::Ok();
  const std::string origin = file + "#chat_template";
  if (found->is_string()) {
    Put(out.templates, {"default", found->get<std::string>(), origin});
    return Status::Ok();
  }
  if (!found->is_array()) {
    return InvalidArgumentError(
        file + ": 'chat_template' must be a string or a list of {\"name\", \"template\"} objects");
  }
  for (size_t i = 0; i < found->size(); ++i) {
    const ordered_json& item = (*found)[i];
    if (!item.is_object() || !item.contains("name") || !item["name"].is_string() ||
        !item.contains("template") || !item["template"].is_string()) {
      return InvalidArgumentError(file + ": chat_template[" + std::to_string(i) +
                                  "] must be an object with string 'name' and 'template'");
    }
    std::string name = item["name"].get<std::string>();
    Put(out.templates, {name, item["template"].get<std::string>(), origin + "[" + name + "]"});
  }
  return Status::Ok();
}

Status ReadSpecialTokens(const ordered_json& config, const std::string& file,
                         TokenizerChatConfig& out) {
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    auto found = config.find(key);
    if (found == config.end()) continue;
    ENGINE_ASSIGN_OR_RETURN(std::optional<std::string> text,
                            TokenText(*found, file + ": '" + key + "'"));
    if (text) out.special_tokens[key] = *text;
  }
  auto additional = config.find("additional_special_tokens");
  if (additional != config.end() && !additional->is_null()) {
    if (!additional->is_array()) {
      return InvalidArgumentError(file + ": 'additional_special_tokens' must be a list");
    }
    ordered_json tokens = ordered_json::array();
    for (size_t i = 0; i < additional->size(); ++i) {
      ENGINE_ASSIGN_OR_RETURN(std::optional<std::string> text,
                              TokenText((*additional)[i], file + ": 'additional_special_tokens[" +
                                                              std::to_string(i) + "]'"));
      if (text) tokens.push_back(*text);
    }
    out.special_tokens["additional_special_tokens"] = std::move(tokens);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<TokenizerChatConfig> ReadTokenizerChatConfig(const fs::path& path) {
  std::error_code error;
  const bool is_dir = fs::is_directory(path, error);
  const fs::path dir = is_dir ? path : path.parent_path();
  const fs::path config_file = is_dir ? path / kConfigFile : path;
  TokenizerChatConfig out;
  if (fs::exists(config_file, error)) {
    ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(config_file, FileKind::kConfig));
    ordered_json config = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return InvalidArgumentError(config_file.string() + ": not a JSON object");
    }
    ENGINE_RETURN_IF_ERROR(ReadConfigTemplates(config, config_file.string(), out));
    ENGINE_RETURN_IF_ERROR(ReadSpecialTokens(config, config_file.string(), out));
  } else if (!is_dir || !fs::exists(dir / kTemplateFile, error)) {
    return NotFoundError("'" + config_file.string() + "' does not exist");
  }
  if (fs::exists(dir / kTemplateFile, error)) {
    ENGINE_ASSIGN_OR_RETURN(std::string text,
                            ReadUntrustedFile(dir / kTemplateFile, FileKind::kTemplate));
    Put(out.templates, {"default", text, (dir / kTemplateFile).string()});
  }
  if (fs::is_directory(dir / kAdditionalTemplatesDir, error)) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir / kAdditionalTemplatesDir)) {
      if (entry.path().extension() == ".jinja") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      ENGINE_ASSIGN_OR_RETURN(std::string text, ReadUntrustedFile(file, FileKind::kTemplate));
      Put(out.templates, {file.stem().string(), text, file.string()});
    }
  }
  if (out.templates.empty()) {
    return NotFoundError(dir.string() + " has no chat template: " + kConfigFile +
                         " has no 'chat_template' and there is no " + kTemplateFile);
  }
  return out;
}

StatusOr<NamedChatTemplate> TokenizerChatConfig::Select(const std::string& name,
                                                        bool with_tools) const {
  auto find = [this](const std::string& wanted) -> const NamedChatTemplate* {
    for (const NamedChatTemplate& t : templates) {
      if (t.name == wanted) return &t;
    }
    return nullptr;
  };
  std::string available;
  for (const NamedChatTemplate& t : templates)
    available += (available.empty() ? "" : ", ") + t.name;
  if (!name.empty()) {
    if (const NamedChatTemplate* t = find(name)) return *t;
    return NotFoundError("no chat template named '" + name + "' (the tokenizer has: " + available +
                         ")");
  }
  if (with_tools) {
    if (const NamedChatTemplate* t = find("tool_use")) return *t;
  }
  if (const NamedChatTemplate* t = find("default")) return *t;
  return NotFoundError(
      "the tokenizer has several chat templates and none is named 'default': name the one to "
      "use (the tokenizer has: " +
      available + ")");
}

StatusOr<ChatTemplate> TokenizerChatConfig::Load(const std::string& name, bool with_tools) const {
  ENGINE_ASSIGN_OR_RETURN(NamedChatTemplate selected, Select(name, with_tools));
  return ChatTemplate::Parse(selected.text, selected.origin, special_tokens);
}

}  // namespace engine::chat
