// The `nf4` and `int8` quantizers and the `lora` adapter on engine::Linear layers: the quantized
// matmul and its backward, compute dtypes, LoRA's identity at initialisation, merge and unmerge,
// and option errors.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "engine/adapter.h"
#include "engine/few_rows_matmul.h"
#include "engine/linear.h"
#include "engine/quantizer.h"
#include "engine/torch_compat.h"
#include "engine_kernels/cpu_kernels_switch.h"
#include "plugins/plugin_test_util.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

const QuantizerPlugin& Quantizer(const std::string& name) {
  return testing::BuiltinPlugin<QuantizerPlugin>(PluginKind::kQuantizer, name);
}
const AdapterPlugin& Lora() {
  return testing::BuiltinPlugin<AdapterPlugin>(PluginKind::kAdapter, "lora");
}

std::shared_ptr<QuantizedWeight> QuantizeWith(const std::string& plugin, const std::string& options,
                                              const at::Tensor& weight) {
  const auto& q = Quantizer(plugin);
  auto result = q.Quantize(*testing::Options(q, options), weight);
  EXPECT_TRUE(result.ok()) << result.status().message();
  return result.ok() ? *result : nullptr;
}

std::vector<std::string> ValidationErrors(const Plugin& plugin, const std::string& options) {
  OptionErrors errors;
  plugin.ValidateOptions(*testing::Options(plugin, options), &errors);
  std::vector<std::string> out;
  for (const auto& e : errors.entries()) out.push_back(e.field_path + ": " + e.message);
  return out;
}

TEST(QuantizedLinearTest, Nf4MatmulEqualsDequantizeThenMatmul) {
  at::manual_seed(1);
  // 1,024 x 512 f32 is 2 MB dense: more than one dequantized tile.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{24, 64}, {1024, 512}}) {
    Linear layer(cols, rows, /*with_bias=*/true);
    const at::Tensor dense = layer->weight.detach().clone();
    ASSERT_TRUE(
        layer->Quantize(QuantizeWith("nf4", "compute_dtype: FP32", layer->weight.detach())).ok());
    EXPECT_FALSE(layer->weight.defined());
    EXPECT_EQ(layer->named_parameters().size(), 1u);  // the bias alone
    EXPECT_EQ(layer->named_buffers()["weight"].scalar_type(), at::kByte);
    const at::Tensor x = at::randn({3, 5, cols});
    const at::Tensor dequantized = layer->DenseWeight(at::kFloat);
    const at::Tensor expected = at::linear(x, dequantized, layer->bias);
    EXPECT_TRUE(at::allclose(layer->forward(x), expected, 1e-5, 1e-5)) << rows;
    // The 4-bit weight is close to the dense one it came from.
    EXPECT_LT((dequantized - dense).abs().max().item<float>(),
              dense.abs().max().item<float>() * 0.16f);
  }
}

TEST(QuantizedLinearTest, BackwardGivesTheInputGradientAndNoWeightGradient) {
  at::manual_seed(2);
  Linear layer(64, 32, /*with_bias=*/false);
  ASSERT_TRUE(
      layer->Quantize(QuantizeWith("nf4", "compute_dtype: FP32", layer->weight.detach())).ok());
  const at::Tensor x = at::randn({4, 64}).requires_grad_();
  const at::Tensor upstream = at::randn({4, 32});
  (layer->forward(x) * upstream).sum().backward();
  const at::Tensor w = layer->DenseWeight(at::kFloat);
  EXPECT_TRUE(at::allclose(x.grad(), at::matmul(upstream, w), 1e-5, 1e-5));
  for (const auto& b : layer->named_buffers()) {
    EXPECT_FALSE(b.value().requires_grad()) << b.key();
    EXPECT_FALSE(b.value().grad().defined()) << b.key();
  }
}

TEST(QuantizedLinearTest, ComputeDtypeIsTheDeclaredOneWhateverTheInput) {
  at::manual_seed(3);
  Linear layer(64, 16, false);
  const at::Tensor original = layer->weight.detach().clone();
  ASSERT_TRUE(layer->Quantize(QuantizeWith("nf4", "compute_dtype: FP32", original)).ok());
  const at::Tensor x = at::randn({2, 64});
  const at::Tensor reference = at::matmul(x, layer->DenseWeight(at::kFloat).t());
  {
    // Under bf16 autocast a plain matmul would run in bf16; the f32 compute dtype holds.
    engine::compat::SetAutocastEnabled(at::kCPU, true);
    engine::compat::SetAutocastDtype(at::kCPU, at::kBFloat16);
    const at::Tensor y = layer->forward(x);
    engine::compat::SetAutocastEnabled(at::kCPU, false);
    engine::compat::ClearAutocastCache();
    EXPECT_EQ(y.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(y, reference, 1e-5, 1e-5));
  }
  // A bf16 compute dtype rounds like bf16, and the output keeps the input's dtype.
  Linear bf16(64, 16, false);
  ASSERT_TRUE(bf16->Quantize(QuantizeWith("nf4", "compute_dtype: BF16", original)).ok());
  const at::Tensor y = bf16->forward(x);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_FALSE(at::equal(y, reference));
  EXPECT_TRUE(at::allclose(y, reference, 5e-2, 5e-2));
}

// Under autocast a 4-bit layer's output (its bias included) stays in the autocast dtype, as a dense
// layer's does, so the activations after it are bf16 too: a QLoRA forward in bf16-mixed used to
// cast them back to f32, 1.6x the time of a LoRA one. The values are the dense bf16 product's, and
// the input gradient comes back in the input's dtype. Outside autocast nothing changes.
TEST(QuantizedLinearTest, UnderAutocastTheOutputStaysInTheAutocastDtypeAsADenseLayersDoes) {
  at::manual_seed(9);
  Linear dense(128, 48, /*with_bias=*/true);
  Linear quantized(128, 48, /*with_bias=*/true);
  ASSERT_TRUE(quantized->Quantize(QuantizeWith("nf4", "", dense->weight.detach())).ok());
  {
    at::NoGradGuard no_grad;
    quantized->bias.copy_(dense->bias);
    dense->weight.copy_(quantized->DenseWeight(at::kFloat));  // the same weight, dequantized
  }
  const at::Tensor x = at::randn({40, 128}).requires_grad_();
  compat::SetAutocastEnabled(at::kCPU, true);
  compat::SetAutocastDtype(at::kCPU, at::kBFloat16);
  const at::Tensor from_dense = dense->forward(x);
  const at::Tensor from_codes = quantized->forward(x);
  compat::SetAutocastEnabled(at::kCPU, false);
  compat::ClearAutocastCache();
  EXPECT_EQ(from_dense.scalar_type(), at::kBFloat16);
  EXPECT_EQ(from_codes.scalar_type(), at::kBFloat16);
  // Both are bf16 products of the same bf16 operands; they differ by the summation order's
  // rounding at most (a few bf16 steps of values up to ~4).
  EXPECT_TRUE(at::allclose(from_codes.to(at::kFloat), from_dense.to(at::kFloat), 0.02, 0.05));
  from_codes.to(at::kFloat).sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(quantized->forward(x).scalar_type(), at::kFloat) << "no autocast: the input's dtype";
}

// What the engine sets for a stage whose quantizer leaves compute_dtype open: the layer's dtype
// wins over the weight's declared bf16, forward and backward, on the tiled and the few-rows paths.
TEST(QuantizedLinearTest, TheLayerComputeDtypeOverridesTheDeclaredOne) {
  at::manual_seed(5);
  for (const int64_t tokens : {3, 40}) {  // few rows straight from the codes; tiles
    Linear layer(256, 96, /*with_bias=*/false);
    ASSERT_TRUE(layer->Quantize(QuantizeWith("nf4", "", layer->weight.detach())).ok());
    ASSERT_EQ(layer->quantized()->compute_dtype(), at::kBFloat16);  // nf4's declared default
    const at::Tensor w = layer->DenseWeight(at::kFloat);
    const at::Tensor x = at::randn({tokens, 256}).requires_grad_();
    const at::Tensor upstream = at::randn({tokens, 96});
    const at::Tensor in_bf16 = layer->forward(x).detach();
    layer->SetQuantizedComputeDtype(at::kFloat);
    EXPECT_EQ(layer->quantized_compute_dtype(), at::kFloat);
    const at::Tensor y = layer->forward(x);
    (y * upstream).sum().backward();
    // f32 products agree with the dequantized weight to f32 rounding; bf16 ones are ~1e-2 off.
    EXPECT_TRUE(at::allclose(y, at::matmul(x.detach(), w.t()), 1e-5, 1e-5)) << tokens;
    EXPECT_TRUE(at::allclose(x.grad(), at::matmul(upstream, w), 1e-5, 1e-5)) << tokens;
    EXPECT_GT((in_bf16 - y.detach()).abs().max().item<float>(), 1e-3) << tokens;
  }
}

// A generated token (or a few): the nf4 weight multiplies straight from its codes
// (FewRowsMatmul), and gives what the dequantized tiles give. ENGINE_CPU_KERNELS=0 takes the tiles.
TEST(QuantizedLinearTest, FewRowsFromTheCodesEqualTheTiledProduct) {
  at::manual_seed(4);
  for (const std::string compute : {"FP32", "BF16"}) {
    Linear layer(512, 1024, /*with_bias=*/true);  // 1 MB of dense bf16: more than one tile
    ASSERT_TRUE(
        layer->Quantize(QuantizeWith("nf4", "compute_dtype: " + compute, layer->weight.detach()))
            .ok());
    ASSERT_NE(dynamic_cast<const FewRowsMatmul*>(layer->quantized().get()), nullptr);
    const at::Tensor x = at::randn({1, 3, 512});
    const at::Tensor direct = layer->forward(x);
    ::setenv(engine::kernels::kCpuKernelsVariable, "0", 1);
    const at::Tensor tiled = layer->forward(x);
    ::unsetenv(engine::kernels::kCpuKernelsVariable);
    ASSERT_EQ(direct.sizes(), tiled.sizes());
    // f32: the same products summed in another order. bf16: one rounding of the product.
    const double tolerance = compute == "FP32" ? 1e-5 : 1.0 / 128;
    EXPECT_TRUE(at::allclose(direct, tiled, tolerance, tolerance)) << compute;
    if (compute == "FP32") {  // (bf16's rounding hides the order of the sums)
      EXPECT_FALSE(at::equal(direct, tiled)) << "the tiled path ran both times";
    }
  }
}

// On a GPU one row (a generated token) multiplies from the codes (cuda::Nf4MatmulFewRows) and more
// rows take the dequantized bf16 tiles and cuBLAS; both give what the CPU gives.
TEST(QuantizedLinearTest, OneRowOnAGpuFromTheCodesEqualsTheTiledProductAndTheCpu) {
  if (!compat::CudaAvailable()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(4);
  for (const std::string compute : {"FP32", "BF16"}) {
    Linear layer(512, 1024, /*with_bias=*/true);
    ASSERT_TRUE(
        layer->Quantize(QuantizeWith("nf4", "compute_dtype: " + compute, layer->weight.detach()))
            .ok());
    const at::Tensor x = at::randn({1, 512});
    const at::Tensor on_cpu = layer->forward(x);
    layer->to(at::kCUDA);
    // The codes' own product takes the row (a build with the CUDA kernels; the tiles otherwise).
    const auto* direct = dynamic_cast<const FewRowsMatmul*>(layer->quantized().get());
    ASSERT_NE(direct, nullptr);
    EXPECT_TRUE(
        direct->MatmulFewRows(x.to(at::kCUDA), compute == "FP32" ? at::kFloat : at::kBFloat16)
            .defined())
        << compute;
    const at::Tensor one_row = layer->forward(x.to(at::kCUDA)).cpu();
    const at::Tensor two_rows = layer->forward(at::cat({x, x}).to(at::kCUDA)).cpu();
    // f32: the same products summed in another order. bf16: one rounding of the product.
    const double tolerance = compute == "FP32" ? 1e-5 : 1.0 / 128;
    EXPECT_TRUE(at::allclose(one_row, two_rows.narrow(0, 0, 1), tolerance, tolerance)) << compute;
    EXPECT_TRUE(at::allclose(one_row, on_cpu, tolerance, tolerance)) << compute;
  }
}

TEST(QuantizedLinearTest, Int8RowsAreWithinHalfAStep) {
  at::manual_seed(4);
  Linear layer(48, 20, false);
  const at::Tensor dense = layer->weight.detach().clone();
  ASSERT_TRUE(layer->Quantize(QuantizeWith("int8", "compute_dtype: FP32", dense)).ok());
  EXPECT_EQ(layer->named_buffers()["weight"].scalar_type(), at::kChar);
  const at::Tensor step = dense.abs().amax(1, true) / 127;
  EXPECT_TRUE(
      ((layer->DenseWeight(at::kFloat) - dense).abs() <= step * 0.5 + 1e-7).all().item<bool>());
  EXPECT_NEAR(layer->quantized()->bits_per_parameter(), 8 + 32.0 / 48, 1e-9);
  const at::Tensor x = at::randn({3, 48});
  EXPECT_TRUE(at::allclose(layer->forward(x), at::matmul(x, layer->DenseWeight(at::kFloat).t()),
                           1e-5, 1e-5));
}

TEST(LoraTest, InitialisationLeavesTheOutputUnchangedAndOnlyTheAdapterLearns) {
  at::manual_seed(5);
  Linear layer(32, 24, true);
  const at::Tensor x = at::randn({6, 32});
  const at::Tensor before = layer->forward(x).detach();
  for (auto& p : layer->parameters()) p.set_requires_grad(false);
  const auto& lora = Lora();
  auto adapter = lora.Create(*testing::Options(lora, "r: 4 lora_alpha: 8"), {}, {"l", "l"}, *layer);
  ASSERT_TRUE(adapter.ok()) << adapter.status().message();
  ASSERT_TRUE(layer->AddAdapter(*adapter).ok());
  auto params = layer->named_parameters();
  ASSERT_NE(params.find("lora_A.weight"), nullptr);
  EXPECT_EQ(params["lora_A.weight"].sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(params["lora_B.weight"].sizes(), (std::vector<int64_t>{24, 4}));
  EXPECT_TRUE(at::equal(params["lora_B.weight"], at::zeros({24, 4})));
  EXPECT_TRUE(at::equal(layer->forward(x), before));

  layer->forward(x).pow(2).sum().backward();
  EXPECT_FALSE(layer->weight.grad().defined());
  EXPECT_FALSE(layer->bias.grad().defined());
  // B starts at zero, so A's first gradient is zero too; B's is not.
  EXPECT_GT(params["lora_B.weight"].grad().abs().sum().item<float>(), 0);
  EXPECT_TRUE(params["lora_A.weight"].grad().defined());
}

// A layer with a trained-looking adapter (B non-zero) on a dense or NF4 base.
Linear AdaptedLayer(bool quantized) {
  at::manual_seed(6);
  Linear layer(64, 32, false);
  if (quantized) {
    EXPECT_TRUE(layer
                    ->Quantize(QuantizeWith("nf4", "compute_dtype: FP32 block_size: 32",
                                            layer->weight.detach()))
                    .ok());
  }
  const auto& lora = Lora();
  auto adapter =
      lora.Create(*testing::Options(lora, "r: 4 lora_alpha: 16"), {}, {"l", "l"}, *layer);
  EXPECT_TRUE(adapter.ok());
  EXPECT_TRUE(layer->AddAdapter(*adapter).ok());
  at::NoGradGuard no_grad;
  layer->named_parameters()["lora_B.weight"].normal_(0, 0.05);
  return layer;
}

TEST(LoraTest, MergedForwardEqualsUnmergedOnADenseBase) {
  Linear layer = AdaptedLayer(false);
  const at::Tensor x = at::randn({5, 64});
  const at::Tensor weight = layer->weight.detach().clone();
  const at::Tensor unmerged = layer->forward(x).detach();
  ASSERT_TRUE(layer->MergeAdapters().ok());
  EXPECT_TRUE(layer->merged());
  EXPECT_TRUE(at::allclose(layer->forward(x), unmerged, 1e-5, 1e-5));
  EXPECT_THAT(layer->MergeAdapters().message(), HasSubstr("merged already"));
  ASSERT_TRUE(layer->UnmergeAdapters().ok());
  EXPECT_TRUE(at::allclose(layer->weight, weight, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(layer->forward(x), unmerged, 1e-5, 1e-5));
}

TEST(LoraTest, MergingIntoAQuantizedBaseIsExplicit) {
  Linear layer = AdaptedLayer(true);
  const at::Tensor x = at::randn({5, 64});
  const at::Tensor unmerged = layer->forward(x).detach();
  EXPECT_THAT(layer->MergeAdapters().message(), HasSubstr("ask for it explicitly (requantize)"));
  EXPECT_FALSE(layer->merged());
  const at::Tensor packed = layer->named_buffers()["weight"];
  ASSERT_TRUE(layer->MergeAdapters(/*requantize=*/true).ok());
  // The buffers are rewritten in place; the output moves by no more than 4-bit rounding.
  EXPECT_EQ(layer->named_buffers()["weight"].data_ptr(), packed.data_ptr());
  const at::Tensor merged = layer->forward(x);
  const float scale = unmerged.abs().max().item<float>();
  EXPECT_LT((merged - unmerged).abs().max().item<float>(), 0.25f * scale);
  EXPECT_GT((merged - unmerged).abs().max().item<float>(), 0.0f);
}

// Dense layers on one input of many rows go through one product: the same outputs and gradients as
// each forward; anything with its own path (an adapter, a quantized weight, a bias on some only)
// is left to the layers one by one, and so is an input of few rows (a generated token's), for
// which copying the weights together costs more than the one product saves.
TEST(ForwardConcatenatedTest, EqualsTheLayersSideBySideOrDeclines) {
  at::manual_seed(13);
  Linear a(16, 8, true), b(16, 4, true), c(16, 4, false), d(16, 4, true);
  const at::Tensor x = at::randn({4, 256, 16});
  EXPECT_FALSE(ForwardConcatenated({a.get(), b.get()}, at::randn({8, 1, 16})).defined());
  EXPECT_FALSE(ForwardConcatenated({a.get(), b.get()}, x.slice(1, 0, 255)).defined());
  const at::Tensor together = ForwardConcatenated({a.get(), b.get()}, x);
  ASSERT_TRUE(together.defined());
  const at::Tensor apart = at::cat({a->forward(x), b->forward(x)}, -1);
  EXPECT_TRUE(at::allclose(together, apart, 1e-6, 1e-6));
  const at::Tensor grad = at::randn_like(together);
  together.backward(grad);
  const at::Tensor weight_grad = a->weight.grad().clone(), bias_grad = b->bias.grad().clone();
  a->zero_grad();
  b->zero_grad();
  apart.backward(grad);
  EXPECT_TRUE(at::allclose(weight_grad, a->weight.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(bias_grad, b->bias.grad(), 1e-5, 1e-6));

  EXPECT_FALSE(ForwardConcatenated({a.get(), c.get()}, x).defined());  // a bias on one only
  ASSERT_TRUE(d->Quantize(QuantizeWith("nf4", "compute_dtype: FP32", d->weight.detach())).ok());
  EXPECT_FALSE(ForwardConcatenated({a.get(), d.get()}, x).defined());
  const auto& lora = Lora();
  auto adapter = lora.Create(*testing::Options(lora, "r: 2 lora_alpha: 4"), {}, {"b", "b"}, *b);
  ASSERT_TRUE(adapter.ok());
  ASSERT_TRUE(b->AddAdapter(*adapter).ok());
  EXPECT_FALSE(ForwardConcatenated({a.get(), b.get()}, x).defined());
}

TEST(QuantizationOptionsTest, BadOptionsAreRefusedByField) {
  EXPECT_THAT(ValidationErrors(Lora(), "r: 0"), ::testing::ElementsAre(HasSubstr("r: is 0")));
  EXPECT_THAT(ValidationErrors(Lora(), "lora_dropout: 1"),
              ::testing::ElementsAre(HasSubstr("lora_dropout: must be in [0, 1)")));
  EXPECT_THAT(ValidationErrors(Quantizer("nf4"), "block_size: 48"),
              ::testing::ElementsAre(HasSubstr("block_size: is 48; it must be a power of two")));
  EXPECT_TRUE(ValidationErrors(Quantizer("nf4"), "block_size: 4096").empty());
  // A rank larger than the layer, and a weight holding NaN.
  Linear layer(4, 3, false);
  auto adapter = Lora().Create(*testing::Options(Lora(), "r: 8"), {}, {"l", "l"}, *layer);
  EXPECT_THAT(adapter.status().message(), HasSubstr("rank 8 is larger than the layer (3x4)"));
  const auto& nf4 = Quantizer("nf4");
  auto nan = nf4.Quantize(*testing::Options(nf4, ""), at::full({4, 64}, NAN));
  EXPECT_THAT(nan.status().message(), HasSubstr("inf or NaN"));
}

TEST(LoraTest, AdapterConfigIsPeftShaped) {
  const auto& lora = Lora();
  const StatusOr<std::string> written =
      lora.AdapterConfigJson(*testing::Options(lora, "r: 4 lora_alpha: 8"), {},
                             {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj",
                              "model.layers.0.self_attn.v_proj"});
  ASSERT_TRUE(written.ok()) << written.status().message();
  const std::string& json = *written;
  EXPECT_THAT(json, HasSubstr("\"peft_type\": \"LORA\""));
  EXPECT_THAT(json, HasSubstr("\"r\": 4"));
  // The full names: bare ones would have PEFT wrap model.layers.1.self_attn.v_proj too.
  EXPECT_THAT(json, HasSubstr("\"target_modules\": [\n    \"model.layers.0.self_attn.q_proj\",\n"
                              "    \"model.layers.0.self_attn.v_proj\",\n"
                              "    \"model.layers.1.self_attn.q_proj\"\n  ]"));
}

}  // namespace
}  // namespace engine
