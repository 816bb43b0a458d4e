#include "plan_only_weights.h"

#include <ATen/core/grad_mode.h>

#include "engine/linear.h"

namespace engine::transformer {

Status DrawQuantizedLayersOnly(torch::nn::Module& root, const ModelContext& context,
                               double initializer_range) {
  if (!context.quantizes || !context.linear_loaded) return Status::Ok();
  at::NoGradGuard no_grad;
  for (const auto& [name, layer] : NamedLinears(root)) {
    if (!context.quantizes(name)) continue;
    layer->weight.normal_(0.0, initializer_range);
    ENGINE_RETURN_IF_ERROR(context.linear_loaded(name, *layer));
  }
  return Status::Ok();
}

}  // namespace engine::transformer
