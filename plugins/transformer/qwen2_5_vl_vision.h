// Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel), named as
// Hugging Face names it under `visual.`: patch_embed.proj (as Qwen2-VL's), blocks.N.{norm1,
// attn.qkv, attn.proj, norm2, mlp.gate_proj, mlp.up_proj, mlp.down_proj} (pre-RMSNorm blocks, a
// gated MLP with biases), merger.{ln_q (RMSNorm), mlp.0, mlp.2}.
//
// What it changes from Qwen2-VL is window attention: the merged patches of each frame are
// regrouped into windows of window_size pixels on a side (windows cut at the frame's right and
// bottom edges are smaller), every block but those of fullatt_block_indexes attends only within
// its window, and the merger's tokens are put back in the image processor's order. Everything else
// (the 2-D rotary, attention in f32 softmax, checkpointing per block) is qwen_vision_parts.h's.
//
//   Qwen25VlVisionTower visual(config);  // config.family == VisionFamily::kQwen25Vl
//   at::Tensor tokens = visual->forward(pixel_values, grids);  // [patches / 4, out_hidden_size]
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/linear.h"
#include "engine/status.h"
#include "llama_modules.h"
#include "qwen2_vl_vision.h"

namespace engine::transformer {

// config.json's "vision_config" of a qwen2_5_vl model (transformers 4's keys and 5's: hidden_size
// is the blocks' width, out_hidden_size the merger's). Every key is read, known not to change the
// math, or refused naming `where` and the key.
StatusOr<Qwen2VlVisionConfig> Qwen25VlVisionConfigFromJson(const nlohmann::json& json,
                                                           const std::string& where);
// Qwen2VlVisionConfig::Check and ToJson for this family.
Status CheckQwen25VlVision(const Qwen2VlVisionConfig& config);
nlohmann::json Qwen25VlVisionJson(const Qwen2VlVisionConfig& config);

// Which merged patches form each attention window, as transformers' get_vision_window_index
// computes it: `order` (i64 [merged patches]) lists the merged patches of every window, windows
// of each frame in row order, images one after another; `lengths` holds each window's patches
// (merged patches x merge^2), windows cut to nothing left out.
struct VisionWindows {
  at::Tensor order;
  std::vector<int64_t> lengths;
};
VisionWindows QwenVisionWindows(const std::vector<ImageGrid>& grids, int64_t spatial_merge_size,
                                int64_t merged_patches_per_window_side);

class Qwen25VlVisionBlockImpl : public torch::nn::Module {
 public:
  explicit Qwen25VlVisionBlockImpl(const Qwen2VlVisionConfig& config);
  // x: [patches, embed_dim] in window order; attention stays inside each run of `segment_lengths`.
  at::Tensor forward(const at::Tensor& x, const VisionRotary& rotary,
                     const std::vector<int64_t>& segment_lengths);

  RmsNorm norm1{nullptr}, norm2{nullptr};
  engine::Linear qkv{nullptr}, proj{nullptr};
  LlamaMlp mlp{nullptr};

 private:
  int64_t num_heads_;
};
TORCH_MODULE(Qwen25VlVisionBlock);

class Qwen25VlVisionTowerImpl : public QwenVisionTower {
 public:
  explicit Qwen25VlVisionTowerImpl(const Qwen2VlVisionConfig& config);

  const Qwen2VlVisionConfig& config() const { return config_; }
  void Initialize() override;

  at::Tensor patch_weight;  // patch_embed.proj.weight [embed_dim, C, T, P, P]
  torch::nn::ModuleList blocks{nullptr};
  RmsNorm ln_q{nullptr};
  engine::Linear merger_fc1{nullptr}, merger_fc2{nullptr};  // merger.mlp.0, merger.mlp.2

 protected:
  VisionTokens Encode(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                      bool checkpointing) override;

 private:
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen25VlVisionTower);

}  // namespace engine::transformer
