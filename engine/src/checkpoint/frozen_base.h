// The frozen base a slim checkpoint leaves out (checkpoint/checkpoint_layout.h): what it is, which
// of the model's tensors belong to it, and whether the base a reader builds now is the one the
// checkpoint was trained on.
//
// A base is named by its `pretrained` directory's files (config.json, the weights and their index,
// with sizes and XXH3 content hashes) and the recipe that turns them into tensors (BaseRecipe).
// Describing a base hashes those files: about a second for a 2 GB checkpoint from the page cache,
// so a stage describes its own once. Any thread; errors name the directory or file.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "engine/checkpoint.pb.h"
#include "engine/status.h"
#include "pipeline/resolved_pipeline.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace engine {

// The base `stage` builds from its `pretrained` directory now (no tensors listed). An error when
// the stage has no such directory or a file cannot be read.
StatusOr<proto::FrozenBase> DescribeFrozenBase(const ResolvedStage& stage,
                                               const ResolvedPipeline& pipeline);

// The tensors of `module` that training leaves as the model build made them: the parameters that
// do not train and the stored codes and scales of quantized layers. Other buffers (running
// statistics) may change and are not among them.
std::set<std::string> UntrainedTensorNames(torch::nn::Module& module);

// OK when `current` is the base `recorded` describes: the same directory contents and recipe.
// Otherwise a FAILED_PRECONDITION error after `context` naming the file that changed, appeared or
// went missing, or the recipes, and what to do.
Status CheckSameBase(const proto::FrozenBase& recorded, const proto::FrozenBase& current,
                     const std::string& context);

// The names of the base's tensors `base` lists.
std::set<std::string> BaseTensorNames(const proto::FrozenBase& base);

// One stage's frozen base while it trains, evaluates or generates: its identity, described on
// first use (the files are hashed once), and, once the model is built, loaded and placed, the
// tensors its slim checkpoints leave out. The training thread's.
class StageFrozenBase {
 public:
  // `slim`: the stage's checkpoint layout (checkpoint/checkpoint_layout.h).
  StageFrozenBase(const ResolvedStage& stage, const ResolvedPipeline& pipeline, bool slim)
      : stage_(stage), pipeline_(pipeline), slim_(slim) {}

  // The base the stage builds (DescribeFrozenBase), described once.
  StatusOr<const proto::FrozenBase*> Identity();

  // Fixes the base's tensors: the untrained tensors of `module` (UntrainedTensorNames), and of
  // those, when the stage started from a parent, only the ones the parent's base held too
  // (`parent_base`; the others hold what the parent trained). A stage that is not slim, or whose
  // base holds no tensor, keeps every tensor in its checkpoints.
  Status Fix(torch::nn::Module& module, const std::set<std::string>* parent_base);

  // For StageParts::frozen_base: null when checkpoints hold every tensor.
  const proto::FrozenBase* for_checkpoints() const {
    return with_tensors_ ? &*with_tensors_ : nullptr;
  }

 private:
  const ResolvedStage& stage_;
  const ResolvedPipeline& pipeline_;
  const bool slim_;
  std::optional<proto::FrozenBase> identity_;
  std::optional<proto::FrozenBase> with_tensors_;
};

}  // namespace engine
