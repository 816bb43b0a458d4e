// The learning rate for each optimizer step, from a stage's `optimizer` settings.
#pragma once

#include <cstdint>

#include "engine/pipeline.pb.h"

namespace engine {

// The rate for the update with 0-based index `step` of `total_steps`. Warm-up rises linearly and
// reaches the full rate at step warmup_steps - 1; the cosine reaches min_lr_ratio x the rate at the
// last step.
double LearningRateAt(const proto::Optimizer& optimizer, int64_t step, int64_t total_steps);

}  // namespace engine
