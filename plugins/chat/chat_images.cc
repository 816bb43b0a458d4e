#include "chat_images.h"

#include <ATen/ops/cat.h>

#include <algorithm>

#include "engine/format.h"
#include "engine/hash.h"
#include "engine/image_file.h"
#include "engine/untrusted_file.h"

namespace engine::plugins {
namespace {

std::string ModeWords(const std::string& mode) {
  if (mode == "L" || mode == "1" || mode == "I;16") return "greyscale";
  if (mode == "LA") return "greyscale with alpha";
  if (mode == "RGBA") return "with alpha";
  if (mode == "P") return "palette";
  return mode;
}

}  // namespace

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

Status ChatImages::CheckAllowed(const std::filesystem::path& path, const std::string& what) const {
  for (const std::filesystem::path& dir : image_dirs_) {
    if (IsInsideDirectory(path, dir)) return Status::Ok();
  }
  return InvalidArgumentError(what + " leads to '" + path.string() + "', outside '" +
                              image_dirs_.front().string() +
                              "' where the data file is; to read images from elsewhere, list their "
                              "directory in images { allowed_dirs: ... }");
}

StatusOr<std::vector<ExampleImage>> ChatImages::Check(const std::vector<std::string>& paths,
                                                      const std::string& where) {
  std::vector<ExampleImage> images;
  for (const std::string& name : paths) {
    const std::filesystem::path path = (image_dirs_.front() / name).lexically_normal();
    ENGINE_RETURN_IF_ERROR(CheckAllowed(path, where + ": image '" + name + "'"));
    StatusOr<std::string> bytes = ReadUntrustedFile(path, FileKind::kImage);
    if (!bytes.ok()) return bytes.status().WithContext(where);
    StatusOr<RgbImage> image = DecodeRgbImage(*bytes, path);
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
  std::vector<int64_t> counts;
  for (const ExampleImage& image : images) counts.push_back(processor_.TokensFor(image.grid));
  return engine::ExpandImageTokens(pad_id_, counts, &example->ids, &example->loss)
      .WithContext(where);
}

StatusOr<ExampleImages> ChatImages::Pixels(const std::vector<ExampleImage>& images) const {
  ExampleImages out;
  std::vector<at::Tensor> patches;
  for (const ExampleImage& image : images) {
    // Read again for each batch: the path must still lead where it did when the data opened.
    ENGINE_RETURN_IF_ERROR(CheckAllowed(image.path, "image '" + image.path.string() + "'"));
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
