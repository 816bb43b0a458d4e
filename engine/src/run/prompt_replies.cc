#include "run/prompt_replies.h"

#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "engine/image_batch.h"

namespace engine {
namespace {

// The images and videos of prompts [begin, end) as the model reads them; an empty batch when none
// has any.
Batch BatchImages(const std::vector<Prompt>& prompts, size_t begin, size_t end,
                  const at::Device& device) {
  std::vector<ExampleImages> rows, video_rows;
  int64_t image_values = 0, video_values = 0;  // each kind's patch width (0: none)
  for (size_t i = begin; i < end; ++i) {
    rows.push_back(prompts[i].pixels);
    video_rows.push_back(prompts[i].video_pixels);
    if (prompts[i].pixels.patches.defined()) image_values = prompts[i].pixels.patches.size(-1);
    if (prompts[i].video_pixels.patches.defined()) {
      video_values = prompts[i].video_pixels.patches.size(-1);
    }
  }
  Batch images;
  if (image_values > 0) PackImages(rows, image_values, &images);
  if (video_values > 0) PackImages(video_rows, video_values, &images, kVideoFields);
  for (auto& [name, tensor] : images) tensor = tensor.to(device);
  return images;
}

// Rows [begin, end) of `encoded`, left-padded: the ids and their attention mask.
std::pair<at::Tensor, at::Tensor> LeftPadded(const std::vector<std::vector<int64_t>>& encoded,
                                             size_t begin, size_t end, int64_t pad) {
  size_t length = 0;
  for (size_t i = begin; i < end; ++i) length = std::max(length, encoded[i].size());
  const int64_t rows = static_cast<int64_t>(end - begin);
  at::Tensor ids = at::full({rows, static_cast<int64_t>(length)}, pad, at::kLong);
  at::Tensor mask = at::zeros({rows, static_cast<int64_t>(length)}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& row = encoded[begin + r];
    const int64_t offset = static_cast<int64_t>(length - row.size());
    ids[r].narrow(0, offset, row.size()).copy_(at::tensor(row, at::kLong));
    mask[r].narrow(0, offset, row.size()).fill_(1);
  }
  return {ids, mask};
}

// Each row of `generated` up to its first stop id, decoded.
std::vector<Reply> Decode(const at::Tensor& generated, const std::vector<int64_t>& stop_ids,
                          const Tokenizer& tokenizer) {
  std::vector<Reply> replies(generated.size(0));
  for (int64_t r = 0; r < generated.size(0); ++r) {
    for (int64_t t = 0; t < generated.size(1); ++t) {
      const int64_t id = generated[r][t].item<int64_t>();
      if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) {
        replies[r].stopped = true;
        break;
      }
      replies[r].ids.push_back(id);
    }
    replies[r].text = tokenizer.Decode(replies[r].ids);
  }
  return replies;
}

// The replies of prompts [begin, end): one batch.
StatusOr<std::vector<Reply>> GenerateBatch(Model& model, TextGenerator& generator,
                                           const GenerationSource& source,
                                           const std::vector<Prompt>& prompts,
                                           const std::vector<std::vector<int64_t>>& encoded,
                                           size_t begin, size_t end,
                                           const GenerationOptions& options) {
  at::Device device = at::kCPU;
  for (const at::Tensor& parameter : model.module().parameters()) {
    device = parameter.device();
    break;
  }
  auto [ids, mask] =
      LeftPadded(encoded, begin, end, std::max<int64_t>(source.tokenizer().pad_id(), 0));
  ids = ids.to(device);
  mask = mask.to(device);
  const Batch images = BatchImages(prompts, begin, end, device);
  at::Tensor generated;
  if (images.empty()) {
    ENGINE_ASSIGN_OR_RETURN(generated, generator.Generate(ids, mask, options));
  } else {
    auto* image_generator = dynamic_cast<ImageTextGenerator*>(&model);
    if (image_generator == nullptr) {
      return FailedPreconditionError("the model (" + model.architecture() +
                                     ") cannot read images: it does not implement "
                                     "engine::ImageTextGenerator");
    }
    ENGINE_ASSIGN_OR_RETURN(generated,
                            image_generator->GenerateWithImages(ids, mask, images, options));
  }
  return Decode(generated.cpu(), options.stop_ids, source.tokenizer());
}

}  // namespace

StatusOr<std::vector<Reply>> GenerateReplies(Model& model, const GenerationSource& source,
                                             const std::vector<Prompt>& prompts,
                                             const std::vector<std::vector<int64_t>>& encoded,
                                             GenerationOptions options, int64_t batch_size) {
  auto* generator = dynamic_cast<TextGenerator*>(&model);
  if (generator == nullptr) {
    return FailedPreconditionError("the model (" + model.architecture() +
                                   ") cannot generate text: it does not implement "
                                   "engine::TextGenerator");
  }
  options.stop_ids = source.stop_ids();
  std::vector<Reply> replies;
  for (size_t begin = 0; begin < encoded.size(); begin += batch_size) {
    const size_t end = std::min(encoded.size(), begin + static_cast<size_t>(batch_size));
    StatusOr<std::vector<Reply>> batch =
        GenerateBatch(model, *generator, source, prompts, encoded, begin, end, options);
    if (!batch.ok() && encoded.size() > 1) {
      return batch.status().WithContext("prompts " + std::to_string(begin + 1) + "-" +
                                        std::to_string(end));
    }
    if (!batch.ok()) return batch.status();
    replies.insert(replies.end(), batch->begin(), batch->end());
  }
  return replies;
}

}  // namespace engine
