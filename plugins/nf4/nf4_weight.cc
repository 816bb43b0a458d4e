#include "nf4_weight.h"

#include "engine_kernels/cpu_kernels_switch.h"

namespace engine::plugins {

at::Tensor Nf4Weight::DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const {
  return kernels::DequantizeNf4Range(q_, begin * cols(), end * cols(), dtype)
      .view({end - begin, cols()});
}

// In bf16 the tiled path's GEMM catches up from about 8 rows of x (bench/quant_bench --tokens N on
// a 2-core AMD EPYC, 4096 x 4096: 1.4-1.8x faster up to 4 rows, even at 8, 0.7x at 16); in f32
// the kernel stays ahead up to 16 (1.5-4.5x).
constexpr int64_t kBf16FewRows = 4;

at::Tensor Nf4Weight::MatmulFewRows(const at::Tensor& x, c10::ScalarType compute) const {
  if (!kernels::CpuKernelsSwitchedOn() || !kernels::Nf4MatmulRowsSupports(q_, x, compute) ||
      (compute == at::kBFloat16 && x.size(0) > kBf16FewRows)) {
    return at::Tensor();
  }
  return kernels::Nf4MatmulRows(x, q_, compute);
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
