// The main job end to end: `engine run pipelines/digits_mlp.pbtxt` trains to >= 90% eval accuracy
// and leaves a checkpoint whose weights, read back on their own, give that accuracy.
#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/relu.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <regex>

#include "checkpoint/checkpoint.h"
#include "engine/data.h"
#include "engine/safetensors.h"
#include "plugins/plugin_registry.h"
#include "testing/subprocess.h"
#include "testing/temp_dir.h"
#include "testing/test_paths.h"

namespace engine {
namespace {

using ::testing::HasSubstr;

TEST(DigitsMlpTest, TrainsToNinetyPercentAndCheckpoints) {
  testing::DigitsDataPath();
  testing::TempDir out;
  const std::string pipeline = std::string(testing::kSourceDir) + "/pipelines/digits_mlp.pbtxt";
  auto r = testing::RunEngine({"run", pipeline, "--output_dir=" + out.path().string()}, "/");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("stage 'train' (fingerprint "));
  EXPECT_THAT(r.out, HasSubstr("pipeline 'digits_mlp' finished: 1 stage"));
  std::smatch match;
  const std::string& text = r.out;
  ASSERT_TRUE(
      std::regex_search(text, match, std::regex("eval on 359 examples: accuracy ([0-9.]+)")))
      << r.out;
  const double printed_accuracy = std::stod(match[1]);
  EXPECT_GE(printed_accuracy, 0.90);
  EXPECT_THAT(r.err, HasSubstr("stage 'train' step 675/675"));  // the progress callback

  // The checkpoint: manifest, weights and optimizer state, complete and consistent.
  const auto final_dir = out.path() / "train" / "final";
  auto manifest = ReadManifest(final_dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  EXPECT_EQ(manifest->pipeline(), "digits_mlp");
  EXPECT_EQ(manifest->stage(), "train");
  EXPECT_TRUE(manifest->final());
  EXPECT_EQ(manifest->step(), 675u);
  EXPECT_EQ(manifest->model().plugin(), "mlp");
  EXPECT_TRUE(manifest->precision().policy() == "fp32" ||
              manifest->precision().policy() == "bf16-mixed")
      << manifest->precision().policy();
  EXPECT_EQ(manifest->optimizer().algorithm(), "adamw");
  EXPECT_EQ(manifest->fingerprint().size(), 16u);
  EXPECT_NEAR(manifest->metrics().at("eval/accuracy"), printed_accuracy, 1e-4);
  ASSERT_EQ(manifest->tensor_size(), 4);
  auto weights = safetensors::File::Open(final_dir / kModelFile);
  ASSERT_TRUE(weights.ok()) << weights.status().message();
  for (const auto& t : manifest->tensor()) {
    const safetensors::TensorInfo* info = (*weights)->Find(t.name());
    ASSERT_NE(info, nullptr) << t.name();
    EXPECT_EQ(info->dtype, at::kFloat);
    EXPECT_EQ(info->shape, std::vector<int64_t>(t.shape().begin(), t.shape().end()));
    EXPECT_TRUE(t.trainable());
  }
  auto optimizer = safetensors::File::Open(final_dir / kOptimizerFile);
  ASSERT_TRUE(optimizer.ok());
  // AdamW's two slots for 4 tensors, and the random generators' states for resuming: the CPU's,
  // and the GPU's where `device: auto` picked one.
  size_t generators = 0;
  for (const auto& info : (*optimizer)->tensors()) {
    generators += info.name.rfind("engine/rng/", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ((*optimizer)->tensors().size() - generators, 8u);
  EXPECT_EQ(generators, at::hasCUDA() ? 2u : 1u);
  EXPECT_NE((*optimizer)->Find("engine/rng/cpu"), nullptr);
  EXPECT_EQ((*optimizer)->metadata().at("step"), "675");

  // Recompute the eval accuracy from the saved (f32) weights alone. Under bf16-mixed the stage
  // evaluated with bf16 products, which may flip an example or two.
  PluginRegistry registry;
  ASSERT_TRUE(registry.LoadDirectory(testing::kBuiltinPluginDir).ok());
  const auto& digits = static_cast<const DataLoaderPlugin&>(
      *registry.Find(PluginKind::kDataLoader, "digits")->plugin);
  std::unique_ptr<google::protobuf::Message> options(digits.default_options().New());
  options->GetReflection()->SetString(options.get(),
                                      options->GetDescriptor()->FindFieldByName("path"),
                                      testing::DigitsDataPath().string());
  auto data = digits.Open(*options, DataContext{"/", 7});
  ASSERT_TRUE(data.ok());
  std::vector<int64_t> all((*data)->size(Split::kEval));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  auto batch = (*data)->GetBatch(Split::kEval, all);
  auto w = [&](const std::string& name) { return *(*weights)->Get(name); };
  at::Tensor hidden =
      at::relu(batch->at("features").matmul(w("layers.0.weight").t()) + w("layers.0.bias"));
  at::Tensor logits = hidden.matmul(w("head.weight").t()) + w("head.bias");
  const double accuracy =
      at::argmax(logits, 1).eq(batch->at("labels")).to(at::kDouble).mean().item<double>();
  const double tolerance = manifest->precision().policy() == "fp32" ? 1e-4 : 2.5 / 359;
  EXPECT_NEAR(accuracy, printed_accuracy, tolerance);
}

}  // namespace
}  // namespace engine
