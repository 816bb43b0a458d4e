// A Qwen2-VL-family fixture of tests/fixtures/hf/ (qwen2_vl_fixture.py: a tiny random checkpoint
// saved by transformers, the processor's inputs and transformers' outputs in
// reference.safetensors), loaded into the engine's module for the family's model tests.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/safetensors.h"
#include "hf_checkpoint.h"
#include "qwen2_vl_model.h"
#include "testing/test_paths.h"

namespace engine::transformer::testing_support {

inline std::filesystem::path FixtureDir(const std::string& family) {
  return std::filesystem::path(testing::kSourceDir) / "tests" / "fixtures" / "hf" / family;
}

// The rows of a [n, 3] grid tensor (image_grid_thw, video_grid_thw) as grids.
inline std::vector<ImageGrid> GridsOf(const at::Tensor& g) {
  std::vector<ImageGrid> all;
  for (int64_t i = 0; i < g.size(0); ++i) {
    all.push_back({g[i][0].item<int64_t>(), g[i][1].item<int64_t>(), g[i][2].item<int64_t>()});
  }
  return all;
}

struct QwenVlFixture {
  Qwen2VlConfig config;
  std::shared_ptr<Qwen2VlModule> module;
  std::shared_ptr<const safetensors::File> reference;

  at::Tensor Get(const std::string& name) const { return *reference->Get(name); }
  std::vector<ImageGrid> Grids() const { return GridsOf(Get("image_grid_thw")); }
  // The fixture's images by row: row 0 has one, row 1 two, row 2 one.
  std::vector<std::vector<ImageGrid>> RowGrids() const {
    const auto all = Grids();
    return {{all[0]}, {all[1], all[2]}, {all[3]}};
  }
};

// The family's fixture: config.json read, the checkpoint loaded (eval mode), the reference open.
inline QwenVlFixture LoadQwenVlFixture(const std::string& family) {
  QwenVlFixture f;
  const std::filesystem::path dir = FixtureDir(family);
  auto json = ReadConfigJson(dir);
  EXPECT_TRUE(json.ok()) << json.status().message();
  auto config = Qwen2VlConfigFromJson(*json, family + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status().message();
  f.config = *config;
  f.module = std::make_shared<Qwen2VlModule>(f.config);
  Status loaded = LoadWeights(dir, *f.module, {}, nullptr, Qwen2VlCheckpointRenames(f.config));
  EXPECT_TRUE(loaded.ok()) << loaded.message();
  f.module->eval();
  auto reference = safetensors::File::Open(dir / "reference.safetensors");
  EXPECT_TRUE(reference.ok()) << reference.status().message();
  f.reference = *reference;
  return f;
}

// Largest |a - b| over the last dimension at the positions `mask` marks real.
inline double MaxDifferenceAtRealTokens(const at::Tensor& a, const at::Tensor& b,
                                        const at::Tensor& mask) {
  return (a - b).abs().amax(-1).masked_select(mask.to(at::kBool)).max().item<double>();
}

}  // namespace engine::transformer::testing_support
