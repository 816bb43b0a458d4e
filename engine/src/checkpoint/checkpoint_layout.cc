#include "checkpoint/checkpoint_layout.h"

#include "core/fingerprint.h"
#include "pipeline/pretrained_dir.h"

namespace engine {
namespace {

std::string PluginText(const char* role, const ResolvedPluginRef& ref) {
  if (ref.entry == nullptr) return std::string(role) + ": none";
  return std::string(role) + ": " + ref.entry->name + "@" + ref.entry->version + " {" +
         CanonicalText(*ref.options) + "}";
}

// Why `child` cannot rebuild `parent`'s base itself; empty when it can.
std::string BaseMismatch(const ResolvedPipeline& pipeline, const ResolvedStage& parent,
                         const ResolvedStage& child) {
  if (child.config->parent_adapters() == proto::Stage::MERGE) {
    return "stage '" + child.name + "' merges its adapters into the base weights";
  }
  if (StagePretrainedDir(child, pipeline.base_dir) !=
      StagePretrainedDir(parent, pipeline.base_dir)) {
    return "stage '" + child.name + "' reads another `pretrained` directory";
  }
  if (BaseRecipe(child) != BaseRecipe(parent)) {
    return "stage '" + child.name +
           "' builds its base another way (its model, quantizer, precision or seed differ)";
  }
  return "";
}

// Why the stage's checkpoints must hold every tensor; empty when they need not.
std::string WhyEveryTensor(const ResolvedPipeline& pipeline, const ResolvedStage& stage,
                           const std::filesystem::path& pretrained) {
  if (stage.config->checkpoint().self_contained()) return "checkpoint.self_contained is set";
  if (pretrained.empty()) return "its model reads no `pretrained` directory";
  if (stage.from_stage) {
    const ResolvedStage& parent = pipeline.stages[static_cast<size_t>(*stage.from_stage)];
    if (!PlanCheckpointLayout(pipeline, parent).slim) {
      return "it starts from stage '" + parent.name + "', whose checkpoints hold every tensor";
    }
    if (std::string mismatch = BaseMismatch(pipeline, parent, stage); !mismatch.empty()) {
      return mismatch;
    }
  }
  for (const ResolvedStage& child : pipeline.stages) {
    if (child.from_stage != stage.index) continue;
    if (std::string mismatch = BaseMismatch(pipeline, stage, child); !mismatch.empty()) {
      return mismatch + ", so it starts from the whole model";
    }
  }
  return "";
}

}  // namespace

std::string BaseRecipe(const ResolvedStage& stage) {
  return PluginText("model", stage.model) + "; " + PluginText("quantizer", stage.quantizer) + "; " +
         PluginText("precision", stage.precision) + "; seed " + std::to_string(stage.seed);
}

CheckpointLayout PlanCheckpointLayout(const ResolvedPipeline& pipeline,
                                      const ResolvedStage& stage) {
  CheckpointLayout layout;
  const std::filesystem::path pretrained = StagePretrainedDir(stage, pipeline.base_dir);
  layout.pretrained = !pretrained.empty();
  const std::string why = WhyEveryTensor(pipeline, stage, pretrained);
  layout.slim = why.empty();
  layout.reason =
      layout.slim ? "only what it changes; the frozen base is rebuilt from " + pretrained.string()
                  : "every tensor: " + why;
  return layout;
}

}  // namespace engine
