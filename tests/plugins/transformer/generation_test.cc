// Generating from left-padded prompts: every row continues as it would alone, the stop ids end
// rows, sampling follows its seed, and prompts beyond the model's positions are refused.
#include "generation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

class GenerationLm : public torch::nn::Module {
 public:
  explicit GenerationLm(const LlamaConfig& c) : lm(*this, c) { InitializeWeights(*this, 0.5); }
  CausalLm lm;
};

LlamaConfig TinyGenerationConfig() {
  LlamaConfig c;
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 32;
  return c;
}

TEST(GenerationTest, LeftPaddedRowsContinueAsTheyWouldAlone) {
  at::manual_seed(3);
  GenerationLm m(TinyGenerationConfig());
  m.eval();
  const std::vector<std::vector<int64_t>> prompts = {{3, 9, 4, 1, 7}, {5, 2}, {8, 8, 6}};
  at::Tensor ids = at::zeros({3, 5}, at::kLong), mask = at::zeros({3, 5}, at::kLong);
  for (size_t r = 0; r < prompts.size(); ++r) {
    const int64_t n = static_cast<int64_t>(prompts[r].size());
    ids[r].narrow(0, 5 - n, n).copy_(at::tensor(prompts[r], at::kLong));
    mask[r].narrow(0, 5 - n, n).fill_(1);
  }
  GenerationOptions greedy;
  greedy.max_new_tokens = 6;
  auto batch = GenerateText(m.lm, ids, mask, greedy);
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  ASSERT_EQ(batch->sizes(), (std::vector<int64_t>{3, 6}));
  for (size_t r = 0; r < prompts.size(); ++r) {
    const at::Tensor row = at::tensor(prompts[r], at::kLong).view({1, -1});
    auto alone = GenerateText(m.lm, row, at::ones_like(row), greedy);
    ASSERT_TRUE(alone.ok());
    EXPECT_TRUE(at::equal((*batch)[r], (*alone)[0])) << "row " << r;
    // The cache-free greedy decoding of the whole sequence agrees.
    const at::Tensor plain = m.lm.Generate(m.lm.model->Embed(row), 6, -1, /*use_cache=*/false);
    EXPECT_TRUE(at::equal(plain[0], (*alone)[0])) << "row " << r;
  }
}

TEST(GenerationTest, StopIdsEndRowsAndSamplingFollowsItsSeed) {
  at::manual_seed(4);
  GenerationLm m(TinyGenerationConfig());
  m.eval();
  const at::Tensor ids = at::tensor({1, 2, 3}, at::kLong).view({1, -1});
  GenerationOptions sampled;
  sampled.max_new_tokens = 12;
  sampled.temperature = 1.5;
  sampled.top_k = 10;
  sampled.top_p = 0.95;
  sampled.seed = 7;
  auto a = GenerateText(m.lm, ids, at::ones_like(ids), sampled);
  auto b = GenerateText(m.lm, ids, at::ones_like(ids), sampled);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(at::equal(*a, *b)) << "the same seed draws the same tokens";
  sampled.seed = 8;
  auto c = GenerateText(m.lm, ids, at::ones_like(ids), sampled);
  EXPECT_FALSE(at::equal(*a, *c)) << "another seed draws others";

  GenerationOptions stopping;
  stopping.max_new_tokens = 12;
  stopping.stop_ids = {(*a)[0][2].item<int64_t>()};
  sampled.seed = 7;
  stopping.temperature = sampled.temperature;
  stopping.top_k = sampled.top_k;
  stopping.top_p = sampled.top_p;
  stopping.seed = 7;
  auto stopped = GenerateText(m.lm, ids, at::ones_like(ids), stopping);
  ASSERT_TRUE(stopped.ok());
  const int64_t first_stop = (*a)[0].eq(stopping.stop_ids[0]).nonzero().min().item<int64_t>();
  EXPECT_EQ(stopped->size(1), first_stop + 1);
}

TEST(GenerationTest, TopKOneIsGreedyAndLongPromptsAreRefused) {
  const at::Tensor logits = at::tensor({0.1f, 2.0f, -1.0f, 1.9f}).view({1, 4});
  GenerationOptions one;
  one.temperature = 5;
  one.top_k = 1;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(SampleNextTokens(logits, one, generator).item<int64_t>(), 1);
  }
  GenerationOptions nucleus;
  nucleus.temperature = 1;
  nucleus.top_p = 0.3;  // the most likely token alone holds more than 0.3
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(SampleNextTokens(logits, nucleus, generator).item<int64_t>(), 1);
  }

  GenerationLm m(TinyGenerationConfig());
  const at::Tensor ids = at::ones({1, 30}, at::kLong);
  GenerationOptions options;
  options.max_new_tokens = 5;
  EXPECT_THAT(GenerateText(m.lm, ids, at::ones_like(ids), options).status().message(),
              HasSubstr("the prompt is 30 tokens and 5 new ones were asked for, beyond the "
                        "model's 32 positions"));
}

}  // namespace
}  // namespace engine::transformer
