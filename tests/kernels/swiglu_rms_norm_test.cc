// The SwiGLU and RMSNorm kernels against the same arithmetic in f64 ATen ops (autograd for the
// gradients), in f32 and bf16, with sizes that leave a remainder after every vector.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "engine_kernels/rms_norm.h"
#include "engine_kernels/swiglu.h"

namespace engine::kernels {
namespace {

double MaxError(const at::Tensor& actual, const at::Tensor& expected) {
  return (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
}

TEST(SwiGluKernelTest, EqualsSiluTimesUpForwardAndBackward) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(5);
    // 3 x 7 x 1365: 28665 elements, past one parallel grain and with a remainder of 1 after 8.
    const at::Tensor gate = (at::randn({3, 7, 1365}) * 4).to(dtype);
    const at::Tensor up = at::randn({3, 7, 1365}).to(dtype);
    const at::Tensor grad = at::randn({3, 7, 1365}).to(dtype);
    const at::Tensor out = SwiGluForward(gate, up);
    const SwiGluGrads grads = SwiGluBackward(grad, gate, up);
    ASSERT_EQ(out.scalar_type(), dtype);
    EXPECT_EQ(grads.gate.scalar_type(), dtype);

    at::Tensor g = gate.to(at::kDouble).requires_grad_(), u = up.to(at::kDouble).requires_grad_();
    const at::Tensor want = at::silu(g) * u;
    const auto want_grads = torch::autograd::grad({want}, {g, u}, {grad.to(at::kDouble)});
    // f32: a few ulp of the vectorised exp; bf16: one rounding of values up to ~40.
    const double tolerance = dtype == at::kFloat ? 2e-5 : 0.25;
    EXPECT_LE(MaxError(out, want.detach()), tolerance) << dtype;
    EXPECT_LE(MaxError(grads.gate, want_grads[0]), tolerance) << dtype;
    EXPECT_LE(MaxError(grads.up, want_grads[1]), tolerance) << dtype;
    if (dtype == at::kFloat) {
      EXPECT_LE(MaxError(out, want.detach()) / want.abs().max().item<double>(), 1e-6);
    }
  }
  // Saturated gates: silu(-100) is -0 and silu(100) is 100, without NaN.
  const at::Tensor extreme = at::tensor({-100.0f, 100.0f, 0.0f});
  const at::Tensor out = SwiGluForward(extreme, at::ones({3}));
  EXPECT_NEAR(out[0].item<float>(), 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(out[1].item<float>(), 100.0f);
  EXPECT_EQ(out[2].item<float>(), 0.0f);
}

TEST(SwiGluKernelTest, HalvesOfOneFusedProjectionInAndOut) {
  at::manual_seed(3);
  const at::Tensor gate_up = at::randn({2, 5, 2 * 37});
  const at::Tensor gate = gate_up.narrow(-1, 0, 37), up = gate_up.narrow(-1, 37, 37);
  ASSERT_TRUE(SwiGluSupports(gate, up));
  const at::Tensor grad = at::randn({2, 5, 37});
  at::Tensor fused_grad = at::empty_like(gate_up);
  const SwiGluGrads into{fused_grad.narrow(-1, 0, 37), fused_grad.narrow(-1, 37, 37)};
  SwiGluBackward(grad, gate, up, &into);
  const at::Tensor out = SwiGluForward(gate, up);
  EXPECT_TRUE(out.is_contiguous());

  at::Tensor fused = gate_up.to(at::kDouble).requires_grad_();
  const at::Tensor want = at::silu(fused.narrow(-1, 0, 37)) * fused.narrow(-1, 37, 37);
  const at::Tensor want_grad = torch::autograd::grad({want}, {fused}, {grad.to(at::kDouble)})[0];
  EXPECT_LE(MaxError(out, want.detach()), 2e-6);
  EXPECT_LE(MaxError(fused_grad, want_grad), 2e-6);
}

TEST(SwiGluKernelTest, RefusesMismatchedInputs) {
  EXPECT_FALSE(SwiGluSupports(at::ones({2, 3}), at::ones({3, 2})));
  EXPECT_FALSE(SwiGluSupports(at::ones({2, 3}), at::ones({2, 3}, at::kBFloat16)));
  EXPECT_FALSE(SwiGluSupports(at::ones({3, 2}).t(), at::ones({2, 3})));
  EXPECT_FALSE(SwiGluSupports(at::ones({2, 4, 3}).narrow(1, 0, 2), at::ones({2, 2, 3})));
  EXPECT_THROW(SwiGluForward(at::ones({2, 3}), at::ones({3})), c10::Error);
}

// transformers' LlamaRMSNorm: weight * to(x.dtype, f32(x) * rsqrt(mean(f32(x)^2) + eps)).
at::Tensor ReferenceRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                            at::ScalarType x_dtype) {
  const at::Tensor normed = x * at::rsqrt(x.pow(2).mean(-1, true) + eps);
  // Rounded to x's dtype as the model does (the gradient passes the rounding unchanged).
  const at::Tensor rounded = normed + (normed.to(x_dtype).to(at::kDouble) - normed).detach();
  return weight * rounded;
}

TEST(RmsNormKernelTest, EqualsTransformersRmsNormForwardAndBackward) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(9);
    const int64_t size = 100;  // not a multiple of 8
    const at::Tensor x = (at::randn({4, 33, size}) * 3).to(dtype);
    const at::Tensor weight = at::randn({size});  // f32, as under autocast
    const RmsNormOutput got = RmsNormForward(x, weight, 1e-6);
    ASSERT_EQ(got.out.scalar_type(), at::kFloat);  // bf16 activations, f32 weight: f32
    const at::Tensor grad = at::randn({4, 33, size});
    const RmsNormGrads grads = RmsNormBackward(grad, x, weight, got.rstd);
    EXPECT_EQ(grads.x.scalar_type(), dtype);
    EXPECT_EQ(grads.weight.scalar_type(), at::kFloat);

    at::Tensor xd = x.to(at::kDouble).requires_grad_(),
               wd = weight.to(at::kDouble).requires_grad_();
    const at::Tensor want = ReferenceRmsNorm(xd, wd, 1e-6, dtype);
    const auto want_grads = torch::autograd::grad({want}, {xd, wd}, {grad.to(at::kDouble)});
    // The forward rounds exactly where transformers does; in bf16 a product landing on a
    // rounding tie may still go the other way (one bf16 step, 2^-8 relative).
    const double forward_tolerance = dtype == at::kFloat ? 1e-5 : 0.05;
    EXPECT_LE(MaxError(got.out, want.detach()), forward_tolerance) << dtype;
    EXPECT_LE(MaxError(grads.x, want_grads[0]), dtype == at::kFloat ? 1e-5 : 0.05) << dtype;
    EXPECT_LE(MaxError(grads.weight, want_grads[1]), dtype == at::kFloat ? 1e-4 : 0.5) << dtype;
  }
}

TEST(RmsNormKernelTest, Bf16WeightsGiveBf16AndTheWeightGradientIsDeterministic) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({64, 48}).to(at::kBFloat16);
  const at::Tensor weight = at::randn({48}).to(at::kBFloat16);
  const RmsNormOutput got = RmsNormForward(x, weight, 1e-5);
  EXPECT_EQ(got.out.scalar_type(), at::kBFloat16);
  const at::Tensor grad = at::randn({64, 48}).to(at::kBFloat16);
  const RmsNormGrads first = RmsNormBackward(grad, x, weight, got.rstd);
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  const RmsNormGrads second = RmsNormBackward(grad, x, weight, got.rstd);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(first.weight, second.weight));
  EXPECT_TRUE(at::equal(first.x, second.x));
}

TEST(RmsNormKernelTest, RefusesWhatItDoesNotTake) {
  EXPECT_FALSE(RmsNormSupports(at::ones({2, 3}), at::ones({2})));
  EXPECT_FALSE(RmsNormSupports(at::ones({2, 3}, at::kHalf), at::ones({3})));
  EXPECT_FALSE(RmsNormSupports(at::ones({3, 2}).t(), at::ones({2})));
  EXPECT_THROW(RmsNormForward(at::ones({2, 3}), at::ones({2}), 1e-6), c10::Error);
}

}  // namespace
}  // namespace engine::kernels
