// Made-up inputs for conformance checks: a data spec many model loaders accept, batches that follow
// a spec, and the events of a short run.
#pragma once

#include <vector>

#include "engine/callback.h"
#include "engine/data.h"

namespace engine::conformance {

// features f32[8]; labels i64[] (3 classes); input_ids i64[16] (64 classes); pixel_values
// f32[3,8,8].
DataSpec SyntheticDataSpec();

// `batch_size` examples following `spec` (random values, class ids below num_classes; variable
// dimensions of 16), from a fixed seed.
Batch SyntheticBatch(const DataSpec& spec, int64_t batch_size);

// pipeline_begin, stage_begin, five step_end, eval, checkpoint_saved, stage_end, error,
// pipeline_end.
std::vector<Event> SyntheticEvents();

}  // namespace engine::conformance
