// The one place where LibTorch versions differ (Debian's 1.13 and the 2.x inside PyTorch).
//
// Code elsewhere includes this instead of testing TORCH_VERSION_* itself, so a new LibTorch release
// means editing one file.
#pragma once

#include <torch/version.h>

#define ENGINE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace engine::compat {

// The LibTorch headers this code was compiled against, e.g. "1.13.0".
inline constexpr const char* kTorchVersion = TORCH_VERSION;

// Whether the LibTorch this process runs with was built with CUDA and sees a device.
bool CudaAvailable();
int CudaDeviceCount();

}  // namespace engine::compat
