// What `engine generate` asks of a model that continues text: an optional interface a Model may
// also implement (the engine finds it with dynamic_cast, so models that cannot generate need
// nothing, and the Model interface stays as plugins were built against it).
//
//   if (auto* generator = dynamic_cast<TextGenerator*>(&model)) {
//     ENGINE_ASSIGN_OR_RETURN(at::Tensor new_ids, generator->Generate(ids, mask, options));
//   }
//
// The model is in eval mode and inside the stage's precision context when this is called, on the
// caller's thread. Errors are values naming what was wrong (a prompt longer than the model's
// positions, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/data.h"
#include "engine/status.h"

namespace engine {

struct GenerationOptions {
  int64_t max_new_tokens = 128;
  // 0: greedy (the most likely token). Otherwise the logits are divided by it and sampled, after
  // keeping the top_k most likely tokens (0: all) and the smallest set whose probability reaches
  // top_p (1: all).
  double temperature = 0;
  int64_t top_k = 0;
  double top_p = 1;
  uint64_t seed = 0;
  // Any of these ends a row; it is the row's last new token.
  std::vector<int64_t> stop_ids;
  // Called after every step with that step's new token of every row (i64 [batch]); rows that have
  // stopped repeat their stop id.
  std::function<void(const at::Tensor&)> on_step;
};

class TextGenerator {
 public:
  virtual ~TextGenerator() = default;
  // ids: i64 [batch, length], padded on the left; attention_mask: the same shape, 1 for real
  // tokens. Returns the new ids, i64 [batch, steps taken] (after a row's stop id, its stop id
  // again).
  virtual StatusOr<at::Tensor> Generate(const at::Tensor& ids, const at::Tensor& attention_mask,
                                        const GenerationOptions& options) = 0;
};

// The same for a model that also reads images (a vision-language model): `images` holds each
// prompt row's images as engine/image_batch.h lays them out ("pixel_values", "image_grid_thw", on
// the model's device), their image tokens already in `ids` (engine/image_tokens.h).
class ImageTextGenerator {
 public:
  virtual ~ImageTextGenerator() = default;
  virtual StatusOr<at::Tensor> GenerateWithImages(const at::Tensor& ids,
                                                  const at::Tensor& attention_mask,
                                                  const Batch& images,
                                                  const GenerationOptions& options) = 0;
};

}  // namespace engine
