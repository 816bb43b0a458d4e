// libFuzzer target: one line of a chat dataset (plugins/chat's layouts, plugins/common's bounded
// line parser), as the chat data loader reads each line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "conversation_formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  engine::plugins::ParseConversationLine(line, "fuzz.jsonl:1").status().IgnoreError();
  return 0;
}
