// Measures what a device can compute with this LibTorch: bf16 and fp16 matrix products and
// autocast, CUDA compute capability, and whether the CPU has bf16 hardware. Results are cached per
// device for the process.
#pragma once

#include <string>

#include "engine/precision.h"
#include "engine/status.h"

namespace engine {

// `device` is "cpu" or "cuda:N" (as resolved by the validator).
DeviceCapability ProbeDevice(const std::string& device);

// Whether a tensor can be made and computed on `device`: Ok on a working device; otherwise an error
// naming the device with LibTorch's reason (a GPU in exclusive-process compute mode that another
// process holds, no memory left on it, a driver problem) and what to do.
Status CheckDeviceUsable(const std::string& device);

// Whether this x86 CPU has avx512_bf16 or amx_bf16 (cpuid), with the flag found.
bool CpuHasBf16Hardware(std::string* flag);

// Whether this x86 CPU has avx512_fp16 or amx_fp16 (cpuid). Without them LibTorch computes fp16
// on the CPU in software.
bool CpuHasFp16Hardware();

}  // namespace engine
