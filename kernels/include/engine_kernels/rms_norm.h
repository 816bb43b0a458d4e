// RMSNorm as Llama-family decoders compute it, forward and backward in one pass per row (CPU):
//
//   y = weight * to_dtype(x, f32(x) * rsqrt(mean(f32(x)^2) + eps))
//
// with x's dtype restored before the weight multiplies (transformers' LlamaRMSNorm), so y has the
// promoted dtype of x and weight (bf16 activations and f32 weights give f32, as in eager autocast).
// Eager LibTorch takes about six kernels forward and ten backward over the activations; here one
// pass forward and two reads of each row backward, vectorised, with the weight's gradient summed
// per thread and then in a fixed order (deterministic).
//
// x: contiguous, f32 or bf16, on the CPU, normalised over its last dimension; weight: [that size],
// f32 or bf16 (RmsNormSupports). The gradient: contiguous, y's shape, f32 or bf16. Violations throw
// c10::Error. Parallel through ATen's thread pool; AVX2/FMA where the CPU has them. No state kept.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine::kernels {

bool RmsNormSupports(const at::Tensor& x, const at::Tensor& weight);

struct RmsNormOutput {
  at::Tensor out;
  at::Tensor rstd;  // [rows] f32: each row's rsqrt(mean(x^2) + eps), for the backward
};
RmsNormOutput RmsNormForward(const at::Tensor& x, const at::Tensor& weight, double eps);

struct RmsNormGrads {
  at::Tensor x, weight;
};
RmsNormGrads RmsNormBackward(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                             const at::Tensor& rstd);

}  // namespace engine::kernels
