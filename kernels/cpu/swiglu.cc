#include "engine_kernels/swiglu.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>

#include "cpu_kernel_support.h"

namespace engine::kernels {
namespace {

#define ENGINE_KERNEL_TILES "swiglu_tiles.inc"
#include "per_isa.inc"

// Elements per f32 scratch span (16 KB each, in L1 with its neighbours).
constexpr int64_t kSpan = 4096;

// A tensor's elements as rows: `cols` of unit stride each, rows `stride` apart (a contiguous
// tensor, or a slice of its last dimension such as one half of a fused gate/up projection).
struct RowLayout {
  bool ok = false;
  int64_t rows = 0, cols = 0, stride = 0;
};

RowLayout RowsOf(const at::Tensor& t) {
  RowLayout layout;
  if (t.dim() < 1 || !t.device().is_cpu() || !IsLowOrF32(t.scalar_type())) return layout;
  const int64_t last = t.dim() - 1;
  layout.cols = t.size(last);
  layout.rows = layout.cols > 0 ? t.numel() / layout.cols : 0;
  layout.stride = last > 0 ? t.stride(last - 1) : layout.cols;
  layout.ok = (t.stride(last) == 1 || layout.cols <= 1) && layout.stride >= layout.cols;
  for (int64_t d = 0; d + 1 < last; ++d) {
    if (t.size(d) > 1 && t.stride(d) != t.stride(d + 1) * t.size(d + 1)) layout.ok = false;
  }
  return layout;
}

// Calls body(row, first column, count) over spans of every row, in parallel over rows.
template <typename Body>
void ForRowSpans(const RowLayout& layout, Body body) {
  at::parallel_for(0, layout.rows, GrainFor(layout.cols), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t col = 0; col < layout.cols; col += kSpan) {
        body(row, col, std::min(kSpan, layout.cols - col));
      }
    }
  });
}

bool SameRows(const RowLayout& a, const RowLayout& b) {
  return a.ok && b.ok && a.rows == b.rows && a.cols == b.cols;
}

}  // namespace

bool SwiGluSupports(const at::Tensor& gate, const at::Tensor& up) {
  return gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type() &&
         SameRows(RowsOf(gate), RowsOf(up));
}

at::Tensor SwiGluForward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(SwiGluSupports(gate, up), "SwiGLU needs CPU f32/bf16/f16 gate and up of one shape ",
              "and dtype, each rows of unit stride; got ", gate.sizes(), " ", gate.scalar_type(),
              " and ", up.sizes(), " ", up.scalar_type());
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const RowLayout g = RowsOf(gate), u = RowsOf(up), y = RowsOf(out);
  const auto span = ENGINE_PICK_ISA(SwiGluSpan);
  ForRowSpans(g, [&](int64_t row, int64_t col, int64_t n) {
    float gb[kSpan], ub[kSpan], yb[kSpan];
    float* result = WritableF32(out, row * y.stride + col, yb);
    span(ReadF32(gate, row * g.stride + col, n, gb), ReadF32(up, row * u.stride + col, n, ub),
         result, n);
    CommitF32(result, out, row * y.stride + col, n);
  });
  return out;
}

SwiGluGrads SwiGluBackward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                           const SwiGluGrads* into) {
  const RowLayout g = RowsOf(gate), u = RowsOf(up), dy = RowsOf(grad);
  TORCH_CHECK(SwiGluSupports(gate, up) && grad.sizes() == gate.sizes() && SameRows(dy, g),
              "SwiGLU backward: the gradient ", grad.sizes(), " ", grad.scalar_type(),
              " does not fit gate ", gate.sizes(), " ", gate.scalar_type());
  SwiGluGrads grads;
  if (into != nullptr) {
    TORCH_CHECK(into->gate.sizes() == gate.sizes() && into->up.sizes() == up.sizes() &&
                    SameRows(RowsOf(into->gate), g) && SameRows(RowsOf(into->up), g),
                "SwiGLU backward: gradient destinations do not fit gate ", gate.sizes());
    grads = *into;
  } else {
    grads = {at::empty(gate.sizes(), gate.options()), at::empty(up.sizes(), up.options())};
  }
  const RowLayout dg = RowsOf(grads.gate), du = RowsOf(grads.up);
  const auto span = ENGINE_PICK_ISA(SwiGluBackwardSpan);
  ForRowSpans(g, [&](int64_t row, int64_t col, int64_t n) {
    float dyb[kSpan], gb[kSpan], ub[kSpan], dgb[kSpan], dub[kSpan];
    float* grad_gate = WritableF32(grads.gate, row * dg.stride + col, dgb);
    float* grad_up = WritableF32(grads.up, row * du.stride + col, dub);
    span(ReadF32(grad, row * dy.stride + col, n, dyb), ReadF32(gate, row * g.stride + col, n, gb),
         ReadF32(up, row * u.stride + col, n, ub), grad_gate, grad_up, n);
    CommitF32(grad_gate, grads.gate, row * dg.stride + col, n);
    CommitF32(grad_up, grads.up, row * du.stride + col, n);
  });
  return grads;
}

}  // namespace engine::kernels
