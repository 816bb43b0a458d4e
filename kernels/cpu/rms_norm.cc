#include "engine_kernels/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernel_support.h"

namespace engine::kernels {
namespace {

#define ENGINE_KERNEL_TILES "rms_norm_tiles.inc"
#include "per_isa.inc"

constexpr int64_t kWeightGradChunks = 32;

}  // namespace

bool RmsNormSupports(const at::Tensor& x, const at::Tensor& weight) {
  const auto low_or_f32 = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; };
  return x.device().is_cpu() && weight.device().is_cpu() && x.dim() >= 1 && weight.dim() == 1 &&
         weight.size(0) == x.size(-1) && x.size(-1) > 0 && low_or_f32(x.scalar_type()) &&
         low_or_f32(weight.scalar_type()) && x.is_contiguous() && weight.is_contiguous();
}

RmsNormOutput RmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(RmsNormSupports(x, weight), "RMSNorm needs a contiguous CPU f32/bf16 input and a ",
              "weight of its last size, got ", x.sizes(), " ", x.scalar_type(), " and ",
              weight.sizes(), " ", weight.scalar_type());
  const int64_t size = x.size(-1), rows = x.numel() / size;
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  RmsNormOutput result;
  result.out = at::empty(
      x.sizes(), x.options().dtype(c10::promoteTypes(x.scalar_type(), weight.scalar_type())));
  result.rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  float* rstd = result.rstd.data_ptr<float>();
  std::vector<float> weight_buffer(static_cast<size_t>(size));
  const float* w = ReadF32(weight, 0, size, weight_buffer.data());
  const auto sum_squares = ENGINE_PICK_ISA(SumSquares);
  const auto normalize = ENGINE_PICK_ISA(NormalizeRow);
  at::parallel_for(0, rows, GrainFor(size), [&](int64_t begin, int64_t end) {
    std::vector<float> in(static_cast<size_t>(size)), out(static_cast<size_t>(size));
    for (int64_t row = begin; row < end; ++row) {
      const float* xr = ReadF32(x, row * size, size, in.data());
      const float mean = sum_squares(xr, size) / static_cast<float>(size);
      const float r = 1.0f / std::sqrt(mean + static_cast<float>(eps));
      rstd[row] = r;
      float* y = WritableF32(result.out, row * size, out.data());
      normalize(xr, r, w, bf16, y, size);
      CommitF32(y, result.out, row * size, size);
    }
  });
  return result;
}

RmsNormGrads RmsNormBackward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& rstd) {
  TORCH_CHECK(RmsNormSupports(x, weight) && grad.device().is_cpu() && grad.is_contiguous() &&
                  grad.sizes() == x.sizes() &&
                  (grad.scalar_type() == at::kFloat || grad.scalar_type() == at::kBFloat16),
              "RMSNorm backward: the gradient ", grad.sizes(), " ", grad.scalar_type(),
              " does not fit the input ", x.sizes());
  const int64_t size = x.size(-1), rows = x.numel() / size;
  TORCH_CHECK(rstd.numel() == rows && rstd.scalar_type() == at::kFloat && rstd.is_contiguous(),
              "RMSNorm backward: rstd must hold one f32 per row");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  RmsNormGrads grads;
  grads.x = at::empty(x.sizes(), x.options());
  const float* r = rstd.data_ptr<float>();
  std::vector<float> weight_buffer(static_cast<size_t>(size));
  const float* w = ReadF32(weight, 0, size, weight_buffer.data());
  // The weight's gradient: a partial sum per chunk of rows, then the chunks in order, so that
  // the result depends neither on the thread count nor on which thread ran what.
  const int64_t chunks = std::min<int64_t>(rows, kWeightGradChunks);
  std::vector<float> partial(static_cast<size_t>(std::max<int64_t>(chunks, 1) * size), 0.0f);
  const auto backward = ENGINE_PICK_ISA(NormalizeRowBackward);
  const int64_t rows_per_chunk = (rows + chunks - 1) / std::max<int64_t>(chunks, 1);
  at::parallel_for(0, chunks, GrainFor(rows_per_chunk * size), [&](int64_t begin, int64_t end) {
    std::vector<float> dy(static_cast<size_t>(size)), in(static_cast<size_t>(size)),
        dx(static_cast<size_t>(size));
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      float* dw = partial.data() + chunk * size;
      for (int64_t row = chunk * rows / chunks; row < (chunk + 1) * rows / chunks; ++row) {
        float* out = WritableF32(grads.x, row * size, dx.data());
        backward(ReadF32(grad, row * size, size, dy.data()),
                 ReadF32(x, row * size, size, in.data()), w, r[row], bf16, out, dw, size);
        CommitF32(out, grads.x, row * size, size);
      }
    }
  });
  at::Tensor weight_grad = at::zeros({size}, x.options().dtype(at::kFloat));
  float* total = weight_grad.data_ptr<float>();
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    for (int64_t i = 0; i < size; ++i) total[i] += partial[chunk * size + i];
  }
  grads.weight = weight_grad.to(weight.scalar_type());
  return grads;
}

}  // namespace engine::kernels
