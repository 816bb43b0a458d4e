#include "train/stage_optimizer.h"

#include <utility>
#include <vector>

#include "core/allocator.h"
#include "dist/gradient_averager.h"
#include "dist/gradient_reduce_scatter.h"
#include "train/sharded_optimizer.h"

namespace engine {

StatusOr<StageOptimizer> MakeStageOptimizer(const StagePlan& plan, const proto::Optimizer& config,
                                            PrecisionRuntime& runtime, DataParallel* group) {
  StageOptimizer made;
  if (!plan.shards_optimizer()) {
    made.optimizer = MakeOptimizer(config, runtime.optimizer_parameters());
    if (plan.process_group) {
      made.gradient_sync =
          std::make_unique<GradientAverager>(group, runtime.parameters(), plan.bucket_bytes);
    }
    return made;
  }
  std::shared_ptr<const ShardLayout> layout;
  if (plan.shards_parameters()) {
    std::vector<NamedBlock> blocks;
    for (size_t b = 0; b < plan.blocks.size(); ++b) {
      blocks.push_back({plan.blocks[b], plan.block_modules[b]});
    }
    ENGINE_ASSIGN_OR_RETURN(made.parameter_shards,
                            ParameterShards::Make(group, runtime.optimizer_parameters(), blocks,
                                                  plan.shard_bucket_bytes));
    // The whole blocks every rank built were just let go: give them back before training
    // allocates its own, or glibc keeps them beside it (core/allocator.h).
    ReturnFreedMemory();
    layout = made.parameter_shards->layout();
  } else {
    ENGINE_ASSIGN_OR_RETURN(
        layout, LayOutShards(runtime.optimizer_parameters(), *group, plan.shard_bucket_bytes));
  }
  const bool in_parts = plan.shards_gradients();
  ENGINE_ASSIGN_OR_RETURN(
      made.optimizer,
      MakeShardedOptimizer(config, runtime.optimizer_parameters(), runtime.OptimizerMasterDtypes(),
                           group, layout,
                           in_parts ? ShardedGradients::kInParts : ShardedGradients::kWhole));
  if (!in_parts) {
    made.gradient_sync =
        std::make_unique<GradientAverager>(group, runtime.parameters(), plan.bucket_bytes);
    return made;
  }
  std::vector<at::Tensor> parts;
  std::vector<size_t> parameter_of;
  for (const ShardLayout::Part& part : layout->parts) {
    parts.push_back(part.view);
    parameter_of.push_back(part.parameter);
  }
  ENGINE_RETURN_IF_ERROR(runtime.HoldGradientsIn(std::move(parts), std::move(parameter_of)));
  made.gradient_sync =
      std::make_unique<GradientReduceScatter>(group, runtime.parameters(), std::move(layout));
  return made;
}

}  // namespace engine
