// GradientAverager against a fake two-rank group whose other rank contributes a known constant:
// buckets start from inside the backward and in bucket order, the results are the means, and
// micro-batch accumulation, unused parameters, low-precision gradients and failures are handled.
#include "dist/gradient_averager.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "testing/fake_data_parallel.h"

namespace engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// This process is rank 0 of two; the other rank's gradients are all `other`.
struct FakeGroup : testing::FakeDataParallel {
  explicit FakeGroup(float other) { other_gradient = other; }
};

struct TwoLayerNet {
  TwoLayerNet() {
    at::manual_seed(3);
    w1 = at::randn({8, 4}).requires_grad_(true);  // 32 elements
    b1 = at::randn({8}).requires_grad_(true);     // 8
    w2 = at::randn({3, 8}).requires_grad_(true);  // 24
    unused = at::randn({5}).requires_grad_(true);
  }
  at::Tensor Loss(const at::Tensor& x) const {
    return at::linear(at::relu(at::linear(x, w1, b1)), w2).pow(2).sum();
  }
  std::vector<NamedParameter> Parameters(bool with_unused) const {
    std::vector<NamedParameter> p = {{"w1", w1}, {"b1", b1}};
    if (with_unused) p.push_back({"unused", unused});
    p.push_back({"w2", w2});
    return p;
  }
  at::Tensor w1, b1, w2, unused;
};

// The gradients of `loss` as plain autograd computes them.
std::vector<at::Tensor> AveragedReference(const TwoLayerNet& net,
                                          const std::vector<at::Tensor>& inputs) {
  at::Tensor total;
  for (const at::Tensor& x : inputs) total = total.defined() ? total + net.Loss(x) : net.Loss(x);
  auto grads = torch::autograd::grad({total}, {net.w1, net.b1, net.w2});
  return {grads[0], grads[1], grads[2]};
}

TEST(GradientAveragerTest, BucketsStartDuringTheBackwardInOrderAndEndAsTheMeans) {
  TwoLayerNet net;
  const at::Tensor x = at::randn({6, 4});
  const auto expected = AveragedReference(net, {x});
  FakeGroup group(/*other=*/1.0f);
  // 200 bytes: w2 (96 bytes) and b1 (32) share the first bucket, w1 (128) gets the second.
  GradientAverager averager(&group, net.Parameters(false), /*bucket_bytes=*/200);
  ASSERT_EQ(averager.bucket_count(), 2);

  averager.ArmForLastBackward();
  net.Loss(x).backward();
  // Both buckets were started by the backward itself, later parameters' bucket first.
  EXPECT_THAT(group.started_sizes, ElementsAre(24 + 8, 32));
  EXPECT_EQ(averager.buckets_started_during_backward(), 2);
  ASSERT_TRUE(averager.Finish().ok());
  EXPECT_EQ(group.started_sizes.size(), 2u);
  EXPECT_TRUE(at::allclose(net.w1.grad(), (expected[0] + 1) / 2));
  EXPECT_TRUE(at::allclose(net.b1.grad(), (expected[1] + 1) / 2));
  EXPECT_TRUE(at::allclose(net.w2.grad(), (expected[2] + 1) / 2));
}

TEST(GradientAveragerTest, EarlierMicroBatchesAreIncludedAndReducedOnce) {
  TwoLayerNet net;
  const at::Tensor x1 = at::randn({6, 4}), x2 = at::randn({6, 4});
  const auto expected = AveragedReference(net, {x1, x2});
  FakeGroup group(/*other=*/0.0f);
  GradientAverager averager(&group, net.Parameters(false), /*bucket_bytes=*/1);
  ASSERT_EQ(averager.bucket_count(), 3);
  net.Loss(x1).backward();
  EXPECT_TRUE(group.started_sizes.empty()) << "an unarmed backward must not reduce";
  averager.ArmForLastBackward();
  net.Loss(x2).backward();
  EXPECT_THAT(group.started_sizes, ElementsAre(24, 8, 32));
  ASSERT_TRUE(averager.Finish().ok());
  EXPECT_TRUE(at::allclose(net.w1.grad(), expected[0] / 2, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(net.w2.grad(), expected[2] / 2, 1e-5, 1e-6));
}

TEST(GradientAveragerTest, AnUnusedParameterCountsAsZerosAndHoldsBackLaterBuckets) {
  TwoLayerNet net;
  const at::Tensor x = at::randn({6, 4});
  FakeGroup group(/*other=*/2.0f);
  GradientAverager averager(&group, net.Parameters(true), /*bucket_bytes=*/1);
  ASSERT_EQ(averager.bucket_count(), 4);  // w2, unused, b1, w1
  averager.ArmForLastBackward();
  net.Loss(x).backward();
  // w2's bucket went; 'unused' never arrives, so b1's and w1's wait for Finish to keep the order.
  EXPECT_THAT(group.started_sizes, ElementsAre(24));
  ASSERT_TRUE(averager.Finish().ok());
  EXPECT_THAT(group.started_sizes, ElementsAre(24, 5, 8, 32));
  ASSERT_TRUE(net.unused.grad().defined());
  EXPECT_TRUE(at::equal(net.unused.grad(), at::full({5}, 1.0f)));
}

TEST(GradientAveragerTest, AStepWithoutAnArmedBackwardReducesWhatAccumulated) {
  TwoLayerNet net;
  const at::Tensor x = at::randn({6, 4});
  const auto expected = AveragedReference(net, {x});
  FakeGroup group(/*other=*/0.0f);
  GradientAverager averager(&group, net.Parameters(false), /*bucket_bytes=*/1 << 20);
  averager.ArmForLastBackward();
  ASSERT_TRUE(averager.Finish().ok());  // a step whose gradients are all missing: zeros
  EXPECT_TRUE(at::equal(net.w1.grad(), at::zeros({8, 4})));
  net.w1.mutable_grad().reset();
  net.b1.mutable_grad().reset();
  net.w2.mutable_grad().reset();
  net.Loss(x).backward();  // not armed: the last micro-batch had no loss terms
  ASSERT_TRUE(averager.Finish().ok());
  EXPECT_TRUE(at::allclose(net.w1.grad(), expected[0] / 2));
}

TEST(GradientAveragerTest, LowPrecisionGradientsAreReducedInF32AndKeepTheirDtype) {
  at::manual_seed(5);
  at::Tensor w = at::randn({16, 16}).to(at::kBFloat16).requires_grad_(true);
  FakeGroup group(/*other=*/0.0f);
  GradientAverager averager(&group, {{"w", w}}, 1 << 20);
  averager.ArmForLastBackward();
  const at::Tensor x = at::randn({4, 16}).to(at::kBFloat16);
  at::matmul(x, w).sum().backward();
  const at::Tensor plain = w.grad().clone();  // what autograd accumulated, in bf16
  ASSERT_TRUE(averager.Finish().ok());
  EXPECT_EQ(w.grad().scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(w.grad(), (plain.to(at::kFloat) / 2).to(at::kBFloat16)));
}

TEST(GradientAveragerTest, AFailedAllReduceIsFinishsErrorAndHooksGoWithTheAverager) {
  TwoLayerNet net;
  const at::Tensor x = at::randn({6, 4});
  FakeGroup group(/*other=*/0.0f);
  group.fail_waits = true;
  {
    GradientAverager averager(&group, net.Parameters(false), 1 << 20);
    averager.ArmForLastBackward();
    net.Loss(x).backward();
    const Status status = averager.Finish();
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr("peer gone"));
  }
  group.started_sizes.clear();
  net.Loss(x).backward();  // the averager is gone; its hooks must be too
  EXPECT_TRUE(group.started_sizes.empty());
}

}  // namespace
}  // namespace engine
