// What the data-parallel end-to-end tests share: a pipeline that trains the digits MLP on several
// ranks, and comparisons of the checkpoints two runs wrote (weights, the model wherever its
// tensors are stored, the optimizer state whichever files hold it).
#pragma once

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_tensors.h"
#include "checkpoint/tensor_pieces.h"
#include "engine/safetensors.h"
#include "testing/pipelines.h"

namespace engine::testing {

// A stage of the digits MLP writing into `out`, 40 steps of `batch` examples per rank, a
// checkpoint every 10, with `parallel`'s fields.
inline std::string DataParallelPipeline(const std::string& out, int batch,
                                        const std::string& parallel, int accumulation = 1,
                                        const std::string& device = "cpu",
                                        const std::string& precision = "fp32") {
  return "output_dir: \"" + out +
         "\"\nstage {\n  name: \"s\"\n"
         "  model { plugin: \"mlp\" options { [type.googleapis.com/engine.plugins.MlpOptions] { "
         "hidden_units: 64 } } }\n"
         "  data { plugin: \"digits\" options { [type.googleapis.com/engine.plugins."
         "DigitsOptions] { path: \"" +
         DigitsDataPath().string() +
         "\" } } }\n"
         "  precision { plugin: \"" +
         precision +
         "\" }\n"
         "  optimizer { learning_rate: 0.003 }\n"
         "  schedule { max_steps: 40 batch_size: " +
         std::to_string(batch) + " gradient_accumulation_steps: " + std::to_string(accumulation) +
         " checkpoint_every_steps: 10 }\n  parallel { device: \"" + device + "\" " + parallel +
         " }\n}\n";
}

// Two tensors equal or (with a tolerance) close. Sums over 32 examples split 16 + 16 across ranks
// round differently from one sum of 32; after 40 AdamW steps the weights agree to about 1e-6.
inline void ExpectSameTensor(const at::Tensor& u, const at::Tensor& v, bool exactly,
                             const std::string& name) {
  EXPECT_TRUE(exactly ? at::equal(u, v) : at::allclose(u, v, 1e-4, 1e-5)) << name;
}

// Two safetensors files (weights, or optimizer state) hold the same names, every tensor equal or
// (with a tolerance) close.
inline void ExpectSameWeights(const std::filesystem::path& a, const std::filesystem::path& b,
                              bool exactly) {
  auto x = safetensors::File::Open(a);
  auto y = safetensors::File::Open(b);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_EQ((*x)->tensors().size(), (*y)->tensors().size());
  for (const auto& info : (*x)->tensors()) {
    ExpectSameTensor(*(*x)->Get(info.name), *(*y)->Get(info.name), exactly, info.name);
  }
}

// A checkpoint's optimizer state by name, whole: optimizer.safetensors's tensors, and a sharded
// stage's slots and masters assembled from its ranks' files.
inline std::map<std::string, at::Tensor> OptimizerStateOf(const std::filesystem::path& checkpoint) {
  std::map<std::string, at::Tensor> state;
  auto file = safetensors::File::Open(checkpoint / "optimizer.safetensors");
  EXPECT_TRUE(file.ok()) << checkpoint;
  if (!file.ok()) return state;
  const auto tensors = (*file)->GetAll();
  EXPECT_TRUE(tensors.ok());
  for (const auto& [name, tensor] : *tensors) state[name] = tensor;
  auto manifest = ReadManifest(checkpoint);
  EXPECT_TRUE(manifest.ok());
  const auto names = RankFiles(*manifest, RankFile::kOptimizerState);
  EXPECT_TRUE(names.ok());
  std::vector<std::filesystem::path> ranks;
  for (const std::string& name : *names) ranks.push_back(checkpoint / name);
  auto pieces = TensorPieces::Open(ranks);
  EXPECT_TRUE(pieces.ok()) << pieces.status().message();
  for (const std::string& name : pieces->names()) {
    EXPECT_EQ(state.count(name), 0u) << name << " is stored twice";
    state[name] = *pieces->Whole(name);
  }
  return state;
}

// Two checkpoints hold the same model tensors, wherever each stores them (CheckpointTensors: a
// shard_level 3 stage's in its ranks' files), equal or (not `exactly`) close.
inline void ExpectSameModel(const std::filesystem::path& a, const std::filesystem::path& b,
                            bool exactly = true) {
  auto x_manifest = ReadManifest(a);
  auto y_manifest = ReadManifest(b);
  ASSERT_TRUE(x_manifest.ok() && y_manifest.ok());
  auto x = CheckpointTensors::Open(a, *x_manifest);
  auto y = CheckpointTensors::Open(b, *y_manifest);
  ASSERT_TRUE(x.ok()) << x.status().message();
  ASSERT_TRUE(y.ok()) << y.status().message();
  ASSERT_EQ(x->tensors().size(), y->tensors().size());
  for (const auto& info : x->tensors()) {
    auto u = x->Get(info.name);
    auto v = y->Get(info.name);
    ASSERT_TRUE(u.ok() && v.ok()) << info.name;
    ExpectSameTensor(*u, *v, exactly, info.name);
  }
}

// Two checkpoints hold the same optimizer state, whichever files it is in.
inline void ExpectSameOptimizerState(const std::filesystem::path& a, const std::filesystem::path& b,
                                     bool exactly) {
  const std::map<std::string, at::Tensor> x = OptimizerStateOf(a);
  const std::map<std::string, at::Tensor> y = OptimizerStateOf(b);
  ASSERT_EQ(x.size(), y.size());
  for (const auto& [name, u] : x) {
    auto it = y.find(name);
    ASSERT_NE(it, y.end()) << name;
    ExpectSameTensor(u, it->second, exactly, name);
  }
}

}  // namespace engine::testing
