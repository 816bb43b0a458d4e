// Qwen2-VL, Qwen2.5-VL and Qwen3-VL (transformers' Qwen2VLForConditionalGeneration,
// Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration): the vision tower's tokens
// placed at the image (and video) tokens of a decoder with multimodal rotary positions. Qwen2-VL
// and Qwen2.5-VL differ only in their vision towers (qwen2_vl_vision.h, qwen2_5_vl_vision.h);
// Qwen3-VL also has a Qwen3 decoder with interleaved rotary bands and adds its tower's DeepStack
// features to the hidden states of the first decoder layers at the image tokens
// (qwen3_vl_vision.h). config.json's model_type picks the family. Hugging Face names: visual.*,
// model.*, lm_head.* for the first two (transformers 4's layout, which their hub checkpoints use);
// model.visual.*, model.language_model.*, lm_head.* for Qwen3-VL (its hub checkpoints' and
// transformers 5's).
//
//   ENGINE_ASSIGN_OR_RETURN(Qwen2VlConfig config, Qwen2VlConfigFromJson(json, "config.json"));
//   Qwen2VlModule module(config);
//   ENGINE_ASSIGN_OR_RETURN(at::Tensor hidden, module.Hidden(ids, mask, pixel_values, grids));
//   at::Tensor logits = module.lm.Logits(hidden);
#pragma once

#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/image_batch.h"
#include "hf_checkpoint.h"
#include "llama_modules.h"
#include "qwen2_vl_vision.h"
#include "qwen_vision_parts.h"

namespace engine::transformer {

struct Qwen2VlConfig {
  LlamaConfig text;
  Qwen2VlVisionConfig vision;
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;

  // "qwen2_vl", "qwen2_5_vl" or "qwen3_vl", as config.json names the family.
  const std::string& model_type() const { return text.model_type; }
  // config.json, in transformers 4's flat layout (Qwen3-VL: transformers 5's, the only one it has);
  // `dtype` names the weights' dtype.
  nlohmann::json ToJson(const std::string& dtype) const;
};

// A qwen2_vl, qwen2_5_vl or qwen3_vl config.json, in transformers 4's flat layout or transformers
// 5's (the language model's keys under text_config): its text part (Qwen2VlTextConfigFromJson),
// vision_config (the family's reader), and the vision token ids. Refused, naming `where` and the
// key: a vision tower whose output width is not the decoder's hidden_size, more DeepStack layers
// than decoder layers, a text_config or vision_config of another family, and any key the parts do
// not read.
StatusOr<Qwen2VlConfig> Qwen2VlConfigFromJson(const nlohmann::json& json, const std::string& where);

// How transformers 5 names Qwen2-VL's tensors (model.language_model.*, model.visual.*) against
// the hub's names this module has (model.*, visual.*), for LoadWeights: a checkpoint in either
// layout loads.
const PrefixRenames& Qwen2VlTransformers5Names();
// The renames LoadWeights needs for this family: the above, or none for Qwen3-VL (whose module
// has transformers 5's names, the only ones its checkpoints use).
const PrefixRenames& Qwen2VlCheckpointRenames(const Qwen2VlConfig& config);

class Qwen2VlModule : public torch::nn::Module {
 public:
  explicit Qwen2VlModule(const Qwen2VlConfig& config);

  // input_ids and attention_mask (undefined: none) [batch, positions]; pixel_values [patches,
  // patch_values], the patches of every image of the batch in row order; row_grids: each row's
  // images. Returns the decoder's final hidden states. With a `cache` (empty), the keys and values
  // are kept for generation and `next_positions` receives each row's next rotary position;
  // `position_ids` (when given) receives the multimodal positions, i64 [3, batch, positions].
  // Errors: image tokens that do not match the images.
  StatusOr<at::Tensor> Hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                              const at::Tensor& pixel_values,
                              const std::vector<std::vector<ImageGrid>>& row_grids,
                              bool checkpointing = false, KvCache* cache = nullptr,
                              std::vector<int64_t>* next_positions = nullptr,
                              at::Tensor* position_ids = nullptr);
  // The same with videos too (image_batch.h: a video's patches, grid and seconds per temporal
  // patch), placed at the video tokens (Qwen3-VL: each temporal patch's tokens a run of their own,
  // after its timestamp). Errors also: video tokens that do not match the videos.
  StatusOr<at::Tensor> Hidden(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                              const ImagesOfBatch& images, const ImagesOfBatch& videos,
                              bool checkpointing = false, KvCache* cache = nullptr,
                              std::vector<int64_t>* next_positions = nullptr,
                              at::Tensor* position_ids = nullptr);

  const Qwen2VlConfig& config() const { return config_; }

  CausalLm lm;
  std::shared_ptr<QwenVisionTower> visual;  // the family's tower

 private:
  // Where the decoder and the tower are registered: this module, or (Qwen3-VL) its "model".
  torch::nn::Module& PartsOwner(const Qwen2VlConfig& config);
  // One kind of visual input (`fields` names it) encoded by the tower and written into `embeds` at
  // its tokens (`token_id`), after checking their counts against its grids.
  struct PlacedVisuals {
    at::Tensor tokens;  // bool [batch, positions]: where they went; undefined when none did
    std::vector<at::Tensor> deepstack;  // Qwen3-VL
  };
  static StatusOr<std::vector<at::Tensor>> DeepStackInPositionOrder(const PlacedVisuals& images,
                                                                    const PlacedVisuals& videos);
  StatusOr<PlacedVisuals> Place(const at::Tensor& host_ids, const at::Tensor& ids,
                                const ImagesOfBatch& visuals, int64_t token_id,
                                const VisualFields& fields, bool checkpointing, at::Tensor* embeds);
  Qwen2VlConfig config_;
};

}  // namespace engine::transformer
