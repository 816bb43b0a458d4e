// Cross-entropy of rows of logits against one target class each, fused for large vocabularies
// (CPU): each row is read once into f32 that stays in cache, and its log-sum-exp, loss term,
// argmax and, when asked, the gradient of its loss term come from there, the gradient written
// over the logits in their own dtype. With a vocabulary of 151,936 the chunked head loss ran
// logsumexp, gather, argmax, a subtraction, exp, a scatter, a product and two casts over each
// chunk's logits, ~17 passes over 100+ MB each and a fresh tensor per step (page faults included).
//
// Arithmetic (f32): the log-sum-exp is m + log(sum(exp(x - m))), m the row's max, as ATen's
// logsumexp computes it (m = 0 where the max is infinite); the exponentials are within 2 ulp of
// expf (vec8.inc), 0 below e^-87, sums in a fixed order (the same bits on any thread count). The
// gradient is (exp(x - lse) - [class == target]) * gradient_scale, rounded once into the logits'
// dtype. A row with a NaN or an infinity gets NaN or inf where ATen's expression would. argmax is
// the first maximum, a NaN counting as the maximum, as at::argmax.
//
// logits: [n, vocab] contiguous f32, bf16 or f16 on the CPU; targets: int64 [n], each in
// [0, vocab) (no ignored rows: callers pass the rows that count) (CrossEntropyRowsSupports);
// violations throw c10::Error. Parallel over rows through ATen's thread pool; AVX2/FMA where the
// CPU has them. No state is kept.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace engine::kernels {

struct CrossEntropyRowsResult {
  at::Tensor loss;    // f32 [n]: log-sum-exp of the row less its target's logit
  at::Tensor argmax;  // int64 [n] when asked for, else undefined
};

bool CrossEntropyRowsSupports(const at::Tensor& logits, const at::Tensor& targets);

// With `gradient_scale`, `logits` is overwritten by the gradient of each row's loss term times
// that scale (1 / the number of terms of a mean, say).
CrossEntropyRowsResult CrossEntropyRows(const at::Tensor& logits, const at::Tensor& targets,
                                        bool argmax, std::optional<float> gradient_scale);

}  // namespace engine::kernels
