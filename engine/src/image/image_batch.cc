#include "engine/image_batch.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace engine {

void PackImages(const std::vector<ExampleImages>& examples, int64_t patch_values, Batch* batch,
                const VisualFields& fields) {
  int64_t most_patches = 0, most_images = 0;
  for (const ExampleImages& e : examples) {
    if (e.patches.defined()) most_patches = std::max(most_patches, e.patches.size(0));
    most_images = std::max<int64_t>(most_images, static_cast<int64_t>(e.grids.size()));
  }
  const auto rows = static_cast<int64_t>(examples.size());
  at::Tensor pixels = at::zeros({rows, most_patches, patch_values}, at::kFloat);
  at::Tensor grids = at::zeros({rows, most_images, 3}, at::kLong);
  at::Tensor seconds = at::zeros({rows, most_images}, at::kFloat);
  auto g = grids.accessor<int64_t, 3>();
  auto s = seconds.accessor<float, 2>();
  for (int64_t row = 0; row < rows; ++row) {
    const ExampleImages& e = examples[static_cast<size_t>(row)];
    if (e.patches.defined() && e.patches.size(0) > 0) {
      pixels[row].narrow(0, 0, e.patches.size(0)).copy_(e.patches);
    }
    for (size_t i = 0; i < e.grids.size(); ++i) {
      const auto at = static_cast<int64_t>(i);
      g[row][at][0] = e.grids[i].t;
      g[row][at][1] = e.grids[i].h;
      g[row][at][2] = e.grids[i].w;
      if (i < e.seconds_per_grid.size()) s[row][at] = static_cast<float>(e.seconds_per_grid[i]);
    }
  }
  (*batch)[fields.pixels] = pixels;
  (*batch)[fields.grids] = grids;
  if (fields.seconds != nullptr) (*batch)[fields.seconds] = seconds;
}

StatusOr<ImagesOfBatch> UnpackImages(const Batch& batch, int64_t patch_values,
                                     const VisualFields& fields) {
  ImagesOfBatch out;
  auto pixels = batch.find(fields.pixels);
  auto grids = batch.find(fields.grids);
  if (pixels == batch.end() && grids == batch.end()) return out;
  if (pixels == batch.end() || grids == batch.end()) {
    return InvalidArgumentError(std::string("the batch has one of '") + fields.pixels + "' and '" +
                                fields.grids + "' without the other");
  }
  const at::Tensor& p = pixels->second;
  const at::Tensor g = grids->second.to(at::kCPU, at::kLong).contiguous();
  if (p.dim() != 3 || p.size(2) != patch_values || g.dim() != 3 || g.size(2) != 3 ||
      g.size(0) != p.size(0)) {
    return InvalidArgumentError(std::string("the batch's ") + fields.noun + "s must be '" +
                                fields.pixels + "' [batch, patches, " +
                                std::to_string(patch_values) + "] and '" + fields.grids +
                                "' [batch, " + fields.noun + "s, 3], not " + c10::str(p.sizes()) +
                                " and " + c10::str(g.sizes()));
  }
  at::Tensor seconds;
  if (fields.seconds != nullptr) {
    auto found = batch.find(fields.seconds);
    if (found == batch.end() || found->second.dim() != 2 || found->second.size(0) != g.size(0) ||
        found->second.size(1) != g.size(1)) {
      return InvalidArgumentError(std::string("the batch's ") + fields.noun + "s need '" +
                                  fields.seconds + "' [batch, " + fields.noun + "s] beside '" +
                                  fields.grids + "' " + c10::str(g.sizes()));
    }
    seconds = found->second.to(at::kCPU, at::kDouble).contiguous();
  }
  auto a = g.accessor<int64_t, 3>();
  std::vector<at::Tensor> parts;
  for (int64_t row = 0; row < g.size(0); ++row) {
    std::vector<ImageGrid> row_grids;
    std::vector<double> row_seconds;
    int64_t patches = 0;
    for (int64_t i = 0; i < g.size(1) && a[row][i][0] > 0; ++i) {
      row_grids.push_back({a[row][i][0], a[row][i][1], a[row][i][2]});
      if (seconds.defined()) row_seconds.push_back(seconds[row][i].item<double>());
      patches += row_grids.back().patches();
    }
    if (patches > p.size(1)) {
      return InvalidArgumentError("batch row " + std::to_string(row) + "'s " + fields.noun +
                                  " grids need " + std::to_string(patches) + " patches but '" +
                                  fields.pixels + "' holds " + std::to_string(p.size(1)));
    }
    if (patches > 0) parts.push_back(p[row].narrow(0, 0, patches));
    out.row_grids.push_back(std::move(row_grids));
    out.row_seconds_per_grid.push_back(std::move(row_seconds));
  }
  if (!parts.empty()) out.pixel_values = at::cat(parts);
  return out;
}

}  // namespace engine
