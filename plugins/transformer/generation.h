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

// Fails when a prompt of `prompt_length` tokens and max_new_tokens exceed the model's
// max_position_embeddings.
Status CheckGenerationLength(const CausalLm& lm, int64_t prompt_length,
                             const GenerationOptions& options);

// The decoding loop after a prompt: `hidden` holds the prompt's final hidden states (its last
// position predicts the first new token), `cache` its keys and values, `inputs` its attention mask.
// New tokens take positions from the mask (undefined `next_positions`) or, for multimodal rotary
// positions, next_positions (i64 [batch]) plus the step on all three axes.
at::Tensor ContinueDecoding(CausalLm& lm, at::Tensor hidden, KvCache* cache, DecoderInputs inputs,
                            const at::Tensor& next_positions, const GenerationOptions& options);

// One token per row from f32 logits [batch, vocab], as `options` says (greedy when temperature is
// 0), drawing from `generator`.
at::Tensor SampleNextTokens(const at::Tensor& logits, const GenerationOptions& options,
                            at::Generator& generator);

}  // namespace engine::transformer
