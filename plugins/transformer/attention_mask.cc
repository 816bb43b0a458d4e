#include "attention_mask.h"

#include <ATen/ATen.h>

namespace engine::transformer {
namespace {

// A packed batch's mask numbers its examples 1, 2, ... (0: padding) instead of holding ones.
bool Packed(const at::Tensor& segments) {
  return segments.numel() > 0 && segments.max().item<int64_t>() > 1;
}

}  // namespace

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
    const at::Tensor segments = padding.to(device);
    const at::Tensor pad = segments.eq(0).view({padding.size(0), 1, 1, total});
    masked = masked.logical_or(pad);
    if (Packed(segments)) {
      // A real query sees only its own example's keys; padding queries keep the plain mask, so
      // that no row is fully masked.
      const at::Tensor queries = segments.narrow(1, offset, positions).unsqueeze(2);
      const at::Tensor keys = segments.unsqueeze(1);
      const at::Tensor other = queries.ne(keys).logical_and(queries.gt(0));
      masked = masked.logical_or(other.unsqueeze(1));
    }
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
  const at::Tensor segments = padding.to(device).to(at::kLong);
  const at::Tensor real = segments.gt(0).to(at::kLong);
  at::Tensor counted = real.cumsum(-1);
  if (Packed(segments)) {
    // Each example counts from 0: subtract the count before the example's first token.
    const int64_t total = segments.size(1);
    const at::Tensor index = at::arange(total, segments.options()).expand_as(segments);
    at::Tensor starts = segments.ne(at::roll(segments, 1, 1));
    starts.select(1, 0).fill_(true);
    const at::Tensor start = std::get<0>(at::where(starts, index, 0).cummax(1));
    counted = counted - counted.gather(1, start) + real.gather(1, start);
  }
  counted = (counted - 1).clamp_min(0);
  return counted.narrow(1, counted.size(1) - positions, positions);
}

}  // namespace engine::transformer
