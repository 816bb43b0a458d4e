// Qwen2-VL's vision tower (transformers' Qwen2VisionTransformerPretrainedModel), named as Hugging
// Face names it under `visual.`: patch_embed.proj (a Conv3d whose kernel is the whole patch, so a
// matrix product over the flattened patch), blocks.N.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1,
// mlp.fc2} (pre-LayerNorm blocks with 2-D rotary positions and bidirectional attention inside each
// frame of each image), and merger.{ln_q, mlp.0, mlp.2} (each 2x2 group of patches merged into
// one token of the decoder's width). Also the vision config of the whole family: Qwen2.5-VL's and
// Qwen3-VL's towers (qwen2_5_vl_vision.h, qwen3_vl_vision.h) read and check their own keys of the
// same struct.
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
#include "qwen_vision_parts.h"

namespace engine::transformer {

enum class VisionFamily { kQwen2Vl, kQwen25Vl, kQwen3Vl };

// "qwen2_vl", "qwen2_5_vl" or "qwen3_vl": config.json's model_type of the family.
const char* VisionFamilyName(VisionFamily family);

struct Qwen2VlVisionConfig {
  VisionFamily family = VisionFamily::kQwen2Vl;
  int64_t depth = 32;
  int64_t embed_dim = 1280;    // the blocks' width (Qwen2.5-VL's vision hidden_size)
  int64_t hidden_size = 3584;  // the merger's output: the decoder's width (2.5: out_hidden_size)
  int64_t num_heads = 16;
  int64_t mlp_ratio = 4;  // Qwen2-VL: the MLP is embed_dim * mlp_ratio wide (2.5, 3: intermediate)
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  Activation hidden_act = Activation::kQuickGelu;
  double initializer_range = 0.02;
  double rope_theta = 10000.0;  // the 2-D rotary's base (transformers 5: rope_parameters)
  // Qwen2.5-VL only: the gated MLP's width, the side in pixels of the windows most blocks attend
  // within, the blocks that attend within the whole frame instead, and the temporal position step
  // of a video second (videos are refused).
  int64_t intermediate_size = 0;
  int64_t window_size = 0;
  std::vector<int64_t> fullatt_block_indexes;
  int64_t tokens_per_second = 0;
  // Qwen3-VL only: the learned position table (a square grid of this many, resampled to each
  // image's grid), and the blocks whose output also goes, through a merger of its own, to decoder
  // layer 0, 1, ... (DeepStack), in block order.
  int64_t num_position_embeddings = 0;
  std::vector<int64_t> deepstack_visual_indexes;

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

// The end of either family's vision_config reader, once it has read its own keys: the keys both
// read alike (hidden_act, initializer_range, rope_parameters, the hub's in_chans and
// spatial_patch_size copies), then every key left refused, then the sizes checked.
StatusOr<Qwen2VlVisionConfig> FinishVisionConfig(JsonKeyReader& keys, const std::string& where,
                                                 Qwen2VlVisionConfig config);

// A pre-LayerNorm block: Qwen2-VL's (mlp.fc1, mlp.fc2, embed_dim x mlp_ratio wide) and Qwen3-VL's
// (mlp.linear_fc1, mlp.linear_fc2, intermediate_size wide), as config.family says.
class Qwen2VlVisionBlockImpl : public torch::nn::Module {
 public:
  explicit Qwen2VlVisionBlockImpl(const Qwen2VlVisionConfig& config);
  // x: [patches, embed_dim]; attention stays inside each run of `frame_lengths` patches.
  at::Tensor forward(const at::Tensor& x, const VisionRotary& rotary,
                     const std::vector<int64_t>& frame_lengths);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  engine::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen2VlVisionBlock);

class Qwen2VlVisionTowerImpl : public QwenVisionTower {
 public:
  explicit Qwen2VlVisionTowerImpl(const Qwen2VlVisionConfig& config);

  const Qwen2VlVisionConfig& config() const { return config_; }
  void Initialize() override;

  at::Tensor patch_weight;  // patch_embed.proj.weight [embed_dim, C, T, P, P]
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_q{nullptr};
  engine::Linear merger_fc1{nullptr}, merger_fc2{nullptr};  // merger.mlp.0, merger.mlp.2

 protected:
  VisionTokens Encode(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                      bool checkpointing) override;

 private:
  Qwen2VlVisionConfig config_;
};
TORCH_MODULE(Qwen2VlVisionTower);

// The sizes Qwen2.5-VL's and Qwen3-VL's towers share: positive, within what this loader builds,
// and heads that the 2-D rotary can split (a multiple of 4). Each family's Check adds its own.
Status CheckGatedOrWideVisionSizes(const Qwen2VlVisionConfig& config);

// LayerNorm of `x` whatever its dtype: in the weights' dtype when `x` has it, otherwise in f32.
at::Tensor ApplyVisionNorm(torch::nn::LayerNorm& norm, const at::Tensor& x);
// The blocks' LayerNorm (eps 1e-6, as transformers builds them).
torch::nn::LayerNorm VisionLayerNorm(int64_t size);

}  // namespace engine::transformer
