#include "chat/reference_cases.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace engine::chat {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string ReferenceCase::Describe() const {
  return fs::path(template_file).filename().string() + " on '" + conversation +
         "', add_generation_prompt=" + (options.add_generation_prompt ? "true" : "false");
}

std::vector<ReferenceCase> ReferenceCases(const std::string& fixtures_dir) {
  std::ifstream in(fs::path(fixtures_dir) / "conversations.json");
  ordered_json conversations = ordered_json::parse(in);
  std::vector<std::string> templates;
  for (const auto& entry : fs::directory_iterator(fixtures_dir)) {
    if (entry.path().extension() == ".jinja") templates.push_back(entry.path().string());
  }
  std::sort(templates.begin(), templates.end());
  const ordered_json special_tokens = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  std::vector<ReferenceCase> cases;
  for (const std::string& file : templates) {
    for (const auto& [name, conversation] : conversations.items()) {
      for (bool generation_prompt : {false, true}) {
        ReferenceCase c;
        c.template_file = file;
        c.conversation = name;
        c.messages = conversation["messages"];
        c.options.add_generation_prompt = generation_prompt;
        c.options.variables = special_tokens;
        c.options.variables["date_string"] = "26 Jul 2024";
        if (conversation.contains("tools")) c.options.variables["tools"] = conversation["tools"];
        if (conversation.contains("variables")) {
          for (const auto& [key, value] : conversation["variables"].items()) {
            c.options.variables[key] = value;
          }
        }
        c.variables = {{"messages", c.messages},
                       {"tools", nullptr},
                       {"documents", nullptr},
                       {"add_generation_prompt", generation_prompt}};
        for (const auto& [key, value] : c.options.variables.items()) c.variables[key] = value;
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

}  // namespace engine::chat
