#include "engine/activation_checkpoint.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "engine/precision_context.h"

namespace engine {
namespace {

struct Block {
  torch::nn::Linear a{16, 32};
  torch::nn::Linear b{32, 16};
  at::Tensor operator()(const at::Tensor& x) {
    return b->forward(at::dropout(at::gelu(a->forward(x)), 0.3, /*train=*/true));
  }
  std::vector<at::Tensor> Grads() const {
    return {a->weight.grad().clone(), a->bias.grad().clone(), b->weight.grad().clone(),
            b->bias.grad().clone()};
  }
  void ZeroGrad() {
    for (auto* p : {&a->weight, &a->bias, &b->weight, &b->bias}) p->mutable_grad().reset();
  }
};

// Two blocks in a row, then a loss; returns the gradients of the parameters and the input.
std::vector<at::Tensor> CheckpointGradients(std::vector<Block>& blocks, bool checkpointed,
                                            const at::Tensor& x0, uint64_t seed) {
  for (Block& block : blocks) block.ZeroGrad();
  at::manual_seed(seed);
  at::Tensor x = x0.detach().set_requires_grad(true);
  at::Tensor h = x;
  for (Block& block : blocks) {
    h = checkpointed ? CheckpointedForward([&](const at::Tensor& in) { return block(in); }, h)
                     : block(h);
  }
  h.to(at::kFloat).pow(2).mean().backward();
  std::vector<at::Tensor> grads;
  for (Block& block : blocks) {
    for (const at::Tensor& g : block.Grads()) grads.push_back(g);
  }
  grads.push_back(x.grad().clone());
  return grads;
}

TEST(ActivationCheckpointTest, GradientsEqualThePlainBackward) {
  std::vector<Block> blocks(2);
  const at::Tensor x = at::randn({4, 16});
  auto plain = CheckpointGradients(blocks, false, x, 3);
  auto checkpointed = CheckpointGradients(blocks, true, x, 3);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(at::allclose(plain[i], checkpointed[i], 1e-6, 1e-7)) << "gradient " << i;
  }
}

TEST(ActivationCheckpointTest, RecomputationReentersTheBf16Context) {
  std::vector<Block> blocks(2);
  const at::Tensor x = at::randn({4, 16});
  auto scope = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter();
  auto plain = CheckpointGradients(blocks, false, x, 5);
  auto checkpointed = CheckpointGradients(blocks, true, x, 5);
  for (size_t i = 0; i < plain.size(); ++i) {
    // The same bf16 computations in the same order: the same bits.
    EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << "gradient " << i;
  }
}

TEST(ActivationCheckpointTest, ParametersGetGradientsWhenTheInputNeedsNone) {
  Block block;
  block.ZeroGrad();
  at::Tensor out =
      CheckpointedForward([&](const at::Tensor& in) { return block(in); }, at::randn({2, 16}));
  out.sum().backward();
  EXPECT_TRUE(block.a->weight.grad().defined());
  EXPECT_GT(block.a->weight.grad().abs().sum().item<float>(), 0.0f);
}

TEST(ActivationCheckpointTest, WithoutGradModeTheBlockJustRuns) {
  Block block;
  at::NoGradGuard no_grad;
  at::Tensor out =
      CheckpointedForward([&](const at::Tensor& in) { return block(in); }, at::randn({2, 16}));
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.sizes(), at::IntArrayRef({2, 16}));
}

}  // namespace
}  // namespace engine
