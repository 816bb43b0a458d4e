#include "chat_images.h"

#include <ATen/ops/cat.h>

#include <algorithm>

#include "engine/atomic_file.h"
#include "engine/format.h"
#include "engine/hash.h"
#include "engine/image_file.h"

namespace engine::plugins {
namespace {

constexpr char kVisionTokens[] = "<|vision_start|><|image_pad|><|vision_end|>";

std::string ModeWords(const std::string& mode) {
  if (mode == "L" || mode == "1" || mode == "I;16") return "greyscale";
  if (mode == "LA") return "greyscale with alpha";
  if (mode == "RGBA") return "with alpha";
  if (mode == "P") return "palette";
  return mode;
}

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

std::string ImageStats::Summary() const {
  std::string out = WithThousands(images) + (images == 1 ? " image" : " images");
  if (!converted.empty()) {
    std::vector<std::string> parts;
    bool alpha = false;
    for (const auto& [mode, count] : converted) {
      parts.push_back(WithThousands(count) + " " + ModeWords(mode));
      alpha = alpha || mode == "RGBA" || mode == "LA" || mode == "P";
    }
    out += " (";
    for (size_t i = 0; i < parts.size(); ++i) {
      out += (i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ") + parts[i];
    }
    out +=
        std::string(" converted to RGB") + (alpha ? ": alpha and transparency dropped" : "") + ")";
  }
  if (!tokens.empty()) {
    std::vector<int64_t> sorted = tokens;
    std::sort(sorted.begin(), sorted.end());
    out += "; image tokens min/median/max " + std::to_string(sorted.front()) + "/" +
           std::to_string(sorted[sorted.size() / 2]) + "/" + std::to_string(sorted.back());
  }
  return out;
}

StatusOr<std::vector<ExampleImage>> ChatImages::Check(const std::vector<std::string>& paths,
                                                      const std::string& where) {
  std::vector<ExampleImage> images;
  for (const std::string& name : paths) {
    const std::filesystem::path path = base_dir_ / name;
    StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return bytes.status().WithContext(where);
    StatusOr<RgbImage> image = ReadRgbImage(path);
    if (!image.ok()) return image.status().WithContext(where);
    StatusOr<ImageGrid> grid = processor_.GridFor(image->height, image->width);
    if (!grid.ok()) return grid.status().WithContext(where + ": image '" + path.string() + "'");
    if (ConvertedToRgb(image->source_mode)) ++stats_.converted[image->source_mode];
    stats_.content_hash = HashHex(Fnv1a64(*bytes, Fnv1a64(stats_.content_hash)));
    stats_.tokens.push_back(processor_.TokensFor(*grid));
    ++stats_.images;
    images.push_back({path, *grid});
  }
  return images;
}

Status ChatImages::ExpandImageTokens(const std::vector<ExampleImage>& images,
                                     const std::string& where,
                                     TokenizedConversation* example) const {
  const auto pads = std::count(example->ids.begin(), example->ids.end(), pad_id_);
  if (pads != static_cast<int64_t>(images.size())) {
    return DataLossError(where + ": the rendered conversation has " + std::to_string(pads) + " " +
                         kImagePadToken + " for " + std::to_string(images.size()) + " image(s)");
  }
  TokenizedConversation expanded;
  size_t image = 0;
  for (size_t i = 0; i < example->ids.size(); ++i) {
    const bool pad = example->ids[i] == pad_id_;
    const int64_t copies = pad ? processor_.TokensFor(images[image++].grid) : 1;
    expanded.ids.insert(expanded.ids.end(), copies, example->ids[i]);
    expanded.loss.insert(expanded.loss.end(), copies, pad ? 0 : example->loss[i]);
  }
  *example = std::move(expanded);
  return Status::Ok();
}

StatusOr<ExampleImages> ChatImages::Pixels(const std::vector<ExampleImage>& images) const {
  ExampleImages out;
  std::vector<at::Tensor> patches;
  for (const ExampleImage& image : images) {
    ENGINE_ASSIGN_OR_RETURN(RgbImage rgb, ReadRgbImage(image.path));
    ENGINE_ASSIGN_OR_RETURN(at::Tensor p, processor_.Patches(rgb));
    if (p.size(0) != image.grid.patches()) {
      return DataLossError("image '" + image.path.string() +
                           "' has changed since the data was opened (other size)");
    }
    patches.push_back(std::move(p));
    out.grids.push_back(image.grid);
  }
  if (!patches.empty()) out.patches = at::cat(patches);
  return out;
}

}  // namespace engine::plugins
