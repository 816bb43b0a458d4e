// Which keys each query may attend to in a decoder: causal, optionally within a sliding window, and
// never to padding. Built once per forward for all layers of a kind (full or sliding).
//
// Positions here are indices in the sequence (padding included), as transformers' masks count them:
// query i of a forward whose first new token has index `offset` sits at offset + i and sees key j
// when j <= offset + i, j > offset + i - window (with a window), and key j is not padding.
//
// Packed rows: a padding mask may number the examples packed into a row 1, 2, 3, ... instead of
// holding ones (each example's tokens contiguous, 0 for padding). A token then sees only its own
// example's keys and positions restart at 0 with each example, so that each example computes what
// it would alone in its row.
#pragma once

#include <ATen/core/Tensor.h>

namespace engine::transformer {

// bool [batch or 1, 1, positions, offset + positions], true where attention is NOT allowed; an
// undefined tensor when nothing is masked (one new position, no window, no padding).
// `padding`: i64 or bool [batch, offset + positions], 1 (true) for real tokens; undefined: none.
at::Tensor BuildAttentionMask(const at::Tensor& padding, int64_t positions, int64_t offset,
                              int64_t window, const at::Device& device);

// The keys each query sees under `mask` (BuildAttentionMask's, no offset) as one range per query:
// int32 [batch, positions, 2] (first, end) on the CPU, (0, 0) for a query that sees none, for the
// attention kernel. Undefined when some query's keys are not one contiguous run (padding between
// real tokens), which the kernel cannot take.
at::Tensor KeyRanges(const at::Tensor& mask, int64_t batch);

// The positions of a padded batch's new tokens, i64 [batch, positions]: each row counts its own
// real tokens (cumsum(mask) - 1, 0 at padding), so that a left-padded row computes what it would
// unpadded. Undefined `padding`: offset, offset + 1, ... for every row ([1, positions]).
at::Tensor PositionIds(const at::Tensor& padding, int64_t positions, int64_t offset,
                       const at::Device& device);

}  // namespace engine::transformer
