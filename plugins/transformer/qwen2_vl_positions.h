// Qwen2-VL's multimodal rotary positions, as transformers 5's get_rope_index computes them: text
// tokens count up on all three axes; the tokens of an image or a video (t x h/merge x w/merge of
// them, one run of image or video tokens) take the position after the text before them plus their
// column and row, and on the temporal axis plus their temporal patch times the video's time step
// (1, or Qwen2.5-VL's tokens_per_second x whole seconds per temporal patch); the text after it
// continues from there plus the larger of its rows and columns (not its temporal patches: a long
// video's last temporal positions can pass the text after it, as in transformers 5). Padding gets
// 1. In a packed row (the attention mask numbering its examples 1, 2, ...) each example counts from
// 0, as it would alone.
//
// Failure: a run of image (video) tokens whose length is not its image's (video's) token count, or
// more runs than images (videos), is an error naming the row. Pure function on CPU tensors; any
// thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"

namespace engine::transformer {

struct MultimodalPositions {
  at::Tensor position_ids;  // i64 [3, batch, positions]
  // Per row, the position the next generated token takes (the largest used plus one; for a packed
  // row, after its last example).
  std::vector<int64_t> next;
};

// One row's images and videos, each in order.
struct RowVisuals {
  std::vector<ImageGrid> images;
  std::vector<ImageGrid> videos;
  std::vector<int64_t> video_time_steps;  // per video: temporal positions between temporal patches
};

// input_ids and attention_mask (undefined: all real): i64 [batch, positions] on the CPU; `rows`:
// each row's images and videos.
StatusOr<MultimodalPositions> ComputeMultimodalPositions(const at::Tensor& input_ids,
                                                         const at::Tensor& attention_mask,
                                                         const std::vector<RowVisuals>& rows,
                                                         int64_t image_token_id,
                                                         int64_t video_token_id,
                                                         int64_t spatial_merge_size);
// Rows with images only (`row_grids`: each row's images in order).
StatusOr<MultimodalPositions> ComputeMultimodalPositions(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const std::vector<std::vector<ImageGrid>>& row_grids, int64_t image_token_id,
    int64_t spatial_merge_size);

}  // namespace engine::transformer
