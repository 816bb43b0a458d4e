#include "qwen2_vl_positions.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

namespace engine::transformer {
namespace {

// The visual inputs of one kind in a row, consumed in order by its runs of tokens.
struct VisualQueue {
  const char* noun;  // "image", "video"
  const std::vector<ImageGrid>* grids;
  const std::vector<int64_t>* time_steps;  // null: 1
  size_t next = 0;
};

}  // namespace

StatusOr<MultimodalPositions> ComputeMultimodalPositions(const at::Tensor& input_ids,
                                                         const at::Tensor& attention_mask,
                                                         const std::vector<RowVisuals>& rows,
                                                         int64_t image_token_id,
                                                         int64_t video_token_id,
                                                         int64_t spatial_merge_size) {
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  const at::Tensor ids = input_ids.to(at::kLong).contiguous();
  const at::Tensor mask =
      attention_mask.defined() ? attention_mask.to(at::kLong).contiguous() : at::ones_like(ids);
  at::Tensor positions = at::ones({3, batch, length}, at::kLong);
  auto p = positions.accessor<int64_t, 3>();
  auto id = ids.accessor<int64_t, 2>();
  auto real = mask.accessor<int64_t, 2>();
  MultimodalPositions out;
  const RowVisuals no_visuals;
  for (int64_t b = 0; b < batch; ++b) {
    const RowVisuals& row = b < static_cast<int64_t>(rows.size()) ? rows[b] : no_visuals;
    VisualQueue images{"image", &row.images, nullptr};
    VisualQueue videos{"video", &row.videos, &row.video_time_steps};
    int64_t next = 0, largest = -1;
    int64_t example = 0;  // the mask's number for the example a token belongs to
    for (int64_t i = 0; i < length;) {
      if (real[b][i] == 0) {
        ++i;
        continue;
      }
      if (real[b][i] != example) {  // a packed row's next example counts from 0 again
        example = real[b][i];
        next = 0;
        largest = -1;
      }
      const int64_t token = id[b][i];
      VisualQueue* queue = token == image_token_id   ? &images
                           : token == video_token_id ? &videos
                                                     : nullptr;
      if (queue == nullptr) {
        p[0][b][i] = p[1][b][i] = p[2][b][i] = next;
        largest = std::max(largest, next++);
        ++i;
        continue;
      }
      int64_t run = 0;
      while (i + run < length && real[b][i + run] == example && id[b][i + run] == token) ++run;
      const std::string noun = queue->noun;
      if (queue->next >= queue->grids->size()) {
        return InvalidArgumentError("row " + std::to_string(b) + " has more runs of " + noun +
                                    " tokens than its " + std::to_string(queue->grids->size()) +
                                    " " + noun + "(s)");
      }
      const size_t index = queue->next++;
      const ImageGrid& g = (*queue->grids)[index];
      const int64_t step = queue->time_steps != nullptr && index < queue->time_steps->size()
                               ? (*queue->time_steps)[index]
                               : 1;
      const int64_t grid_rows = g.h / spatial_merge_size, cols = g.w / spatial_merge_size;
      if (run != g.t * grid_rows * cols) {
        return InvalidArgumentError("row " + std::to_string(b) + ": " + noun + " " +
                                    std::to_string(index + 1) + " has " + std::to_string(run) +
                                    " " + noun + " tokens where its " + std::to_string(g.t) + "x" +
                                    std::to_string(g.h) + "x" + std::to_string(g.w) +
                                    " patches need " + std::to_string(g.t * grid_rows * cols));
      }
      for (int64_t k = 0; k < run; ++k) {
        const int64_t frame = k / (grid_rows * cols), r = k / cols % grid_rows, col = k % cols;
        p[0][b][i + k] = next + frame * step;
        p[1][b][i + k] = next + r;
        p[2][b][i + k] = next + col;
      }
      largest = std::max({largest, next + (g.t - 1) * step, next + grid_rows - 1, next + cols - 1});
      next += std::max(grid_rows, cols);
      i += run;
    }
    for (const VisualQueue* queue : {&images, &videos}) {
      if (queue->next != queue->grids->size()) {
        return InvalidArgumentError("row " + std::to_string(b) + " has " +
                                    std::to_string(queue->grids->size()) + " " + queue->noun +
                                    "(s) but " + std::to_string(queue->next) + " run(s) of " +
                                    queue->noun + " tokens");
      }
    }
    out.next.push_back(largest + 1);
  }
  out.position_ids = positions;
  return out;
}

StatusOr<MultimodalPositions> ComputeMultimodalPositions(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const std::vector<std::vector<ImageGrid>>& row_grids, int64_t image_token_id,
    int64_t spatial_merge_size) {
  std::vector<RowVisuals> rows(row_grids.size());
  for (size_t i = 0; i < row_grids.size(); ++i) rows[i].images = row_grids[i];
  return ComputeMultimodalPositions(input_ids, attention_mask, rows, image_token_id,
                                    /*video_token_id=*/-1, spatial_merge_size);
}

}  // namespace engine::transformer
