// Which tensors a stage's checkpoints hold: every tensor of the model (self-contained), or only
// what the stage changes, over a frozen base that every reader rebuilds from the model's
// `pretrained` directory (slim; checkpoint/frozen_base.h records and checks that base).
//
// A QLoRA stage of a 1.1B model trains 1.7 MB of adapters over a 700 MB 4-bit base that its model
// build makes again, bit for bit, from the same directory with the same loader, quantizer,
// precision and seed: writing that base at every checkpoint is the cost slim checkpoints remove.
// The layout is decided from the pipeline's configuration alone, before anything is built, so that
// `engine check` prints it and the stage's fingerprint includes it. A stage writes slim
// checkpoints only when every reader builds the same base: its own resume, eval, generate and
// export (the same stage), and each `from_stage` child, which must read the same directory with
// the same recipe and attach (not merge) the adapters.
//
// Pure functions of the resolved pipeline; any thread.
#pragma once

#include <string>

#include "pipeline/resolved_pipeline.h"

namespace engine {

struct CheckpointLayout {
  bool slim = false;
  // Why, for the plan: "only what it trains; its frozen base is rebuilt from DIR", or the reason
  // it holds every tensor.
  std::string reason;
  // Whether the stage's model reads a `pretrained` directory (the plan says the layout then).
  bool pretrained = false;
};

// How the stage makes its base from its `pretrained` directory: the model, quantizer and precision
// plugins with versions and options, and the seed. Stages with equal recipes over equal files
// build equal base tensors.
std::string BaseRecipe(const ResolvedStage& stage);

CheckpointLayout PlanCheckpointLayout(const ResolvedPipeline& pipeline, const ResolvedStage& stage);

}  // namespace engine
