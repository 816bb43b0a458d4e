#include "engine/torch_compat.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

#if defined(ENGINE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#if ENGINE_TORCH_AT_LEAST(2, 1)
#include <ATen/ops/scaled_dot_product_attention.h>
#endif

namespace engine::compat {

#if ENGINE_TORCH_AT_LEAST(2, 1)
bool HasScaledDotProductAttention() { return true; }
at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& bias, bool causal, double scale) {
  // Two calls rather than one optional: the optional is c10's before 2.4 and std's after.
  if (bias.defined()) return at::scaled_dot_product_attention(q, k, v, bias, 0.0, causal, scale);
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scale);
}
#else
bool HasScaledDotProductAttention() { return false; }
at::Tensor ScaledDotProductAttention(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, bool, double) {
  TORCH_CHECK(false, "scaled_dot_product_attention needs LibTorch 2.1 or later; this is ",
              kTorchVersion);
}
#endif

bool CudaAvailable() { return torch::cuda::is_available(); }

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

bool CudaMemory(int64_t* allocated, int64_t* reserved, int64_t* peak_allocated) {
#if defined(ENGINE_WITH_CUDA)
  if (!CudaAvailable()) return false;
  decltype(c10::cuda::CUDACachingAllocator::getDeviceStats(0)) stats;
  try {
    stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  } catch (const c10::Error&) {
    return false;  // the allocator is not initialised until the first CUDA allocation
  }
  // StatType::AGGREGATE, which is 0 in every version; the enum moved namespaces in LibTorch 2.6.
  constexpr size_t kAll = 0;
  *allocated = stats.allocated_bytes[kAll].current;
  *reserved = stats.reserved_bytes[kAll].current;
  *peak_allocated = stats.allocated_bytes[kAll].peak;
  return true;
#else
  (void)allocated;
  (void)reserved;
  (void)peak_allocated;
  return false;
#endif
}

#if ENGINE_TORCH_AT_LEAST(2, 4)

bool AutocastEnabled(c10::DeviceType device_type) {
  return at::autocast::is_autocast_enabled(device_type);
}
void SetAutocastEnabled(c10::DeviceType device_type, bool enabled) {
  at::autocast::set_autocast_enabled(device_type, enabled);
}
c10::ScalarType AutocastDtype(c10::DeviceType device_type) {
  return at::autocast::get_autocast_dtype(device_type);
}
void SetAutocastDtype(c10::DeviceType device_type, c10::ScalarType dtype) {
  at::autocast::set_autocast_dtype(device_type, dtype);
}

#else

bool AutocastEnabled(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CUDA ? at::autocast::is_enabled()
                                              : at::autocast::is_cpu_enabled();
}
void SetAutocastEnabled(c10::DeviceType device_type, bool enabled) {
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(enabled);
  } else {
    at::autocast::set_cpu_enabled(enabled);
  }
}
c10::ScalarType AutocastDtype(c10::DeviceType device_type) {
  return device_type == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                              : at::autocast::get_autocast_cpu_dtype();
}
void SetAutocastDtype(c10::DeviceType device_type, c10::ScalarType dtype) {
  if (device_type == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}

#endif

int IncrementAutocastNesting() { return at::autocast::increment_nesting(); }
int DecrementAutocastNesting() { return at::autocast::decrement_nesting(); }
void ClearAutocastCache() { at::autocast::clear_cache(); }

}  // namespace engine::compat
