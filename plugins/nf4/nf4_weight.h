// A weight held as NF4 codes (engine_kernels/nf4.h) behind engine::QuantizedWeight: what every
// layer the `nf4` quantizer quantizes holds, and what the 4-bit matmul benchmarks multiply with.
// Built as a static library of its own so the benchmarks use the plugin's class without loading the
// plugin.
//
// Stored tensors, named as the layer's buffers: "weight" (u8, two codes per byte, first element
// high), and either "weight_absmax" (f32 per block) or, double-quantized as bitsandbytes does it,
// "weight_nested_codes" (u8 per block, indices into its dynamic map), "weight_nested_absmax" (f32
// per 256 blocks) and "weight_nested_offset" (f32). Checkpoints of nf4 0.1.0 named a linear 8-bit
// code "weight_absmax_codes": they are refused by that name, never decoded the new way.
//
// Immutable once made; safe to read from any thread. Dequantizes on the device the codes are on.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/few_rows_matmul.h"
#include "engine/linear.h"
#include "engine_kernels/nf4.h"

namespace engine::plugins {

// FewRowsMatmul: the product with a few rows, on the CPU or a GPU, straight from the codes
// (Nf4MatmulRows).
class Nf4Weight : public QuantizedWeight, public FewRowsMatmul {
 public:
  Nf4Weight(kernels::Nf4Tensor q, c10::ScalarType compute) : q_(std::move(q)), compute_(compute) {}

  std::string format() const override { return "nf4"; }
  int64_t rows() const override { return q_.shape[0]; }
  int64_t cols() const override { return q_.shape[1]; }
  c10::ScalarType compute_dtype() const override { return compute_; }
  at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const override;
  std::vector<std::pair<std::string, at::Tensor>> tensors() const override;
  StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(const at::Tensor& dense) const override;
  at::Tensor MatmulFewRows(const at::Tensor& x, c10::ScalarType compute) const override;

  const kernels::Nf4Tensor& codes() const { return q_; }

 private:
  kernels::Nf4Tensor q_;
  c10::ScalarType compute_;
};

}  // namespace engine::plugins
