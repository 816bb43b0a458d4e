// Causal self-attention in one pass per head, forward and backward (CPU), for training without a
// KV cache: softmax(q k^T * scale, masked to keys j <= i, and j > i - window when window > 0) v,
// with grouped key/value heads read in place (no repeated copy).
//
// Eager LibTorch materialises the [batch, heads, positions, positions] scores and passes over them
// five times forward and six times backward (scale, mask, softmax, cast, and their gradients), and
// multiplies the masked half too. Here each head's queries go through in blocks of rows: scores,
// softmax and the value product stay in a block-sized buffer, masked keys are never multiplied,
// and the backward recomputes the probabilities from the saved log-sum-exp (FlashAttention's
// scheme) instead of keeping them. Arithmetic is f32 whatever the inputs' dtypes; results agree
// with the math path to f32 rounding (tests/kernels/causal_attention_test.cc).
//
// Shapes: q [batch, heads, positions, dim]; k, v [batch, kv_heads, positions, dim], heads a
// multiple of kv_heads; any strides with the last one 1; each f32, bf16 or f16, on the CPU. The
// output has v's dtype, stored [batch, positions, heads, dim] and returned as its
// [batch, heads, positions, dim] view (so that merging the heads is free); lse is
// [batch, heads, positions] f32. Gradients come back in each input's dtype, as views of the same
// layout. A violated precondition throws c10::Error. Parallel over (batch, kv_head) through ATen's
// thread pool; vectorised with AVX2/FMA where the CPU has them. No state is kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace engine::kernels {

struct CausalAttentionOutput {
  at::Tensor out;  // [batch, heads, positions, dim], v's dtype
  at::Tensor lse;  // [batch, heads, positions] f32: log of each query's softmax denominator
};

struct CausalAttentionGrads {
  at::Tensor q, k, v;
};

// Rotary position embedding applied to q and k as they are read (transformers' rotate_half form:
// x cos + rotate_half(x) sin), so that the caller passes the projections as they are. cos and sin:
// [1 or batch, positions, dim], any float dtype (read as f32); dim even.
struct CausalAttentionRotary {
  at::Tensor cos, sin;
};

// Whether the kernel takes these inputs (CPU, supported dtypes and shapes); else use ATen ops.
bool CausalAttentionSupports(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// `rotary`: null, or the tables to rotate q and k with. `key_ranges`: undefined for the causal
// mask (within `window`), or which keys each query sees instead: [batch, positions, 2] int32,
// (first, end) per query (padded and packed rows, made by the caller from its mask). A query with
// first >= end sees no key; like the math path's lowest-value fill, it then averages every value
// with one weight, and its scores get no gradient.
CausalAttentionOutput CausalAttentionForward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, double scale, int64_t window,
                                             const CausalAttentionRotary* rotary = nullptr,
                                             const at::Tensor& key_ranges = at::Tensor());

// grad_out: the gradient of `out`, [batch, heads, positions, dim], unit last stride. The same
// `rotary` and `key_ranges` as the forward's; the gradients are those of the unrotated q and k.
// `into`: null, or tensors of q's, k's and v's shapes (unit last stride, e.g. views into one
// [batch, positions, (heads + 2 kv_heads) * dim] gradient of a fused projection) to write the
// gradients into.
CausalAttentionGrads CausalAttentionBackward(const at::Tensor& grad_out, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const CausalAttentionOutput& forward, double scale,
                                             int64_t window,
                                             const CausalAttentionRotary* rotary = nullptr,
                                             const at::Tensor& key_ranges = at::Tensor(),
                                             const CausalAttentionGrads* into = nullptr);

}  // namespace engine::kernels
