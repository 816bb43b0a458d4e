// SwiGLU, the gated MLP activation silu(gate) * up, forward and backward in one pass each (CPU).
//
// Eager LibTorch runs silu (a scalar exp per element in LibTorch 1.13's CPU build), a product, and
// backward silu_backward and two products, each a pass over [tokens, intermediate] memory and a
// fresh tensor. Here each pass reads its inputs once and writes its outputs once, with a
// vectorised exp, computing in f32 and rounding once to the inputs' dtype.
//
// gate and up: the same shape and dtype (f32, bf16 or f16), on the CPU, each made of rows of unit
// stride (contiguous, or a slice of the last dimension: the two halves of one fused gate/up
// projection) (SwiGluSupports). The gradient may have any of those dtypes, laid out likewise. The
// forward's output is contiguous; gradients have gate's dtype, or go into the caller's tensors.
// Violations throw c10::Error. Parallel through ATen's thread pool; AVX2/FMA where the CPU has
// them. No state is kept.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine::kernels {

bool SwiGluSupports(const at::Tensor& gate, const at::Tensor& up);

at::Tensor SwiGluForward(const at::Tensor& gate, const at::Tensor& up);

struct SwiGluGrads {
  at::Tensor gate, up;
};
// `into`: null, or tensors of gate's shape laid out in rows (e.g. the halves of one fused
// gradient) to write the gradients into.
SwiGluGrads SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                           const SwiGluGrads* into = nullptr);

}  // namespace engine::kernels
