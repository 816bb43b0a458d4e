// An optional second interface of an engine::QuantizedWeight: its product with a few rows of
// input computed from the stored format directly, without the dense tiles the general path
// dequantizes. That path pays a dense copy of the weight per call, which for one generated token
// is nearly the whole cost.
//
// engine::Linear asks a quantized weight for it (dynamic_cast) when an input, on any device, has
// at most kMaxRows rows; a format without it, or a call it declines, takes the tiled path. A
// quantizer plugin built before this interface existed simply does not have it. Threads: as
// QuantizedWeight (immutable, any thread).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace engine {

class FewRowsMatmul {
 public:
  static constexpr int64_t kMaxRows = 16;

  virtual ~FewRowsMatmul();
  // y [n, rows] = x [n, cols] @ W^T in `compute` (the layer's compute dtype, which need not be
  // the weight's declared one), computed as the tiled path computes it (x rounded to `compute`,
  // products and sums in f32, y rounded); undefined when this input is not one it takes.
  virtual at::Tensor MatmulFewRows(const at::Tensor& x, c10::ScalarType compute) const = 0;
};

}  // namespace engine
