// libFuzzer target: a chat template from a hub, parsed and rendered (jinja/ and chat/) with a
// conversation, as `engine preview` and the chat data loader render it. Any crash, hang past the
// time limit or memory past the RSS limit is a bug: templates run within jinja/limits.h's budgets.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "chat/chat_template.h"

namespace {

const nlohmann::ordered_json& Conversation() {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <image> there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": [{"type": "text", "text": "And?"}, {"type": "image"}]},
    {"role": "assistant", "content": "Done."}])");
  return messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto parsed = engine::chat::ChatTemplate::Parse(source, "fuzz.jinja",
                                                  {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  if (!parsed.ok()) return 0;
  engine::chat::ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.now = [] { return std::tm{}; };
  parsed->Render(Conversation(), options).status().IgnoreError();
  parsed->RenderForTraining(Conversation()).status().IgnoreError();
  return 0;
}
