// The per-step constants of the fused AdamW update, in f32, shared by the CPU and CUDA kernels so
// both compute the same expression (no LibTorch types: the .cu files include it):
//
//   g  = grad * grad_scale
//   m  = b1 * m + one_minus_b1 * g
//   v  = b2 * v + one_minus_b2 * g * g
//   p  = p * decay - step_size * m / (sqrt(v) * inv_bias2_sqrt + eps)
//
// with decay = 1 - lr * weight_decay, step_size = lr / (1 - b1^t), inv_bias2_sqrt =
// 1 / sqrt(1 - b2^t).
#pragma once

namespace engine::kernels {

struct AdamWCoefficients {
  float decay, b1, one_minus_b1, b2, one_minus_b2, inv_bias2_sqrt, eps, step_size, grad_scale;
};

// Element types the kernels read and write, by code (the CUDA entry points take plain ints).
enum class KernelDtype : int { kF32 = 0, kBF16 = 1, kF16 = 2, kNone = -1 };

}  // namespace engine::kernels
