// The loss and evaluation metrics of causal language models.
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/data.h"
#include "engine/model.h"
#include "llama_modules.h"

namespace engine::transformer {

// Token ids at positions whose label is this are not predicted.
inline constexpr int64_t kIgnoreIndex = -100;

// Targets that must not be predicted in a padded or packed batch ([batch, positions], true where
// not): padding, and the first token of each example (the position before it is padding or
// another packed example, so nothing of its own precedes it; alone, it is never a target).
at::Tensor WithoutContext(const at::Tensor& attention_mask);

// A batch's token ids and what a causal LM predicts from them: "labels" when `token_labels`
// (input_ids otherwise), without the targets WithoutContext names, and the attention mask
// (undefined when the batch has none). An error when the batch has no input_ids.
struct BatchTokens {
  at::Tensor ids, targets, attention_mask;
};
StatusOr<BatchTokens> TokensOf(const Batch& batch, bool token_labels);

// The next-token loss of the model's final `hidden` states ([batch, positions, hidden]) and, in
// evaluation, CausalLmLoss's metrics and, when the labels mark answers (`answers`),
// TeacherForcedExactMatch. A dense head scores chunk by chunk without building the logits
// (lm_head_loss.h); a quantized head or one with adapters goes through lm.Logits.
void ScoreCausalLm(CausalLm& lm, const at::Tensor& hidden, const BatchTokens& tokens,
                   bool evaluating, bool answers, int64_t eos_id, ModelOutput* out);

// The argmax id at every position but the last ([batch, positions - 1]): each position's
// prediction of the next token.
at::Tensor NextTokenPredictions(const at::Tensor& logits);

// Next-token cross-entropy: logits [batch, positions, vocab] at position t predict labels at t + 1.
// Fills loss (the mean over predicted tokens) and, in training, loss_count_tensor (the count stays
// on the device; the trainer reads it with its step's scalars), in evaluation loss_count and also
// "perplexity"
// (exp of the mean negative log-likelihood), "token_accuracy" and, with an `eos_id` (the data's
// end of sequence: a chat template's end-of-turn token), "eos_accuracy": the share of the targets
// that are eos which the model predicts (argmax), i.e. how often it would stop where the text
// stops. A model that never learns it never stops generating.
void CausalLmLoss(const at::Tensor& logits, const at::Tensor& labels, bool evaluating,
                  ModelOutput* out, int64_t eos_id = -1);

// Rows of `generated` ([batch, n], stopping at eos) that equal `answers` ([batch, m], padded with
// kIgnoreIndex, possibly ending in eos), as an "exact_match" metric.
void ExactMatch(const at::Tensor& generated, const at::Tensor& answers, int64_t eos_id,
                ModelOutput* out);

// "exact_match" without generating: the share of examples with labels whose every labelled token
// (an answer and its end of turn) is the model's argmax given the tokens before it. Greedy
// decoding reproduces an example's answers exactly if and only if that holds (each step then
// sees the same tokens as teacher forcing), so this is the exact match of greedy generation at
// the cost of one forward. Examples are rows, or the numbered examples of packed rows when
// `attention_mask` (undefined: none) numbers them.
// `predicted`: NextTokenPredictions of the logits, [batch, positions - 1].
void TeacherForcedExactMatch(const at::Tensor& predicted, const at::Tensor& labels,
                             const at::Tensor& attention_mask, ModelOutput* out);

// When `batch` holds "prompt_length" and "answer_ids" (as digits_captions makes them): greedy
// generation (with the KV cache) after `image_prefix` (embeddings, or undefined) and the first
// prompt_length input_ids, scored by ExactMatch. Otherwise does nothing.
Status ScoreGeneratedAnswers(CausalLm& lm, const at::Tensor& image_prefix, const Batch& batch,
                             int64_t eos_id, ModelOutput* out);
// Whether ScoreGeneratedAnswers generates for `batch` (token by token, outside RunBlock).
bool GeneratesAnswers(const Batch& batch);

}  // namespace engine::transformer
