// What the vectorised CPU kernels share outside their per-ISA arithmetic (per_isa.inc): which copy
// the CPU runs, and f32 views of f32/bf16/f16 tensor spans, so that the arithmetic is written once,
// in f32. Internal to engine_kernels.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>

namespace engine::kernels {

inline bool CpuHasAvx2Fma() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define ENGINE_PICK_ISA(fn) (::engine::kernels::CpuHasAvx2Fma() ? avx2::fn : baseline::fn)
#else
#define ENGINE_PICK_ISA(fn) (baseline::fn)
#endif

// Items per at::parallel_for task, for items of `work_per_item` elementary steps each: about
// ATen's grain of 32K elements per task, so that small tensors stay on one thread instead of
// paying a parallel region's start and join for microseconds of work.
inline int64_t GrainFor(int64_t work_per_item) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, work_per_item));
}

inline bool IsLowOrF32(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

// Elements [begin, begin + n) of contiguous `t` as f32: in place for an f32 tensor, else
// converted into `scratch` (n floats).
inline const float* ReadF32(const at::Tensor& t, int64_t begin, int64_t n, float* scratch) {
  if (t.scalar_type() == at::kFloat) return t.data_ptr<float>() + begin;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "ReadF32", [&] {
    const scalar_t* src = t.data_ptr<scalar_t>() + begin;
    for (int64_t i = 0; i < n; ++i) scratch[i] = static_cast<float>(src[i]);
  });
  return scratch;
}

// Where to compute elements [begin, begin + n) of contiguous `t` in f32: in place for an f32
// tensor, else `scratch`, which CommitF32 then converts into `t`.
inline float* WritableF32(const at::Tensor& t, int64_t begin, float* scratch) {
  return t.scalar_type() == at::kFloat ? t.data_ptr<float>() + begin : scratch;
}

inline void CommitF32(const float* values, const at::Tensor& t, int64_t begin, int64_t n) {
  if (t.scalar_type() == at::kFloat) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, t.scalar_type(), "CommitF32", [&] {
    scalar_t* dst = t.data_ptr<scalar_t>() + begin;
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<scalar_t>(values[i]);
  });
}

}  // namespace engine::kernels
