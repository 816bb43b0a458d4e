#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "engine_kernels/fused_adamw_cuda.h"

namespace engine::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float Load(const __half* p, int64_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void Store(float* p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float x) {
  p[i] = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void Store(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }

// One element per thread and grid-stride iteration: the same f32 expression as the CPU kernel
// (adamw_coefficients.h), so the two agree to rounding.
template <typename G, typename L>
__global__ void AdamWKernel(float* p, const G* g, float* m, float* v, int64_t n,
                            AdamWCoefficients c, L* low) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float grad = Load(g, i) * c.grad_scale;
    const float param = p[i] * c.decay;
    const float mi = m[i] * c.b1 + c.one_minus_b1 * grad;
    const float vi = v[i] * c.b2 + c.one_minus_b2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    const float updated = param - c.step_size * (mi / (sqrtf(vi) * c.inv_bias2_sqrt + c.eps));
    p[i] = updated;
    if (low != nullptr) Store(low, i, updated);
  }
}

template <typename G>
__global__ void NonFiniteKernel(G* g, int64_t n, bool unscale, float inverse, int* found) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float x = Load(g, i);
    bad |= !isfinite(x);
    if (unscale) Store(g, i, x * inverse);
  }
  // Benign race: every writer writes 1.
  if (bad) *found = 1;
}

int Blocks(int64_t n) {
  const int64_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<int>(wanted < 65535 * 8 ? (wanted > 0 ? wanted : 1) : 65535 * 8);
}

template <typename G>
int LaunchAdamW(float* p, const void* grad, float* m, float* v, int64_t n,
                const AdamWCoefficients& c, void* low, KernelDtype low_type, cudaStream_t stream) {
  const G* g = static_cast<const G*>(grad);
  switch (low_type) {
    case KernelDtype::kNone:
      AdamWKernel<G, float><<<Blocks(n), kThreads, 0, stream>>>(p, g, m, v, n, c, nullptr);
      break;
    case KernelDtype::kBF16:
      AdamWKernel<<<Blocks(n), kThreads, 0, stream>>>(p, g, m, v, n, c,
                                                      static_cast<__nv_bfloat16*>(low));
      break;
    case KernelDtype::kF16:
      AdamWKernel<<<Blocks(n), kThreads, 0, stream>>>(p, g, m, v, n, c, static_cast<__half*>(low));
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int FusedAdamW(float* master, const void* grad, KernelDtype grad_type, float* exp_avg,
               float* exp_avg_sq, int64_t n, const AdamWCoefficients& c, void* low,
               KernelDtype low_type, void* stream) {
  if (n <= 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (grad_type) {
    case KernelDtype::kF32:
      return LaunchAdamW<float>(master, grad, exp_avg, exp_avg_sq, n, c, low, low_type, s);
    case KernelDtype::kBF16:
      return LaunchAdamW<__nv_bfloat16>(master, grad, exp_avg, exp_avg_sq, n, c, low, low_type, s);
    case KernelDtype::kF16:
      return LaunchAdamW<__half>(master, grad, exp_avg, exp_avg_sq, n, c, low, low_type, s);
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

int FlagNonFinite(void* grad, KernelDtype grad_type, int64_t n, bool unscale, float inverse_scale,
                  int* found_nonfinite, void* stream) {
  if (n <= 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (grad_type) {
    case KernelDtype::kF32:
      NonFiniteKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<float*>(grad), n, unscale,
                                                     inverse_scale, found_nonfinite);
      break;
    case KernelDtype::kBF16:
      NonFiniteKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(grad), n, unscale,
                                                     inverse_scale, found_nonfinite);
      break;
    case KernelDtype::kF16:
      NonFiniteKernel<<<Blocks(n), kThreads, 0, s>>>(static_cast<__half*>(grad), n, unscale,
                                                     inverse_scale, found_nonfinite);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace engine::kernels::cuda
