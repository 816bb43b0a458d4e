// What `engine eval --logits` asks of a model: its logits on a batch, with the positions it used,
// so that any library can be run on the same inputs and compared with the engine. An optional
// interface a Model may also implement (the engine finds it with dynamic_cast, as it finds
// TextGenerator), so models without logits need nothing and the Model interface stays as plugins
// were built against it.
//
//   if (auto* logits_model = dynamic_cast<LogitsModel*>(&model)) {
//     ENGINE_ASSIGN_OR_RETURN(BatchLogits out, logits_model->Logits(batch));
//   }
//
// The model is in eval mode, without gradients, inside the stage's precision context when this is
// called, on the caller's thread. Errors are values naming what was wrong (image tokens that do not
// match the batch's images, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include "engine/data.h"
#include "engine/status.h"

namespace engine {

struct BatchLogits {
  // f32 [batch, positions, vocabulary]: the scores of the token after each position, before any
  // softmax, as the model's head computes them (in the stage's compute dtype, then widened).
  at::Tensor logits;
  // i64 [batch, positions], or [3, batch, positions] for multimodal rotary positions: the positions
  // the model gave the tokens (the batch's position_ids, or those it worked out from the mask and
  // the images).
  at::Tensor position_ids;
};

class LogitsModel {
 public:
  virtual ~LogitsModel() = default;
  // `batch`: one of the stage's batches as Forward reads it (on the model's device, but for the
  // model's host_fields, which may stay on the host).
  virtual StatusOr<BatchLogits> Logits(const Batch& batch) = 0;
};

}  // namespace engine
