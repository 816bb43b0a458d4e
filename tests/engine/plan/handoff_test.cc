// The tensor mapping from a parent stage to a child stage (plan/handoff.h), on small modules.
#include "plan/handoff.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/linear.h"

namespace engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// An 8-bit stand-in for a quantizer: "weight" i8 [rows, cols] and "weight_scale" f32 [rows].
class FakeInt8 : public QuantizedWeight {
 public:
  explicit FakeInt8(const at::Tensor& dense)
      : scale_(dense.abs().amax(1).clamp_min(1e-8) / 127),
        codes_((dense / scale_.unsqueeze(1)).round().to(at::kChar)) {}
  std::string format() const override { return "fake8"; }
  int64_t rows() const override { return codes_.size(0); }
  int64_t cols() const override { return codes_.size(1); }
  c10::ScalarType compute_dtype() const override { return at::kFloat; }
  at::Tensor DequantizeRows(int64_t begin, int64_t end, c10::ScalarType dtype) const override {
    return (codes_.slice(0, begin, end).to(at::kFloat) * scale_.slice(0, begin, end).unsqueeze(1))
        .to(dtype);
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors() const override {
    return {{"weight", codes_}, {"weight_scale", scale_}};
  }
  StatusOr<std::shared_ptr<QuantizedWeight>> QuantizeLike(const at::Tensor& dense) const override {
    return std::shared_ptr<QuantizedWeight>(std::make_shared<FakeInt8>(dense));
  }

 private:
  at::Tensor scale_, codes_;
};

// A LoRA-shaped adapter: lora_A [r, in], lora_B [out, r].
class FakeLora : public LinearAdapter {
 public:
  FakeLora(int64_t in, int64_t out, int64_t r) : a_(Linear(in, r)), b_(Linear(r, out)) {}
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules() override {
    return {{"lora_A", a_.ptr()}, {"lora_B", b_.ptr()}};
  }
  at::Tensor Delta(const at::Tensor& x) override { return b_(a_(x)); }
  at::Tensor WeightDelta() override { return at::matmul(b_->weight, a_->weight); }

 private:
  Linear a_, b_;
};

struct TwoLayers : torch::nn::Module {
  TwoLayers() {
    first = register_module("first", Linear(8, 6, /*with_bias=*/true));
    second = register_module("second", Linear(6, 4));
  }
  Linear first{nullptr}, second{nullptr};
};

HandoffSource SourceOf(torch::nn::Module& module, const std::string& stage = "parent") {
  HandoffSource source;
  source.stage = stage;
  for (const auto& item : module.named_parameters()) {
    source.tensors[item.key()] = item.value().sizes().vec();
  }
  for (const auto& item : module.named_buffers()) {
    source.tensors[item.key()] = item.value().sizes().vec();
    if (!item.value().is_floating_point()) source.integer_tensors.insert(item.key());
  }
  return source;
}

std::set<std::string> AdapterNames(torch::nn::Module& module) {
  std::set<std::string> names;
  for (const auto& item : module.named_parameters()) {
    if (item.key().find(".lora_") != std::string::npos) names.insert(item.key());
  }
  return names;
}

TEST(HandoffTest, SameModelsCopyEveryTensor) {
  TwoLayers parent, child;
  const Handoff h = PlanHandoff(SourceOf(parent), child, {}, /*merge_adapters=*/false);
  EXPECT_THAT(h.problems, IsEmpty());
  EXPECT_THAT(h.copied, ElementsAre("first.bias", "first.weight", "second.weight"));
  EXPECT_EQ(HandoffSummary(h), "3 tensors copied");
}

TEST(HandoffTest, AQuantizedChildLayerIsQuantizedFromTheDenseParentWeight) {
  TwoLayers parent, child;
  ASSERT_TRUE(
      child.second->Quantize(std::make_shared<FakeInt8>(child.second->weight.detach())).ok());
  ASSERT_TRUE(child.second->AddAdapter(std::make_shared<FakeLora>(6, 4, 2)).ok());
  const Handoff h = PlanHandoff(SourceOf(parent), child, AdapterNames(child), false);
  EXPECT_THAT(h.problems, IsEmpty());
  EXPECT_THAT(h.copied, ElementsAre("first.bias", "first.weight"));
  EXPECT_THAT(h.dense_layers, ElementsAre("second"));
  EXPECT_EQ(h.quantized_layers, 1);
  EXPECT_THAT(h.fresh, ElementsAre("second.lora_A.weight", "second.lora_B.weight"));
  EXPECT_EQ(HandoffSummary(h),
            "2 tensors copied, 1 layers quantized from dense weights, 2 new adapter tensors");

  // LoadDenseWeight then holds the parent's weight, quantized.
  at::NoGradGuard no_grad;
  ASSERT_TRUE(child.second->LoadDenseWeight(parent.second->weight).ok());
  EXPECT_TRUE(at::allclose(child.second->DenseWeight(at::kFloat), parent.second->weight, 0, 0.01));

  // A parent quantized the same way is copied buffer by buffer.
  TwoLayers quantized_parent;
  ASSERT_TRUE(quantized_parent.second
                  ->Quantize(std::make_shared<FakeInt8>(quantized_parent.second->weight.detach()))
                  .ok());
  const Handoff same = PlanHandoff(SourceOf(quantized_parent), child, AdapterNames(child), false);
  EXPECT_THAT(same.problems, IsEmpty());
  EXPECT_THAT(same.copied,
              ElementsAre("first.bias", "first.weight", "second.weight", "second.weight_scale"));
}

TEST(HandoffTest, ParentAdaptersAreReattachedOrMergedAsTheStageSays) {
  TwoLayers parent;
  ASSERT_TRUE(parent.first->AddAdapter(std::make_shared<FakeLora>(8, 6, 2)).ok());
  HandoffSource source = SourceOf(parent);
  source.adapter_tensors = AdapterNames(parent);

  TwoLayers plain;
  const Handoff refused = PlanHandoff(source, plain, {}, /*merge_adapters=*/false);
  ASSERT_EQ(refused.problems.size(), 2u);
  EXPECT_THAT(refused.problems[0], HasSubstr("'first.lora_A.weight' has no place here"));
  EXPECT_THAT(refused.problems[0], HasSubstr("parent_adapters: MERGE"));

  const Handoff merged = PlanHandoff(source, plain, {}, /*merge_adapters=*/true);
  EXPECT_THAT(merged.problems, IsEmpty());
  EXPECT_THAT(merged.dense_layers, ElementsAre("first"));
  ASSERT_EQ(merged.merged_adapters.count("first"), 1u);
  EXPECT_EQ(merged.merged_adapters.at("first").size(), 2u);
  EXPECT_THAT(merged.copied, ElementsAre("first.bias", "second.weight"));

  TwoLayers adapted;
  ASSERT_TRUE(adapted.first->AddAdapter(std::make_shared<FakeLora>(8, 6, 2)).ok());
  const Handoff attached = PlanHandoff(source, adapted, AdapterNames(adapted), false);
  EXPECT_THAT(attached.problems, IsEmpty());
  EXPECT_EQ(attached.reattached_adapter_tensors, 2);
  EXPECT_THAT(attached.fresh, IsEmpty());
}

TEST(HandoffTest, MergingTheAdaptersOfAQuantizedParentIsRefusedWithTheWayOut) {
  TwoLayers parent;
  ASSERT_TRUE(
      parent.first->Quantize(std::make_shared<FakeInt8>(parent.first->weight.detach())).ok());
  ASSERT_TRUE(parent.first->AddAdapter(std::make_shared<FakeLora>(8, 6, 2)).ok());
  HandoffSource source = SourceOf(parent);
  source.adapter_tensors = AdapterNames(parent);
  TwoLayers plain;
  const Handoff h = PlanHandoff(source, plain, {}, /*merge_adapters=*/true);
  ASSERT_FALSE(h.problems.empty());
  EXPECT_THAT(h.problems[0], HasSubstr("'first.weight': merging the parent's adapters needs its "
                                       "dense weight, and the parent holds it quantized"));
  EXPECT_THAT(h.problems[0], HasSubstr("parent_adapters: ATTACH"));
}

TEST(HandoffTest, TensorsOnlyOneSideHasAndOtherShapesAreNamed) {
  TwoLayers parent;
  struct Other : torch::nn::Module {
    Other() {
      first = register_module("first", Linear(8, 5, /*with_bias=*/true));
      third = register_module("third", Linear(5, 4));
    }
    Linear first{nullptr}, third{nullptr};
  } child;
  const Handoff h = PlanHandoff(SourceOf(parent, "vision"), child, {}, false);
  EXPECT_THAT(h.problems, ElementsAre("'first.bias' is [6] in 'vision' but [5] here",
                                      "'first.weight' is [6,8] in 'vision' but [5,8] here",
                                      "'third.weight' exists only here (name the tensors that keep "
                                      "the model's initialisation in new_tensors)",
                                      "'second.weight' exists only in 'vision'"));
  EXPECT_THAT(HandoffProblems(h, 2), HasSubstr("... (4 in all)"));
}

struct Tower : torch::nn::Module {
  Tower() {
    in = register_module("in", Linear(3, 8, /*with_bias=*/true));
    out = register_module("out", Linear(8, 8));
  }
  Linear in{nullptr}, out{nullptr};
};

// A "vlm"-like child: the parent's two layers under the same names, plus a new "tower".
struct TowerAndTwoLayers : TwoLayers {
  TowerAndTwoLayers() { tower = register_module("tower", std::make_shared<Tower>()); }
  std::shared_ptr<Tower> tower;
};

TEST(HandoffTest, NewTensorsKeepTheirInitialisationWhenTheParentLacksThem) {
  TwoLayers parent;
  TowerAndTwoLayers child;
  ASSERT_TRUE(child.first->AddAdapter(std::make_shared<FakeLora>(8, 6, 2)).ok());

  const Handoff refused = PlanHandoff(SourceOf(parent, "lm"), child, AdapterNames(child), false);
  ASSERT_EQ(refused.problems.size(), 3u);
  EXPECT_EQ(refused.problems[0],
            "'tower.in.bias' exists only here (name the tensors that keep the model's "
            "initialisation in new_tensors)");
  EXPECT_EQ(refused.problems[1], "'tower.in.weight' exists only here");

  const Handoff h = PlanHandoff(SourceOf(parent, "lm"), child, AdapterNames(child), false,
                                {"tower.*", "first.lora_*"});
  EXPECT_THAT(h.problems, IsEmpty());
  EXPECT_THAT(h.copied, ElementsAre("first.bias", "first.weight", "second.weight"));
  EXPECT_THAT(h.initialised, ElementsAre("tower.in.bias", "tower.in.weight", "tower.out.weight"));
  EXPECT_THAT(h.fresh, ElementsAre("first.lora_A.weight", "first.lora_B.weight"));
  EXPECT_EQ(HandoffSummary(h),
            "3 tensors copied, 2 new adapter tensors, 3 new tensors initialised by the model");

  // A pattern that names nothing the parent lacks is a mistake (here: tensors the parent has).
  const Handoff stray = PlanHandoff(SourceOf(parent, "lm"), child, AdapterNames(child), false,
                                    {"tower.*", "second.*"});
  EXPECT_THAT(stray.problems,
              ElementsAre("new_tensors pattern 'second.*' matches no tensor that 'lm' lacks"));

  // The parent's own tensors must still all find a place: new_tensors does not drop them.
  TowerAndTwoLayers bigger_parent;
  TwoLayers smaller_child;
  const Handoff dropped =
      PlanHandoff(SourceOf(bigger_parent, "vlm"), smaller_child, {}, false, {"first.*"});
  EXPECT_THAT(dropped.problems, ::testing::Contains("'tower.in.weight' exists only in 'vlm'"));
}

}  // namespace
}  // namespace engine
