// The one place where LibTorch versions differ (Debian's 1.13 and the 2.x inside PyTorch).
//
// Code elsewhere includes this instead of testing TORCH_VERSION_* itself, so a new LibTorch release
// means editing one file.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <torch/version.h>

#include <cstdint>

#define ENGINE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace engine::compat {

// The LibTorch headers this code was compiled against, e.g. "1.13.0".
inline constexpr const char* kTorchVersion = TORCH_VERSION;

// Whether the LibTorch this process runs with was built with CUDA and sees a device.
bool CudaAvailable();
int CudaDeviceCount();

// The CUDA caching allocator's statistics for the current device, summed over pools; false (and
// nothing filled) when this build has no CUDA or no device is in use.
bool CudaMemory(int64_t* allocated, int64_t* reserved, int64_t* peak_allocated);

// Autocast state of the calling thread for one device type (kCPU or kCUDA). LibTorch 1.13 to 2.3
// have per-device functions (set_cpu_enabled, set_autocast_gpu_dtype, ...); 2.4 and later take the
// device type. SetAutocastDtype throws c10::Error when this LibTorch cannot autocast to `dtype`
// there.
bool AutocastEnabled(c10::DeviceType device_type);
void SetAutocastEnabled(c10::DeviceType device_type, bool enabled);
c10::ScalarType AutocastDtype(c10::DeviceType device_type);
void SetAutocastDtype(c10::DeviceType device_type, c10::ScalarType dtype);
// Autocast caches casts of weights within a region; the outermost region's exit must clear it.
int IncrementAutocastNesting();
int DecrementAutocastNesting();
void ClearAutocastCache();

// LibTorch's fused attention, softmax(q k^T * scale + bias) v, with its flash and
// memory-efficient kernels (2.1 and later: scaled_dot_product_attention with a scale). q, k, v:
// [batch, heads, positions, head_dim] with as many key heads as query heads. `bias`: added to the
// scores, broadcastable to [batch, heads, queries, keys], of q's dtype, or undefined; `causal`: a
// causal mask instead (with an undefined bias). Throws c10::Error on a LibTorch without it.
bool HasScaledDotProductAttention();
at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& bias, bool causal, double scale);

}  // namespace engine::compat
