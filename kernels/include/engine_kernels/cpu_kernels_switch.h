// The one switch over the engine's CPU kernels that replace ATen expressions (attention, SwiGLU,
// RMSNorm, the few-rows NF4 matmul): ENGINE_CPU_KERNELS=0 turns them off, to compare with ATen or
// to rule them out. Read at each call (a getenv), so tests and benchmarks can flip it.
#pragma once

namespace engine::kernels {

inline constexpr char kCpuKernelsVariable[] = "ENGINE_CPU_KERNELS";

bool CpuKernelsSwitchedOn();

}  // namespace engine::kernels
