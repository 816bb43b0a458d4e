// Shard level 3's parameter shards on real Gloo groups of 2 and 3 ranks (threads): a block's
// trainable parameters hold no elements except while the block runs, the forward and backward
// through the shards give the plain module's loss and gradients exactly, frozen and out-of-block
// parameters stay whole, and what the layout's parts (the optimizer's views) or a restore write is
// what the next gather brings back.
#define USE_C10D_GLOO 1
#include "dist/parameter_shards.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <string>
#include <vector>

#include "testing/gloo_ranks.h"

namespace engine {
namespace {

// Three blocks of widths 5 -> 7 -> 3 -> 4 (block 1 also holds a frozen scale) and a head 4 -> 2
// outside every block; 40-byte buckets cut the blocks' parameters into several buckets each.
constexpr int64_t kToyBucketBytes = 40;

struct ShardToy : torch::nn::Module {
  ShardToy() {
    blocks.push_back(register_module("b0", torch::nn::Linear(5, 7)));
    blocks.push_back(register_module("b1", torch::nn::Linear(7, 3)));
    blocks.push_back(register_module("b2", torch::nn::Linear(3, 4)));
    frozen = blocks[1]->register_parameter("scale", at::ones({3}), /*requires_grad=*/false);
    head = register_module("head", torch::nn::Linear(4, 2));
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7);
    at::NoGradGuard no_grad;
    for (auto& p : parameters()) p.copy_(at::randn(p.sizes(), generator));
  }
  at::Tensor Block(size_t i, const at::Tensor& x) {
    at::Tensor y = at::tanh(blocks[i]->forward(x));
    return i == 1 ? y * frozen : y;
  }
  std::vector<torch::nn::Linear> blocks;
  at::Tensor frozen;
  torch::nn::Linear head{nullptr};
};

std::vector<NamedParameter> Trainable(ShardToy& toy) {
  std::vector<NamedParameter> out;
  for (const auto& item : toy.named_parameters()) {
    if (item.value().requires_grad()) out.push_back({item.key(), item.value()});
  }
  return out;
}

std::vector<NamedBlock> Blocks(ShardToy& toy) {
  return {{"b0", toy.blocks[0].get()}, {"b1", toy.blocks[1].get()}, {"b2", toy.blocks[2].get()}};
}

at::Tensor Input(int rank) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(100 + rank);
  return at::randn({6, 5}, generator);
}

// The loss of `toy` on `x`, each block run through `shards` (or as it is, when null).
at::Tensor Loss(ShardToy& toy, ParameterShards* shards, const at::Tensor& x) {
  at::Tensor h = x;
  for (size_t i = 0; i < toy.blocks.size(); ++i) {
    auto run = [&toy, i](const at::Tensor& in) { return toy.Block(i, in); };
    h = shards != nullptr ? shards->Run(*toy.blocks[i], run, h, /*checkpointing=*/false) : run(h);
  }
  return toy.head->forward(h).pow(2).sum();
}

class ParameterShardsTest : public ::testing::TestWithParam<int> {};

TEST_P(ParameterShardsTest, BlocksAreWholeOnlyWhileTheyRunAndTheGradientsAreThePlainOnes) {
  const int world = GetParam();
  testing::OnRanks(world, [&](DataParallel& group) {
    ShardToy reference;
    const at::Tensor x = Input(group.rank());
    const at::Tensor expected_loss = Loss(reference, nullptr, x);
    expected_loss.backward();

    ShardToy toy;
    auto shards = ParameterShards::Make(&group, Trainable(toy), Blocks(toy), kToyBucketBytes);
    ASSERT_TRUE(shards.ok()) << shards.status().message();
    for (const auto& block : toy.blocks) {
      EXPECT_EQ(block->weight.numel(), 0);
      EXPECT_EQ(block->bias.numel(), 0);
    }
    // Frozen and out-of-block parameters are not split.
    EXPECT_TRUE(at::equal(toy.frozen, reference.frozen));
    EXPECT_TRUE(at::equal(toy.head->weight, reference.head->weight));
    // 35 + 7 + 21 + 3 + 12 + 4 = 82 block elements; this rank keeps about 1/world of them.
    EXPECT_EQ((*shards)->block_elements(), 82);
    EXPECT_LE((*shards)->kept_elements(), 82 / world + 3 * 3);

    const at::Tensor loss = Loss(toy, shards->get(), x);
    EXPECT_TRUE(at::equal(loss, expected_loss));
    for (const auto& block : toy.blocks) EXPECT_EQ(block->weight.numel(), 0);
    loss.backward();
    for (size_t i = 0; i < toy.blocks.size(); ++i) {
      EXPECT_EQ(toy.blocks[i]->weight.numel(), 0) << i;
      EXPECT_TRUE(at::equal(toy.blocks[i]->weight.grad(), reference.blocks[i]->weight.grad())) << i;
      EXPECT_TRUE(at::equal(toy.blocks[i]->bias.grad(), reference.blocks[i]->bias.grad())) << i;
    }
    EXPECT_TRUE(at::equal(toy.head->weight.grad(), reference.head->weight.grad()));
    // Each block gathered for its forward and again for its backward; all but the first of each
    // pass were on the wire while the block before ran.
    EXPECT_EQ((*shards)->gathers(), 6);
    EXPECT_EQ((*shards)->prefetched_gathers(), 4);

    // Without gradients (an evaluation) the blocks are gathered and let go the same way.
    {
      at::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(Loss(toy, shards->get(), x), expected_loss));
    }
    EXPECT_EQ(toy.blocks[2]->weight.numel(), 0);
    EXPECT_EQ((*shards)->prefetched_gathers(), 6);
    EXPECT_TRUE((*shards)->Settle().ok());
  });
}

TEST_P(ParameterShardsTest, WhatThePartsAndTheWholeParametersGetIsWhatTheNextGatherBrings) {
  const int world = GetParam();
  testing::OnRanks(world, [&](DataParallel& group) {
    ShardToy reference;
    ShardToy toy;
    auto made = ParameterShards::Make(&group, Trainable(toy), Blocks(toy), kToyBucketBytes);
    ASSERT_TRUE(made.ok()) << made.status().message();
    ParameterShards& shards = **made;
    // The optimizer updates the parts in place: every rank adds 1 to its own.
    const ShardLayout& layout = *shards.layout();
    {
      at::NoGradGuard no_grad;
      for (const ShardLayout::Part& part : layout.parts) {
        if (layout.buckets[part.bucket].block >= 0) part.view.add_(1);
      }
    }
    ASSERT_TRUE(
        shards
            .WithWholeParameters([&] {
              for (size_t i = 0; i < toy.blocks.size(); ++i) {
                EXPECT_TRUE(at::equal(toy.blocks[i]->weight, reference.blocks[i]->weight + 1)) << i;
                // Nested: still whole, gathered once.
                EXPECT_TRUE(shards.WithWholeParameters([] { return Status::Ok(); }).ok());
                EXPECT_GT(toy.blocks[i]->weight.numel(), 0);
              }
              // A restore writes the whole parameters.
              at::NoGradGuard no_grad;
              toy.blocks[1]->bias.fill_(5);
              return Status::Ok();
            })
            .ok());
    EXPECT_EQ(toy.blocks[1]->bias.numel(), 0);
    ASSERT_TRUE(shards
                    .WithWholeParameters([&] {
                      EXPECT_TRUE(at::equal(toy.blocks[1]->bias, at::full({3}, 5.0)));
                      EXPECT_TRUE(at::equal(toy.blocks[0]->bias, reference.blocks[0]->bias + 1));
                      return Status::Ok();
                    })
                    .ok());
  });
}

TEST_P(ParameterShardsTest, ABlockRunOutOfOrderDropsThePrefetchAndStillGetsItsOwnWeights) {
  const int world = GetParam();
  testing::OnRanks(world, [&](DataParallel& group) {
    ShardToy reference;
    ShardToy toy;
    auto made = ParameterShards::Make(&group, Trainable(toy), Blocks(toy), kToyBucketBytes);
    ASSERT_TRUE(made.ok()) << made.status().message();
    at::NoGradGuard no_grad;
    const at::Tensor x = Input(group.rank()).narrow(1, 0, 3);
    // Block 2 first (its prefetch of block 3: none), then block 0 (prefetching 1), then block 2
    // again, while block 1's gather is on the wire.
    auto run = [&](ShardToy& t, ParameterShards* shards, size_t i) {
      auto forward = [&t, i](const at::Tensor& in) { return t.blocks[i]->forward(in); };
      return shards != nullptr ? shards->Run(*t.blocks[i], forward, x, false) : forward(x);
    };
    EXPECT_TRUE(at::equal(run(toy, made->get(), 2), run(reference, nullptr, 2)));
    const at::Tensor wide = Input(group.rank());
    auto first = [&](ShardToy& t, ParameterShards* shards) {
      auto forward = [&t](const at::Tensor& in) { return t.blocks[0]->forward(in); };
      return shards != nullptr ? shards->Run(*t.blocks[0], forward, wide, false) : forward(wide);
    };
    EXPECT_TRUE(at::equal(first(toy, made->get()), first(reference, nullptr)));
    EXPECT_TRUE(at::equal(run(toy, made->get(), 2), run(reference, nullptr, 2)));
    EXPECT_EQ((*made)->gathers(), 3);
    EXPECT_EQ((*made)->prefetched_gathers(), 0);
    EXPECT_TRUE((*made)->Settle().ok());
  });
}

TEST_P(ParameterShardsTest, ARunningBlocksWeightsAreViewsOfOneGatherBuffer) {
  const int world = GetParam();
  testing::OnRanks(world, [&](DataParallel& group) {
    ShardToy toy;
    auto made = ParameterShards::Make(&group, Trainable(toy), Blocks(toy), kToyBucketBytes);
    ASSERT_TRUE(made.ok()) << made.status().message();
    at::NoGradGuard no_grad;
    // b0's weight (35 elements) and bias (7) span 5 buckets of 40 bytes: whole, they lie end to
    // end in one buffer, not copied out of the gathered buckets. (Whether the next gather reuses
    // that buffer depends on when Gloo's worker lets go of it.)
    bool ran = false;
    auto forward = [&](const at::Tensor& in) {
      const at::Tensor& weight = toy.blocks[0]->weight;
      const at::Tensor& bias = toy.blocks[0]->bias;
      EXPECT_TRUE(weight.storage().is_alias_of(bias.storage()));
      EXPECT_EQ(static_cast<const float*>(bias.data_ptr()),
                static_cast<const float*>(weight.data_ptr()) + 35);
      ran = true;
      return toy.blocks[0]->forward(in);
    };
    (*made)->Run(*toy.blocks[0], forward, Input(group.rank()), false);
    EXPECT_TRUE(ran);
    EXPECT_EQ(toy.blocks[0]->weight.numel(), 0);
    EXPECT_TRUE((*made)->Settle().ok());
  });
}

TEST_P(ParameterShardsTest, AParameterWithoutElementsKeepsItsShapeAndDtypeThroughARun) {
  const int world = GetParam();
  testing::OnRanks(world, [&](DataParallel& group) {
    struct Block : torch::nn::Module {
      Block() {
        linear = register_module("linear", torch::nn::Linear(2, 2));
        nothing = register_parameter("nothing", at::zeros({0, 3}, at::kBFloat16));
      }
      torch::nn::Linear linear{nullptr};
      at::Tensor nothing;
    } block;
    std::vector<NamedParameter> trainable;
    for (const auto& item : block.named_parameters())
      trainable.push_back({item.key(), item.value()});
    auto made = ParameterShards::Make(&group, trainable, {{"b", &block}}, kToyBucketBytes);
    ASSERT_TRUE(made.ok()) << made.status().message();
    at::NoGradGuard no_grad;
    auto forward = [&](const at::Tensor& in) {
      EXPECT_EQ(block.nothing.scalar_type(), at::kBFloat16);
      EXPECT_EQ(block.nothing.sizes(), (std::vector<int64_t>{0, 3}));
      EXPECT_EQ(block.linear->weight.numel(), 4);
      return block.linear->forward(in);
    };
    (*made)->Run(block, forward, at::ones({1, 2}), false);
    EXPECT_EQ(block.nothing.scalar_type(), at::kBFloat16);
    EXPECT_TRUE((*made)->Settle().ok());
  });
}

TEST(ParameterShardsPoolTest, BlocksOfManySizesLeaveAFewBuffersPooledNotOneEach) {
  testing::OnRanks(2, [&](DataParallel& group) {
    // Eight blocks of widths 2, 3, ..., 9: eight run sizes.
    torch::nn::Module model;
    std::vector<torch::nn::Linear> blocks;
    std::vector<NamedBlock> named;
    for (int64_t width = 2; width < 10; ++width) {
      const std::string name = "b" + std::to_string(width);
      blocks.push_back(model.register_module(name, torch::nn::Linear(width, width)));
      named.push_back({name, blocks.back().get()});
    }
    std::vector<NamedParameter> trainable;
    for (const auto& item : model.named_parameters())
      trainable.push_back({item.key(), item.value()});
    auto made = ParameterShards::Make(&group, trainable, named, kToyBucketBytes);
    ASSERT_TRUE(made.ok()) << made.status().message();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const at::Tensor x = at::ones({1, static_cast<int64_t>(i) + 2});
      auto forward = [&, i](const at::Tensor& in) { return blocks[i]->forward(in); };
      (*made)->Run(*blocks[i], forward, x, false);
    }
    ASSERT_TRUE((*made)->Settle().ok());
    EXPECT_LE((*made)->pooled_buffers(), ParameterShards::kPooledBuffers);
  });
}

TEST(ParameterShardsRefusalTest, AParameterTwoBlocksHoldIsRefusedNamingBoth) {
  testing::OnRanks(2, [&](DataParallel& group) {
    ShardToy toy;
    auto made = ParameterShards::Make(
        &group, Trainable(toy), {{"b0", toy.blocks[0].get()}, {"all", &toy}}, kToyBucketBytes);
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().message(),
              "the model's blocks 'b0' and 'all' both hold 'b0.weight'; shard_level 3 gathers "
              "each parameter with one block");
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ParameterShardsTest, ::testing::Values(2, 3));

}  // namespace
}  // namespace engine
