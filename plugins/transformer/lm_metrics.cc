#include "lm_metrics.h"

#include <ATen/ATen.h>

#include "lm_head_loss.h"

namespace engine::transformer {

at::Tensor WithoutContext(const at::Tensor& attention_mask) {
  const at::Tensor before =
      at::cat({at::zeros({attention_mask.size(0), 1}, attention_mask.options()),
               attention_mask.narrow(1, 0, attention_mask.size(1) - 1)},
              1);
  return attention_mask.eq(0).logical_or(before.ne(attention_mask));
}

StatusOr<BatchTokens> TokensOf(const Batch& batch, bool token_labels) {
  auto ids = batch.find("input_ids");
  if (ids == batch.end()) return InvalidArgumentError("the batch has no 'input_ids'");
  auto labels = token_labels ? batch.find("labels") : batch.end();
  BatchTokens tokens{ids->second, labels != batch.end() ? labels->second : ids->second, {}};
  if (auto mask = batch.find("attention_mask"); mask != batch.end()) {
    tokens.attention_mask = mask->second;
    tokens.targets = tokens.targets.masked_fill(WithoutContext(mask->second), kIgnoreIndex);
  }
  return tokens;
}

namespace {

// In evaluation: perplexity, token accuracy and eos accuracy of the next-token `predicted` ids
// ([n]) against `targets` ([n], kIgnoreIndex where nothing is predicted).
void NextTokenMetrics(double mean_loss, int64_t count, const at::Tensor& predicted,
                      const at::Tensor& targets, int64_t eos_id, ModelOutput* out) {
  const at::Tensor counted = targets.ne(kIgnoreIndex);
  out->metrics["perplexity"] = {mean_loss * static_cast<double>(count), static_cast<double>(count),
                                true};
  const at::Tensor hits = predicted.eq(targets) & counted;
  out->metrics["token_accuracy"] = {hits.sum().item<double>(), static_cast<double>(count)};
  if (eos_id >= 0) {
    // Every batch reports it, with a zero count when it holds no eos target, so that the metrics
    // of all batches and ranks have the same names.
    const at::Tensor stops = targets.eq(eos_id);
    out->metrics["eos_accuracy"] = {(hits & stops).sum().item<double>(),
                                    stops.sum().item<double>()};
  }
}

}  // namespace

at::Tensor NextTokenPredictions(const at::Tensor& logits) {
  return logits.narrow(1, 0, logits.size(1) - 1).argmax(-1);
}

void ScoreCausalLm(CausalLm& lm, const at::Tensor& hidden, const BatchTokens& tokens,
                   bool evaluating, bool answers, int64_t eos_id, ModelOutput* out) {
  const at::Tensor weight = lm.DenseHeadWeight();
  if (!weight.defined()) {
    const at::Tensor logits = lm.Logits(hidden);
    CausalLmLoss(logits, tokens.targets, evaluating, out, eos_id);
    if (evaluating && answers) {
      TeacherForcedExactMatch(NextTokenPredictions(logits), tokens.targets, tokens.attention_mask,
                              out);
    }
    return;
  }
  const int64_t rows = hidden.size(0), positions = hidden.size(1) - 1;
  const at::Tensor targets = tokens.targets.narrow(1, 1, positions).reshape({-1});
  const HeadLoss scored = ChunkedHeadCrossEntropy(
      hidden.narrow(1, 0, positions).reshape({-1, hidden.size(2)}), weight, targets, kIgnoreIndex,
      /*predictions=*/evaluating);
  out->loss = scored.loss;
  if (!evaluating) {
    out->loss_count_tensor = scored.count;  // read by the trainer with its step's scalars
    return;
  }
  out->loss_count = scored.count.item<int64_t>();
  if (out->loss_count == 0) return;
  NextTokenMetrics(scored.loss.item<double>(), out->loss_count, scored.predicted, targets, eos_id,
                   out);
  if (answers) {
    TeacherForcedExactMatch(scored.predicted.view({rows, positions}), tokens.targets,
                            tokens.attention_mask, out);
  }
}

void CausalLmLoss(const at::Tensor& logits, const at::Tensor& labels, bool evaluating,
                  ModelOutput* out, int64_t eos_id) {
  const int64_t vocab = logits.size(-1);
  const at::Tensor predicted = logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, vocab});
  const at::Tensor targets = labels.narrow(1, 1, labels.size(1) - 1).reshape({-1});
  const at::Tensor count = targets.ne(kIgnoreIndex).sum();
  // The sum over the count (at least 1, so no target gives a zero tied to the logits) is the mean
  // cross_entropy computes, without reading the count here.
  out->loss = at::cross_entropy_loss(predicted.to(at::kFloat), targets, {}, at::Reduction::Sum,
                                     kIgnoreIndex) /
              count.clamp_min(1).to(at::kFloat);
  if (!evaluating) {
    out->loss_count_tensor = count;
    return;
  }
  out->loss_count = count.item<int64_t>();
  if (out->loss_count == 0) return;
  NextTokenMetrics(out->loss.item<double>(), out->loss_count, predicted.argmax(-1), targets, eos_id,
                   out);
}

void ExactMatch(const at::Tensor& generated, const at::Tensor& answers, int64_t eos_id,
                ModelOutput* out) {
  const at::Tensor g = generated.cpu();
  const at::Tensor a = answers.cpu();
  double matches = 0;
  for (int64_t row = 0; row < g.size(0); ++row) {
    std::vector<int64_t> produced, expected;
    for (int64_t i = 0; i < g.size(1); ++i) {
      const int64_t id = g[row][i].item<int64_t>();
      if (id == eos_id) break;
      produced.push_back(id);
    }
    for (int64_t i = 0; i < a.size(1); ++i) {
      const int64_t id = a[row][i].item<int64_t>();
      if (id == kIgnoreIndex || id == eos_id) break;
      expected.push_back(id);
    }
    matches += produced == expected ? 1 : 0;
  }
  out->metrics["exact_match"] = {matches, static_cast<double>(g.size(0))};
}

void TeacherForcedExactMatch(const at::Tensor& predicted, const at::Tensor& labels,
                             const at::Tensor& attention_mask, ModelOutput* out) {
  const int64_t rows = predicted.size(0), positions = predicted.size(1);
  const at::Tensor targets = labels.narrow(1, 1, positions);
  const at::Tensor counted = targets.ne(kIgnoreIndex);
  const at::Tensor wrong = predicted.ne(targets) & counted;
  // One slot per (row, example of the row); unpacked rows have one example each.
  at::Tensor example = at::zeros_like(targets);
  int64_t per_row = 1;
  if (attention_mask.defined()) {
    example = attention_mask.narrow(1, 1, positions).to(at::kLong);
    per_row = example.max().item<int64_t>() + 1;
  }
  const at::Tensor slot =
      (at::arange(rows, targets.options()).unsqueeze(1) * per_row + example).flatten();
  auto per_example = [&](const at::Tensor& flags) {
    return at::zeros({rows * per_row}, targets.options())
        .index_add_(0, slot, flags.to(at::kLong).flatten());
  };
  const at::Tensor answered = per_example(counted).gt(0);
  const at::Tensor right = answered & per_example(wrong).eq(0);
  out->metrics["exact_match"] = {right.sum().item<double>(), answered.sum().item<double>()};
}

bool GeneratesAnswers(const Batch& batch) {
  return batch.count("prompt_length") > 0 && batch.count("answer_ids") > 0 &&
         batch.count("input_ids") > 0;
}

Status ScoreGeneratedAnswers(CausalLm& lm, const at::Tensor& image_prefix, const Batch& batch,
                             int64_t eos_id, ModelOutput* out) {
  if (!GeneratesAnswers(batch)) return Status::Ok();
  auto prompt_length = batch.find("prompt_length");
  auto answers = batch.find("answer_ids");
  auto ids = batch.find("input_ids");
  const at::Tensor lengths = prompt_length->second;
  const int64_t length = lengths.numel() > 0 ? lengths.min().item<int64_t>() : 0;
  if (lengths.numel() == 0 || lengths.max().item<int64_t>() != length || length <= 0 ||
      length > ids->second.size(1)) {
    return InvalidArgumentError(
        "'prompt_length' must be one positive value for the whole batch, at most the length of "
        "'input_ids'");
  }
  at::Tensor prefix = lm.model->Embed(ids->second.narrow(1, 0, length));
  if (image_prefix.defined()) prefix = at::cat({image_prefix.to(prefix.scalar_type()), prefix}, 1);
  const at::Tensor generated =
      lm.Generate(prefix, answers->second.size(1), eos_id, /*use_cache=*/true);
  ExactMatch(generated, answers->second, eos_id, out);
  return Status::Ok();
}

}  // namespace engine::transformer
