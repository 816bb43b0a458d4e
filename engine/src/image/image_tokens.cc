#include "engine/image_tokens.h"

#include <algorithm>
#include <string>

namespace engine {
namespace {

constexpr char kVisionTokens[] = "<|vision_start|><|image_pad|><|vision_end|>";

}  // namespace

int64_t MarkImagePlaceholders(nlohmann::ordered_json* messages) {
  int64_t marked = 0;
  for (auto& message : *messages) {
    auto content = message.find("content");
    if (content == message.end() || !content->is_string()) continue;
    std::string text = content->get<std::string>();
    for (size_t at = text.find(kImagePlaceholder); at != std::string::npos;
         at = text.find(kImagePlaceholder, at + sizeof(kVisionTokens) - 1)) {
      text.replace(at, sizeof(kImagePlaceholder) - 1, kVisionTokens);
      ++marked;
    }
    *content = text;
  }
  return marked;
}

Status ExpandImageTokens(int64_t pad_id, const std::vector<int64_t>& counts,
                         std::vector<int64_t>* ids, std::vector<uint8_t>* loss) {
  const auto pads = std::count(ids->begin(), ids->end(), pad_id);
  if (pads != static_cast<int64_t>(counts.size())) {
    return InvalidArgumentError("the rendered text has " + std::to_string(pads) + " " +
                                kImagePadToken + " for " + std::to_string(counts.size()) +
                                " image(s)");
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

}  // namespace engine
