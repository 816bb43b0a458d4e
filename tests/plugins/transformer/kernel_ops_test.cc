// The decoder with the engine's CPU kernels (causal attention, SwiGLU, RMSNorm) against the same
// decoder on ATen ops (ENGINE_CPU_KERNELS=0): logits and every parameter's gradient, in f32 and
// under bf16 autocast, with grouped heads, a sliding window and gradient checkpointing; and the
// paths the kernels leave to ATen (padding masks, the KV cache) still agree.
#include "kernel_ops.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "attention_mask.h"
#include "engine/precision_context.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "llama_config.h"
#include "llama_modules.h"
#include "rotary.h"

namespace engine::transformer {
namespace {

LlamaConfig Small(int64_t window) {
  LlamaConfig c;
  c.vocab_size = 67;
  c.hidden_size = 64;
  c.intermediate_size = 92;  // not a multiple of 8
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 128;
  c.sliding_window = window;
  c.sliding_layers = {true, false};  // one layer slides, one sees everything
  return c;
}

class KernelOpsLm : public torch::nn::Module {
 public:
  explicit KernelOpsLm(const LlamaConfig& c) : lm(*this, c) { InitializeWeights(*this, 0.2); }
  CausalLm lm;
};

struct TrainingRun {
  at::Tensor logits;
  std::map<std::string, at::Tensor> grads;
};

// Logits and gradients of the mean next-token loss, with the kernels on or off.
TrainingRun Train(KernelOpsLm& model, const at::Tensor& ids, const DecoderInputs& inputs,
                  bool kernels, const PrecisionContext& precision, bool checkpointing = false) {
  if (kernels) {
    unsetenv(engine::kernels::kCpuKernelsVariable);
  } else {
    setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
  }
  model.zero_grad();
  TrainingRun run;
  {
    auto scope = precision.Enter();
    const at::Tensor embeds = model.lm.model->Embed(ids);
    run.logits = model.lm.Logits(model.lm.model->Forward(embeds, inputs, nullptr, checkpointing));
  }
  const at::Tensor loss = at::cross_entropy_loss(
      run.logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, run.logits.size(-1)}).to(at::kFloat),
      ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
  loss.backward();
  for (const auto& p : model.named_parameters()) run.grads[p.key()] = p.value().grad().clone();
  unsetenv(engine::kernels::kCpuKernelsVariable);
  return run;
}

void ExpectRunsAgree(const TrainingRun& got, const TrainingRun& want, double tolerance,
                     const std::string& what) {
  const auto relative = [](const at::Tensor& a, const at::Tensor& b) {
    return ((a.to(at::kDouble) - b.to(at::kDouble)).abs().max() /
            b.to(at::kDouble).abs().max().clamp_min(1e-12))
        .item<double>();
  };
  EXPECT_LE(relative(got.logits, want.logits), tolerance) << what << ": logits";
  for (const auto& [name, grad] : want.grads) {
    EXPECT_LE(relative(got.grads.at(name), grad), tolerance) << what << ": " << name;
  }
}

TEST(KernelOpsTest, DecoderEqualsTheAtenPathInF32) {
  for (int64_t window : {0, 9}) {
    at::manual_seed(4);
    KernelOpsLm model(Small(window));
    const at::Tensor ids = at::randint(0, 67, {3, 37}, at::kLong);
    const PrecisionContext f32 = PrecisionContext::None();
    const TrainingRun aten = Train(model, ids, {}, false, f32);
    const TrainingRun kernels = Train(model, ids, {}, true, f32);
    // The kernels ran: their sums go in another order, so the values are not bit-identical.
    EXPECT_FALSE(at::equal(kernels.logits, aten.logits));
    // fp32: the same arithmetic to rounding (1e-5 of each tensor's largest value).
    ExpectRunsAgree(kernels, aten, 1e-5, "window " + std::to_string(window));
    const TrainingRun checkpointed = Train(model, ids, {}, true, f32, /*checkpointing=*/true);
    ExpectRunsAgree(checkpointed, kernels, 1e-6, "checkpointed, window " + std::to_string(window));
  }
}

TEST(KernelOpsTest, DecoderUnderBf16AutocastStaysWithinBf16OfTheAtenPath) {
  at::manual_seed(6);
  KernelOpsLm model(Small(0));
  const at::Tensor ids = at::randint(0, 67, {2, 45}, at::kLong);
  const PrecisionContext bf16 = PrecisionContext::Autocast(c10::DeviceType::CPU, at::kBFloat16);
  const TrainingRun aten = Train(model, ids, {}, false, bf16);
  const TrainingRun kernels = Train(model, ids, {}, true, bf16);
  EXPECT_EQ(kernels.logits.scalar_type(), aten.logits.scalar_type());
  // The ATen path rounds to bf16 after each op, the kernels once per op: a few bf16 steps apart.
  ExpectRunsAgree(kernels, aten, 0.05, "bf16 autocast");
  // Both are within bf16 of the f32 model.
  const TrainingRun f32 = Train(model, ids, {}, true, PrecisionContext::None());
  ExpectRunsAgree(kernels, f32, 0.05, "bf16 kernels against f32");
}

TEST(KernelOpsTest, PaddedAndPackedRowsEqualTheAtenPathAndTheCacheKeepsIt) {
  at::manual_seed(8);
  KernelOpsLm model(Small(0));
  const at::Tensor ids = at::randint(0, 67, {2, 6}, at::kLong);
  const PrecisionContext f32 = PrecisionContext::None();
  // Left padding (the first two queries of row 0 see nothing), then packed examples with trailing
  // padding.
  for (const std::vector<int64_t>& mask :
       {std::vector<int64_t>{0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        std::vector<int64_t>{1, 1, 2, 2, 2, 0, 1, 1, 1, 2, 2, 2}}) {
    DecoderInputs inputs;
    inputs.attention_mask = at::tensor(mask, at::kLong).view({2, 6});
    const TrainingRun kernels = Train(model, ids, inputs, true, f32);
    // Against the math path: the loss here covers the padding queries, which see no key, and
    // LibTorch 2.11's CPU scaled_dot_product_attention gets their gradients wrong (its backward
    // recomputes the softmax from a log-sum-exp that the lowest-value bias swallows: every weight
    // comes back 1, not 1/keys). Training never puts loss on padding, so there those rows carry
    // no gradient; FusedAttentionEqualsTheMathPath checks the fused path where rows see keys.
    setenv("ENGINE_ATTENTION", "math", 1);
    const TrainingRun aten = Train(model, ids, inputs, false, f32);
    unsetenv("ENGINE_ATTENTION");
    EXPECT_FALSE(at::equal(kernels.logits, aten.logits));  // the kernel ran
    ExpectRunsAgree(kernels, aten, 1e-5, "mask " + std::to_string(mask[0]));
  }
  // Generation: the prompt through the kernel, later tokens through the cache, equal to the
  // uncached full forwards.
  at::NoGradGuard no_grad;
  const at::Tensor prompt = model.lm.model->Embed(ids);
  const at::Tensor with_cache = model.lm.Generate(prompt, 5, -1, /*use_cache=*/true);
  const at::Tensor without = model.lm.Generate(prompt, 5, -1, /*use_cache=*/false);
  EXPECT_TRUE(at::equal(with_cache, without));
}

TEST(KernelOpsTest, KeyRangesOnlyWhereEveryQuerySeesOneRun) {
  const at::Tensor packed = BuildAttentionMask(
      at::tensor(std::vector<int64_t>{1, 1, 2, 2, 0}, at::kLong).view({1, 5}), 5, 0, 0, at::kCPU);
  const at::Tensor ranges = KeyRanges(packed, 1);
  ASSERT_TRUE(ranges.defined());
  // The padding query at the end sees every real key before it.
  EXPECT_TRUE(at::equal(ranges.flatten(),
                        at::tensor(std::vector<int32_t>{0, 1, 0, 2, 2, 3, 2, 4, 0, 4}, at::kInt)));
  // A hole inside a row (padding between real tokens): no range says it, so no ranges.
  const at::Tensor holed = BuildAttentionMask(
      at::tensor(std::vector<int64_t>{1, 0, 1, 1}, at::kLong).view({1, 4}), 4, 0, 0, at::kCPU);
  EXPECT_FALSE(KeyRanges(holed, 1).defined());
}

// The unpacked form (projections one by one, as with adapters or quantized weights): the kernel
// rotates q and k itself, and their gradients are those of the unrotated projections.
TEST(KernelOpsTest, SeparateProjectionsWithRotaryEqualRotaryThenMathAttention) {
  at::manual_seed(10);
  LlamaConfig config = Small(0);
  const int64_t batch = 2, positions = 11, d = config.head_dim();
  const auto heads = [&](int64_t count) {
    return at::randn({batch, positions, count, d}).transpose(1, 2).requires_grad_();
  };
  const at::Tensor q = heads(4), k = heads(2), v = heads(2);
  const RotaryTables rotary = BuildRotaryTables(
      config, at::arange(positions, at::kLong).unsqueeze(0).expand({batch, positions}), at::kFloat);
  const at::Tensor got = KernelCausalAttention(q, k, v, 0.125, 0, &rotary);
  const at::Tensor grad = at::randn_like(got);
  const auto got_grads = torch::autograd::grad({got}, {q, k, v}, {grad});

  const at::Tensor kr = ApplyRotary(k, rotary).repeat_interleave(2, 1);
  const at::Tensor scores = at::matmul(ApplyRotary(q, rotary), kr.transpose(2, 3)) * 0.125;
  const at::Tensor mask = at::ones({positions, positions}, at::kBool).triu(1);
  const at::Tensor want =
      at::matmul(at::softmax(scores.masked_fill(mask, -INFINITY), -1), v.repeat_interleave(2, 1));
  const auto want_grads = torch::autograd::grad({want}, {q, k, v}, {grad});
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(got_grads[i], want_grads[i], 1e-5, 1e-5)) << "input " << i;
  }
}

TEST(KernelOpsTest, SwitchesTurnTheKernelsOff) {
  const at::Tensor q = at::randn({1, 2, 4, 8});
  EXPECT_TRUE(KernelAttentionTakes(q, q, q));
  setenv("ENGINE_ATTENTION", "math", 1);
  EXPECT_FALSE(KernelAttentionTakes(q, q, q));
  unsetenv("ENGINE_ATTENTION");
  setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
  EXPECT_FALSE(KernelAttentionTakes(q, q, q));
  EXPECT_FALSE(KernelSwiGluTakes(q, q));
  EXPECT_FALSE(KernelRmsNormTakes(q, at::ones({8})));
  unsetenv(engine::kernels::kCpuKernelsVariable);
  EXPECT_TRUE(KernelSwiGluTakes(q, q));
  EXPECT_TRUE(KernelRmsNormTakes(q, at::ones({8})));
}

}  // namespace
}  // namespace engine::transformer
