// Qwen3-VL's vision tower (transformers' Qwen3VLVisionModel), named as Hugging Face names it under
// `model.visual.`: patch_embed.proj (Qwen2-VL's, with a bias), pos_embed (a learned square grid of
// positions, resampled bilinearly with aligned corners to each image's grid of patches),
// blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.linear_fc1, mlp.linear_fc2} (Qwen2-VL's blocks
// with an intermediate_size-wide MLP), merger.{norm, linear_fc1, linear_fc2} (LayerNorm before the
// 2x2 groups are merged) and deepstack_merger_list.N.{norm, linear_fc1, linear_fc2} (LayerNorm
// after merging): the outputs of the blocks of deepstack_visual_indexes, each through its own
// merger, are the DeepStack features the decoder adds to its first layers' hidden states.
//
//   Qwen3VlVisionTower visual(config);  // config.family == VisionFamily::kQwen3Vl
//   VisionTokens tokens = visual->Features(pixel_values, grids);
//   // tokens.merged [patches / 4, out_hidden_size]; tokens.deepstack: one such per index
//
// The 2-D rotary, attention within each frame (f32 softmax) and checkpointing per block are
// qwen_vision_parts.h's.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/status.h"
#include "qwen2_vl_vision.h"

namespace engine::transformer {

// config.json's "vision_config" of a qwen3_vl model (hidden_size is the blocks' width,
// out_hidden_size the mergers'). Every key is read, known not to change the math, or refused
// naming `where` and the key.
StatusOr<Qwen2VlVisionConfig> Qwen3VlVisionConfigFromJson(const nlohmann::json& json,
                                                          const std::string& where);
// Qwen2VlVisionConfig::Check and ToJson for this family.
Status CheckQwen3VlVision(const Qwen2VlVisionConfig& config);
nlohmann::json Qwen3VlVisionJson(const Qwen2VlVisionConfig& config);

// The learned positions of every patch of `grids` (in the image processor's merged order, every
// frame alike): `table` [side x side, width] resampled bilinearly with aligned corners to each
// image's h x w patches, in f32 (as transformers weighs the table's rows). [patches, width].
at::Tensor InterpolatedPositions(const at::Tensor& table, const std::vector<ImageGrid>& grids,
                                 int64_t spatial_merge_size);

// Merges each 2x2 group of patches into one token of the decoder's width: norm (before merging,
// over one patch; or with `after_merge`, over the merged group), linear_fc1, exact GELU,
// linear_fc2.
class Qwen3VlPatchMergerImpl : public torch::nn::Module {
 public:
  Qwen3VlPatchMergerImpl(const Qwen2VlVisionConfig& config, bool after_merge);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm norm{nullptr};
  engine::Linear linear_fc1{nullptr}, linear_fc2{nullptr};

 private:
  int64_t merged_width_;
  bool after_merge_;
};
TORCH_MODULE(Qwen3VlPatchMerger);

class Qwen3VlVisionTowerImpl : public QwenVisionTower {
 public:
  explicit Qwen3VlVisionTowerImpl(const Qwen2VlVisionConfig& config);

  const Qwen2VlVisionConfig& config() const { return config_; }
  void Initialize() override;

  at::Tensor patch_weight, patch_bias;  // patch_embed.proj.{weight, bias}
  at::Tensor pos_embed;                 // pos_embed.weight [num_position_embeddings, embed_dim]
  torch::nn::ModuleList blocks{nullptr};
  Qwen3VlPatchMerger merger{nullptr};
  torch::nn::ModuleList deepstack_mergers{nullptr};  // deepstack_merger_list

 protected:
  VisionTokens Encode(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                      bool checkpointing) override;

 private:
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen3VlVisionTower);

}  // namespace engine::transformer
