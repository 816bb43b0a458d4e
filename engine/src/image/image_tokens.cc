#include "engine/image_tokens.h"

#include <algorithm>
#include <cstdio>
#include <string>

namespace engine {
namespace {

// `placeholder` in the string contents of `messages` replaced, the i-th by texts[i] or (past
// their end, or empty) by `tokens`; how many.
int64_t MarkPlaceholders(const std::string& placeholder, const std::string& tokens,
                         const std::vector<std::string>& texts, nlohmann::ordered_json* messages) {
  int64_t marked = 0;
  for (auto& message : *messages) {
    auto content = message.find("content");
    if (content == message.end() || !content->is_string()) continue;
    std::string text = content->get<std::string>();
    for (size_t at = text.find(placeholder); at != std::string::npos;) {
      const auto at_text = static_cast<size_t>(marked);
      const std::string& replacement =
          at_text < texts.size() && !texts[at_text].empty() ? texts[at_text] : tokens;
      text.replace(at, placeholder.size(), replacement);
      ++marked;
      at = text.find(placeholder, at + replacement.size());
    }
    *content = text;
  }
  return marked;
}

std::string VisionTokens(const char* pad) {
  return std::string("<|vision_start|>") + pad + "<|vision_end|>";
}

}  // namespace

int64_t MarkImagePlaceholders(nlohmann::ordered_json* messages) {
  return MarkPlaceholders(kImagePlaceholder, VisionTokens(kImagePadToken), {}, messages);
}

int64_t MarkVideoPlaceholders(nlohmann::ordered_json* messages,
                              const std::vector<std::string>& texts) {
  return MarkPlaceholders(kVideoPlaceholder, VisionTokens(kVideoPadToken), texts, messages);
}

std::string Qwen3VideoText(const std::vector<double>& timestamps) {
  std::string patches;
  for (double seconds : timestamps) {
    // Python's f"{t:.1f}": the binary value rounded to nearest, half to even, as printf does.
    char time[64];
    std::snprintf(time, sizeof(time), "<%.1f seconds>", seconds);
    patches += time + VisionTokens(kVideoPadToken);
  }
  return "<|vision_start|>" + patches + "<|vision_end|>";
}

Status ExpandImageTokens(int64_t pad_id, const std::vector<int64_t>& counts,
                         std::vector<int64_t>* ids, std::vector<uint8_t>* loss,
                         const char* pad_token) {
  const auto pads = std::count(ids->begin(), ids->end(), pad_id);
  if (pads != static_cast<int64_t>(counts.size())) {
    const bool video = std::string(pad_token) == kVideoPadToken;
    return InvalidArgumentError("the rendered text has " + std::to_string(pads) + " " + pad_token +
                                " where the " + (video ? "videos" : "images") + " need " +
                                std::to_string(counts.size()));
  }
  std::vector<int64_t> expanded_ids;
  std::vector<uint8_t> expanded_loss;
  size_t image = 0;
  for (size_t i = 0; i < ids->size(); ++i) {
    const bool pad = (*ids)[i] == pad_id;
    const int64_t copies = pad ? counts[image++] : 1;
    expanded_ids.insert(expanded_ids.end(), copies, (*ids)[i]);
    if (loss != nullptr) expanded_loss.insert(expanded_loss.end(), copies, pad ? 0 : (*loss)[i]);
  }
  *ids = std::move(expanded_ids);
  if (loss != nullptr) *loss = std::move(expanded_loss);
  return Status::Ok();
}

StatusOr<std::vector<std::vector<std::string>>> LineVideos(const nlohmann::ordered_json& line) {
  std::vector<std::vector<std::string>> videos;
  for (const char* key : {"videos", "video"}) {
    auto it = line.find(key);
    if (it == line.end() || it->is_null()) continue;
    if (!videos.empty()) {
      return InvalidArgumentError("names videos under both 'videos' and 'video'");
    }
    // "video": "clip/" or ["f1.png", "f2.png"] is one video; "videos" is a list of them.
    const bool one = std::string(key) == "video";
    const nlohmann::ordered_json list =
        one || !it->is_array() ? nlohmann::ordered_json::array({*it}) : *it;
    for (const nlohmann::ordered_json& video : list) {
      std::vector<std::string> frames;
      for (const nlohmann::ordered_json& frame :
           video.is_array() ? video : nlohmann::ordered_json::array({video})) {
        if (!frame.is_string() || frame.get<std::string>().empty()) {
          return InvalidArgumentError(std::string("'") + key +
                                      "' must hold videos: a directory of frames or a list of "
                                      "frame files (strings), not " +
                                      video.dump());
        }
        frames.push_back(frame.get<std::string>());
      }
      if (frames.empty()) {
        return InvalidArgumentError(std::string("'") + key + "' holds a video without frames");
      }
      videos.push_back(std::move(frames));
    }
  }
  return videos;
}

}  // namespace engine
