// F2: fp16 mixed precision was requested on a bf16 model and crashed at start. The engine refuses
// the explicit request at check time with the census, the rule and the fix; `auto` resolves it.
#include <ATen/ops/full.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(F2Fp16OnBf16ModelTest, Fp16CannotHoldWhatBf16Holds) {
  // Plain LibTorch: a value a bf16 model may carry becomes inf in fp16.
  at::Tensor activation = at::full({1}, 1.0e5, at::kBFloat16);
  EXPECT_TRUE(std::isinf(activation.to(at::kHalf).to(at::kFloat).item<float>()));
}

TEST(F2Fp16OnBf16ModelTest, ExplicitFp16IsRefusedAtCheckAndAutoResolves) {
  testing::TempDir dir;
  auto refused = dir.Write(
      "fp16.pbtxt",
      "output_dir: \"out\"\n" +
          testing::DigitsStage("s", testing::Precision("fp16-mixed"), "param_dtype: BF16"));
  auto r = testing::RunEngine({"check", refused.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("fp16.pbtxt:6:3: error: stage 's' precision policy 'fp16-mixed': "
                               "fp16-mixed computes in fp16, but the model is stored in bf16 "
                               "(census: 4 of 4 floating-point parameter tensors, 9,610 values)"));
  EXPECT_THAT(r.err, HasSubstr("fp16 cannot hold (fp16's largest value is 65,504"));
  EXPECT_THAT(r.err, HasSubstr("Use precision auto, bf16-mixed or bf16-true, or fp32"));

  auto resolved = dir.Write(
      "auto.pbtxt", "output_dir: \"out\"\n" + testing::DigitsStage("s", "", "param_dtype: BF16"));
  auto ok = testing::RunEngine({"run", resolved.string()}, dir.path().string());
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("precision   auto -> "));
  EXPECT_THAT(ok.out, ::testing::AnyOf(HasSubstr("auto -> bf16-true"), HasSubstr("auto -> fp32")));
}

}  // namespace
}  // namespace engine
