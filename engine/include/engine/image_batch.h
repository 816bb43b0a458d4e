// How images and videos of variable size travel in a Batch between a data loader and a
// vision-language model:
//
//   "pixel_values"         f32 [batch, patches, patch_values]: each example's images' patches one
//                          after another (Qwen2VlImageProcessor::Patches), zeros after them
//   "image_grid_thw"       i64 [batch, images, 3]: each example's images' (t, h, w), zero rows
//   after "pixel_values_videos"  the same for videos (Qwen2VlImageProcessor::VideoPatches), t > 1
//   "video_grid_thw"
//   "second_per_grid_ts"   f32 [batch, videos]: the seconds one temporal patch of each video spans
//                          (temporal_patch_size / the frames' fps), as transformers names it
//
// so that every tensor's first dimension is the example (data.h) and examples can be sliced,
// stacked and moved like any other field. An example without images (videos) has only zeros; a
// batch without any video has no video fields.
//
//   Batch batch = ...;
//   PackImages(examples, patch_values, &batch);                  // data loader
//   PackImages(videos, patch_values, &batch, kVideoFields);
//   ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch images, UnpackImages(batch, patch_values));  // model
//   ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch clips, UnpackImages(batch, patch_values, kVideoFields));
//
// Failure: unpacking a batch whose fields disagree (more patches claimed than held, another patch
// width, a video without its seconds) is an error saying what. Pure functions; any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/data.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"

namespace engine {

inline constexpr char kPixelValuesField[] = "pixel_values";
inline constexpr char kImageGridField[] = "image_grid_thw";
inline constexpr char kVideoPixelValuesField[] = "pixel_values_videos";
inline constexpr char kVideoGridField[] = "video_grid_thw";
inline constexpr char kVideoSecondsField[] = "second_per_grid_ts";

// The fields one kind of visual input travels in; `seconds` is null for images.
struct VisualFields {
  const char* pixels;
  const char* grids;
  const char* seconds;
  const char* noun;  // "image", "video": for messages
};
inline constexpr VisualFields kImageFields = {kPixelValuesField, kImageGridField, nullptr, "image"};
inline constexpr VisualFields kVideoFields = {kVideoPixelValuesField, kVideoGridField,
                                              kVideoSecondsField, "video"};

// One example's images (or videos).
struct ExampleImages {
  at::Tensor patches;  // f32 [patches, patch_values], or undefined when there are none
  std::vector<ImageGrid> grids;
  std::vector<double> seconds_per_grid;  // videos: one per grid
};

// Adds the fields of `fields` for `examples` (one per batch row) to `batch`; `patch_values` sizes
// the pixel values of a batch without any image.
void PackImages(const std::vector<ExampleImages>& examples, int64_t patch_values, Batch* batch,
                const VisualFields& fields = kImageFields);

struct ImagesOfBatch {
  at::Tensor pixel_values;  // [patches, patch_values]: every row's, in row order; undefined if none
  std::vector<std::vector<ImageGrid>> row_grids;
  std::vector<std::vector<double>> row_seconds_per_grid;  // videos: parallel to row_grids
  bool empty() const { return !pixel_values.defined(); }
};

// The batch's images or videos (none when it has no such fields), on the batch's device.
StatusOr<ImagesOfBatch> UnpackImages(const Batch& batch, int64_t patch_values,
                                     const VisualFields& fields = kImageFields);

}  // namespace engine
