// F1: precision was read from a model-level attribute; a wrapped model said f32 while its weights
// were bf16. The engine's census reads the tensors.
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include "precision/census.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

// What the seeds' code did: trust a declared dtype.
struct WrappedModel {
  at::ScalarType declared_dtype = at::kFloat;  // "model.dtype" said f32
  torch::nn::Linear inner{4, 2};
};

TEST(F1CensusFromTensorsTest, TrustingTheAttributeFailsAndTheCensusDoesNot) {
  WrappedModel wrapped;
  wrapped.inner->to(at::kBFloat16);  // the weights really are bf16
  // Plain LibTorch: inputs prepared for the declared dtype meet bf16 weights.
  at::Tensor input = at::ones({3, 4}, wrapped.declared_dtype);
  try {
    (void)wrapped.inner->forward(input);
    FAIL() << "expected a dtype mismatch";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what_without_backtrace(), HasSubstr("same dtype"));
  }
  // The engine's census looks at the tensors.
  for (const TensorCensusEntry& e : TakeCensus(*wrapped.inner)) {
    EXPECT_EQ(e.dtype, at::kBFloat16) << e.name;
  }
}

TEST(F1CensusFromTensorsTest, CheckPrintsTheCensusOfTheRealTensors) {
  testing::TempDir dir;
  auto file = dir.Write(
      "p.pbtxt", "output_dir: \"out\"\n" +
                     testing::DigitsStage("s", testing::Precision("fp32"), "param_dtype: BF16"));
  auto r = testing::RunEngine({"check", file.string(), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto plan = nlohmann::json::parse(r.out)["plan"]["stages"][0];
  for (const auto& row : plan["census"]) EXPECT_EQ(row["dtype"], "bf16") << row["name"];
  EXPECT_EQ(plan["census_summary"][0]["dtype"], "bf16");
  EXPECT_EQ(plan["precision"]["reason"], "as the pipeline asks; casts 4 tensor(s) bf16 to f32");
  auto text = testing::RunEngine({"check", file.string()});
  EXPECT_THAT(text.out, HasSubstr("layers            trainable  bf16         2         8,320"));
}

}  // namespace
}  // namespace engine
