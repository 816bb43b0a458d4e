// The engine's CPU kernels (kernels/) as autograd ops for the decoders: causal attention, SwiGLU
// and RMSNorm, each one node whose forward and backward are single fused passes. Each op computes
// what the ATen expression it replaces computes, to f32 rounding (tests/kernels/ and
// tests/plugins/transformer/kernel_ops_test.cc hold them to it), and rounds low-precision results
// once instead of after every step.
//
// A caller asks `...Takes` first and keeps its ATen expression for what the kernels do not take:
// other devices, dtypes or layouts, and everything when ENGINE_CPU_KERNELS=0 (to compare, or to
// rule the kernels out). Attention also stays on ATen with ENGINE_ATTENTION=math or sdpa. The
// switches are read at every call. Thread-safe like any ATen op.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace engine::transformer {

// Causal self-attention: softmax(q k^T * scale over keys j <= i, and j > i - window when
// window > 0) v. q [batch, heads, positions, dim], k and v [batch, kv_heads, positions, dim] ->
// [batch, heads, positions, dim] in v's dtype (a view of a [batch, positions, heads, dim] tensor,
// so merging the heads is free). The node saves the inputs, the output and each query's
// log-sum-exp, not the probabilities; the backward recomputes them.
bool KernelAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
at::Tensor KernelCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, int64_t window);

// silu(gate) * up.
bool KernelSwiGluTakes(const at::Tensor& gate, const at::Tensor& up);
at::Tensor KernelSwiGlu(const at::Tensor& gate, const at::Tensor& up);

// Llama's RMSNorm over the last dimension: weight * to(x.dtype, f32(x) * rsqrt(mean(x^2) + eps)).
bool KernelRmsNormTakes(const at::Tensor& x, const at::Tensor& weight);
at::Tensor KernelRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace engine::transformer
