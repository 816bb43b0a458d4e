// The model's replies to encoded prompts (run/generation_prompts.h): batch by batch, each batch
// left-padded with the tokenizer's pad id, continued by the model's TextGenerator (its
// ImageTextGenerator when a prompt of the batch has images) until one of the source's stop ids or
// max_new_tokens, and decoded.
//
// Failure: a model that cannot generate (or read images) is named by its architecture; an error in
// a batch names its prompts ("prompts 9-16"). Prints nothing: options.on_step sees every step.
// Use from one thread, inside GenerationSource::WithModel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/status.h"
#include "engine/text_generator.h"
#include "run/generation_prompts.h"
#include "run/generation_source.h"

namespace engine {

struct Reply {
  std::vector<int64_t> ids;  // without the stop id
  std::string text;
  bool stopped = false;  // ended by a stop id, not by max_new_tokens
};

// options.stop_ids is replaced by the source's.
StatusOr<std::vector<Reply>> GenerateReplies(Model& model, const GenerationSource& source,
                                             const std::vector<Prompt>& prompts,
                                             const std::vector<std::vector<int64_t>>& encoded,
                                             GenerationOptions options, int64_t batch_size);

}  // namespace engine
