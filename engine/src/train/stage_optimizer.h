// A stage's optimizer and, in a process group, what brings the ranks' gradients together, chosen
// by the plan's strategy: the plain optimizer with DDP's averager (dist/gradient_averager.h), or a
// sharded stage's optimizer on its layout (train/sharded_optimizer.h) with the averager (level 1)
// or the reduce-scatter that leaves each rank its parts of the gradients (level 2,
// dist/gradient_reduce_scatter.h), which the precision runtime is then told to read; at level 3
// the same, on the layout of the parameter shards (dist/parameter_shards.h) of the model's blocks.
//
// Ownership: the optimizer and the sync borrow `group` and the runtime's parameters, which must
// outlive them. Training thread only. Errors name the parameter that cannot be sharded.
#pragma once

#include <memory>

#include "dist/data_parallel.h"
#include "dist/gradient_sync.h"
#include "dist/parameter_shards.h"
#include "engine/status.h"
#include "plan/pipeline_plan.h"
#include "train/optimizer.h"
#include "train/precision_runtime.h"

namespace engine {

struct StageOptimizer {
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GradientSync> gradient_sync;  // null without a process group
  // At shard_level 3: the blocks' parameters, kept in parts (to be installed as the block runner
  // while the model runs); null otherwise.
  std::unique_ptr<ParameterShards> parameter_shards;
};

// `group`: the stage's process group, or null without one. `runtime` was applied with
// MasterHolder::kOptimizer where plan.shards_optimizer().
StatusOr<StageOptimizer> MakeStageOptimizer(const StagePlan& plan, const proto::Optimizer& config,
                                            PrecisionRuntime& runtime, DataParallel* group);

}  // namespace engine
