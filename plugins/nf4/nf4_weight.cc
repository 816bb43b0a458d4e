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
// On a GPU the kernel reads all of x for each weight row: on an H200 (bench/nf4_cuda_bench,
// 4096 x 4096, bf16, 2026-11-29) it took 0.59x the time of dequantize + GEMM for 1 row, 2.1x for
// 4 and 7.5x for 16. One generated token of one prompt takes it.
constexpr int64_t kGpuFewRows = 1;

at::Tensor Nf4Weight::MatmulFewRows(const at::Tensor& x, c10::ScalarType compute) const {
  const bool taken = x.is_cuda() ? x.size(0) <= kGpuFewRows
                                 : kernels::CpuKernelsSwitchedOn() &&
                                       (compute != at::kBFloat16 || x.size(0) <= kBf16FewRows);
  if (!taken || !kernels::Nf4MatmulRowsSupports(q_, x, compute)) return at::Tensor();
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
