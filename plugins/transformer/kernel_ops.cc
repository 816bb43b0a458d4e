#include "kernel_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <string>

#include "engine_kernels/causal_attention.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "engine_kernels/rms_norm.h"
#include "engine_kernels/swiglu.h"

namespace engine::transformer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool KernelsOn() { return kernels::CpuKernelsSwitchedOn(); }

}  // namespace

bool KernelAttentionSwitchedOn() {
  const char* choice = std::getenv("ENGINE_ATTENTION");
  return KernelsOn() &&
         (choice == nullptr || (std::string(choice) != "math" && std::string(choice) != "sdpa"));
}

namespace {

// A gradient as the kernels read it (an expanded gradient of a sum is not).
at::Tensor Dense(const at::Tensor& grad) { return grad.is_contiguous() ? grad : grad.contiguous(); }

// The tables as the kernel takes them: [1 or batch, positions, dim] (RotaryTables hold them with
// a heads dimension of 1). Undefined tensors without rotary.
kernels::CausalAttentionRotary KernelTables(const RotaryTables* rotary) {
  if (rotary == nullptr || !rotary->cos.defined()) return {};
  return {rotary->cos.squeeze(1), rotary->sin.squeeze(1)};
}

c10::optional<at::Tensor> Optional(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

const kernels::CausalAttentionRotary* OrNull(const kernels::CausalAttentionRotary& tables) {
  return tables.cos.defined() ? &tables : nullptr;
}

// [batch, positions, (heads + 2 kv_heads) * dim] -> the q, k and v views [batch, heads,
// positions, dim].
struct HeadViews {
  at::Tensor q, k, v;
};
HeadViews SplitHeads(const at::Tensor& qkv, int64_t heads, int64_t kv_heads) {
  const int64_t batch = qkv.size(0), positions = qkv.size(1);
  const int64_t dim = qkv.size(2) / (heads + 2 * kv_heads);
  const auto part = [&](int64_t first, int64_t count) {
    return qkv.narrow(2, first * dim, count * dim)
        .view({batch, positions, count, dim})
        .transpose(1, 2);
  };
  return {part(0, heads), part(heads, kv_heads), part(heads + kv_heads, kv_heads)};
}

// Inputs: q, k, v (separate), or qkv with heads and kv_heads (packed). The rotary tables and key
// ranges are optional so that, absent, they are no inputs of the node (an undefined tensor
// argument would be).
class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, int64_t heads,
                               int64_t kv_heads, double scale, int64_t window,
                               const c10::optional<at::Tensor>& cos,
                               const c10::optional<at::Tensor>& sin,
                               const c10::optional<at::Tensor>& key_ranges) {
    const bool packed = inputs.size() == 1;
    const HeadViews views = packed ? SplitHeads(inputs[0], heads, kv_heads)
                                   : HeadViews{inputs[0], inputs[1], inputs[2]};
    const kernels::CausalAttentionRotary tables{cos.value_or(at::Tensor()),
                                                sin.value_or(at::Tensor())};
    const at::Tensor ranges = key_ranges.value_or(at::Tensor());
    kernels::CausalAttentionOutput result = kernels::CausalAttentionForward(
        views.q, views.k, views.v, scale, window, OrNull(tables), ranges);
    variable_list saved = inputs.vec();
    saved.insert(saved.end(), {result.out, result.lse, tables.cos, tables.sin, ranges});
    ctx->save_for_backward(saved);
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    return {result.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const bool packed = saved.size() == 6;
    const size_t n = packed ? 1 : 3;
    variable_list result(n + 7);
    if (!grads[0].defined()) return result;
    at::Tensor grad = grads[0];
    if (grad.stride(-1) != 1) grad = grad.contiguous();
    const int64_t heads = ctx->saved_data["heads"].toInt();
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt();
    const HeadViews views =
        packed ? SplitHeads(saved[0], heads, kv_heads) : HeadViews{saved[0], saved[1], saved[2]};
    const kernels::CausalAttentionRotary tables{saved[n + 2], saved[n + 3]};
    const at::Tensor& ranges = saved[n + 4];
    const double scale = ctx->saved_data["scale"].toDouble();
    const int64_t window = ctx->saved_data["window"].toInt();
    const kernels::CausalAttentionOutput forward{saved[n], saved[n + 1]};
    if (packed) {
      at::Tensor grad_qkv = at::empty_like(saved[0], at::MemoryFormat::Contiguous);
      const HeadViews into = SplitHeads(grad_qkv, heads, kv_heads);
      const kernels::CausalAttentionGrads destinations{into.q, into.k, into.v};
      kernels::CausalAttentionBackward(grad, views.q, views.k, views.v, forward, scale, window,
                                       OrNull(tables), ranges, &destinations);
      result[0] = grad_qkv;
    } else {
      const kernels::CausalAttentionGrads got = kernels::CausalAttentionBackward(
          grad, views.q, views.k, views.v, forward, scale, window, OrNull(tables), ranges);
      result[0] = got.q;
      result[1] = got.k;
      result[2] = got.v;
    }
    return result;
  }
};

// Inputs: gate and up (separate), or gate_up (packed).
class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs) {
    ctx->save_for_backward(inputs.vec());
    if (inputs.size() == 1) {
      const int64_t half = inputs[0].size(-1) / 2;
      return kernels::SwiGluForward(inputs[0].narrow(-1, 0, half),
                                    inputs[0].narrow(-1, half, half));
    }
    return kernels::SwiGluForward(inputs[0], inputs[1]);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return variable_list(saved.size());
    const at::Tensor grad = Dense(grads[0]);
    if (saved.size() == 1) {
      const int64_t half = saved[0].size(-1) / 2;
      at::Tensor grad_gate_up = at::empty_like(saved[0], at::MemoryFormat::Contiguous);
      const kernels::SwiGluGrads into{grad_gate_up.narrow(-1, 0, half),
                                      grad_gate_up.narrow(-1, half, half)};
      kernels::SwiGluBackward(grad, saved[0].narrow(-1, 0, half), saved[0].narrow(-1, half, half),
                              &into);
      return {grad_gate_up};
    }
    kernels::SwiGluGrads result = kernels::SwiGluBackward(grad, saved[0], saved[1]);
    return {result.gate, result.up};
  }
};

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps) {
    kernels::RmsNormOutput result = kernels::RmsNormForward(x, weight, eps);
    ctx->save_for_backward({x, weight, result.rstd});
    return result.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    at::Tensor grad = Dense(grads[0]);
    // The kernel reads f32 or bf16 gradients (an f16 one only comes from an f16 consumer).
    if (grad.scalar_type() != at::kFloat && grad.scalar_type() != at::kBFloat16) {
      grad = grad.to(at::kFloat);
    }
    kernels::RmsNormGrads result = kernels::RmsNormBackward(grad, saved[0], saved[1], saved[2]);
    return {result.x, result.weight, at::Tensor()};
  }
};

}  // namespace

bool KernelAttentionAvailable(const at::Tensor& x) {
  return KernelAttentionSwitchedOn() && x.device().is_cpu() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
          x.scalar_type() == at::kHalf);
}

bool KernelAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return KernelAttentionSwitchedOn() && kernels::CausalAttentionSupports(q, k, v);
}

at::Tensor KernelCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, int64_t window, const RotaryTables* rotary,
                                 const at::Tensor& key_ranges) {
  const kernels::CausalAttentionRotary tables = KernelTables(rotary);
  return CausalAttentionFunction::apply(at::TensorList({q, k, v}), q.size(1), k.size(1), scale,
                                        window, Optional(tables.cos), Optional(tables.sin),
                                        Optional(key_ranges))[0];
}

at::Tensor KernelPackedCausalAttention(const at::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                       double scale, int64_t window, const RotaryTables* rotary,
                                       const at::Tensor& key_ranges) {
  const kernels::CausalAttentionRotary tables = KernelTables(rotary);
  return CausalAttentionFunction::apply(at::TensorList(qkv), heads, kv_heads, scale, window,
                                        Optional(tables.cos), Optional(tables.sin),
                                        Optional(key_ranges))[0];
}

bool KernelSwiGluTakes(const at::Tensor& gate, const at::Tensor& up) {
  return KernelsOn() && kernels::SwiGluSupports(gate, up);
}

at::Tensor KernelSwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  return SwiGluFunction::apply(at::TensorList({gate, up}));
}

bool KernelPackedSwiGluTakes(const at::Tensor& gate_up) {
  if (gate_up.dim() < 1 || gate_up.size(-1) % 2 != 0) return false;
  const int64_t half = gate_up.size(-1) / 2;
  return KernelSwiGluTakes(gate_up.narrow(-1, 0, half), gate_up.narrow(-1, half, half));
}

at::Tensor KernelPackedSwiGlu(const at::Tensor& gate_up) {
  return SwiGluFunction::apply(at::TensorList(gate_up));
}

bool KernelRmsNormTakes(const at::Tensor& x, const at::Tensor& weight) {
  return KernelsOn() && kernels::RmsNormSupports(x, weight);
}

at::Tensor KernelRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace engine::transformer
