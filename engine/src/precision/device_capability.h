// Measures what a device can compute with this LibTorch: bf16 and fp16 matrix products and
// autocast, CUDA compute capability, and whether the CPU has bf16 hardware. Results are cached per
// device for the process.
#pragma once

#include <string>

#include "engine/precision.h"

namespace engine {

// `device` is "cpu" or "cuda:N" (as resolved by the validator).
DeviceCapability ProbeDevice(const std::string& device);

// Whether this x86 CPU has avx512_bf16 or amx_bf16 (cpuid), with the flag found.
bool CpuHasBf16Hardware(std::string* flag);

}  // namespace engine
