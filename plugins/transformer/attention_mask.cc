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
    const at::Tensor segments = padding.to(device);
    const at::Tensor pad = segments.eq(0).view({padding.size(0), 1, 1, total});
    masked = masked.logical_or(pad);
    // Packed rows: a real query sees only its own example's keys. Padding queries keep the plain
    // mask, so that no row is fully masked. With a 0/1 mask this masks nothing more, so it is
    // computed for every mask instead of asking the device which kind this is.
    const at::Tensor queries = segments.narrow(1, offset, positions).unsqueeze(2);
    const at::Tensor keys = segments.unsqueeze(1);
    const at::Tensor other = queries.ne(keys).logical_and(queries.gt(0));
    masked = masked.logical_or(other.unsqueeze(1));
  }
  return masked;
}

at::Tensor KeyRanges(const at::Tensor& mask, int64_t batch) {
  const int64_t positions = mask.size(2), keys = mask.size(3);
  const at::Tensor visible = mask.logical_not().squeeze(1).expand({batch, positions, keys}).cpu();
  const at::Tensor count = visible.sum(-1);
  // argmax finds the first true; over the flipped keys, the last. Bytes: the copies are the
  // mask's size, not four times it.
  const at::Tensor as_bytes = visible.to(at::kByte);
  const at::Tensor first = as_bytes.argmax(-1);
  const at::Tensor end = keys - as_bytes.flip(-1).argmax(-1);
  const at::Tensor none = count.eq(0);
  // `visible` is a host copy: read in place, without an operator call per forward.
  const at::Tensor contiguous_rows = count.eq(end - first).logical_or(none).all();
  if (!*contiguous_rows.data_ptr<bool>()) return at::Tensor();
  return at::stack({first.masked_fill(none, 0), end.masked_fill(none, 0)}, -1)
      .to(at::kInt)
      .contiguous();
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
  // Each packed example counts from 0: a new example starts where the number changes between two
  // real tokens, and its positions are the real tokens counted since that start. A 0/1 mask has no
  // such start (padding is no example), so it counts every real token of the row, as before.
  const at::Tensor previous = at::roll(segments, 1, 1);
  at::Tensor starts = segments.ne(previous).logical_and(segments.gt(0)).logical_and(previous.gt(0));
  starts.select(1, 0).fill_(true);
  const at::Tensor index = at::arange(segments.size(1), segments.options()).expand_as(segments);
  const at::Tensor start = std::get<0>(index.mul(starts).cummax(1));
  const at::Tensor through = real.cumsum(-1);  // real tokens up to each position
  at::Tensor counted = through - (through - real).gather(1, start);
  counted = (counted - 1).clamp_min(0);
  return counted.narrow(1, counted.size(1) - positions, positions);
}

}  // namespace engine::transformer
