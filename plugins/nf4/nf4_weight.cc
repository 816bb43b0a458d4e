#include "nf4_weight.h"

namespace engine::plugins {

at::Tensor Nf4Weight::DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const {
  return kernels::DequantizeNf4Range(q_, begin * cols(), end * cols(), dtype)
      .view({end - begin, cols()});
}

std::vector<std::pair<std::string, at::Tensor>> Nf4Weight::tensors() const {
  if (!q_.double_quantized()) return {{"weight", q_.packed}, {"weight_absmax", q_.absmax}};
  return {{"weight", q_.packed},
          {"weight_nested_codes", q_.absmax_codes},
          {"weight_nested_absmax", q_.absmax_scales},
          {"weight_nested_offset", q_.absmax_mean}};
}

StatusOr<std::shared_ptr<QuantizedWeight>> Nf4Weight::QuantizeLike(const at::Tensor& dense) const {
  if (dense.sizes().vec() != q_.shape) {
    return InvalidArgumentError("nf4: the new weight's shape differs from the quantized one");
  }
  return std::shared_ptr<QuantizedWeight>(std::make_shared<Nf4Weight>(
      kernels::QuantizeNf4(dense.detach().cpu(), q_.block_size, q_.double_quantized()), compute_));
}

}  // namespace engine::plugins
