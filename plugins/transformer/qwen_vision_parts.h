// What the vision towers of the Qwen2-VL family (Qwen2-VL, Qwen2.5-VL) share: the 2-D rotary
// embedding of each patch's row and column, bidirectional self-attention within runs of patches
// (a frame, or a window of one), Hugging Face's initialisation, and the vision_config keys read the
// same way. Each tower (qwen2_vl_vision.h, qwen2_5_vl_vision.h) keeps only what its family changes.
//
// Functions, no state; thread-safe as ATen is. Config readers return errors naming the key.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

#include "engine/json_key_reader.h"
#include "engine/linear.h"
#include "engine/qwen2_vl_image_processor.h"
#include "engine/status.h"
#include "llama_config.h"

namespace engine::transformer {

// What a tower gives the decoder: the images' tokens, [patches / merge^2, hidden_size], and
// (Qwen3-VL) one more such tensor per DeepStack layer, added to the hidden states after decoder
// layer 0, 1, ... at the image tokens.
struct VisionTokens {
  at::Tensor merged;
  std::vector<at::Tensor> deepstack;
};

// A family's vision tower, as Qwen2VlModule holds it.
class QwenVisionTower : public torch::nn::Module {
 public:
  // pixel_values: [patches, patch_values] in the image processor's order, the images' patches one
  // after another; grids: each image's (t, h, w). Returns [patches / merge^2, hidden_size], the
  // images' tokens for the decoder. Gradient checkpointing is per block.
  at::Tensor forward(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                     bool checkpointing = false) {
    return Encode(pixel_values, grids, checkpointing).merged;
  }
  // The same, with the DeepStack features.
  VisionTokens Features(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                        bool checkpointing = false) {
    return Encode(pixel_values, grids, checkpointing);
  }
  // Hugging Face's random initialisation (InitializeQwenVision).
  virtual void Initialize() = 0;

 protected:
  virtual VisionTokens Encode(const at::Tensor& pixel_values, const std::vector<ImageGrid>& grids,
                              bool checkpointing) = 0;
};

// patch_embed.proj.weight [embed_dim, in_channels, temporal_patch, patch, patch], registered on
// `tower` (a Conv3d whose kernel is the whole patch; with `bias`, patch_embed.proj.bias
// [embed_dim] too, returned through `bias_out`), and its product with the flattened patches:
// pixel_values [patches, patch values] -> [patches, embed_dim] in its dtype.
at::Tensor RegisterPatchEmbedding(torch::nn::Module& tower, int64_t embed_dim, int64_t in_channels,
                                  int64_t temporal_patch_size, int64_t patch_size,
                                  at::Tensor* bias_out = nullptr);
at::Tensor EmbedPatches(const at::Tensor& patch_weight, const at::Tensor& pixel_values,
                        const at::Tensor& patch_bias = at::Tensor());

// The patches of each frame of each image, in order: the runs full attention stays within.
std::vector<int64_t> FrameLengths(const std::vector<ImageGrid>& grids);

// The rotation of every patch of `grids` (the images' patches one after another, in the image
// processor's merged order): f32 [patches, 1, head_dim], the first quarter of the frequencies from
// the patch's row, the second from its column, repeated for the two halves.
struct VisionRotary {
  at::Tensor cos, sin;
};
VisionRotary QwenVisionRotary(const std::vector<ImageGrid>& grids, int64_t spatial_merge_size,
                              int64_t head_dim, double theta, const at::Device& device);

// The same rows of `t` ([patches, ...]) regrouped: row group i (of `group` rows, a merged patch)
// of the result is group order[i] of `t`.
at::Tensor PermuteMergedGroups(const at::Tensor& t, const at::Tensor& order, int64_t group);

// softmax(q k^T / sqrt(head_dim)) v of the fused projection qkv [patches, 3 * heads * head_dim]
// (q and k rotated by `rotary` in f32, the softmax in f32), each patch attending to the patches of
// its own run of `segment_lengths` (which sum to the patches). Returns [patches, heads * head_dim]
// in qkv's dtype. The engine's CPU kernel when it takes it (kernel_ops.h), ATen otherwise.
at::Tensor SegmentedVisionAttention(const at::Tensor& qkv, int64_t heads,
                                    const VisionRotary& rotary,
                                    const std::vector<int64_t>& segment_lengths);

// Hugging Face's initialisation of a vision tower: normal(0, initializer_range) for the
// projections and the patch embedding, zero biases, norms at one (and zero bias).
void InitializeQwenVision(torch::nn::Module& tower, double initializer_range);

// vision_config keys both families read alike. hidden_act: quick_gelu, gelu, gelu_pytorch_tanh or
// silu. rope_parameters (transformers 5): {rope_type "axial", rope_theta}; absent: 10000.
Status ReadVisionActivation(JsonKeyReader& keys, Activation* activation);
Status ReadVisionRope(JsonKeyReader& keys, double* theta);
// A list of the tower's blocks (fullatt_block_indexes, deepstack_visual_indexes) into `blocks`
// when the key is there: each an integer from 0 to depth - 1.
Status ReadVisionBlockList(JsonKeyReader& keys, const std::string& key, int64_t depth,
                           std::vector<int64_t>* blocks);
// The hub's configs also carry in_chans and spatial_patch_size, which transformers keeps without
// reading: they must agree with what it reads.
Status CheckUnreadVisionCopies(JsonKeyReader& keys, int64_t in_channels, int64_t patch_size);

}  // namespace engine::transformer
