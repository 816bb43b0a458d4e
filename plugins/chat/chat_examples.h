// The chat loader's examples: every line of a JSON Lines file read (conversation_formats.h),
// rendered by the chat template, tokenized with its loss mask (loss_mask.h), and truncated or
// dropped as the options say, with counts of what happened for the plan.
//
// Failure: a malformed line, a conversation the template cannot render (a role it does not
// know), one without an assistant turn when skip_without_assistant is false, or an image that
// cannot be used (chat_images.h), is an error naming FILE:LINE; nothing half-read is returned. No
// examples at all is an error too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "chat_images.h"
#include "chat_options.pb.h"
#include "engine/status.h"
#include "engine/tokenizer.h"

namespace engine::plugins {

struct ChatStats {
  std::map<std::string, int64_t> by_format;  // "messages", "sharegpt", "alpaca"
  std::vector<int64_t> lengths;              // tokens of each kept example
  int64_t truncated = 0;
  int64_t dropped_too_long = 0;      // DROP: longer than max_length
  int64_t dropped_no_loss_left = 0;  // TRUNCATE_END: no assistant token within max_length
  int64_t skipped_no_assistant = 0;
  int64_t dropped_image_cut = 0;  // TRUNCATE_END would cut image tokens
  int64_t tokens = 0;
  int64_t loss_tokens = 0;

  // "120 conversations (messages 100, alpaca 20); tokens min/median/max 20/85/512; 3 truncated
  // to max_length 512; dropped: 1 longer than max_length, 2 without an assistant turn; 38.5% of
  // tokens carry loss".
  std::string Summary(const ChatOptions& options) const;
};

struct ChatExamples {
  std::vector<std::vector<int64_t>> ids;
  std::vector<std::vector<uint8_t>> loss;
  std::vector<std::vector<ExampleImage>> images;  // each example's, often none
  std::vector<std::vector<ExampleImage>> videos;  // each example's, often none
  ChatStats stats;
};

// What turns the images and videos lines name into tokens (chat_images.h); null: a line that
// names one is an error saying how to configure it.
struct ChatVisuals {
  ChatImages* images = nullptr;
  ChatImages* videos = nullptr;
  std::string videos_unavailable;  // why `videos` is null, when there is a reason
};

// `origin` names the file in errors.
StatusOr<ChatExamples> ReadChatExamples(const std::string& text, const std::string& origin,
                                        const chat::ChatTemplate& chat_template,
                                        const Tokenizer& tokenizer, const ChatOptions& options,
                                        const ChatVisuals& visuals);

}  // namespace engine::plugins
