// How images of variable size travel in a Batch between a data loader and a vision-language model:
//
//   "pixel_values"    f32 [batch, patches, patch_values]: each example's images' patches one
//                     after another (Qwen2VlImageProcessor::Patches), zeros after them
//   "image_grid_thw"  i64 [batch, images, 3]: each example's images' (t, h, w), zero rows after
//
// so that every tensor's first dimension is the example (data.h) and examples can be sliced,
// stacked and moved like any other field. An example without images has only zeros.
//
//   Batch batch = ...;
//   PackImages(examples, &batch);                               // data loader
//   ENGINE_ASSIGN_OR_RETURN(ImagesOfBatch images, UnpackImages(batch, patch_values));  // model
//
// Failure: unpacking a batch whose fields disagree (more patches claimed than held, another patch
// width) is an error saying what. Pure functions; any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/data.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"

namespace engine {

inline constexpr char kPixelValuesField[] = "pixel_values";
inline constexpr char kImageGridField[] = "image_grid_thw";

// One example's images.
struct ExampleImages {
  at::Tensor patches;  // f32 [patches, patch_values], or undefined when there are none
  std::vector<ImageGrid> grids;
};

// Adds the two fields for `examples` (one per batch row) to `batch`; `patch_values` sizes the
// pixel_values of a batch without any image.
void PackImages(const std::vector<ExampleImages>& examples, int64_t patch_values, Batch* batch);

struct ImagesOfBatch {
  at::Tensor pixel_values;  // [patches, patch_values]: every row's, in row order; undefined if none
  std::vector<std::vector<ImageGrid>> row_grids;
  bool empty() const { return !pixel_values.defined(); }
};

// The batch's images (none when it has no pixel_values), on the batch's device.
StatusOr<ImagesOfBatch> UnpackImages(const Batch& batch, int64_t patch_values);

}  // namespace engine
