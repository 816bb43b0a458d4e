// The engine's CPU kernels (kernels/) as autograd ops for the decoders: causal attention (with the
// rotary embedding applied as it reads q and k), SwiGLU and RMSNorm, each one node whose forward
// and backward are single fused passes. Each op computes what the ATen expression it replaces
// computes, to f32 rounding (tests/kernels/ and tests/plugins/transformer/kernel_ops_test.cc hold
// them to it), and rounds low-precision results once instead of after every step. The packed
// forms read the output of one fused projection (engine::ForwardConcatenated) and give it one
// gradient, instead of slices whose gradients would be summed into zero-filled copies.
//
// A caller asks `...Takes` first and keeps its ATen expression for what the kernels do not take:
// other devices, dtypes or layouts, and everything when ENGINE_CPU_KERNELS=0 (to compare, or to
// rule the kernels out). Attention also stays on ATen with ENGINE_ATTENTION=math or sdpa. The
// switches are read at every call. Thread-safe like any ATen op.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "rotary.h"

namespace engine::transformer {

// Whether the switches leave the attention kernel on (ENGINE_CPU_KERNELS, ENGINE_ATTENTION).
bool KernelAttentionSwitchedOn();

// Whether the attention kernel would take projections of `x` (the CPU, a floating dtype, the
// switches on): asked before projecting, so that nothing is computed twice.
bool KernelAttentionAvailable(const at::Tensor& x);

// Causal self-attention: softmax(q k^T * scale over keys j <= i, and j > i - window when
// window > 0; or over the keys `key_ranges` gives each query, KeyRanges below) v, with q and k
// rotated by `rotary` first when it is given. q [batch, heads,
// positions, dim], k and v [batch, kv_heads, positions, dim] -> [batch, heads, positions, dim] in
// v's dtype (a view of a [batch, positions, heads, dim] tensor, so merging the heads is free). The
// node saves its inputs, the output and each query's log-sum-exp, not the probabilities; the
// backward recomputes them.
bool KernelAttentionTakes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
at::Tensor KernelCausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 double scale, int64_t window, const RotaryTables* rotary = nullptr,
                                 const at::Tensor& key_ranges = at::Tensor());

// The same on one fused projection qkv [batch, positions, (heads + 2 kv_heads) * head_dim]
// (queries, then keys, then values), whose gradient comes back as one tensor.
at::Tensor KernelPackedCausalAttention(const at::Tensor& qkv, int64_t heads, int64_t kv_heads,
                                       double scale, int64_t window, const RotaryTables* rotary,
                                       const at::Tensor& key_ranges = at::Tensor());

// silu(gate) * up.
bool KernelSwiGluTakes(const at::Tensor& gate, const at::Tensor& up);
at::Tensor KernelSwiGlu(const at::Tensor& gate, const at::Tensor& up);
// The same on one fused projection gate_up [..., 2 * intermediate] (gate, then up).
bool KernelPackedSwiGluTakes(const at::Tensor& gate_up);
at::Tensor KernelPackedSwiGlu(const at::Tensor& gate_up);

// Llama's RMSNorm over the last dimension: weight * to(x.dtype, f32(x) * rsqrt(mean(x^2) + eps)).
bool KernelRmsNormTakes(const at::Tensor& x, const at::Tensor& weight);
at::Tensor KernelRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace engine::transformer
