// The fused AdamW and unscale kernels against the same arithmetic in ATen ops.
#include "engine_kernels/fused_adamw.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace engine::kernels {
namespace {

// The engine's AdamW (engine/src/train/optimizer.cc) step in ATen ops.
void ReferenceStep(at::Tensor& p, const at::Tensor& g, at::Tensor& m, at::Tensor& v,
                   const AdamWHyper& h) {
  const double bias1 = 1 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(h.beta2, static_cast<double>(h.step)));
  p.mul_(1 - h.lr * h.weight_decay);
  m.mul_(h.beta1).add_(g, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
  p.addcdiv_(m, v.sqrt().div_(bias2_sqrt).add_(h.epsilon), -h.lr / bias1);
}

TEST(FusedAdamWTest, MatchesTheEngineUpdateForEveryGradientDtype) {
  for (c10::ScalarType grad_dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::manual_seed(1);
    const int64_t n = 100003;  // not a multiple of any vector width or grain
    at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
    at::Tensor rp = p.clone(), rm = m.clone(), rv = v.clone();
    at::Tensor low = at::empty({n}, at::kBFloat16);
    AdamWHyper h;
    h.lr = 0.01;
    for (int64_t step = 1; step <= 3; ++step) {
      h.step = step;
      const at::Tensor g = (at::randn({n}) * 4).to(grad_dtype);  // scaled by 4, unscaled below
      FusedAdamW(p, g, m, v, h, /*grad_scale=*/0.25, low);
      ReferenceStep(rp, g.to(at::kFloat) * 0.25, rm, rv, h);
    }
    EXPECT_TRUE(at::allclose(p, rp, 1e-5, 1e-6)) << grad_dtype;
    EXPECT_TRUE(at::allclose(m, rm, 1e-5, 1e-7)) << grad_dtype;
    EXPECT_TRUE(at::allclose(v, rv, 1e-5, 1e-7)) << grad_dtype;
    EXPECT_TRUE(at::equal(low, p.to(at::kBFloat16))) << grad_dtype;
  }
}

TEST(FusedAdamWTest, RefusesWhatItCannotTake) {
  at::Tensor p = at::zeros({4}), m = at::zeros({4}), v = at::zeros({4});
  EXPECT_FALSE(FusedAdamWSupports(p.to(at::kBFloat16), p));
  EXPECT_FALSE(FusedAdamWSupports(p, at::zeros({5})));
  EXPECT_FALSE(FusedAdamWSupports(at::zeros({4, 2}).t(), at::zeros({2, 4})));
  EXPECT_THROW(FusedAdamW(p, p, m.to(at::kBFloat16), v, AdamWHyper()), c10::Error);
  EXPECT_THROW(FusedAdamW(p, p, m, v, AdamWHyper(), 1.0, at::zeros({4})), c10::Error);
}

TEST(UnscaleTest, ScalesAndReportsNonFiniteValues) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor g = at::full({70000}, 8.0).to(dtype);
    EXPECT_TRUE(UnscaleAndCheckFinite(g, 0.125)) << dtype;
    EXPECT_TRUE(at::equal(g, at::ones({70000}).to(dtype))) << dtype;
    g[65000] = INFINITY;
    EXPECT_FALSE(UnscaleAndCheckFinite(g, 1.0)) << dtype;
    g[65000] = NAN;
    g[3] = 2.0;
    EXPECT_FALSE(UnscaleAndCheckFinite(g, 0.5)) << dtype;
    EXPECT_EQ(g[3].item<float>(), 1.0f) << dtype;
  }
}

TEST(AllFiniteTest, FindsOneNonFiniteValueAndWritesNothing) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor g = at::full({70000}, 8.0).to(dtype);
    EXPECT_TRUE(AllFinite(g)) << dtype;
    g[69999] = -INFINITY;
    EXPECT_FALSE(AllFinite(g)) << dtype;
    g[69999] = NAN;
    EXPECT_FALSE(AllFinite(g)) << dtype;
    EXPECT_EQ(g[0].item<float>(), 8.0f) << dtype;
  }
  EXPECT_TRUE(AllFinite(at::zeros({0})));
  EXPECT_THROW(AllFinite(at::zeros({4}, at::kDouble)), c10::Error);
}

TEST(AllFiniteTest, TheLargestAndTheSubnormalValuesOfEachDtypeAreFinite) {
  // The check reads the exponent bits, so the values next to inf and the ones without an exponent
  // are the edges.
  const std::vector<std::pair<c10::ScalarType, double>> largest = {
      {at::kFloat, 3.4028234663852886e38},
      {at::kBFloat16, 3.3895313892515355e38},
      {at::kHalf, 65504.0}};
  for (const auto& [dtype, max] : largest) {
    at::Tensor g = at::full({70000}, 8.0).to(dtype);
    g[1] = max;
    g[2] = -max;
    g[3] = at::kFloat == dtype ? 1e-45 : dtype == at::kHalf ? 6e-8 : 1e-40;
    EXPECT_GT(std::abs(g[1].item<double>()), 1e4) << dtype;
    EXPECT_NE(g[3].item<double>(), 0.0) << dtype << ": the subnormal rounded to zero";
    EXPECT_TRUE(AllFinite(g)) << dtype;
    at::Tensor found = at::zeros({1}, at::kInt);
    FlagNonFinite(g, found);
    EXPECT_EQ(found.item<int>(), 0) << dtype;
  }
}

TEST(FlagNonFiniteTest, OneFlagCollectsEveryTensorsCheck) {
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor found = at::zeros({1}, at::kInt);
    at::Tensor a = at::full({70000}, 8.0).to(dtype), b = at::full({33}, 2.0).to(dtype);
    UnscaleAndFlagNonFinite(a, 0.125, found);
    FlagNonFinite(b, found);
    EXPECT_EQ(found.item<int>(), 0) << dtype;
    EXPECT_TRUE(at::equal(a, at::ones({70000}).to(dtype))) << dtype;
    EXPECT_EQ(b[0].item<float>(), 2.0f) << "FlagNonFinite writes nothing";
    b[32] = NAN;
    FlagNonFinite(b, found);
    UnscaleAndFlagNonFinite(a, 1.0, found);
    EXPECT_EQ(found.item<int>(), 1) << "a later clean tensor does not clear the flag";
  }
  EXPECT_TRUE(FusedKernelsTake(at::zeros({4}, at::kBFloat16)));
  EXPECT_FALSE(FusedKernelsTake(at::zeros({4, 2}).t()));
  EXPECT_FALSE(FusedKernelsTake(at::zeros({4}, at::kDouble)));
  EXPECT_THROW(FlagNonFinite(at::zeros({4}), at::zeros({1}, at::kLong)), c10::Error);
  EXPECT_THROW(FlagNonFinite(at::zeros({4, 2}).t(), at::zeros({1}, at::kInt)), c10::Error);
}

}  // namespace
}  // namespace engine::kernels
