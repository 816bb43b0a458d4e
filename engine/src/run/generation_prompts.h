// The prompts `engine generate` continues, from the command line or a JSONL file, and the ids each
// starts from. A prompt is a conversation (a user message, or the "messages" of a line) rendered
// with the source's chat template and generation prompt, as transformers' apply_chat_template
// renders it; or, raw, text to continue after the tokenizer's bos. Images are read through the
// source's image processor, each expanded to its image tokens where its placeholder stands; videos
// likewise through its video processor (chat data's rules: docs/data_and_chat.md).
//
// Failure: every error names the prompt ("--prompt 2", "FILE:3") and what is wrong with it (not
// JSON, a placeholder without its image, an image the processor cannot take, no chat template).
// Files named by a prompt file are read relative to it. Use from one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/image_batch.h"
#include "engine/status.h"
#include "run/generation_source.h"

namespace engine {

struct Prompt {
  nlohmann::ordered_json messages;            // a conversation; null when raw
  std::string text;                           // raw: the text; otherwise the rendered conversation
  std::string origin;                         // "--prompt 2", "FILE:3", for errors
  std::vector<std::filesystem::path> images;  // shown where the messages say <image>
  ExampleImages pixels;                       // the images' patches and grids, once encoded
  // Each video's frame files, or the one directory holding them; shown where the messages say
  // <video> (after the images when a text has no placeholder).
  std::vector<std::vector<std::filesystem::path>> videos;
  double fps = 2;              // frames a second the videos' frames were taken at
  ExampleImages video_pixels;  // the videos' patches, grids and seconds, once encoded
};

// One prompt per text: a user message holding every image first (after a system message when
// `system` is not empty); raw, the text itself (no images).
std::vector<Prompt> PromptsFromTexts(const std::vector<std::string>& texts,
                                     const std::vector<std::string>& images,
                                     const std::string& system, bool raw);

// One prompt per non-blank line of a JSONL file: {"messages": [...]} or {"prompt": "..."}, with
// "images" (or "image") and "videos" (or "video": a directory of frames or a list of frame files;
// "fps", the rate they were taken at, 2 by default) relative to the file.
StatusOr<std::vector<Prompt>> ReadPromptFile(const std::filesystem::path& file, bool raw);

// The ids each prompt starts from, its text (rendered) and pixels filled in.
StatusOr<std::vector<std::vector<int64_t>>> EncodePrompts(std::vector<Prompt>& prompts,
                                                          const GenerationSource& source, bool raw);

}  // namespace engine
