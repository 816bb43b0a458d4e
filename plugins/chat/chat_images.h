// The images of chat examples, as Qwen2-VL reads them (engine/image_tokens.h: <image> placeholders
// become vision tokens, each image pad repeated per merged patch group, never carrying loss).
// Image paths are relative to the JSON Lines file and stay inside its directory, or inside one the
// pipeline allows (`images.allowed_dirs`): a dataset's line cannot make the engine read a file
// elsewhere on the machine. Images are read as engine/untrusted_file.h reads files.
//
//   ChatImages images(processor, pad_id, jsonl_dir);
//   int64_t marked = MarkImagePlaceholders(&messages);              // engine/image_tokens.h
//   ENGINE_ASSIGN_OR_RETURN(auto read, images.Check(parsed.images, where));   // every file decoded
//   ENGINE_RETURN_IF_ERROR(images.ExpandImageTokens(read, where, &tokenized));
//   ENGINE_ASSIGN_OR_RETURN(ExampleImages pixels, images.Pixels(read));       // for a batch
//
// Failure, naming FILE:LINE and the image: a missing, unreadable or truncated image, one outside
// the allowed directories, the size limit or the pixel limits, and a count of <image> placeholders
// (or of image tokens after rendering) that differs from the images given. Immutable after
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

struct ExampleImage {
  std::filesystem::path path;
  ImageGrid grid;
};

// Counts for the plan.
struct ImageStats {
  int64_t images = 0;
  std::map<std::string, int64_t> converted;  // source mode ("L", "RGBA", ...) -> images
  std::vector<int64_t> tokens;               // image tokens per image
  std::string content_hash;                  // of every image file's bytes, in order

  // "9 images (2 greyscale and 1 with alpha converted to RGB: alpha dropped); image tokens
  // min/median/max 4/6/12".
  std::string Summary() const;
};

class ChatImages {
 public:
  // Image paths are relative to image_dirs[0] (the data file's directory) and must lead into one
  // of `image_dirs`.
  ChatImages(Qwen2VlImageProcessor processor, int64_t pad_id,
             std::vector<std::filesystem::path> image_dirs)
      : processor_(std::move(processor)), pad_id_(pad_id), image_dirs_(std::move(image_dirs)) {}

  // Reads every image of a line (decoding it whole, so that a truncated file is found now).
  StatusOr<std::vector<ExampleImage>> Check(const std::vector<std::string>& paths,
                                            const std::string& where);
  // Repeats each image pad token of `example` for its image.
  Status ExpandImageTokens(const std::vector<ExampleImage>& images, const std::string& where,
                           TokenizedConversation* example) const;
  // Patches and grids of an example's images.
  StatusOr<ExampleImages> Pixels(const std::vector<ExampleImage>& images) const;

  const Qwen2VlImageProcessor& processor() const { return processor_; }
  int64_t pad_id() const { return pad_id_; }
  const ImageStats& stats() const { return stats_; }

 private:
  // The error for an image path outside every allowed directory, naming `what`.
  Status CheckAllowed(const std::filesystem::path& path, const std::string& what) const;

  Qwen2VlImageProcessor processor_;
  int64_t pad_id_;
  std::vector<std::filesystem::path> image_dirs_;
  ImageStats stats_;
};

}  // namespace engine::plugins
