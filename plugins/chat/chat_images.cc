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

// The most frame files of one video a processor that samples frames chooses from.
constexpr int64_t kMaxListedFrames = 100000;

}  // namespace

std::string ImageStats::Summary() const {
  std::string out = WithThousands(images) + " " + noun + (images == 1 ? "" : "s");
  if (noun == "video") out += " of " + WithThousands(frames) + " frames";
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
    out += "; " + noun + " tokens min/median/max " + std::to_string(sorted.front()) + "/" +
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

StatusOr<RgbImage> ChatImages::ReadChecked(const std::filesystem::path& path,
                                           const std::string& where) {
  StatusOr<std::string> bytes = ReadUntrustedFile(path, FileKind::kImage);
  if (!bytes.ok()) return bytes.status().WithContext(where);
  StatusOr<RgbImage> image = DecodeRgbImage(*bytes, path);
  if (!image.ok()) return image.status().WithContext(where);
  if (ConvertedToRgb(image->source_mode)) ++stats_.converted[image->source_mode];
  stats_.content_hash = HashHex(Fnv1a64(*bytes, Fnv1a64(stats_.content_hash)));
  return image;
}

StatusOr<std::vector<ExampleImage>> ChatImages::Check(const std::vector<std::string>& paths,
                                                      const std::string& where) {
  std::vector<ExampleImage> images;
  for (const std::string& name : paths) {
    const std::filesystem::path path = (image_dirs_.front() / name).lexically_normal();
    ENGINE_RETURN_IF_ERROR(CheckAllowed(path, where + ": image '" + name + "'"));
    ENGINE_ASSIGN_OR_RETURN(RgbImage image, ReadChecked(path, where));
    StatusOr<ImageGrid> grid = processor_.GridFor(image.height, image.width);
    if (!grid.ok()) return grid.status().WithContext(where + ": image '" + path.string() + "'");
    stats_.tokens.push_back(processor_.TokensFor(*grid));
    ++stats_.images;
    images.push_back({path, *grid, {}, {}});
  }
  return images;
}

StatusOr<std::vector<std::filesystem::path>> ChatImages::FramesOf(
    const std::vector<std::string>& video, const std::string& where) const {
  // At most max_frames frames (a processor that samples frames keeps at most max_frames of up to
  // kMaxListedFrames).
  const int64_t most = processor_.sample_frames ? kMaxListedFrames : processor_.max_frames;
  if (static_cast<int64_t>(video.size()) > most) {
    return InvalidArgumentError(where + ": a video of " + std::to_string(video.size()) +
                                " frames, more than the " + std::to_string(most) +
                                " this engine reads of one video");
  }
  std::vector<std::filesystem::path> frames;
  for (const std::string& name : video) {
    const std::filesystem::path path = (image_dirs_.front() / name).lexically_normal();
    ENGINE_RETURN_IF_ERROR(CheckAllowed(path, where + ": video frame '" + name + "'"));
    frames.push_back(path);
  }
  std::error_code error;
  if (frames.size() != 1 || !std::filesystem::is_directory(frames[0], error)) {
    if (frames.size() == 1 && !IsImageFileName(frames[0])) {
      return InvalidArgumentError(where + ": video '" + video[0] +
                                  "' is neither a directory of frames nor an image file; this "
                                  "engine decodes no video files: extract its frames (for "
                                  "example at 2 a second) into a directory and name that");
    }
    return frames;
  }
  StatusOr<std::vector<std::filesystem::path>> listed = FrameFilesOf(frames[0], most);
  if (!listed.ok()) return listed.status().WithContext(where + ": video '" + video[0] + "'");
  for (const std::filesystem::path& frame : *listed) {
    ENGINE_RETURN_IF_ERROR(CheckAllowed(frame, where + ": video frame '" + frame.string() + "'"));
  }
  return listed;
}

StatusOr<std::vector<ExampleImage>> ChatImages::CheckVideos(
    const std::vector<std::vector<std::string>>& videos, const std::string& where) {
  std::vector<ExampleImage> out;
  for (const std::vector<std::string>& video : videos) {
    ENGINE_ASSIGN_OR_RETURN(std::vector<std::filesystem::path> listed, FramesOf(video, where));
    const std::vector<int64_t> kept =
        processor_.SampledFrames(static_cast<int64_t>(listed.size()), fps_);
    std::vector<std::filesystem::path> frames;
    for (int64_t i : kept) frames.push_back(listed[static_cast<size_t>(i)]);
    const std::string what = where + ": video '" + video[0] + "'";
    int64_t height = 0, width = 0;
    for (const std::filesystem::path& frame : frames) {
      ENGINE_ASSIGN_OR_RETURN(RgbImage image, ReadChecked(frame, what));
      ENGINE_RETURN_IF_ERROR(Qwen2VlImageProcessor::CheckVideoFrame(image).WithContext(
          what + ": frame '" + frame.string() + "'"));
      if (height == 0) {
        height = image.height;
        width = image.width;
      } else if (image.height != height || image.width != width) {
        return InvalidArgumentError(
            what + ": frame '" + frame.string() + "' is " + std::to_string(image.width) + "x" +
            std::to_string(image.height) + " pixels where the first is " + std::to_string(width) +
            "x" + std::to_string(height) + "; a video's frames have one size");
      }
    }
    StatusOr<ImageGrid> grid =
        processor_.VideoGridFor(static_cast<int64_t>(frames.size()), height, width);
    if (!grid.ok()) return grid.status().WithContext(what);
    stats_.tokens.push_back(processor_.TokensFor(*grid));
    stats_.frames += static_cast<int64_t>(frames.size());
    ++stats_.images;
    std::vector<double> timestamps;
    if (timestamps_in_text()) timestamps = processor_.Timestamps(kept, fps_);
    out.push_back(
        {image_dirs_.front() / video[0], *grid, std::move(frames), std::move(timestamps)});
  }
  return out;
}

std::vector<int64_t> ChatImages::PadCounts(const std::vector<ExampleImage>& images) const {
  std::vector<int64_t> counts;
  for (const ExampleImage& image : images) {
    if (!videos()) {
      counts.push_back(processor_.TokensFor(image.grid));
      continue;
    }
    const std::vector<int64_t> pads = processor_.VideoPadTokens(image.grid);
    counts.insert(counts.end(), pads.begin(), pads.end());
  }
  return counts;
}

Status ChatImages::ExpandImageTokens(const std::vector<ExampleImage>& images,
                                     const std::string& where,
                                     TokenizedConversation* example) const {
  const std::vector<int64_t> counts = PadCounts(images);
  return engine::ExpandImageTokens(pad_id_, counts, &example->ids, &example->loss,
                                   videos() ? kVideoPadToken : kImagePadToken)
      .WithContext(where);
}

StatusOr<ExampleImages> ChatImages::Pixels(const std::vector<ExampleImage>& images) const {
  ExampleImages out;
  std::vector<at::Tensor> patches;
  for (const ExampleImage& image : images) {
    // Read again for each batch: the paths must still lead where they did when the data opened.
    const std::string what =
        std::string(videos() ? "video '" : "image '") + image.path.string() + "'";
    // Each frame read when the processor takes it: one frame at its own size at a time.
    const auto read = [&](const std::filesystem::path& path) -> StatusOr<RgbImage> {
      ENGINE_RETURN_IF_ERROR(CheckAllowed(path, what));
      return ReadRgbImage(path);
    };
    StatusOr<at::Tensor> p = at::Tensor();
    if (videos()) {
      p = processor_.VideoPatches(static_cast<int64_t>(image.frames.size()), [&](int64_t i) {
        return read(image.frames[static_cast<size_t>(i)]);
      });
    } else {
      ENGINE_ASSIGN_OR_RETURN(RgbImage rgb, read(image.path));
      p = processor_.Patches(rgb);
    }
    if (!p.ok()) return p.status().WithContext(what);
    if (p->size(0) != image.grid.patches()) {
      return DataLossError(what + " has changed since the data was opened (other size)");
    }
    patches.push_back(std::move(*p));
    out.grids.push_back(image.grid);
    if (videos()) {
      out.seconds_per_grid.push_back(static_cast<double>(processor_.temporal_patch_size) / fps_);
    }
  }
  if (!patches.empty()) out.patches = at::cat(patches);
  return out;
}

}  // namespace engine::plugins
