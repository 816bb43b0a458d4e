// Qwen2-VL's vision tower (transformers' Qwen2VisionTransformerPretrainedModel), named as Hugging
// Face names it under `visual.`: patch_embed.proj (a Conv3d whose kernel is the whole patch, so a
// matrix product over the flattened patch), blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
// mlp.fc2} (pre-LayerNorm blocks with 2-D rotary positions and bidirectional attention inside each
// frame of each image), and merger.{ln_q, mlp.0, mlp.2} (each 2x2 group of patches merged into
// one token of the decoder's width).
//
//   Qwen2VlVisionTower visual(config);
//   at::Tensor tokens = visual->forward(pixel_values, grids);  // [patches / 4, hidden_size]
//
// Softmax and the rotary rotation run in f32 whatever the weights' dtype, as in transformers.
// Gradient checkpointing is per block (engine::CheckpointedForward).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"
#include "llama_config.h"

namespace engine::transformer {

struct Qwen2VlVisionConfig {
  int64_t depth = 32;
  int64_t embed_dim = 1280;
  int64_t hidden_size = 3584;  // the merger's output: the decoder's width
  int64_t num_heads = 16;
  int64_t mlp_ratio = 4;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  Activation hidden_act = Activation::kQuickGelu;
  double initializer_range = 0.02;
  double rope_theta = 10000.0;  // the 2-D rotary's base (transformers 5: rope_parameters)

  int64_t head_dim() const { return embed_dim / num_heads; }
  int64_t patch_values() const {
    return in_channels * temporal_patch_size * patch_size * patch_size;
  }
  // Sizes that cannot work, in words.
  Status Check() const;
  nlohmann::json ToJson() const;
};

// config.json's "vision_config" of a qwen2_vl model. Every key is read, known not to change the
// math, or refused naming `where` and the key.
StatusOr<Qwen2VlVisionConfig> Qwen2VlVisionConfigFromJson(const nlohmann::json& json,
                                                          const std::string& where);

class Qwen2VlVisionBlockImpl : public torch::nn::Module {
 public:
  explicit Qwen2VlVisionBlockImpl(const Qwen2VlVisionConfig& config);
  // x: [patches, embed_dim]; cos/sin: f32 [patches, 1, head_dim]; attention stays inside each
  // run of `frame_lengths` patches.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& frame_lengths);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  engine::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  at::Tensor Attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                       const std::vector<int64_t>& frame_lengths);
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen2VlVisionBlock);

class Qwen2VlVisionTowerImpl : public torch::nn::Module {
 public:
  explicit Qwen2VlVisionTowerImpl(const Qwen2VlVisionConfig& config);
  // pixel_values: [patches, patch_values] in the image processor's order, the images' patches one
  // after another; grids: each image's (t, h, w). Returns [patches / merge^2, hidden_size].
  at::Tensor forward(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                     bool checkpointing = false);

  const Qwen2VlVisionConfig& config() const { return config_; }
  // Hugging Face's initialisation: normal(0, initializer_range) for the projections and the
  // patch embedding, zero biases, LayerNorms at one and zero.
  void Initialize();

  at::Tensor patch_weight;  // patch_embed.proj.weight [embed_dim, C, T, P, P]
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_q{nullptr};
  engine::Linear merger_fc1{nullptr}, merger_fc2{nullptr};  // merger.mlp.0, merger.mlp.2

 private:
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen2VlVisionTower);

}  // namespace engine::transformer
