// Continuing left-padded prompts with a decoder: the KV cache, greedy or sampled tokens, stop ids
// (engine/text_generator.h is the contract; the `llama` model implements it with this).
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/status.h"
#include "engine/text_generator.h"
#include "llama_modules.h"

namespace engine::transformer {

// The new ids, i64 [batch, steps taken]. Fails when a prompt and max_new_tokens exceed the
// model's max_position_embeddings.
StatusOr<at::Tensor> GenerateText(CausalLm& lm, const at::Tensor& ids,
                                  const at::Tensor& attention_mask,
                                  const GenerationOptions& options);

// One token per row from f32 logits [batch, vocab], as `options` says (greedy when temperature is
// 0), drawing from `generator`.
at::Tensor SampleNextTokens(const at::Tensor& logits, const GenerationOptions& options,
                            at::Generator& generator);

}  // namespace engine::transformer
