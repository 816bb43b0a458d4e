#include "engine/torch_compat.h"

#include <ATen/autocast_mode.h>
#include <torch/cuda.h>

namespace engine::compat {

bool CudaAvailable() { return torch::cuda::is_available(); }

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

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
