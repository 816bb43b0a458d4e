// The random initialisation of a model that the engine only plans (ModelContext::plan_only):
// built under UninitializedParametersScope, it draws only the weights of the
// layers its stage quantizes, each handed to linear_loaded as soon as it is drawn, so that
// planning a 7B model holds its 4-bit layers and little else. Nothing reads the other values.
//
// Call from the loader's thread, on a model built under UninitializedParametersScope and not
// initialised otherwise. An error is linear_loaded's, for the loader to return.
#pragma once

#include <torch/nn/module.h>

#include "engine/model.h"
#include "engine/status.h"

namespace engine::transformer {

// Each engine::Linear of `root` that context.quantizes selects (by its full name, as the stage
// sees it) gets a weight drawn from N(0, initializer_range^2), then goes to context.linear_loaded.
// Does nothing without both.
Status DrawQuantizedLayersOnly(torch::nn::Module& root, const ModelContext& context,
                               double initializer_range);

}  // namespace engine::transformer
