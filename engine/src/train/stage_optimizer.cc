#include "train/stage_optimizer.h"

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dist/gradient_averager.h"
#include "dist/gradient_reduce_scatter.h"
#include "engine/model.h"
#include "train/sharded_optimizer.h"

namespace engine {
namespace {

// The modules the model names as its blocks, found by name in its module.
StatusOr<std::vector<NamedBlock>> BlocksOf(Model& model) {
  std::map<std::string, const torch::nn::Module*> modules;
  for (const auto& item : model.module().named_modules()) modules[item.key()] = item.value().get();
  std::vector<NamedBlock> blocks;
  for (const std::string& name : model.blocks()) {
    auto it = modules.find(name);
    if (it == modules.end()) {
      return FailedPreconditionError("the model names '" + name +
                                     "' among its blocks, and it has no module of that name");
    }
    blocks.push_back({name, it->second});
  }
  return blocks;
}

}  // namespace

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
    ENGINE_ASSIGN_OR_RETURN(const std::vector<NamedBlock> blocks, BlocksOf(*plan.model));
    ENGINE_ASSIGN_OR_RETURN(made.parameter_shards,
                            ParameterShards::Make(group, runtime.optimizer_parameters(), blocks,
                                                  plan.shard_bucket_bytes));
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
