// Device descriptions for precision tests, injected instead of probed.
#pragma once

#include "engine/precision.h"

namespace engine::testing {

// A CPU with bf16 hardware (avx512_bf16), as LibTorch 1.13 sees it: bf16 products and autocast,
// no fp16.
inline DeviceCapability CpuWithBf16() {
  DeviceCapability d;
  d.device = "cpu";
  d.name = "Test CPU (avx512_bf16)";
  d.bf16 = d.bf16_fast = d.bf16_autocast = true;
  return d;
}

// A CPU without bf16 hardware: bf16 runs, slowly.
inline DeviceCapability CpuWithoutBf16() {
  DeviceCapability d = CpuWithBf16();
  d.name = "Test CPU";
  d.bf16_fast = false;
  return d;
}

// Turing (sm_75): fp16 but no bf16 (failure catalogue F10).
inline DeviceCapability Turing() {
  DeviceCapability d;
  d.device = "cuda:0";
  d.name = "NVIDIA TITAN RTX";
  d.cuda = true;
  d.compute_capability = 75;
  d.fp16 = d.fp16_autocast = true;
  return d;
}

// Ampere (sm_80): bf16 and fp16.
inline DeviceCapability Ampere() {
  DeviceCapability d = Turing();
  d.name = "NVIDIA A100";
  d.compute_capability = 80;
  d.bf16 = d.bf16_fast = d.bf16_autocast = true;
  return d;
}

}  // namespace engine::testing
