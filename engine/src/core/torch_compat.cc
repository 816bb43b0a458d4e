#include "engine/torch_compat.h"

#include <torch/cuda.h>

namespace engine::compat {

bool CudaAvailable() { return torch::cuda::is_available(); }

int CudaDeviceCount() { return static_cast<int>(torch::cuda::device_count()); }

}  // namespace engine::compat
