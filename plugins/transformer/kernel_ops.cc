#include "kernel_ops.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cstdlib>
#include <string>

#include "engine_kernels/causal_attention.h"
#include "engine_kernels/rms_norm.h"
#include "engine_kernels/swiglu.h"

namespace engine::transformer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool KernelsOn() {
  const char* choice = std::getenv("ENGINE_CPU_KERNELS");
  return choice == nullptr || std::string(choice) != "0";
}

// A gradient as the kernels read it: unit last stride and dense (an expanded gradient of a sum is
// neither).
at::Tensor Dense(const at::Tensor& grad) { return grad.is_contiguous() ? grad : grad.contiguous(); }

class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, double scale, int64_t window) {
    kernels::CausalAttentionOutput result = kernels::CausalAttentionForward(q, k, v, scale, window);
    ctx->save_for_backward({q, k, v, result.out, result.lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = window;
    return result.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), {}, {}};
    at::Tensor grad = grads[0];
    if (grad.stride(-1) != 1) grad = grad.contiguous();
    kernels::CausalAttentionGrads result = kernels::CausalAttentionBackward(
        grad, saved[0], saved[1], saved[2], {saved[3], saved[4]},
        ctx->saved_data["scale"].toDouble(), ctx->saved_data["window"].toInt());
    return {result.q, result.k, result.v, at::Tensor(), at::Tensor()};
  }
};

class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return kernels::SwiGluForward(gate, up);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const variable_list saved = ctx->get_saved_variables();
    kernels::SwiGluGrads result = kernels::SwiGluBackward(Dense(grads[0]), saved[0], saved[1]);
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

bool KernelAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const char* choice = std::getenv("ENGINE_ATTENTION");
  if (choice != nullptr && (std::string(choice) == "math" || std::string(choice) == "sdpa")) {
    return false;
  }
  return KernelsOn() && kernels::CausalAttentionSupports(q, k, v);
}

at::Tensor KernelCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, int64_t window) {
  return CausalAttentionFunction::apply(q, k, v, scale, window);
}

bool KernelSwiGluTakes(const at::Tensor& gate, const at::Tensor& up) {
  return KernelsOn() && kernels::SwiGluSupports(gate, up);
}

at::Tensor KernelSwiGlu(const at::Tensor& gate, const at::Tensor& up) {
  return SwiGluFunction::apply(gate, up);
}

bool KernelRmsNormTakes(const at::Tensor& x, const at::Tensor& weight) {
  return KernelsOn() && kernels::RmsNormSupports(x, weight);
}

at::Tensor KernelRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return RmsNormFunction::apply(x, weight, eps);
}

}  // namespace engine::transformer
