#include "engine_kernels/cross_entropy_rows.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_kernel_support.h"

namespace engine::kernels {
namespace {

#define ENGINE_KERNEL_TILES "cross_entropy_rows_tiles.inc"
#include "per_isa.inc"

// The first index of the row's largest value, a NaN counting as largest (at::argmax).
int64_t ArgMax(const float* x, int64_t n, float max) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == max) return i;
  }
  return 0;
}

// A row with a NaN or an infinite maximum, in IEEE arithmetic as ATen's logsumexp and exp: its
// log-sum-exp, and the row turned into exp(x - lse) when `gradient`.
float NonFiniteRow(float* x, int64_t n, float max, bool gradient) {
  const float shift = std::isinf(max) ? 0.0f : max;  // NaN stays NaN
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - shift);
  const float lse = std::log(sum) + shift;
  if (gradient) {
    for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i] - lse);
  }
  return lse;
}

}  // namespace

bool CrossEntropyRowsSupports(const at::Tensor& logits, const at::Tensor& targets) {
  return logits.device().is_cpu() && logits.dim() == 2 && logits.is_contiguous() &&
         IsLowOrF32(logits.scalar_type()) && logits.size(1) > 0 && targets.device().is_cpu() &&
         targets.dim() == 1 && targets.scalar_type() == at::kLong &&
         targets.size(0) == logits.size(0);
}

CrossEntropyRowsResult CrossEntropyRows(const at::Tensor& logits, const at::Tensor& targets,
                                        bool argmax, std::optional<float> gradient_scale) {
  TORCH_CHECK(CrossEntropyRowsSupports(logits, targets),
              "cross-entropy rows: logits must be [n, vocab] contiguous f32/bf16/f16 and targets "
              "int64 [n], both on the CPU; got ",
              logits.sizes(), " ", logits.scalar_type(), " and ", targets.sizes(), " ",
              targets.scalar_type());
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const at::Tensor t = targets.contiguous();
  const int64_t* target = t.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(target[r] >= 0 && target[r] < vocab, "cross-entropy rows: target ", target[r],
                " of row ", r, " is outside the vocabulary of ", vocab);
  }
  CrossEntropyRowsResult result;
  result.loss = at::empty({rows}, logits.options().dtype(at::kFloat));
  if (argmax) result.argmax = at::empty({rows}, targets.options());
  float* loss = result.loss.data_ptr<float>();
  int64_t* best = argmax ? result.argmax.data_ptr<int64_t>() : nullptr;
  const bool gradient = gradient_scale.has_value();
  const float scale = gradient_scale.value_or(1.0f);
  const auto row_max = ENGINE_PICK_ISA(RowMax);
  const auto sum_exp = ENGINE_PICK_ISA(SumExp);
  const auto exp_shifted = ENGINE_PICK_ISA(ExpShifted);
  const auto scale_row = ENGINE_PICK_ISA(Scale);
  at::parallel_for(0, rows, GrainFor(vocab), [&](int64_t begin, int64_t end) {
    // One row in f32 (in place for f32 logits): 600 KB for 151,936 classes, in L2 for the passes.
    std::vector<float> scratch(logits.scalar_type() == at::kFloat ? 0 : vocab);
    for (int64_t r = begin; r < end; ++r) {
      float* x = const_cast<float*>(ReadF32(logits, r * vocab, vocab, scratch.data()));
      bool non_finite = false;
      const float max = row_max(x, vocab, &non_finite);
      if (best != nullptr) best[r] = ArgMax(x, vocab, max);
      const float picked = x[target[r]];  // before the row becomes its gradient
      const float lse = non_finite ? NonFiniteRow(x, vocab, max, gradient)
                                   : std::log(sum_exp(x, vocab, max)) + max;
      loss[r] = lse - picked;
      if (!gradient) continue;
      if (!non_finite) exp_shifted(x, vocab, lse);
      x[target[r]] -= 1.0f;
      scale_row(x, vocab, scale);
      CommitF32(x, logits, r * vocab, vocab);
    }
  });
  return result;
}

}  // namespace engine::kernels
