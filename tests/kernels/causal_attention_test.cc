// The causal attention kernel against the math path (scores, masked softmax, product) in f64 ATen
// ops, forward and backward, for the shapes that exercise its padding, row blocks, grouped heads,
// sliding windows, strided inputs and low-precision dtypes.
#include "engine_kernels/causal_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace engine::kernels {
namespace {

struct Case {
  int64_t batch, heads, kv_heads, positions, dim, window;
  std::string Name() const {
    std::ostringstream out;
    out << batch << "x" << heads << "/" << kv_heads << " heads x " << positions << " positions x "
        << dim << ", window " << window;
    return out.str();
  }
};

// softmax(q k^T * scale masked to FirstKey(i) <= j <= i) v, in the inputs' dtype (f64 here).
at::Tensor MathAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         double scale, int64_t window) {
  const int64_t groups = q.size(1) / k.size(1), t = q.size(2);
  const at::Tensor kk = k.repeat_interleave(groups, 1), vv = v.repeat_interleave(groups, 1);
  const at::Tensor rows = at::arange(t).unsqueeze(1), cols = at::arange(t).unsqueeze(0);
  at::Tensor masked = cols > rows;
  if (window > 0) masked = masked.logical_or(cols <= rows - window);
  const at::Tensor scores = at::matmul(q, kk.transpose(2, 3)) * scale;
  return at::matmul(at::softmax(scores.masked_fill(masked, -INFINITY), -1), vv);
}

struct Inputs {
  at::Tensor q, k, v, grad_out;
};

// Inputs as the decoder makes them: projections viewed [batch, positions, heads, dim] and
// transposed, so that no tensor is contiguous.
Inputs RandomInputs(const Case& c, at::ScalarType dtype) {
  Inputs in;
  in.q = at::randn({c.batch, c.positions, c.heads, c.dim}).to(dtype).transpose(1, 2);
  in.k = at::randn({c.batch, c.positions, c.kv_heads, c.dim}).to(dtype).transpose(1, 2);
  in.v = at::randn({c.batch, c.positions, c.kv_heads, c.dim}).to(dtype).transpose(1, 2);
  in.grad_out = at::randn({c.batch, c.heads, c.positions, c.dim}).to(dtype);
  return in;
}

// The kernel's output and gradients against the f64 reference on the same (rounded) inputs.
void ExpectMatchesMath(const Case& c, at::ScalarType dtype, double tolerance) {
  at::manual_seed(7);
  const Inputs in = RandomInputs(c, dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));

  const CausalAttentionOutput got = CausalAttentionForward(in.q, in.k, in.v, scale, c.window);
  const CausalAttentionGrads grads =
      CausalAttentionBackward(in.grad_out, in.q, in.k, in.v, got, scale, c.window);

  at::Tensor q = in.q.to(at::kDouble).requires_grad_(), k = in.k.to(at::kDouble).requires_grad_(),
             v = in.v.to(at::kDouble).requires_grad_();
  const at::Tensor want = MathAttention(q, k, v, scale, c.window);
  const auto want_grads = torch::autograd::grad({want}, {q, k, v}, {in.grad_out.to(at::kDouble)});

  ASSERT_EQ(got.out.scalar_type(), dtype);
  ASSERT_EQ(got.out.sizes(), want.sizes());
  const auto check = [&](const at::Tensor& actual, const at::Tensor& expected, const char* what) {
    EXPECT_EQ(actual.scalar_type(), dtype) << what;
    const double error = (actual.to(at::kDouble) - expected).abs().max().item<double>();
    const double size = expected.abs().max().item<double>();
    EXPECT_LE(error, tolerance * std::max(size, 1.0))
        << c.Name() << " " << dtype << ": " << what << " off by " << error;
  };
  check(got.out, want.detach(), "output");
  check(grads.q, want_grads[0], "dq");
  check(grads.k, want_grads[1], "dk");
  check(grads.v, want_grads[2], "dv");
  // The log-sum-exp the backward relies on.
  const at::Tensor scores =
      at::matmul(q.detach(), k.detach().repeat_interleave(c.heads / c.kv_heads, 1).transpose(2, 3));
  EXPECT_EQ(got.lse.sizes(), (std::vector<int64_t>{c.batch, c.heads, c.positions}));
  EXPECT_NEAR(got.lse[0][0][0].item<double>(), scores[0][0][0][0].item<double>() * scale,
              tolerance * 10);
}

TEST(CausalAttentionKernelTest, F32EqualsTheMathPathForwardAndBackward) {
  for (const Case& c : {
           Case{1, 1, 1, 1, 8, 0},     // one position
           Case{2, 4, 2, 13, 32, 0},   // positions not a multiple of 8, grouped heads
           Case{2, 4, 1, 70, 12, 0},   // three row blocks, a padded head dim, one kv head
           Case{1, 2, 2, 45, 16, 5},   // a sliding window shorter than the sequence
           Case{1, 3, 3, 33, 64, 40},  // a window longer than it
           Case{2, 2, 1, 128, 32, 0},  // the benchmark's head size
       }) {
    ExpectMatchesMath(c, at::kFloat, 2e-5);
  }
}

TEST(CausalAttentionKernelTest, LowPrecisionInputsComputeInF32AndRoundOnce) {
  // bf16 keeps 8 significant bits: its results are the f32 ones rounded once (2^-8 relative).
  ExpectMatchesMath(Case{2, 4, 2, 37, 32, 0}, at::kBFloat16, 1.0 / 128);
  ExpectMatchesMath(Case{1, 2, 1, 21, 16, 6}, at::kHalf, 1.0 / 512);
}

TEST(CausalAttentionKernelTest, MixedInputDtypesGiveTheValuesDtype) {
  // Under CPU autocast the rotary product promotes q and k to f32 while v stays bf16.
  at::manual_seed(3);
  const Case c{1, 2, 2, 9, 8, 0};
  Inputs in = RandomInputs(c, at::kFloat);
  in.v = in.v.to(at::kBFloat16);
  const CausalAttentionOutput got = CausalAttentionForward(in.q, in.k, in.v, 0.5, 0);
  EXPECT_EQ(got.out.scalar_type(), at::kBFloat16);
  const at::Tensor want =
      MathAttention(in.q.to(at::kDouble), in.k.to(at::kDouble), in.v.to(at::kDouble), 0.5, 0);
  EXPECT_LE((got.out.to(at::kDouble) - want).abs().max().item<double>(), 1.0 / 64);
  const CausalAttentionGrads grads = CausalAttentionBackward(
      at::ones_like(got.out).expand_as(got.out), in.q, in.k, in.v, got, 0.5, 0);
  EXPECT_EQ(grads.q.scalar_type(), at::kFloat);
  EXPECT_EQ(grads.v.scalar_type(), at::kBFloat16);
}

// transformers' apply_rotary_pos_emb: x cos + rotate_half(x) sin, tables [rows, positions, dim].
at::Tensor Rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

TEST(CausalAttentionKernelTest, RotaryTablesRotateQueriesAndKeysAndTheirGradients) {
  for (int64_t table_rows : {1, 2}) {  // shared positions, or per row (Qwen2-VL's M-RoPE)
    at::manual_seed(12);
    const Case c{2, 4, 2, 19, 16, 0};
    // The projections as one fused [batch, positions, (heads + 2 kv_heads) * dim] tensor.
    const int64_t width = (c.heads + 2 * c.kv_heads) * c.dim;
    const at::Tensor qkv = at::randn({c.batch, c.positions, width});
    const auto heads_of = [&](const at::Tensor& fused, int64_t first, int64_t count) {
      return fused.narrow(2, first * c.dim, count * c.dim)
          .view({c.batch, c.positions, count, c.dim})
          .transpose(1, 2);
    };
    const at::Tensor q = heads_of(qkv, 0, c.heads), k = heads_of(qkv, c.heads, c.kv_heads),
                     v = heads_of(qkv, c.heads + c.kv_heads, c.kv_heads);
    const at::Tensor angles = at::rand({table_rows, c.positions, c.dim / 2}) * 6;
    const at::Tensor emb = at::cat({angles, angles}, -1);
    CausalAttentionRotary rotary{emb.cos(), emb.sin()};
    const at::Tensor grad_out = at::randn({c.batch, c.heads, c.positions, c.dim});

    const CausalAttentionOutput got = CausalAttentionForward(q, k, v, 0.25, 0, &rotary);
    at::Tensor grad_qkv = at::empty_like(qkv);
    const CausalAttentionGrads into{heads_of(grad_qkv, 0, c.heads),
                                    heads_of(grad_qkv, c.heads, c.kv_heads),
                                    heads_of(grad_qkv, c.heads + c.kv_heads, c.kv_heads)};
    CausalAttentionBackward(grad_out, q, k, v, got, 0.25, 0, &rotary, at::Tensor(), &into);

    at::Tensor fused = qkv.to(at::kDouble).requires_grad_();
    const at::Tensor cos = rotary.cos.to(at::kDouble), sin = rotary.sin.to(at::kDouble);
    const at::Tensor want =
        MathAttention(Rotate(heads_of(fused, 0, c.heads), cos, sin),
                      Rotate(heads_of(fused, c.heads, c.kv_heads), cos, sin),
                      heads_of(fused, c.heads + c.kv_heads, c.kv_heads), 0.25, 0);
    const at::Tensor want_grad =
        torch::autograd::grad({want}, {fused}, {grad_out.to(at::kDouble)})[0];
    EXPECT_LE((got.out.to(at::kDouble) - want).abs().max().item<double>(), 1e-5) << table_rows;
    EXPECT_LE((grad_qkv.to(at::kDouble) - want_grad).abs().max().item<double>(), 1e-5)
        << table_rows;
  }
}

// Key ranges (what padded and packed rows become): each query's keys from its range, and a query
// with an empty range averaging every value, as the math path's lowest-value fill gives it.
TEST(CausalAttentionKernelTest, KeyRangesAndQueriesThatSeeNothing) {
  at::manual_seed(14);
  const Case c{2, 4, 2, 11, 16, 0};
  const Inputs in = RandomInputs(c, at::kFloat);
  // Row 0 packs two examples (positions 0-4, 5-8) and two padding queries (which see all real
  // keys up to 8); row 1 is left-padded: its first three queries see nothing.
  std::vector<int32_t> flat;
  for (int64_t i = 0; i < 11; ++i) {
    const int32_t first = i < 5 ? 0 : (i < 9 ? 5 : 0), end = i < 9 ? i + 1 : 9;
    flat.insert(flat.end(), {first, end});
  }
  for (int64_t i = 0; i < 11; ++i) {
    flat.insert(flat.end(), {i < 3 ? 0 : 3, i < 3 ? 0 : static_cast<int32_t>(i) + 1});
  }
  const at::Tensor ranges = at::tensor(flat, at::kInt).view({2, 11, 2});
  const CausalAttentionOutput got =
      CausalAttentionForward(in.q, in.k, in.v, 0.25, 0, nullptr, ranges);
  const CausalAttentionGrads grads =
      CausalAttentionBackward(in.grad_out, in.q, in.k, in.v, got, 0.25, 0, nullptr, ranges);

  at::Tensor q = in.q.to(at::kDouble).requires_grad_(), k = in.k.to(at::kDouble).requires_grad_(),
             v = in.v.to(at::kDouble).requires_grad_();
  const at::Tensor cols = at::arange(11).view({1, 1, 11});
  const at::Tensor first = ranges.select(2, 0).unsqueeze(2), end = ranges.select(2, 1).unsqueeze(2);
  const at::Tensor masked = (cols < first).logical_or(cols >= end).unsqueeze(1);  // [2, 1, 11, 11]
  const at::Tensor scores = at::matmul(q, k.repeat_interleave(2, 1).transpose(2, 3)) * 0.25;
  const at::Tensor want =
      at::matmul(at::softmax(scores.masked_fill(masked, std::numeric_limits<double>::lowest()), -1),
                 v.repeat_interleave(2, 1));
  const auto want_grads = torch::autograd::grad({want}, {q, k, v}, {in.grad_out.to(at::kDouble)});
  EXPECT_LE((got.out.to(at::kDouble) - want).abs().max().item<double>(), 1e-5);
  EXPECT_LE((grads.q.to(at::kDouble) - want_grads[0]).abs().max().item<double>(), 1e-5);
  EXPECT_LE((grads.k.to(at::kDouble) - want_grads[1]).abs().max().item<double>(), 1e-5);
  EXPECT_LE((grads.v.to(at::kDouble) - want_grads[2]).abs().max().item<double>(), 1e-5);

  const at::Tensor outside = ranges.clone().fill_(12);
  EXPECT_THROW(CausalAttentionForward(in.q, in.k, in.v, 0.25, 0, nullptr, outside), c10::Error);
  EXPECT_THROW(CausalAttentionForward(in.q, in.k, in.v, 0.25, 0, nullptr, ranges.to(at::kLong)),
               c10::Error);
}

TEST(CausalAttentionKernelTest, RefusesWhatItDoesNotTake) {
  const at::Tensor q = at::randn({1, 3, 4, 8}), k = at::randn({1, 2, 4, 8});
  EXPECT_THROW(CausalAttentionForward(q, k, k, 1.0, 0), c10::Error);  // 3 heads over 2 kv heads
  const at::Tensor ints = at::ones({1, 2, 4, 8}, at::kInt);
  EXPECT_FALSE(CausalAttentionSupports(ints, k, k));
  EXPECT_FALSE(CausalAttentionSupports(k.transpose(2, 3), k, k));  // last stride not 1
  EXPECT_THROW(CausalAttentionForward(ints, k, k, 1.0, 0), c10::Error);
  const at::Tensor odd = at::randn({1, 2, 4, 7});
  CausalAttentionRotary rotary{at::ones({1, 4, 7}), at::zeros({1, 4, 7})};
  EXPECT_THROW(CausalAttentionForward(odd, odd, odd, 1.0, 0, &rotary), c10::Error);
  CausalAttentionRotary short_tables{at::ones({1, 3, 8}), at::zeros({1, 3, 8})};
  EXPECT_THROW(CausalAttentionForward(k, k, k, 1.0, 0, &short_tables), c10::Error);
}

}  // namespace
}  // namespace engine::kernels
