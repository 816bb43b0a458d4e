// CUDA twins of the fused AdamW and the non-finite checks (fused_adamw.h), on raw device pointers
// (no LibTorch types, so they compile without LibTorch's CUDA headers). Built only when nvcc is
// present; wired into fused_adamw.h's entry points where LibTorch has CUDA. Each returns the
// launch's cudaError_t as an int (0 on success); the caller owns every buffer and the stream and
// keeps them alive until the stream has run the kernel.
#pragma once

#include <cstdint>

#include "engine_kernels/adamw_coefficients.h"

namespace engine::kernels::cuda {

// master, exp_avg, exp_avg_sq: f32, `n` elements. grad: `grad_type` (f32, bf16 or f16). low: the
// updated master's low-precision copy (`low_type` bf16 or f16), or null with kNone.
int FusedAdamW(float* master, const void* grad, KernelDtype grad_type, float* exp_avg,
               float* exp_avg_sq, int64_t n, const AdamWCoefficients& c, void* low,
               KernelDtype low_type, void* stream);

// Sets *found_nonfinite (a device int) to 1 when a value of grad is inf or NaN, leaving it as it
// was otherwise; with `unscale`, also multiplies every value by `inverse_scale` in place.
int FlagNonFinite(void* grad, KernelDtype grad_type, int64_t n, bool unscale, float inverse_scale,
                  int* found_nonfinite, void* stream);

}  // namespace engine::kernels::cuda
