// The frozen base a slim checkpoint leaves out (checkpoint/checkpoint_layout.h): what it is, which
// of the model's tensors belong to it, and whether the base a reader builds now is the one the
// checkpoint was trained on.
//
// A base is named by its `pretrained` directory's files (config.json, the weights and their index,
// with sizes and XXH3 content hashes) and the recipe that turns them into tensors (BaseRecipe), not
// by the directory's path: a base moved elsewhere is the same base, and FindBaseByContent finds it.
// Describing a base hashes those files: about a second for a 2 GB checkpoint from the page cache,
// so a stage describes its own once. Any thread; errors name the directory or file.
#pragma once

#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

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

// OK when `current` is the base `recorded` describes: the same files (names, sizes, content
// hashes) and recipe, wherever each directory is. Otherwise a FAILED_PRECONDITION error after
// `context` naming the file that changed, appeared or went missing, or the recipes, and what to do.
Status CheckSameBase(const proto::FrozenBase& recorded, const proto::FrozenBase& current,
                     const std::string& context);

// Whether `dir` holds the files `recorded` lists and no other file that makes tensors, with their
// sizes and content hashes. Files are hashed only once the names and sizes agree; a file that
// cannot be read (or listed) is not the base's.
bool HoldsBaseFiles(const std::filesystem::path& dir, const proto::FrozenBase& recorded);

// Whether `dir` holds files of every name `recorded` lists (whatever their contents).
bool HoldsBaseFileNames(const std::filesystem::path& dir, const proto::FrozenBase& recorded);

// Whether `stage`'s model options name their `pretrained` directory as the options that built
// `recorded` did (the same text as written in the pipeline, wherever it resolves now).
bool WrittenAsRecorded(const proto::FrozenBase& recorded, const ResolvedStage& stage);

// The most directories FindBaseByContent visits: a search path that holds more is cut short, and
// the error says so.
inline constexpr int kMaxBaseSearchDirs = 10000;

// The first directory that HoldsBaseFiles(recorded) among `roots`, each root searched before the
// next: the root, then the directories below it, 3 levels down at most (as far as a Hugging Face
// cache's snapshots, hub/models--ORG--NAME/snapshots/REVISION), in name order, without following
// symlinked directories. A NOT_FOUND error naming the files and hashes expected
// (DescribeBaseFiles) and every root it looked in, when none holds them.
StatusOr<std::filesystem::path> FindBaseByContent(const proto::FrozenBase& recorded,
                                                  const std::vector<std::filesystem::path>& roots);

// "config.json (xxh3 0123456789abcdef, 1.2 kB), model.safetensors (xxh3 ..., 2.1 GB)": the files
// that make up `base`, for messages (the first four, then how many more).
std::string DescribeBaseFiles(const proto::FrozenBase& base);

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

  // Fixes the base's tensors: the untrained tensors of `module` (UntrainedTensorNames) but those of
  // `not_base` (values that came from elsewhere, as an adapter's files), and of those, when the
  // stage started from a parent, only the ones the parent's base held too (`parent_base`; the
  // others hold what the parent trained). A stage that is not slim, or whose base holds no tensor,
  // keeps every tensor in its checkpoints.
  Status Fix(torch::nn::Module& module, const std::set<std::string>* parent_base,
             const std::set<std::string>& not_base = {});

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
