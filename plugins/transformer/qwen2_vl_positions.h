// Qwen2-VL's multimodal rotary positions (transformers' get_rope_index, for images): text tokens
// count up on all three axes; the tokens of an image (t x h/merge x w/merge of them, one run of
// image tokens) take the position after the text before them plus their frame, row and column;
// the text after an image continues from the largest position used plus one. Padding gets 1, as in
// transformers. In a packed row (the attention mask numbering its examples 1, 2, ...) each example
// counts from 0, as it would alone.
//
// Failure: a run of image tokens whose length is not its image's token count, or more runs than
// images, is an error naming the row. Pure function on CPU tensors; any thread.
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

// input_ids and attention_mask (undefined: all real): i64 [batch, positions] on the CPU;
// `row_grids`: each row's images in order.
StatusOr<MultimodalPositions> ComputeMultimodalPositions(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const std::vector<std::vector<ImageGrid>>& row_grids, int64_t image_token_id,
    int64_t spatial_merge_size);

}  // namespace engine::transformer
