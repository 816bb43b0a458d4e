// A trained stage's logits on the first examples of its eval (or training) split, with the inputs
// that gave them, for `engine eval --logits`: what another library (transformers on the stage's hf
// export, say) is run on to be compared with the engine on the same tokens.
//
// Failure: a model that does not implement LogitsModel (engine/model_logits.h), an empty split, or
// a data loader or model error, each an error naming the stage. Runs on the caller's
// thread; reads the checkpoint as `engine eval` does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "engine/data.h"
#include "engine/safetensors.h"
#include "engine/status.h"
#include "train/trainer.h"

namespace engine {

// The tensors an `engine eval --logits` file holds, on the CPU, in the layout transformers' models
// take them:
//   input_ids        i64 [batch, positions]
//   attention_mask   i64 [batch, positions] (when the data has one)
//   labels           i64 [batch, positions] (when the data has them; -100 where nothing counts)
//   position_ids     i64 [batch, positions], or [3, batch, positions] (multimodal rotary)
//   logits           f32 [batch, positions, vocabulary]
//   pixel_values     f32 [patches, patch_values], the batch's images' patches in row order
//   image_grid_thw   i64 [images, 3] (both only when the batch has images)
struct StageLogits {
  safetensors::NamedTensors tensors;
  // "stage", "checkpoint", "architecture", "examples": the file's __metadata__.
  std::map<std::string, std::string> metadata;
};

// The first `examples` examples of `split` (0: one eval batch, as the stage evaluates; at most the
// split) in one batch through the stage's model with `checkpoint`'s weights. The training split's
// are in the data's order, not a step's.
StatusOr<StageLogits> ComputeStageLogits(const StageRunRequest& request,
                                         const std::filesystem::path& checkpoint, int64_t examples,
                                         Split split = Split::kEval);

}  // namespace engine
