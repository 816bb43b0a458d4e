// Next-token cross-entropy straight from the decoder's final hidden states and the LM head's
// weight, a chunk of rows at a time, so that the [tokens, vocab] logits never exist whole.
//
// With a real vocabulary (Qwen2's 151,936) the logits of one batch of 8 x 1024 tokens take 2.5 GB
// in bf16 and the f32 copy, log-softmax and gradient that cross_entropy builds take 5 GB each.
// Here each chunk's logits are computed, scored and turned into their gradient at once (softmax
// minus the target, over the count), multiplied back into the hidden states' and the weight's
// gradients, and dropped: the peak is a chunk of ~128 MiB. The arithmetic is what
// matmul + cross_entropy computes under the same precision (logits in the autocast dtype, scored
// in f32), summed in another order; lm_head_loss_test.cc holds it to the unchunked loss and
// gradients. On the CPU, where the targets cost nothing to read, only the rows whose target counts
// are multiplied out at all (a chat batch's prompts and padding are most of its rows); the others
// add nothing to the loss and get a zero gradient, there as in cross_entropy.
//
// The gradients are computed with the loss (in its forward) when grad mode is on and the inputs
// need them, and handed back, scaled in place by the loss's gradient, by the backward, which
// therefore runs once (a retained graph's second backward is an error). Thread-safe like any
// ATen op; errors are c10::Error.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace engine::transformer {

struct HeadLoss {
  at::Tensor loss;       // f32 scalar: the mean over targets other than `ignore_index`
  at::Tensor count;      // those targets, an int64 scalar on their device, never read here (a
                         // device synchronisation); with none the loss is a zero tied to the inputs
  at::Tensor predicted;  // [rows] argmax ids, when asked for; undefined otherwise. On the CPU
                         // rows whose target is ignored are not scored: ignore_index there
};

// hidden [rows, hidden], weight [vocab, hidden] (the head's dense weight, no bias), targets [rows]
// (ignore_index where nothing is predicted). `chunk_rows` 0: rows per chunk from a budget of
// ~128 MiB of f32 logits.
HeadLoss ChunkedHeadCrossEntropy(const at::Tensor& hidden, const at::Tensor& weight,
                                 const at::Tensor& targets, int64_t ignore_index, bool predictions,
                                 int64_t chunk_rows = 0);

}  // namespace engine::transformer
