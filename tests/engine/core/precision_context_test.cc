#include "engine/precision_context.h"

#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>

#include "engine/torch_compat.h"

namespace engine {
namespace {

TEST(PrecisionContextTest, EnterSetsAndRestoresTheThreadsState) {
  ASSERT_FALSE(engine::compat::AutocastEnabled(at::kCPU));
  {
    auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
    EXPECT_TRUE(engine::compat::AutocastEnabled(at::kCPU));
    EXPECT_EQ(engine::compat::AutocastDtype(at::kCPU), at::kBFloat16);
    at::Tensor a = at::ones({2, 2});
    EXPECT_EQ(a.matmul(a).scalar_type(), at::kBFloat16);
    {
      auto off = PrecisionContext::None().Enter();
      EXPECT_FALSE(engine::compat::AutocastEnabled(at::kCPU));
      EXPECT_EQ(a.matmul(a).scalar_type(), at::kFloat);
    }
    EXPECT_TRUE(engine::compat::AutocastEnabled(at::kCPU));
  }
  EXPECT_FALSE(engine::compat::AutocastEnabled(at::kCPU));
}

TEST(PrecisionContextTest, CaptureReadsTheCurrentState) {
  EXPECT_EQ(PrecisionContext::Capture(), PrecisionContext::None());
  const auto bf16 = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16);
  auto scope = bf16.Enter();
  EXPECT_EQ(PrecisionContext::Capture(), bf16);
  EXPECT_EQ(bf16.ToString(), "autocast cpu bf16");
  EXPECT_EQ(PrecisionContext::None().ToString(), "none");
}

TEST(PrecisionContextTest, LeavingTheOutermostScopeDropsCachedCasts) {
  // Autocast caches the bf16 copy of a weight within a region; after the weight changes outside,
  // the next region must see the new value.
  at::Tensor w = at::ones({2, 2}).set_requires_grad(true);
  at::Tensor x = at::ones({1, 2});
  const auto bf16 = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16);
  {
    auto scope = bf16.Enter();
    EXPECT_EQ(x.matmul(w).sum().item<float>(), 4.0f);
  }
  {
    at::NoGradGuard no_grad;
    w.mul_(2);
  }
  {
    auto scope = bf16.Enter();
    EXPECT_EQ(x.matmul(w).sum().item<float>(), 8.0f);
  }
}

TEST(PrecisionContextTest, UnsupportedDtypeThrowsWithoutChangingAnything) {
  const auto fp16 = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kHalf);
  bool threw = false;
  try {
    auto scope = fp16.Enter();
  } catch (const c10::Error&) {
    threw = true;
  }
  if (threw) {
    EXPECT_FALSE(engine::compat::AutocastEnabled(at::kCPU));
  } else {
    GTEST_SKIP() << "this LibTorch autocasts to fp16 on the CPU";
  }
}

}  // namespace
}  // namespace engine
