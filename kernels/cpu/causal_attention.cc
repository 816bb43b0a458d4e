#include "engine_kernels/causal_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_kernel_support.h"

namespace engine::kernels {
namespace {

struct AttentionDims {
  int64_t t = 0, tp = 0;  // positions, padded to a multiple of 8
  int64_t d = 0, dp = 0;  // head dim, padded likewise
  int64_t window = 0;
  float scale = 1;
  // Per query of one batch row, (first, end) of the keys it sees; null: causal within window.
  const int32_t* ranges = nullptr;
};

// Query rows per block: a block's scores ([kRowBlock][positions] f32) stay in L2 up to a few
// thousand positions.
constexpr int64_t kRowBlock = 32;

#define ENGINE_KERNEL_TILES "causal_attention_tiles.inc"
#include "per_isa.inc"

using ForwardHeadFn = void (*)(const AttentionDims&, const float*, const float*, const float*,
                               float*, float*, float*);
using BackwardHeadFn = void (*)(const AttentionDims&, const float*, const float*, const float*,
                                const float*, const float*, const float*, const float*, float*,
                                float*, float*, float*, float*, float*);

// One head of a [batch, heads, positions, dim] tensor, converted to f32 into a zero-padded
// [tp][dp] buffer, or [dp][tp] when `transposed`.
void PackHead(const at::Tensor& x, int64_t b, int64_t h, const AttentionDims& dims, bool transposed,
              float* dst) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "PackHead", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>() + b * x.stride(0) + h * x.stride(1);
    const int64_t row_stride = x.stride(2), t = dims.t, d = dims.d, tp = dims.tp, dp = dims.dp;
    if (!transposed) {
      for (int64_t i = 0; i < t; ++i) {
        const scalar_t* __restrict__ row = src + i * row_stride;
        float* __restrict__ out = dst + i * dp;
        if constexpr (std::is_same_v<scalar_t, float>) {
          std::memcpy(out, row, static_cast<size_t>(d) * sizeof(float));
        } else {
          for (int64_t c = 0; c < d; ++c) out[c] = static_cast<float>(row[c]);
        }
      }
      return;
    }
    // Eight positions at a time, so that each destination row gets eight adjacent writes.
    int64_t i = 0;
    for (; i + 8 <= t; i += 8) {
      for (int64_t c = 0; c < d; ++c) {
        float* __restrict__ out = dst + c * tp + i;
        for (int64_t r = 0; r < 8; ++r) out[r] = static_cast<float>(src[(i + r) * row_stride + c]);
      }
    }
    for (; i < t; ++i) {
      for (int64_t c = 0; c < d; ++c) dst[c * tp + i] = static_cast<float>(src[i * row_stride + c]);
    }
  });
}

// The inverse of PackHead (not transposed), into x's dtype.
void UnpackHead(const float* src, const AttentionDims& dims, const at::Tensor& x, int64_t b,
                int64_t h) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "UnpackHead", [&] {
    scalar_t* dst = x.data_ptr<scalar_t>() + b * x.stride(0) + h * x.stride(1);
    const int64_t row_stride = x.stride(2), d = dims.d, dp = dims.dp;
    for (int64_t i = 0; i < dims.t; ++i) {
      scalar_t* __restrict__ row = dst + i * row_stride;
      const float* __restrict__ in = src + i * dp;
      if constexpr (std::is_same_v<scalar_t, float>) {
        std::memcpy(row, in, static_cast<size_t>(d) * sizeof(float));
      } else {
        for (int64_t c = 0; c < d; ++c) row[c] = static_cast<scalar_t>(in[c]);
      }
    }
  });
}

// Rotary embedding of packed rows in place (transformers' rotate_half form): with h = dim / 2,
// x[c] <- x[c] cos[c] - x[c + h] sin[c] and x[c + h] <- x[c + h] cos[c + h] + x[c] sin[c + h];
// `inverse` applies the transpose instead, which takes a gradient back through the rotation.
void RotateRows(float* x, const AttentionDims& dims, const float* cos, const float* sin,
                bool inverse) {
  const int64_t half = dims.d / 2;
  for (int64_t i = 0; i < dims.t; ++i) {
    float* __restrict__ row = x + i * dims.dp;
    const float* __restrict__ c = cos + i * dims.d;
    const float* __restrict__ s = sin + i * dims.d;
    for (int64_t j = 0; j < half; ++j) {
      const float a = row[j], b = row[j + half];
      if (inverse) {
        row[j] = a * c[j] + b * s[j + half];
        row[j + half] = b * c[j + half] - a * s[j];
      } else {
        row[j] = a * c[j] - b * s[j];
        row[j + half] = b * c[j + half] + a * s[j + half];
      }
    }
  }
}

// [tp][dp] -> [dp][tp].
void Transpose(const float* x, const AttentionDims& dims, float* out) {
  for (int64_t i = 0; i < dims.t; ++i) {
    for (int64_t c = 0; c < dims.d; ++c) out[c * dims.tp + i] = x[i * dims.dp + c];
  }
}

// The tables of batch row b, or null pointers without rotary.
struct RotaryRows {
  const float* cos = nullptr;
  const float* sin = nullptr;
};

// Group g's keys of batch row b, rotated when `rows` has tables, packed both ways: [tp][dp] into
// `kk`, [dp][tp] into `kt`.
void PackKeys(const at::Tensor& k, int64_t b, int64_t g, const AttentionDims& dims,
              const RotaryRows& rows, float* kk, float* kt) {
  PackHead(k, b, g, dims, /*transposed=*/false, kk);
  if (rows.cos != nullptr) RotateRows(kk, dims, rows.cos, rows.sin, /*inverse=*/false);
  Transpose(kk, dims, kt);
}

class RotaryTables {
 public:
  RotaryTables(const CausalAttentionRotary* rotary, const AttentionDims& dims, int64_t batch) {
    if (rotary == nullptr) return;
    TORCH_CHECK(dims.d % 2 == 0, "rotary attention needs an even head dim, got ", dims.d);
    cos_ = rotary->cos.to(at::kFloat).contiguous();
    sin_ = rotary->sin.to(at::kFloat).contiguous();
    TORCH_CHECK(cos_.dim() == 3 && cos_.sizes() == sin_.sizes() && cos_.size(1) == dims.t &&
                    cos_.size(2) == dims.d && (cos_.size(0) == 1 || cos_.size(0) == batch),
                "rotary tables ", cos_.sizes(), " do not fit ", batch, " rows of ", dims.t,
                " positions x ", dims.d);
    batch_stride_ = cos_.size(0) == 1 ? 0 : dims.t * dims.d;
  }
  bool active() const { return cos_.defined(); }
  RotaryRows Rows(int64_t b) const {
    if (!active()) return {};
    return {cos_.data_ptr<float>() + b * batch_stride_, sin_.data_ptr<float>() + b * batch_stride_};
  }

 private:
  at::Tensor cos_, sin_;
  int64_t batch_stride_ = 0;
};

AttentionDims DimsOf(const at::Tensor& q, double scale, int64_t window) {
  AttentionDims dims;
  dims.t = q.size(2);
  dims.tp = (dims.t + 7) / 8 * 8;
  dims.d = q.size(3);
  dims.dp = (dims.d + 7) / 8 * 8;
  dims.window = window;
  dims.scale = static_cast<float>(scale);
  return dims;
}

// (batch row, key/value head) pairs per parallel task: a pair is `groups` query heads' scores and
// weighted sums, about t * t / 2 * d steps each when causal (a window or key ranges only lower it).
int64_t GroupGrain(const AttentionDims& dims, int64_t groups) {
  return GrainFor(groups * dims.t * dims.t * dims.d);
}

// [batch, heads, positions, dim] stored as [batch, positions, heads, dim].
at::Tensor EmptyHeadsLast(const at::Tensor& like, int64_t heads, at::ScalarType dtype) {
  return at::empty({like.size(0), like.size(2), heads, like.size(3)}, like.options().dtype(dtype))
      .transpose(1, 2);
}

void CheckShapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "causal attention takes [batch, heads, positions, dim] tensors");
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                  q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
              "causal attention: q ", q.sizes(), " and k/v ", k.sizes(), "/", v.sizes(),
              " do not fit (heads a multiple of key/value heads)");
  TORCH_CHECK(CausalAttentionSupports(q, k, v),
              "causal attention needs CPU f32/bf16/f16 tensors with unit last stride");
}

// The ranges' data after checking them: [batch, positions, 2] int32, contiguous, on the CPU, each
// (first, end) within [0, positions]. Null when undefined.
const int32_t* CheckedRanges(const at::Tensor& ranges, const at::Tensor& q) {
  if (!ranges.defined()) return nullptr;
  TORCH_CHECK(ranges.device().is_cpu() && ranges.scalar_type() == at::kInt &&
                  ranges.is_contiguous() && ranges.dim() == 3 && ranges.size(0) == q.size(0) &&
                  ranges.size(1) == q.size(2) && ranges.size(2) == 2,
              "causal attention: key ranges must be contiguous CPU int32 [", q.size(0), ", ",
              q.size(2), ", 2], got ", ranges.sizes(), " ", ranges.scalar_type());
  const int32_t* data = ranges.data_ptr<int32_t>();
  const auto [low, high] = std::minmax_element(data, data + ranges.numel());
  TORCH_CHECK(ranges.numel() == 0 || (*low >= 0 && *high <= q.size(2)),
              "causal attention: key ranges outside [0, ", q.size(2), "]");
  return data;
}

// `dims` with batch row b's ranges.
AttentionDims RowDims(const AttentionDims& dims, const int32_t* ranges, int64_t b) {
  AttentionDims row = dims;
  if (ranges != nullptr) row.ranges = ranges + b * dims.t * 2;
  return row;
}

// The per-thread buffers of one key/value group.
struct GroupBuffers {
  explicit GroupBuffers(const AttentionDims& dims, bool backward)
      : head(static_cast<size_t>(dims.tp * dims.dp)),
        block(static_cast<size_t>(kRowBlock * dims.tp)) {
    const int count = backward ? 10 : 4;
    storage.assign(static_cast<size_t>(count) * head + (backward ? 2 : 1) * block + dims.tp, 0.0f);
  }
  float* Head(int index) { return storage.data() + index * head; }
  float* Block(int index, int heads) { return storage.data() + heads * head + index * block; }
  size_t head, block;
  std::vector<float> storage;
};

}  // namespace

bool CausalAttentionSupports(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const at::Tensor* x : {&q, &k, &v}) {
    if (!x->device().is_cpu() || x->dim() != 4 || x->stride(3) != 1 ||
        !IsLowOrF32(x->scalar_type())) {
      return false;
    }
  }
  return true;
}

CausalAttentionOutput CausalAttentionForward(const at::Tensor& q, const at::Tensor& k,
                                             const at::Tensor& v, double scale, int64_t window,
                                             const CausalAttentionRotary* rotary,
                                             const at::Tensor& key_ranges) {
  CheckShapes(q, k, v);
  const AttentionDims dims = DimsOf(q, scale, window);
  const int32_t* ranges = CheckedRanges(key_ranges, q);
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t groups = heads / kv_heads;
  const RotaryTables tables(rotary, dims, batch);
  CausalAttentionOutput result;
  result.out = EmptyHeadsLast(q, heads, v.scalar_type());
  result.lse = at::empty({batch, heads, dims.t}, q.options().dtype(at::kFloat));
  float* lse = result.lse.data_ptr<float>();
  const ForwardHeadFn forward = ENGINE_PICK_ISA(ForwardHead);
  at::parallel_for(0, batch * kv_heads, GroupGrain(dims, groups), [&](int64_t begin, int64_t end) {
    GroupBuffers buffers(dims, /*backward=*/false);
    float *kt = buffers.Head(0), *vv = buffers.Head(1), *qo = buffers.Head(2);
    float* kk = buffers.Head(3);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, g = item % kv_heads;
      const RotaryRows rows = tables.Rows(b);
      PackKeys(k, b, g, dims, rows, kk, kt);
      PackHead(v, b, g, dims, /*transposed=*/false, vv);
      for (int64_t h = g * groups; h < (g + 1) * groups; ++h) {
        PackHead(q, b, h, dims, /*transposed=*/false, qo);
        if (tables.active()) RotateRows(qo, dims, rows.cos, rows.sin, /*inverse=*/false);
        // The output overwrites the packed queries: each block reads only its own rows first.
        forward(RowDims(dims, ranges, b), qo, kt, vv, qo, lse + (b * heads + h) * dims.t,
                buffers.Block(0, 4));
        UnpackHead(qo, dims, result.out, b, h);
      }
    }
  });
  return result;
}

CausalAttentionGrads CausalAttentionBackward(const at::Tensor& grad_out, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const CausalAttentionOutput& forward, double scale,
                                             int64_t window, const CausalAttentionRotary* rotary,
                                             const at::Tensor& key_ranges,
                                             const CausalAttentionGrads* into) {
  CheckShapes(q, k, v);
  const int32_t* ranges = CheckedRanges(key_ranges, q);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && CausalAttentionSupports(grad_out, k, v),
              "causal attention: the output gradient ", grad_out.sizes(), " does not fit q ",
              q.sizes());
  const AttentionDims dims = DimsOf(q, scale, window);
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  const int64_t groups = heads / kv_heads;
  const RotaryTables tables(rotary, dims, batch);
  CausalAttentionGrads grads;
  if (into != nullptr) {
    TORCH_CHECK(into->q.sizes() == q.sizes() && into->k.sizes() == k.sizes() &&
                    into->v.sizes() == v.sizes() &&
                    CausalAttentionSupports(into->q, into->k, into->v),
                "causal attention: gradient destinations do not fit the inputs");
    grads = *into;
  } else {
    grads.q = EmptyHeadsLast(q, heads, q.scalar_type());
    grads.k = EmptyHeadsLast(k, kv_heads, k.scalar_type());
    grads.v = EmptyHeadsLast(v, kv_heads, v.scalar_type());
  }
  const at::Tensor lse_tensor = forward.lse.contiguous();
  const float* lse = lse_tensor.data_ptr<float>();
  const BackwardHeadFn backward = ENGINE_PICK_ISA(BackwardHead);
  at::parallel_for(0, batch * kv_heads, GroupGrain(dims, groups), [&](int64_t begin, int64_t end) {
    GroupBuffers buffers(dims, /*backward=*/true);
    float *kk = buffers.Head(0), *kt = buffers.Head(1), *vt = buffers.Head(2);
    float *dk = buffers.Head(3), *dv = buffers.Head(4), *qq = buffers.Head(5);
    float *oo = buffers.Head(6), *dout = buffers.Head(7), *dq = buffers.Head(8);
    float* delta = buffers.Block(2, 10);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, g = item % kv_heads;
      const RotaryRows rows = tables.Rows(b);
      PackKeys(k, b, g, dims, rows, kk, kt);
      PackHead(v, b, g, dims, /*transposed=*/true, vt);
      std::memset(dk, 0, buffers.head * sizeof(float));
      std::memset(dv, 0, buffers.head * sizeof(float));
      for (int64_t h = g * groups; h < (g + 1) * groups; ++h) {
        PackHead(q, b, h, dims, /*transposed=*/false, qq);
        if (tables.active()) RotateRows(qq, dims, rows.cos, rows.sin, /*inverse=*/false);
        PackHead(forward.out, b, h, dims, /*transposed=*/false, oo);
        PackHead(grad_out, b, h, dims, /*transposed=*/false, dout);
        backward(RowDims(dims, ranges, b), qq, kk, kt, vt, oo, dout, lse + (b * heads + h) * dims.t,
                 dq, dk, dv, buffers.Block(0, 10), buffers.Block(1, 10), delta);
        if (tables.active()) RotateRows(dq, dims, rows.cos, rows.sin, /*inverse=*/true);
        UnpackHead(dq, dims, grads.q, b, h);
      }
      if (tables.active()) RotateRows(dk, dims, rows.cos, rows.sin, /*inverse=*/true);
      UnpackHead(dk, dims, grads.k, b, g);
      UnpackHead(dv, dims, grads.v, b, g);
    }
  });
  return grads;
}

}  // namespace engine::kernels
