// Qwen2-VL's image tokens in text, the one convention for data loaders and `engine generate`: an
// image is shown where a message says <image>, which becomes
// <|vision_start|><|image_pad|><|vision_end|> before the chat template renders the conversation
// (Qwen2-VL's template renders image content parts the same way); after tokenizing, each
// <|image_pad|> is repeated once per merged patch group of its image
// (Qwen2VlImageProcessor::TokensFor), as transformers' Qwen2VLProcessor does. Videos likewise:
// <video> becomes <|vision_start|><|video_pad|><|vision_end|>, and each <|video_pad|> one token per
// merged patch group of each temporal patch. Qwen3-VL's processor also writes each temporal
// patch's time into the text, each patch in vision tokens of its own (Qwen3VideoText).
//
//   int64_t marked = MarkImagePlaceholders(&messages);        // then render and encode
//   ENGINE_RETURN_IF_ERROR(ExpandImageTokens(pad_id, counts, &ids, &loss));
//   int64_t videos = MarkVideoPlaceholders(&messages);
//   ENGINE_RETURN_IF_ERROR(ExpandImageTokens(video_pad_id, counts, &ids, &loss, kVideoPadToken));
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/status.h"

namespace engine {

inline constexpr char kImagePlaceholder[] = "<image>";
inline constexpr char kImagePadToken[] = "<|image_pad|>";
inline constexpr char kVideoPlaceholder[] = "<video>";
inline constexpr char kVideoPadToken[] = "<|video_pad|>";

// Replaces <image> in the string contents of `messages` (an array of {"role", "content"}) by the
// vision tokens; returns how many it replaced.
int64_t MarkImagePlaceholders(nlohmann::ordered_json* messages);
// The same for <video>; with `texts`, the i-th <video> becomes texts[i] (where that is empty or
// past their end, the usual vision tokens).
int64_t MarkVideoPlaceholders(nlohmann::ordered_json* messages,
                              const std::vector<std::string>& texts = {});
// The videos a line of chat data or of `engine generate`'s prompt file names, in LLaMA-Factory's
// layout: "videos" (a list of videos) or "video" (one), each a directory of frames ("clip/") or a
// list of frame files, as the line spells them. An error naming the key (the caller says which
// line) for both keys, a frame that is not a non-empty string, or a video without frames.
StatusOr<std::vector<std::vector<std::string>>> LineVideos(const nlohmann::ordered_json& line);

// Qwen3-VL's text for a video whose temporal patches are at `timestamps` seconds, as transformers
// 5.17's Qwen3VLProcessor writes it in place of the video's <|video_pad|> (so inside the video's
// own <|vision_start|> ... <|vision_end|>): "<0.2 seconds><|vision_start|><|video_pad|>
// <|vision_end|>" for each patch, the pad then repeated per merged patch group of one patch.
std::string Qwen3VideoText(const std::vector<double>& timestamps);

// Repeats the i-th `pad_id` of `ids` counts[i] times; the copies carry no loss (`loss`, parallel
// to `ids`, may be null). An error when `ids` holds another number of pad ids than `counts`
// (naming `pad_token`, the pad's text).
Status ExpandImageTokens(int64_t pad_id, const std::vector<int64_t>& counts,
                         std::vector<int64_t>* ids, std::vector<uint8_t>* loss,
                         const char* pad_token = kImagePadToken);

}  // namespace engine
