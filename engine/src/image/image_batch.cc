#include "engine/image_batch.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace engine {

void PackImages(const std::vector<ExampleImages>& examples, int64_t patch_values, Batch* batch) {
  int64_t most_patches = 0, most_images = 0;
  for (const ExampleImages& e : examples) {
    if (e.patches.defined()) most_patches = std::max(most_patches, e.patches.size(0));
    most_images = std::max<int64_t>(most_images, static_cast<int64_t>(e.grids.size()));
  }
  const auto rows = static_cast<int64_t>(examples.size());
  at::Tensor pixels = at::zeros({rows, most_patches, patch_values}, at::kFloat);
  at::Tensor grids = at::zeros({rows, most_images, 3}, at::kLong);
  auto g = grids.accessor<int64_t, 3>();
  for (int64_t row = 0; row < rows; ++row) {
    const ExampleImages& e = examples[static_cast<size_t>(row)];
    if (e.patches.defined() && e.patches.size(0) > 0) {
      pixels[row].narrow(0, 0, e.patches.size(0)).copy_(e.patches);
    }
    for (size_t i = 0; i < e.grids.size(); ++i) {
      g[row][static_cast<int64_t>(i)][0] = e.grids[i].t;
      g[row][static_cast<int64_t>(i)][1] = e.grids[i].h;
      g[row][static_cast<int64_t>(i)][2] = e.grids[i].w;
    }
  }
  (*batch)[kPixelValuesField] = pixels;
  (*batch)[kImageGridField] = grids;
}

StatusOr<ImagesOfBatch> UnpackImages(const Batch& batch, int64_t patch_values) {
  ImagesOfBatch out;
  auto pixels = batch.find(kPixelValuesField);
  auto grids = batch.find(kImageGridField);
  if (pixels == batch.end() && grids == batch.end()) return out;
  if (pixels == batch.end() || grids == batch.end()) {
    return InvalidArgumentError(std::string("the batch has one of '") + kPixelValuesField +
                                "' and '" + kImageGridField + "' without the other");
  }
  const at::Tensor& p = pixels->second;
  const at::Tensor g = grids->second.to(at::kCPU, at::kLong).contiguous();
  if (p.dim() != 3 || p.size(2) != patch_values || g.dim() != 3 || g.size(2) != 3 ||
      g.size(0) != p.size(0)) {
    return InvalidArgumentError(std::string("the batch's images must be '") + kPixelValuesField +
                                "' [batch, patches, " + std::to_string(patch_values) + "] and '" +
                                kImageGridField + "' [batch, images, 3], not " +
                                c10::str(p.sizes()) + " and " + c10::str(g.sizes()));
  }
  auto a = g.accessor<int64_t, 3>();
  std::vector<at::Tensor> parts;
  for (int64_t row = 0; row < g.size(0); ++row) {
    std::vector<ImageGrid> row_grids;
    int64_t patches = 0;
    for (int64_t i = 0; i < g.size(1) && a[row][i][0] > 0; ++i) {
      row_grids.push_back({a[row][i][0], a[row][i][1], a[row][i][2]});
      patches += row_grids.back().patches();
    }
    if (patches > p.size(1)) {
      return InvalidArgumentError("batch row " + std::to_string(row) + "'s image grids need " +
                                  std::to_string(patches) + " patches but '" + kPixelValuesField +
                                  "' holds " + std::to_string(p.size(1)));
    }
    if (patches > 0) parts.push_back(p[row].narrow(0, 0, patches));
    out.row_grids.push_back(std::move(row_grids));
  }
  if (!parts.empty()) out.pixel_values = at::cat(parts);
  return out;
}

}  // namespace engine
