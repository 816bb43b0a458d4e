#include "generation.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace engine::transformer {
namespace {

// Keeps the smallest set of most likely tokens whose probability reaches top_p (always the most
// likely one); the others get -inf.
at::Tensor KeepTopP(const at::Tensor& logits, double top_p) {
  const auto [sorted, order] = logits.sort(-1, /*descending=*/true);
  const at::Tensor probs = at::softmax(sorted, -1);
  const at::Tensor before = probs.cumsum(-1) - probs;  // the mass of the more likely tokens
  const at::Tensor dropped_sorted = before.ge(top_p);
  const at::Tensor dropped = at::zeros_like(dropped_sorted).scatter(-1, order, dropped_sorted);
  return logits.masked_fill(dropped, -std::numeric_limits<float>::infinity());
}

}  // namespace

at::Tensor SampleNextTokens(const at::Tensor& logits, const GenerationOptions& options,
                            at::Generator& generator) {
  if (options.temperature <= 0) return logits.argmax(-1);
  at::Tensor scaled = logits / options.temperature;
  if (options.top_k > 0 && options.top_k < scaled.size(-1)) {
    const at::Tensor kth =
        std::get<0>(scaled.topk(options.top_k, -1)).narrow(-1, options.top_k - 1, 1);
    scaled = scaled.masked_fill(scaled.lt(kth), -std::numeric_limits<float>::infinity());
  }
  if (options.top_p < 1) scaled = KeepTopP(scaled, options.top_p);
  return at::multinomial(at::softmax(scaled, -1), 1, /*replacement=*/false, generator).squeeze(1);
}

Status CheckGenerationLength(const CausalLm& lm, int64_t prompt_length,
                             const GenerationOptions& options) {
  const int64_t positions = lm.model->config().max_position_embeddings;
  if (prompt_length + options.max_new_tokens > positions) {
    return InvalidArgumentError("the prompt is " + std::to_string(prompt_length) + " tokens and " +
                                std::to_string(options.max_new_tokens) +
                                " new ones were asked for, beyond the model's " +
                                std::to_string(positions) + " positions");
  }
  return Status::Ok();
}

at::Tensor ContinueDecoding(CausalLm& lm, at::Tensor hidden, KvCache* cache, DecoderInputs inputs,
                            const at::Tensor& next_positions, const GenerationOptions& options) {
  at::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const int64_t rows = hidden.size(0);
  const at::Device device = hidden.device();
  const at::Tensor stops =
      at::tensor(options.stop_ids, at::TensorOptions().dtype(at::kLong)).to(device);
  at::Tensor finished = at::zeros({rows}, at::TensorOptions().dtype(at::kBool).device(device));
  at::Tensor last;
  std::vector<at::Tensor> generated;
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const at::Tensor logits = lm.Logits(hidden.select(1, hidden.size(1) - 1)).to(at::kFloat);
    at::Tensor next = SampleNextTokens(logits.cpu(), options, generator).to(device);
    if (last.defined()) next = at::where(finished, last, next);
    generated.push_back(next);
    if (options.on_step) options.on_step(next);
    if (stops.numel() > 0) finished = finished.logical_or(at::isin(next, stops));
    last = next;
    if (step + 1 == options.max_new_tokens || finished.all().item<bool>()) break;
    inputs.offset = inputs.attention_mask.size(1);
    inputs.attention_mask =
        at::cat({inputs.attention_mask, at::ones({rows, 1}, inputs.attention_mask.options())}, 1);
    if (next_positions.defined()) {
      // The same position on the three rotary axes, counting on from the prompt's.
      inputs.position_ids = (next_positions + step).view({1, rows, 1}).expand({3, rows, 1});
    }
    hidden = lm.model->Forward(lm.model->Embed(next.unsqueeze(1)), inputs, cache);
  }
  return at::stack(generated, 1);
}

StatusOr<at::Tensor> GenerateText(CausalLm& lm, const at::Tensor& ids,
                                  const at::Tensor& attention_mask,
                                  const GenerationOptions& options) {
  ENGINE_RETURN_IF_ERROR(CheckGenerationLength(lm, ids.size(1), options));
  at::NoGradGuard no_grad;
  KvCache cache;
  DecoderInputs inputs;
  inputs.attention_mask = attention_mask;
  const at::Tensor hidden = lm.model->Forward(lm.model->Embed(ids), inputs, &cache);
  return ContinueDecoding(lm, hidden, &cache, inputs, at::Tensor(), options);
}

}  // namespace engine::transformer
