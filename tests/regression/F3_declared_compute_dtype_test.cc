// F3: which parts compute in which dtype was implicit. A module that must compute in f32 declares
// it, and the plan lists storage and compute dtype of every part.
#include <ATen/ops/ones.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <nlohmann/json.hpp>

#include "engine/precision_context.h"
#include "testing/pipelines.h"
#include "testing/subprocess.h"

namespace engine {
namespace {

TEST(F3DeclaredComputeDtypeTest, UnderAutocastComputeIsImplicit) {
  // Plain LibTorch: an f32 module under bf16 autocast computes in bf16 without saying so.
  torch::nn::Linear head(4, 2);
  auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
  EXPECT_EQ(head->forward(at::ones({1, 4})).scalar_type(), at::kBFloat16);
}

TEST(F3DeclaredComputeDtypeTest, ThePlanListsStorageAndComputePerPart) {
  testing::TempDir dir;
  auto file = dir.Write(
      "p.pbtxt", "output_dir: \"out\"\n" +
                     testing::DigitsStage(
                         "s", testing::Precision("bf16-true") + "  schedule { max_steps: 20 }",
                         "head_compute_fp32: true"));
  auto r = testing::RunEngine({"check", file.string(), "--format=json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto precision = nlohmann::json::parse(r.out)["plan"]["stages"][0]["precision"];
  for (const auto& t : precision["tensors"]) {
    const bool head = t["name"].get<std::string>().rfind("head.", 0) == 0;
    EXPECT_EQ(t["storage"], head ? "f32" : "bf16") << t["name"];
    EXPECT_EQ(t["compute"], head ? "f32" : "bf16") << t["name"];
    EXPECT_EQ(t["master"], "f32") << t["name"];
  }
  auto text = testing::RunEngine({"check", file.string()});
  EXPECT_THAT(text.out, ::testing::HasSubstr("trainable, kept f32"));
  auto run = testing::RunEngine({"run", file.string()}, dir.path().string());
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

}  // namespace
}  // namespace engine
