// SwiGLU, the gated MLP activation silu(gate) * up, forward and backward in one pass each (CPU).
//
// Eager LibTorch runs silu (a scalar exp per element in LibTorch 1.13's CPU build), a product, and
// backward silu_backward and two products, each a pass over [tokens, intermediate] memory and a
// fresh tensor. Here each pass reads its inputs once and writes its outputs once, with a
// vectorised exp, computing in f32 and rounding once to the inputs' dtype.
//
// gate and up: the same shape, contiguous, the same dtype (f32, bf16 or f16), on the CPU
// (SwiGluSupports). The gradient may have any of those dtypes; it must be contiguous and of the
// same shape. Outputs have gate's dtype. Violations throw c10::Error. Parallel through ATen's
// thread pool; AVX2/FMA where the CPU has them. No state is kept.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine::kernels {

bool SwiGluSupports(const at::Tensor& gate, const at::Tensor& up);

at::Tensor SwiGluForward(const at::Tensor& gate, const at::Tensor& up);

struct SwiGluGrads {
  at::Tensor gate, up;
};
SwiGluGrads SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);

}  // namespace engine::kernels
