// The JSON Lines layouts users bring conversations in, each turned into one conversation (a JSON
// array of {"role", "content"} messages) for the chat template:
//
//   OpenAI/TRL  {"messages": [{"role": "user", "content": "..."}, ...]}
//   ShareGPT    {"conversations": [{"from": "human"|"gpt"|"system"|..., "value": "..."}],
//                "system": "..." (optional)}
//   alpaca      {"instruction": "...", "input": "..." (optional), "output": "...",
//                "system": "..." (optional)}: the instruction and input (joined by a blank line)
//                as the user's turn, the output as the assistant's.
//
// Any layout may name images: "images": ["a.png", ...] (LLaMA-Factory) or "image": "a.png" or a
// list (Qwen-VL's fine-tuning data), each shown where the text says <image>; and videos:
// "videos": [...] (LLaMA-Factory) or "video", each a directory of frames or a list of frame files,
// shown where the text says <video>. A video file (.mp4) is not decoded, and a video in a content
// part is refused: both name the line.
//
// Failure: a line that is not a JSON object, or holds none of the layouts, or a ShareGPT speaker
// we do not know, is an error naming the file and line. Pure functions; any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/status.h"

namespace engine::plugins {

enum class ConversationFormat { kMessages, kShareGpt, kAlpaca };
std::string_view ConversationFormatName(ConversationFormat format);

struct ParsedConversation {
  ConversationFormat format;
  nlohmann::ordered_json messages;  // an array of {"role", "content"}
  std::vector<std::string> images;  // as the line spells them
  // Each video's frames as the line spells them; one entry may be a directory of frames.
  std::vector<std::vector<std::string>> videos;
};

// `where` is "FILE:LINE", for errors.
StatusOr<ParsedConversation> ParseConversationLine(std::string_view line, const std::string& where);

// Whether the conversation has an assistant turn.
bool HasAssistantTurn(const nlohmann::ordered_json& messages);

}  // namespace engine::plugins
