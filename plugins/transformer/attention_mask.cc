#include "attention_mask.h"

#include <ATen/ATen.h>

namespace engine::transformer {

at::Tensor BuildAttentionMask(const at::Tensor& padding, int64_t positions, int64_t offset,
                              int64_t window, const at::Device& device) {
  const int64_t total = offset + positions;
  const bool causal = positions > 1;
  const bool slides = window > 0 && total > window;
  if (!causal && !slides && !padding.defined()) return at::Tensor();
  const auto i64 = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor rows = at::arange(offset, total, i64).unsqueeze(1);  // query indices
  const at::Tensor cols = at::arange(total, i64).unsqueeze(0);          // key indices
  at::Tensor masked = cols > rows;
  if (slides) masked = masked.logical_or(cols <= rows - window);
  masked = masked.view({1, 1, positions, total});
  if (padding.defined()) {
    const at::Tensor pad = padding.to(device).eq(0).view({padding.size(0), 1, 1, total});
    masked = masked.logical_or(pad);
  }
  return masked;
}

at::Tensor PositionIds(const at::Tensor& padding, int64_t positions, int64_t offset,
                       const at::Device& device) {
  if (!padding.defined()) {
    return at::arange(offset, offset + positions,
                      at::TensorOptions().dtype(at::kLong).device(device))
        .unsqueeze(0);
  }
  const at::Tensor real = padding.to(device).to(at::kLong);
  const at::Tensor counted = (real.cumsum(-1) - 1).clamp_min(0);
  return counted.narrow(1, counted.size(1) - positions, positions);
}

}  // namespace engine::transformer
