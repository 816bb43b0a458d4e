// The optimizer's hot loops, fused into one pass over memory each (CPU; vectorised with AVX2 clones
// where the CPU has AVX2, parallel through ATen's thread pool):
//
//   FusedAdamW: decoupled weight decay, both moment updates, the bias-corrected step on the f32
//     master, reading a gradient in f32, bf16 or f16 (scaled by `grad_scale`, e.g. 1 / loss
//     scale), and optionally writing the updated weight's low-precision copy. LibTorch's AdamW
//     needs a cast of the gradient, five or six elementwise kernels and a cast of the result.
//   UnscaleAndCheckFinite: multiplies gradients by 1 / loss scale in place and reports whether
//     every value is finite, in one read and one write; AllFinite only checks.
//
// The arithmetic is the engine's AdamW (engine/src/train/optimizer.cc) in f32
// (adamw_coefficients.h), so results agree with it to rounding. Tensors must be contiguous, on one
// device, and of equal element counts; a violated precondition throws c10::Error. Where LibTorch
// has CUDA, CUDA tensors run the kernels of fused_adamw_cuda.h on the current stream. Callers own
// all tensors; no state is kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace engine::kernels {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weight_decay = 0.01;
  int64_t step = 1;  // after incrementing: the first update is step 1
};

// Whether the non-finite checks below take this gradient: contiguous f32/bf16/f16 on the CPU, or on
// a CUDA device where this build has the CUDA kernels (else the caller uses ATen ops).
bool FusedKernelsTake(const at::Tensor& grad);

// Whether FusedAdamW takes these tensors (else the caller falls back to ATen ops).
bool FusedAdamWSupports(const at::Tensor& master, const at::Tensor& grad);

// master, exp_avg, exp_avg_sq: f32. grad: f32, bf16 or f16. low_precision_copy: undefined, or bf16
// / f16 receiving the updated master.
void FusedAdamW(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& exp_avg,
                const at::Tensor& exp_avg_sq, const AdamWHyper& hyper, double grad_scale = 1.0,
                const at::Tensor& low_precision_copy = at::Tensor());

// grad: f32, bf16 or f16. Returns false when any value (before scaling) is inf or NaN; the values
// are scaled either way.
bool UnscaleAndCheckFinite(const at::Tensor& grad, double inverse_scale);

// Whether every value of `grad` (f32, bf16 or f16) is finite, in one read and no write: the check
// for a gradient whose unscaling FusedAdamW does itself (`grad_scale`).
bool AllFinite(const at::Tensor& grad);

// The same two checks for many tensors and one read at the end (no device synchronisation per
// tensor): `found_nonfinite` is one int32 on the gradient's device, set to 1 when a value is inf
// or NaN and left as it was otherwise. On the CPU or, where wired in, a CUDA device.
void UnscaleAndFlagNonFinite(const at::Tensor& grad, double inverse_scale,
                             const at::Tensor& found_nonfinite);
void FlagNonFinite(const at::Tensor& grad, const at::Tensor& found_nonfinite);

}  // namespace engine::kernels
