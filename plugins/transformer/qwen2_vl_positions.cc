#include "qwen2_vl_positions.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace engine::transformer {

StatusOr<MultimodalPositions> ComputeMultimodalPositions(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const std::vector<std::vector<ImageGrid>>& row_grids, int64_t image_token_id,
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
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<ImageGrid> no_images;
    const auto& grids = b < static_cast<int64_t>(row_grids.size()) ? row_grids[b] : no_images;
    size_t image = 0;
    int64_t next = 0;
    int64_t example = 0;  // the mask's number for the example a token belongs to
    for (int64_t i = 0; i < length;) {
      if (real[b][i] == 0) {
        ++i;
        continue;
      }
      if (real[b][i] != example) {  // a packed row's next example counts from 0 again
        example = real[b][i];
        next = 0;
      }
      if (id[b][i] != image_token_id) {
        p[0][b][i] = p[1][b][i] = p[2][b][i] = next++;
        ++i;
        continue;
      }
      int64_t run = 0;
      while (i + run < length && real[b][i + run] == example && id[b][i + run] == image_token_id) {
        ++run;
      }
      if (image >= grids.size()) {
        return InvalidArgumentError("row " + std::to_string(b) +
                                    " has more runs of image tokens than its " +
                                    std::to_string(grids.size()) + " image(s)");
      }
      const ImageGrid& g = grids[image++];
      const int64_t rows = g.h / spatial_merge_size, cols = g.w / spatial_merge_size;
      if (run != g.t * rows * cols) {
        return InvalidArgumentError("row " + std::to_string(b) + ": image " +
                                    std::to_string(image) + " has " + std::to_string(run) +
                                    " image tokens where its " + std::to_string(g.t) + "x" +
                                    std::to_string(g.h) + "x" + std::to_string(g.w) +
                                    " patches need " + std::to_string(g.t * rows * cols));
      }
      for (int64_t k = 0; k < run; ++k) {
        const int64_t frame = k / (rows * cols), row = k / cols % rows, col = k % cols;
        p[0][b][i + k] = next + frame;
        p[1][b][i + k] = next + row;
        p[2][b][i + k] = next + col;
      }
      next += std::max({g.t, rows, cols});
      i += run;
    }
    if (image != grids.size()) {
      return InvalidArgumentError("row " + std::to_string(b) + " has " +
                                  std::to_string(grids.size()) + " image(s) but " +
                                  std::to_string(image) + " run(s) of image tokens");
    }
    out.next.push_back(next);
  }
  out.position_ids = positions;
  return out;
}

}  // namespace engine::transformer
