// A small ViT: patches of the image are embedded, given learned positions and run through pre-norm
// blocks (non-causal attention). Names: patch_embed, pos_embed, blocks.N.{norm1, attn.qkv,
// attn.proj, norm2, mlp.fc1, mlp.fc2}, norm.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json.hpp>
#include <string>

#include "engine/linear.h"
#include "engine/status.h"
#include "transformer_options.pb.h"

namespace engine::transformer {

struct VisionConfig {
  int64_t channels = 1;
  int64_t image_size = 8;  // square images
  int64_t patch_size = 2;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t mlp_ratio = 4;
  double layer_norm_eps = 1e-6;

  int64_t num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
  // Sizes that cannot work, in words.
  Status Check() const;
  nlohmann::json ToJson() const;
};

// Images of `channels` x `image_size` x `image_size` (from the data).
StatusOr<VisionConfig> VisionConfigFromOptions(const VisionOptions& options, int64_t channels,
                                               int64_t image_size);
// From the "vision_config" object of a vlm config.json. Errors name `where` and the key.
StatusOr<VisionConfig> VisionConfigFromJson(const nlohmann::json& json, const std::string& where);

class VisionBlockImpl : public torch::nn::Module {
 public:
  explicit VisionBlockImpl(const VisionConfig& config);
  at::Tensor forward(const at::Tensor& x);

 private:
  VisionConfig config_;
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  engine::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(VisionBlock);

class VisionTowerImpl : public torch::nn::Module {
 public:
  explicit VisionTowerImpl(const VisionConfig& config);
  // pixels: [batch, channels, size, size] -> [batch, num_patches, hidden_size].
  at::Tensor forward(const at::Tensor& pixels, bool checkpointing = false);

  const VisionConfig& config() const { return config_; }

 private:
  VisionConfig config_;
  engine::Linear patch_embed{nullptr};
  at::Tensor pos_embed;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(VisionTower);

}  // namespace engine::transformer
