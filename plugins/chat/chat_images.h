// The images (or videos) of chat examples, as Qwen2-VL reads them (engine/image_tokens.h:
// <image> and <video> placeholders become vision tokens, each pad repeated per merged patch group,
// never carrying loss). One ChatImages reads images, another videos: a video is a directory of
// frames (its image files in name order) or a list of frame files, each frame an image file.
// Paths are relative to the JSON Lines file and stay inside its directory, or inside one the
// pipeline allows (`images.allowed_dirs`): a dataset's line cannot make the engine read a file
// elsewhere on the machine. Files are read as engine/untrusted_file.h reads them.
//
//   ChatImages images(processor, pad_id, jsonl_dir);
//   int64_t marked = MarkImagePlaceholders(&messages);              // engine/image_tokens.h
//   ENGINE_ASSIGN_OR_RETURN(auto read, images.Check(parsed.images, where));   // every file decoded
//   ENGINE_RETURN_IF_ERROR(images.ExpandImageTokens(read, where, &tokenized));
//   ENGINE_ASSIGN_OR_RETURN(ExampleImages pixels, images.Pixels(read));       // for a batch
//   ChatImages videos(video_processor, video_pad_id, jsonl_dirs, fps);       // videos
//   ENGINE_ASSIGN_OR_RETURN(auto clips, videos.CheckVideos(parsed.videos, where));
//
// Failure, naming FILE:LINE and the image or video: a missing, unreadable or truncated image or
// frame, one outside the allowed directories, the size limit or the pixel limits, frames of
// different sizes, a video file (not decoded: give its frames), and a count of placeholders (or
// of pad tokens after rendering) that differs from the images or videos given. Immutable after
// construction apart from the counts; Pixels may run on several threads at once.
#pragma once

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/image_batch.h"
#include "engine/image_tokens.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"
#include "loss_mask.h"

namespace engine::plugins {

// An image, or a video (its frames, in order).
struct ExampleImage {
  std::filesystem::path path;  // the image, or the video as the line names it
  ImageGrid grid;
  std::vector<std::filesystem::path> frames;  // videos only: the frames the processor reads
  std::vector<double> timestamps;  // Qwen3-VL's videos: each temporal patch's time (seconds)
};

// Counts for the plan.
struct ImageStats {
  std::string noun = "image";                // "video"
  int64_t images = 0;                        // images or videos
  int64_t frames = 0;                        // videos' frames
  std::map<std::string, int64_t> converted;  // source mode ("L", "RGBA", ...) -> images (frames)
  std::vector<int64_t> tokens;               // tokens per image (video)
  std::string content_hash;                  // of every file's bytes, in order

  // "9 images (2 greyscale and 1 with alpha converted to RGB: alpha dropped); image tokens
  // min/median/max 4/6/12"; "2 videos of 7 frames; video tokens min/median/max 4/12/12".
  std::string Summary() const;
};

class ChatImages {
 public:
  // Image paths are relative to image_dirs[0] (the data file's directory) and must lead into one
  // of `image_dirs`.
  ChatImages(Qwen2VlImageProcessor processor, int64_t pad_id,
             std::vector<std::filesystem::path> image_dirs)
      : processor_(std::move(processor)), pad_id_(pad_id), image_dirs_(std::move(image_dirs)) {}
  // Videos whose frames were taken `fps` a second.
  ChatImages(Qwen2VlImageProcessor processor, int64_t pad_id,
             std::vector<std::filesystem::path> image_dirs, double fps)
      : ChatImages(std::move(processor), pad_id, std::move(image_dirs)) {
    fps_ = fps;
    stats_.noun = "video";
  }

  // Reads every image of a line (decoding it whole, so that a truncated file is found now). Videos
  // of a processor that samples frames read only the frames it keeps.
  StatusOr<std::vector<ExampleImage>> Check(const std::vector<std::string>& paths,
                                            const std::string& where);
  // The same for videos: every frame of each.
  StatusOr<std::vector<ExampleImage>> CheckVideos(
      const std::vector<std::vector<std::string>>& videos, const std::string& where);
  // Whether the text shows each temporal patch's time (Qwen3-VL's videos: Qwen3VideoText).
  bool timestamps_in_text() const {
    return videos() && processor_.video_kind == Qwen2VlImageProcessor::VideoKind::kQwen3Vl;
  }
  // The pad tokens `images` take in the rendered text, and how many tokens each becomes.
  std::vector<int64_t> PadCounts(const std::vector<ExampleImage>& images) const;
  // Repeats each pad token of `example` for its image (video).
  Status ExpandImageTokens(const std::vector<ExampleImage>& images, const std::string& where,
                           TokenizedConversation* example) const;
  // Patches and grids of an example's images (videos, with their seconds per temporal patch).
  StatusOr<ExampleImages> Pixels(const std::vector<ExampleImage>& images) const;

  const Qwen2VlImageProcessor& processor() const { return processor_; }
  int64_t pad_id() const { return pad_id_; }
  bool videos() const { return fps_ > 0; }
  double fps() const { return fps_; }
  const ImageStats& stats() const { return stats_; }

 private:
  // The error for a path outside every allowed directory, naming `what`.
  Status CheckAllowed(const std::filesystem::path& path, const std::string& what) const;
  // One image file read and decoded whole, counted in the stats.
  StatusOr<RgbImage> ReadChecked(const std::filesystem::path& path, const std::string& where);
  // A video's frame files: the list given, or the image files of the one directory given.
  StatusOr<std::vector<std::filesystem::path>> FramesOf(const std::vector<std::string>& video,
                                                        const std::string& where) const;

  Qwen2VlImageProcessor processor_;
  int64_t pad_id_;
  std::vector<std::filesystem::path> image_dirs_;
  double fps_ = 0;  // videos only
  ImageStats stats_;
};

}  // namespace engine::plugins
