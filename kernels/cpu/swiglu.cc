#include "engine_kernels/swiglu.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cstdint>

#include "cpu_kernel_support.h"

namespace engine::kernels {
namespace {

#define ENGINE_KERNEL_TILES "swiglu_tiles.inc"
#include "per_isa.inc"

// Elements per f32 scratch span (16 KB each, in L1 with its neighbours).
constexpr int64_t kSpan = 4096;
constexpr int64_t kGrain = 1 << 15;

// Calls body(begin, n) for spans of [0, numel), in parallel.
template <typename Body>
void ForSpans(int64_t numel, Body body) {
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; i += kSpan) body(i, end - i < kSpan ? end - i : kSpan);
  });
}

}  // namespace

bool SwiGluSupports(const at::Tensor& gate, const at::Tensor& up) {
  return gate.device().is_cpu() && up.device().is_cpu() && gate.sizes() == up.sizes() &&
         gate.scalar_type() == up.scalar_type() && IsF32OrLower(gate.scalar_type()) &&
         gate.is_contiguous() && up.is_contiguous();
}

at::Tensor SwiGluForward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(SwiGluSupports(gate, up), "SwiGLU needs contiguous CPU f32/bf16/f16 gate and up of ",
              "one shape and dtype, got ", gate.sizes(), " ", gate.scalar_type(), " and ",
              up.sizes(), " ", up.scalar_type());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const auto span = ENGINE_PICK_ISA(SwiGluSpan);
  ForSpans(gate.numel(), [&](int64_t begin, int64_t n) {
    float g[kSpan], u[kSpan], y[kSpan];
    float* result = WritableF32(out, begin, y);
    span(ReadF32(gate, begin, n, g), ReadF32(up, begin, n, u), result, n);
    CommitF32(result, out, begin, n);
  });
  return out;
}

SwiGluGrads SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(SwiGluSupports(gate, up) && grad.device().is_cpu() && grad.is_contiguous() &&
                  grad.sizes() == gate.sizes() && IsF32OrLower(grad.scalar_type()),
              "SwiGLU backward: the gradient ", grad.sizes(), " ", grad.scalar_type(),
              " does not fit gate ", gate.sizes(), " ", gate.scalar_type());
  SwiGluGrads grads{at::empty(gate.sizes(), gate.options()), at::empty(up.sizes(), up.options())};
  const auto span = ENGINE_PICK_ISA(SwiGluBackwardSpan);
  ForSpans(gate.numel(), [&](int64_t begin, int64_t n) {
    float dy[kSpan], g[kSpan], u[kSpan], dg[kSpan], du[kSpan];
    float* grad_gate = WritableF32(grads.gate, begin, dg);
    float* grad_up = WritableF32(grads.up, begin, du);
    span(ReadF32(grad, begin, n, dy), ReadF32(gate, begin, n, g), ReadF32(up, begin, n, u),
         grad_gate, grad_up, n);
    CommitF32(grad_gate, grads.gate, begin, n);
    CommitF32(grad_up, grads.up, begin, n);
  });
  return grads;
}

}  // namespace engine::kernels
