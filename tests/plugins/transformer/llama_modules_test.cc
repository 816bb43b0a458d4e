// The Llama modules: values computed by hand, grouped-query attention, the KV cache, gradient
// checkpointing, and config.json parsing.
#include "llama_modules.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "engine/precision_context.h"
#include "engine/torch_compat.h"
#include "llama_config.h"

namespace engine::transformer {
namespace {

using ::testing::HasSubstr;

LlamaConfig TinyModulesConfig(int64_t heads = 2, int64_t kv_heads = 1) {
  LlamaConfig c;
  c.vocab_size = 17;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 64;
  return c;
}

class ModulesLm : public torch::nn::Module {
 public:
  explicit ModulesLm(const LlamaConfig& c) : lm(*this, c) { InitializeWeights(*this, 0.3); }
  CausalLm lm;
};

TEST(RmsNormTest, MatchesTheFormula) {
  RmsNorm norm(2, 0.0);
  norm->weight.data().copy_(at::tensor({2.0f, 0.5f}));
  const at::Tensor out = norm->forward(at::tensor({3.0f, 4.0f}).view({1, 2}));
  const double rms = std::sqrt((9.0 + 16.0) / 2);
  EXPECT_NEAR(out[0][0].item<double>(), 2 * 3 / rms, 1e-6);
  EXPECT_NEAR(out[0][1].item<double>(), 0.5 * 4 / rms, 1e-6);
}

// One head of size 4, identity projections: position 0 attends only to itself; position 1 mixes
// the two values with the softmax of rotated-query . rotated-key / 2.
TEST(LlamaAttentionTest, HandComputedTwoPositions) {
  LlamaConfig c = TinyModulesConfig(1, 1);
  c.hidden_size = 4;
  LlamaAttention attention(c);
  at::NoGradGuard no_grad;
  for (auto* p : {&attention->q_proj, &attention->k_proj, &attention->v_proj, &attention->o_proj}) {
    (*p)->weight.copy_(at::eye(4));
  }
  const double x[2][4] = {{1, 0, 0.5, 0}, {0, 1, 0, 2}};
  const at::Tensor input =
      at::tensor({1.0f, 0.0f, 0.5f, 0.0f, 0.0f, 1.0f, 0.0f, 2.0f}).view({1, 2, 4});
  const at::Tensor out = attention->forward(input, 0, nullptr);

  // Rotary at position p: pairs (i, i + 2) rotate by p * theta^(-2i/4), i.e. angles p and p/100.
  auto rotate = [](const double* v, double p, double* r) {
    const double angle[2] = {p, p / 100.0};
    for (int i = 0; i < 2; ++i) {
      r[i] = v[i] * std::cos(angle[i]) - v[i + 2] * std::sin(angle[i]);
      r[i + 2] = v[i + 2] * std::cos(angle[i]) + v[i] * std::sin(angle[i]);
    }
  };
  double q1[4], k0[4], k1[4];
  rotate(x[1], 1, q1);
  rotate(x[0], 0, k0);
  rotate(x[1], 1, k1);
  double s0 = 0, s1 = 0;
  for (int i = 0; i < 4; ++i) {
    s0 += q1[i] * k0[i] / 2;
    s1 += q1[i] * k1[i] / 2;
  }
  const double w0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(out[0][0][i].item<double>(), x[0][i], 1e-6) << i;
    EXPECT_NEAR(out[0][1][i].item<double>(), w0 * x[0][i] + (1 - w0) * x[1][i], 1e-6) << i;
  }
}

TEST(LlamaAttentionTest, GroupedQueryEqualsRepeatedKeyValueHeads) {
  at::manual_seed(3);
  LlamaAttention grouped(TinyModulesConfig(4, 2));
  LlamaAttention full(TinyModulesConfig(4, 4));
  at::NoGradGuard no_grad;
  full->q_proj->weight.copy_(grouped->q_proj->weight);
  full->o_proj->weight.copy_(grouped->o_proj->weight);
  // kv head j serves query heads 2j and 2j + 1: repeat each kv head's rows.
  const int64_t d = 2;
  for (auto [g, f] : {std::pair{grouped->k_proj, full->k_proj}, {grouped->v_proj, full->v_proj}}) {
    for (int64_t head = 0; head < 4; ++head) {
      f->weight.narrow(0, head * d, d).copy_(g->weight.narrow(0, (head / 2) * d, d));
    }
  }
  const at::Tensor x = at::randn({2, 5, 8});
  EXPECT_TRUE(
      at::allclose(grouped->forward(x, 0, nullptr), full->forward(x, 0, nullptr), 1e-5, 1e-6));
}

TEST(LlamaDecoderTest, ShapesDtypesAndHuggingFaceNames) {
  ModulesLm model(TinyModulesConfig());
  const at::Tensor ids = at::randint(0, 17, {3, 6}, at::kLong);
  const at::Tensor hidden = model.lm.model->forward(model.lm.model->Embed(ids), 0, nullptr);
  EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{3, 6, 8}));
  const at::Tensor logits = model.lm.Logits(hidden);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 6, 17}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  std::vector<std::string> names;
  for (const auto& p : model.named_parameters()) names.push_back(p.key());
  EXPECT_THAT(
      names, ::testing::ElementsAre(
                 "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                 "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                 "model.layers.0.post_attention_layernorm.weight",
                 "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                 "model.layers.0.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
                 "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                 "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                 "model.layers.1.post_attention_layernorm.weight",
                 "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
                 "model.layers.1.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"));
  EXPECT_EQ(model.named_parameters()["model.layers.0.self_attn.k_proj.weight"].sizes(),
            (std::vector<int64_t>{4, 8}));  // one kv head of size 4

  LlamaConfig tied = TinyModulesConfig();
  tied.tie_word_embeddings = true;
  ModulesLm tied_model(tied);
  EXPECT_EQ(tied_model.named_parameters().find("lm_head.weight"), nullptr);
  const at::Tensor h = at::randn({1, 2, 8});
  EXPECT_TRUE(at::equal(tied_model.lm.Logits(h),
                        at::matmul(h, tied_model.lm.model->embed_tokens->weight.t())));
}

// The decoder's hidden states for `embeds` with the math path or LibTorch's fused attention.
at::Tensor Hidden(ModulesLm& model, const at::Tensor& embeds, const DecoderInputs& inputs,
                  bool fused) {
  if (fused) {
    unsetenv("ENGINE_ATTENTION");
  } else {
    setenv("ENGINE_ATTENTION", "math", 1);
  }
  at::Tensor hidden = model.lm.model->Forward(embeds, inputs, nullptr);
  unsetenv("ENGINE_ATTENTION");
  return hidden;
}

// Causal rows (the kernel's own mask), then left-padded and packed rows (a bias), with and without
// a sliding window: the fused attention's hidden states against the math path's, on `device` in
// `dtype`, within `tolerance`; 4 heads of hidden_size / 4.
void ExpectFusedAttentionEqualsTheMathPath(at::Device device, c10::ScalarType dtype,
                                           double tolerance, int64_t hidden_size = 8) {
  at::NoGradGuard no_grad;
  for (int64_t window : {0, 3}) {
    LlamaConfig config = TinyModulesConfig(4, 2);
    config.hidden_size = hidden_size;
    config.sliding_window = window;
    ModulesLm model(config);
    model.to(device, dtype);
    const at::Tensor embeds =
        model.lm.model->Embed(at::randint(0, 17, {2, 6}, at::kLong).to(device));
    DecoderInputs causal;
    DecoderInputs padded;
    padded.attention_mask =
        at::tensor(std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 0}, at::kLong)
            .view({2, 6})
            .to(device);
    for (const DecoderInputs& inputs : {causal, padded}) {
      const at::Tensor math = Hidden(model, embeds, inputs, false).to(at::kFloat);
      const at::Tensor fused = Hidden(model, embeds, inputs, true).to(at::kFloat);
      EXPECT_TRUE(at::allclose(fused, math, tolerance, tolerance))
          << device << " " << dtype << ", window " << window << ", max difference "
          << (fused - math).abs().max().item<float>();
    }
  }
}

TEST(LlamaAttentionTest, FusedAttentionEqualsTheMathPath) {
  if (!compat::HasScaledDotProductAttention()) {
    GTEST_SKIP() << "LibTorch " << compat::kTorchVersion
                 << " has no scaled_dot_product_attention: the math path is the only one";
  }
  // fp32: the kernels sum in another order.
  ExpectFusedAttentionEqualsTheMathPath(at::kCPU, at::kFloat, 1e-5);
}

TEST(LlamaAttentionTest, FusedAttentionOnAGpuEqualsTheMathPath) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  // LibTorch's flash and memory-efficient kernels, on heads of 16 (they take no heads of 2, which
  // would leave every case to SDPA's own math backend). fp32 sums in another order: 1e-5 as on
  // the CPU (4e-6 measured there at this width), with room for the GPU's fused multiply-adds.
  // bf16 rounds at other points than the math path (the scores, the softmax), and every later
  // module computes in bf16 from there: at this width the CPU's fused bf16 kernels differ from the
  // math path by up to 0.13 (1 + |h|), |h| up to 3.5, about nine bf16 steps. 1/4 catches an
  // attention that reads the wrong keys (off by about |h|), which is what this case is for.
  ExpectFusedAttentionEqualsTheMathPath(at::kCUDA, at::kFloat, 1e-4, 64);
  ExpectFusedAttentionEqualsTheMathPath(at::kCUDA, at::kBFloat16, 1.0 / 4, 64);
}

TEST(LlamaDecoderTest, CacheStepsEqualTheFullForward) {
  at::manual_seed(5);
  ModulesLm model(TinyModulesConfig());
  at::NoGradGuard no_grad;
  const at::Tensor embeds = model.lm.model->Embed(at::randint(0, 17, {2, 7}, at::kLong));
  const at::Tensor full = model.lm.model->forward(embeds, 0, nullptr);
  KvCache cache;
  const at::Tensor first = model.lm.model->forward(embeds.narrow(1, 0, 4), 0, &cache);
  ASSERT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache[0].key.size(2), 4);
  std::vector<at::Tensor> parts = {first};
  for (int64_t t = 4; t < 7; ++t) {
    parts.push_back(model.lm.model->forward(embeds.narrow(1, t, 1), t, &cache));
  }
  const at::Tensor stepped = at::cat(parts, 1);
  // A step attends with one query, through other matmul shapes than the full forward: f32 sums in
  // another order. Measured up to 1.6e-6 where |h| reaches 2.6 (several ulps), and the vector
  // width LibTorch picks for the CPU changes it; CI once saw more than 1e-6 on a value near zero.
  // A cache that holds a wrong key or position is off by about |h|.
  EXPECT_TRUE(at::allclose(stepped, full, 1e-5, 1e-5))
      << "max difference " << (stepped - full).abs().max().item<float>() << ", max |h| "
      << full.abs().max().item<float>();
}

// Greedy generation with the KV cache equals generation by full forwards, and eos handling.
void CheckGenerationAgrees() {
  ModulesLm model(TinyModulesConfig());
  const at::Tensor prefix = model.lm.model->Embed(at::randint(0, 17, {4, 3}, at::kLong)).detach();
  const at::Tensor cached = model.lm.Generate(prefix, 9, /*eos_id=*/-1, /*use_cache=*/true);
  const at::Tensor plain = model.lm.Generate(prefix, 9, -1, /*use_cache=*/false);
  EXPECT_EQ(cached.sizes(), (std::vector<int64_t>{4, 9}));
  EXPECT_TRUE(at::equal(cached, plain)) << cached << plain;

  // With an eos id, a row follows the free generation up to its first eos and repeats eos after
  // it; generation ends early only once every row has finished. Which tokens the random model
  // picks differs between CPUs, so the expectations are derived from `cached`, not assumed.
  const int64_t eos = cached[0][1].item<int64_t>();
  const at::Tensor stopped = model.lm.Generate(prefix, 9, eos, true);
  int64_t last_first_eos = 0;
  bool every_row_finishes = true;
  std::vector<int64_t> first_eos(4, -1);
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t i = 0; i < 9 && first_eos[row] < 0; ++i) {
      if (cached[row][i].item<int64_t>() == eos) first_eos[row] = i;
    }
    if (first_eos[row] < 0) every_row_finishes = false;
    last_first_eos = std::max(last_first_eos, first_eos[row]);
  }
  ASSERT_GE(first_eos[0], 0);
  ASSERT_LE(first_eos[0], 1);
  EXPECT_EQ(stopped.size(1), every_row_finishes ? last_first_eos + 1 : 9);
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t i = 0; i < stopped.size(1); ++i) {
      const bool after_eos = first_eos[row] >= 0 && i > first_eos[row];
      EXPECT_EQ(stopped[row][i].item<int64_t>(), after_eos ? eos : cached[row][i].item<int64_t>())
          << "row " << row << " position " << i;
    }
  }
}

TEST(LlamaDecoderTest, GenerationWithAndWithoutTheCacheAgrees) {
  for (uint64_t seed = 0; seed < 8; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    at::manual_seed(seed);
    CheckGenerationAgrees();
  }
}

// Gradients with per-block checkpointing equal the plain backward, in f32 and under bf16 autocast,
// biases included (Qwen2's q/k/v biases, which autocast casts and caches).
TEST(LlamaDecoderTest, GradientCheckpointingGivesTheSameGradients) {
  LlamaConfig with_biases = TinyModulesConfig();
  with_biases.qkv_bias = with_biases.o_bias = with_biases.mlp_bias = true;
  for (auto [bf16, config] :
       {std::pair{false, TinyModulesConfig()}, std::pair{true, TinyModulesConfig()},
        std::pair{false, with_biases}, std::pair{true, with_biases}}) {
    ModulesLm model(config);
    const at::Tensor ids = at::randint(0, 17, {2, 6}, at::kLong);
    auto gradients = [&](bool checkpointing) {
      model.zero_grad();
      auto scope = bf16 ? PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16).Enter()
                        : PrecisionContext::None().Enter();
      const at::Tensor hidden =
          model.lm.model->forward(model.lm.model->Embed(ids), 0, nullptr, checkpointing);
      model.lm.Logits(hidden).to(at::kFloat).pow(2).mean().backward();
      std::vector<at::Tensor> grads;
      for (const auto& p : model.parameters()) grads.push_back(p.grad().clone());
      return grads;
    };
    const auto plain = gradients(false);
    const auto checkpointed = gradients(true);
    ASSERT_EQ(plain.size(), checkpointed.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(at::equal(plain[i], checkpointed[i]))
          << "bf16=" << bf16 << " biases=" << config.qkv_bias << " tensor " << i;
    }
  }
}

TEST(LlamaConfigTest, ReadsAndWritesConfigJson) {
  LlamaConfig c = TinyModulesConfig(4, 2);
  c.rope_theta = 500000;
  c.tie_word_embeddings = true;
  auto back = ConfigFromJson(c.ToJson("bfloat16"), "config.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->num_key_value_heads, 2);
  EXPECT_EQ(back->rope_theta, 500000);
  EXPECT_TRUE(back->tie_word_embeddings);
  EXPECT_EQ(c.ToJson("bfloat16")["torch_dtype"], "bfloat16");
  EXPECT_EQ(c.ToJson("bfloat16")["architectures"][0], "LlamaForCausalLM");
}

TEST(LlamaConfigTest, BadConfigJsonNamesTheKey) {
  auto json = TinyModulesConfig().ToJson("float32");
  json.erase("hidden_size");
  auto missing = ConfigFromJson(json, "'m/config.json'");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("'m/config.json': 'hidden_size' is missing"));

  json = TinyModulesConfig().ToJson("float32");
  json["num_attention_heads"] = "four";
  EXPECT_THAT(ConfigFromJson(json, "c").status().message(),
              HasSubstr("'num_attention_heads' must be a positive integer, not \"four\""));

  json = TinyModulesConfig().ToJson("float32");
  json["num_attention_heads"] = 3;
  EXPECT_THAT(ConfigFromJson(json, "c").status().message(),
              HasSubstr("hidden_size 8 is not a multiple of num_attention_heads 3"));

  json = TinyModulesConfig().ToJson("float32");
  json["model_type"] = "bert";
  EXPECT_THAT(ConfigFromJson(json, "c").status().message(), HasSubstr("model_type is 'bert'"));

  json = TinyModulesConfig().ToJson("float32");
  json["num_hidden_layers"] = 100000;
  EXPECT_THAT(ConfigFromJson(json, "c").status().message(),
              HasSubstr("num_hidden_layers 100000 is above the largest"));
}

}  // namespace
}  // namespace engine::transformer
