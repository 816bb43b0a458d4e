// The model loaders of the Qwen2-VL family: `qwen2_vl` (Qwen2VLForConditionalGeneration),
// `qwen2_5_vl` (Qwen2_5_VLForConditionalGeneration) and `qwen3_vl`
// (Qwen3VLForConditionalGeneration, dense), qwen2_vl_model.h's module, from a Hugging Face model
// directory (`pretrained`: config.json and its safetensors, sharded or not, in their stored dtype,
// with the hub's tensor names or transformers 5's) or from a config.json alone
// (`config`: Hugging Face's random initialisation). Each plugin is this loader for its model_type;
// a config of the other family is refused naming the loader that reads it.
//
// Batches need "input_ids" (i64 [B, L]) and may carry "labels" (-100 where nothing is predicted;
// input_ids when absent), "attention_mask" (0 at padding) and the images of each row as
// engine/image_batch.h lays them out ("pixel_values", "image_grid_thw"), one run of image tokens
// per image; prompts with images generate (engine generate --image) with the KV cache and
// multimodal positions. Evaluation reports perplexity, token accuracy, eos accuracy and, when the
// labels mark answers (chat data), exact match (every answer token the greedy choice: lm_metrics.h
// TeacherForcedExactMatch). Text-only prompts generate as a Qwen2 decoder: without images the
// three rotary axes coincide.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/plugin.h"
#include "qwen2_vl_model.h"

namespace engine::transformer {

class Qwen2VlFamilyLoader : public ModelLoaderPlugin {
 public:
  // `model_type`: "qwen2_vl", "qwen2_5_vl" or "qwen3_vl", the family this loader builds.
  explicit Qwen2VlFamilyLoader(std::string model_type);

  const google::protobuf::Message& default_options() const override;
  void ValidateOptions(const google::protobuf::Message& message,
                       OptionErrors* errors) const override;
  StatusOr<std::unique_ptr<Model>> Create(const google::protobuf::Message& message,
                                          const ModelContext& context) const override;
  std::vector<std::string> model_types() const override { return {model_type_}; }

 private:
  std::string model_type_;
};

}  // namespace engine::transformer
