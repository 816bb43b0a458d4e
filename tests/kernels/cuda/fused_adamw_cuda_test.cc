// The CUDA fused AdamW and non-finite checks against the CPU kernels, through the same entry
// points (fused_adamw.h dispatches on the tensors' device). Built only when nvcc is present and
// LibTorch has CUDA; skipped when no device is visible.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "engine/torch_compat.h"
#include "engine_kernels/fused_adamw.h"

namespace engine::kernels {
namespace {

TEST(FusedAdamWCudaTest, MatchesTheCpuKernelForEveryGradientAndCopyDtype) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  for (c10::ScalarType grad_dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (c10::ScalarType low_dtype : {at::kBFloat16, at::kHalf}) {
      at::manual_seed(3);
      const int64_t n = 1000003;
      at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
      at::Tensor low = at::empty({n}, low_dtype);
      at::Tensor dp = p.cuda(), dm = m.cuda(), dv = v.cuda();
      at::Tensor dlow = at::empty({n}, at::TensorOptions(low_dtype).device(at::kCUDA));
      AdamWHyper h;
      h.lr = 0.01;
      for (int64_t step = 1; step <= 3; ++step) {
        h.step = step;
        const at::Tensor g = (at::randn({n}) * 1024).to(grad_dtype);
        ASSERT_TRUE(FusedAdamWSupports(dp, g.cuda()));
        FusedAdamW(p, g, m, v, h, 1.0 / 1024, low);
        FusedAdamW(dp, g.cuda(), dm, dv, h, 1.0 / 1024, dlow);
      }
      // nvcc may contract multiply-adds the CPU compiler did not: agreement to rounding.
      EXPECT_TRUE(at::allclose(dp.cpu(), p, 1e-5, 1e-6)) << grad_dtype << " " << low_dtype;
      EXPECT_TRUE(at::allclose(dm.cpu(), m, 1e-5, 1e-7)) << grad_dtype << " " << low_dtype;
      EXPECT_TRUE(at::allclose(dv.cpu(), v, 1e-5, 1e-7)) << grad_dtype << " " << low_dtype;
      EXPECT_TRUE(at::equal(dlow.cpu(), dp.cpu().to(low_dtype))) << grad_dtype << " " << low_dtype;
    }
  }
}

TEST(FusedAdamWCudaTest, NonFiniteChecksMatchTheCpu) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  for (c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::Tensor g = (at::randn({300001}) * 512).to(dtype);
    at::Tensor dg = g.cuda();
    at::Tensor found = at::zeros({1}, at::kInt), dfound = found.cuda();
    UnscaleAndFlagNonFinite(g, 1.0 / 512, found);
    UnscaleAndFlagNonFinite(dg, 1.0 / 512, dfound);
    EXPECT_TRUE(at::equal(dg.cpu(), g)) << dtype;
    EXPECT_EQ(dfound.item<int>(), 0) << dtype;
    dg[300000] = INFINITY;
    FlagNonFinite(dg, dfound);
    EXPECT_EQ(dfound.item<int>(), 1) << dtype;
  }
}

}  // namespace
}  // namespace engine::kernels
