#include "engine_kernels/cpu_kernels_switch.h"

#include <cstdlib>
#include <cstring>

namespace engine::kernels {

bool CpuKernelsSwitchedOn() {
  const char* choice = std::getenv(kCpuKernelsVariable);
  return choice == nullptr || std::strcmp(choice, "0") != 0;
}

}  // namespace engine::kernels
